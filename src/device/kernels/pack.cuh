// Packing the gate's output: one warp per token turns its gate row into the list of active units
// (ascending), flags rows with a TwELL tile over capacity or too many units for gathers (the
// dense path) and counts each unit's activations; dense mode's h (form_hidden) and its statistics
// from z and h (dense_row_stats).
#pragma once

#include "common/values.cuh"
#include "common/warp.cuh"
#include "kernels/finalize.cuh"

namespace twblas::cuda {

// ---- pack: one warp per token, 256 gate values (8 per lane) per step

constexpr int kPackAhead = 4;

/// A token's verdict: its unit count, or -1 (a TwELL tile over capacity, counted in the
/// statistics) / -2 (a long row) with a place in the dense list.
__device__ inline void record_row(int64_t row, int total, bool overflow, int row_limit, int32_t *count,
                                  int32_t *row_nnz, int32_t *dense_rows, uint32_t *dense_count) {
    row_nnz[row] = total;
    const int32_t code = row_count_code(total, overflow, row_limit);
    count[row] = code;
    if (code < 0) dense_rows[atomicAdd(dense_count, 1u)] = static_cast<int32_t>(row);
}

template <class T>
struct PackArgs {
    void *gate;
    int64_t ldg, m, h;
    bool gate_f32, zero_inactive;
    int tile, slots, cap;
    uint16_t *idx;
    int32_t *count, *row_nnz, *dense_rows;
    uint32_t *dense_count;
    unsigned long long *neuron_counts;
    int row_limit;  // rows with more active units go to the dense path (GEMMs beat gathers)
};

/// Dense mode's h = relu(z) * u rounded to T (gated; relu(z) for a plain FFN, u NULL) into `h`,
/// which may be u itself (each value is read before it is written); +0 past column `cols`. A
/// thread per 16-byte chunk: the dense FFN's element-wise pass, so that the down GEMM starts as
/// soon as h exists and the statistics (dense_row_stats) are formed beside it. It also zeroes
/// the forward's `header` (the dense count and the statistics pass's ticket), which a memset
/// node on the statistics' branch did: a node fewer.
template <class T>
__global__ void __launch_bounds__(256)
    form_hidden(const T *z, const T *u, T *h, int64_t ldg, int64_t m, int64_t cols, uint32_t *header) {
    if (blockIdx.x == 0 && threadIdx.x < 2) header[threadIdx.x] = 0;
    constexpr int V = Chunk<T>::n;  // values a 16-byte chunk
    const int64_t row_chunks = ldg / V, chunks = m * row_chunks;  // ldg is a multiple of 8
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < chunks;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t at = (i / row_chunks) * ldg + (i % row_chunks) * V, c0 = (i % row_chunks) * V;
        const uint4 zq = *reinterpret_cast<const uint4 *>(z + at);
        const uint4 uq = u ? *reinterpret_cast<const uint4 *>(u + at) : make_uint4(0, 0, 0, 0);
        T out[V];
        float l1 = 0.0f;  // unused: dense_row_stats forms each row's l1 beside the down GEMM
        hidden_chunk<T>(zq, uq, u != nullptr, cols - c0, out, l1);
        *reinterpret_cast<uint4 *>(h + at) = *reinterpret_cast<const uint4 *>(out);
    }
}

