// The masked gate GEMM for cutlass::bfloat16_t operands (see masked_gate_gemm.cuh).
#include "gemm/masked_gate_gemm.cuh"

namespace twblas::cuda::masked_gate {
template void launch_typed<cutlass::bfloat16_t>(cudaStream_t, const MaskedGateGemm &, int, int);
}  // namespace twblas::cuda::masked_gate
