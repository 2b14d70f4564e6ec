// Packing the gate's output: one warp per token turns its gate row into the list of active units
// (ascending), flags rows with a TwELL tile over capacity or too many units for gathers (the
// dense path) and counts each unit's activations; in dense mode it writes h over the gate instead.
#pragma once

#include <type_traits>
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
    if (overflow || total > row_limit) {
        count[row] = overflow ? -1 : -2;
        dense_rows[atomicAdd(dense_count, 1u)] = static_cast<int32_t>(row);
    } else {
        count[row] = total;
    }
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
    int row_limit;    // rows with more active units go to the dense path (GEMMs beat gathers)
    const T *hidden;  // dense mode (16-bit types): h of every row (form_hidden), read for the l1
    bool dense_mode;  // dense mode: each row's statistics and l1; no unit lists
    int dense_warps;  // dense mode: warps a row (a block), up to kPackDenseWarpsMax
    float *row_l1;
    // dense mode, a few tokens: the grid's last row block reduces and publishes the statistics
    // (finalize's work, a launch fewer at the serving sizes); NULL: finalize does
    FfnStatsBlock *stats;
    FfnFeedback *publish;
    uint32_t *ticket;  // zeroed before the grid
};

/// Dense mode's h = relu(z) * u rounded to T (gated; relu(z) for a plain FFN, u NULL) into `h`,
/// which may be u itself (each value is read before it is written); +0 past column `cols`. A
/// thread per 16-byte chunk: the dense FFN's element-wise pass, so that the down GEMM starts as
/// soon as h exists and the statistics (pack_rows in dense mode) are formed beside it.
template <class T>
__global__ void __launch_bounds__(256) form_hidden(const T *z, const T *u, T *h, int64_t ldg, int64_t m, int64_t cols) {
    constexpr int V = Chunk<T>::n;  // values a 16-byte chunk
    const int64_t row_chunks = ldg / V, chunks = m * row_chunks;  // ldg is a multiple of 8
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < chunks;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t at = (i / row_chunks) * ldg + (i % row_chunks) * V, c0 = (i % row_chunks) * V;
        const uint4 zq = *reinterpret_cast<const uint4 *>(z + at);
        const uint4 uq = u ? *reinterpret_cast<const uint4 *>(u + at) : make_uint4(0, 0, 0, 0);
        T out[V];
        float l1 = 0.0f;  // unused: the packing pass forms each row's l1 beside the down GEMM
        hidden_chunk<T>(zq, uq, u != nullptr, cols - c0, out, l1);
        *reinterpret_cast<uint4 *>(h + at) = *reinterpret_cast<const uint4 *>(out);
    }
}

/// Dense mode splits a row's steps over the warps of a block (no unit list, so no order between
/// them to keep): one warp per row, 22 dependent steps at H = 5632, took 28 us at M = 64 (ncu,
/// bench/NOTES.md) against 3 for the dense FFN's element-wise pass. 8 warps a row, or 16 up to
/// heuristics::kPackDenseWideMaxTokens tokens.
constexpr int kPackDenseWarpsMax = 16;

template <class T>
__global__ void __launch_bounds__(512) pack_rows(PackArgs<T> a) {
    // warps per row: a.dense_warps in dense mode (a block per row), else 1 (four rows a block)
    const int per_row = a.dense_mode ? a.dense_warps : 1, warp = threadIdx.x / 32;
    const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32 / per_row) + warp / per_row;
    const int part = warp % per_row;
    if (row >= a.m) return;
    uint4 last_record = make_uint4(0, 0, 0, 0);  // loaded now, its latency hidden (a.stats)
    if (a.stats && threadIdx.x == 0) last_record = *reinterpret_cast<const uint4 *>(&a.stats->published);
    const int lane = threadIdx.x & 31;
    const int lanes_per_tile = a.tile / 8;
    const int first = lane & ~(lanes_per_tile - 1);
    uint16_t *idx = a.idx + row * a.cap;
    int total = 0;
    bool overflow = false;
    float l1 = 0.0f;
    // kPackAhead steps' loads in flight before the first is used: a warp's steps are otherwise a
    // chain of dependent round trips (22 at H = 5632; ncu: 16 us at any M up to 512)
    // (this warp's steps: part, part + per_row, ...)
    const int64_t stride = int64_t{256} * per_row;
    for (int64_t g0 = static_cast<int64_t>(part) * 256; g0 < a.h; g0 += stride * kPackAhead) {
        float vs[kPackAhead][8];
        uint4 hq[kPackAhead];  // dense mode: h at the same columns
#pragma unroll
        for (int s = 0; s < kPackAhead; ++s) {
            const int64_t cl = g0 + s * stride + lane * 8;
            hq[s] = make_uint4(0, 0, 0, 0);
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
                    if (a.dense_mode) hq[s] = *reinterpret_cast<const uint4 *>(a.hidden + row * a.ldg + cl);
                }
            }
        }
