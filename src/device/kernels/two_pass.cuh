// The forward's sparse rows in two passes (used by the training forward and by the inference
// forward from heuristics::kTwoPassMinTokens tokens): fwd_u, a warp per (token, active unit), then
// fwd_y, a block per (token, 512-column slice).
#pragma once

#include "common/values.cuh"
#include "common/warp.cuh"

namespace twblas::cuda {

// fwd_u: 8 warps per block (one per active unit in flight); fwd_y: 64 threads of 16-byte chunks
// = 512 bf16 columns per block
constexpr int kFwdUWarps = 8, kFwdYThreads = 64;

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
    const T *pair;
    int64_t pair_stride, dp, d, m, h;
    const void *gate;
    int64_t ldg;
    bool gate_f32, gated, highest;
    const uint16_t *idx;
    const int32_t *count;
    int ell;
    void *save_g, *save_u;  // training: g and u per slot; NULL: h goes over the gate value
    float *row_l1;
};

template <class T> __global__ void __launch_bounds__(32 * kFwdUWarps) fwd_u(FwdArgs<T> a) {
    constexpr int E = Chunk<T>::n;
    extern __shared__ uint4 sx[];  // x_t as dp / E chunks
    __shared__ float warp_l1[kFwdUWarps];
    const int64_t row = blockIdx.x;
    const int n = min(a.count[row], a.ell);
    if (n < 0) return;  // the dense path
    const int nchunks = static_cast<int>(a.dp / E);
    if (a.gated) {
        stage_row(sx, a.x, row, a.x_rs, a.x_cs, a.x_vec, a.d, nchunks);
        __syncthreads();
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    const int64_t base = row * a.ell;
    float l1 = 0.0f;
    for (int k = warp; k < n; k += kFwdUWarps) {
        const int64_t col = min(static_cast<int64_t>(a.idx[base + k]), a.h - 1);
        const float g = gate_value<T>(a.gate, row * a.ldg + col, a.gate_f32);
        float h = g, u = 0.0f;
        if (a.gated) {
            const float dot = warp_row_dot(sx, a.pair + col * a.pair_stride, nchunks);
            u = a.highest ? dot : round_to<T>(dot);
            h = a.highest ? g * u : round_to<T>(g * u);
        }
        if (lane == 0) {
            if (a.save_g) {
                gate_store<T>(a.save_g, base + k, a.gate_f32, g);
                if (a.gated) gate_store<T>(a.save_u, base + k, a.gate_f32, u);
            } else {
                gate_store<T>(const_cast<void *>(a.gate), row * a.ldg + col, a.gate_f32, h);
            }
            l1 += fabsf(h);
        }
    }
    if (lane == 0) warp_l1[warp] = l1;
    __syncthreads();
    if (threadIdx.x == 0) {
        float sum = 0.0f;
        for (int w = 0; w < kFwdUWarps; ++w) sum += warp_l1[w];
        a.row_l1[row] = sum;
    }
}

template <class T> __global__ void __launch_bounds__(kFwdYThreads) fwd_y(FwdArgs<T> a) {
    constexpr int E = Chunk<T>::n;
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
    }
    __syncthreads();
    const int64_t k0 = (static_cast<int64_t>(blockIdx.y) * kFwdYThreads + threadIdx.x) * E;
    if (k0 >= a.dp) return;
    const T *down = a.pair + (a.gated ? a.dp : 0);
    float acc[E];
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] = 0.0f;
    constexpr int kG = 4;
    int k = 0;
    for (; k + kG <= n; k += kG) {
        uint4 w[kG];
#pragma unroll
        for (int g = 0; g < kG; ++g) w[g] = *reinterpret_cast<const uint4 *>(down + s_col[k + g] * a.pair_stride + k0);
#pragma unroll
        for (int g = 0; g < kG; ++g)
#pragma unroll
            for (int e = 0; e < E; ++e) acc[e] = fmaf(s_h[k + g], Chunk<T>::get(w[g], e), acc[e]);
    }
    for (; k < n; ++k) {
        const uint4 w = *reinterpret_cast<const uint4 *>(down + s_col[k] * a.pair_stride + k0);
#pragma unroll
        for (int e = 0; e < E; ++e) acc[e] = fmaf(s_h[k], Chunk<T>::get(w, e), acc[e]);
    }
    if (k0 < a.d) store_chunk(a.y, row, a.y_rs, a.y_cs, a.y_vec, k0, a.d, acc);
}

}  // namespace twblas::cuda
