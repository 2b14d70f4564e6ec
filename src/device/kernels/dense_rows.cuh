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

template <class T> __global__ void gather_rows(const T *x, int64_t x_rs, int64_t x_cs, int64_t d, const int32_t *rows,
                                               const uint32_t *count, int64_t cap, T *xc, int64_t ldc) {
    const int64_t n = min(static_cast<int64_t>(*count), cap);
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const int64_t r = rows[i];
        for (int64_t k = threadIdx.x; k < d; k += blockDim.x) xc[i * ldc + k] = x[r * x_rs + k * x_cs];
    }
}

/// hc[i] = h of dense row rows[i] from its gate row and uc[i] (= X Wu^T, gated), written over
/// uc[i]; also each row's l1 and, for the hidden output, h back into the gate buffer. A block per
/// row: with a warp per row the 5632-value rows took 144 us for 320 rows (ncu: load latency).
template <class T> __global__ void __launch_bounds__(256) compact_hidden(T *gate, int64_t ldg, T *uc, int64_t h,
                                                                         bool gated, const int32_t *rows,
                                                                         const uint32_t *count, int64_t cap,
                                                                         bool write_back, float *row_l1) {
    __shared__ float warp_l1[8];
    const int64_t n = min(static_cast<int64_t>(*count), cap);
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const int64_t r = rows[i];
        float l1 = 0.0f;
        for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
            const float g = load_elem(gate, r * ldg + c);
            float hv = 0.0f;
            if (relu_active(g)) hv = gated ? round_to<T>(g * load_elem(uc, i * ldg + c)) : g;
            store_elem(uc, i * ldg + c, hv);
            if (write_back) store_elem(gate, r * ldg + c, hv);
            l1 += fabsf(hv);
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

template <class T> __global__ void scatter_rows(const T *yc, int64_t ldc, int64_t d, const int32_t *rows,
                                                const uint32_t *count, int64_t cap, T *y, int64_t y_rs, int64_t y_cs) {
    const int64_t n = min(static_cast<int64_t>(*count), cap);
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const int64_t r = rows[i];
        for (int64_t k = threadIdx.x; k < d; k += blockDim.x) y[r * y_rs + k * y_cs] = yc[i * ldc + k];
    }
}

}  // namespace twblas::cuda
