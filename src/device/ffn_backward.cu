// The training backward of the fused FFN, from the forward's saved state:
//   recompute  rows the forward sent through its dense path (a TwELL tile over capacity, or more
//              active units than the saved ELL holds) are recomputed from X: the first of them
//              (in ascending row order) through cuBLAS GEMMs of a capacity the statistics suggest,
//              the rest through the gathered GEMM whose row count is read on the device; their
//              dz, du, h, dX rows and fp32 weight-gradient terms (exact for any number of rows);
//   tokens     for each saved (token, unit) slot dh = dY_t . Wd_j on the unit's row only, then
//              dz and du; then dX_t = sum du Wu_j + dz Wg_j over the token's units;
//   transpose  the (token, unit) slots are sorted by unit with a stable radix sort: each unit's
//              tokens come out in ascending order, so every sum below has a fixed order;
//   units      a block per unit sums dz X_t, du X_t and h dY_t over its tokens (plus the
//              recomputed rows' terms) and writes the unit's rows of dWg, dWu, dWd once.
// The recompute and the transpose need only the saved state: they run on the FFN's branch beside
// the token phase, joined before the units.
// Nothing uses atomics on values: the results are bitwise reproducible.
#include "ffn_backward.hpp"
#include "ffn_forward.hpp"

#include <cub/device/device_radix_sort.cuh>

#include <algorithm>

#include "common/cluster_launch.cuh"
#include "common/dispatch.hpp"
#include "common/matrix_arg.hpp"
#include "common/pointer_check.hpp"
#include "gemm/gathered_gemm.hpp"
#include "plan/forward_plan.hpp"
#include "kernels/bwd_recompute.cuh"
#include "kernels/bwd_tokens.cuh"
#include "kernels/bwd_units.cuh"

