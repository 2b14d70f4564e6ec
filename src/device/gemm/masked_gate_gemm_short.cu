// The masked gate GEMM's 64 x 64 pingpong tiles for both 16-bit types (see masked_gate_gemm.cuh).
#include "gemm/masked_gate_gemm.cuh"

namespace twblas::cuda::masked_gate {
void launch_bf16_short(cudaStream_t stream, const MaskedGateGemm &g, int device, int sm_count) {
    launch_typed<cutlass::bfloat16_t, ShortKernel<cutlass::bfloat16_t>>(stream, g, device, sm_count);
}
void launch_f16_short(cudaStream_t stream, const MaskedGateGemm &g, int device, int sm_count) {
    launch_typed<cutlass::half_t, ShortKernel<cutlass::half_t>>(stream, g, device, sm_count);
}
}  // namespace twblas::cuda::masked_gate
