// The forward of the fused FFN. After the gate GEMM (cuBLASLt, tensor cores):
//   pack       one warp per token turns its gate row into the list of active units, flags rows
//              with a TwELL tile over capacity or too many units (the dense path) and counts
//              each unit's activations (after the masked gate GEMM from its active-unit words:
//              lists_from_masks, or up to kFwdUListsMaxTokens fwd_u's own blocks);
//   dense path the first rows of the dense list through cuBLAS GEMMs of a capacity taken from
//              the measured statistics, any beyond through the gathered GEMM whose row count is
//              read on the device: exact for any sparsity, no host sync; on a branch of the
//              FFN's own beside the sparse rows;
//   sparse     the other rows through the fused kernel (small M) or the two-pass kernels;
//   finish     statistics reduced in a fixed order, published for the path choice, and the
//              optional hidden output.
// Decode (a few tokens) does gate, packing and projections in one kernel instead; dense mode
// (many active units, or up to 512 tokens rows on the dense path, as an earlier forward measured)
// runs the projections as cuBLAS GEMMs, its statistics on a branch beside the down GEMM.
#include "ffn_forward.hpp"

#include <algorithm>

#include "common/dependent_launch.cuh"
#include "common/dispatch.hpp"
#include "common/matrix_arg.hpp"
#include "common/pointer_check.hpp"
#include "gemm/gathered_gemm.hpp"
#include "gemm/masked_gate_gemm.hpp"
#include "heuristics.hpp"
#include "kernels/decode.cuh"
#include "kernels/dense_rows.cuh"
#include "kernels/finalize.cuh"
#include "kernels/fused.cuh"
#include "kernels/pack.cuh"
#include "kernels/saved_state.cuh"
#include "kernels/serve.cuh"
#include "kernels/two_pass.cuh"
#include "sparse_ops.hpp"

