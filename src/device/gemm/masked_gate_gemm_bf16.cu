// The masked gate GEMM for cutlass::bfloat16_t operands (see masked_gate_gemm.cuh).
#include "gemm/masked_gate_gemm.cuh"

namespace twblas::cuda::masked_gate {
void launch_bf16(cudaStream_t stream, const MaskedGateGemm &g, int device, int sm_count) {
    launch_typed<cutlass::bfloat16_t>(stream, g, device, sm_count);
}
}  // namespace twblas::cuda::masked_gate
