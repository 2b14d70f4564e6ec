// The fused sparse up/down kernel: a team of warps per token reads only the active units' rows
// [Wu_j | Wd_j] (through a cp.async ring) and accumulates y in registers; h never goes to memory.
// At small M a token's units are dealt to several teams, whose partial rows reduce_splits sums.
#pragma once

#include "common/async_copy.cuh"
#include "common/values.cuh"
#include "common/warp.cuh"
#include "kernel_limits.hpp"

namespace twblas::cuda {

// ---- sparse up/down: a team of W warps per token; V 16-byte chunks of x per thread

template <class T> struct FusedArgs {
    const T *x;
    int64_t x_rs, x_cs;
    bool x_vec;
    T *y;
    int64_t y_rs, y_cs;
    bool y_vec;
    const T *up;    // Wu rows (gated; NULL for a plain FFN), up_ld apart
    int64_t up_ld;
    const T *down;  // Wd rows, down_ld apart
    int64_t down_ld, dp, d, m;
    void *gate;
    int64_t ldg;
    bool gate_f32, gated, highest, write_h;
    const uint16_t *idx;
    int cap;
    const int32_t *count;
    float *row_l1;
    int splits;      // > 1: the units of a token are dealt round-robin to `splits` teams, which
    float *partial;  // write fp32 partial rows [split][m][dp] and l1 [split][m] for reduce_splits
};

constexpr int kStages = 2;  // units in shared memory per team: the current one and one ahead

/// Shared memory of one team: kStages x ([Wu_j | Wd_j] or [Wd_j], dp elements each, then one
/// 4-byte gate word per thread).
template <class T> __host__ __device__ size_t sparse_stage_bytes(int64_t dp, bool gated, int threads) {
    return static_cast<size_t>((gated ? 2 : 1) * dp) * sizeof(T) + static_cast<size_t>(threads) * 4;
}

// a team of up to kFusedMaxTeamWarps warps (D past 4096 at 16 bits, 2048 at 32; the bound was 128
// threads, which made the launch fail past those D)
template <class T, int V>
__global__ void __launch_bounds__(32 * kFusedMaxTeamWarps) sparse_ffn(FusedArgs<T> a) {
    constexpr int E = Chunk<T>::n;
    extern __shared__ uint4 dyn_smem[];
    __shared__ float partial[2][32];
    const int team_threads = blockDim.x;  // 32 * W, one team (token) per block
    const int warps = team_threads / 32;
    const int t = threadIdx.x, lane = t & 31, warp = t / 32;
    const int64_t row = blockIdx.x;
    if (row >= a.m) return;
    const int n = a.count[row];
    if (n < 0) return;  // the dense path writes this row

    // x chunks in registers
    uint4 xc[V];
#pragma unroll
    for (int c = 0; c < V; ++c) {
        const int64_t k0 = (static_cast<int64_t>(c) * team_threads + t) * E;
        if (k0 < a.dp && a.x_vec) {
            xc[c] = __ldcs(reinterpret_cast<const uint4 *>(a.x + row * a.x_rs + k0));
        } else {
            T tmp[E];
            for (int i = 0; i < E; ++i)
                tmp[i] = k0 + i < a.d ? a.x[row * a.x_rs + (k0 + i) * a.x_cs] : Value<T>::from_float(0.0f);
            xc[c] = *reinterpret_cast<const uint4 *>(tmp);
        }
    }
    float acc[V][E];
#pragma unroll
    for (int c = 0; c < V; ++c)
#pragma unroll
        for (int i = 0; i < E; ++i) acc[c][i] = 0.0f;
    float l1 = 0.0f;
    int parity = 0;

    // this team's units: s, s + S, s + 2S, ... of the row's list (S = splits)
    const int split = static_cast<int>(blockIdx.y), splits = a.splits;
    const uint16_t *list = a.idx + row * a.cap;
    const int span = n;
    const int first = 0;
    const int mine = span > split ? (span - split + splits - 1) / splits : 0;
    const int64_t weights = (a.gated ? 2 : 1) * a.dp;
    const size_t stage_bytes = sparse_stage_bytes<T>(a.dp, a.gated, team_threads);
    char *ring = reinterpret_cast<char *>(dyn_smem);
    const uint64_t keep = l2_keep_policy();
    auto issue = [&](int k) {
        if (k < mine) {
            const int col = list[first + split + k * splits];
            char *stage = ring + static_cast<size_t>(k % kStages) * stage_bytes;
            T *dst = reinterpret_cast<T *>(stage);
            // the stage holds [Wu_j | Wd_j] (gated) or [Wd_j]
            const T *down = a.down + col * a.down_ld;
            const T *src = a.gated ? a.up + col * a.up_ld : down;
#pragma unroll
            for (int c = 0; c < V; ++c) {
                const int64_t k0 = (static_cast<int64_t>(c) * team_threads + t) * E;
                if (k0 < a.dp) {
                    cp_async16(dst + k0, src + k0, keep);
                    if (a.gated) cp_async16(dst + a.dp + k0, down + k0, keep);
                }
            }
            // the 4-byte word holding this unit's gate value (16-bit gates: an aligned pair)
            const int64_t gi = row * a.ldg + col;
            const char *gw = a.gate_f32 ? reinterpret_cast<const char *>(static_cast<const float *>(a.gate) + gi)
                                        : reinterpret_cast<const char *>(static_cast<const T *>(a.gate) + (gi & ~int64_t{1}));
            cp_async4(reinterpret_cast<char *>(dst + weights) + t * 4, gw);
        }
        cp_async_commit();  // one group per unit slot, empty past the end: uniform counting
    };
    for (int k = 0; k < kStages - 1; ++k) issue(k);
    for (int k = 0; k < mine; ++k) {
        issue(k + kStages - 1);
        cp_async_wait<kStages - 1>();  // unit k has landed (this thread's copies)
        const char *stage = ring + static_cast<size_t>(k % kStages) * stage_bytes;
        const T *w = reinterpret_cast<const T *>(stage);
        const uint32_t gword = *reinterpret_cast<const uint32_t *>(reinterpret_cast<const char *>(w + weights) + t * 4);
        float g;
        const int col = list[first + split + k * splits];
        if (a.gate_f32) {
            g = __uint_as_float(gword);
        } else {
            const uint4 q = make_uint4(gword, 0, 0, 0);
            g = Chunk<T>::get(q, col & 1);
        }
        float h = g;
        if (a.gated) {
            // E independent partial sums: a single chain of V * E dependent FMAs was the
            // kernel's main stall (ncu: "wait" 39 %, 2 warps per scheduler)
            float part[E];
#pragma unroll
            for (int e = 0; e < E; ++e) part[e] = 0.0f;
#pragma unroll
            for (int c = 0; c < V; ++c) {
                const int64_t k0 = (static_cast<int64_t>(c) * team_threads + t) * E;
                if (k0 < a.dp) {
                    const uint4 wu = *reinterpret_cast<const uint4 *>(w + k0);
#pragma unroll
                    for (int e = 0; e < E; ++e) part[e] = fmaf(Chunk<T>::get(xc[c], e), Chunk<T>::get(wu, e), part[e]);
                }
            }
            float dot = 0.0f;
#pragma unroll
            for (int e = 0; e < E; ++e) dot += part[e];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(kFullMask, dot, o);
            if (warps > 1) {
                if (lane == 0) partial[parity][warp] = dot;
                __syncthreads();
                dot = 0.0f;
                for (int ww = 0; ww < warps; ++ww) dot += partial[parity][ww];
                parity ^= 1;
            }
            const float u = a.highest ? dot : round_to<T>(dot);
            h = a.highest ? g * u : round_to<T>(g * u);
        }
        l1 += fabsf(h);
        if (a.write_h && t == 0) gate_store<T>(a.gate, row * a.ldg + col, a.gate_f32, h);
        const T *wd = w + (a.gated ? a.dp : 0);
#pragma unroll
        for (int c = 0; c < V; ++c) {
            const int64_t k0 = (static_cast<int64_t>(c) * team_threads + t) * E;
            if (k0 < a.dp) {
                const uint4 q = *reinterpret_cast<const uint4 *>(wd + k0);
#pragma unroll
                for (int e = 0; e < E; ++e) acc[c][e] = fmaf(h, Chunk<T>::get(q, e), acc[c][e]);
            }
        }
    }
    cp_async_wait<0>();

    if (a.splits > 1) {
        float *part = a.partial + (static_cast<int64_t>(blockIdx.y) * a.m + row) * a.dp;
#pragma unroll
        for (int c = 0; c < V; ++c) {
            const int64_t k0 = (static_cast<int64_t>(c) * team_threads + t) * E;
            if (k0 >= a.dp) continue;
#pragma unroll
            for (int e = 0; e < E; e += 4)
                *reinterpret_cast<float4 *>(part + k0 + e) = make_float4(acc[c][e], acc[c][e + 1], acc[c][e + 2], acc[c][e + 3]);
        }
        if (t == 0) a.partial[static_cast<int64_t>(a.splits) * a.m * a.dp + static_cast<int64_t>(blockIdx.y) * a.m + row] = l1;
        return;
    }
#pragma unroll
    for (int c = 0; c < V; ++c) {
        const int64_t k0 = (static_cast<int64_t>(c) * team_threads + t) * E;
        if (k0 >= a.dp) continue;
        if (a.y_vec) {
            T out[E];
            for (int e = 0; e < E; ++e) out[e] = Value<T>::from_float(acc[c][e]);
            *reinterpret_cast<uint4 *>(a.y + row * a.y_rs + k0) = *reinterpret_cast<const uint4 *>(out);
        } else {
            for (int e = 0; e < E; ++e)
                if (k0 + e < a.d) a.y[row * a.y_rs + (k0 + e) * a.y_cs] = Value<T>::from_float(acc[c][e]);
        }
    }
    if (t == 0) a.row_l1[row] = l1;
}

/// Sums the split partials of each sparse row in split order (deterministic) into Y and row_l1.
template <class T> __global__ void reduce_splits(const float *partial, int splits, int64_t m, int64_t d, int64_t dp,
                                                 const int32_t *count, T *y, int64_t y_rs, int64_t y_cs, float *row_l1) {
    const int64_t total = m * d;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t row = i / d, k = i % d;
        if (count[row] < 0) continue;  // the dense path writes this row
        float v = 0.0f;
        for (int sp = 0; sp < splits; ++sp) v += partial[(sp * m + row) * dp + k];
        y[row * y_rs + k * y_cs] = Value<T>::from_float(v);
        if (k == 0) {
            const float *l1 = partial + static_cast<int64_t>(splits) * m * dp;
            float s = 0.0f;
            for (int sp = 0; sp < splits; ++sp) s += l1[sp * m + row];
            row_l1[row] = s;
        }
    }
}

}  // namespace twblas::cuda