namespace twblas::cuda {

namespace {

/// The masked gate GEMM's operands: z = X Wg^T into the gate buffer (its active values), the
/// words into unit_masks.
MaskedGateGemm masked_gate_operands(const CudaFfnState &st, const FfnProblem &p, const twDnMatDescr &x,
                                    const FfnScratch &s) {
    const FfnWeights w = st.weights(p);
    return {x.values, x.ld, w.gate, w.gate_ld, p.m, p.h, p.d, s.gate, s.ldg, s.unit_masks, (p.h + 31) / 32};
}

/// What one forward runs, chosen before anything is enqueued (and part of a captured call's key).
struct ForwardPath {
    bool serve;           // the serving path: tensor-core gate with masks, then one gather kernel
    bool decode;          // the one-kernel decode path
    bool dense_mode;      // projections as cuBLAS GEMMs over every row
    bool masked_gate;     // the gate through the masked gate GEMM, the lists from its unit words
    bool two_pass;        // sparse rows through the two-pass kernels (else the fused kernel)
    bool lists_in_fwd_u;  // masked gate + two-pass: fwd_u (fwd_u_fp8) lists its row from the words
    int64_t cublas_rows;  // rows of the dense list that go through cuBLAS GEMMs
};

ForwardPath choose_path(const CudaFfnState &st, const FfnProblem &p, const twDnMatDescr &x, const twDnMatDescr &y,
                        bool training) {
    ForwardPath path{};
    // after a forward that chose dense mode the cuBLAS projections win, unless few tokens gather
    // fewer weight rows than they read
    const bool gathers = !st.dense_mode || p.deterministic ||
                         heuristics::gathers_pay_in_dense_mode(st.mean_active, p.m, p.h);
    // serving: x rows go straight into the MMA fragments, so they must start on 16 bytes; FP8
    // weights: cuBLAS's gate and serve_token's FP8 instance there, the two-pass kernels past it
    // (decode, the fused kernel and dense mode read the 16-bit rows)
    const bool rows_16bit = !p.fp8;
    path.serve = !training && (rows_16bit || heuristics::kServeFp8) && gathers && heuristics::serve_applies(p) &&
                 rows_aligned16(matrix_arg(x));
    path.decode = !training && rows_16bit && gathers && !path.serve && heuristics::decode_applies(p);
    // deterministic mode never switches (bits would depend on history); fp32 intermediates have
    // no cuBLAS form here, so they stay sparse too
    const bool cublas = !p.deterministic && p.cublas_ok() && rows_16bit && p.m > 0;
    path.dense_mode = !path.serve && !path.decode && cublas &&
                      (st.dense_mode || heuristics::dense_rows_favour_dense_mode(st.dense_row_fraction, p.m)) &&
                      y.order == TW_ORDER_ROW && y.ld % 8 == 0;
    path.masked_gate = !path.serve && !path.decode && !path.dense_mode && st.masked_gate && p.cublas_ok() &&
                       p.m >= heuristics::masked_gate_min_tokens(p.d, p.h) && x.order == TW_ORDER_ROW &&
                       // X and the weights decide; the workspace carver puts the gate on 16 bytes
                       masked_gate_gemm_fits(p.type, masked_gate_operands(st, p, x, FfnScratch{}));
    path.two_pass = training || p.fp8 || heuristics::two_pass_applies(p);
    path.lists_in_fwd_u = path.masked_gate && path.two_pass && (!p.fp8 || heuristics::kFwdUListsFp8) &&
                          p.m <= heuristics::kFwdUListsMaxTokens;
    path.cublas_rows = !path.serve && !path.decode && !path.dense_mode && cublas
                           ? heuristics::dense_path_cublas_rows(st.dense_row_fraction, p.m)
                           : 0;
    return path;
}

/// z = X Wg^T into the gate buffer, rounded to the gate type (cuBLASLt): every path but decode
/// and the serving path's own gate starts with it.
void run_gate_gemm(cudaStream_t stream, CudaFfnState &st, const FfnProblem &p, const GemmOperand &x,
                   const FfnScratch &s) {
    const FfnWeights w = st.weights(p);
    st.gemm.run(stream, 1.0f, x, {w.gate, p.h, p.d, w.gate_ld, TW_ORDER_ROW, p.type},
                {s.gate, s.ldg, p.gate_f32() ? TW_R_32F : p.type}, s.lt_workspace, s.lt_bytes);
}

/// Wd^T (D x H) as a GEMM operand: the down rows read column-major, no transposed copy.
GemmOperand down_t_operand(const FfnWeights &w, const FfnProblem &p) {
    return {w.down, p.d, p.h, w.down_ld, TW_ORDER_COL, p.type};
}

/// What the unit lists are made from after the masked gate GEMM: its words, into the lists,
/// counts, dense list and per-unit counts of the scratch.
MaskListArgs mask_list_args(const FfnProblem &p, const FfnScratch &s, unsigned long long *neuron_counts) {
    return {s.unit_masks, s.unit_words, p.m, p.tile, p.slots, s.cap, s.idx, s.count, s.row_nnz,
            s.dense_rows, s.dense_count, neuron_counts, s.row_limit,
            static_cast<uint16_t *>(s.gate), s.ldg, p.h};
}

/// The masked gate GEMM, then (unless fwd_u makes them, path.lists_in_fwd_u) the unit lists from
/// its words (instead of the cuBLAS gate GEMM and the packing pass over the gate values). The
/// GEMM writes the gate's active values only: the sparse rows read nothing else, the lists'
/// maker zeroes the rest of the dense path's rows, and the hidden output reads the gate buffer
/// under the words (gate_mask).
void run_masked_gate(cudaStream_t stream, const CudaFfnState &st, const FfnProblem &p, const twDnMatDescr &x,
                     const FfnScratch &s, unsigned long long *neuron_counts, bool lists) {
    // the dense list's count (and finalize's ticket) first: the list's maker then follows the
    // GEMM directly
    check(cudaMemsetAsync(s.header, 0, 2 * sizeof(uint32_t), stream), "cudaMemsetAsync");
    launch_masked_gate_gemm(stream, p.type, masked_gate_operands(st, p, x, s), st.device, st.sm_count);
    if (!lists) return;
    lists_from_masks<<<static_cast<unsigned>(ceil_div(p.m, 4)), 128, 0, stream>>>(mask_list_args(p, s, neuron_counts));
    check_launch("lists_from_masks");
}

// ---- launchers, in the order a forward runs them

template <class T>
void launch_decode(cudaStream_t stream, const FfnProblem &p, const FfnWeights &w, const MatrixArg &x, const MatrixArg &y,
                   const FfnScratch &s, unsigned long long *neuron_counts, bool write_h) {
    const int blocks = ceil_div(p.h, kDecodeUnitsPerBlock);
    const int nt = ceil_div(p.h, p.tile);
    // the header and the counters after it (ffn_layout: one memset, one graph node fewer)
    check(cudaMemsetAsync(s.header, 0, static_cast<size_t>(2 + p.m * (2 + nt)) * 4, stream), "cudaMemsetAsync");
    DecodeArgs<T> a{static_cast<const T *>(x.ptr), x.rs, x.cs, rows_vectorizable(x, p.d), static_cast<int>(p.m), p.d,
                    p.dp, p.h, static_cast<const T *>(w.gate), w.gate_ld, static_cast<const T *>(w.up), w.up_ld,
                    static_cast<const T *>(w.down), w.down_ld, p.gated, p.highest, false, write_h, s.gate, s.ldg, p.tile, nt, s.dec_zero, s.dec_zero + 2 * p.m,
                    s.dec_zero + p.m, s.dec_list, blocks, s.dec_partial,
                    s.dec_partial + static_cast<int64_t>(blocks) * p.m * p.dp, neuron_counts};
    // x of every token in shared memory: at most 4 x 4096 x 2 bytes (decode_applies), under 48 KB
    const size_t xs_bytes = static_cast<size_t>(p.m * p.dp) * sizeof(T);
    // rows of up to 2048 values need 8 chunks per lane (64 registers), wider ones 16
    if (p.dp <= 2048)
        decode_ffn<T, 8><<<blocks, 32 * kDecodeUnitsPerBlock, xs_bytes, stream>>>(a);
    else
        decode_ffn<T, 16><<<blocks, 32 * kDecodeUnitsPerBlock, xs_bytes, stream>>>(a);
    check_launch("decode_ffn");
    const dim3 rgrid(static_cast<unsigned>(p.m), static_cast<unsigned>(ceil_div(p.d, 256)));
    decode_reduce<T><<<rgrid, 256, static_cast<size_t>(a.nblk) * 4, stream>>>(a, static_cast<T *>(y.ptr), y.rs, y.cs,
                                                                                p.slots, s.count, s.row_nnz, s.row_l1);
    check_launch("decode_reduce");
}

/// The serving path's own gate (up to heuristics::serve_gate_max_tokens), which serve_down follows by
/// programmatic dependent launch (launch_dependent).
template <class T, int R, int U, bool FP8>
void launch_serve_gate(cudaStream_t stream, const ServeArgs<T> &a) {
    // a block per 8 units, 4 per mask word: every byte of the words is written
    serve_gate<T, R, U, FP8><<<static_cast<unsigned>(4 * a.words), 32 * kServeGateWarps, 0, stream>>>(a);
    check_launch("serve_gate");
}

template <class T>
void launch_serve(cudaStream_t stream, CudaFfnState &st, const FfnProblem &p, const FfnWeights &w,
                  const MatrixArg &x, const GemmOperand &xg, const MatrixArg &y, const FfnScratch &s,
                  unsigned long long *neuron_counts, bool write_h) {
    ServeArgs<T> a{};
    a.x = static_cast<const T *>(x.ptr), a.x_rs = x.rs, a.m = static_cast<int>(p.m);
    a.d = p.d, a.dp = p.dp, a.h = p.h;
    a.wgate = static_cast<const T *>(w.gate), a.wgate_ld = w.gate_ld;
    a.up = static_cast<const T *>(w.up), a.up_ld = w.up_ld;
    a.down = static_cast<const T *>(w.down), a.down_ld = w.down_ld;
    a.fp8 = w.fp8;
    a.gated = p.gated, a.write_h = write_h;
    a.gate = static_cast<T *>(s.gate), a.ldg = s.ldg;
    a.masks = s.unit_masks, a.words = s.unit_words, a.ticket = s.serve_ticket;
    a.neuron_counts = neuron_counts;
    a.y = static_cast<T *>(y.ptr), a.y_rs = y.rs, a.y_cs = y.cs;
    a.tile = p.tile, a.slots = p.slots, a.row_limit = s.row_limit;
    a.count = s.count, a.row_nnz = s.row_nnz, a.row_l1 = s.row_l1;
    a.stats = st.stats_block(), a.publish = st.feedback.device();
    // the step's statistics: by serve_stats after the last kernel (no ticket), or by the last
    // counting block behind a ticket; one token publishes them from registers either way
    const bool own_gate = p.m <= heuristics::serve_gate_max_tokens(p.d, p.h);  // serve_gate, else cuBLAS's
    const bool stats_kernel = p.m > 1 && (own_gate ? heuristics::kServeStatsKernelFew : heuristics::kServeStatsKernel);
    if (stats_kernel) a.ticket = nullptr;
    if (!own_gate) {
        // the ticket zeroed (serve_gate zeroes it on its own path), cuBLAS's gate GEMM (z rounded
        // to T), then serve_token
        if (a.ticket) check(cudaMemsetAsync(a.ticket, 0, sizeof(uint32_t), stream), "cudaMemsetAsync");
        run_gate_gemm(stream, st, p, xg, s);
        const int warps = heuristics::serve_token_warps(p.m, write_h);
        const int splits = heuristics::serve_token_splits(p.m, p.dp, write_h, warps);
        const int64_t per_split = ceil_div(p.dp / Chunk<T>::n, int64_t{splits});  // chunks a block
        const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(p.m)), block(32 * warps);
        // per_split <= one chunk a thread but for a hidden output (one split) past 4096 columns
        auto run = [&](auto kernel) {
            launch_dependent(kernel, grid, block, 0, stream, st.pdl, "cudaLaunchKernelEx(serve_token)", a);
        };
        if (warps == 8 && per_split <= 32 * 8)
            p.fp8 ? run(serve_token<T, 8, 1, true>) : run(serve_token<T, 8, 1>);
        else if (warps == 16 && per_split <= 32 * 16)
            p.fp8 ? run(serve_token<T, 16, 1, true>) : run(serve_token<T, 16, 1>);
        else if (warps == 16 && per_split <= 2 * 32 * 16)  // dp <= 8192 (heuristics::max_model_dim)
            p.fp8 ? run(serve_token<T, 16, 2, true>) : run(serve_token<T, 16, 2>);
        else
            fail(TW_STATUS_INTERNAL_ERROR, "serve_token: no instance for %lld chunks a split", static_cast<long long>(per_split));
    } else {
        // serve_gate: U 16-byte chunks of the weight row in flight per lane, and of R x rows
        // (FP8: their instances that read the FP8 rows)
        if (p.m <= 8)
            p.fp8 ? launch_serve_gate<T, 1, heuristics::kServeGateChunks, true>(stream, a)
                  : launch_serve_gate<T, 1, heuristics::kServeGateChunks, false>(stream, a);
        else
            p.fp8 ? launch_serve_gate<T, 2, 4, true>(stream, a) : launch_serve_gate<T, 2, 4, false>(stream, a);
        static_assert(heuristics::kServeGateMaxTokens <= 16, "serve_gate takes up to 2 x rows of 8 tokens");
        // serve_down: a block per (256 columns, token)
        const dim3 grid(static_cast<unsigned>(ceil_div(a.dp, int64_t{kServeDownCols})), static_cast<unsigned>(a.m));
        launch_dependent(p.fp8 ? serve_down<T, true> : serve_down<T, false>, grid, dim3(32 * kServeDownWarps), 0,
                         stream, st.pdl, "cudaLaunchKernelEx(serve_down)", a);
    }
    if (stats_kernel)
        launch_dependent(serve_stats<T>, dim3(1), dim3(32), 0, stream, st.pdl, "cudaLaunchKernelEx(serve_stats)", a);
}

/// Where dense mode keeps z, u and h (M x ldg each): h over u in the workspace (z stays for the
/// statistics), or with save_dense z and u in the saved state and h in the workspace.
struct DenseModeBuffers {
    void *z, *up, *h;
};

/// The packing pass of the sparse paths: unit lists, counts, the dense list, per-unit counts.
template <class T>
void launch_pack(cudaStream_t stream, const FfnProblem &p, const FfnScratch &s, unsigned long long *neuron_counts,
                 bool zero_inactive) {
    check(cudaMemsetAsync(s.header, 0, 2 * sizeof(uint32_t), stream), "cudaMemsetAsync");
    const PackArgs<T> pk{s.gate, s.ldg, p.m, p.h, p.gate_f32(), zero_inactive, p.tile, p.slots, s.cap, s.idx, s.count,
                         s.row_nnz, s.dense_rows, s.dense_count, neuron_counts, s.row_limit};
    pack_rows<T><<<static_cast<unsigned>(ceil_div(p.m, 4)), 128, 0, stream>>>(pk);
    check_launch("pack_rows");
}

/// Dense mode's statistics from z and h (a block per row; the header zeroed by form_hidden).
/// With `stats` its last block also publishes them (finalize's work).
template <class T>
void launch_dense_stats(cudaStream_t stream, const FfnProblem &p, const FfnScratch &s, const void *z, const void *h,
                        unsigned long long *neuron_counts, FfnStatsBlock *stats = nullptr, FfnFeedback *publish = nullptr) {
    const DenseStatsArgs<T> a{static_cast<const T *>(z), static_cast<const T *>(h), s.ldg, p.m, p.h, p.tile, p.slots,
                              s.row_limit, neuron_counts, s.count, s.row_nnz, s.row_l1, stats, publish, s.header + 1};
    dense_row_stats<T><<<static_cast<unsigned>(p.m), 32 * kDenseStatsWarps, 0, stream>>>(a);
    check_launch("dense_row_stats");
}

/// The gate and the unit lists of the sparse paths: the masked gate GEMM and the lists from its
/// words, or cuBLAS's gate GEMM and the packing pass over the gate (zeroing the inactive units'
/// values when a hidden output reads the gate buffer; the masked GEMM writes them as +0).
template <class T>
void run_gate_and_lists(cudaStream_t stream, CudaFfnState &st, const FfnProblem &p, const ForwardPath &path,
                        const twDnMatDescr &x, const FfnScratch &s, bool zero_inactive) {
    if (path.masked_gate) return run_masked_gate(stream, st, p, x, s, st.neuron_counts(), !path.lists_in_fwd_u);
    run_gate_gemm(stream, st, p, gemm_operand(x), s);
    launch_pack<T>(stream, p, s, st.neuron_counts(), zero_inactive);
}

/// Dense mode: the per-unit activation counts, by columns of the gate.
template <class T>
void launch_count_dense(cudaStream_t stream, const FfnProblem &p, const void *z, int64_t ldz, unsigned long long *counts) {
    const int64_t rows = count_rows_per_block(p.m);
    const dim3 grid(static_cast<unsigned>(ceil_div(ldz, 256 * 8)), static_cast<unsigned>(ceil_div(p.m, rows)));
    count_active_columns<T><<<grid, 256, 0, stream>>>(static_cast<const T *>(z), ldz, p.m, p.h, rows, counts);
    check_launch("count_active_columns");
}

template <class T, int V> void launch_fused_v(cudaStream_t stream, const FusedArgs<T> &a, int warps) {
    const int threads = 32 * warps;
    const size_t smem = kStages * sparse_stage_bytes<T>(a.dp, a.gated, threads);
    // over 48 KB only for D > ~6000 (16-bit)
    allow_dynamic_smem(sparse_ffn<T, V>, smem);
    const dim3 grid(static_cast<unsigned>(a.m), static_cast<unsigned>(a.splits));
    sparse_ffn<T, V><<<grid, threads, smem, stream>>>(a);
    check_launch("sparse_ffn");
}

/// The fused kernel over the sparse rows (h over the gate buffer when `write_h`), then the sum of
/// the teams' partial rows when a token's units were split.
template <class T>
void launch_fused(cudaStream_t stream, const FfnProblem &p, const FfnWeights &w, const MatrixArg &x, const MatrixArg &y,
                  const FfnScratch &s, bool write_h) {
    FusedArgs<T> a{static_cast<const T *>(x.ptr), x.rs, x.cs, rows_vectorizable(x, p.d), static_cast<T *>(y.ptr), y.rs,
                   y.cs, rows_vectorizable(y, p.d), static_cast<const T *>(w.up), w.up_ld, static_cast<const T *>(w.down),
                   w.down_ld, p.dp, p.d, p.m, s.gate, s.ldg, p.gate_f32(), p.gated, p.highest, write_h, s.idx, s.cap, s.count, s.row_l1,
                   s.splits, s.partial};
    constexpr int E = Chunk<T>::n;
    const int64_t per_warp_max = heuristics::kFusedWarpChunks * 32 * E;
    const int warps = std::max(1, ceil_div(a.dp, per_warp_max));  // dp <= max_model_dim (twCreateFfn)
    const int v_needed = ceil_div(a.dp, static_cast<int64_t>(warps) * 32 * E);
    static_assert(heuristics::kFusedWarpChunks <= 8, "launch_fused instantiates up to 8 chunks per lane");
    if (v_needed <= 1)
        launch_fused_v<T, 1>(stream, a, warps);
    else if (v_needed <= 2)
        launch_fused_v<T, 2>(stream, a, warps);
    else if (v_needed <= 4)
        launch_fused_v<T, 4>(stream, a, warps);
    else
        launch_fused_v<T, 8>(stream, a, warps);
    if (s.splits > 1) {
        reduce_splits<T><<<std::max(1, std::min(1024, ceil_div(p.m * p.d, 256))), 256, 0, stream>>>(
            s.partial, s.splits, p.m, p.d, p.dp, s.count, static_cast<T *>(y.ptr), y.rs, y.cs, s.row_l1);
        check_launch("reduce_splits");
    }
}

template <class T, bool FP8, class AfterU>
void launch_two_pass_kernels(cudaStream_t stream, const FfnProblem &p, const FwdArgs<T> &a, int ell, bool pdl,
                             AfterU &&after_u) {
    constexpr int E = Chunk<T>::n;
    if (FP8 && p.gated) {
        // x over the FP8 half (D rounded up to 16), then the list's ids, gate values and scales:
        // over 48 KB only past D ~ 8000 with long lists (max_model_dim keeps D at 8192)
        const size_t smem = static_cast<size_t>(a.fp8.half) * sizeof(T) + static_cast<size_t>(ell) * 12;
        allow_dynamic_smem(fwd_u_fp8<T>, smem);
        launch_dependent(fwd_u_fp8<T>, dim3(static_cast<unsigned>(p.m)), dim3(32 * kFwdUWarps), smem, stream, pdl,
                         "cudaLaunchKernelEx(fwd_u_fp8)", a);
    } else {
        // x_t (gated: at most 8192 x 2 or 4096 x 4 bytes, max_model_dim), then the list's ids and
        // gate values: over 48 KB only past D ~ 8000 with long lists
        const size_t smem = (p.gated ? static_cast<size_t>(p.dp) * sizeof(T) : 0) + static_cast<size_t>(ell) * 8;
        allow_dynamic_smem(fwd_u<T>, smem);
        launch_dependent(fwd_u<T>, dim3(static_cast<unsigned>(p.m)), dim3(32 * kFwdUWarps), smem, stream, pdl,
                         "cudaLaunchKernelEx(fwd_u)", a);
    }
    after_u();
    // a thread takes 8 (fp32: 4) columns, 16 with FP8 rows
    const int64_t cols_per_block = int64_t{kFwdYThreads} * (FP8 ? 16 : E);
    const dim3 grid(static_cast<unsigned>(p.m), static_cast<unsigned>(ceil_div(p.dp, cols_per_block)));
    const size_t list_smem = static_cast<size_t>(ell) * (sizeof(int64_t) + sizeof(float));
    // over 48 KB only for lists of more than 4096 units (H beyond ~34000 at the default tile)
    allow_dynamic_smem(fwd_y<T, FP8>, list_smem);
    launch_dependent(fwd_y<T, FP8>, grid, dim3(kFwdYThreads), list_smem, stream, pdl, "cudaLaunchKernelEx(fwd_y)", a);
}

/// The sparse rows in two passes: u and h per active unit (saved as g and u in training, else h
/// over the gate value), then y by column slices; `after_u` enqueues what follows fwd_u directly
/// (the dense path's fork, where fwd_u makes the lists).
template <class T, class AfterU>
void launch_two_pass(cudaStream_t stream, const FfnProblem &p, const FfnWeights &w, const MatrixArg &x,
                     const MatrixArg &y, const FfnScratch &s, bool pdl, const MaskListArgs *lists, AfterU &&after_u) {
    FwdArgs<T> a{static_cast<const T *>(x.ptr), x.rs, x.cs, rows_vectorizable(x, p.d), static_cast<T *>(y.ptr), y.rs,
                 y.cs, rows_vectorizable(y, p.d), static_cast<const T *>(w.up), w.up_ld, static_cast<const T *>(w.down),
                 w.down_ld, p.dp, p.d, p.m, p.h,
                 s.gate, s.ldg, p.gate_f32(), p.gated, p.highest, s.idx, s.count, s.cap, s.save_g, s.save_u, s.row_l1,
                 w.fp8, s.dense_rows, s.dense_count, lists ? *lists : MaskListArgs{}};
    if constexpr (std::is_same_v<T, float>) {
        launch_two_pass_kernels<T, false>(stream, p, a, s.cap, pdl, after_u);
    } else {
        if (p.fp8)
            launch_two_pass_kernels<T, true>(stream, p, a, s.cap, pdl, after_u);
        else
            launch_two_pass_kernels<T, false>(stream, p, a, s.cap, pdl, after_u);
    }
}

/// FP8: the rows of the dense list through the two-pass kernels' dense-row forms (a grid bound of
/// two blocks per SM: the list's length is known on the device only).
template <class T>
void launch_fp8_dense_rows(cudaStream_t stream, const CudaFfnState &st, const FfnProblem &p, const FfnWeights &w,
                           const MatrixArg &x, const MatrixArg &y, const FfnScratch &s) {
    if (p.m == 0) return;
    const FwdArgs<T> a{static_cast<const T *>(x.ptr), x.rs, x.cs, rows_vectorizable(x, p.d), static_cast<T *>(y.ptr),
                       y.rs, y.cs, rows_vectorizable(y, p.d), static_cast<const T *>(w.up), w.up_ld,
                       static_cast<const T *>(w.down), w.down_ld, p.dp, p.d,
                       p.m, p.h, s.gate, s.ldg, false, p.gated, false, s.idx, s.count, s.cap, nullptr, nullptr,
                       s.row_l1, w.fp8, s.dense_rows, s.dense_count, MaskListArgs{}};
    // about two waves of blocks in all: most forwards have few dense rows or none, and an idle
    // block still costs its launch
    auto rows_for = [&](int64_t per_row) {
        return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(p.m, ceil_div(4 * st.sm_count, per_row))));
    };
    if (p.gated) {
        const int64_t unit_blocks = ceil_div(p.h, int64_t{32} * kDenseRowWarps);
        const dim3 grid(rows_for(unit_blocks), static_cast<unsigned>(unit_blocks));
        launch_dependent(fwd_u_dense_rows<T>, grid, dim3(32 * kDenseRowWarps), static_cast<size_t>(a.fp8.half) * sizeof(T),
                         stream, st.pdl, "cudaLaunchKernelEx(fwd_u_dense_rows)", a);
    }
    const int64_t slices = ceil_div(p.dp, int64_t{512});
    launch_dependent(fwd_y_dense_rows<T>, dim3(rows_for(slices), static_cast<unsigned>(slices)), dim3(32 * kDenseRowYWarps), 0,
                     stream, st.pdl, "cudaLaunchKernelEx(fwd_y_dense_rows)", a);
}