/// The packing pass of the sparse paths: one warp per token, four tokens a block (launch bound
/// 512, the register budget it has been timed with since it also served dense mode).
template <class T>
__global__ void __launch_bounds__(512) pack_rows(PackArgs<T> a) {
    const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= a.m) return;
    const int lane = threadIdx.x & 31;
    const int lanes_per_tile = a.tile / 8;
    const int first = lane & ~(lanes_per_tile - 1);
    uint16_t *idx = a.idx + row * a.cap;
    int total = 0;
    bool overflow = false;
    // kPackAhead steps' loads in flight before the first is used: a warp's steps are otherwise a
    // chain of dependent round trips (22 at H = 5632; ncu: 16 us at any M up to 512)
    for (int64_t g0 = 0; g0 < a.h; g0 += 256 * kPackAhead) {
        float vs[kPackAhead][8];
#pragma unroll
        for (int s = 0; s < kPackAhead; ++s) {
            const int64_t cl = g0 + s * 256 + lane * 8;
            for (int i = 0; i < 8; ++i) vs[s][i] = 0.0f;
            if (cl < a.ldg) {  // ldg is a multiple of 8: whole 16-byte chunks
                if (a.gate_f32) {
                    const float4 *p =
                        reinterpret_cast<const float4 *>(static_cast<const float *>(a.gate) + row * a.ldg + cl);
                    const float4 q0 = __ldcs(p), q1 = __ldcs(p + 1);
                    vs[s][0] = q0.x, vs[s][1] = q0.y, vs[s][2] = q0.z, vs[s][3] = q0.w;
                    vs[s][4] = q1.x, vs[s][5] = q1.y, vs[s][6] = q1.z, vs[s][7] = q1.w;
                } else {
                    const uint4 q =
                        __ldcs(reinterpret_cast<const uint4 *>(static_cast<const T *>(a.gate) + row * a.ldg + cl));
                    for (int i = 0; i < 8; ++i) vs[s][i] = Chunk<T>::get(q, i);
                }
            }
        }
#pragma unroll
        for (int s = 0; s < kPackAhead; ++s) {
            const int64_t c0 = g0 + s * 256;
            if (c0 >= a.h) break;  // the same for the whole warp
            const int64_t cl = c0 + lane * 8;
            const float *v = vs[s];
            unsigned mask = 0;
            for (int i = 0; i < 8; ++i)
                if (cl + i < a.h && relu_active(v[i])) mask |= 1u << i;
            const int n = __popc(mask);
            const int incl = warp_scan_incl(n), excl = incl - n;
            const int tile_base = __shfl_sync(kFullMask, excl, first);
            const int tile_count = __shfl_sync(kFullMask, incl, first + lanes_per_tile - 1) - tile_base;
            overflow |= __any_sync(kFullMask, tile_count > a.slots);
            int pos = total + excl;
            for (int i = 0; i < 8; ++i) {
                if (!(mask >> i & 1u)) continue;
                if (pos < a.cap) idx[pos] = static_cast<uint16_t>(cl + i);
                ++pos;
                if (a.neuron_counts) atomicAdd(a.neuron_counts + cl + i, 1ull);
            }
            if (a.zero_inactive && cl < a.ldg && mask != 0xffu) {
                for (int i = 0; i < 8; ++i)
                    if (!(mask >> i & 1u)) gate_store<T>(a.gate, row * a.ldg + cl + i, a.gate_f32, 0.0f);
            }
            total += __shfl_sync(kFullMask, incl, 31);
        }
    }
    if (lane == 0) record_row(row, total, overflow, a.row_limit, a.count, a.row_nnz, a.dense_rows, a.dense_count);
}

/// Dense mode's statistics (no unit lists) from z and h: each row's active units, TwELL-tile
/// overflow (-1) or long-row (-2) verdict and l1, and the per-unit counts. A block per row, its
/// warps taking 256-column steps side by side: one warp per row, 22 dependent steps at H = 5632,
/// took 28 us at M = 64 (ncu). Beside the down GEMM its work is latency (ncu at M = 4: pack_rows's
/// dense mode, which did this before, ran ~730 instructions a warp, one every 13 cycles), so the
/// step is lean: the units by
/// popcount, one reduction over the tile's lanes, the l1 over every value of h (+0 where z is
/// not active, and adding +0 leaves the sum's bits as the masked sum's).
/// Eight warps a row at every M: 16 up to 32 tokens (which the older pass needed, its last block
/// reducing with one warp) were slower with this pass on an H100, llm-29 M = 16
/// 38.7 us against 37.4 with 8, M = 32 37.6 against 37.3, M = 4 level.
constexpr int kDenseStatsWarps = 8;

template <class T>
struct DenseStatsArgs {
    const T *z, *h;
    int64_t ldg, m, cols;
    int tile, slots, row_limit;
    unsigned long long *neuron_counts;  // NULL: not counted here
    int32_t *count, *row_nnz;
    float *row_l1;
    // a few tokens: the grid's last block reduces and publishes the statistics (finalize's work,
    // a launch fewer at the serving sizes); NULL: finalize does
    FfnStatsBlock *stats;
    FfnFeedback *publish;
    uint32_t *ticket;  // zeroed before the grid
};

