// The cuBLAS part of the forward's dense path: the first `cap` rows of the dense list compacted,
// their h formed, and their Y rows scattered back.
#pragma once

#include "common/values.cuh"
#include "common/warp.cuh"

namespace twblas::cuda {

// ---- the dense path through cuBLAS: the first `cap` rows of the dense list are compacted,
// multiplied by cuBLAS GEMMs of cap rows, and scattered back (cap comes from the statistics of
// an earlier forward; rows past it go through the gathered kernels, so nothing depends on it
// being large enough)

/// Rows of a strided matrix copied between a row list and a compact buffer: a block per row,
/// each thread kRowCopyAhead elements' loads in flight before its stores (one after another, the
/// 2048-value rows took ~7 us for ~100 rows: a chain of eight round trips, ncu on an H100).
constexpr int kRowCopyAhead = 8;
template <class T>
__device__ inline void copy_row(const T *src, int64_t src_cs, T *dst, int64_t dst_cs, int64_t d) {
    for (int64_t k0 = threadIdx.x; k0 < d; k0 += kRowCopyAhead * static_cast<int64_t>(blockDim.x)) {
        T v[kRowCopyAhead];
#pragma unroll
        for (int s = 0; s < kRowCopyAhead; ++s) {
            const int64_t k = k0 + s * static_cast<int64_t>(blockDim.x);
            if (k < d) v[s] = src[k * src_cs];
        }
#pragma unroll
        for (int s = 0; s < kRowCopyAhead; ++s) {
            const int64_t k = k0 + s * static_cast<int64_t>(blockDim.x);
            if (k < d) dst[k * dst_cs] = v[s];
        }
    }
}

template <class T>
__global__ void gather_rows(const T *x, int64_t x_rs, int64_t x_cs, int64_t d, const int32_t *rows,
                            const uint32_t *count, int64_t cap, T *xc, int64_t ldc) {
    const int64_t n = min(static_cast<int64_t>(*count), cap);
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) copy_row(x + rows[i] * x_rs, x_cs, xc + i * ldc, 1, d);
}

/// hc[i] = h of dense row rows[i] from its gate row and uc[i] (= X Wu^T, gated), written over
/// uc[i]; also each row's l1 and, for the hidden output, h back into the gate buffer. A block per
/// row (a warp per row took 144 us for 320 rows of 5632 values, ncu: load latency), 16-byte
/// chunks with four a thread in flight (one 2-byte value a thread at a time took 21 us for ~100
/// rows on an H100). ldg is a multiple of 8 values and the rows start on 16 bytes.
constexpr int kCompactAhead = 4;
template <class T>
__global__ void __launch_bounds__(256)
    compact_hidden(T *gate, int64_t ldg, T *uc, int64_t h, bool gated, const int32_t *rows, const uint32_t *count,
                   int64_t cap, bool write_back, float *row_l1) {
    constexpr int V = Chunk<T>::n;  // values a chunk (16-bit T: cuBLAS runs the dense path)
    __shared__ float warp_l1[8];
    const int64_t n = min(static_cast<int64_t>(*count), cap);
    const int64_t chunks = (h + V - 1) / V;
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const int64_t r = rows[i];
        T *g_row = gate + r * ldg, *u_row = uc + i * ldg;
        float l1 = 0.0f;
        for (int64_t c0 = threadIdx.x; c0 < chunks; c0 += kCompactAhead * static_cast<int64_t>(blockDim.x)) {
            uint4 gq[kCompactAhead], uq[kCompactAhead];
#pragma unroll
            for (int s = 0; s < kCompactAhead; ++s) {
                const int64_t c = c0 + s * static_cast<int64_t>(blockDim.x);
                gq[s] = uq[s] = make_uint4(0, 0, 0, 0);
                if (c < chunks) gq[s] = *reinterpret_cast<const uint4 *>(g_row + c * V);
                if (c < chunks && gated) uq[s] = *reinterpret_cast<const uint4 *>(u_row + c * V);
            }
#pragma unroll
            for (int s = 0; s < kCompactAhead; ++s) {
                const int64_t c = c0 + s * static_cast<int64_t>(blockDim.x);
                if (c >= chunks) break;
                const T *gv = reinterpret_cast<const T *>(&gq[s]);
                T hu[V], hg[V];  // into uc (0 past h), and into the gate row (its own value past h)
                hidden_chunk<T>(gq[s], uq[s], gated, h - c * V, hu, l1);
#pragma unroll
                for (int e = 0; e < V; ++e) hg[e] = c * V + e < h ? hu[e] : gv[e];
                *reinterpret_cast<uint4 *>(u_row + c * V) = *reinterpret_cast<const uint4 *>(hu);
                if (write_back) *reinterpret_cast<uint4 *>(g_row + c * V) = *reinterpret_cast<const uint4 *>(hg);
            }
        }
        for (int o = 16; o > 0; o >>= 1) l1 += __shfl_xor_sync(kFullMask, l1, o);
        if ((threadIdx.x & 31) == 0) warp_l1[threadIdx.x / 32] = l1;
        __syncthreads();
        if (threadIdx.x == 0) {
            float sum = 0.0f;
            for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) sum += warp_l1[w];
            row_l1[r] = sum;
        }
        __syncthreads();
    }
}

template <class T>
__global__ void scatter_rows(const T *yc, int64_t ldc, int64_t d, const int32_t *rows, const uint32_t *count,
                             int64_t cap, T *y, int64_t y_rs, int64_t y_cs) {
    const int64_t n = min(static_cast<int64_t>(*count), cap);
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) copy_row(yc + i * ldc, 1, y + rows[i] * y_rs, y_cs, d);
}

}  // namespace twblas::cuda
