// The backward's transpose (slots keyed by unit for a stable radix sort) and unit phase: a block
// per (unit, column slice) sums dz X_t, du X_t and h dY_t over the unit's tokens in ascending
// token order and writes each weight-gradient row once.
#pragma once

#include <cooperative_groups.h>

#include "common/values.cuh"

namespace twblas::cuda {

// ---- transpose: (token, unit) slots sorted by unit

/// Key of each slot: its unit id, or H for an empty slot and the slots of recomputed rows. Also
/// zeroes the hot-unit count that unit_starts adds to.
__global__ void slot_keys(const uint16_t *idx, const int32_t *count, int64_t m, int ell, int64_t h, uint32_t *keys,
                          int32_t *slots, uint32_t *hot_count) {
    if (blockIdx.x == 0 && threadIdx.x == 0) *hot_count = 0;
    const int64_t total = m * ell;
    for (int64_t s = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; s < total;
         s += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t row = s / ell, i = s % ell;
        const int n = count[row];
        uint32_t key = static_cast<uint32_t>(h);
        if (n >= 0 && i < n && idx[s] < h) key = idx[s];
        keys[s] = key;
        slots[s] = static_cast<int32_t>(s);
    }
}

/// The dense list (filled by atomics in the forward, so in no fixed order) as sort keys: row
/// ids, and M past the count. Sorted, the weight-gradient sums run in ascending row order.
__global__ void dense_row_keys(const int32_t *rows, const uint32_t *count, int64_t m, int32_t *keys) {
    const int64_t n = min(static_cast<int64_t>(*count), m);
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < m;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        keys[i] = i < n ? min(max(rows[i], 0), static_cast<int32_t>(m - 1)) : static_cast<int32_t>(m);
}

/// start[u] = first sorted position whose key is >= u, for u in [0, H]: unit j's slots are
/// [start[j], start[j + 1]). With `hot_units`, the units with more than `hot_tokens` slots are
/// listed there too, in no fixed order (a unit's sums do not depend on its place in the list).
__global__ void unit_starts(const uint32_t *keys, int64_t total, int64_t h, int32_t *start, int64_t hot_tokens,
                            int32_t *hot_units, uint32_t *hot_count) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    if (total == 0) {
        for (int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u <= h; u += stride) start[u] = 0;
        return;
    }
    for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < total; p += stride) {
        const int64_t k = keys[p], prev = p ? static_cast<int64_t>(keys[p - 1]) : -1;
        for (int64_t u = prev + 1; u <= k && u <= h; ++u) start[u] = static_cast<int32_t>(p);
        // the first slot of unit k, which has more than hot_tokens slots when slot p + hot_tokens is k's
        if (hot_units && k != prev && k < h && p + hot_tokens < total && keys[p + hot_tokens] == k)
            hot_units[atomicAdd(hot_count, 1u)] = static_cast<int32_t>(k);
        if (p == total - 1)
            for (int64_t u = k + 1; u <= h; ++u) start[u] = static_cast<int32_t>(total);
    }
}

// ---- unit phase: a block per (unit, column chunk); the unit's tokens staged in shared memory

template <class T> struct UnitArgs {
    const T *x;
    int64_t x_rs, x_cs;
    bool x_vec;
    const T *dy;
    int64_t dy_rs, dy_cs;
    bool dy_vec;
    const int32_t *start, *slots;
    int ell;
    const void *sg, *su, *dz, *du;
    bool gate_f32, gated, highest;
    // backward_units leaves the units with more than hot_tokens slots to backward_hot_units,
    // which takes them from the list
    int64_t hot_tokens;
    const int32_t *hot_units;
    const uint32_t *hot_count;
    const float *dw_dense;  // [3][H][dp]: the recomputed rows' terms, when *dense_count > 0
    const uint32_t *dense_count;
    int64_t dp, d, h;
    T *out_z;  // dz X: dWg (gated) or dWu (plain)
    int64_t z_rs, z_cs;
    bool z_vec;
    T *out_u;  // du X: dWu (gated only)
    int64_t u_rs, u_cs;
    bool u_vec;
    T *out_d;  // h dY: dWd
    int64_t d_rs, d_cs;
    bool d_vec;
};