/// The rows of the dense list from position `first` on, through the gathered GEMM: u (gated)
/// with h formed in its epilogue over the gate buffer, then the down projection into Y.
void launch_dense_path_gathered(cudaStream_t stream, const CudaFfnState &st, const FfnProblem &p, const FfnWeights &w,
                                const MatrixArg &x, const MatrixArg &y, const FfnScratch &s, int64_t first) {
    const bool tensor_cores = !p.gate_f32();
    GatheredGemm g{};
    g.dev_count = s.dense_count;
    g.m_dev = true;
    g.first = first;
    g.m = p.m;
    g.highest = p.highest;
    g.gated = p.gated;
    g.b_f32 = p.type == TW_R_32F;
    g.b_rk = g.b2_rk = 1;
    g.c_rows = s.dense_rows;
    if (p.gated) {
        GatheredGemm up = g;
        up.a = up.a2 = x.ptr, up.a_f32 = x.type == TW_R_32F, up.a_ri = x.rs, up.a_ck = x.cs, up.a_rows = s.dense_rows;
        up.b = up.b2 = w.up, up.b_cj = w.up_ld;
        up.n = p.h, up.k = p.d, up.ksplit = p.d;
        up.epi = GatherEpilogue::GateProduct, up.c = s.gate, up.c_rs = s.ldg, up.c_f32 = p.gate_f32();
        launch_gathered_gemm(stream, up, p.type, tensor_cores, st.sm_count, st.pdl);
    }
    GatheredGemm down = g;
    down.a = down.a2 = s.gate, down.a_f32 = p.gate_f32(), down.relu_a = !p.gated, down.a_ri = s.ldg, down.a_ck = 1;
    down.a_rows = s.dense_rows;
    // Wd^T: row j of Wd holds the reduction's column j (k = unit, j = output column)
    down.b = down.b2 = w.down, down.b_rk = down.b2_rk = w.down_ld, down.b_cj = 1;
    down.n = p.d, down.k = p.h, down.ksplit = p.h;
    down.epi = GatherEpilogue::ScatterRows, down.c = y.ptr, down.c_rs = y.rs, down.c_cs = y.cs;
    launch_gathered_gemm(stream, down, p.type, tensor_cores, st.sm_count, st.pdl);
}

