// The fused gate+up GEMM's 64 x 128 tiles (see gate_up_relu_gemm.cuh): the ping-pong schedule,
// whose two consumer warpgroups take turns (one's epilogue under the other's mainloop), for
// small M, where 128-row tiles would be mostly padding and too few tiles would stream the weights.
#include "testing/cuda/gate_up_relu_gemm.cuh"

namespace twblas::testing::fused {
void launch_narrow(cudaStream_t stream, const GateUpRelu &g, int device, int sm_count) {
    launch<Kernel<Shape<_64, _128, _64>, Shape<_1, _1, _1>, cutlass::gemm::KernelTmaWarpSpecializedPingpong>>(
        stream, g, device, sm_count);
}
}  // namespace twblas::testing::fused
