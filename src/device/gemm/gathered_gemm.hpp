// The one gathered GEMM of the CUDA backend: C(i, j) = epilogue(sum_k A(i, k) B(k, j)) over rows
// or reductions gathered through index lists, with counts read on the device (no host sync).
// The forward's dense path (rows past the cuBLAS capacity) and the backward's recompute both use
// it. 64 x 128 output tiles, K steps of 32, 8 warps; tensor cores (wmma, fp32 accumulation) for
// 16-bit operands, fp32 FMAs otherwise.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/l1_scale.hpp"
#include "twblas/twblas.h"

namespace twblas::cuda {

/// What happens to each output value v at list position i, column j.
enum class GatherEpilogue : int {
    StoreGate,     // c[i * c_rs + j] = v in the gate type (rounded in DEFAULT mode)
    GateProduct,   // forward, gated: u = v; h = relu(g) * u written over g at c[c_rows[i] * c_rs + j]
    BackwardGrad,  // backward: (z, u in rz / ru, dh = v) -> dz, du, h at [i * ldr + j]
    ScatterRows,   // value type at c[c_rows[i] * c_rs + j * c_cs]
    StoreF32,      // fp32 at c[i * c_rs + j]
    AccumF32,      // fp32 added at c[i * c_rs + j]
};

/// C(i, j) = sum_k A(i, k) B(k, j). A(i, k) is at a + ai * a_ri + k * a_ck (ai = a_rows[i] when
/// gathering rows, else i); for k >= ksplit it comes from a2 at k - ksplit (B likewise, from b2
/// with its own row stride): [dZ | dU] x [Wg ; Wu] in one pass. The device count bounds the rows
/// (m_dev) or the reduction (k_dev) to list positions [first, count).
struct GatheredGemm {
    const void *a, *a2;
    bool a_f32, relu_a;  // relu_a: A is a plain FFN's raw gate; ReLU on load
    int64_t a_ri, a_ck;
    const int32_t *a_rows;
    const void *b, *b2;
    bool b_f32;
    int64_t b_rk, b2_rk, b_cj;
    const int32_t *b_rows;
    int64_t ksplit;
    int64_t m, n, k;  // m (m_dev) or k (k_dev) is the capacity: the device count caps it
    const uint32_t *dev_count;
    bool m_dev, k_dev;
    int64_t first;
    GatherEpilogue epi;
    void *c;
    int64_t c_rs, c_cs;
    bool c_f32;
    const int32_t *c_rows;
    void *rz, *ru, *rh;  // BackwardGrad
    int64_t ldr;
    bool gated, highest;
    L1Scale l1_scale;
    bool b_vec;  // set by the launcher: B rows K-contiguous, 16-bit, 16-byte aligned
};

/// Enqueues the GEMM; `value_type` is the FFN's (T of the kernels), `tensor_cores` picks wmma
/// (16-bit operands only), `sm_count` sizes the grid; with `pdl` its blocks start while the kernel
/// before it finishes (common/dependent_launch.cuh).
void launch_gathered_gemm(cudaStream_t stream, GatheredGemm g, twDataType_t value_type, bool tensor_cores, int sm_count,
                          bool pdl = false);

}  // namespace twblas::cuda
