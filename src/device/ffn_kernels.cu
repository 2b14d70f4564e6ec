// The fused feed-forward after its gate GEMM:
//   pack      one warp per token turns the gate row into the list of active units (ascending),
//             flags rows with a TwELL tile over capacity and appends them to the dense list;
//   sparse    a team of warps per token reads only the active units' rows [Wu_j | Wd_j] and
//             accumulates y in registers; h never goes to memory;
//   dense     overflowing rows go through gathered tensor-core GEMMs whose row count is read on
//             the device (no host synchronisation): exact for any sparsity;
//   stats     per-row counts reduced in a fixed order (deterministic).
#include <cub/block/block_reduce.cuh>
#include <mma.h>

#include <algorithm>
#include <type_traits>

#include "cuda_util.cuh"
#include "device_values.cuh"
#include "kernels.hpp"
#include "lt_gemm.hpp"

namespace twblas::cuda {

namespace {

constexpr unsigned kFull = 0xffffffffu;

struct MaxOp {
    __device__ long long operator()(long long a, long long b) const { return a > b ? a : b; }
};

// ---- pack: one warp per token, 256 gate values (8 per lane) per step

template <class T> struct PackArgs {
    void *gate;
    int64_t ldg, m, h;
    bool gate_f32, zero_inactive;
    int tile, slots, cap;
    uint16_t *idx;
    int32_t *count, *row_nnz, *dense_rows;
    uint32_t *dense_count;
    unsigned long long *neuron_counts;
    int row_limit;    // rows with more active units go to the dense path (GEMMs beat gathers)
    const T *up;      // dense mode (16-bit types): X Wu^T of every row, NULL for a plain FFN
    bool dense_mode;  // dense mode: write h over the gate and each row's l1; no unit lists
    float *row_l1;
};

template <class T> __global__ void __launch_bounds__(128) pack_rows(PackArgs<T> a) {
    const int64_t row = static_cast<int64_t>(blockIdx.x) * 4 + threadIdx.x / 32;
    if (row >= a.m) return;
    const int lane = threadIdx.x & 31;
    const int lanes_per_tile = a.tile / 8;
    const int first = lane & ~(lanes_per_tile - 1);
    uint16_t *idx = a.idx + row * a.cap;
    int total = 0;
    bool overflow = false;
    float l1 = 0.0f;
    for (int64_t c0 = 0; c0 < a.h; c0 += 256) {
        const int64_t cl = c0 + lane * 8;
        float v[8];
        if (cl < a.ldg) {  // ldg is a multiple of 8: whole 16-byte chunks
            if (a.gate_f32) {
                const float4 *p = reinterpret_cast<const float4 *>(static_cast<const float *>(a.gate) + row * a.ldg + cl);
                const float4 q0 = __ldcs(p), q1 = __ldcs(p + 1);
                v[0] = q0.x, v[1] = q0.y, v[2] = q0.z, v[3] = q0.w, v[4] = q1.x, v[5] = q1.y, v[6] = q1.z, v[7] = q1.w;
            } else {
                const uint4 q = __ldcs(reinterpret_cast<const uint4 *>(static_cast<const T *>(a.gate) + row * a.ldg + cl));
                for (int i = 0; i < 8; ++i) v[i] = Chunk<T>::get(q, i);
            }
        }
        unsigned mask = 0;
        for (int i = 0; i < 8; ++i)
            if (cl + i < a.h && relu_active(v[i])) mask |= 1u << i;
        const int n = __popc(mask);
        const int incl = warp_scan_incl(n), excl = incl - n;
        const int tile_base = __shfl_sync(kFull, excl, first);
        const int tile_count = __shfl_sync(kFull, incl, first + lanes_per_tile - 1) - tile_base;
        overflow |= __any_sync(kFull, tile_count > a.slots);
        int pos = total + excl;
        for (int i = 0; i < 8; ++i) {
            if (!(mask >> i & 1u)) continue;
            if (!a.dense_mode && pos < a.cap) idx[pos] = static_cast<uint16_t>(cl + i);
            ++pos;
            if (a.neuron_counts) atomicAdd(a.neuron_counts + cl + i, 1ull);
        }
        if constexpr (!std::is_same_v<T, float>) {
            if (a.dense_mode && cl < a.ldg) {
                // h = relu(g) * u rounded (gated) or relu(g), written over the gate values
                uint4 uq = make_uint4(0, 0, 0, 0);
                if (a.up) uq = *reinterpret_cast<const uint4 *>(a.up + row * a.ldg + cl);
                T out[8];
                for (int i = 0; i < 8; ++i) {
                    float hv = 0.0f;
                    if (mask >> i & 1u) hv = a.up ? round_to<T>(v[i] * Chunk<T>::get(uq, i)) : v[i];
                    out[i] = Value<T>::from_float(hv);
                    l1 += fabsf(Value<T>::to_float(out[i]));
                }
                *reinterpret_cast<uint4 *>(static_cast<T *>(a.gate) + row * a.ldg + cl) = *reinterpret_cast<const uint4 *>(out);
            }
        }
        if (a.zero_inactive && !a.dense_mode && cl < a.ldg && mask != 0xffu) {
            for (int i = 0; i < 8; ++i)
                if (!(mask >> i & 1u)) gate_store<T>(a.gate, row * a.ldg + cl + i, a.gate_f32, 0.0f);
        }
        total += __shfl_sync(kFull, incl, 31);
    }
    if (a.dense_mode) {
        for (int o = 16; o > 0; o >>= 1) l1 += __shfl_xor_sync(kFull, l1, o);
        if (lane == 0) {
            a.row_nnz[row] = total;
            a.count[row] = overflow ? -1 : total;
            a.row_l1[row] = l1;
        }
        return;
    }
    if (lane == 0) {
        a.row_nnz[row] = total;
        // -1: a TwELL tile over capacity (counted in the statistics); -2: a long row
        if (overflow || total > a.row_limit) {
            a.count[row] = overflow ? -1 : -2;
            a.dense_rows[atomicAdd(a.dense_count, 1u)] = static_cast<int32_t>(row);
        } else {
            a.count[row] = total;
        }
    }
}

/// Per-unit activation counts of a dense forward, by columns: each thread counts 8 adjacent
/// units over 256 rows and adds once, instead of one atomic per active (token, unit), which at
/// 900 active units per token contended on 5632 counters (ncu: the packing pass doubled).
constexpr int kCountRows = 256;
template <class T> __global__ void __launch_bounds__(256) count_active_columns(const T *gate, int64_t ldg, int64_t m,
                                                                             int64_t h, unsigned long long *counts) {
    const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
    if (c0 >= ldg) return;
    const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kCountRows, r1 = min(m, r0 + kCountRows);
    unsigned n[8] = {};
    for (int64_t r = r0; r < r1; ++r) {
        const uint4 q = __ldcs(reinterpret_cast<const uint4 *>(gate + r * ldg + c0));
        for (int i = 0; i < 8; ++i) n[i] += relu_active(Chunk<T>::get(q, i)) ? 1u : 0u;
    }
    for (int i = 0; i < 8; ++i)
        if (n[i] && c0 + i < h) atomicAdd(counts + c0 + i, static_cast<unsigned long long>(n[i]));
}

// ---- sparse up/down: a team of W warps per token; V 16-byte chunks of x per thread

template <class T> struct SparseArgs {
    const T *x;
    int64_t x_rs, x_cs;
    bool x_vec;
    T *y;
    int64_t y_rs, y_cs;
    bool y_vec;
    const T *pair;
    int64_t pair_stride, dp, d, m;
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

template <class T, int V> __global__ void __launch_bounds__(128) sparse_ffn(SparseArgs<T> a) {
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
            const T *src = a.pair + col * a.pair_stride;
#pragma unroll
            for (int c = 0; c < V; ++c) {
                const int64_t k0 = (static_cast<int64_t>(c) * team_threads + t) * E;
                if (k0 < a.dp) {
                    cp_async16(dst + k0, src + k0, keep);
                    if (a.gated) cp_async16(dst + a.dp + k0, src + a.dp + k0, keep);
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
            for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(kFull, dot, o);
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

// ---- decode (M <= kDecodeMaxTokens, 16-bit types): one launch does the gate, the packing and
// the up/down projections. Each warp owns one unit: it loads the unit's whole gate row at once
// (all warps together stream the gate weights once, the floor of a decode step) and, when the
// unit fires for some token, its up row. The block then applies the down rows of its 8 units to
// the tokens they fired for, in unit order, into one fp32 partial row per token; decode_reduce
// sums, per token, the partial rows of the blocks that had any, in block order (deterministic).

constexpr int kDecodeMaxTokens = 8, kDecodeWarps = 8;  // C chunks of 8 values per lane: D <= 256 C

template <class T> struct DecodeArgs {
    const T *x;
    int64_t x_rs, x_cs;
    bool x_vec;  // row-major, 16-byte aligned rows: vector loads
    int m;
    int64_t d, dp, h;
    const T *wgate;  // H x dp
    const T *pair;
    int64_t pair_stride;
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
__device__ inline float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
    return v;
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
    for (int t = 0; t < kDecodeMaxTokens; ++t) {
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
    __shared__ float hs[kDecodeWarps][kDecodeMaxTokens];
    __shared__ unsigned act[kDecodeWarps];
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
    const int64_t j = static_cast<int64_t>(blockIdx.x) * kDecodeWarps + warp;
    unsigned active = 0;
    float hv[kDecodeMaxTokens];
#pragma unroll
    for (int t = 0; t < kDecodeMaxTokens; ++t) hv[t] = 0.0f;
    if (j < a.h) {
        float z[kDecodeMaxTokens], g[kDecodeMaxTokens];
        dots_with_row<T, C>(a.wgate + j * a.dp, xs, a.dp, a.m, ~0u, z);
#pragma unroll
        for (int t = 0; t < kDecodeMaxTokens; ++t) {
            g[t] = a.highest ? z[t] : round_to<T>(z[t]);
            if (t < a.m && relu_active(g[t])) active |= 1u << t;
        }
        if (active && a.gated) {
            float u[kDecodeMaxTokens];
            dots_with_row<T, C>(a.pair + j * a.pair_stride, xs, a.dp, a.m, active, u);
#pragma unroll
            for (int t = 0; t < kDecodeMaxTokens; ++t)
                if (active >> t & 1u) {
                    const float ur = a.highest ? u[t] : round_to<T>(u[t]);
                    hv[t] = a.highest ? g[t] * ur : round_to<T>(g[t] * ur);
                }
        } else if (active) {
#pragma unroll
            for (int t = 0; t < kDecodeMaxTokens; ++t)
                if (active >> t & 1u) hv[t] = g[t];
        }
        if (lane == 0) {
#pragma unroll
            for (int t = 0; t < kDecodeMaxTokens; ++t) {
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
        for (int t = 0; t < kDecodeMaxTokens; ++t) hs[warp][t] = hv[t];
    }
    __syncthreads();
    unsigned any = 0;
    for (int w = 0; w < kDecodeWarps; ++w) any |= act[w];
    if (!any) return;  // uniform: nothing fired in this block

    // down rows of the block's units, in unit order, for the tokens they fired for (token by
    // token: the block's 8 rows stay in L1 after the first)
    for (int t = 0; t < a.m; ++t) {
        if (!(any >> t & 1u)) continue;
        for (int64_t k0 = static_cast<int64_t>(threadIdx.x) * 8; k0 < a.dp; k0 += static_cast<int64_t>(blockDim.x) * 8) {
            float acc[8] = {};
            for (int w = 0; w < kDecodeWarps; ++w) {
                if (!(act[w] >> t & 1u)) continue;
                const int64_t jw = static_cast<int64_t>(blockIdx.x) * kDecodeWarps + w;
                const uint4 q = *reinterpret_cast<const uint4 *>(a.pair + jw * a.pair_stride + (a.gated ? a.dp : 0) + k0);
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
        for (int t = 0; t < kDecodeMaxTokens; ++t) {
            if (!(any >> t & 1u)) continue;
            float l1 = 0.0f;
            for (int w = 0; w < kDecodeWarps; ++w) l1 += fabsf(hs[w][t]);
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

// ---- dense path: C[rows[i], :] = epilogue(A[rows[i], :] * B^T) for i < *count
//
// A element (r, k) at a + r * a_rs + k * a_cs (type TA); B row-major n x k (ldb, type T, K-major,
// padded with zeros). 64 x 128 output tiles, K steps of 32, 8 warps (each 32 x 32).

enum class Epilogue { UpGated, Down };

template <class T, class TA> struct GatherArgs {
    const TA *a;
    int64_t a_rs, a_cs;
    bool relu_a;  // plain FFN: A is the raw gate, apply ReLU on load
    const T *b;
    int64_t ldb, n, k;
    const int32_t *rows;
    const uint32_t *count;
    void *gate;  // UpGated: reads g, writes h (gate type)
    int64_t ldg;
    bool gate_f32, highest;
    T *y;  // Down
    int64_t y_rs, y_cs;
    int64_t first;  // rows[first..count) (the ones before went through cuBLAS)
};

constexpr int kTm = 64, kTn = 128, kTk = 32;

template <class T, class TA> __device__ inline float a_elem(const GatherArgs<T, TA> &g, int64_t r, int64_t k) {
    float v = load_elem(g.a, r * g.a_rs + k * g.a_cs);
    if (g.relu_a && !relu_active(v)) v = 0.0f;
    return v;
}

template <class T, class TA, Epilogue EPI>
__device__ inline void gather_epilogue(const GatherArgs<T, TA> &g, int64_t r, int64_t col, float z) {
    if (col >= g.n) return;
    if constexpr (EPI == Epilogue::UpGated) {
        const int64_t at = r * g.ldg + col;
        const float gv = gate_value<T>(g.gate, at, g.gate_f32);
        float h = 0.0f;
        if (relu_active(gv)) {
            const float u = g.highest ? z : round_to<T>(z);
            h = g.highest ? gv * u : round_to<T>(gv * u);
        }
        gate_store<T>(g.gate, at, g.gate_f32, h);
    } else {
        g.y[r * g.y_rs + col * g.y_cs] = Value<T>::from_float(z);
    }
}

/// Tensor-core version (16-bit A and B): wmma 16x16x16, fp32 accumulation.
template <class T, Epilogue EPI> __global__ void __launch_bounds__(256) gathered_gemm_tc(GatherArgs<T, T> g) {
    using namespace nvcuda;
    __shared__ __align__(32) T sa[kTm][kTk + 8];
    __shared__ __align__(32) T sb[kTn][kTk + 8];
    __shared__ __align__(32) float sc[kTm][kTn + 4];
    __shared__ int64_t srow[kTm];
    const int tid = threadIdx.x, warp = tid / 32;
    const int wm = warp / 4, wn = warp % 4;  // 2 x 4 warps of 32 x 32
    const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTn;
    const int64_t total = *g.count;
    for (int64_t m0 = g.first + static_cast<int64_t>(blockIdx.y) * kTm; m0 < total; m0 += static_cast<int64_t>(gridDim.y) * kTm) {
        __syncthreads();
        if (tid < kTm) srow[tid] = m0 + tid < total ? g.rows[m0 + tid] : -1;
        __syncthreads();
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
        for (int i = 0; i < 2; ++i)
            for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
        for (int64_t k0 = 0; k0 < g.k; k0 += kTk) {
            // A: 64 x 32 elements, 8 per thread
            for (int e = tid; e < kTm * kTk; e += 256) {
                const int r = e / kTk, kk = e % kTk;
                const int64_t row = srow[r];
                float v = 0.0f;
                if (row >= 0 && k0 + kk < g.k) v = a_elem(g, row, k0 + kk);
                sa[r][kk] = Value<T>::from_float(v);
            }
            // B: 128 x 32 elements as 16-byte chunks (rows padded with zeros to ldb)
            for (int e = tid; e < kTn * kTk / 8; e += 256) {
                const int r = e / (kTk / 8), kc = (e % (kTk / 8)) * 8;
                uint4 v = make_uint4(0, 0, 0, 0);
                if (n0 + r < g.n && k0 + kc < g.ldb) v = *reinterpret_cast<const uint4 *>(g.b + (n0 + r) * g.ldb + k0 + kc);
                *reinterpret_cast<uint4 *>(&sb[r][kc]) = v;
            }
            __syncthreads();
            for (int kk = 0; kk < kTk; kk += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa[2];
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb[2];
                for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], &sa[wm * 32 + i * 16][kk], kTk + 8);
                for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(fb[j], &sb[wn * 32 + j * 16][kk], kTk + 8);
                for (int i = 0; i < 2; ++i)
                    for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
            }
            __syncthreads();
        }
        for (int i = 0; i < 2; ++i)
            for (int j = 0; j < 2; ++j)
                wmma::store_matrix_sync(&sc[wm * 32 + i * 16][wn * 32 + j * 16], acc[i][j], kTn + 4, wmma::mem_row_major);
        __syncthreads();
        for (int e = tid; e < kTm * kTn; e += 256) {
            const int r = e / kTn, c = e % kTn;
            if (srow[r] >= 0) gather_epilogue<T, T, EPI>(g, srow[r], n0 + c, sc[r][c]);
        }
    }
}

/// fp32 version (fp32 data, or HIGHEST_PRECISION's fp32 h): plain FMAs, 4 x 8 outputs per thread.
template <class T, class TA, Epilogue EPI> __global__ void __launch_bounds__(256) gathered_gemm_f32(GatherArgs<T, TA> g) {
    __shared__ float sa[kTk][kTm + 1];
    __shared__ float sb[kTk][kTn + 1];
    __shared__ int64_t srow[kTm];
    const int tid = threadIdx.x;
    const int tr = tid / 16, tc = tid % 16;  // rows tr*4.., cols tc + 16*j
    const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTn;
    const int64_t total = *g.count;
    for (int64_t m0 = g.first + static_cast<int64_t>(blockIdx.y) * kTm; m0 < total; m0 += static_cast<int64_t>(gridDim.y) * kTm) {
        __syncthreads();
        if (tid < kTm) srow[tid] = m0 + tid < total ? g.rows[m0 + tid] : -1;
        __syncthreads();
        float acc[4][8] = {};
        for (int64_t k0 = 0; k0 < g.k; k0 += kTk) {
            for (int e = tid; e < kTm * kTk; e += 256) {
                const int r = e / kTk, kk = e % kTk;
                const int64_t row = srow[r];
                sa[kk][r] = row >= 0 && k0 + kk < g.k ? a_elem(g, row, k0 + kk) : 0.0f;
            }
            for (int e = tid; e < kTn * kTk; e += 256) {
                const int r = e / kTk, kk = e % kTk;
                sb[kk][r] = n0 + r < g.n && k0 + kk < g.k ? load_elem(g.b, (n0 + r) * g.ldb + k0 + kk) : 0.0f;
            }
            __syncthreads();
            for (int kk = 0; kk < kTk; ++kk) {
                float av[4], bv[8];
                for (int i = 0; i < 4; ++i) av[i] = sa[kk][tr * 4 + i];
                for (int j = 0; j < 8; ++j) bv[j] = sb[kk][tc + 16 * j];
                for (int i = 0; i < 4; ++i)
                    for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
            }
            __syncthreads();
        }
        for (int i = 0; i < 4; ++i) {
            const int64_t row = srow[tr * 4 + i];
            if (row < 0) continue;
            for (int j = 0; j < 8; ++j) gather_epilogue<T, TA, EPI>(g, row, n0 + tc + 16 * j, acc[i][j]);
        }
    }
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

/// The l1 of the rows on the dense path (one warp per row), then, in the last block to finish,
/// the statistics reduced in a fixed order.
constexpr int kFinalThreads = 512;
template <class T>
__global__ void __launch_bounds__(kFinalThreads) finalize(const void *gate, int64_t ldg, int64_t h, bool f32,
                                                          bool relu, const int32_t *rows, const uint32_t *count_dense,
                                                          bool dense_l1, int64_t first, int64_t m, const int32_t *row_nnz,
                                                          const int32_t *count, float *row_l1, uint32_t *ticket,
                                                          FfnDeviceStats *out) {
    const int lane = threadIdx.x & 31;
    if (dense_l1) {
        const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
        for (int64_t i = first + static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
             i < *count_dense; i += warps) {
            const int64_t r = rows[i];
            float s = 0.0f;
            for (int64_t c = lane; c < h; c += 32) {
                const float v = gate_value<T>(gate, r * ldg + c, f32);
                if (!relu || relu_active(v)) s += fabsf(v);
            }
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(kFull, s, o);
            if (lane == 0) row_l1[r] = s;
        }
    }
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(ticket, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const int64_t per = (m + kFinalThreads - 1) / kFinalThreads;
    const int64_t lo = min(m, threadIdx.x * per), hi = min(m, lo + per);
    long long nnz = 0, mx = 0, over = 0, dense = 0;
    double l1 = 0.0;
    for (int64_t r = lo; r < hi; ++r) {
        nnz += row_nnz[r];
        mx = max(mx, static_cast<long long>(row_nnz[r]));
        over += count[r] == -1;
        dense += count[r] < 0;
        l1 += static_cast<volatile const float *>(row_l1)[r];
    }
    using ReduceL = cub::BlockReduce<long long, kFinalThreads>;
    using ReduceD = cub::BlockReduce<double, kFinalThreads>;
    __shared__ union {
        typename ReduceL::TempStorage l;
        typename ReduceD::TempStorage d;
    } temp;
    const long long tn = ReduceL(temp.l).Sum(nnz);
    __syncthreads();
    const long long tm = ReduceL(temp.l).Reduce(mx, MaxOp{});
    __syncthreads();
    const long long to = ReduceL(temp.l).Sum(over);
    __syncthreads();
    const long long td = ReduceL(temp.l).Sum(dense);
    __syncthreads();
    const double tl = ReduceD(temp.d).Sum(l1);
    if (threadIdx.x == 0) *out = FfnDeviceStats{m, tn, tm, to, td, tl};
}

// ---- the dense path through cuBLAS: the first `cap` rows of the dense list are compacted,
// multiplied by cuBLAS GEMMs of cap rows, and scattered back (cap comes from the statistics of
// an earlier forward; rows past it go through the gathered kernels, so nothing depends on it
// being large enough)

template <class T> __global__ void gather_rows(const T *x, int64_t x_rs, int64_t x_cs, int64_t d, const int32_t *rows,
                                               const uint32_t *count, int64_t cap, T *xc, int64_t ldc) {
    const int64_t n = min(static_cast<int64_t>(*count), cap);
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const int64_t r = rows[i];
        for (int64_t k = threadIdx.x; k < d; k += blockDim.x) xc[i * ldc + k] = x[r * x_rs + k * x_cs];
    }
}

/// hc[i] = h of dense row rows[i] from its gate row and uc[i] (= X Wu^T, gated), written over
/// uc[i]; also each row's l1 and, for the hidden output, h back into the gate buffer. A block per
/// row: with a warp per row the 5632-value rows took 144 us for 320 rows (ncu: load latency).
template <class T> __global__ void __launch_bounds__(256) compact_hidden(T *gate, int64_t ldg, T *uc, int64_t h,
                                                                         bool gated, const int32_t *rows,
                                                                         const uint32_t *count, int64_t cap,
                                                                         bool write_back, float *row_l1) {
    __shared__ float warp_l1[8];
    const int64_t n = min(static_cast<int64_t>(*count), cap);
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const int64_t r = rows[i];
        float l1 = 0.0f;
        for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
            const float g = load_elem(gate, r * ldg + c);
            float hv = 0.0f;
            if (relu_active(g)) hv = gated ? round_to<T>(g * load_elem(uc, i * ldg + c)) : g;
            store_elem(uc, i * ldg + c, hv);
            if (write_back) store_elem(gate, r * ldg + c, hv);
            l1 += fabsf(hv);
        }
        for (int o = 16; o > 0; o >>= 1) l1 += __shfl_xor_sync(kFull, l1, o);
        if ((threadIdx.x & 31) == 0) warp_l1[threadIdx.x / 32] = l1;
        __syncthreads();
        if (threadIdx.x == 0) {
            float sum = 0.0f;
            for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) sum += warp_l1[w];
            row_l1[r] = sum;
        }
        __syncthreads();
    }
}

template <class T> __global__ void scatter_rows(const T *yc, int64_t ldc, int64_t d, const int32_t *rows,
                                                const uint32_t *count, int64_t cap, T *y, int64_t y_rs, int64_t y_cs) {
    const int64_t n = min(static_cast<int64_t>(*count), cap);
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const int64_t r = rows[i];
        for (int64_t k = threadIdx.x; k < d; k += blockDim.x) y[r * y_rs + k * y_cs] = yc[i * ldc + k];
    }
}

// ---- weight repacking (setup)

__global__ void repack(MatrixArg in, bool transpose, void *out, int64_t ldo, int64_t out_rows, int64_t out_cols,
                       int elem) {
    const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const int64_t r = blockIdx.y;
    if (c >= out_cols) return;
    // out (r, c) = in(r, c), or in(c, r) when transposed; zero in the padding
    const int64_t ir = transpose ? c : r, ic = transpose ? r : c;
    uint32_t v = 0;
    if (ir < in.rows && ic < in.cols) {
        const int64_t i = ir * in.rs + ic * in.cs;
        v = elem == 4 ? static_cast<const uint32_t *>(in.ptr)[i] : static_cast<const uint16_t *>(in.ptr)[i];
    }
    if (elem == 4)
        static_cast<uint32_t *>(out)[r * ldo + c] = v;
    else
        static_cast<uint16_t *>(out)[r * ldo + c] = static_cast<uint16_t>(v);
    (void)out_rows;
}

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

// ---- launch helpers

template <class T, int V> void launch_sparse_v(cudaStream_t stream, const SparseArgs<T> &a, int warps) {
    const int threads = 32 * warps;
    const size_t smem = kStages * sparse_stage_bytes<T>(a.dp, a.gated, threads);
    if (smem > 48 * 1024)
        check(cudaFuncSetAttribute(sparse_ffn<T, V>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
              "cudaFuncSetAttribute");
    const dim3 grid(static_cast<unsigned>(a.m), static_cast<unsigned>(a.splits));
    sparse_ffn<T, V><<<grid, threads, smem, stream>>>(a);
    check_launch("sparse_ffn");
}

// A warp covers up to 4 chunks of 16 bytes per lane (1024 bf16 values): wider rows take a team
// of up to 8 warps, which keeps registers near 100 and occupancy up (the kernel is bound by
// instruction latency, not bandwidth: ncu at D = 2048 with one warp of 177 registers showed 7
// warps per SM, stalls on dependent instructions).
constexpr int kWarpChunks = 4, kMaxTeamWarps = 8;

template <class T> void launch_sparse(cudaStream_t stream, const SparseArgs<T> &a) {
    constexpr int E = Chunk<T>::n;
    const int64_t per_warp_max = kWarpChunks * 32 * E;
    const int warps = std::max(1, ceil_div(a.dp, per_warp_max));  // dp <= ffn_max_model_dim (twCreateFfn)
    const int v_needed = ceil_div(a.dp, static_cast<int64_t>(warps) * 32 * E);
    if (v_needed <= 1)
        launch_sparse_v<T, 1>(stream, a, warps);
    else if (v_needed <= 2)
        launch_sparse_v<T, 2>(stream, a, warps);
    else if (v_needed <= 4)
        launch_sparse_v<T, 4>(stream, a, warps);
    else
        launch_sparse_v<T, 8>(stream, a, warps);
}

template <class T, class TA, Epilogue EPI>
void launch_gathered(cudaStream_t stream, const GatherArgs<T, TA> &g, int64_t max_rows, bool tensor_cores) {
    if (max_rows == 0 || g.n == 0) return;
    const int sms = sm_count();
    const int tiles_n = ceil_div(g.n, kTn);
    const int row_blocks = ceil_div(max_rows, kTm);
    const int grid_y = std::max(1, std::min(row_blocks, std::max(1, 4 * sms / tiles_n)));
    const dim3 grid(static_cast<unsigned>(tiles_n), static_cast<unsigned>(grid_y));
    if constexpr (std::is_same_v<T, TA> && !std::is_same_v<T, float>) {
        if (tensor_cores) {
            gathered_gemm_tc<T, EPI><<<grid, 256, 0, stream>>>(g);
            check_launch("gathered_gemm_tc");
            return;
        }
    }
    gathered_gemm_f32<T, TA, EPI><<<grid, 256, 0, stream>>>(g);
    check_launch("gathered_gemm_f32");
}

bool gate_is_f32(const FfnProblem &p) { return p.type == TW_R_32F || p.highest; }

template <class T>
void pack(cudaStream_t stream, const FfnProblem &p, const FfnScratch &s, unsigned long long *neuron_counts,
          bool zero_inactive, bool dense_mode) {
    check(cudaMemsetAsync(s.header, 0, 2 * sizeof(uint32_t), stream), "cudaMemsetAsync");
    PackArgs<T> pk{s.gate, s.ldg, p.m, p.h, gate_is_f32(p), zero_inactive, p.tile, p.slots, s.cap,
                   s.idx, s.count, s.row_nnz, s.dense_rows, s.dense_count, neuron_counts, s.row_limit,
                   dense_mode && p.gated ? static_cast<const T *>(s.up) : nullptr, dense_mode, s.row_l1};
    pack_rows<T><<<static_cast<unsigned>(ceil_div(p.m, 4)), 128, 0, stream>>>(pk);
    check_launch("pack_rows");
}

template <class T>
void sparse_rows(cudaStream_t stream, const FfnProblem &p, const FfnWeights &w, const MatrixArg &x, const MatrixArg &y,
                 const FfnScratch &s, bool write_h, int64_t first, bool fused_rows) {
    const bool gate_f32 = gate_is_f32(p);
    const size_t eb = elem_bytes(p.type);
    auto aligned = [&](const MatrixArg &mat) {
        return mat.cs == 1 && (mat.rs * static_cast<int64_t>(eb)) % 16 == 0 &&
               reinterpret_cast<uintptr_t>(mat.ptr) % 16 == 0 && p.d % 8 == 0;
    };
    SparseArgs<T> sp{static_cast<const T *>(x.ptr), x.rs, x.cs, aligned(x), static_cast<T *>(y.ptr), y.rs, y.cs,
                     aligned(y), static_cast<const T *>(w.pair), w.pair_stride, p.dp, p.d, p.m, s.gate, s.ldg,
                     gate_f32, p.gated, p.highest, write_h, s.idx, s.cap, s.count, s.row_l1, s.splits, s.partial};
    if (fused_rows) launch_sparse<T>(stream, sp);
    if (fused_rows && s.splits > 1) {
        reduce_splits<T><<<std::max(1, std::min(1024, ceil_div(p.m * p.d, 256))), 256, 0, stream>>>(
            s.partial, s.splits, p.m, p.d, p.dp, s.count, static_cast<T *>(y.ptr), y.rs, y.cs, s.row_l1);
        check_launch("reduce_splits");
    }

    // dense path: the row count lives on the device; grids are sized for all M rows and idle
    // blocks leave at once
    const bool tc = !gate_f32;
    if (p.gated) {
        GatherArgs<T, T> up{static_cast<const T *>(x.ptr), x.rs, x.cs, false, static_cast<const T *>(w.pair),
                            w.pair_stride, p.h, p.d, s.dense_rows, s.dense_count, s.gate, s.ldg, gate_f32,
                            p.highest, nullptr, 0, 0, first};
        launch_gathered<T, T, Epilogue::UpGated>(stream, up, p.m, tc);
    }
    if (gate_f32) {
        GatherArgs<T, float> down{static_cast<const float *>(s.gate), s.ldg, 1, !p.gated,
                                  static_cast<const T *>(w.down_t), p.hp, p.d, p.h, s.dense_rows, s.dense_count,
                                  nullptr, 0, gate_f32, p.highest, static_cast<T *>(y.ptr), y.rs, y.cs, first};
        launch_gathered<T, float, Epilogue::Down>(stream, down, p.m, false);
    } else {
        GatherArgs<T, T> down{static_cast<const T *>(s.gate), s.ldg, 1, !p.gated, static_cast<const T *>(w.down_t),
                              p.hp, p.d, p.h, s.dense_rows, s.dense_count, nullptr, 0, gate_f32, p.highest,
                              static_cast<T *>(y.ptr), y.rs, y.cs, first};
        launch_gathered<T, T, Epilogue::Down>(stream, down, p.m, tc);
    }
}

template <class T>
void finish(cudaStream_t stream, const FfnProblem &p, const FfnScratch &s, bool dense_mode, int64_t first,
            FfnDeviceStats *stats, const twSpMatDescr *hidden) {
    const bool gate_f32 = gate_is_f32(p);
    const unsigned blocks = static_cast<unsigned>(std::max(1, std::min(264, ceil_div(p.m, kFinalThreads / 32))));
    finalize<T><<<blocks, kFinalThreads, 0, stream>>>(s.gate, s.ldg, p.h, gate_f32, !p.gated, s.dense_rows,
                                                      s.dense_count, !dense_mode, first, p.m, s.row_nnz, s.count, s.row_l1,
                                                      s.header + 1, stats);
    check_launch("finalize");
    if (hidden) {
        // the gate buffer now holds h (inactive units zeroed); PLAIN keeps every stored
        // pattern but +0, as the reference does
        const MatrixArg h{s.gate, p.m, p.h, s.ldg, 1, gate_f32 ? TW_R_32F : p.type};
        write_sparse(stream, h, TW_CONVERT_PLAIN, *hidden, s.writer_flags);
    }
}

template <class F> void by_type(twDataType_t t, F &&f) {
    switch (t) {
        case TW_R_16BF: f(__nv_bfloat16{}); break;
        case TW_R_16F: f(__half{}); break;
        default: f(float{}); break;
    }
}

}  // namespace

bool ffn_decode_applies(const FfnProblem &p) {
    // measured on an H100 at D = 2048, H = 5632: 29 us at M = 1 and 53 us at M = 8 (its gate dot
    // products run on CUDA cores, ~3.4 us per token) against ~44 us flat for the cuBLAS path:
    // the one-kernel path wins up to about 4 tokens
    return p.m >= 1 && p.m <= 4 && !gate_is_f32(p) && p.dp <= 4096;
}

void ffn_decode(cudaStream_t stream, const FfnProblem &p, const FfnWeights &w, const MatrixArg &x, const MatrixArg &y,
                const FfnScratch &s, unsigned long long *neuron_counts, bool write_h) {
    const int blocks = ceil_div(p.h, kDecodeWarps);
    const int nt = ceil_div(p.h, p.tile);
    check(cudaMemsetAsync(s.header, 0, 2 * sizeof(uint32_t), stream), "cudaMemsetAsync");
    check(cudaMemsetAsync(s.dec_zero, 0, static_cast<size_t>(p.m * (2 + nt)) * 4, stream), "cudaMemsetAsync");
    by_type(p.type, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (!std::is_same_v<T, float>) {
            const bool x_vec = x.cs == 1 && (x.rs * 2) % 16 == 0 && reinterpret_cast<uintptr_t>(x.ptr) % 16 == 0 &&
                               p.d % 8 == 0;
            DecodeArgs<T> a{static_cast<const T *>(x.ptr), x.rs, x.cs, x_vec, static_cast<int>(p.m), p.d, p.dp, p.h,
                            static_cast<const T *>(w.gate), static_cast<const T *>(w.pair), w.pair_stride, p.gated,
                            p.highest, false, write_h, s.gate, s.ldg, p.tile, nt, s.dec_zero, s.dec_zero + 2 * p.m,
                            s.dec_zero + p.m, s.dec_list, blocks, s.dec_partial,
                            s.dec_partial + static_cast<int64_t>(blocks) * p.m * p.dp, neuron_counts};
            const size_t xs_bytes = static_cast<size_t>(p.m * p.dp) * sizeof(T);
            auto launch = [&](auto kernel) {
                if (xs_bytes > 48 * 1024)
                    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(xs_bytes)),
                          "cudaFuncSetAttribute");
                kernel<<<blocks, 32 * kDecodeWarps, xs_bytes, stream>>>(a);
                check_launch("decode_ffn");
            };
            // rows of up to 2048 values need 8 chunks per lane (64 registers), wider ones 16
            if (p.dp <= 2048)
                launch(decode_ffn<T, 8>);
            else
                launch(decode_ffn<T, 16>);
            const dim3 rgrid(static_cast<unsigned>(p.m), static_cast<unsigned>(ceil_div(p.d, 256)));
            decode_reduce<T><<<rgrid, 256, static_cast<size_t>(a.nblk) * 4, stream>>>(
                a, static_cast<T *>(y.ptr), y.rs, y.cs, p.slots, s.count, s.row_nnz, s.row_l1);
            check_launch("decode_reduce");
        }
    });
}

int64_t ffn_max_model_dim(twDataType_t type) {
    return int64_t{kMaxTeamWarps} * kWarpChunks * 32 * (16 / static_cast<int64_t>(elem_bytes(type)));
}

int32_t ffn_list_width(const FfnProblem &p) {
    // a row that fits every TwELL tile has at most tiles x slots active units
    const int64_t tiles = (p.h + p.tile - 1) / p.tile;
    return static_cast<int32_t>(std::min<int64_t>(tiles * p.slots, p.h));
}

int ffn_splits(int64_t m) {
    // small M: deal each token's units to several teams so that the GPU has enough loads in
    // flight; the split count depends on M alone, so results stay reproducible
    if (m <= 0) return 1;
    return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(32, 512 / m)));
}

FfnScratch carve_ffn_scratch(void *workspace, const FfnProblem &p, size_t *bytes) {
    WorkspaceCarver c(workspace);
    FfnScratch s{};
    s.lt_bytes = GemmRunner::kWorkspaceBytes;
    s.lt_workspace = c.take<char>(s.lt_bytes);
    const bool gate_f32 = gate_is_f32(p);
    s.ldg = p.hp;
    s.gate = c.take<char>(static_cast<size_t>(p.m * p.hp) * (gate_f32 ? 4 : 2));
    // dense mode's U (the up projection of every row): 16-bit types in DEFAULT mode only
    s.up = gate_f32 ? nullptr : c.take<char>(static_cast<size_t>(p.m * p.hp) * 2);
    // the cuBLAS dense path's compacted X rows, then its Y rows
    s.xc = gate_f32 ? nullptr : c.take<char>(static_cast<size_t>(p.m * p.dp) * 2);
    s.cap = ffn_list_width(p);
    s.idx = c.take<uint16_t>(static_cast<size_t>(p.m * s.cap));
    // per-row break-even of gathers (8 KB per unit for D = 2048) against a GEMM row (4 D H
    // flops): about H / 32 units; never below what the TwELL tiles hold on average
    s.row_limit = static_cast<int32_t>(std::max<int64_t>(p.h / 32, 64));
    s.count = c.take<int32_t>(static_cast<size_t>(p.m));
    s.row_nnz = c.take<int32_t>(static_cast<size_t>(p.m));
    s.row_l1 = c.take<float>(static_cast<size_t>(p.m));
    s.header = c.take<uint32_t>(2);
    s.dense_count = s.header;
    s.dense_rows = c.take<int32_t>(static_cast<size_t>(p.m));
    s.writer_flags = c.take<int32_t>(static_cast<size_t>(p.m) + 64);
    if (ffn_decode_applies(p)) {
        const int64_t nblk = (p.h + kDecodeWarps - 1) / kDecodeWarps;
        const int64_t nt = (p.h + p.tile - 1) / p.tile;
        s.dec_zero = c.take<int32_t>(static_cast<size_t>(p.m * (2 + nt)));  // row_nnz, list_count, tile counts
        s.dec_list = c.take<int32_t>(static_cast<size_t>(p.m * nblk));
        s.dec_partial = c.take<float>(static_cast<size_t>(nblk * p.m * (p.dp + 1)));
    }
    s.splits = ffn_splits(p.m);
    s.partial = s.splits > 1 ? c.take<float>(static_cast<size_t>(s.splits * p.m * (p.dp + 1))) : nullptr;
    if (bytes) *bytes = c.used();
    return s;
}

void repack_weights(cudaStream_t stream, const FfnProblem &p, const MatrixArg *wg, const MatrixArg &wu,
                    const MatrixArg &wd, void *gate, void *pair, void *down_t) {
    const int64_t eb = static_cast<int64_t>(elem_bytes(p.type));
    launch_repack(stream, p.gated ? *wg : wu, false, gate, p.dp, p.h, p.dp);
    if (p.gated) {
        // pair row j = [Wu_j | Wd_j]: two strided copies into the halves
        launch_repack(stream, wu, false, pair, 2 * p.dp, p.h, p.dp);
        launch_repack(stream, wd, false, static_cast<char *>(pair) + p.dp * eb, 2 * p.dp, p.h, p.dp);
    } else {
        launch_repack(stream, wd, false, pair, p.dp, p.h, p.dp);
    }
    launch_repack(stream, wd, true, down_t, p.hp, p.d, p.hp);
}

void ffn_pack(cudaStream_t stream, const FfnProblem &p, const FfnScratch &s, unsigned long long *neuron_counts,
              bool zero_inactive, bool dense_mode) {
    by_type(p.type, [&](auto t) { pack<decltype(t)>(stream, p, s, neuron_counts, zero_inactive, dense_mode); });
}

void ffn_count_dense(cudaStream_t stream, const FfnProblem &p, const FfnScratch &s, unsigned long long *neuron_counts) {
    if (p.m == 0) return;
    by_type(p.type, [&](auto t) {
        using T = decltype(t);
        if constexpr (!std::is_same_v<T, float>) {
            const dim3 grid(static_cast<unsigned>(ceil_div(s.ldg, 256 * 8)), static_cast<unsigned>(ceil_div(p.m, kCountRows)));
            count_active_columns<T><<<grid, 256, 0, stream>>>(static_cast<const T *>(s.gate), s.ldg, p.m, p.h, neuron_counts);
            check_launch("count_active_columns");
        }
    });
}

void ffn_sparse(cudaStream_t stream, const FfnProblem &p, const FfnWeights &w, const MatrixArg &x, const MatrixArg &y,
                const FfnScratch &s, bool write_h, int64_t first, bool sparse_rows_too) {
    by_type(p.type, [&](auto t) { sparse_rows<decltype(t)>(stream, p, w, x, y, s, write_h, first, sparse_rows_too); });
}

void ffn_finish(cudaStream_t stream, const FfnProblem &p, const FfnScratch &s, bool dense_mode, int64_t first,
                FfnDeviceStats *stats, const twSpMatDescr *hidden) {
    by_type(p.type, [&](auto t) { finish<decltype(t)>(stream, p, s, dense_mode, first, stats, hidden); });
}

void ffn_dense_gather(cudaStream_t stream, const FfnProblem &p, const MatrixArg &x, const FfnScratch &s, int64_t cap) {
    by_type(p.type, [&](auto t) {
        using T = decltype(t);
        gather_rows<T><<<static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(cap, 1024))), 256, 0, stream>>>(
            static_cast<const T *>(x.ptr), x.rs, x.cs, p.d, s.dense_rows, s.dense_count, cap, static_cast<T *>(s.xc), p.dp);
        check_launch("gather_rows");
    });
}

void ffn_dense_rows_hidden(cudaStream_t stream, const FfnProblem &p, const FfnScratch &s, int64_t cap, bool write_back) {
    by_type(p.type, [&](auto t) {
        using T = decltype(t);
        if constexpr (!std::is_same_v<T, float>) {
            compact_hidden<T><<<static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(cap, 4096))), 256, 0,
                                stream>>>(static_cast<T *>(s.gate), s.ldg, static_cast<T *>(s.up), p.h, p.gated,
                                                  s.dense_rows, s.dense_count, cap, write_back, s.row_l1);
            check_launch("compact_hidden");
        }
    });
}

void ffn_dense_scatter(cudaStream_t stream, const FfnProblem &p, const MatrixArg &y, const FfnScratch &s, int64_t cap) {
    by_type(p.type, [&](auto t) {
        using T = decltype(t);
        scatter_rows<T><<<static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(cap, 1024))), 256, 0, stream>>>(
            static_cast<const T *>(s.xc), p.dp, p.d, s.dense_rows, s.dense_count, cap, static_cast<T *>(y.ptr), y.rs, y.cs);
        check_launch("scatter_rows");
    });
}

}  // namespace twblas::cuda
