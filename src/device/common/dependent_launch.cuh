// Programmatic dependent launch (PDL, sm_90): a kernel launched with it may start its blocks while
// the kernel before it in the stream finishes, and waits on the device for that kernel's results.
// A chain of short kernels then pays each launch's start once, hidden behind the previous
// kernel's tail, instead of one drain and one start per kernel.
//
// The rule every kernel launched this way follows: wait_for_prior_grid() before touching memory
// the kernels before it write or read; allow_dependent_launch() once its own blocks are all
// running (the next kernel's blocks then take the SM room the last wave leaves). Both are no-ops
// when the kernel was launched without the attribute, and on GPUs before sm_90.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "common/launch.cuh"

namespace twblas::cuda {

/// Waits until the kernels this one depends on have finished and their writes are visible.
__device__ inline void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cudaGridDependencySynchronize();
#endif
}

/// Lets the next kernel of the stream, when launched with PDL, start its blocks.
__device__ inline void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cudaTriggerProgrammaticLaunchCompletion();
#endif
}

/// `kernel` on `stream` after the work before it; with `pdl` its blocks may start while the kernel
/// before it finishes (it must call wait_for_prior_grid first), without it after that kernel.
template <class... Params, class... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
                      const char *what, Args &&...args) {
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    launch_with_attributes(kernel, grid, block, smem, stream, &attr, pdl ? 1u : 0u, what, std::forward<Args>(args)...);
}

}  // namespace twblas::cuda