namespace twblas::cuda {

namespace {

// The unit phase's shape for units active on many tokens (docs/performance-notes.md, "Tuning"):
// a hot unit's tokens are summed by kUnitTokenGroups groups of 64 threads, in clusters of
// kHotUnitCluster blocks (sm_90), kHotUnitBlocks units a launch. Only the hot units take groups:
// every unit in groups made the training step 4-16 % slower (fewer blocks an SM).
constexpr int kUnitTokenGroups = 8;
constexpr int kHotUnitCluster = 8;
constexpr int64_t kHotUnitBlocks = 64;
/// A unit is hot past 256 tokens, or M / 32 past 8192 tokens: a function of M alone, so the bits
/// are the same from call to call.
constexpr int64_t unit_hot_tokens(int64_t m) { return m / 32 > 256 ? m / 32 : 256; }

struct BackwardArgs {
    MatrixArg x, dy, dx, dwg, dwu, dwd;  // dwg.ptr NULL for a plain FFN
    L1Scale l1_scale;                    // l1Coeff / M
};

/// The recomputed rows (the forward's dense list): z, u and dh by GEMMs over their gathered X
/// and dY rows, dz, du, h in the dh GEMM's epilogue, then their dX rows and weight-gradient terms.
template <class T>
void recompute_rows(cudaStream_t stream, const FfnProblem &p, const FfnWeights &w, const SavedView &sv,
                    const BackwardArgs &b, const TrainScratch &s, int64_t first, int sm_count) {
    const bool f32 = p.gate_f32(), tc = !f32;
    const T *wg = static_cast<const T *>(w.gate);  // Wg (gated) or Wu (plain), gate_ld apart
    const T *wu = static_cast<const T *>(w.up);    // Wu (gated), up_ld apart
    const T *wd = static_cast<const T *>(w.down);  // Wd, down_ld apart
    GatheredGemm base{};
    base.dev_count = sv.dense_count;
    base.m_dev = true;
    base.first = first;  // list positions before it went through cuBLAS
    base.m = p.m;
    base.gated = p.gated;
    base.highest = p.highest;
    base.l1_scale = b.l1_scale;
    base.c_f32 = f32;
    base.ldr = p.hp;
    // z = X_r Wg^T, u = X_r Wu^T (rows gathered from X), stored in the gate type
    GatheredGemm z = base;
    z.a = z.a2 = b.x.ptr, z.a_f32 = b.x.type == TW_R_32F, z.a_ri = b.x.rs, z.a_ck = b.x.cs, z.a_rows = sv.dense_rows;
    z.b = z.b2 = wg, z.b_f32 = p.type == TW_R_32F, z.b_rk = z.b2_rk = 1, z.b_cj = w.gate_ld;
    z.ksplit = p.d, z.n = p.h, z.k = p.d;
    z.epi = GatherEpilogue::StoreGate, z.c = s.rz, z.c_rs = p.hp;
    launch_gathered_gemm(stream, z, p.type, tc, sm_count);
    if (p.gated) {
        GatheredGemm u = z;
        u.b = u.b2 = wu, u.b_cj = w.up_ld, u.c = s.ru;
        launch_gathered_gemm(stream, u, p.type, tc, sm_count);
    }
    // dh = dY_r Wd^T; the epilogue turns (z, u, dh) into dz, du, h
    GatheredGemm dh = z;
    dh.a = dh.a2 = b.dy.ptr, dh.a_ri = b.dy.rs, dh.a_ck = b.dy.cs;
    dh.b = dh.b2 = wd, dh.b_cj = w.down_ld;
    dh.epi = GatherEpilogue::BackwardGrad, dh.rz = s.rz, dh.ru = s.ru, dh.rh = s.rh;
    launch_gathered_gemm(stream, dh, p.type, tc, sm_count);
    // dX rows = [dZ | dU] [Wg ; Wu] (gated) or dZ Wu (plain), scattered to the rows' places
    GatheredGemm dx = base;
    dx.a = s.rz, dx.a2 = s.ru, dx.a_f32 = f32, dx.a_ri = p.hp, dx.a_ck = 1, dx.a_rows = nullptr;
    dx.b = wg, dx.b2 = wu, dx.b_f32 = p.type == TW_R_32F, dx.b_rk = w.gate_ld, dx.b2_rk = w.up_ld, dx.b_cj = 1;
    dx.ksplit = p.h, dx.n = p.d, dx.k = p.gated ? 2 * p.h : p.h;
    dx.epi = GatherEpilogue::ScatterRows, dx.c = b.dx.ptr, dx.c_rs = b.dx.rs, dx.c_cs = b.dx.cs, dx.c_rows = sv.dense_rows;
    launch_gathered_gemm(stream, dx, p.type, tc, sm_count);
    // weight-gradient terms: dZ^T X_r, dU^T X_r, H^T dY_r (reduction over the device count)
    GatheredGemm dw = base;
    dw.m_dev = false, dw.k_dev = true;
    dw.m = p.h, dw.n = p.d, dw.k = p.m;
    dw.a_f32 = f32, dw.a_ri = 1, dw.a_ck = p.hp, dw.a_rows = nullptr;
    dw.b_f32 = b.x.type == TW_R_32F, dw.b_cj = b.x.cs, dw.b_rk = dw.b2_rk = b.x.rs, dw.b_rows = sv.dense_rows;
    dw.ksplit = p.m;
    dw.epi = first > 0 ? GatherEpilogue::AccumF32 : GatherEpilogue::StoreF32, dw.c_rs = p.dp;
    const int64_t plane = p.h * p.dp;
    dw.a = dw.a2 = s.rz, dw.b = dw.b2 = b.x.ptr, dw.c = s.dw_dense;
    launch_gathered_gemm(stream, dw, p.type, tc, sm_count);
    if (p.gated) {
        dw.a = dw.a2 = s.ru, dw.c = s.dw_dense + plane;
        launch_gathered_gemm(stream, dw, p.type, tc, sm_count);
    }
    dw.a = dw.a2 = s.rh, dw.c = s.dw_dense + 2 * plane;
    dw.b = dw.b2 = b.dy.ptr, dw.b_cj = b.dy.cs, dw.b_rk = dw.b2_rk = b.dy.rs;
    launch_gathered_gemm(stream, dw, p.type, tc, sm_count);
}

template <class T> void launch_tokens(cudaStream_t stream, const TokenArgs<T> &a) {
    if (a.m == 0) return;
    constexpr int E = Chunk<T>::n;
    const size_t smem = static_cast<size_t>(a.dp) * sizeof(T);  // dY_t
    allow_dynamic_smem(token_dh<T>, smem);
    token_dh<T><<<static_cast<unsigned>(a.m), 32 * kDhWarps, smem, stream>>>(a);
    check_launch("token_dh");
    // blockIdx.x = token is the fast index: the grid runs slice by slice, so the slice of the
    // weight rows in use (2 x 5.8 MB at the paper's shape) stays in L2
    const dim3 grid(static_cast<unsigned>(a.m), static_cast<unsigned>(ceil_div(a.dp, int64_t{kDxThreads} * E)));
    token_dx<T><<<grid, kDxThreads, 0, stream>>>(a);
    check_launch("token_dx");
}

/// The saved slots sorted by unit (a stable radix sort: each unit's tokens in ascending order),
/// each unit's first position in the sorted list, and, with `list_hot`, the list of hot units.
void sort_slots_by_unit(cudaStream_t stream, const FfnProblem &p, const SavedView &sv, int32_t ell,
                        const TrainScratch &s, int64_t hot_tokens, bool list_hot) {
    const int64_t total = p.m * ell;
    if (total > 0) {
        slot_keys<<<std::max(1, std::min(4096, ceil_div(total, 256))), 256, 0, stream>>>(
            sv.idx, sv.count, p.m, ell, p.h, s.keys, s.slots, s.hot_count);
        check_launch("slot_keys");
        size_t temp = s.sort_bytes;
        check(cub::DeviceRadixSort::SortPairs(s.sort_temp, temp, s.keys, s.keys_sorted, s.slots, s.slots_sorted,
                                              static_cast<int>(total), 0, key_bits(p.h), stream),
              "cub::DeviceRadixSort");
    }
    unit_starts<<<std::max(1, std::min(4096, ceil_div(std::max<int64_t>(total, p.h + 1), 256))), 256, 0, stream>>>(
        s.keys_sorted, total, p.h, s.unit_start, hot_tokens, list_hot ? s.hot_units : nullptr, s.hot_count);
    check_launch("unit_starts");
}

/// The hot units' kernel: clusters of kHotUnitCluster blocks a unit where cluster
/// launches run (an sm_90+ GPU running compute_90+ code: DeviceInfo::pdl's condition), else
/// one block a unit.
template <class T>
void launch_hot_units(cudaStream_t stream, const UnitArgs<T> &ua, int64_t h, unsigned slices, bool clusters) {
    constexpr int G = kUnitTokenGroups, N = kHotUnitCluster;
    const unsigned units = static_cast<unsigned>(std::min<int64_t>(h, kHotUnitBlocks));
    if (!clusters || N == 1) {
        backward_hot_units<T, G, 1><<<dim3(units, slices), kUnitThreads * G, 0, stream>>>(ua);
        check_launch("backward_hot_units");
        return;
    }
    launch_in_clusters(backward_hot_units<T, G, N>, dim3(units * N, slices), dim3(kUnitThreads * G), N, 0, stream,
                       "cudaLaunchKernelEx(backward_hot_units)", ua);
}

template <class T>
void backward(cudaStream_t stream, const FfnProblem &p, const FfnWeights &w, const void *saved, const BackwardArgs &b,
              const TrainScratch &s, int64_t first, int sm_count, StreamBranch &branch, bool clusters) {
    const SavedView sv = saved_view(p, saved);
    const SavedLayout l = saved_layout(p);
    const bool f32 = p.gate_f32();
    // clang-format off
    TokenArgs<T> ta{static_cast<const T *>(b.dy.ptr), b.dy.rs, b.dy.cs, rows_vectorizable(b.dy, p.d),
                    static_cast<T *>(b.dx.ptr), b.dx.rs, b.dx.cs, rows_vectorizable(b.dx, p.d),
                    static_cast<const T *>(w.up), w.up_ld, static_cast<const T *>(w.down), w.down_ld,
                    static_cast<const T *>(w.gate), w.gate_ld,
                    p.dp, p.d, p.m, p.h, f32, p.gated, p.highest, b.l1_scale,
                    sv.idx, sv.g, sv.u, sv.count, l.ell, s.dz, s.du};
    // clang-format on
    const int64_t total = p.m * l.ell;
    const int64_t hot_tokens = unit_hot_tokens(p.m);
    // a unit has at most M slots: up to hot_tokens tokens none is hot, so no list and no hot kernel
    const bool hot_possible = total > 0 && p.m > hot_tokens;
    // The token phase on the main stream; beside it, on the branch, the work that needs only the
    // saved state: the recompute of the dense-path rows (their own dX rows, which the token phase
    // skips, and their fp32 terms) and the slots' sort by unit. The unit phase reads all three,
    // so it starts after the join. (In line, the recompute's gathered GEMMs cost a launch each
    // even when the dense list is empty.)
    branch.mark(stream);
    launch_tokens<T>(stream, ta);
    const cudaStream_t side = branch.fork_from_mark();
    if (p.m > 0) {
        SavedView sorted = sv;
        sorted.dense_rows = s.rows_sorted;
        recompute_rows<T>(side, p, w, sorted, b, s, first, sm_count);
    }
    sort_slots_by_unit(side, p, sv, l.ell, s, hot_tokens, hot_possible);
    branch.join(stream);

    const MatrixArg &oz = p.gated ? b.dwg : b.dwu;
    // clang-format off
    UnitArgs<T> ua{static_cast<const T *>(b.x.ptr), b.x.rs, b.x.cs, rows_vectorizable(b.x, p.d),
                   static_cast<const T *>(b.dy.ptr), b.dy.rs, b.dy.cs, rows_vectorizable(b.dy, p.d),
                   s.unit_start, s.slots_sorted, l.ell, sv.g, sv.u, s.dz, s.du, f32, p.gated, p.highest,
                   hot_tokens, s.hot_units, s.hot_count,
                   s.dw_dense, sv.dense_count, p.dp, p.d, p.h,
                   static_cast<T *>(oz.ptr), oz.rs, oz.cs, rows_vectorizable(oz, p.d),
                   static_cast<T *>(b.dwu.ptr), b.dwu.rs, b.dwu.cs, rows_vectorizable(b.dwu, p.d),
                   static_cast<T *>(b.dwd.ptr), b.dwd.rs, b.dwd.cs, rows_vectorizable(b.dwd, p.d)};
    // clang-format on
    if (p.h > 0 && p.d > 0) {
        const unsigned slices = static_cast<unsigned>(ceil_div(p.dp, kUnitThreads * Chunk<T>::n));
        // the hot units (listed only when there are slots) on the main stream, enqueued first so
        // that their long sums start at once, the other units on the branch beside them (the
        // other order, hot units on the branch, measured the same: 924 against 912 us a step
        // with 8 units on every token, d_model 512, 8192 tokens; H100, same call)
        const dim3 cold_grid(static_cast<unsigned>(p.h), slices);
        if (hot_possible) {
            branch.mark(stream);
            launch_hot_units<T>(stream, ua, p.h, slices, clusters);
            backward_units<T><<<cold_grid, kUnitThreads, 0, branch.fork_from_mark()>>>(ua);
            check_launch("backward_units");
            branch.join(stream);
        } else {
            backward_units<T><<<cold_grid, kUnitThreads, 0, stream>>>(ua);
            check_launch("backward_units");
        }
    }
}

// ---- the cuBLAS part of the recompute: list positions [0, cap) of the sorted dense list

void sort_dense_list(cudaStream_t stream, const FfnProblem &p, const void *saved, const TrainScratch &s) {
    if (p.m == 0) return;
    const SavedView sv = saved_view(p, saved);
    dense_row_keys<<<std::max(1, std::min(1024, ceil_div(p.m, 256))), 256, 0, stream>>>(sv.dense_rows, sv.dense_count, p.m,
                                                                                      s.rows_key);
    check_launch("dense_row_keys");
    size_t temp = s.rows_bytes;
    check(cub::DeviceRadixSort::SortKeys(s.rows_temp, temp, s.rows_key, s.rows_sorted, static_cast<int>(p.m), 0,
                                         key_bits(p.m), stream),
          "cub::DeviceRadixSort");
}

void gather_dense_rows(cudaStream_t stream, const FfnProblem &p, const void *saved, const BackwardArgs &b,
                           const TrainScratch &s, int64_t cap) {
    const SavedView sv = saved_view(p, saved);
    by_type(p.type, [&](auto t) {
        using T = decltype(t);
        gather_pair<T><<<static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(cap, 1024))), 256, 0, stream>>>(
            b.x, b.dy, s.rows_sorted, sv.dense_count, cap, p.d, p.dp, static_cast<T *>(s.xc), static_cast<T *>(s.dyc));
        check_launch("gather_pair");
    });
}