/// The cuBLAS part of the dense path: the first `cap` rows of the dense list compacted,
/// multiplied by GEMMs of `cap` rows, and scattered back.
template <class T>
void run_dense_path_cublas(cudaStream_t stream, CudaFfnState &st, const FfnProblem &p, const FfnScratch &s,
                           const twDnMatDescr &x, const MatrixArg &y, int64_t cap, bool write_hidden) {
    const MatrixArg xa = matrix_arg(x);
    const unsigned blocks = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(cap, 1024)));
    if (p.gated) {
        gather_rows<T><<<blocks, 256, 0, stream>>>(static_cast<const T *>(xa.ptr), xa.rs, xa.cs, p.d, s.dense_rows,
                                                  s.dense_count, cap, static_cast<T *>(s.xc), p.dp);
        check_launch("gather_rows");
        const FfnWeights w = st.weights(p);
        st.gemm.run(stream, 1.0f, {s.xc, cap, p.d, p.dp, TW_ORDER_ROW, p.type},
                    {w.up, p.h, p.d, w.up_ld, TW_ORDER_ROW, p.type}, {s.up, s.ldg, p.type}, s.lt_workspace,
                    s.lt_bytes);
    }
    compact_hidden<T><<<static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(cap, 4096))), 256, 0, stream>>>(
        static_cast<T *>(s.gate), s.ldg, static_cast<T *>(s.up), p.h, p.gated, s.dense_rows, s.dense_count, cap,
        write_hidden, s.row_l1);
    check_launch("compact_hidden");
    st.gemm.run(stream, 1.0f, {s.up, cap, p.h, s.ldg, TW_ORDER_ROW, p.type}, down_t_operand(st.weights(p), p),
                {s.xc, p.dp, p.type}, s.lt_workspace, s.lt_bytes);
    scatter_rows<T><<<blocks, 256, 0, stream>>>(static_cast<const T *>(s.xc), p.dp, p.d, s.dense_rows, s.dense_count, cap,
                                               static_cast<T *>(y.ptr), y.rs, y.cs);
    check_launch("scatter_rows");
}

