// Packing the gate's output: one warp per token turns its gate row into the list of active units
// (ascending), flags rows with a TwELL tile over capacity or too many units for gathers (the
// dense path) and counts each unit's activations.
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

}  // namespace twblas::cuda
