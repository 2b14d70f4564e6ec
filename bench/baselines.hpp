#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace twbench {
/// out (M x H) = relu(g) * u with gu = [g | u] (M x 2H), all bf16 row-major.
void relu_mul(cudaStream_t stream, const void *gu, int64_t m, int64_t h, void *out);
/// x = relu(x), n bf16 values.
void relu_inplace(cudaStream_t stream, void *x, int64_t n);
}  // namespace twbench