template <class T>
__global__ void __launch_bounds__(32 * kDenseStatsWarps) dense_row_stats(DenseStatsArgs<T> a) {
    static_assert(Chunk<T>::n == 8, "16-bit values: a lane's 8 columns, a warp's 256");
    constexpr int warps = kDenseStatsWarps;
    const int warp = static_cast<int>(threadIdx.x / 32);
    const int lane = threadIdx.x & 31;
    const int64_t row = blockIdx.x;
    uint4 last_record = make_uint4(0, 0, 0, 0);  // loaded now, its latency hidden (a.stats)
    if (a.stats && threadIdx.x == 0) last_record = *reinterpret_cast<const uint4 *>(&a.stats->published);
    const int lanes_per_tile = a.tile / 8;
    const T *z = a.z + row * a.ldg, *h = a.h + row * a.ldg;
    int units = 0;
    bool over = false;
    float l1 = 0.0f;
    const int64_t stride = int64_t{256} * warps;  // this warp's steps: warp, warp + warps, ...
    for (int64_t g0 = static_cast<int64_t>(warp) * 256; g0 < a.cols; g0 += stride * kPackAhead) {
        uint4 zq[kPackAhead], hq[kPackAhead];
#pragma unroll
        for (int s = 0; s < kPackAhead; ++s) {  // every step's loads in flight before the first is used
            const int64_t cl = g0 + s * stride + lane * 8;
            zq[s] = hq[s] = make_uint4(0, 0, 0, 0);
            if (cl < a.ldg) {  // ldg is a multiple of 8: whole 16-byte chunks
                zq[s] = __ldcs(reinterpret_cast<const uint4 *>(z + cl));
                hq[s] = *reinterpret_cast<const uint4 *>(h + cl);  // the down GEMM reads h beside
            }
        }
#pragma unroll
        for (int s = 0; s < kPackAhead; ++s) {
            const int64_t c0 = g0 + s * stride;
            if (c0 >= a.cols) break;  // the same for the whole warp
            const int64_t cl = c0 + lane * 8;
            unsigned mask = 0;
            for (int i = 0; i < 8; ++i)
                if (cl + i < a.cols && relu_active(Chunk<T>::get(zq[s], i))) mask |= 1u << i;
            const int n = __popc(mask);
            units += n;
            int tile_units = n;
            if (lanes_per_tile == 32)
                tile_units = static_cast<int>(__reduce_add_sync(kFullMask, static_cast<unsigned>(n)));
            else  // xor partners stay inside the tile's lanes
                for (int o = 1; o < lanes_per_tile; o <<= 1) tile_units += __shfl_xor_sync(kFullMask, tile_units, o);
            over |= tile_units > a.slots;
            for (int i = 0; i < 8; ++i) l1 += fabsf(Chunk<T>::get(hq[s], i));
            if (a.neuron_counts)
                for (int i = 0; i < 8; ++i)
                    if (mask >> i & 1u) atomicAdd(a.neuron_counts + cl + i, 1ull);
        }
    }
    // the row's sums: each warp's butterfly, then the warps in order
    units = static_cast<int>(__reduce_add_sync(kFullMask, static_cast<unsigned>(units)));
    over = __any_sync(kFullMask, over);
    for (int o = 16; o > 0; o >>= 1) l1 += __shfl_xor_sync(kFullMask, l1, o);
    __shared__ float l1s[kDenseStatsWarps];
    __shared__ int totals[kDenseStatsWarps], overs[kDenseStatsWarps];
    if (lane == 0) l1s[warp] = l1, totals[warp] = units, overs[warp] = over;
    __syncthreads();
    __shared__ bool last;
    if (threadIdx.x == 0) {
        float row_l1 = 0.0f;
        int row_total = 0, row_over = 0;
        for (int w = 0; w < warps; ++w) row_l1 += l1s[w], row_total += totals[w], row_over |= overs[w];
        a.row_nnz[row] = row_total;
        // -1 / -2 as the sparse paths mark them, so that the dense share (which keeps dense mode on
        // for a batch with such rows, the plan's dense_rows_dense_mode_max_tokens) is measured here too
        a.count[row] = row_count_code(row_total, row_over, a.row_limit);
        a.row_l1[row] = row_l1;
        last = false;
        if (a.stats) {  // release the row, then the ticket; the last block acquires
            __threadfence();
            last = atomicAdd(a.ticket, 1u) == static_cast<unsigned>(a.m - 1);
            if (last) __threadfence();
        }
    }
    if (!a.stats) return;  // the same for every thread of the grid
    __syncthreads();
    // up to 32 rows one warp's reduction
    if (last && a.m <= 32 && threadIdx.x < 32)
        reduce_and_publish_statistics_warp(static_cast<int>(a.m), a.cols, a.row_nnz, a.count, a.row_l1, a.stats,
                                           a.publish, last_record);
    if (last && a.m > 32)
        reduce_and_publish_statistics(a.m, a.cols, a.row_nnz, a.count, a.row_l1, a.stats, a.publish, last_record);
}

