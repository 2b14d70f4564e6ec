// The TwELL form of the masked gate GEMM (masked_gate_twell.cuh) for both 16-bit types.
#include "gemm/masked_gate_twell.cuh"

namespace twblas::cuda::masked_gate {
void launch_bf16_twell(cudaStream_t stream, const MaskedGateGemm &g, const TwellTarget &t, int device, int sm_count) {
    launch_typed<cutlass::bfloat16_t, TwellKernel<cutlass::bfloat16_t>>(stream, g, device, sm_count, t);
}
void launch_f16_twell(cudaStream_t stream, const MaskedGateGemm &g, const TwellTarget &t, int device, int sm_count) {
    launch_typed<cutlass::half_t, TwellKernel<cutlass::half_t>>(stream, g, device, sm_count, t);
}
}  // namespace twblas::cuda::masked_gate