#pragma unroll
        for (int s = 0; s < kPackAhead; ++s) {
            const int64_t c0 = g0 + s * stride;
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
                if (!a.dense_mode && pos < a.cap) idx[pos] = static_cast<uint16_t>(cl + i);
                ++pos;
                if (a.neuron_counts) atomicAdd(a.neuron_counts + cl + i, 1ull);
            }
            if constexpr (!std::is_same_v<T, float>) {
                if (a.dense_mode && cl < a.ldg)  // the l1 of h at the active units (it is +0 elsewhere)
                    for (int i = 0; i < 8; ++i)
                        if (mask >> i & 1u) l1 += fabsf(Chunk<T>::get(hq[s], i));
            }
            if (a.zero_inactive && !a.dense_mode && cl < a.ldg && mask != 0xffu) {
                for (int i = 0; i < 8; ++i)
                    if (!(mask >> i & 1u)) gate_store<T>(a.gate, row * a.ldg + cl + i, a.gate_f32, 0.0f);
            }
            total += __shfl_sync(kFullMask, incl, 31);
        }
    }
    if (a.dense_mode) {  // the row's warps' sums in warp order
        __shared__ float l1s[kPackDenseWarpsMax];
        __shared__ int totals[kPackDenseWarpsMax], overs[kPackDenseWarpsMax];
        for (int o = 16; o > 0; o >>= 1) l1 += __shfl_xor_sync(kFullMask, l1, o);
        if (lane == 0) l1s[part] = l1, totals[part] = total, overs[part] = overflow;
        __syncthreads();
        __shared__ bool last;
        if (threadIdx.x == 0) {
            float row_l1 = 0.0f;
            int row_total = 0, row_over = 0;
            for (int w = 0; w < per_row; ++w) row_l1 += l1s[w], row_total += totals[w], row_over |= overs[w];
            a.row_nnz[row] = row_total;
            // -1 / -2 as record_row marks them, so that the dense share (which keeps dense mode on
            // for a batch with such rows, heuristics::dense_rows_favour_dense_mode) is measured here too
            a.count[row] = row_over ? -1 : row_total > a.row_limit ? -2 : row_total;
            a.row_l1[row] = row_l1;
            last = false;
            if (a.stats) {  // release the row, then the ticket; the last block acquires
                __threadfence();
                last = atomicAdd(a.ticket, 1u) == static_cast<unsigned>(a.m - 1);
                if (last) __threadfence();
            }
        }
        if (a.stats) {  // the same for every thread of the grid: a barrier only where the ticket was taken
            __syncthreads();
            // up to 32 rows one warp's reduction (heuristics::kPackDenseWideMaxTokens)
            if (last && a.m <= 32 && threadIdx.x < 32)
                reduce_and_publish_statistics_warp(static_cast<int>(a.m), a.h, a.row_nnz, a.count, a.row_l1, a.stats,
                                                   a.publish, last_record);
            if (last && a.m > 32)
                reduce_and_publish_statistics(a.m, a.h, a.row_nnz, a.count, a.row_l1, a.stats, a.publish, last_record);
        }
        return;
    }
    if (lane == 0) record_row(row, total, overflow, a.row_limit, a.count, a.row_nnz, a.dense_rows, a.dense_count);
}

/// The packing pass's outputs (unit lists, counts, the dense list, per-unit counts) from the
/// masked gate GEMM's active-unit words instead of the gate values: one warp per token reads
/// H / 8 bytes instead of the whole 16-bit gate row (1/16 of the bytes). Same outputs as pack_rows
/// in its sparse mode: units ascending, -1 for a TwELL tile over capacity, -2 for a long row.
struct MaskListArgs {
    const uint32_t *masks;
    int64_t words, m;
    int tile, slots, cap;
    uint16_t *idx;
    int32_t *count, *row_nnz, *dense_rows;
    uint32_t *dense_count;
    unsigned long long *neuron_counts;
    int row_limit;
    // the 16-bit gate the words came from, written at active units only: the other values of
    // a dense-path row are zeroed here (NULL: the gate is whole, inactive units +0)
    uint16_t *gate;
    int64_t ldg, h;
};

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

__global__ void __launch_bounds__(128) lists_from_masks(MaskListArgs a) {
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
