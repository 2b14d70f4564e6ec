// Dense mode's element-wise pass: h = relu(z) * u (relu(z) for a plain FFN) and the forward's
// statistics from the same reads of z and u, before the down GEMM. Statistics beside that GEMM
// would wait for it: from a few hundred tokens its tiles fill the SMs (ncu, H200, 512 tokens x
// 2816 active units: re-reading z and h and counting took 23.4 us after the GEMM's 19.8). At a
// few tokens the GEMM leaves SMs free, and h alone goes first, the statistics beside it
// (form_hidden, dense_row_stats).
#pragma once

#include <cooperative_groups.h>

#include "common/values.cuh"
#include "common/warp.cuh"
#include "kernels/finalize.cuh"

namespace twblas::cuda {

constexpr int kHiddenWarps = 8;     // a warp's step: 256 adjacent columns, as the TwELL tiles need
constexpr int kHiddenAhead = 4;     // 16-byte chunks of z and u in flight a lane
constexpr int kHiddenMaxRows = 64;  // rows a block: its rows' sums stay in shared memory
// Blocks a cluster (sm_90): the ranks add their per-unit counts through distributed shared
// memory, so that the global atomics are H per cluster instead of H per block.
constexpr int kHiddenCluster = 8;

template <class T>
struct HiddenStatsArgs {
    const T *z, *u;  // u NULL: a plain FFN
    T *h;            // may be u itself: each value is read before it is written
    int64_t ldg, m, cols, rows_per_block;
    int tile, slots, row_limit;
    unsigned long long *neuron_counts;  // NULL: not counted
    int32_t *count, *row_nnz;
    float *row_l1;
    uint32_t *header;  // zeroed here: the dense count and the statistics' ticket
};

/// Shared memory a block needs beyond its static part (its rows' sums, kHiddenStaticBytes): a
/// 16-bit count for each column.
inline size_t hidden_stats_shared_bytes(int64_t ldg) { return static_cast<size_t>(ldg) * 2; }
constexpr size_t kHiddenStaticBytes = kHiddenMaxRows * kHiddenWarps * (sizeof(int) + sizeof(float) + sizeof(bool));

/// A lane's 8 columns from `cl`: its active units (below `cols`) as a mask, added to `units`;
/// `over` set when the TwELL tile they belong to (lanes_per_tile adjacent lanes) holds more
/// than `slots`. Every lane of the warp calls it.
template <class T>
__device__ inline unsigned chunk_activity(const uint4 &zq, int64_t cl, int64_t cols, int lanes_per_tile, int slots,
                                          int &units, bool &over) {
    unsigned mask = 0;
    for (int i = 0; i < 8; ++i)
        if (cl + i < cols && relu_active(Chunk<T>::get(zq, i))) mask |= 1u << i;
    const int n = __popc(mask);
    units += n;
    over |= tile_over_slots(n, lanes_per_tile, slots);
    return mask;
}

/// This lane's 16-byte chunks of kHiddenAhead steps (columns g0 + s * stride + lane * 8, below
/// ldg) of the rows `a` and `b` (b NULL: zeros), every load in flight before the first is used.
/// `a` is read once (evict first); `b` too when `b_once`, else it is read beside (the down GEMM
/// reads h).
template <class T>
__device__ inline void load_steps(const T *a, const T *b, bool b_once, int64_t g0, int64_t stride, int lane,
                                  int64_t ldg, uint4 (&aq)[kHiddenAhead], uint4 (&bq)[kHiddenAhead]) {
#pragma unroll
    for (int s = 0; s < kHiddenAhead; ++s) {
        const int64_t cl = g0 + s * stride + lane * 8;
        aq[s] = bq[s] = make_uint4(0, 0, 0, 0);
        if (cl >= ldg) continue;  // ldg is a multiple of 8: whole 16-byte chunks
        aq[s] = __ldcs(reinterpret_cast<const uint4 *>(a + cl));
        if (b)
            bq[s] = b_once ? __ldcs(reinterpret_cast<const uint4 *>(b + cl)) : *reinterpret_cast<const uint4 *>(b + cl);
    }
}

/// f(cl, aq, bq) for each of this warp's 256-column steps of the rows `a` and `b` below `end`
/// (columns first, first + stride, ...; cl the lane's first column, aq and bq its chunks),
/// kHiddenAhead steps' loads in flight at a time (load_steps). Every lane of the warp calls it.
template <class T, class F>
__device__ __forceinline__ void for_warp_steps(const T *a, const T *b, bool b_once, int64_t first, int64_t end,
                                               int64_t stride, int lane, int64_t ldg, F &&f) {
    for (int64_t g0 = first; g0 < end; g0 += stride * kHiddenAhead) {
        uint4 aq[kHiddenAhead], bq[kHiddenAhead];
        load_steps<T>(a, b, b_once, g0, stride, lane, ldg, aq, bq);
#pragma unroll
        for (int s = 0; s < kHiddenAhead; ++s) {
            const int64_t c0 = g0 + s * stride;
            if (c0 >= end) break;  // the same for the whole warp
            f(c0 + lane * 8, aq[s], bq[s]);
        }
    }
}

/// Blocks of a few rows each: each block's rows one after another, its 8 warps over a row's
/// 256-column steps side by side (each row's sums: a butterfly a warp, then the warps in order,
/// as dense_row_stats sums: both give the same bits). h is written +0 past column `cols` up to
/// ldg. The per-unit counts, kSharedCounts: a lane owns the same columns on every row, so it
/// counts each of its units' activations in shared memory without atomics (8 x 16 bits a chunk),
/// and the block (or, with N-block clusters, one rank per column slice) adds them to the global
/// counts once: H atomics a block or cluster, whatever the activity. Otherwise one atomic an
/// active value, which costs less where few units are active (N = 1, no shared counts).
template <class T, int N, bool kSharedCounts>
__global__ void __launch_bounds__(32 * kHiddenWarps) form_hidden_stats(HiddenStatsArgs<T> a) {
    static_assert(kSharedCounts || N == 1, "clusters add shared counts");
    static_assert(Chunk<T>::n == 8, "16-bit values: a lane's 8 columns, a warp's 256");
    extern __shared__ uint4 s_counts[];  // ldg / 8 chunks of eight 16-bit counts
    __shared__ int s_units[kHiddenMaxRows][kHiddenWarps];
    __shared__ float s_l1[kHiddenMaxRows][kHiddenWarps];
    __shared__ bool s_over[kHiddenMaxRows][kHiddenWarps];
    const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x & 31);
    if (blockIdx.x == 0 && threadIdx.x < 2) a.header[threadIdx.x] = 0;
    const int64_t chunks = a.ldg / 8;  // ldg is a multiple of 8
    // chunk i belongs to thread i % blockDim.x below: zeroed by it, no barrier needed
    if constexpr (kSharedCounts)
        for (int64_t i = threadIdx.x; i < chunks; i += blockDim.x) s_counts[i] = make_uint4(0, 0, 0, 0);
    const int lanes_per_tile = a.tile / 8;
    const int64_t r0 = static_cast<int64_t>(blockIdx.x) * a.rows_per_block;
    const int64_t r1 = min(a.m, r0 + a.rows_per_block);
    const int64_t stride = int64_t{256} * kHiddenWarps;
    for (int64_t row = r0; row < r1; ++row) {
        const T *z = a.z + row * a.ldg;
        const T *u = a.u ? a.u + row * a.ldg : nullptr;
        T *h = a.h + row * a.ldg;
        int units = 0;
        bool over = false;
        float l1 = 0.0f;
        for_warp_steps<T>(z, u, true, static_cast<int64_t>(warp) * 256, a.ldg, stride, lane, a.ldg,
                          [&](int64_t cl, const uint4 &zq, const uint4 &uq) {
                              T out[8];
                              hidden_chunk<T>(zq, uq, u != nullptr, a.cols - cl, out, l1);
                              if (cl < a.ldg) *reinterpret_cast<uint4 *>(h + cl) = *reinterpret_cast<const uint4 *>(out);
                              const unsigned mask =
                                  chunk_activity<T>(zq, cl, a.cols, lanes_per_tile, a.slots, units, over);
                              if (!kSharedCounts) {
                                  if (a.neuron_counts)
                                      for (int i = 0; i < 8; ++i)
                                          if (mask >> i & 1u) atomicAdd(a.neuron_counts + cl + i, 1ull);
                              } else if (mask) {  // a 16-bit count a unit: bit i of the mask to half i % 2 of word i / 2
                                  uint4 &q = s_counts[cl / 8];
                                  q.x += (mask & 1u) | (mask >> 1 & 1u) << 16;
                                  q.y += (mask >> 2 & 1u) | (mask >> 3 & 1u) << 16;
                                  q.z += (mask >> 4 & 1u) | (mask >> 5 & 1u) << 16;
                                  q.w += (mask >> 6 & 1u) | (mask >> 7 & 1u) << 16;
                              }
                          });
        units = static_cast<int>(__reduce_add_sync(kFullMask, static_cast<unsigned>(units)));
        over = __any_sync(kFullMask, over);
        l1 = warp_sum(l1);
        if (lane == 0) s_units[row - r0][warp] = units, s_l1[row - r0][warp] = l1, s_over[row - r0][warp] = over;
    }
    __syncthreads();
    if (threadIdx.x < r1 - r0) {  // a row a thread: the warps in order
        const int r = static_cast<int>(threadIdx.x);
        float row_l1 = 0.0f;
        int row_total = 0;
        bool row_over = false;
        for (int w = 0; w < kHiddenWarps; ++w)
            row_l1 += s_l1[r][w], row_total += s_units[r][w], row_over |= s_over[r][w];
        a.row_nnz[r0 + r] = row_total;
        a.count[r0 + r] = row_count_code(row_total, row_over, a.row_limit);
        a.row_l1[r0 + r] = row_l1;
    }
    if (!kSharedCounts || !a.neuron_counts) return;  // the same for every block
    // the chunks [c0, c1) this block adds: all of them, or with clusters its rank's share of
    // the cluster's sums
    int64_t c0 = 0, c1 = chunks;
    [[maybe_unused]] const uint4 *peers[N] = {};
    if constexpr (N > 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
        cluster.sync();  // every rank's counts complete
        const int64_t share = (chunks + N - 1) / N;
        c0 = min(chunks, static_cast<int64_t>(cluster.block_rank()) * share);
        c1 = min(chunks, c0 + share);
        for (int q = 0; q < N; ++q) peers[q] = cluster.map_shared_rank(s_counts, q);
#else
        __trap();  // clusters run only where compute_90+ code does (the launch checks)
#endif
    } else {
        __syncthreads();
    }
    for (int64_t i = c0 + threadIdx.x; i < c1; i += blockDim.x) {
        unsigned sum[8] = {};
        for (int q = 0; q < N; ++q) {
            const uint4 v = N > 1 ? peers[q][i] : s_counts[i];
            const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int k = 0; k < 4; ++k) sum[2 * k] += w[k] & 0xffffu, sum[2 * k + 1] += w[k] >> 16;
        }
#pragma unroll
        for (int k = 0; k < 8; ++k)
            if (sum[k] && i * 8 + k < a.cols)
                atomicAdd(a.neuron_counts + i * 8 + k, static_cast<unsigned long long>(sum[k]));
    }
    if constexpr (N > 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        cooperative_groups::this_cluster().sync();  // the ranks' memory kept until it is read
#endif
    }
}

