// The dense path: rows with a TwELL tile over capacity or more active units than gathers pay for
// (dense_path_row_limit), exact for any sparsity. The first plan.cublas_rows rows of the dense
// list are compacted and multiplied by cuBLAS GEMMs, any beyond by the gathered GEMM, whose row
// count is read on the device (no host sync). Both read the 16-bit weights, with FP8 weights too:
// a row with this many units is faster as a GEMM row than as gathers of FP8 rows. It writes only
// its own rows of h and Y, so the forward runs it on a branch beside the sparse rows.
#include "launch/launch.hpp"

#include <algorithm>
#include <type_traits>

#include "common/check.hpp"
#include "common/dependent_launch.cuh"
#include "common/dispatch.hpp"
#include "gemm/gathered_gemm.hpp"
#include "kernels/dense_rows.cuh"

namespace twblas::cuda {

namespace {

/// The rows of the dense list from position `first` on, through the gathered GEMM: u (gated)
/// with h formed in its epilogue over the gate buffer, then the down projection into Y.
void launch_dense_path_gathered(cudaStream_t stream, const FfnCall &c, int64_t first) {
    const FfnProblem &p = c.p;
    const FfnScratch &s = c.s;
    const FfnWeights &w = c.w;
    const MatrixArg &x = c.xa, &y = c.ya;
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
        launch_gathered_gemm(stream, up, p.type, tensor_cores, c.st.sm_count, c.st.pdl);
    }
    GatheredGemm down = g;
    down.a = down.a2 = s.gate, down.a_f32 = p.gate_f32(), down.relu_a = !p.gated, down.a_ri = s.ldg, down.a_ck = 1;
    down.a_rows = s.dense_rows;
    // Wd^T: row j of Wd holds the reduction's column j (k = unit, j = output column)
    down.b = down.b2 = w.down, down.b_rk = down.b2_rk = w.down_ld, down.b_cj = 1;
    down.n = p.d, down.k = p.h, down.ksplit = p.h;
    down.epi = GatherEpilogue::ScatterRows, down.c = y.ptr, down.c_rs = y.rs, down.c_cs = y.cs;
    launch_gathered_gemm(stream, down, p.type, tensor_cores, c.st.sm_count, c.st.pdl);
}

/// The cuBLAS part: the first `cap` rows of the dense list compacted, multiplied by GEMMs of
/// `cap` rows, and scattered back.
template <class T>
void run_dense_path_cublas(cudaStream_t stream, const FfnCall &c, int64_t cap, bool write_hidden) {
    const FfnProblem &p = c.p;
    const FfnScratch &s = c.s;
    const FfnWeights &w = c.w;
    const MatrixArg &xa = c.xa, &y = c.ya;
    const unsigned blocks = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(cap, 1024)));
    if (p.gated) {
        gather_rows<T><<<blocks, 256, 0, stream>>>(static_cast<const T *>(xa.ptr), xa.rs, xa.cs, p.d, s.dense_rows,
                                                  s.dense_count, cap, static_cast<T *>(s.xc), p.dp);
        check_launch("gather_rows");
        c.st.gemm.run(stream, 1.0f, {s.xc, cap, p.d, p.dp, TW_ORDER_ROW, p.type},
                      {w.up, p.h, p.d, w.up_ld, TW_ORDER_ROW, p.type}, {s.up, s.ldg, p.type}, s.lt_workspace,
                      s.lt_bytes);
    }
    compact_hidden<T><<<static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(cap, 4096))), 256, 0, stream>>>(
        static_cast<T *>(s.gate), s.ldg, static_cast<T *>(s.up), p.h, p.gated, s.dense_rows, s.dense_count, cap,
        write_hidden, s.row_l1);
    check_launch("compact_hidden");
    // Wd^T (D x H): the down rows read column-major, no transposed copy
    c.st.gemm.run(stream, 1.0f, {s.up, cap, p.h, s.ldg, TW_ORDER_ROW, p.type},
                  {w.down, p.d, p.h, w.down_ld, TW_ORDER_COL, p.type}, {s.xc, p.dp, p.type}, s.lt_workspace,
                  s.lt_bytes);
    scatter_rows<T><<<blocks, 256, 0, stream>>>(static_cast<const T *>(s.xc), p.dp, p.d, s.dense_rows, s.dense_count, cap,
                                               static_cast<T *>(y.ptr), y.rs, y.cs);
    check_launch("scatter_rows");
}

}  // namespace

void enqueue_dense_path(cudaStream_t stream, const FfnCall &c, bool write_hidden) {
    by_type(c.p.type, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (!std::is_same_v<T, float>)
            if (c.plan.cublas_rows > 0) run_dense_path_cublas<T>(stream, c, c.plan.cublas_rows, write_hidden);
        launch_dense_path_gathered(stream, c, c.plan.cublas_rows);
    });
}

}  // namespace twblas::cuda
