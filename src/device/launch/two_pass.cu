// The sparse rows in two passes (training, FP8 weights, and inference past the fused kernel's
// tokens): fwd_u, a warp per (token, active unit), computes u and h (saved as g and u in
// training, else h over the gate value); fwd_y, a block per (token, 512-column slice), sums
// h Wd_j over the token's units (kernels/two_pass.cuh).
#include "launch/launch.hpp"

#include <type_traits>

#include "common/check.hpp"
#include "common/dependent_launch.cuh"
#include "common/dispatch.hpp"
#include "kernels/two_pass.cuh"

namespace twblas::cuda {

namespace {

template <class T, bool FP8>
void launch_two_pass_kernels(cudaStream_t stream, const FfnProblem &p, const FwdArgs<T> &a, int ell, bool pdl,
                             const std::function<void()> &after_u) {
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
    if (after_u) after_u();
    // a thread takes 8 (fp32: 4) columns, 16 with FP8 rows
    const int64_t cols_per_block = int64_t{kFwdYThreads} * (FP8 ? 16 : E);
    const dim3 grid(static_cast<unsigned>(p.m), static_cast<unsigned>(ceil_div(p.dp, cols_per_block)));
    const size_t list_smem = static_cast<size_t>(ell) * (sizeof(int64_t) + sizeof(float));
    // over 48 KB only for lists of more than 4096 units (H beyond ~34000 at the default tile)
    allow_dynamic_smem(fwd_y<T, FP8>, list_smem);
    launch_dependent(fwd_y<T, FP8>, grid, dim3(kFwdYThreads), list_smem, stream, pdl, "cudaLaunchKernelEx(fwd_y)", a);
}

template <class T>
void launch_two_pass_t(cudaStream_t stream, const FfnCall &c, const MaskListArgs *lists,
                       const std::function<void()> &after_u) {
    const FfnProblem &p = c.p;
    const FfnScratch &s = c.s;
    const FfnWeights &w = c.w;
    const MatrixArg &x = c.xa, &y = c.ya;
    FwdArgs<T> a{static_cast<const T *>(x.ptr), x.rs, x.cs, rows_vectorizable(x, p.d), static_cast<T *>(y.ptr), y.rs,
                 y.cs, rows_vectorizable(y, p.d), static_cast<const T *>(w.up), w.up_ld, static_cast<const T *>(w.down),
                 w.down_ld, p.dp, p.d, p.m, p.h,
                 s.gate, s.ldg, p.gate_f32(), p.gated, p.highest, s.idx, s.count, s.cap, s.save_g, s.save_u, s.row_l1,
                 w.fp8, s.dense_rows, s.dense_count, lists ? *lists : MaskListArgs{}};
    if constexpr (std::is_same_v<T, float>) {
        launch_two_pass_kernels<T, false>(stream, p, a, s.cap, c.st.pdl, after_u);
    } else {
        if (p.fp8)
            launch_two_pass_kernels<T, true>(stream, p, a, s.cap, c.st.pdl, after_u);
        else
            launch_two_pass_kernels<T, false>(stream, p, a, s.cap, c.st.pdl, after_u);
    }
}

}  // namespace

void launch_two_pass(cudaStream_t stream, const FfnCall &c, const MaskListArgs *lists,
                     const std::function<void()> &after_u) {
    by_type(c.p.type, [&](auto tag) { launch_two_pass_t<decltype(tag)>(stream, c, lists, after_u); });
}

}  // namespace twblas::cuda