/// Where dense_rows_grads reads z and u (rows hp apart: the recomputed ones in s.rz and s.ru, or a
/// dense-mode forward's saved ones) and writes du; dz goes to s.rz, dz and du rows `ld` apart.
struct DenseGradsRows {
    const void *z, *u;
    void *du;
    int64_t ld;
};
DenseGradsRows recomputed_rows(const FfnProblem &p, const TrainScratch &s) { return {s.rz, s.ru, s.ru, p.hp}; }

/// dz, du and h of the first `cap` rows from z, u and dh (in rh, which then holds h).
void dense_rows_grads(cudaStream_t stream, const FfnProblem &p, const TrainScratch &s, int64_t cap, L1Scale l1_scale,
                      const DenseGradsRows &io) {
    by_type(p.type, [&](auto t) {
        using T = decltype(t);
        if constexpr (!std::is_same_v<T, float>) {
            const int64_t chunks = cap * (p.hp / 8);
            dense_grads<T><<<static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(ceil_div(chunks, 256), 8192))),
                             256, 0, stream>>>(static_cast<const T *>(io.z), static_cast<const T *>(io.u),
                                               static_cast<T *>(s.rz), static_cast<T *>(io.du), static_cast<T *>(s.rh),
                                               cap, p.h, p.hp, io.ld, p.gated, l1_scale);
            check_launch("dense_grads");
        }
    });
}

