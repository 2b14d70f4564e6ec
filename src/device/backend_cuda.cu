// The CUDA backend (sm_90a). Until its kernels land, a CUDA handle can be created on a usable
// GPU and every routine reports TW_STATUS_NOT_SUPPORTED saying so; DEFAULT picks the CPU when
// no usable GPU is present.
#include <cuda_runtime.h>

#include "backend_stub.hpp"

namespace twblas {

namespace {

/// A usable GPU: the runtime answers and device 0 is a Hopper (sm_90) or newer part.
bool hopper_present() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        (void)cudaGetLastError();  // clear the sticky error of a machine without a driver
        return false;
    }
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess) return false;
    return major >= 9;
}

}  // namespace

bool cuda_backend_usable() { return hopper_present(); }

std::unique_ptr<Backend> make_cuda_backend() {
    if (!hopper_present())
        fail(TW_STATUS_NOT_SUPPORTED, "backend: no usable GPU (the CUDA backend needs an sm_90 device)");
    return std::make_unique<UnavailableBackend>(TW_BACKEND_CUDA,
                                                "the CUDA kernels are not implemented yet; use a TW_BACKEND_CPU handle");
}

}  // namespace twblas