/// The optional hidden output from h: the gate buffer's (inactive units zeroed, or outside the
/// gate's mask), or dense mode's `h_values` (ldg apart); PLAIN keeps every stored pattern but +0,
/// as the reference does.
inline void write_hidden_output(cudaStream_t stream, const FfnProblem &p, const FfnScratch &s,
                                const twSpMatDescr *hidden, const ActiveMask &gate_mask = {},
                                void *h_values = nullptr) {
    if (!hidden) return;
    const MatrixArg h{h_values ? h_values : s.gate, p.m, p.h, s.ldg, 1, p.gate_f32() ? TW_R_32F : p.type};
    write_sparse(stream, h, TW_CONVERT_PLAIN, *hidden, s.writer_flags, gate_mask);
}

/// Statistics (and the l1 of dense-path rows from list position `first` on), published for the
/// path choice, then the optional hidden output from h.
template <class T>
void launch_finish(cudaStream_t stream, const CudaFfnState &st, const FfnProblem &p, const FfnScratch &s,
                   bool dense_l1, int64_t first, const twSpMatDescr *hidden, const ActiveMask &gate_mask = {}) {
    const unsigned blocks = static_cast<unsigned>(std::max(1, std::min(264, ceil_div(p.m, kFinalThreads / 32))));
    launch_dependent(finalize<T>, dim3(blocks), dim3(kFinalThreads), 0, stream, st.pdl, "cudaLaunchKernelEx(finalize)",
                     s.gate, s.ldg, p.h, p.gate_f32(), !p.gated, s.dense_rows, s.dense_count, dense_l1, first, p.m,
                     s.row_nnz, s.count, s.row_l1, s.header + 1, st.stats_block(), st.feedback.device());
    write_hidden_output(stream, p, s, hidden, gate_mask);
}