void scatter_dense_dx(cudaStream_t stream, const FfnProblem &p, const void *saved, const BackwardArgs &b,
                            const TrainScratch &s, int64_t cap) {
    const SavedView sv = saved_view(p, saved);
    by_type(p.type, [&](auto t) {
        using T = decltype(t);
        scatter_sum<T><<<static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(cap, 1024))), 256, 0, stream>>>(
            s.dxc, p.gated ? s.dxc + cap * p.dp : nullptr, p.dp, s.rows_sorted, sv.dense_count, cap, p.d,
            static_cast<T *>(b.dx.ptr), b.dx.rs, b.dx.cs);
        check_launch("scatter_sum");
    });
}


/// The cuBLAS recompute of the first `cap` rows of the (sorted) dense list: z, u, dh; dz, du, h;
/// dX rows; the weight-gradient terms (fp32, summed with the sparse terms before the one
/// rounding of dW).
void recompute_with_cublas(cudaStream_t stream, CudaFfnState &st, const FfnProblem &p, const void *saved,
                           const BackwardArgs &b, const TrainScratch &s, int64_t cap) {
    const twDataType_t t = p.type;
    const FfnWeights w = st.weights(p);
    auto gemm = [&](GemmOperand a, GemmOperand bb, GemmOutput z) {
        st.gemm.run(stream, 1.0f, a, bb, z, s.lt_workspace, s.lt_bytes);
    };
    gather_dense_rows(stream, p, saved, b, s, cap);
    gemm({s.xc, cap, p.d, p.dp, TW_ORDER_ROW, t}, {w.gate, p.h, p.d, w.gate_ld, TW_ORDER_ROW, t}, {s.rz, p.hp, t});
    if (p.gated)
        gemm({s.xc, cap, p.d, p.dp, TW_ORDER_ROW, t}, {w.up, p.h, p.d, w.up_ld, TW_ORDER_ROW, t}, {s.ru, p.hp, t});
    gemm({s.dyc, cap, p.d, p.dp, TW_ORDER_ROW, t}, {w.down, p.h, p.d, w.down_ld, TW_ORDER_ROW, t}, {s.rh, p.hp, t});
    dense_rows_grads(stream, p, s, cap, b.l1_scale, recomputed_rows(p, s));
    // dX = dZ Wg (+ dU Wu): the weights as column-major D x H views
    gemm({s.rz, cap, p.h, p.hp, TW_ORDER_ROW, t}, {w.gate, p.d, p.h, w.gate_ld, TW_ORDER_COL, t},
         {s.dxc, p.dp, TW_R_32F});
    if (p.gated)
        gemm({s.ru, cap, p.h, p.hp, TW_ORDER_ROW, t}, {w.up, p.d, p.h, w.up_ld, TW_ORDER_COL, t},
             {s.dxc + cap * p.dp, p.dp, TW_R_32F});
    scatter_dense_dx(stream, p, saved, b, s, cap);
    // weight-gradient terms: dZ^T Xc, dU^T Xc, H^T dYc (column-major views of the cap-row buffers)
    const int64_t plane = p.h * p.dp;
    gemm({s.rz, p.h, cap, p.hp, TW_ORDER_COL, t}, {s.xc, p.d, cap, p.dp, TW_ORDER_COL, t}, {s.dw_dense, p.dp, TW_R_32F});
    if (p.gated)
        gemm({s.ru, p.h, cap, p.hp, TW_ORDER_COL, t}, {s.xc, p.d, cap, p.dp, TW_ORDER_COL, t},
             {s.dw_dense + plane, p.dp, TW_R_32F});
    gemm({s.rh, p.h, cap, p.hp, TW_ORDER_COL, t}, {s.dyc, p.d, cap, p.dp, TW_ORDER_COL, t},
         {s.dw_dense + 2 * plane, p.dp, TW_R_32F});
}

