// Gather kernels the probes share: the sparse half of an FFN step over lists made on the host
// (bench/probes/sparse_half_probe.cu, coresident_probe.cu). A block is kGatherWarps warps.
#pragma once

#include "probe_common.cuh"

constexpr int kGatherWarps = 8;

__device__ inline float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/// The dot product of row w with row x (d values, d / 8 <= 256 chunks), all loads issued first.
__device__ inline float row_dot(const bf16 *w, const bf16 *x, int chunks, int lane) {
    uint4 wq[8], xq[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) {
        const int c = lane + 32 * q;
        if (c < chunks) {
            wq[q] = *reinterpret_cast<const uint4 *>(w + 8 * c);
            xq[q] = *reinterpret_cast<const uint4 *>(x + 8 * c);
        }
    }
    float acc = 0.0f;
#pragma unroll
    for (int q = 0; q < 8; ++q)
        if (lane + 32 * q < chunks) acc = dot8(wq[q], xq[q], acc);
    return warp_sum(acc);
}

__global__ void up_pairs(const bf16 *pair, int64_t stride, const bf16 *x, int d, const int *pt, const int *pj,
                         const float *g, int npairs, float *h) {
    const int lane = threadIdx.x & 31, p = blockIdx.x * kGatherWarps + threadIdx.x / 32;
    if (p >= npairs) return;
    const float dot = row_dot(pair + static_cast<int64_t>(pj[p]) * stride, x + static_cast<int64_t>(pt[p]) * d, d / 8, lane);
    if (lane == 0) h[p] = g[p] * dot;
}

/// y[t][256 s + 8 lane ..] = sum over the token's pairs of h * Wd_j[same columns], B rows in flight.
template <int B>
__global__ void down(const bf16 *pair, int64_t stride, int dp, const int *tstart, const int *pj, const float *h, int m,
                     int slices, bf16 *y) {
    const int lane = threadIdx.x & 31, wid = blockIdx.x * kGatherWarps + threadIdx.x / 32;
    if (wid >= m * slices) return;
    const int t = wid / slices, col = (wid % slices) * 256 + lane * 8;
    float acc[8] = {};
    for (int k0 = tstart[t]; k0 < tstart[t + 1]; k0 += B) {
        uint4 w[B];
        float hv[B];
#pragma unroll
        for (int i = 0; i < B; ++i) {
            const int k = k0 + i;
            const bool ok = k < tstart[t + 1];
            hv[i] = ok ? h[k] : 0.0f;
            w[i] = ok ? *reinterpret_cast<const uint4 *>(pair + static_cast<int64_t>(pj[k]) * stride + dp + col)
                      : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int i = 0; i < B; ++i) {
            const bf16 *v = reinterpret_cast<const bf16 *>(&w[i]);
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[e] = fmaf(hv[i], __bfloat162float(v[e]), acc[e]);
        }
    }
    bf16 out[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) out[e] = __float2bfloat16(acc[e]);
    *reinterpret_cast<uint4 *>(y + static_cast<int64_t>(t) * dp + col) = *reinterpret_cast<const uint4 *>(out);
}

