// The fused kernel over the sparse rows (up to a hundred-odd tokens past the serving path's
// reach): a team of warps per token walks its active units, u and h and the down rows in one
// kernel; at small M a token's units are dealt to several teams (fused_splits) whose partial
// rows are summed after (kernels/fused.cuh).
#include "launch/launch.hpp"

#include <algorithm>

#include "common/check.hpp"
#include "common/dispatch.hpp"
#include "kernels/fused.cuh"

namespace twblas::cuda {

namespace {

template <class T, int V> void launch_fused_v(cudaStream_t stream, const FusedArgs<T> &a, int warps) {
    const int threads = 32 * warps;
    const size_t smem = kStages * sparse_stage_bytes<T>(a.dp, a.gated, threads);
    // over 48 KB only for D > ~6000 (16-bit)
    allow_dynamic_smem(sparse_ffn<T, V>, smem);
    const dim3 grid(static_cast<unsigned>(a.m), static_cast<unsigned>(a.splits));
    sparse_ffn<T, V><<<grid, threads, smem, stream>>>(a);
    check_launch("sparse_ffn");
}

template <class T>
void launch_fused_t(cudaStream_t stream, const FfnCall &c, bool write_h) {
    const FfnProblem &p = c.p;
    const FfnScratch &s = c.s;
    const FfnWeights &w = c.w;
    const MatrixArg &x = c.xa, &y = c.ya;
    FusedArgs<T> a{static_cast<const T *>(x.ptr), x.rs, x.cs, rows_vectorizable(x, p.d), static_cast<T *>(y.ptr), y.rs,
                   y.cs, rows_vectorizable(y, p.d), static_cast<const T *>(w.up), w.up_ld, static_cast<const T *>(w.down),
                   w.down_ld, p.dp, p.d, p.m, s.gate, s.ldg, p.gate_f32(), p.gated, p.highest, write_h, s.idx, s.cap, s.count, s.row_l1,
                   s.splits, s.partial};
    constexpr int E = Chunk<T>::n;
    const int64_t per_warp_max = kFusedWarpChunks * 32 * E;
    const int warps = std::max(1, ceil_div(a.dp, per_warp_max));  // dp <= max_model_dim (twCreateFfn)
    const int v_needed = ceil_div(a.dp, static_cast<int64_t>(warps) * 32 * E);
    static_assert(kFusedWarpChunks <= 8, "launch_fused instantiates up to 8 chunks per lane");
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

}  // namespace

void launch_fused(cudaStream_t stream, const FfnCall &c, bool write_h) {
    by_type(c.p.type, [&](auto tag) { launch_fused_t<decltype(tag)>(stream, c, write_h); });
}

}  // namespace twblas::cuda