// ---- the backward of a dense-mode forward that kept z and u (save_dense): the dense step

/// cuBLAS may write this weight gradient itself: 16-byte aligned, a leading dimension of whole
/// 16-byte chunks (else the backward recomputes, whose kernels write any layout).
bool gemm_writes(const twDnMatDescr *w) {
    return !w || (reinterpret_cast<uintptr_t>(w->values) % 16 == 0 && (w->ld * elem_bytes(w->type)) % 16 == 0);
}

/// dW (H x D, either order) = A^T B for M-row A (M x H) and B (M x D), rounded once by cuBLAS.
void weight_gradient(cudaStream_t stream, CudaFfnState &st, const TrainScratch &s, const GemmOperand &a,
                     const GemmOperand &b, const twDnMatDescr &dw) {
    const GemmOperand at = transposed(a), bt = transposed(b);  // H x M, D x M
    if (dw.order == TW_ORDER_ROW)
        st.gemm.run(stream, 1.0f, at, bt, {dw.values, dw.ld, dw.type}, s.lt_workspace, s.lt_bytes);
    else  // the D x H row-major matrix dW^T = B^T A
        st.gemm.run(stream, 1.0f, bt, at, {dw.values, dw.ld, dw.type}, s.lt_workspace, s.lt_bytes);
}

