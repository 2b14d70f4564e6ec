// Dense mode (16-bit, not deterministic): z = X Wg^T and the up projection of every row by one
// cuBLAS GEMM of two batches, h by one element-wise pass, then the down projection by cuBLAS;
// the statistics (which read z and h) on a branch beside the down GEMM, joined before the call's
// later work. The plan runs it after a forward with many active units, or with rows on the dense
// path at a few hundred tokens, where cuBLAS's GEMMs beat the gathers.
#include "launch/launch.hpp"

#include <type_traits>

#include "common/check.hpp"
#include "common/dispatch.hpp"
#include "kernels/finalize.cuh"
#include "kernels/pack.cuh"

namespace twblas::cuda {

namespace {

/// Wd^T (D x H) as a GEMM operand: the down rows read column-major, no transposed copy.
GemmOperand down_t_operand(const FfnWeights &w, const FfnProblem &p) {
    return {w.down, p.d, p.h, w.down_ld, TW_ORDER_COL, p.type};
}

/// The statistics from z and h (a block per row; the header zeroed by form_hidden). With `stats`
/// its last block also publishes them (finalize's work).
template <class T>
void launch_dense_stats(cudaStream_t stream, const FfnProblem &p, const FfnScratch &s, const void *z, const void *h,
                        unsigned long long *neuron_counts, FfnStatsBlock *stats = nullptr, FfnFeedback *publish = nullptr) {
    const DenseStatsArgs<T> a{static_cast<const T *>(z), static_cast<const T *>(h), s.ldg, p.m, p.h, p.tile, p.slots,
                              s.row_limit, neuron_counts, s.count, s.row_nnz, s.row_l1, stats, publish, s.header + 1};
    dense_row_stats<T><<<static_cast<unsigned>(p.m), 32 * kDenseStatsWarps, 0, stream>>>(a);
    check_launch("dense_row_stats");
}

/// The per-unit activation counts, by columns of the gate.
template <class T>
void launch_count_dense(cudaStream_t stream, const FfnProblem &p, const void *z, int64_t ldz, unsigned long long *counts) {
    const int64_t rows = count_rows_per_block(p.m);
    const dim3 grid(static_cast<unsigned>(ceil_div(ldz, 256 * 8)), static_cast<unsigned>(ceil_div(p.m, rows)));
    count_active_columns<T><<<grid, 256, 0, stream>>>(static_cast<const T *>(z), ldz, p.m, p.h, rows, counts);
    check_launch("count_active_columns");
}

template <class T>
void run_dense_mode_t(cudaStream_t stream, const FfnCall &c, const DenseModeBuffers &b) {
    const FfnProblem &p = c.p;
    const FfnScratch &s = c.s;
    const FfnWeights &w = c.w;
    CudaFfnState &st = c.st;
    if (p.gated) {
        // z and u: one strided-batched GEMM, as the dense FFN stacks [Wg; Wu], where Wu starts
        // 16-byte aligned after Wg with the same leading dimension (the FFN's copy: dp further
        // on; in place, a stacked [Wg; Wu] storage or two allocations in that order), else two
        // GEMMs. u's buffer is (up - z) after z's (16-bit values; both layouts, the workspace's
        // and the saved state's, place u after z)
        const ptrdiff_t apart = static_cast<const char *>(b.up) - static_cast<const char *>(b.z);
        if (apart < static_cast<ptrdiff_t>(p.m * s.ldg) * 2)
            fail(TW_STATUS_INTERNAL_ERROR, "dense mode: u's buffer does not follow z's");
        const GemmOperand wg{w.gate, p.h, p.d, w.gate_ld, TW_ORDER_ROW, p.type};
        const ptrdiff_t w_apart = static_cast<const char *>(w.up) - static_cast<const char *>(w.gate);
        if (w.up_ld == w.gate_ld && w_apart > 0 && w_apart % 16 == 0) {
            st.gemm.run(stream, 1.0f, gemm_operand(c.x), wg, {b.z, s.ldg, p.type}, s.lt_workspace, s.lt_bytes,
                        GemmBatch{2, 0, w_apart / p.weight_bytes(), apart / 2});
        } else {
            st.gemm.run(stream, 1.0f, gemm_operand(c.x), wg, {b.z, s.ldg, p.type}, s.lt_workspace, s.lt_bytes);
            st.gemm.run(stream, 1.0f, gemm_operand(c.x), {w.up, p.h, p.d, w.up_ld, TW_ORDER_ROW, p.type},
                        {b.up, s.ldg, p.type}, s.lt_workspace, s.lt_bytes);
        }
    } else {
        FfnScratch zs = s;
        zs.gate = b.z;
        run_gate_gemm(stream, st, p, gemm_operand(c.x), zs);
    }
    const int64_t chunks = p.m * (s.ldg / 8);
    form_hidden<T><<<static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(ceil_div(chunks, 256), 8 * st.sm_count))),
                     256, 0, stream>>>(static_cast<const T *>(b.z), p.gated ? static_cast<const T *>(b.up) : nullptr,
                                       static_cast<T *>(b.h), s.ldg, p.m, p.h, s.header);
    check_launch("form_hidden");
    // the statistics beside the down GEMM, off the path; the GEMM enqueued first, so that its
    // tiles take the SMs before the statistics' blocks (the other order was 6 % slower)
    st.branch.mark(stream);
    st.gemm.run(stream, 1.0f, {b.h, p.m, p.h, s.ldg, TW_ORDER_ROW, p.type}, down_t_operand(w, p),
                {c.y.values, c.y.ld, p.type}, s.lt_workspace, s.lt_bytes);
    const cudaStream_t side = st.branch.fork_from_mark();
    if (c.plan.dense_stats_fold) {
        launch_dense_stats<T>(side, p, s, b.z, b.h, st.neuron_counts(), st.stats_block(), st.feedback.device());
    } else {
        launch_count_dense<T>(side, p, b.z, s.ldg, st.neuron_counts());
        launch_dense_stats<T>(side, p, s, b.z, b.h, nullptr);
        launch_finish(side, c, false, 0, nullptr);
    }
    st.branch.join(stream);
}

}  // namespace

void run_dense_mode(cudaStream_t stream, const FfnCall &c, const DenseModeBuffers &b) {
    by_type(c.p.type, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (std::is_same_v<T, float>)
            fail(TW_STATUS_INTERNAL_ERROR, "dense mode runs 16-bit FFNs");
        else
            run_dense_mode_t<T>(stream, c, b);
    });
}

}  // namespace twblas::cuda
