// Dense mode (16-bit, not deterministic): z = X Wg^T and the up projection of every row by one
// cuBLAS GEMM of two batches, h and the statistics by one element-wise pass, then the down
// projection by cuBLAS, the statistics published on a branch beside it (joined before the call's
// later work). The plan runs it after a forward with many active units, or with rows on the dense
// path at a few hundred tokens, where cuBLAS's GEMMs beat the gathers.
#include "launch/launch.hpp"

#include <algorithm>
#include <type_traits>

#include "common/check.hpp"
#include "common/dispatch.hpp"
#include "common/cluster_launch.cuh"
#include "kernels/dense_hidden.cuh"

namespace twblas::cuda {

namespace {

/// Wd^T (D x H) as a GEMM operand: the down rows read column-major, no transposed copy.
GemmOperand down_t_operand(const FfnWeights &w, const FfnProblem &p) {
    return {w.down, p.d, p.h, w.down_ld, TW_ORDER_COL, p.type};
}

/// h and the statistics by one pass (kernels/dense_hidden.cuh): blocks of a few rows (the plan's
/// count, up to dense_hidden_blocks_per_sm an SM), the per-unit counts in shared memory (clusters
/// adding them where compute_90+ code runs) or by an atomic an active value.
template <class T>
void launch_form_hidden_stats(cudaStream_t stream, const FfnCall &c, const DenseModeBuffers &b, bool shared_counts) {
    const FfnProblem &p = c.p;
    const FfnScratch &s = c.s;
    CudaFfnState &st = c.st;
    const int64_t rows = std::clamp<int64_t>(ceil_div(p.m, c.plan.hidden_blocks), 1, kHiddenMaxRows);
    HiddenStatsArgs<T> a{};
    a.z = static_cast<const T *>(b.z);
    a.u = static_cast<const T *>(p.gated ? b.up : nullptr);
    a.h = static_cast<T *>(b.h);
    a.ldg = s.ldg, a.m = p.m, a.cols = p.h, a.rows_per_block = rows;
    a.tile = p.tile, a.slots = p.slots, a.row_limit = s.row_limit;
    a.neuron_counts = st.neuron_counts();
    a.count = s.count, a.row_nnz = s.row_nnz, a.row_l1 = s.row_l1, a.header = s.header;
    const size_t shared = hidden_stats_shared_bytes(s.ldg);
    const int64_t blocks = std::max<int64_t>(1, ceil_div(p.m, rows));
    if (!shared_counts) {
        form_hidden_stats<T, 1, false><<<static_cast<unsigned>(blocks), 32 * kHiddenWarps, 0, stream>>>(a);
        check_launch("form_hidden_stats");
    } else if (st.pdl) {  // compute_90+ code runs: clusters (elsewhere each block adds its own counts)
        auto *kernel = form_hidden_stats<T, kHiddenCluster, true>;
        allow_dynamic_smem(kernel, shared, kHiddenStaticBytes);
        launch_in_clusters(kernel, dim3(static_cast<unsigned>(ceil_div(blocks, kHiddenCluster) * kHiddenCluster)),
                           dim3(32 * kHiddenWarps), kHiddenCluster, shared, stream,
                           "cudaLaunchKernelEx(form_hidden_stats)", a);
    } else {
        auto *kernel = form_hidden_stats<T, 1, true>;
        allow_dynamic_smem(kernel, shared, kHiddenStaticBytes);
        kernel<<<static_cast<unsigned>(blocks), 32 * kHiddenWarps, shared, stream>>>(a);
        check_launch("form_hidden_stats");
    }
}

/// A few tokens: h alone (a thread a 16-byte chunk) ...
template <class T>
void launch_form_hidden(cudaStream_t stream, const FfnCall &c, const DenseModeBuffers &b) {
    const FfnProblem &p = c.p;
    const FfnScratch &s = c.s;
    const int64_t chunks = p.m * (s.ldg / 8);
    form_hidden<T>
        <<<static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(ceil_div(chunks, 256), 8 * c.st.sm_count))),
           256, 0, stream>>>(static_cast<const T *>(b.z), p.gated ? static_cast<const T *>(b.up) : nullptr,
                             static_cast<T *>(b.h), s.ldg, p.m, p.h, s.header);
    check_launch("form_hidden");
}

/// ... and the statistics from z and h, published by the grid's last block (a block a row).
template <class T>
void launch_dense_stats(cudaStream_t stream, const FfnCall &c, const DenseModeBuffers &b) {
    const FfnProblem &p = c.p;
    const FfnScratch &s = c.s;
    CudaFfnState &st = c.st;
    DenseStatsArgs<T> a{};
    a.z = static_cast<const T *>(b.z);
    a.h = static_cast<const T *>(b.h);
    a.ldg = s.ldg, a.m = p.m, a.cols = p.h;
    a.tile = p.tile, a.slots = p.slots, a.row_limit = s.row_limit;
    a.neuron_counts = st.neuron_counts();
    a.count = s.count, a.row_nnz = s.row_nnz, a.row_l1 = s.row_l1;
    a.stats = st.stats_block(), a.publish = st.feedback.device(), a.ticket = s.header + 1;
    dense_row_stats<T><<<static_cast<unsigned>(p.m), 32 * kDenseStatsWarps, 0, stream>>>(a);
    check_launch("dense_row_stats");
}

template <class T>
void run_dense_mode_t(cudaStream_t stream, const FfnCall &c, const DenseModeBuffers &b,
                      const std::function<void(cudaStream_t)> &after_stats) {
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
    // counts by atomics also where a block cannot hold a count for every unit (H past ~48 k on
    // GPUs with 99 KB of shared memory a block)
    const bool beside = c.plan.dense_stats == DenseStats::Beside;
    const bool shared_counts = c.plan.dense_stats == DenseStats::SharedCounts &&
                               hidden_stats_shared_bytes(s.ldg) + kHiddenStaticBytes <= static_cast<size_t>(st.smem_optin);
    if (beside)
        launch_form_hidden<T>(stream, c, b);
    else
        launch_form_hidden_stats<T>(stream, c, b, shared_counts);
    // the statistics published beside the down GEMM (few tokens: all of them; else finalize, one
    // block); the GEMM enqueued first, so that its tiles take the SMs
    st.branch.mark(stream);
    st.gemm.run(stream, 1.0f, {b.h, p.m, p.h, s.ldg, TW_ORDER_ROW, p.type}, down_t_operand(w, p),
                {c.y.values, c.y.ld, p.type}, s.lt_workspace, s.lt_bytes, {}, {c.plan.down_gemm_sms});
    const cudaStream_t side = st.branch.fork_from_mark();
    if (beside)
        launch_dense_stats<T>(side, c, b);
    else
        launch_finish(side, c, false, 0, nullptr);
    if (after_stats) after_stats(side);
    st.branch.join(stream);
}

}  // namespace

void run_dense_mode(cudaStream_t stream, const FfnCall &c, const DenseModeBuffers &b,
                    const std::function<void(cudaStream_t)> &after_stats) {
    by_type(c.p.type, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (std::is_same_v<T, float>)
            fail(TW_STATUS_INTERNAL_ERROR, "dense mode runs 16-bit FFNs");
        else
            run_dense_mode_t<T>(stream, c, b, after_stats);
    });
}

}  // namespace twblas::cuda