/// The packing pass's outputs (unit lists, counts, the dense list, per-unit counts) from the
/// masked gate GEMM's active-unit words instead of the gate values: one warp per token reads
/// H / 8 bytes instead of the whole 16-bit gate row (1/16 of the bytes). Same outputs as pack_rows
/// in its sparse mode: units ascending, -1 for a TwELL tile over capacity, -2 for a long row
/// (MaskListArgs, ffn_layout.hpp).

constexpr int kMaskAhead = 4;

/// The units of one mask word (`bits`, word `w`) at list positions pos, pos + 1, ...: into `idx`
/// (up to the list's capacity) and the neuron counts; `also(pos, unit)` for each.
template <class F>
__device__ inline void list_word_units(const MaskListArgs &a, uint16_t *idx, uint32_t bits, int64_t w, int pos, F &&also) {
    while (bits) {
        const int64_t unit = w * 32 + __ffs(bits) - 1;
        bits &= bits - 1;
        if (pos < a.cap) idx[pos] = static_cast<uint16_t>(unit);
        also(pos, unit);
        ++pos;
        if (a.neuron_counts) atomicAdd(a.neuron_counts + unit, 1ull);
    }
}

/// Whether the tile this lane's word belongs to holds more units than its slots (the tile's
/// words are `words_per_tile` adjacent lanes).
__device__ inline bool tile_over_slots(int n, int words_per_tile, int slots) {
    for (int o = 1; o < words_per_tile; o <<= 1) n += __shfl_xor_sync(kFullMask, n, o);
    return n > slots;
}

/// Zeroes the values of a gate row at its inactive units (the masked GEMM wrote only the active
/// ones), so that the dense path reads the row whole: one warp, 8-column chunks over its lanes,
/// chunks without an active unit written without being read.
__device__ inline void zero_inactive_units(const uint32_t *masks, uint16_t *gate, int64_t h, int lane) {
    for (int64_t c = static_cast<int64_t>(lane) * 8; c < h; c += 32 * 8) {
        const unsigned live = (masks[c / 32] >> (c % 32)) & 0xffu;
        uint16_t v[8] = {};
        const bool whole = c + 8 <= h;  // ldg and the row base on 16 bytes
        if (live && whole) memcpy(v, gate + c, 16);
        if (live && !whole)
            for (int k = 0; c + k < h; ++k) v[k] = gate[c + k];
#pragma unroll
        for (int k = 0; k < 8; ++k)
            if (!(live >> k & 1u)) v[k] = 0;
        if (whole)
            *reinterpret_cast<uint4 *>(gate + c) = *reinterpret_cast<const uint4 *>(v);
        else
            for (int k = 0; c + k < h; ++k) gate[c + k] = v[k];
    }
}

// static: several launcher files include this header (one copy of the kernel each)
static __global__ void __launch_bounds__(128) lists_from_masks(MaskListArgs a) {
    const int64_t row = static_cast<int64_t>(blockIdx.x) * 4 + threadIdx.x / 32;
    if (row >= a.m) return;
    const int lane = threadIdx.x & 31;
    const int words_per_tile = a.tile / 32;  // 2, 4 or 8: a tile's words are adjacent lanes
    const uint32_t *masks = a.masks + row * a.words;
    uint16_t *idx = a.idx + row * a.cap;
    int total = 0;
    bool overflow = false;
    for (int64_t w0 = 0; w0 < a.words; w0 += 32 * kMaskAhead) {
        uint32_t ws[kMaskAhead];
#pragma unroll
        for (int s = 0; s < kMaskAhead; ++s) {
            const int64_t w = w0 + s * 32 + lane;
            ws[s] = w < a.words ? __ldcs(masks + w) : 0u;
        }
#pragma unroll
        for (int s = 0; s < kMaskAhead; ++s) {
            if (w0 + s * 32 >= a.words) break;  // the same for the whole warp
            const int n = __popc(ws[s]);
            overflow |= __any_sync(kFullMask, tile_over_slots(n, words_per_tile, a.slots));
            const int incl = warp_scan_incl(n);
            list_word_units(a, idx, ws[s], w0 + s * 32 + lane, total + incl - n, [](int, int64_t) {});
            total += __shfl_sync(kFullMask, incl, 31);
        }
    }
    if (lane == 0) record_row(row, total, overflow, a.row_limit, a.count, a.row_nnz, a.dense_rows, a.dense_count);
    if (a.gate && (overflow || total > a.row_limit)) zero_inactive_units(masks, a.gate + row * a.ldg, a.h, lane);
}