// A block covers 512 columns (64 threads of 8 bf16) of one unit, and the grid runs column slice
// by column slice (blockIdx.x = unit is the fast index): while one slice is in flight, the X and
// dY columns it gathers (2 x 16 MB at M = 16384, D = 2048) stay in L2. With whole rows per block
// the gathers of X and dY rows (4 KB each, 3.9 GB at the paper's shape) came from HBM: ncu put
// this kernel at 1.11 ms, about HBM speed.
// G token groups (G x 64 threads): each staged batch is cut into G contiguous ranges, one per
// group, and the groups' sums are added in group order at the end (deterministic). The loop is
// bound by load latency, so a unit active on most tokens (a long serial sum) finishes G times
// sooner; G = 1 is one group, no reduction. Every unit with G > 1 cost 4-16 % of the training
// step on an H100 (fewer blocks an SM), so only the hot units take the groups
// (unit_hot_tokens in ffn_backward.cu).
// A batch stages 64 entries a group, up to 4 groups (a hot unit's 8192 tokens in 32 batches of
// two dependent loads and two barriers each, not 128).
constexpr int kUnitThreads = 64, kUnitBatch = 64;
// 16-byte loads of X and dY rows in flight a lane: 2 x 4 entries, and for the hot units' groups
// (one 512-thread block an SM, 89 registers) 2 x 8. On an H100, 8 units on every token (bench
// uniform-6+hot-8, same call): 64-entry batches 715 us a step, 256-entry batches 566, and 8
// entries in flight 553
constexpr int kHotUnitAhead = 8;

