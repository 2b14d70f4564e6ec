// Decode (a few tokens, 16-bit types): one launch does the gate, the unit choice and the
// up/down projections, streaming the gate weights once; decode_reduce sums per token.
#pragma once

#include "common/values.cuh"
#include "common/warp.cuh"
#include "ffn_layout.hpp"
#include "kernel_limits.hpp"

namespace twblas::cuda {

// ---- decode (a few tokens, 16-bit types): one launch does the gate, the packing and
// the up/down projections. Each warp owns one unit: it loads the unit's whole gate row at once
// (all warps together stream the gate weights once, the floor of a decode step) and, when the
// unit fires for some token, its up row. The block then applies the down rows of its 8 units to
// the tokens they fired for, in unit order, into one fp32 partial row per token; decode_reduce
// sums, per token, the partial rows of the blocks that had any, in block order (deterministic).

// Tokens the kernel's per-warp registers hold (the path takes up to kDecodeMaxTokens); C chunks of 8 values per lane cover D <= 256 C.
constexpr int kDecodeTokenCapacity = 8;
static_assert(kDecodeMaxTokens <= kDecodeTokenCapacity, "decode takes more tokens than it holds");

template <class T> struct DecodeArgs {
    const T *x;
    int64_t x_rs, x_cs;
    bool x_vec;  // row-major, 16-byte aligned rows: vector loads
    int m;
    int64_t d, dp, h;
    const T *wgate;  // H rows, wgate_ld apart
    int64_t wgate_ld;
    const T *up;  // Wu rows (gated), up_ld apart
    int64_t up_ld;
    const T *down;  // Wd rows, down_ld apart
    int64_t down_ld;
    bool gated, highest, gate_f32, write_h;
    void *gate;  // h of every (token, unit) for the hidden output
    int64_t ldg;
    int tile, nt;
    int *row_nnz, *tile_cnt, *list_count, *list;
    int nblk;  // blocks in the grid
    float *partial, *partial_l1;
    unsigned long long *neuron_counts;
};

template <class T> __device__ inline float dot8(const uint4 &a, const uint4 &b) {
    float s = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) s = fmaf(Chunk<T>::get(a, e), Chunk<T>::get(b, e), s);
    return s;
}

/// Per token t < m: the warp-reduced dot product of row (dp values) with x_t (smem).
template <class T, int C> __device__ inline void dots_with_row(const T *row, const T *xs, int64_t dp, int m, unsigned mask,
                                                               float *out) {
    const int lane = threadIdx.x & 31;
    uint4 w[C];
#pragma unroll
    for (int c = 0; c < C; ++c) {  // every load in flight before the first use
        const int64_t k0 = (static_cast<int64_t>(c) * 32 + lane) * 8;
        w[c] = k0 < dp ? __ldcs(reinterpret_cast<const uint4 *>(row + k0)) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int t = 0; t < kDecodeTokenCapacity; ++t) {
        float acc = 0.0f;
        if (t < m && (mask >> t & 1u)) {
#pragma unroll
            for (int c = 0; c < C; ++c) {
                const int64_t k0 = (static_cast<int64_t>(c) * 32 + lane) * 8;
                if (k0 < dp) acc += dot8<T>(*reinterpret_cast<const uint4 *>(xs + t * dp + k0), w[c]);
            }
        }
        out[t] = warp_sum(acc);
    }
}

