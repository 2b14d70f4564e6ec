// The end of every forward: the l1 of the rows on the dense path, then, in the last block to
// finish, the statistics reduced in a fixed order (deterministic) and published for the host.
#pragma once

#include "common/dependent_launch.cuh"
#include "common/values.cuh"
#include "common/warp.cuh"
#include "ffn_layout.hpp"

namespace twblas::cuda {


/// A row's entry in the count array: its active units, -1 when a TwELL tile holds more than
/// `slots` of them, -2 when it is longer than the dense-path limit (what the statistics count as
/// overflow and dense rows, and the path choice reads).
__device__ inline int32_t row_count_code(int32_t nnz, bool tile_over, int32_t row_limit) {
    return tile_over ? -1 : nnz > row_limit ? -2 : nnz;
}

/// A sum or maximum over the block (blockDim.x a multiple of 32): butterfly within warps, then
/// the warps in order (deterministic for a given block size). `scratch`: 32 values.
template <class V, class Op> __device__ inline V block_reduce(V v, Op op, V *scratch) {
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(kFullMask, v, o));
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x / 32] = v;
    __syncthreads();
    V total = scratch[0];
    for (unsigned w = 1; w < blockDim.x / 32; ++w) total = op(total, scratch[w]);
    __syncthreads();
    return total;
}

/// What publish_statistics reads of the statistics block, loaded early by a kernel whose end is
/// the step's (their latency hidden): the last published record and the dense-mode limits.
struct PublishInputs {
    uint4 last_record;
    double dense_mode_mean;
    float dense_mode_share;
};
__device__ inline PublishInputs load_publish_inputs(const FfnStatsBlock *block) {
    return {*reinterpret_cast<const uint4 *>(&block->published), block->dense_mode_mean, block->dense_mode_share};
}

/// The statistics of a forward, reduced, into the FFN's statistics block, and published to the
/// host when what steers the path choice changed (one thread), against the limits in `in`.
__device__ inline void publish_statistics(const FfnDeviceStats &s, FfnStatsBlock *block, FfnFeedback *publish,
                                          const PublishInputs &in) {
    const uint4 last_record = in.last_record;
    block->last = s;
    // publish what steers the path choice to the host (mapped memory), when it changed: one
    // 16-byte store with a check word, so that a torn read is recognised
    const long long m = s.tokens;
    const double mean = m > 0 ? static_cast<double>(s.total_nnz) / static_cast<double>(m) : 0.0;
    const float share = m > 0 ? static_cast<float>(static_cast<double>(s.dense_rows) / static_cast<double>(m)) : 0.0f;
    const uint32_t mode = feedback_mode(mean > in.dense_mode_mean || share > in.dense_mode_share, mean);
    const uint32_t share_bits = __float_as_uint(share);
    if (last_record.z != 1u || last_record.x != mode || last_record.y != share_bits) {
        const uint4 record = make_uint4(mode, share_bits, 1u, feedback_check(mode, share_bits));
        *reinterpret_cast<uint4 *>(&block->published) = record;
        *reinterpret_cast<uint4 *>(publish) = record;
    }
}