/// Unit j's three weight-gradient chunks (this block's column slice). Every thread of the block
/// calls it with the same j (its barriers are the block's). With N > 1 the block is rank r of a
/// cluster of N that all call it with j: it sums the r-th of N contiguous shares of the unit's
/// slots, and rank 0 adds the ranks' sums in rank order (distributed shared memory) and writes.
template <class T, int G, int N = 1>
__device__ void unit_gradients(const UnitArgs<T> &a, int64_t j) {
    static_assert(N == 1 || G > 1, "a cluster's sums pass through the groups' shared memory");
    // up to 4 groups' entries a batch: at G = 8, 256 entries (5 KB) and the groups' sums (42 KB)
    // stay under the 48 KB of static shared memory
    constexpr int E = Chunk<T>::n, B = kUnitBatch * (G < 4 ? G : 4);
    __shared__ int64_t s_tok[B];
    __shared__ float s_z[B], s_u[B], s_h[B];
    const int lane = static_cast<int>(threadIdx.x) % kUnitThreads, group = static_cast<int>(threadIdx.x) / kUnitThreads;
    const int64_t k0 = (static_cast<int64_t>(blockIdx.y) * kUnitThreads + lane) * E;
    float az[E], au[E], ad[E];
#pragma unroll
    for (int e = 0; e < E; ++e) az[e] = au[e] = ad[e] = 0.0f;
    int32_t p0 = a.start[j], p1 = a.start[j + 1];
    [[maybe_unused]] int rank = 0;
    if constexpr (N > 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        rank = static_cast<int>(cooperative_groups::this_cluster().block_rank());
#endif
        const int32_t share = (p1 - p0 + N - 1) / N;
        p0 = min(p1, p0 + rank * share);
        p1 = min(p1, p0 + share);
    }
    for (int32_t b = p0; b < p1; b += B) {
        const int nb = min(B, p1 - b);
        __syncthreads();
        if (threadIdx.x < nb) {
            const int64_t slot = a.slots[b + threadIdx.x];
            s_tok[threadIdx.x] = slot / a.ell;
            const float g = gate_value<T>(a.sg, slot, a.gate_f32);
            s_z[threadIdx.x] = gate_value<T>(a.dz, slot, a.gate_f32);
            if (a.gated) {
                const float u = gate_value<T>(a.su, slot, a.gate_f32);
                s_u[threadIdx.x] = gate_value<T>(a.du, slot, a.gate_f32);
                s_h[threadIdx.x] = a.highest ? g * u : round_to<T>(g * u);
            } else {
                s_h[threadIdx.x] = g;
            }
        }
        __syncthreads();
        if (k0 >= a.dp) continue;
        // this group's entries of the batch: [e, e_end)
        const int per = (nb + G - 1) / G;
        int e = min(nb, group * per);
        const int e_end = min(nb, e + per);
        if (a.x_vec && a.dy_vec && k0 + E <= a.d) {
            // kG entries at a time: their 2 kG 16-byte loads are issued before any is used
            // (the kernel is bound by load latency, not bandwidth)
            constexpr int kG = G > 1 ? kHotUnitAhead : 4;
            for (; e + kG <= e_end; e += kG) {
                uint4 xq[kG], yq[kG];
#pragma unroll
                for (int g = 0; g < kG; ++g) {
                    const int64_t tok = s_tok[e + g];
                    xq[g] = *reinterpret_cast<const uint4 *>(a.x + tok * a.x_rs + k0);
                    yq[g] = *reinterpret_cast<const uint4 *>(a.dy + tok * a.dy_rs + k0);
                }
#pragma unroll
                for (int g = 0; g < kG; ++g) {
                    const float cz = s_z[e + g], ch = s_h[e + g], cu = a.gated ? s_u[e + g] : 0.0f;
#pragma unroll
                    for (int q = 0; q < E; ++q) {
                        const float xv = Chunk<T>::get(xq[g], q);
                        az[q] = fmaf(cz, xv, az[q]);
                        au[q] = fmaf(cu, xv, au[q]);
                        ad[q] = fmaf(ch, Chunk<T>::get(yq[g], q), ad[q]);
                    }
                }
            }
        }
        for (; e < e_end; ++e) {
            const int64_t tok = s_tok[e];
            float xv[E], yv[E];
            load_chunk(a.x, tok, a.x_rs, a.x_cs, a.x_vec, k0, a.d, xv);
            load_chunk(a.dy, tok, a.dy_rs, a.dy_cs, a.dy_vec, k0, a.d, yv);
            const float cz = s_z[e], ch = s_h[e];
#pragma unroll
            for (int q = 0; q < E; ++q) {
                az[q] = fmaf(cz, xv[q], az[q]);
                ad[q] = fmaf(ch, yv[q], ad[q]);
            }
            if (a.gated) {
                const float cu = s_u[e];
#pragma unroll
                for (int q = 0; q < E; ++q) au[q] = fmaf(cu, xv[q], au[q]);
            }
        }
    }
    if constexpr (G > 1) {
        // the groups' sums, added in group order by group 0
        __shared__ float s_red[G - 1][3][kUnitThreads * E];
        __syncthreads();
        if (group > 0) {
#pragma unroll
            for (int q = 0; q < E; ++q) {
                s_red[group - 1][0][lane * E + q] = az[q];
                s_red[group - 1][1][lane * E + q] = au[q];
                s_red[group - 1][2][lane * E + q] = ad[q];
            }
        }
        __syncthreads();
        if (group == 0) {
            for (int g = 0; g < G - 1; ++g) {
#pragma unroll
                for (int q = 0; q < E; ++q) {
                    az[q] += s_red[g][0][lane * E + q];
                    au[q] += s_red[g][1][lane * E + q];
                    ad[q] += s_red[g][2][lane * E + q];
                }
            }
        }
        if constexpr (N > 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            // the block's sums where group 1's were (each lane reads and writes only its own
            // columns), then rank 0 adds ranks 1 .. N-1 in order; every thread of every block
            // takes both cluster barriers, the second keeping the ranks' memory until it is read
            cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
            if (group == 0 && rank > 0) {
#pragma unroll
                for (int q = 0; q < E; ++q) {
                    s_red[0][0][lane * E + q] = az[q];
                    s_red[0][1][lane * E + q] = au[q];
                    s_red[0][2][lane * E + q] = ad[q];
                }
            }
            cluster.sync();
            if (group == 0 && rank == 0) {
                for (int r = 1; r < N; ++r) {
                    float(*peer)[3][kUnitThreads * E] = cluster.map_shared_rank(s_red, r);
#pragma unroll
                    for (int q = 0; q < E; ++q) {
                        az[q] += peer[0][0][lane * E + q];
                        au[q] += peer[0][1][lane * E + q];
                        ad[q] += peer[0][2][lane * E + q];
                    }
                }
            }
            cluster.sync();
#else
            __trap();  // clusters run only where compute_90+ code does (the launch checks)
#endif
        }
        if (group > 0 || rank > 0) return;
    }
    if (k0 >= a.d) return;
    if (*a.dense_count > 0) {
        const int64_t plane = a.h * a.dp;
#pragma unroll
        for (int q = 0; q < E; ++q) {
            if (k0 + q >= a.dp) break;
            const int64_t at = j * a.dp + k0 + q;
            az[q] += a.dw_dense[at];
            au[q] += a.dw_dense[plane + at];
            ad[q] += a.dw_dense[2 * plane + at];
        }
    }
    store_chunk(a.out_z, j, a.z_rs, a.z_cs, a.z_vec, k0, a.d, az);
    if (a.gated) store_chunk(a.out_u, j, a.u_rs, a.u_cs, a.u_vec, k0, a.d, au);
    store_chunk(a.out_d, j, a.d_rs, a.d_cs, a.d_vec, k0, a.d, ad);
}

/// A block per (unit, column slice) for the units with at most hot_tokens slots.
template <class T>
__global__ void __launch_bounds__(kUnitThreads) backward_units(UnitArgs<T> a) {
    const int64_t j = blockIdx.x;
    if (a.start[j + 1] - a.start[j] > a.hot_tokens) return;  // backward_hot_units' unit
    unit_gradients<T, 1>(a, j);
}

/// The listed hot units, G token groups a block and clusters of N blocks a unit (N = 1: no
/// cluster), the clusters striding over the list.
template <class T, int G, int N>
__global__ void __launch_bounds__(kUnitThreads *G) backward_hot_units(UnitArgs<T> a) {
    const uint32_t n = *a.hot_count;
    for (uint32_t i = blockIdx.x / N; i < n; i += gridDim.x / N) unit_gradients<T, G, N>(a, a.hot_units[i]);
}

}  // namespace twblas::cuda
