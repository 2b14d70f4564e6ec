// The serving path (a few to a few hundred tokens, 16-bit weights or FP8 rows): the active units
// found on the device, then gathers that read each active unit's Wu and Wd rows once per token
// (kernels/serve.cuh). Up to the plan's serve_gate tokens its own tensor-core gate (serve_gate,
// which also forms h of the active pairs) and serve_down (its units split into the plan's groups
// where rows have hundreds); past it cuBLAS's gate GEMM and serve_token.
#include "launch/launch.hpp"

#include <type_traits>

#include "common/check.hpp"
#include "common/dependent_launch.cuh"
#include "common/dispatch.hpp"
#include "kernels/serve.cuh"

namespace twblas::cuda {

namespace {

/// serve_gate's 16-byte chunks of the weight row in flight per lane, up to 8 tokens (one x row a
/// lane); 9 to 16 tokens hold two x rows and take 4.
constexpr int kServeGateChunks = 6;

/// serve_gate, which serve_down follows by programmatic dependent launch.
template <class T, int R, int U, bool FP8>
void launch_serve_gate(cudaStream_t stream, const ServeArgs<T> &a) {
    // a block per 8 units, 4 per mask word: every byte of the words is written
    serve_gate<T, R, U, FP8><<<static_cast<unsigned>(4 * a.words), 32 * kServeGateWarps, 0, stream>>>(a);
    check_launch("serve_gate");
}

/// serve_gate_rows (up to kServeGateRowsMaxTokens tokens): the same grid, a warp per unit.
template <class T, int M, bool FP8>
void launch_serve_gate_rows(cudaStream_t stream, const ServeArgs<T> &a) {
    serve_gate_rows<T, M, FP8><<<static_cast<unsigned>(4 * a.words), 32 * kServeGateUnits, 0, stream>>>(a);
    check_launch("serve_gate_rows");
}

template <class T>
void launch_serve_t(cudaStream_t stream, const FfnCall &c, bool write_h) {
    const FfnProblem &p = c.p;
    const FfnScratch &s = c.s;
    const FfnWeights &w = c.w;
    const ServePlan &sp = c.plan.serve;
    CudaFfnState &st = c.st;
    ServeArgs<T> a{};
    a.x = static_cast<const T *>(c.xa.ptr), a.x_rs = c.xa.rs, a.m = static_cast<int>(p.m);
    a.d = p.d, a.dp = p.dp, a.h = p.h;
    a.wgate = static_cast<const T *>(w.gate), a.wgate_ld = w.gate_ld;
    a.up = static_cast<const T *>(w.up), a.up_ld = w.up_ld;
    a.down = static_cast<const T *>(w.down), a.down_ld = w.down_ld;
    a.fp8 = w.fp8;
    a.gated = p.gated, a.write_h = write_h;
    a.gate = static_cast<T *>(s.gate), a.ldg = s.ldg;
    a.masks = s.unit_masks, a.words = s.unit_words, a.ticket = s.serve_ticket;
    a.neuron_counts = st.neuron_counts();
    a.y = static_cast<T *>(c.ya.ptr), a.y_rs = c.ya.rs, a.y_cs = c.ya.cs;
    a.tile = p.tile, a.slots = p.slots, a.row_limit = s.row_limit;
    a.count = s.count, a.row_nnz = s.row_nnz, a.row_l1 = s.row_l1;
    a.stats = st.stats_block(), a.publish = st.feedback.device();
    // serve_down's groups (the plan keeps their blocks within the workspace's partial rows and
    // tickets), where the workspace holds them
    const int64_t slices = ceil_div(p.dp, int64_t{kServeDownCols});
    a.down_groups = sp.own_gate && s.serve_parts ? sp.down_groups : 1;
    a.parts = s.serve_parts, a.part_l1 = s.serve_part_l1, a.part_nnz = s.serve_part_nnz;
    a.part_over = s.serve_part_over, a.down_tickets = s.serve_tickets;
    // the step's statistics: by serve_stats after the last kernel (no ticket), or by the last
    // counting block behind a ticket; one token publishes them from registers either way
    if (sp.stats_kernel) a.ticket = nullptr;
    if (!sp.own_gate) {
        // the ticket zeroed (serve_gate zeroes it on its own path), cuBLAS's gate GEMM (z rounded
        // to T), then serve_token
        if (a.ticket) check(cudaMemsetAsync(a.ticket, 0, sizeof(uint32_t), stream), "cudaMemsetAsync");
        run_gate_gemm(stream, st, p, gemm_operand(c.x), s);
        const int warps = sp.token_warps, splits = sp.token_splits;
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
        else if (warps == 16 && per_split <= 2 * 32 * 16)  // dp <= 8192 (max_model_dim)
            p.fp8 ? run(serve_token<T, 16, 2, true>) : run(serve_token<T, 16, 2>);
        else
            fail(TW_STATUS_INTERNAL_ERROR, "serve_token: no instance for %d warps and %lld chunks a split", warps,
                 static_cast<long long>(per_split));
    } else {
        // serve_gate: U 16-byte chunks of the weight row in flight per lane, and of R x rows
        // (FP8: their instances that read the FP8 rows)
        static_assert(kServeGateRowsMaxTokens == 2, "serve_gate_rows has instances for 1 and 2 tokens");
        if (sp.gate_rows && p.m == 1)
            p.fp8 ? launch_serve_gate_rows<T, 1, true>(stream, a) : launch_serve_gate_rows<T, 1, false>(stream, a);
        else if (sp.gate_rows)
            p.fp8 ? launch_serve_gate_rows<T, 2, true>(stream, a) : launch_serve_gate_rows<T, 2, false>(stream, a);
        else if (p.m <= 8)
            p.fp8 ? launch_serve_gate<T, 1, kServeGateChunks, true>(stream, a)
                  : launch_serve_gate<T, 1, kServeGateChunks, false>(stream, a);
        else
            p.fp8 ? launch_serve_gate<T, 2, 4, true>(stream, a) : launch_serve_gate<T, 2, 4, false>(stream, a);
        static_assert(kServeGateTokenCapacity <= 16, "serve_gate takes up to 2 x rows of 8 tokens");
        // serve_down: a block per (256 columns, token, group)
        const dim3 grid(static_cast<unsigned>(slices), static_cast<unsigned>(a.m), static_cast<unsigned>(a.down_groups));
        const bool groups = a.down_groups > 1;
        auto *down = p.fp8 ? (groups ? serve_down<T, true, true> : serve_down<T, true, false>)
                           : (groups ? serve_down<T, false, true> : serve_down<T, false, false>);
        launch_dependent(down, grid, dim3(32 * kServeDownWarps), 0, stream, st.pdl, "cudaLaunchKernelEx(serve_down)", a);
    }
    if (sp.stats_kernel)
        launch_dependent(serve_stats<T>, dim3(1), dim3(32), 0, stream, st.pdl, "cudaLaunchKernelEx(serve_stats)", a);
}

}  // namespace

void launch_serve(cudaStream_t stream, const FfnCall &c, bool write_h) {
    by_type(c.p.type, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (std::is_same_v<T, float>)
            fail(TW_STATUS_INTERNAL_ERROR, "the serving path runs 16-bit FFNs");
        else
            launch_serve_t<T>(stream, c, write_h);
    });
}

}  // namespace twblas::cuda
