// The forward's sparse rows in two passes (used by the training forward and by the inference
// forward past the fused kernel's tokens): fwd_u, a warp per (token, active unit), then
// fwd_y, a block per (token, 512-column slice).
#pragma once

#include "common/dependent_launch.cuh"
#include "common/values.cuh"
#include "common/warp.cuh"
#include "kernels/fp8_rows.cuh"
#include "kernels/pack.cuh"

namespace twblas::cuda {

// fwd_u: 8 warps per block (one per active unit in flight; 16 measured 6-8 % slower); fwd_y: 64
// threads of 16-byte chunks = 512 bf16 columns per block
constexpr int kFwdUWarps = 8;
constexpr int kFwdYThreads = 64;
// weight rows whose loads fwd_y has in flight before it uses the first: 8 16-bit chunks (29 units
// in four rounds of loads instead of eight; the sum keeps its unit order), 4 FP8 ones
constexpr int kFwdUnroll = 8;
constexpr int kFwdUnrollFp8 = 4;

// ---- the forward's sparse rows, in two kernels (as the token phase of the backward), used by
// the training forward and by the inference forward at M > 512 (one team per token):
//   fwd_u  one warp per (token, active unit): u = x_t . Wu_j (gated), h (saved as g and u in
//          training, written over the gate value otherwise), and each token's l1 (warp sums
//          added in warp order: deterministic);
//   fwd_y  one block per (token, 512-column slice), slice by slice: y_t = sum h Wd_j.

template <class T> struct FwdArgs {
    const T *x;
    int64_t x_rs, x_cs;
    bool x_vec;
    T *y;
    int64_t y_rs, y_cs;
    bool y_vec;
    const T *up;    // Wu rows (gated; NULL for a plain FFN), up_ld apart
    int64_t up_ld;
    const T *down;  // Wd rows, down_ld apart
    int64_t down_ld, dp, d, m, h;
    const void *gate;
    int64_t ldg;
    bool gate_f32, gated, highest;
    const uint16_t *idx;
    const int32_t *count;
    int ell;
    void *save_g, *save_u;  // training: g and u per slot; NULL: h goes over the gate value
    float *row_l1;
    Fp8Rows fp8;  // the rows as FP8 (the kernels' FP8 instances read these instead of up and down)
    const int32_t *dense_rows;  // the dense path's rows
    const uint32_t *dense_count;
    MaskListArgs lists;  // lists.masks set: fwd_u lists its row from the masked GEMM's words itself
};

/// A token's l1: lane 0 of each warp holds its warp's sum; added in warp order (deterministic).
__device__ inline void store_row_l1(float l1, float *warp_l1, float *dst) {
    if ((threadIdx.x & 31) == 0) warp_l1[threadIdx.x / 32] = l1;
    __syncthreads();
    if (threadIdx.x == 0) {
        float sum = 0.0f;
        for (int w = 0; w < kFwdUWarps; ++w) sum += warp_l1[w];
        *dst = sum;
    }
}

/// The start of fwd_u and fwd_u_fp8: x_t staged (`stage_x`), the row's units into s_col and their
/// gate values into s_g (`each(k, unit)` stages more per unit), listed from the masked gate GEMM's
/// words (lists_from_masks's work; x_t's loads go first, so that they are in flight while the words
/// are read) or read from the lists. Returns the units, or -1 for a dense-path row (the block
/// returns); ends with a barrier.
template <class T, class Each>
__device__ inline int stage_row_units(const FwdArgs<T> &a, int64_t row, uint4 *sx, int nchunks, bool stage_x,
                                      int32_t *s_col, float *s_g, int *s_warp, Each &&each) {
    int n;
    if (a.lists.masks) {
        if (stage_x) stage_row(sx, a.x, row, a.x_rs, a.x_cs, a.x_vec, a.d, nchunks);
        n = block_list_from_masks(a.lists, row, s_col, a.ell, s_warp);
        if (n < 0) return -1;  // the dense path
        n = min(n, a.ell);
        __syncthreads();  // s_col
        for (int k = threadIdx.x; k < n; k += blockDim.x) {
            s_g[k] = gate_value<T>(a.gate, row * a.ldg + s_col[k], a.gate_f32);
            each(k, s_col[k]);
        }
    } else {
        n = min(a.count[row], a.ell);
        if (n < 0) return -1;  // the dense path
        const int64_t base = row * a.ell;
        for (int k = threadIdx.x; k < n; k += blockDim.x) {
            const int32_t col = static_cast<int32_t>(min(static_cast<int64_t>(a.idx[base + k]), a.h - 1));
            s_col[k] = col;
            s_g[k] = gate_value<T>(a.gate, row * a.ldg + col, a.gate_f32);
            each(k, col);
        }
        if (stage_x) stage_row(sx, a.x, row, a.x_rs, a.x_cs, a.x_vec, a.d, nchunks);
    }
    __syncthreads();
    return n;
}

/// The row's unit ids and gate values staged in shared memory first (the loop's loads wait on no
/// other load), and each unit's whole row (up to D = 2048) in flight at once (warp_row_dot): at 29
/// units a token and 8 warps, about four rounds of row loads a warp instead of about seven chains
/// of an id, its gate value and two half-row loads. One row at a time keeps the kernel near 64
/// registers, four blocks an SM: M = 512 in one wave.
template <class T> __global__ void __launch_bounds__(32 * kFwdUWarps) fwd_u(FwdArgs<T> a) {
    wait_for_prior_grid();  // the lists (launch_dependent)
    allow_dependent_launch();
    constexpr int E = Chunk<T>::n;
    extern __shared__ uint4 sx[];  // x_t as dp / E chunks (gated), then the row's units and gate values
    __shared__ float warp_l1[kFwdUWarps];
    __shared__ int s_warp[kFwdUWarps];
    const int64_t row = blockIdx.x;
    const int nchunks = a.gated ? static_cast<int>(a.dp / E) : 0;
    int32_t *s_col = reinterpret_cast<int32_t *>(sx + nchunks);
    float *s_g = reinterpret_cast<float *>(s_col + a.ell);
    const int64_t base = row * a.ell;
    const int n = stage_row_units(a, row, sx, nchunks, a.gated, s_col, s_g, s_warp, [](int, int32_t) {});
    if (n < 0) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    float l1 = 0.0f;
    for (int k = warp; k < n; k += kFwdUWarps) {
        const float g = s_g[k];
        float h = g, u = 0.0f;
        if (a.gated) {
            const float dot = warp_row_dot(sx, a.up + static_cast<int64_t>(s_col[k]) * a.up_ld, nchunks);
            u = a.highest ? dot : round_to<T>(dot);
            h = a.highest ? g * u : round_to<T>(g * u);
        }
        if (lane == 0) {
            if (a.save_g) {
                gate_store<T>(a.save_g, base + k, a.gate_f32, g);
                if (a.gated) gate_store<T>(a.save_u, base + k, a.gate_f32, u);
            } else {
                gate_store<T>(const_cast<void *>(a.gate), row * a.ldg + s_col[k], a.gate_f32, h);
            }
            l1 += fabsf(h);
        }
    }
    store_row_l1(l1, warp_l1, a.row_l1 + row);
}

/// fwd_u of a gated FFN over FP8 rows: the row's unit ids (from the lists, or from the masked gate
/// GEMM's words as fwd_u makes them), gate values and up scales staged in shared memory first (no
/// load waits on another in the loop), and each warp takes its units two
/// at a time (eight 16-byte loads a lane in flight). h goes over the gate value (inference only).
template <class T> __global__ void __launch_bounds__(32 * kFwdUWarps) fwd_u_fp8(FwdArgs<T> a) {
    wait_for_prior_grid();  // launch_dependent
    allow_dependent_launch();
    constexpr int E = Chunk<T>::n;
    extern __shared__ uint4 sx[];  // x_t over the FP8 half (zeros past D), then the row's units
    __shared__ float warp_l1[kFwdUWarps];
    __shared__ int s_warp[kFwdUWarps];
    const int64_t row = blockIdx.x;
    const int nchunks = static_cast<int>(a.fp8.half / E);
    int32_t *s_col = reinterpret_cast<int32_t *>(sx + nchunks);
    float *s_g = reinterpret_cast<float *>(s_col + a.ell), *s_su = s_g + a.ell;
    // gated only; FP8 FFNs are 16-bit, so the gate values are too (a.gate_f32 false)
    const int n = stage_row_units(a, row, sx, nchunks, true, s_col, s_g, s_warp,
                                  [&](int k, int32_t col) { s_su[k] = a.fp8.scale[col].x; });
    if (n < 0) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    float l1 = 0.0f;
    for (int k = 2 * warp; k < n; k += 2 * kFwdUWarps) {
        const int units = min(2, n - k);
        const int32_t ca = s_col[k], cb = s_col[k + units - 1];
        float dot[2];
        warp_row_dot2_fp8<T>(sx, a.fp8.q + static_cast<int64_t>(ca) * a.fp8.stride,
                             a.fp8.q + static_cast<int64_t>(cb) * a.fp8.stride, nchunks, dot[0], dot[1]);
        for (int i = 0; i < units; ++i) {
            const float h = round_to<T>(s_g[k + i] * round_to<T>(s_su[k + i] * dot[i]));
            if (lane == 0) {
                gate_store<T>(const_cast<void *>(a.gate), row * a.ldg + s_col[k + i], false, h);
                l1 += fabsf(h);
            }
        }
    }
    store_row_l1(l1, warp_l1, a.row_l1 + row);
}

/// acc[e] += sum over k < n of h[k] * row(col[k])[e] for one thread's 8 (or 4) columns of 16-bit
/// (fp32) rows `stride` elements apart, U rows' loads in flight before any is used; in k order.
template <class T, int U>
__device__ inline void value_rows_axpy(const T *rows, int64_t stride, const int64_t *col, const float *h, int n,
                                       float (&acc)[Chunk<T>::n]) {
    constexpr int E = Chunk<T>::n;
    int k = 0;
    for (; k + U <= n; k += U) {
        uint4 w[U];
#pragma unroll
        for (int g = 0; g < U; ++g) w[g] = *reinterpret_cast<const uint4 *>(rows + col[k + g] * stride);
#pragma unroll
        for (int g = 0; g < U; ++g)
#pragma unroll
            for (int e = 0; e < E; ++e) acc[e] = fmaf(h[k + g], Chunk<T>::get(w[g], e), acc[e]);
    }
    for (; k < n; ++k) {
        const uint4 w = *reinterpret_cast<const uint4 *>(rows + col[k] * stride);
#pragma unroll
        for (int e = 0; e < E; ++e) acc[e] = fmaf(h[k], Chunk<T>::get(w, e), acc[e]);
    }
}

/// The same over FP8 rows (`stride` bytes apart), 16 columns (one 16-byte load) a thread; h
/// already holds h s_j.
template <int U>
__device__ inline void fp8_rows_axpy(const uint8_t *rows, int64_t stride, const int64_t *col, const float *h, int n,
                                     float (&acc)[16]) {
    int k = 0;
    for (; k + U <= n; k += U) {
        uint4 w[U];
#pragma unroll
        for (int g = 0; g < U; ++g) w[g] = *reinterpret_cast<const uint4 *>(rows + col[k + g] * stride);
#pragma unroll
        for (int g = 0; g < U; ++g) {
            float v[16];
            fp8x16_to_float(w[g], v);
#pragma unroll
            for (int e = 0; e < 16; ++e) acc[e] = fmaf(h[k + g], v[e], acc[e]);
        }
    }
    for (; k < n; ++k) {
        float v[16];
        fp8x16_to_float(*reinterpret_cast<const uint4 *>(rows + col[k] * stride), v);
#pragma unroll
        for (int e = 0; e < 16; ++e) acc[e] = fmaf(h[k], v[e], acc[e]);
    }
}

/// y's columns k0 .. k0 + 15 of `row` (16-bit types), as two 8-value chunks; nothing past D.
template <class T> __device__ inline void store_chunk16(const FwdArgs<T> &a, int64_t row, int64_t k0, const float (&v)[16]) {
    float lo[8], hi[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) lo[e] = v[e], hi[e] = v[8 + e];
    if (k0 < a.d) store_chunk(a.y, row, a.y_rs, a.y_cs, a.y_vec, k0, a.d, lo);
    if (k0 + 8 < a.d) store_chunk(a.y, row, a.y_rs, a.y_cs, a.y_vec, k0 + 8, a.d, hi);
}

template <class T, bool FP8> __global__ void __launch_bounds__(kFwdYThreads) fwd_y(FwdArgs<T> a) {
    constexpr int E = Chunk<T>::n;
    wait_for_prior_grid();  // h from fwd_u (launch_dependent)
    allow_dependent_launch();
    extern __shared__ int64_t s_col[];  // the row's units, then their h (list width of each)
    float *s_h = reinterpret_cast<float *>(s_col + a.ell);
    const int64_t row = blockIdx.x;
    const int n = min(a.count[row], a.ell);
    if (n < 0) return;
    for (int k = threadIdx.x; k < n; k += kFwdYThreads) {
        const int64_t at = row * a.ell + k;
        s_col[k] = min(static_cast<int64_t>(a.idx[at]), a.h - 1);
        if (a.save_g) {
            const float g = gate_value<T>(a.save_g, at, a.gate_f32);
            s_h[k] = a.gated ? (a.highest ? g * gate_value<T>(a.save_u, at, a.gate_f32)
                                          : round_to<T>(g * gate_value<T>(a.save_u, at, a.gate_f32)))
                             : g;
        } else {
            s_h[k] = gate_value<T>(a.gate, row * a.ldg + s_col[k], a.gate_f32);
        }
        if constexpr (FP8) s_h[k] *= a.fp8.scale[s_col[k]].y;  // h s_j: the row's scale taken out of the sum
    }
    __syncthreads();
    if constexpr (FP8) {  // 16 columns a thread: one 16-byte load of FP8 per unit
        static_assert(E == 8, "FP8 is for 16-bit FFNs");
        const int64_t k0 = (static_cast<int64_t>(blockIdx.y) * kFwdYThreads + threadIdx.x) * 16;
        if (k0 >= a.dp) return;
        float acc[16];
#pragma unroll
        for (int e = 0; e < 16; ++e) acc[e] = 0.0f;
        fp8_rows_axpy<kFwdUnrollFp8>(a.fp8.q + (a.gated ? a.fp8.half : 0) + k0, a.fp8.stride, s_col, s_h, n, acc);
        store_chunk16(a, row, k0, acc);
    } else {
        const int64_t k0 = (static_cast<int64_t>(blockIdx.y) * kFwdYThreads + threadIdx.x) * E;
        if (k0 >= a.dp) return;
        float acc[E];
#pragma unroll
        for (int e = 0; e < E; ++e) acc[e] = 0.0f;
        value_rows_axpy<T, kFwdUnroll>(a.down + k0, a.down_ld, s_col, s_h, n, acc);
        if (k0 < a.d) store_chunk(a.y, row, a.y_rs, a.y_cs, a.y_vec, k0, a.d, acc);
    }
}

}  // namespace twblas::cuda
