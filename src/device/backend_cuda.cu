// The CUDA backend (sm_90a). Until its kernels land, a CUDA handle can be created on a usable
// GPU and every routine reports TW_STATUS_NOT_SUPPORTED saying so; DEFAULT picks the CPU when
// no usable GPU is present.
#include <cuda_runtime.h>

#include "backend_stub.hpp"

namespace twblas {

namespace {

/// Compute capability major of the current device, or -1 when no GPU answers.
int device_major() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        (void)cudaGetLastError();  // clear the error of a machine without a driver
        return -1;
    }
    int device = 0, major = -1;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess)
        return -1;
    return major;
}

}  // namespace

bool cuda_backend_usable() { return device_major() >= 9; }

std::unique_ptr<Backend> make_cuda_backend() {
    const int major = device_major();
    if (major < 0) fail(TW_STATUS_NOT_SUPPORTED, "backend: no usable GPU found by the CUDA runtime");
    if (major < 9)
        fail(TW_STATUS_ARCH_MISMATCH, "backend: the CUDA backend is built for sm_90a (Hopper); this GPU is sm_%d", major * 10);
    return std::make_unique<UnavailableBackend>(TW_BACKEND_CUDA,
                                                "the CUDA kernels are not implemented yet; use a TW_BACKEND_CPU handle");
}

}  // namespace twblas