// ---- a few tokens (the tuning's dense_stats_beside_max_tokens): h alone, then the statistics
// beside the down GEMM, which leaves SMs free there

/// h = relu(z) * u rounded to T (gated; relu(z) for a plain FFN, u NULL) into `h`, which may be u
/// itself (each value is read before it is written); +0 past column `cols`. A thread per 16-byte
/// chunk. It also zeroes the forward's `header` (the dense count and the statistics' ticket).
template <class T>
__global__ void __launch_bounds__(256)
    form_hidden(const T *z, const T *u, T *h, int64_t ldg, int64_t m, int64_t cols, uint32_t *header) {
    if (blockIdx.x == 0 && threadIdx.x < 2) header[threadIdx.x] = 0;
    constexpr int V = Chunk<T>::n;                                // values a 16-byte chunk
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

/// The statistics from z and h: each row's active units, TwELL-tile overflow (-1) or long-row
/// (-2) verdict and l1, the per-unit counts by one atomic an active value, and from the grid's
/// last block the statistics published. A block per row, its warps taking 256-column steps side
/// by side (one warp a row, 22 dependent steps at H = 5632, took 28 us at M = 64, ncu); the l1
/// over every value of h (+0 where z is not active: the masked sum's bits). Eight warps a row:
/// 16 were slower on an H100 (llm-29, M = 16: 38.7 us against 37.4).
constexpr int kDenseStatsWarps = 8;

template <class T>
struct DenseStatsArgs {
    const T *z, *h;
    int64_t ldg, m, cols;
    int tile, slots, row_limit;
    unsigned long long *neuron_counts;  // NULL: not counted here
    int32_t *count, *row_nnz;
    float *row_l1;
    FfnStatsBlock *stats;  // the grid's last block reduces and publishes the statistics here
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
    PublishInputs early{};  // loaded now, its latency hidden
    if (threadIdx.x == 0) early = load_publish_inputs(a.stats);
    const int lanes_per_tile = a.tile / 8;
    const T *z = a.z + row * a.ldg, *h = a.h + row * a.ldg;
    int units = 0;
    bool over = false;
    float l1 = 0.0f;
    const int64_t stride = int64_t{256} * warps;  // this warp's steps: warp, warp + warps, ...
    for_warp_steps<T>(z, h, false, static_cast<int64_t>(warp) * 256, a.cols, stride, lane, a.ldg,
                      [&](int64_t cl, const uint4 &zq, const uint4 &hq) {
                          const unsigned mask = chunk_activity<T>(zq, cl, a.cols, lanes_per_tile, a.slots, units, over);
                          for (int i = 0; i < 8; ++i) l1 += fabsf(Chunk<T>::get(hq, i));
                          if (a.neuron_counts)
                              for (int i = 0; i < 8; ++i)
                                  if (mask >> i & 1u) atomicAdd(a.neuron_counts + cl + i, 1ull);
                      });
    // the row's sums: each warp's butterfly, then the warps in order
    units = static_cast<int>(__reduce_add_sync(kFullMask, static_cast<unsigned>(units)));
    over = __any_sync(kFullMask, over);
    l1 = warp_sum(l1);
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
        // release the row, then the ticket; the last block acquires
        __threadfence();
        last = atomicAdd(a.ticket, 1u) == static_cast<unsigned>(a.m - 1);
        if (last) __threadfence();
    }
    __syncthreads();
    // up to 32 rows one warp's reduction
    if (last && a.m <= 32 && threadIdx.x < 32)
        reduce_and_publish_statistics_warp(static_cast<int>(a.m), a.row_nnz, a.count, a.row_l1, a.stats, a.publish,
                                           early);
    if (last && a.m > 32)
        reduce_and_publish_statistics(a.m, a.row_nnz, a.count, a.row_l1, a.stats, a.publish, early);
}

}  // namespace twblas::cuda