/// Dense mode: z = X Wg^T and the up projection of every row (gated) by one cuBLAS GEMM of two
/// batches, h by one element-wise pass, then the down projection by cuBLAS; the statistics (which
/// read z and h) on a branch beside the down GEMM, joined before the call's later work. Up to
/// heuristics::kDenseModeFoldMaxTokens tokens one pass (dense_row_stats) counts the active
/// units, forms each row's statistics and publishes them; past it count_active_columns, that
/// pass and finalize do.
template <class T>
void run_dense_mode(cudaStream_t stream, CudaFfnState &st, const FfnProblem &p, const FfnScratch &s,
                    const twDnMatDescr &x, const twDnMatDescr &y, const DenseModeBuffers &b) {
    if (p.gated) {
        // z and u: one strided-batched GEMM, as the dense FFN stacks [Wg; Wu], where Wu starts
        // 16-byte aligned after Wg with the same leading dimension (the FFN's copy: dp further
        // on; in place, a stacked [Wg; Wu] storage or two allocations in that order), else two
        // GEMMs. u's buffer is (up - z) after z's (16-bit values; both
        // layouts, the workspace's and the saved state's, place u after z)
        const FfnWeights w = st.weights(p);
        const ptrdiff_t apart = static_cast<const char *>(b.up) - static_cast<const char *>(b.z);
        if (apart < static_cast<ptrdiff_t>(p.m * s.ldg) * 2)
            fail(TW_STATUS_INTERNAL_ERROR, "dense mode: u's buffer does not follow z's");
        const GemmOperand wg{w.gate, p.h, p.d, w.gate_ld, TW_ORDER_ROW, p.type};
        const ptrdiff_t w_apart = static_cast<const char *>(w.up) - static_cast<const char *>(w.gate);
        if (w.up_ld == w.gate_ld && w_apart > 0 && w_apart % 16 == 0) {
            st.gemm.run(stream, 1.0f, gemm_operand(x), wg, {b.z, s.ldg, p.type}, s.lt_workspace, s.lt_bytes,
                        GemmBatch{2, 0, w_apart / p.weight_bytes(), apart / 2});
        } else {
            st.gemm.run(stream, 1.0f, gemm_operand(x), wg, {b.z, s.ldg, p.type}, s.lt_workspace, s.lt_bytes);
            st.gemm.run(stream, 1.0f, gemm_operand(x), {w.up, p.h, p.d, w.up_ld, TW_ORDER_ROW, p.type},
                        {b.up, s.ldg, p.type}, s.lt_workspace, s.lt_bytes);
        }
    } else {
        FfnScratch zs = s;
        zs.gate = b.z;
        run_gate_gemm(stream, st, p, gemm_operand(x), zs);
    }
    const int64_t chunks = p.m * (s.ldg / 8);
    form_hidden<T><<<static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(ceil_div(chunks, 256), 8 * st.sm_count))),
                     256, 0, stream>>>(static_cast<const T *>(b.z), p.gated ? static_cast<const T *>(b.up) : nullptr,
                                       static_cast<T *>(b.h), s.ldg, p.m, p.h, s.header);
    check_launch("form_hidden");
    // the statistics beside the down GEMM, off the path; the GEMM enqueued first, so that its
    // tiles take the SMs before the statistics' blocks: in the other order (and no memset node
    // before them) 256 tokens took 54.6 us against 51.4 on an H100, llm-29
    st.branch.mark(stream);
    st.gemm.run(stream, 1.0f, {b.h, p.m, p.h, s.ldg, TW_ORDER_ROW, p.type}, down_t_operand(st.weights(p), p),
                {y.values, y.ld, p.type}, s.lt_workspace, s.lt_bytes);
    const cudaStream_t side = st.branch.fork_from_mark();
    if (p.m <= heuristics::kDenseModeFoldMaxTokens) {
        launch_dense_stats<T>(side, p, s, b.z, b.h, st.neuron_counts(), st.stats_block(), st.feedback.device());
    } else {
        launch_count_dense<T>(side, p, b.z, s.ldg, st.neuron_counts());
        launch_dense_stats<T>(side, p, s, b.z, b.h, nullptr);
        launch_finish<T>(side, st, p, s, false, 0, nullptr);
    }
    st.branch.join(stream);
}