/// lists_from_masks's work for one row by a whole block (fwd_u's, when it reads the masked GEMM's
/// words itself: one launch and its chain of round trips fewer). The same outputs (idx, count,
/// row_nnz, the dense list, neuron counts, a dense-path row's inactive values zeroed), and the
/// row's first `ell` units into `s_col`. `s_warp`: blockDim.x / 32 ints of shared memory.
/// Returns what count[row] now holds: the units, or -1 / -2 for a dense-path row.
__device__ inline int block_list_from_masks(const MaskListArgs &a, int64_t row, int32_t *s_col, int ell, int *s_warp) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const int words_per_tile = a.tile / 32;  // 2, 4 or 8 adjacent lanes, as in lists_from_masks
    const uint32_t *masks = a.masks + row * a.words;
    uint16_t *idx = a.idx + row * a.cap;
    int total = 0;
    bool overflow = false;
    for (int64_t w0 = 0; w0 < a.words; w0 += blockDim.x) {  // a block-wide pass per blockDim.x words
        const int64_t w = w0 + threadIdx.x;
        const uint32_t bits = w < a.words ? __ldcs(masks + w) : 0u;
        const int n = __popc(bits);
        overflow |= tile_over_slots(n, words_per_tile, a.slots);
        const int incl = warp_scan_incl(n);
        if (lane == 31) s_warp[warp] = incl;
        __syncthreads();
        int before = total, pass = 0;
        for (int k = 0; k < warps; ++k) {
            before += k < warp ? s_warp[k] : 0;
            pass += s_warp[k];
        }
        __syncthreads();  // s_warp is read: the next pass may write it
        list_word_units(a, idx, bits, w, before + incl - n, [&](int pos, int64_t unit) {
            if (pos < ell) s_col[pos] = static_cast<int32_t>(min(unit, a.h - 1));  // as fwd_u reads idx
        });
        total += pass;
    }
    overflow = __syncthreads_or(overflow);
    if (threadIdx.x == 0) record_row(row, total, overflow, a.row_limit, a.count, a.row_nnz, a.dense_rows, a.dense_count);
    if (!(overflow || total > a.row_limit)) return total;
    // a dense-path row: its inactive values zeroed (the masked GEMM wrote only the active ones),
    // a warp per stretch of 256 columns
    if (a.gate)
        for (int64_t c0 = static_cast<int64_t>(warp) * 256; c0 < a.h; c0 += static_cast<int64_t>(warps) * 256)
            zero_inactive_units(masks + c0 / 32, a.gate + row * a.ldg + c0, min(static_cast<int64_t>(256), a.h - c0), lane);
    return overflow ? -1 : -2;
}

/// Per-unit activation counts of a dense forward, by columns: each thread counts 8 adjacent
/// units over `rows` rows (count_rows_per_block) and adds once, instead of one atomic per active
/// (token, unit), which at 900 active units per token contended on 5632 counters (ncu: the
/// packing pass doubled). Eight rows' loads are in flight at a time.
constexpr int kCountMaxRows = 256;
inline int64_t count_rows_per_block(int64_t m) {
    // about 128 row blocks (enough blocks at a few hundred tokens: 256 rows per block, one load
    // after another, took ~100 us at M = 256), at most kCountMaxRows (atomics at large M)
    const int64_t r = (m + 127) / 128;
    return r < 8 ? 8 : r > kCountMaxRows ? kCountMaxRows : (r + 7) / 8 * 8;
}
template <class T>
__global__ void __launch_bounds__(256)
    count_active_columns(const T *gate, int64_t ldg, int64_t m, int64_t h, int64_t rows, unsigned long long *counts) {
    const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
    if (c0 >= ldg) return;
    const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows, r1 = min(m, r0 + rows);
    unsigned n[8] = {};
    for (int64_t g = r0; g < r1; g += 8) {
        uint4 q[8];
#pragma unroll
        for (int k = 0; k < 8; ++k)
            q[k] = g + k < r1 ? __ldcs(reinterpret_cast<const uint4 *>(gate + (g + k) * ldg + c0))
                              : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int k = 0; k < 8; ++k)
#pragma unroll
            for (int i = 0; i < 8; ++i)
                n[i] += relu_active(Chunk<T>::get(q[k], i)) ? 1u : 0u;  // zeros count as inactive
    }
    for (int i = 0; i < 8; ++i)
        if (n[i] && c0 + i < h) atomicAdd(counts + c0 + i, static_cast<unsigned long long>(n[i]));
}

}  // namespace twblas::cuda