template <class T, int C> __global__ void __launch_bounds__(256) decode_ffn(DecodeArgs<T> a) {
    extern __shared__ uint4 decode_smem[];
    T *xs = reinterpret_cast<T *>(decode_smem);  // m x dp, zero padded
    __shared__ float hs[kDecodeUnitsPerBlock][kDecodeTokenCapacity];
    __shared__ unsigned act[kDecodeUnitsPerBlock];
    // x into shared memory, 16 bytes per thread and step (no index division: it cost more than
    // the gate itself at M = 8)
    for (int t = 0; t < a.m; ++t)
        for (int64_t k0 = static_cast<int64_t>(threadIdx.x) * 8; k0 < a.dp; k0 += static_cast<int64_t>(blockDim.x) * 8) {
            uint4 v;
            if (a.x_vec) {
                v = *reinterpret_cast<const uint4 *>(a.x + t * a.x_rs + k0);
            } else {
                T tmp[8];
                for (int e = 0; e < 8; ++e)
                    tmp[e] = k0 + e < a.d ? a.x[t * a.x_rs + (k0 + e) * a.x_cs] : Value<T>::from_float(0.0f);
                v = *reinterpret_cast<const uint4 *>(tmp);
            }
            *reinterpret_cast<uint4 *>(xs + t * a.dp + k0) = v;
        }
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int64_t j = static_cast<int64_t>(blockIdx.x) * kDecodeUnitsPerBlock + warp;
    unsigned active = 0;
    float hv[kDecodeTokenCapacity];
#pragma unroll
    for (int t = 0; t < kDecodeTokenCapacity; ++t) hv[t] = 0.0f;
    if (j < a.h) {
        float z[kDecodeTokenCapacity], g[kDecodeTokenCapacity];
        dots_with_row<T, C>(a.wgate + j * a.wgate_ld, xs, a.dp, a.m, ~0u, z);
#pragma unroll
        for (int t = 0; t < kDecodeTokenCapacity; ++t) {
            g[t] = a.highest ? z[t] : round_to<T>(z[t]);
            if (t < a.m && relu_active(g[t])) active |= 1u << t;
        }
        if (active && a.gated) {
            float u[kDecodeTokenCapacity];
            dots_with_row<T, C>(a.up + j * a.up_ld, xs, a.dp, a.m, active, u);
#pragma unroll
            for (int t = 0; t < kDecodeTokenCapacity; ++t)
                if (active >> t & 1u) {
                    const float ur = a.highest ? u[t] : round_to<T>(u[t]);
                    hv[t] = a.highest ? g[t] * ur : round_to<T>(g[t] * ur);
                }
        } else if (active) {
#pragma unroll
            for (int t = 0; t < kDecodeTokenCapacity; ++t)
                if (active >> t & 1u) hv[t] = g[t];
        }
        if (lane == 0) {
#pragma unroll
            for (int t = 0; t < kDecodeTokenCapacity; ++t) {
                if (t >= a.m) continue;
                if (a.write_h) gate_store<T>(a.gate, t * a.ldg + j, a.gate_f32, hv[t]);
                if (!(active >> t & 1u)) continue;
                atomicAdd(a.row_nnz + t, 1);
                atomicAdd(a.tile_cnt + t * a.nt + j / a.tile, 1);
                if (a.neuron_counts) atomicAdd(a.neuron_counts + j, 1ull);
            }
        }
    }
    if (lane == 0) {
        act[warp] = active;
#pragma unroll
        for (int t = 0; t < kDecodeTokenCapacity; ++t) hs[warp][t] = hv[t];
    }
    __syncthreads();
    unsigned any = 0;
    for (int w = 0; w < kDecodeUnitsPerBlock; ++w) any |= act[w];
    if (!any) return;  // uniform: nothing fired in this block

    // down rows of the block's units, in unit order, for the tokens they fired for (token by
    // token: the block's 8 rows stay in L1 after the first)
    for (int t = 0; t < a.m; ++t) {
        if (!(any >> t & 1u)) continue;
        for (int64_t k0 = static_cast<int64_t>(threadIdx.x) * 8; k0 < a.dp; k0 += static_cast<int64_t>(blockDim.x) * 8) {
            float acc[8] = {};
            for (int w = 0; w < kDecodeUnitsPerBlock; ++w) {
                if (!(act[w] >> t & 1u)) continue;
                const int64_t jw = static_cast<int64_t>(blockIdx.x) * kDecodeUnitsPerBlock + w;
                const uint4 q = *reinterpret_cast<const uint4 *>(a.down + jw * a.down_ld + k0);
                const float hw = hs[w][t];
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[e] = fmaf(hw, Chunk<T>::get(q, e), acc[e]);
            }
            float4 *pr = reinterpret_cast<float4 *>(a.partial + (static_cast<int64_t>(blockIdx.x) * a.m + t) * a.dp + k0);
            pr[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
            pr[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
        }
    }
    if (threadIdx.x == 0) {
#pragma unroll
        for (int t = 0; t < kDecodeTokenCapacity; ++t) {
            if (!(any >> t & 1u)) continue;
            float l1 = 0.0f;
            for (int w = 0; w < kDecodeUnitsPerBlock; ++w) l1 += fabsf(hs[w][t]);
            a.partial_l1[static_cast<int64_t>(blockIdx.x) * a.m + t] = l1;
            a.list[t * a.nblk + atomicAdd(a.list_count + t, 1)] = static_cast<int>(blockIdx.x);
        }
    }
}

/// Grid (token, column block): the blocks that wrote a partial row for the token, sorted
/// (deterministic order), summed into y with loads in flight in parallel; block 0 of each token
/// also finishes the row's count (-1: a TwELL tile over capacity), nnz and l1 for finalize.
template <class T> __global__ void __launch_bounds__(256) decode_reduce(DecodeArgs<T> a, T *y, int64_t y_rs, int64_t y_cs,
                                                                       int slots, int32_t *count, int32_t *row_nnz,
                                                                       float *row_l1) {
    extern __shared__ int sorted[];
    const int t = blockIdx.x;
    const int n = a.list_count[t];
    const int *list = a.list + t * a.nblk;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int v = list[i];
        int rank = 0;
        for (int k = 0; k < n; ++k) rank += list[k] < v;
        sorted[rank] = v;
    }
    __syncthreads();
    const int64_t k = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
    if (k < a.d) {
        // eight independent loads per step; the partial sums are combined in a fixed order
        float part[8] = {};
        int i = 0;
        for (; i + 8 <= n; i += 8) {
#pragma unroll
            for (int q = 0; q < 8; ++q) part[q] += a.partial[(static_cast<int64_t>(sorted[i + q]) * a.m + t) * a.dp + k];
        }
        for (int q = 0; i < n; ++i, ++q) part[q] += a.partial[(static_cast<int64_t>(sorted[i]) * a.m + t) * a.dp + k];
        float sum = 0.0f;
#pragma unroll
        for (int q = 0; q < 8; ++q) sum += part[q];
        y[t * y_rs + k * y_cs] = Value<T>::from_float(sum);
    }
    if (blockIdx.y == 0 && threadIdx.x == 0) {
        float l1 = 0.0f;
        for (int i = 0; i < n; ++i) l1 += a.partial_l1[static_cast<int64_t>(sorted[i]) * a.m + t];
        row_l1[t] = l1;
        bool over = false;
        for (int i = 0; i < a.nt; ++i) over |= a.tile_cnt[t * a.nt + i] > slots;
        row_nnz[t] = a.row_nnz[t];
        count[t] = over ? -1 : a.row_nnz[t];
    }
}

}  // namespace twblas::cuda
