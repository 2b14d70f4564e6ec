// Warp and block primitives shared by the kernels: scans, sums, a row staged in shared memory and
// a warp's dot product of it with a weight row.
#pragma once

#include "values.cuh"

namespace twblas::cuda {

constexpr unsigned kFullMask = 0xffffffffu;

/// Inclusive sum over the lanes of a full warp.
__device__ inline int warp_scan_incl(int v) {
    const int lane = static_cast<int>(threadIdx.x & 31u);
    for (int o = 1; o < 32; o <<= 1) {
        const int n = __shfl_up_sync(kFullMask, v, o);
        if (lane >= o) v += n;
    }
    return v;
}

/// Sum over the lanes of a full warp (every lane gets it; butterfly order, deterministic).
__device__ inline float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
    return v;
}
__device__ inline long long warp_sum(long long v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
    return v;
}

/// Whether the TwELL tile this lane belongs to holds more units than its slots: the sum of `n`
/// over the tile's `lanes` adjacent lanes (a power of two up to 32; every lane of the warp calls
/// it).
__device__ inline bool tile_over_slots(int n, int lanes, int slots) {
    if (lanes == 32) return static_cast<int>(__reduce_add_sync(kFullMask, static_cast<unsigned>(n))) > slots;
    for (int o = 1; o < lanes; o <<= 1) n += __shfl_xor_sync(kFullMask, n, o);  // partners inside the tile
    return n > slots;
}

/// Row `r` of a matrix into shared memory as `nchunks` 16-byte chunks (zeros past d), by the block.
template <class T> __device__ inline void stage_row(uint4 *dst, const T *m, int64_t r, int64_t rs, int64_t cs, bool vec,
                                                    int64_t d, int nchunks) {
    constexpr int E = Chunk<T>::n;
    for (int c = threadIdx.x; c < nchunks; c += blockDim.x) {
        float v[E];
        load_chunk(m, r, rs, cs, vec, static_cast<int64_t>(c) * E, d, v);
        T tmp[E];
#pragma unroll
        for (int e = 0; e < E; ++e) tmp[e] = Value<T>::from_float(v[e]);
        dst[c] = *reinterpret_cast<const uint4 *>(tmp);
    }
}

/// One warp's dot product of a row held in shared memory (`nchunks` 16-byte chunks) with a weight
/// row in global memory. The kernels that use it are bound by load latency, so each lane issues the
/// loads of up to 8 chunks (a whole 2048-value row) before using any. Lane l sums chunks l + 32 q
/// into part[q % 4] in chunk order, and the parts are added as (p0 + p1) + (p2 + p3) before the
/// butterfly (the order the 4-chunk version had: the bits did not change). Every lane gets the sum.
template <class T> __device__ inline float warp_row_dot(const uint4 *row, const T *w, int nchunks) {
    constexpr int E = Chunk<T>::n;
    const int lane = threadIdx.x & 31;
    float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int c0 = lane; c0 < nchunks; c0 += 256) {
        uint4 wq[8];
#pragma unroll
        for (int q = 0; q < 8; ++q)
            if (c0 + 32 * q < nchunks) wq[q] = *reinterpret_cast<const uint4 *>(w + static_cast<int64_t>(c0 + 32 * q) * E);
#pragma unroll
        for (int q = 0; q < 8; ++q) {
            if (c0 + 32 * q >= nchunks) break;
            const uint4 x = row[c0 + 32 * q];
#pragma unroll
            for (int e = 0; e < E; ++e) part[q % 4] = fmaf(Chunk<T>::get(x, e), Chunk<T>::get(wq[q], e), part[q % 4]);
        }
    }
    return warp_sum((part[0] + part[1]) + (part[2] + part[3]));
}

}  // namespace twblas::cuda