// ---- the sequences

/// The rows of the dense list: FP8 through the two-pass kernels' dense-row forms, else the first
/// path.cublas_rows through cuBLAS and any beyond through the gathered GEMM.
template <class T>
void enqueue_dense_path(cudaStream_t stream, CudaFfnState &st, const FfnProblem &p, const ForwardPath &path,
                        const twDnMatDescr &x, const FfnWeights &w, const MatrixArg &xa, const MatrixArg &ya,
                        const FfnScratch &s, bool write_hidden) {
    if constexpr (!std::is_same_v<T, float>) {
        if (p.fp8) return launch_fp8_dense_rows<T>(stream, st, p, w, xa, ya, s);
        if (path.cublas_rows > 0) run_dense_path_cublas<T>(stream, st, p, s, x, ya, path.cublas_rows, write_hidden);
    }
    launch_dense_path_gathered(stream, st, p, w, xa, ya, s, path.cublas_rows);
}

/// The gate, the unit lists, the sparse rows and the dense path's rows (inference and training
/// alike). The dense path needs the dense list, which exists after the lists' maker (or after
/// fwd_u, path.lists_in_fwd_u); it writes only its own rows of h and Y, so it runs on the FFN's
/// branch beside the sparse kernels (on an H200 its launches cost ~4 us in line even when the
/// list is empty) and is joined before the statistics, which read its rows' h.
template <class T>
void enqueue_gate_and_rows(cudaStream_t stream, CudaFfnState &st, const FfnProblem &p, const ForwardPath &path,
                           const twDnMatDescr &x, const FfnWeights &w, const MatrixArg &xa, const MatrixArg &ya,
                           const FfnScratch &s, bool write_hidden) {
    run_gate_and_lists<T>(stream, st, p, path, x, s, write_hidden);
    auto dense_path_beside = [&] {
        enqueue_dense_path<T>(st.branch.fork(stream), st, p, path, x, w, xa, ya, s, write_hidden);
    };
    if (!path.lists_in_fwd_u) dense_path_beside();
    if (path.two_pass) {
        const MaskListArgs lists = mask_list_args(p, s, st.neuron_counts());
        launch_two_pass<T>(stream, p, w, xa, ya, s, st.pdl, path.lists_in_fwd_u ? &lists : nullptr, [&] {
            if (path.lists_in_fwd_u) dense_path_beside();
        });
    } else {
        launch_fused<T>(stream, p, w, xa, ya, s, write_hidden);
    }
    st.branch.join(stream);
}

template <class T>
void enqueue_inference(cudaStream_t stream, CudaFfnState &st, const FfnProblem &p, const ForwardPath &path,
                       const twDnMatDescr &x, const twDnMatDescr &y, const twSpMatDescr *hidden, void *workspace) {
    const FfnScratch s = carve_ffn_scratch(workspace, p, nullptr);
    const FfnWeights w = st.weights(p);
    const MatrixArg xa = matrix_arg(x), ya = matrix_arg(y);
    if (path.serve) {
        if constexpr (!std::is_same_v<T, float>) {
            launch_serve<T>(stream, st, p, w, xa, gemm_operand(x), ya, s, st.neuron_counts(), hidden != nullptr);
            if (hidden) {  // h over the gate buffer, 0 for inactive units (serve_gate wrote them)
                const MatrixArg h{s.gate, p.m, p.h, s.ldg, 1, p.type};
                write_sparse(stream, h, TW_CONVERT_PLAIN, *hidden, s.writer_flags);
            }
        }
        return;
    }
    if (path.decode) {
        if constexpr (!std::is_same_v<T, float>) launch_decode<T>(stream, p, w, xa, ya, s, st.neuron_counts(), hidden);
        launch_finish<T>(stream, st, p, s, false, 0, hidden);
        return;
    }
    if (path.dense_mode) {  // h over u in the workspace
        if constexpr (!std::is_same_v<T, float>) run_dense_mode<T>(stream, st, p, s, x, y, {s.gate, s.up, s.up});
        write_hidden_output(stream, p, s, hidden, {}, s.up);
        return;
    }
    enqueue_gate_and_rows<T>(stream, st, p, path, x, w, xa, ya, s, hidden != nullptr);
    launch_finish<T>(stream, st, p, s, true, path.cublas_rows, hidden,
                     path.masked_gate ? ActiveMask{s.unit_masks, s.unit_words} : ActiveMask{});
}

