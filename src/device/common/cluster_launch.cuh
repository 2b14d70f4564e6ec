// Thread-block clusters (sm_90): `cluster_x` consecutive blocks along x run at once on one GPC and
// can read each other's shared memory (cooperative_groups::this_cluster()). Only where compute_90+
// code runs (DeviceInfo::pdl's condition); callers fall back to plain launches elsewhere.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "common/launch.cuh"

namespace twblas::cuda {

/// `kernel` on `stream` in clusters of `cluster_x` blocks (grid.x a multiple of it), with `smem`
/// bytes of dynamic shared memory.
template <class... Params, class... Args>
void launch_in_clusters(void (*kernel)(Params...), dim3 grid, dim3 block, unsigned cluster_x, size_t smem,
                        cudaStream_t stream, const char *what, Args &&...args) {
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = cluster_x;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    launch_with_attributes(kernel, grid, block, smem, stream, &attr, 1u, what, std::forward<Args>(args)...);
}

}  // namespace twblas::cuda
