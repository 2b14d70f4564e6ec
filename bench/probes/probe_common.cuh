// What the standalone probes share: CUDA error checks that end the probe, and the bf16 dot
// product of two 16-byte chunks. Probes include it from their own folder (nvcc finds it next
// to them), so each still builds with one nvcc line.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                                                       \
    do {                                                                                               \
        cudaError_t e_ = (x);                                                                          \
        if (e_ != cudaSuccess) {                                                                       \
            std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));            \
            std::exit(1);                                                                              \
        }                                                                                              \
    } while (0)

using bf16 = __nv_bfloat16;

/// acc + the dot product of eight bf16 values in `w` with eight in `x`, in element order.
__device__ inline float dot8(uint4 w, uint4 x, float acc) {
    const bf16 *a = reinterpret_cast<const bf16 *>(&w), *b = reinterpret_cast<const bf16 *>(&x);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc = fmaf(__bfloat162float(a[e]), __bfloat162float(b[e]), acc);
    return acc;
}

/// A device copy of `v` (at least one element's memory), never freed: probes exit.
template <class T> T *upload(const std::vector<T> &v) {
    T *p = nullptr;
    CHECK(cudaMalloc(&p, std::max<size_t>(1, v.size()) * sizeof(T)));
    CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return p;
}
