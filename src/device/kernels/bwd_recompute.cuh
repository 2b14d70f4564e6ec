// The cuBLAS part of the backward's recompute: the first `cap` rows of the sorted dense list.
#pragma once

#include "common/matrix_arg.hpp"
#include "common/values.cuh"
#include "kernels/ffn_math.cuh"

namespace twblas::cuda {

// ---- the cuBLAS part of the recompute: the first `cap` rows of the sorted dense list

/// X and dY rows of list positions [0, cap) compacted (zero rows past the count: their z = 0
/// makes every unit inactive, so they add nothing to the cuBLAS weight-gradient GEMMs).
template <class T> __global__ void gather_pair(MatrixArg x, MatrixArg dy, const int32_t *rows, const uint32_t *count,
                                               int64_t cap, int64_t d, int64_t dp, T *xc, T *dyc) {
    const int64_t n = min(static_cast<int64_t>(*count), cap);
    const T *xs = static_cast<const T *>(x.ptr), *ys = static_cast<const T *>(dy.ptr);
    for (int64_t i = blockIdx.x; i < cap; i += gridDim.x) {
        const int64_t r = i < n ? rows[i] : -1;
        for (int64_t k = threadIdx.x; k < dp; k += blockDim.x) {
            const bool in = r >= 0 && k < d;
            xc[i * dp + k] = in ? xs[r * x.rs + k * x.cs] : Value<T>::from_float(0.0f);
            dyc[i * dp + k] = in ? ys[r * dy.rs + k * dy.cs] : Value<T>::from_float(0.0f);
        }
    }
}

/// z, u (value type: cuBLAS outputs recomputed into rz, ru, or kept by a dense-mode forward)
/// and dh (in rh) -> dz, du, h into rz, ru, rh, as the BackwardGrad epilogue. 16-bit types: a
/// thread per 16-byte chunk of 8 units (hp is a multiple of 8 and every buffer starts on 256
/// bytes), so that the pass moves its 6 x 2 bytes per unit at the copy rate (one element per
/// thread took 632 us at 16384 x 5632 on an H100). z, u and h rows are hp values apart, the rows
/// of dz and du dzu_ld apart (2 hp: [dZ | dU] as one matrix).
template <class T> __global__ void dense_grads(const T *z_in, const T *u_in, T *rz, T *ru, T *rh, int64_t cap, int64_t h,
                                               int64_t hp, int64_t dzu_ld, bool gated, L1Scale l1) {
    const float l1_scale = l1.get();
    static_assert(Chunk<T>::n == 8, "16-bit values");
    const int64_t per_row = hp / 8, n = cap * per_row;
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < n;
         c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t j0 = (c % per_row) * 8, at = c * 8;  // at = row * hp + j0
        const int64_t out = (c / per_row) * dzu_ld + j0;
        const uint4 zq = *reinterpret_cast<const uint4 *>(z_in + at);
        const uint4 uq = gated ? *reinterpret_cast<const uint4 *>(u_in + at) : make_uint4(0, 0, 0, 0);
        const uint4 hq = *reinterpret_cast<const uint4 *>(rh + at);
        T dz[8], du[8], hv[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const float z = Chunk<T>::get(zq, i);
            UnitGrad ug{0.0f, 0.0f, 0.0f};
            if (j0 + i < h && relu_active(z))
                ug = unit_grad<T>(z, gated ? Chunk<T>::get(uq, i) : 0.0f, Chunk<T>::get(hq, i), gated, false, l1_scale);
            dz[i] = Value<T>::from_float(ug.dz);
            du[i] = Value<T>::from_float(ug.du);
            hv[i] = Value<T>::from_float(ug.h);
        }
        *reinterpret_cast<uint4 *>(rz + out) = *reinterpret_cast<const uint4 *>(dz);
        if (gated) *reinterpret_cast<uint4 *>(ru + out) = *reinterpret_cast<const uint4 *>(du);
        *reinterpret_cast<uint4 *>(rh + at) = *reinterpret_cast<const uint4 *>(hv);
    }
}

/// dX rows of the first `cap` list positions: dZ Wg (+ dU Wu), fp32 from cuBLAS, rounded once.
/// rows NULL: every row in order (`cap` of them).
template <class T> __global__ void scatter_sum(const float *a, const float *b, int64_t ld, const int32_t *rows,
                                               const uint32_t *count, int64_t cap, int64_t d, T *dx, int64_t rs, int64_t cs) {
    const int64_t n = rows ? min(static_cast<int64_t>(*count), cap) : cap;
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const int64_t r = rows ? rows[i] : i;
        for (int64_t k = threadIdx.x; k < d; k += blockDim.x)
            dx[r * rs + k * cs] = Value<T>::from_float(a[i * ld + k] + (b ? b[i * ld + k] : 0.0f));
    }
}

}  // namespace twblas::cuda
