// The gate and the unit lists of the sparse paths: cuBLAS's gate GEMM and the packing pass over
// the gate values, or the masked gate GEMM (sm_90a), whose epilogue writes the active-unit words
// that the lists are made from (H / 8 bytes a token read instead of the gate row).
#include "launch/launch.hpp"

#include "common/check.hpp"
#include "common/dispatch.hpp"
#include "gemm/masked_gate_gemm.hpp"
#include "kernels/pack.cuh"

namespace twblas::cuda {

namespace {

/// The masked gate GEMM's operands: z = X Wg^T into the gate buffer (its active values), the
/// words into unit_masks.
MaskedGateGemm masked_gate_operands(const FfnCall &c) {
    const FfnProblem &p = c.p;
    return {c.x.values, c.x.ld, c.w.gate, c.w.gate_ld, p.m, p.h, p.d, c.s.gate, c.s.ldg, c.s.unit_masks, (p.h + 31) / 32};
}

/// The masked gate GEMM, then (unless fwd_u makes them) the unit lists from its words. The GEMM
/// writes the gate's active values only: the sparse rows read nothing else, the lists' maker
/// zeroes the rest of the dense path's rows, and the hidden output reads the gate buffer under
/// the words.
void run_masked_gate(cudaStream_t stream, const FfnCall &c, bool lists) {
    const FfnProblem &p = c.p;
    // the dense list's count (and finalize's ticket) first: the list's maker then follows the
    // GEMM directly
    check(cudaMemsetAsync(c.s.header, 0, 2 * sizeof(uint32_t), stream), "cudaMemsetAsync");
    launch_masked_gate_gemm(stream, p.type, masked_gate_operands(c), c.plan.masked_gate_tile_n, c.st.device,
                            c.st.sm_count);
    if (!lists) return;
    lists_from_masks<<<static_cast<unsigned>(ceil_div(p.m, 4)), 128, 0, stream>>>(
        mask_list_args(p, c.s, c.st.neuron_counts()));
    check_launch("lists_from_masks");
}

/// The packing pass: unit lists, counts, the dense list, per-unit counts.
template <class T>
void launch_pack(cudaStream_t stream, const FfnProblem &p, const FfnScratch &s, unsigned long long *neuron_counts,
                 bool zero_inactive) {
    check(cudaMemsetAsync(s.header, 0, 2 * sizeof(uint32_t), stream), "cudaMemsetAsync");
    const PackArgs<T> pk{s.gate, s.ldg, p.m, p.h, p.gate_f32(), zero_inactive, p.tile, p.slots, s.cap, s.idx, s.count,
                         s.row_nnz, s.dense_rows, s.dense_count, neuron_counts, s.row_limit};
    pack_rows<T><<<static_cast<unsigned>(ceil_div(p.m, 4)), 128, 0, stream>>>(pk);
    check_launch("pack_rows");
}

}  // namespace

void run_gate_gemm(cudaStream_t stream, CudaFfnState &st, const FfnProblem &p, const GemmOperand &x,
                   const FfnScratch &s) {
    const FfnWeights w = st.weights(p);
    st.gemm.run(stream, 1.0f, x, {w.gate, p.h, p.d, w.gate_ld, TW_ORDER_ROW, p.type},
                {s.gate, s.ldg, p.gate_f32() ? TW_R_32F : p.type}, s.lt_workspace, s.lt_bytes);
}

MaskListArgs mask_list_args(const FfnProblem &p, const FfnScratch &s, unsigned long long *neuron_counts) {
    return {s.unit_masks, s.unit_words, p.m, p.tile, p.slots, s.cap, s.idx, s.count, s.row_nnz,
            s.dense_rows, s.dense_count, neuron_counts, s.row_limit,
            static_cast<uint16_t *>(s.gate), s.ldg, p.h};
}

void run_gate_and_lists(cudaStream_t stream, const FfnCall &c, bool zero_inactive) {
    if (c.plan.masked_gate) return run_masked_gate(stream, c, !c.plan.lists_in_fwd_u);
    run_gate_gemm(stream, c.st, c.p, gemm_operand(c.x), c.s);
    by_type(c.p.type, [&](auto tag) {
        launch_pack<decltype(tag)>(stream, c.p, c.s, c.st.neuron_counts(), zero_inactive);
    });
}

}  // namespace twblas::cuda
