// Which builds and operands the masked gate GEMM takes, and the dispatch by type. Compiled for
// every architecture of the build; the kernels themselves (masked_gate_gemm_{bf16,f16}.cu) only
// for sm_90a, where TWBLAS_HAVE_SM90A says they were built.
#include "gemm/masked_gate_gemm.hpp"

#include "host/error.hpp"

namespace twblas::cuda {

#if defined(TWBLAS_HAVE_SM90A)
namespace masked_gate {
void launch_bf16(cudaStream_t stream, const MaskedGateGemm &g, int device, int sm_count);
void launch_f16(cudaStream_t stream, const MaskedGateGemm &g, int device, int sm_count);
void launch_bf16_narrow(cudaStream_t stream, const MaskedGateGemm &g, int device, int sm_count);
void launch_f16_narrow(cudaStream_t stream, const MaskedGateGemm &g, int device, int sm_count);
}  // namespace masked_gate
#endif

namespace {
bool aligned16(const void *p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
}  // namespace

bool masked_gate_gemm_built() {
    // CMake defines it when the build's architectures name sm_90a
#if defined(TWBLAS_HAVE_SM90A)
    return true;
#else
    return false;
#endif
}

bool masked_gate_gemm_fits(twDataType_t type, const MaskedGateGemm &g) {
    if (type != TW_R_16BF && type != TW_R_16F) return false;
    // TMA: 16-byte aligned bases and row strides, and (CUTLASS's check) a reduction of whole
    // 16-byte chunks; the epilogue's 16-byte stores: gate rows on 16 bytes
    if (!aligned16(g.x) || !aligned16(g.w) || g.ldx % 8 != 0 || g.ldw % 8 != 0 || g.k % 8 != 0) return false;
    if (!aligned16(g.gate) || g.ldg % 8 != 0) return false;
    constexpr int64_t kInt = int64_t{1} << 31;
    return g.m > 0 && g.n > 0 && g.k > 0 && g.m < kInt && g.n < kInt && g.k < kInt && g.words * 32 >= g.n;
}

void launch_masked_gate_gemm(cudaStream_t stream, twDataType_t type, const MaskedGateGemm &g, int tile_n, int device,
                             int sm_count) {
#if defined(TWBLAS_HAVE_SM90A)
    const bool narrow = tile_n == 192;
    if (type == TW_R_16BF)
        (narrow ? masked_gate::launch_bf16_narrow : masked_gate::launch_bf16)(stream, g, device, sm_count);
    else
        (narrow ? masked_gate::launch_f16_narrow : masked_gate::launch_f16)(stream, g, device, sm_count);
#else
    (void)stream, (void)type, (void)g, (void)tile_n, (void)device, (void)sm_count;
    fail(TW_STATUS_INTERNAL_ERROR, "masked gate GEMM: this build holds no sm_90a code (masked_gate_gemm_built)");
#endif
}

}  // namespace twblas::cuda
