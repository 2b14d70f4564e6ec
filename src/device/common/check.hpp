// CUDA error checks that become twblas::Error, and the small host arithmetic every launcher uses.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "host/error.hpp"
#include "twblas/twblas.h"

namespace twblas::cuda {

/// Throws EXECUTION_FAILED naming the call and the CUDA error.
inline void check(cudaError_t e, const char *what) {
    if (e != cudaSuccess) fail(TW_STATUS_EXECUTION_FAILED, "%s: %s", what, cudaGetErrorString(e));
}
/// After a launch: reports a bad launch configuration or an earlier asynchronous fault.
inline void check_launch(const char *kernel) { check(cudaGetLastError(), kernel); }

inline int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

/// Lets `kernel` take `bytes` of dynamic shared memory beside its `static_bytes`: past the 48 KB
/// default only with the kernel's attribute raised (an attribute of the kernel, not twblas state).
template <class Kernel> void allow_dynamic_smem(Kernel *kernel, size_t bytes, size_t static_bytes = 0) {
    if (bytes + static_bytes > 48 * 1024)
        check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
              "cudaFuncSetAttribute");
}
inline size_t elem_bytes(twDataType_t t) { return t == TW_R_32F ? 4 : 2; }

}  // namespace twblas::cuda