/// The statistics of a forward reduced in a fixed order (deterministic) by the block that
/// finishes it, then published: each warp's butterfly over all five values, then thread 0 adds
/// the warps in order (the order block_reduce gives, so the same bits) and publishes. One barrier
/// instead of five reductions' ten: this is the serial end of every forward. `in`: thread 0's,
/// loaded before the kernel's wait.
__device__ inline void reduce_and_publish_statistics(int64_t m, const int32_t *row_nnz, const int32_t *count,
                                                     const float *row_l1, FfnStatsBlock *block, FfnFeedback *publish,
                                                     const PublishInputs &in) {
    long long nnz = 0, mx = 0, over = 0, dense = 0;
    double l1 = 0.0;
    // a thread's rows r, r + blockDim.x, ... in that order, kStatsAhead rows' loads in flight at a
    // time (one block reads every row: at 16384 rows one load after another took 18 us, ncu)
    constexpr int kStatsAhead = 8;
    for (int64_t r0 = threadIdx.x; r0 < m; r0 += kStatsAhead * static_cast<int64_t>(blockDim.x)) {
        int32_t n[kStatsAhead], c[kStatsAhead];
        float l[kStatsAhead];
#pragma unroll
        for (int k = 0; k < kStatsAhead; ++k) {
            const int64_t r = r0 + k * static_cast<int64_t>(blockDim.x);
            const bool here = r < m;
            n[k] = here ? __ldcg(row_nnz + r) : 0;  // other blocks wrote them
            c[k] = here ? __ldcg(count + r) : 0;
            l[k] = here ? __ldcg(row_l1 + r) : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < kStatsAhead; ++k) {
            if (r0 + k * static_cast<int64_t>(blockDim.x) >= m) break;  // the same sums as one row at a time
            nnz += n[k];
            mx = max(mx, static_cast<long long>(n[k]));
            over += c[k] == -1;
            dense += c[k] < 0;
            l1 += l[k];
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        nnz += __shfl_xor_sync(kFullMask, nnz, o);
        mx = max(mx, __shfl_xor_sync(kFullMask, mx, o));
        over += __shfl_xor_sync(kFullMask, over, o);
        dense += __shfl_xor_sync(kFullMask, dense, o);
        l1 += __shfl_xor_sync(kFullMask, l1, o);
    }
    __shared__ FfnDeviceStats warp_stats[32];
    if ((threadIdx.x & 31) == 0) warp_stats[threadIdx.x / 32] = FfnDeviceStats{m, nnz, mx, over, dense, l1};
    __syncthreads();
    if (threadIdx.x != 0) return;
    FfnDeviceStats total = warp_stats[0];
    for (unsigned w = 1; w < blockDim.x / 32; ++w) {
        const FfnDeviceStats &s = warp_stats[w];
        total.total_nnz += s.total_nnz;
        total.max_row = max(total.max_row, s.max_row);
        total.overflow_rows += s.overflow_rows;
        total.dense_rows += s.dense_rows;
        total.l1_sum += s.l1_sum;
    }
    publish_statistics(total, block, publish, in);
}

/// The same by one warp (lane r reads row r, and r + 32, ... with kPast32Rows): a few instructions instead of five
/// block reductions. For the serving path, whose last block runs it at the end of every decode
/// step: on an H100 the block version there took the step from 17.5 to 21.1 us (why so much was
/// not profiled; code run once per call from a cold instruction cache is a guess). The 32-bit
/// sums hold for the serving path's rows (up to kServeMaxTokens, of at most 65536 units each).
template <bool kPast32Rows = false>
__device__ inline void reduce_and_publish_statistics_warp(int m, const int32_t *row_nnz, const int32_t *count,
                                                          const float *row_l1, FfnStatsBlock *block, FfnFeedback *publish,
                                                          const PublishInputs &in) {
    const int lane = threadIdx.x & 31;
    const bool mine = lane < m;
    int32_t mx = mine ? __ldcg(row_nnz + lane) : 0;
    const int32_t c = mine ? __ldcg(count + lane) : 0;
    unsigned n = static_cast<unsigned>(mx), over = c == -1, dense = c < 0;
    double l1 = mine ? __ldcg(row_l1 + lane) : 0.0;
    if constexpr (kPast32Rows)  // compiled only where needed: serve_down's registers are tight
        for (int r = lane + 32; r < m; r += 32) {
            const int32_t nr = __ldcg(row_nnz + r), cr = __ldcg(count + r);
            n += static_cast<unsigned>(nr), mx = max(mx, nr), over += cr == -1, dense += cr < 0;
            l1 += __ldcg(row_l1 + r);
        }
    for (int o = 16; o > 0; o >>= 1) l1 += __shfl_xor_sync(kFullMask, l1, o);
    const long long tn = __reduce_add_sync(kFullMask, n);
    const long long tm = __reduce_max_sync(kFullMask, mx);
    const long long to = __reduce_add_sync(kFullMask, over);
    const long long td = __reduce_add_sync(kFullMask, dense);
    if (lane == 0) publish_statistics(FfnDeviceStats{m, tn, tm, to, td, l1}, block, publish, in);
}

/// The l1 of the rows on the dense path (one warp per row), then, in the last block to finish,
/// the statistics reduced in a fixed order.
constexpr int kFinalThreads = 512;
template <class T>
__global__ void __launch_bounds__(kFinalThreads) finalize(const void *gate, int64_t ldg, int64_t h, bool f32,
                                                          bool relu, const int32_t *rows, const uint32_t *count_dense,
                                                          bool dense_l1, int64_t first, int64_t m, const int32_t *row_nnz,
                                                          const int32_t *count, float *row_l1, uint32_t *ticket,
                                                          FfnStatsBlock *block, FfnFeedback *publish) {
    const int lane = threadIdx.x & 31;
    // what publishing reads, loaded now so that its latency hides behind the work below (a load
    // at the end put about a microsecond on every forward's critical path)
    PublishInputs early{};
    if (threadIdx.x == 0) early = load_publish_inputs(block);
    wait_for_prior_grid();  // the forward's kernels (launch_dependent)
    const bool any_dense = dense_l1 && static_cast<int64_t>(*count_dense) > first;  // rows whose l1 is computed here
    if (any_dense) {
        const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
        for (int64_t i = first + static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
             i < *count_dense; i += warps) {
            const int64_t r = rows[i];
            float s = 0.0f;
            for (int64_t c = lane; c < h; c += 32) {
                const float v = gate_value<T>(gate, r * ldg + c, f32);
                if (!relu || relu_active(v)) s += fabsf(v);
            }
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(kFullMask, s, o);
            if (lane == 0) row_l1[r] = s;
        }
    }
    if (!any_dense) {
        // nothing written above: block 0 reduces at once, without the other blocks' release and
        // ticket (two dependent round trips fewer on every forward without dense-path rows)
        if (blockIdx.x == 0) reduce_and_publish_statistics(m, row_nnz, count, row_l1, block, publish, early);
        return;
    }
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(ticket, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    reduce_and_publish_statistics(m, row_nnz, count, row_l1, block, publish, early);
}

}  // namespace twblas::cuda
