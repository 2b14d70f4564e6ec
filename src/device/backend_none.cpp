// Built without CUDA: the CUDA backend cannot be created and DEFAULT resolves to the CPU.
#include "host/backend.hpp"
#include "host/error.hpp"

namespace twblas {

bool cuda_backend_usable() { return false; }

std::unique_ptr<Backend> make_cuda_backend(void *const *) {
    fail(TW_STATUS_NOT_SUPPORTED, "backend: twblas was built without CUDA (TWBLAS_WITH_CUDA=OFF)");
}

}  // namespace twblas