/// The training forward: the saved state holds the lists, counts and g / u of the sparse rows;
/// the rows of the dense path keep only their id (the backward recomputes them).
template <class T>
void enqueue_training(cudaStream_t stream, CudaFfnState &st, const FfnProblem &p, const ForwardPath &path,
                      const twDnMatDescr &x, const twDnMatDescr &y, void *saved, void *workspace) {
    FfnScratch s = carve_ffn_scratch(workspace, p, nullptr);
    point_scratch_into_saved(p, saved, s);
    const SavedLayout l = saved_layout(p);
    write_header<<<1, 1, 0, stream>>>(saved_header(p), reinterpret_cast<SavedHeader *>(static_cast<char *>(saved) + l.header));
    check_launch("write_header");
    // what the backward of this saved state follows (recorded now: a failure below leaves no
    // state to differentiate anyway)
    st.train_forwards.remember(saved, p.m, {path.dense_mode, path.dense_mode && p.save_dense});
    if (p.m == 0) {  // the saved state of no tokens: a header and an empty dense list
        check(cudaMemsetAsync(s.header, 0, 2 * sizeof(uint32_t), stream), "cudaMemsetAsync");
        return;
    }
    const FfnWeights w = st.weights(p);
    const MatrixArg xa = matrix_arg(x), ya = matrix_arg(y);
    if (path.dense_mode) {
        // every row is saved as one the backward recomputes (through cuBLAS: see ffn_backward);
        // with save_dense z and u stay in the saved state too, and the backward reads them
        // instead when it knows this forward wrote them (st.train_forwards)
        char *const sb = static_cast<char *>(saved);
        const DenseModeBuffers b = p.save_dense ? DenseModeBuffers{sb + l.dense_z, p.gated ? sb + l.dense_u : nullptr, s.gate}
                                                : DenseModeBuffers{s.gate, s.up, s.up};
        if constexpr (!std::is_same_v<T, float>) run_dense_mode<T>(stream, st, p, s, x, y, b);
        all_rows_dense<<<std::max(1, std::min(1024, ceil_div(p.m, 256))), 256, 0, stream>>>(s.count, s.dense_rows,
                                                                                          s.dense_count, p.m);
        check_launch("all_rows_dense");
        return;
    }
    enqueue_gate_and_rows<T>(stream, st, p, path, x, w, xa, ya, s, false);  // two-pass: path.two_pass
    launch_finish<T>(stream, st, p, s, true, path.cublas_rows, nullptr);
}

/// Everything the inference forward's enqueued work depends on.
CallKey inference_key(const FfnProblem &p, const ForwardPath &path, const FfnWeights &w, const twDnMatDescr &x,
                      const twDnMatDescr &y, const twSpMatDescr *hidden, const void *workspace) {
    CallKey k;
    k.add(p.m).add(p.highest).add(p.fp8).add(p.deterministic).add(p.tile).add(p.slots);
    k.add(path.serve).add(path.decode).add(path.dense_mode).add(path.masked_gate).add(path.two_pass).add(path.cublas_rows);
    k.add(path.lists_in_fwd_u);
    for (const twDnMatDescr *d : {&x, &y}) k.add(d->values).add(d->ld).add(d->order);
    k.add(workspace).add(hidden);
    // the weights' addresses (twFfnUpdateWeights may point the FFN elsewhere)
    k.add(w.gate).add(w.gate_ld).add(w.up).add(w.up_ld).add(w.down).add(w.down_ld);
    if (hidden) {
        k.add(hidden->buffer).add(hidden->format).add(hidden->type).add(hidden->rows).add(hidden->cols);
        k.add(hidden->twell.tile_width).add(hidden->twell.compression);
        k.add(hidden->hybrid.ell_width).add(hidden->hybrid.backup_rows);
    }
    return k;
}

}  // namespace

void ffn_forward(cudaStream_t stream, const twFfnDescr &ffn, const twDnMatDescr &x, const twDnMatDescr &y,
                 const twSpMatDescr *hidden, void *workspace) {
    CudaFfnState &st = state_of(ffn);
    const FfnProblem p = problem_of(ffn, x.rows);
    std::lock_guard<std::mutex> lock(st.mutex);
    absorb_feedback(st);
    if (p.fp8 && !st.fp8_q.get()) fail(TW_STATUS_INTERNAL_ERROR, "FP8 forward without the FP8 copy's memory");
    if (p.fp8 && st.fp8_stale) {
        // outside the captured call: a graph replays the forward, not the quantization (a
        // caller's own capture records it once, and its replays quantize again: still exact)
        quantize_fp8_weights(stream, st, p);
        st.fp8_stale = false;
    }
    const ForwardPath path = choose_path(st, p, x, y, false);
    const CallKey key = inference_key(p, path, st.weights(p), x, y, hidden, workspace);
    if (!st.calls.seen(key)) {  // once per argument set: a replayed call's pointers were checked
        require_device_accessible(x.values, "X");
        require_device_accessible(y.values, "Y");
        require_apart_from_weights(st, byte_range(y), "Y");
        if (hidden) require_device_accessible(hidden->buffer, "hidden");
        if (hidden) require_apart_from_weights(st, byte_range(*hidden), "hidden");
        require_device_accessible(workspace, "workspace");
    }
    st.calls.run(stream, key, ffn.call_graphs != 0, [&](cudaStream_t s) {
        by_type(p.type, [&](auto tag) { enqueue_inference<decltype(tag)>(s, st, p, path, x, y, hidden, workspace); });
    });
}

namespace {
/// The last forward's l1 as twFfnGetStats computes it, rounded to float.
__global__ void forward_l1_kernel(const FfnStatsBlock *block, float *dst) {
    const FfnDeviceStats &s = block->last;
    *dst = s.tokens ? static_cast<float>(s.l1_sum / static_cast<double>(s.tokens)) : 0.0f;
}
}  // namespace

void write_forward_l1(cudaStream_t stream, const twFfnDescr &ffn, float *dst) {
    // an ordinary launch: it starts after the forward's last kernel has finished, statistics included
    forward_l1_kernel<<<1, 1, 0, stream>>>(state_of(ffn).stats_block(), dst);
    check_launch("forward_l1_kernel");
}

void ffn_forward_train(cudaStream_t stream, const twFfnDescr &ffn, const twDnMatDescr &x, const twDnMatDescr &y,
                       void *saved, void *workspace) {
    CudaFfnState &st = state_of(ffn);
    const FfnProblem p = problem_of(ffn, x.rows);
    std::lock_guard<std::mutex> lock(st.mutex);
    st.train_pointers.require(x.values, "X");
    st.train_pointers.require(y.values, "Y");
    st.train_pointers.require(saved, "saved");
    st.train_pointers.require(workspace, "workspace");
    require_apart_from_weights(st, byte_range(y), "Y");
    absorb_feedback(st);
    const ForwardPath path = choose_path(st, p, x, y, true);
    by_type(p.type, [&](auto tag) { enqueue_training<decltype(tag)>(stream, st, p, path, x, y, saved, workspace); });
}

}  // namespace twblas::cuda
