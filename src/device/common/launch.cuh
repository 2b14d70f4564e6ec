// One kernel launch through cudaLaunchKernelEx with launch attributes (PDL, clusters): the config
// built in one place for the launchers that name what the attributes mean (dependent_launch.cuh,
// cluster_launch.cuh).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "common/check.hpp"

namespace twblas::cuda {

/// `kernel` on `stream` with the `nattrs` attributes at `attrs` (none when nattrs is 0).
template <class... Params, class... Args>
void launch_with_attributes(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                            cudaLaunchAttribute *attrs, unsigned nattrs, const char *what, Args &&...args) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attrs;
    cfg.numAttrs = nattrs;
    check(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), what);
}

}  // namespace twblas::cuda