/// Wu's rows right after Wg's with the same leading dimension ([Wg; Wu] stored as one matrix, as
/// fused gate-up weights are): the two read as one 2H x D matrix. H a multiple of 8, so that
/// [dZ | dU] (rows 2 hp apart) has no pad columns between the halves.
bool stacked_gate_up(const FfnProblem &p, const FfnWeights &w) {
    return p.gated && p.h == p.hp && w.up_ld == w.gate_ld &&
           static_cast<const char *>(w.up) == static_cast<const char *>(w.gate) + p.h * w.gate_ld * p.weight_bytes();
}

/// dWu right after dWg, both row-major with one leading dimension: one H-row pair, written by one GEMM.
bool stacked_grads(const FfnProblem &p, const twDnMatDescr *dwg, const twDnMatDescr &dwu) {
    return dwg && dwg->order == TW_ORDER_ROW && dwu.order == TW_ORDER_ROW && dwg->ld == dwu.ld &&
           dwg->type == dwu.type &&
           static_cast<const char *>(dwu.values) ==
               static_cast<const char *>(dwg->values) + p.h * dwg->ld * static_cast<int64_t>(elem_bytes(dwg->type));
}

/// Every row as the dense cuBLAS step runs it, from the z and u the forward kept: dh = dY Wd^T,
/// then dz, du, h in one pass, dX = dZ Wg (+ dU Wu) (fp32, rounded once), and each weight
/// gradient as one GEMM straight into its output. No sort, no gathers, no recomputed GEMMs.
/// Stacked [Wg; Wu] take dX as one GEMM over K = 2H (as the dense step does), and stacked
/// [dWg; dWu] one GEMM of 2H rows.
void dense_saved_backward(cudaStream_t stream, CudaFfnState &st, const FfnProblem &p, const SavedView &sv,
                          const twDnMatDescr &x, const twDnMatDescr &dy, L1Scale l1_scale, const twDnMatDescr &dx,
                          const twDnMatDescr *dwg, const twDnMatDescr &dwu, const twDnMatDescr &dwd,
                          const TrainScratch &s) {
    const twDataType_t t = p.type;
    const FfnWeights w = st.weights(p);
    auto gemm = [&](GemmOperand a, GemmOperand b, GemmOutput z) {
        st.gemm.run(stream, 1.0f, a, b, z, s.lt_workspace, s.lt_bytes);
    };
    gemm(gemm_operand(dy), {w.down, p.h, p.d, w.down_ld, TW_ORDER_ROW, t}, {s.rh, p.hp, t});
    // [dZ | dU] as one M x 2H matrix (rows 2 hp apart) when the weights are stacked
    const bool stacked = stacked_gate_up(p, w);
    const int64_t dzu_ld = stacked ? 2 * p.hp : p.hp;
    void *const ru = stacked ? static_cast<void *>(static_cast<char *>(s.rz) + p.hp * p.weight_bytes()) : s.ru;
    dense_rows_grads(stream, p, s, p.m, l1_scale, {sv.dense_z, sv.dense_u, ru, dzu_ld});
    const GemmOperand dz{s.rz, p.m, p.h, dzu_ld, TW_ORDER_ROW, t}, du{ru, p.m, p.h, dzu_ld, TW_ORDER_ROW, t};
    const GemmOperand h{s.rh, p.m, p.h, p.hp, TW_ORDER_ROW, t};
    // dX = dZ Wg (+ dU Wu): the weights as column-major D x H views (D x 2H when stacked)
    const bool one_gemm = !p.gated || stacked;
    const GemmOperand dx_a = stacked ? GemmOperand{s.rz, p.m, 2 * p.h, dzu_ld, TW_ORDER_ROW, t} : dz;
    const GemmOperand dx_b{w.gate, p.d, stacked ? 2 * p.h : p.h, w.gate_ld, TW_ORDER_COL, t};
    if (one_gemm && dx.order == TW_ORDER_ROW && dx.type == t && gemm_writes(&dx)) {
        gemm(dx_a, dx_b, {dx.values, dx.ld, t});  // rounded once, straight into dX
    } else {
        gemm(dx_a, dx_b, {s.dxc, p.dp, TW_R_32F});
        if (!one_gemm) gemm(du, {w.up, p.d, p.h, w.up_ld, TW_ORDER_COL, t}, {s.dxc + p.m * p.dp, p.dp, TW_R_32F});
        const MatrixArg dxa = matrix_arg(dx);
        by_type(t, [&](auto tag) {
            using T = decltype(tag);
            scatter_sum<T><<<static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(p.m, 1024))), 256, 0,
                             stream>>>(s.dxc, one_gemm ? nullptr : s.dxc + p.m * p.dp, p.dp, nullptr, nullptr, p.m, p.d,
                                       static_cast<T *>(dxa.ptr), dxa.rs, dxa.cs);
            check_launch("scatter_sum");
        });
    }
    const GemmOperand xo = gemm_operand(x), dyo = gemm_operand(dy);
    if (stacked && stacked_grads(p, dwg, dwu)) {
        twDnMatDescr both = *dwg;  // [dWg; dWu]: 2H rows
        both.rows = 2 * p.h;
        weight_gradient(stream, st, s, dx_a, xo, both);
    } else {
        weight_gradient(stream, st, s, dz, xo, p.gated ? *dwg : dwu);  // dWg (dWu when plain)
        if (p.gated) weight_gradient(stream, st, s, du, xo, dwu);
    }
    weight_gradient(stream, st, s, h, dyo, dwd);
}

}  // namespace

