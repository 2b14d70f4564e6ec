// The backward's token phase: dh, dz, du per saved (token, unit) slot, then dX per token.
#pragma once

#include "common/values.cuh"
#include "common/warp.cuh"
#include "ffn_layout.hpp"
#include "kernels/ffn_math.cuh"

namespace twblas::cuda {

// ---- token phase

template <class T> struct TokenArgs {
    const T *dy;
    int64_t dy_rs, dy_cs;
    bool dy_vec;
    T *dx;
    int64_t dx_rs, dx_cs;
    bool dx_vec;
    const T *up;  // Wu rows (gated; NULL for a plain FFN), up_ld apart
    int64_t up_ld;
    const T *down;  // Wd rows, down_ld apart
    int64_t down_ld;
    const T *gate_w;  // Wg_j (gated) or Wu_j (plain), gate_ld apart
    int64_t gate_ld;
    int64_t dp, d, m, h;
    bool gate_f32, gated, highest;
    L1Scale l1_scale;
    const uint16_t *idx;
    const void *sg, *su;
    const int32_t *count;
    int ell;
    void *dz, *du;  // per slot, gate type
};

// ---- token phase, in two kernels:
//   token_dh  one warp per (token, active unit): dh = dY_t . Wd_j over the whole row (dY_t in
//             shared memory), then dz and du for the slot;
//   token_dx  one block per (token, 512-column slice), slice by slice: dX_t = sum du Wu_j + dz Wg_j
//             over the token's units, four units' rows loaded at once.
// The fused kernel before them read three rows per unit through a cp.async ring and was bound
// by load latency (ncu: 1.13 ms at the paper's shape, 3.0 GB from HBM).

constexpr int kDhWarps = 8;


template <class T> __global__ void __launch_bounds__(32 * kDhWarps) token_dh(TokenArgs<T> a) {
    constexpr int E = Chunk<T>::n;
    extern __shared__ uint4 sy[];  // dY_t as dp / E chunks
    const int64_t row = blockIdx.x;
    const int n = min(a.count[row], a.ell);
    if (n <= 0) return;
    const int nchunks = static_cast<int>(a.dp / E);
    stage_row(sy, a.dy, row, a.dy_rs, a.dy_cs, a.dy_vec, a.d, nchunks);
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    const float l1_scale = a.l1_scale.get();  // once, not per unit (it may be a load)
    const int64_t base = row * a.ell;
    for (int k = warp; k < n; k += kDhWarps) {
        const int64_t col = min(static_cast<int64_t>(a.idx[base + k]), a.h - 1);
        const float dot = warp_row_dot(sy, a.down + col * a.down_ld, nchunks);
        if (lane == 0) {
            const float g = gate_value<T>(a.sg, base + k, a.gate_f32), u = a.gated ? gate_value<T>(a.su, base + k, a.gate_f32) : 0.0f;
            const UnitGrad ug = unit_grad<T>(g, u, dot, a.gated, a.highest, l1_scale);
            gate_store<T>(a.dz, base + k, a.gate_f32, ug.dz);
            if (a.gated) gate_store<T>(a.du, base + k, a.gate_f32, ug.du);
        }
    }
}

constexpr int kDxThreads = 64;

template <class T> __global__ void __launch_bounds__(kDxThreads) token_dx(TokenArgs<T> a) {
    constexpr int E = Chunk<T>::n;
    __shared__ int64_t s_col[kSavedEll];
    __shared__ float s_c1[kSavedEll], s_c2[kSavedEll];
    const int64_t row = blockIdx.x;
    const int n = min(a.count[row], a.ell);
    if (n < 0) return;  // a recomputed row: the dense path writes it
    for (int k = threadIdx.x; k < n; k += kDxThreads) {
        const int64_t at = row * a.ell + k;
        s_col[k] = min(static_cast<int64_t>(a.idx[at]), a.h - 1);
        const float dz = gate_value<T>(a.dz, at, a.gate_f32);
        s_c1[k] = a.gated ? gate_value<T>(a.du, at, a.gate_f32) : dz;  // times Wu_j
        s_c2[k] = dz;                                             // times Wg_j (gated)
    }
    __syncthreads();
    const int64_t k0 = (static_cast<int64_t>(blockIdx.y) * kDxThreads + threadIdx.x) * E;
    if (k0 >= a.dp) return;
    float acc[E];
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] = 0.0f;
    // Wu_j: the up rows (gated) or the gate-weight row (plain, where gate_w = Wu)
    const T *up = a.gated ? a.up : a.gate_w;
    const int64_t up_stride = a.gated ? a.up_ld : a.gate_ld;
    constexpr int kG = 4;
    int k = 0;
    for (; k + kG <= n; k += kG) {
        uint4 wu[kG], wg[kG];
#pragma unroll
        for (int g = 0; g < kG; ++g) {
            wu[g] = *reinterpret_cast<const uint4 *>(up + s_col[k + g] * up_stride + k0);
            if (a.gated) wg[g] = *reinterpret_cast<const uint4 *>(a.gate_w + s_col[k + g] * a.gate_ld + k0);
        }
#pragma unroll
        for (int g = 0; g < kG; ++g) {
            const float c1 = s_c1[k + g], c2 = s_c2[k + g];
#pragma unroll
            for (int e = 0; e < E; ++e) {
                acc[e] = fmaf(c1, Chunk<T>::get(wu[g], e), acc[e]);
                if (a.gated) acc[e] = fmaf(c2, Chunk<T>::get(wg[g], e), acc[e]);
            }
        }
    }
    for (; k < n; ++k) {
        const uint4 wu = *reinterpret_cast<const uint4 *>(up + s_col[k] * up_stride + k0);
        const float c1 = s_c1[k], c2 = s_c2[k];
#pragma unroll
        for (int e = 0; e < E; ++e) acc[e] = fmaf(c1, Chunk<T>::get(wu, e), acc[e]);
        if (a.gated) {
            const uint4 wg = *reinterpret_cast<const uint4 *>(a.gate_w + s_col[k] * a.gate_ld + k0);
#pragma unroll
            for (int e = 0; e < E; ++e) acc[e] = fmaf(c2, Chunk<T>::get(wg, e), acc[e]);
        }
    }
    if (k0 < a.d) store_chunk(a.dx, row, a.dx_rs, a.dx_cs, a.dx_vec, k0, a.d, acc);
}

}  // namespace twblas::cuda
