// Where the FFN's kernels read its weights (FfnWeights), set by twCreateFfn and
// twFfnUpdateWeights: each matrix in the caller's memory when it is in the kernels' layout,
// else in rows of the FFN's copy, made here from either order.
#include <algorithm>
#include <bitset>

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
        // a gated FFN's rows are Wu_j and Wd_j, a plain one's Wd_j (its Wu is the gate)
        quantize_fp8_rows<T><<<static_cast<unsigned>(p.h), 256, 0, stream>>>(
            static_cast<const T *>(p.gated ? w.up : w.down), p.gated ? w.up_ld : w.down_ld,
            static_cast<const T *>(w.down), w.down_ld, p.dp, p.gated ? 2 : 1, st.fp8_q.get<uint8_t>(),
            st.fp8_scale.get<float2>(), w.fp8.stride, w.fp8.half);
        check_launch("quantize_fp8_rows");
    });
}

bool readable_in_place(const FfnProblem &p, const twDnMatDescr &w) {
    // dp = d: rows without pads (the kernels read whole 16-byte chunks up to dp, and multiply
    // any pad by x's zero, which only a zero pad survives exactly)
    return w.type == p.type && w.order == TW_ORDER_ROW && w.rows == p.h && w.cols == p.d && p.d % 8 == 0 &&
           reinterpret_cast<uintptr_t>(w.values) % 16 == 0 && (w.ld * p.weight_bytes()) % 16 == 0;
}

void ffn_place_weights(cudaStream_t stream, CudaFfnState &st, const FfnProblem &p, const twDnMatDescr *wg,
                       const twDnMatDescr &wu, const twDnMatDescr &wd, bool wait) {
    if (wg) require_device_accessible(wg->values, "wGate");
    require_device_accessible(wu.values, "wUp");
    require_device_accessible(wd.values, "wDown");
    // the kernels' three matrices: the gate (Wg, or Wu of a plain FFN), the up rows (gated), Wd
    const twDnMatDescr *const mats[3] = {p.gated ? wg : &wu, p.gated ? &wu : nullptr, &wd};
    const char *const names[3] = {p.gated ? "wGate" : "wUp", "wUp", "wDown"};
    int copied = 0;
    for (int i = 0; i < 3; ++i)
        if (mats[i] && !readable_in_place(p, *mats[i])) copied |= 1 << i;
    // the copy: row j holds the copied matrices' rows j side by side, dp values each
    const int64_t n_copied = static_cast<int64_t>(std::bitset<3>(static_cast<unsigned>(copied)).count());
    const int64_t row = n_copied * p.dp;
    if (copied != st.copied) {
        // a layout the FFN does not hold yet (twCreateFfn, or new weights that differ in what is
        // read in place): its memory is allocated here, which blocks
        cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
        check(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing");
        if (status != cudaStreamCaptureStatusNone)
            fail(TW_STATUS_NOT_SUPPORTED, "wGate, wUp, wDown: which of these weights can be read in place differs from "
                 "the FFN's current ones, so its weight copy must be reallocated: not during a stream capture");
        check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");  // work in flight may read the old copy
        st.weight_copy.reset(static_cast<size_t>(p.h * row * p.weight_bytes()));
        st.copied = copied;
    }
    FfnWeights w{};
    const void *ptr[3] = {};
    int64_t ld[3] = {};
    int64_t at = 0;  // elements into a copied row
    for (int i = 0; i < 3; ++i) {
        st.in_place[i] = {};
        st.in_place_name[i] = names[i];
        if (!mats[i]) continue;
        if (copied >> i & 1) {
            void *dst = st.weight_copy.get<char>() + at * p.weight_bytes();
            launch_repack(stream, matrix_arg(*mats[i]), false, dst, row, p.h, p.dp);
            ptr[i] = dst, ld[i] = row;
            at += p.dp;
        } else {
            ptr[i] = mats[i]->values, ld[i] = mats[i]->ld;
            st.in_place[i] = byte_range(*mats[i]);
        }
    }
    w.gate = ptr[0], w.gate_ld = ld[0];
    w.up = ptr[1], w.up_ld = ld[1];
    w.down = ptr[2], w.down_ld = ld[2];
    {
        std::lock_guard<std::mutex> lock(st.mutex);
        // new pointers make new keys of the captured calls (inference_key): a graph never reads
        // memory the FFN no longer points at
        st.placed = w;
        st.fp8_stale = true;  // the next FP8 forward quantizes the new rows
    }
    if (wait) check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

/// INVALID_VALUE when `out` (memory a compute call writes) overlaps weights read in place.
void require_apart_from_weights(const CudaFfnState &st, const ByteRange &out, const char *out_name) {
    for (int i = 0; i < 3; ++i) require_disjoint(out, out_name, st.in_place[i], st.in_place_name[i]);
}

}  // namespace twblas::cuda
