// TW_COMPUTE_FP8_WEIGHTS: the units' up and down rows as FP8 E4M3 with one fp32 scale per row
// (s = max|w| / 448, 1 for a row of zeros; twblas.h gives the rule), made from the FFN's own rows
// by quantize_fp8_rows, and read back by the two-pass and serving kernels: half the bytes of a
// 16-bit row for every active unit, the point of the mode.
#pragma once

#include <cuda_fp8.h>

#include "common/values.cuh"
#include "ffn_layout.hpp"
#include "common/warp.cuh"

namespace twblas::cuda {

/// Eight E4M3 values (8 bytes) as fp32: E4M3 -> fp16 is exact (the hardware converts two at once
/// on sm_89 and later).
__device__ inline void fp8x8_to_float(uint2 w, float (&v)[8]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint32_t word = i < 2 ? w.x : w.y;
        const __nv_fp8x2_storage_t pair = static_cast<__nv_fp8x2_storage_t>((i % 2) ? word >> 16 : word & 0xffffu);
        const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
        const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&h));
        v[2 * i] = f.x;
        v[2 * i + 1] = f.y;
    }
}

/// Setup (the first FP8 forward after create or update): a block per unit, each of its rows
/// (`halves` of them: row j of `first`, then of `second`) quantized with its own scale. Division
/// and rounding as the CPU reference does them (IEEE division, nearest even, saturating at 448),
/// so both backends hold the same bytes.
template <class T>
__global__ void __launch_bounds__(256) quantize_fp8_rows(const T *first, int64_t first_ld, const T *second,
                                                         int64_t second_ld, int64_t dp, int halves, uint8_t *q,
                                                         float2 *scale, int64_t q_stride, int64_t q_half) {
    __shared__ float warp_max[8];
    const int64_t j = blockIdx.x;
    float s[2] = {1.0f, 1.0f};
    for (int half = 0; half < halves; ++half) {
        const T *w = half == 0 ? first + j * first_ld : second + j * second_ld;
        float amax = 0.0f;
        for (int64_t k = threadIdx.x; k < dp; k += blockDim.x) amax = fmaxf(amax, fabsf(load_elem(w, k)));
        for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, o));
        if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x / 32] = amax;
        __syncthreads();
        amax = 0.0f;
        for (int i = 0; i < static_cast<int>(blockDim.x / 32); ++i) amax = fmaxf(amax, warp_max[i]);
        __syncthreads();  // warp_max is reused by the next half
        const float sc = amax > 0.0f ? amax / 448.0f : 1.0f;
        s[half] = sc;
        uint8_t *out = q + j * q_stride + half * q_half;
        for (int64_t k = threadIdx.x; k < q_half; k += blockDim.x)  // the pads as +0
            out[k] = k < dp ? __nv_cvt_float_to_fp8(load_elem(w, k) / sc, __NV_SATFINITE, __NV_E4M3) : 0;
    }
    // a plain FFN's only half is its down row
    if (threadIdx.x == 0) scale[j] = halves == 2 ? make_float2(s[0], s[1]) : make_float2(1.0f, s[0]);
}

/// Sixteen E4M3 values (16 bytes) as fp32.
__device__ inline void fp8x16_to_float(uint4 w, float (&v)[16]) {
    float lo[8], hi[8];
    fp8x8_to_float(make_uint2(w.x, w.y), lo);
    fp8x8_to_float(make_uint2(w.z, w.w), hi);
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = lo[e], v[8 + e] = hi[e];
}

/// One warp's dot product of a row held in shared memory (`nchunks` 16-byte chunks of 8 16-bit
/// values, an even count: the FP8 half, zero-padded) with an FP8 row in global memory, unscaled,
/// 16 values (one 16-byte load) a lane at a time and four loads in flight; every lane gets it.
template <class T> __device__ inline float warp_row_dot_fp8(const uint4 *row, const uint8_t *q, int nchunks) {
    const int lane = threadIdx.x & 31;
    const int nblocks = nchunks / 2;
    float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int b0 = lane; b0 < nblocks; b0 += 128) {
        uint4 wq[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
            if (b0 + 32 * i < nblocks) wq[i] = *reinterpret_cast<const uint4 *>(q + static_cast<int64_t>(b0 + 32 * i) * 16);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            if (b0 + 32 * i >= nblocks) break;
            const uint4 r0 = row[2 * (b0 + 32 * i)], r1 = row[2 * (b0 + 32 * i) + 1];
            float w[16];
            fp8x16_to_float(wq[i], w);
#pragma unroll
            for (int e = 0; e < 8; ++e) part[i] = fmaf(Chunk<T>::get(r0, e), w[e], part[i]);
#pragma unroll
            for (int e = 0; e < 8; ++e) part[i] = fmaf(Chunk<T>::get(r1, e), w[8 + e], part[i]);
        }
    }
    return warp_sum((part[0] + part[1]) + (part[2] + part[3]));
}

/// warp_row_dot_fp8 of two rows at once (eight loads a lane in flight, the same sums in the same
/// order as two calls).
template <class T>
__device__ inline void warp_row_dot2_fp8(const uint4 *row, const uint8_t *qa, const uint8_t *qb, int nchunks, float &da,
                                         float &db) {
    const int lane = threadIdx.x & 31;
    const int nblocks = nchunks / 2;
    float pa[4] = {0.0f, 0.0f, 0.0f, 0.0f}, pb[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int b0 = lane; b0 < nblocks; b0 += 128) {
        uint4 wa[4], wb[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
            if (b0 + 32 * i < nblocks) {
                wa[i] = *reinterpret_cast<const uint4 *>(qa + static_cast<int64_t>(b0 + 32 * i) * 16);
                wb[i] = *reinterpret_cast<const uint4 *>(qb + static_cast<int64_t>(b0 + 32 * i) * 16);
            }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            if (b0 + 32 * i >= nblocks) break;
            const uint4 r0 = row[2 * (b0 + 32 * i)], r1 = row[2 * (b0 + 32 * i) + 1];
            float w[16];
            fp8x16_to_float(wa[i], w);
#pragma unroll
            for (int e = 0; e < 8; ++e) pa[i] = fmaf(Chunk<T>::get(r0, e), w[e], pa[i]);
#pragma unroll
            for (int e = 0; e < 8; ++e) pa[i] = fmaf(Chunk<T>::get(r1, e), w[8 + e], pa[i]);
            fp8x16_to_float(wb[i], w);
#pragma unroll
            for (int e = 0; e < 8; ++e) pb[i] = fmaf(Chunk<T>::get(r0, e), w[e], pb[i]);
#pragma unroll
            for (int e = 0; e < 8; ++e) pb[i] = fmaf(Chunk<T>::get(r1, e), w[8 + e], pb[i]);
        }
    }
    da = warp_sum((pa[0] + pa[1]) + (pa[2] + pa[3]));
    db = warp_sum((pb[0] + pb[1]) + (pb[2] + pb[3]));
}

}  // namespace twblas::cuda
