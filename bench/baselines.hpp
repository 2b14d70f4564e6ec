#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace twbench {
/// out (M x H) = relu(g) * u with gu = [g | u] (M x 2H), all bf16 row-major.
void relu_mul(cudaStream_t stream, const void *gu, int64_t m, int64_t h, void *out);
/// The dense backward's element-wise step: from gu = [g | u] and dh (M x H), with the L1 term
/// l1_scale * sign(h) added to dh on active units, dgu = [dh u relu'(g) | dh relu(g)] (M x 2H).
void relu_mul_backward(cudaStream_t stream, const void *gu, const void *dh, int64_t m, int64_t h, float l1_scale,
                       void *dgu);
/// x = relu(x), n bf16 values.
void relu_inplace(cudaStream_t stream, void *x, int64_t n);
}  // namespace twbench
