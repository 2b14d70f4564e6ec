// The FFN's weights in the kernels' layouts (FfnWeights), copied by twCreateFfn and
// twFfnUpdateWeights from user weights in either order.
#include <algorithm>

#include "common/matrix_arg.hpp"
#include "common/pointer_check.hpp"
#include "ffn_forward.hpp"
#include "common/dispatch.hpp"
#include "kernels/fp8_rows.cuh"
#include "kernels/repack.cuh"

namespace twblas::cuda {

namespace {

void launch_repack(cudaStream_t stream, const MatrixArg &in, bool transpose, void *out, int64_t ldo,
                   int64_t out_rows, int64_t out_cols) {
    if (out_rows == 0 || out_cols == 0) return;
    for (int64_t r0 = 0; r0 < out_rows; r0 += 65535) {  // grid.y limit
        const int64_t rows = std::min<int64_t>(65535, out_rows - r0);
        const int elem = static_cast<int>(elem_bytes(in.type));
        MatrixArg shifted = in;
        // shift the output rows: logical out row r0 + y
        if (transpose)
            shifted.ptr = static_cast<char *>(in.ptr) + r0 * in.cs * elem, shifted.cols = in.cols - r0;
        else
            shifted.ptr = static_cast<char *>(in.ptr) + r0 * in.rs * elem, shifted.rows = in.rows - r0;
        repack<<<dim3(ceil_div(out_cols, 256), static_cast<unsigned>(rows)), 256, 0, stream>>>(
            shifted, transpose, static_cast<char *>(out) + r0 * ldo * elem, ldo, rows, out_cols, elem);
        check_launch("repack");
    }
}

}  // namespace

void quantize_fp8_weights(cudaStream_t stream, CudaFfnState &st, const FfnProblem &p) {
    if (p.h == 0) return;
    const FfnWeights w = st.weights(p);
    by_16bit_type(p.type, [&](auto tag) {
        using T = decltype(tag);
        quantize_fp8_rows<T><<<static_cast<unsigned>(p.h), 256, 0, stream>>>(
            static_cast<const T *>(w.pair), w.pair_stride, p.dp, p.gated ? 2 : 1, st.fp8_q.get<uint8_t>(),
            st.fp8_scale.get<float2>(), w.fp8.stride, w.fp8.half);
        check_launch("quantize_fp8_rows");
    });
}

void ffn_repack_weights(cudaStream_t stream, CudaFfnState &st, const FfnProblem &p, const twDnMatDescr *wg,
                        const twDnMatDescr &wu, const twDnMatDescr &wd, bool wait) {
    if (wg) require_device_accessible(wg->values, "wGate");
    require_device_accessible(wu.values, "wUp");
    require_device_accessible(wd.values, "wDown");
    // unit row j = [Wg_j | Wu_j | Wd_j] (gated) or [Wu_j | Wd_j]: a strided copy into each third
    const FfnWeights w = st.weights(p);
    const int64_t eb = static_cast<int64_t>(elem_bytes(p.type));
    launch_repack(stream, matrix_arg(p.gated ? *wg : wu), false, const_cast<void *>(w.gate), w.gate_ld, p.h, p.dp);
    char *const pair = static_cast<char *>(const_cast<void *>(w.pair));
    if (p.gated) launch_repack(stream, matrix_arg(wu), false, pair, w.pair_stride, p.h, p.dp);
    launch_repack(stream, matrix_arg(wd), false, pair + (p.gated ? p.dp * eb : 0), w.pair_stride, p.h, p.dp);
    launch_repack(stream, matrix_arg(wd), true, st.down_t.get(), p.hp, p.d, p.hp);
    {
        std::lock_guard<std::mutex> lock(st.mutex);
        st.fp8_stale = true;  // the next FP8 forward quantizes the new rows
    }
    if (wait) check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

}  // namespace twblas::cuda