void ffn_backward(cudaStream_t stream, const twFfnDescr &ffn, const twDnMatDescr &x, const void *saved,
                  const twDnMatDescr &dy, L1Coefficient l1, const twDnMatDescr &dx, const twDnMatDescr *dwg,
                  const twDnMatDescr &dwu, const twDnMatDescr &dwd, void *workspace) {
    CudaFfnState &st = state_of(ffn);
    const FfnProblem p = problem_of(ffn, x.rows);
    std::lock_guard<std::mutex> lock(st.mutex);
    ReachablePointers &checked = st.train_pointers;
    checked.require(x.values, "X");
    checked.require(saved, "saved");
    checked.require(dy.values, "dY");
    checked.require(dx.values, "dX");
    if (dwg) checked.require(dwg->values, "dWgate");
    checked.require(dwu.values, "dWup");
    checked.require(dwd.values, "dWdown");
    checked.require(workspace, "workspace");
    // outputs over weights the FFN reads in place would be read after being written
    require_apart_from_weights(st, byte_range(dx), "dX");
    if (dwg) require_apart_from_weights(st, byte_range(*dwg), "dWgate");
    require_apart_from_weights(st, byte_range(dwu), "dWup");
    require_apart_from_weights(st, byte_range(dwd), "dWdown");
    const TrainScratch s = carve_train_scratch(workspace, p, nullptr);
    const FfnWeights w = st.weights(p);
    BackwardArgs b{};
    b.x = matrix_arg(x);
    b.dy = matrix_arg(dy);
    b.dx = matrix_arg(dx);
    if (dwg) b.dwg = matrix_arg(*dwg);
    b.dwu = matrix_arg(dwu);
    b.dwd = matrix_arg(dwd);
    b.l1_scale.value = p.m > 0 ? l1.value / static_cast<float>(p.m) : 0.0f;
    b.l1_scale.coeff = p.m > 0 ? l1.at : nullptr;  // read by the kernels, divided there as here
    b.l1_scale.m = static_cast<float>(p.m);
    const TrainForwards::Record *forward = st.train_forwards.find(saved, p.m);
    if (p.m > 0 && forward && forward->kept_z_u && gemm_writes(dwg) && gemm_writes(&dwu) && gemm_writes(&dwd)) {
        FfnProblem kept = p;  // the layout its forward wrote: z and u at the state's tail
        kept.save_dense = true;
        return dense_saved_backward(stream, st, p, saved_view(kept, saved), x, dy, b.l1_scale, dx, dwg, dwu, dwd, s);
    }
    sort_dense_list(stream, p, saved, s);
    // the forward's dense-path rows are recomputed: the first `cap` of them through cuBLAS (cap
    // from the measured share, as in the forward; after a dense-mode forward all of them), any
    // beyond through the gathered GEMM. The mode is the forward's, not the one the statistics
    // published since then ask for (unless the forward is no longer listed).
    absorb_feedback(st);
    const bool cublas = !p.deterministic && p.cublas_ok();
    const bool dense_forward = forward ? forward->dense_mode : st.feedback_seen.dense_mode;
    const int64_t cap = !cublas                ? 0
                        : dense_forward ? p.m
                                        : dense_path_cublas_rows(st.feedback_seen.dense_row_fraction, p.m);
    if (cap > 0) recompute_with_cublas(stream, st, p, saved, b, s, cap);
    by_type(p.type,
            [&](auto tag) { backward<decltype(tag)>(stream, p, w, saved, b, s, cap, st.sm_count, st.branch, st.pdl); });
}

}  // namespace twblas::cuda
