// The end of every forward: the l1 of the rows on the dense path, then, in the last block to
// finish, the statistics reduced in a fixed order (deterministic) and published for the host.
#pragma once

#include <cub/block/block_reduce.cuh>
#include "common/values.cuh"
#include "common/warp.cuh"
#include "ffn_layout.hpp"
#include "heuristics.hpp"

namespace twblas::cuda {

struct MaxOp {
    __device__ long long operator()(long long a, long long b) const { return a > b ? a : b; }
};


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
    // the last published record, loaded now so that its latency hides behind the work below
    // (a load at the end put about a microsecond on every forward's critical path)
    uint4 last_record = make_uint4(0, 0, 0, 0);
    if (threadIdx.x == 0) last_record = *reinterpret_cast<const uint4 *>(&block->published);
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
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(kFullMask, s, o);
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
    if (threadIdx.x == 0) {
        block->last = FfnDeviceStats{m, tn, tm, to, td, tl};
        // publish what steers the path choice to the host (mapped memory), when it changed:
        // one 16-byte store with a check word, so that a torn read is recognised
        const double mean = m > 0 ? static_cast<double>(tn) / static_cast<double>(m) : 0.0;
        const float share = m > 0 ? static_cast<float>(static_cast<double>(td) / static_cast<double>(m)) : 0.0f;
        const uint32_t mode = heuristics::dense_mode_after(mean, share, h) ? 1u : 0u;
        const uint32_t share_bits = __float_as_uint(share);
        if (last_record.z != 1u || last_record.x != mode || last_record.y != share_bits) {
            const uint4 record = make_uint4(mode, share_bits, 1u, feedback_check(mode, share_bits));
            *reinterpret_cast<uint4 *>(&block->published) = record;
            *reinterpret_cast<uint4 *>(publish) = record;
        }
    }
}

}  // namespace twblas::cuda
