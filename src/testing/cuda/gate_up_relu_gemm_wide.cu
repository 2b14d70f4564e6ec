// The fused gate+up GEMM's 128 x 256 tiles (see gate_up_relu_gemm.cuh): the cooperative
// schedule with clusters of two along M sharing the weight tile, for large M.
#include "testing/cuda/gate_up_relu_gemm.cuh"

namespace twblas::testing::fused {
void launch_wide(cudaStream_t stream, const GateUpRelu &g, int device, int sm_count) {
    launch<Kernel<Shape<_128, _256, _64>, Shape<_2, _1, _1>, cutlass::gemm::KernelTmaWarpSpecializedCooperative>>(
        stream, g, device, sm_count);
}
}  // namespace twblas::testing::fused
