// Element-wise kernels of the dense baselines (what a user writes today around cuBLAS).
#include <cuda_bf16.h>

#include "baselines.hpp"

namespace twbench {

namespace {

/// h[i, j] = bf16(relu(g) * u) from gu = [g | u] (M x 2H, row-major), as PyTorch computes it
/// in bf16 (each op rounds).
__global__ void relu_mul_kernel(const __nv_bfloat16 *gu, int64_t m, int64_t h, __nv_bfloat16 *out) {
    const int64_t n = m * h;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t r = i / h, c = i % h;
        const float g = __bfloat162float(gu[r * 2 * h + c]);
        const float u = __bfloat162float(gu[r * 2 * h + h + c]);
        out[i] = __float2bfloat16_rn(g > 0.0f ? __bfloat162float(__float2bfloat16_rn(g)) * u : 0.0f);
    }
}

__global__ void relu_mul_backward_kernel(const __nv_bfloat16 *gu, const __nv_bfloat16 *dh, int64_t m, int64_t h,
                                         float l1_scale, __nv_bfloat16 *dgu) {
    const int64_t n = m * h;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t r = i / h, c = i % h;
        const float g = __bfloat162float(gu[r * 2 * h + c]);
        const float u = __bfloat162float(gu[r * 2 * h + h + c]);
        float dg = 0.0f, du = 0.0f;
        if (g > 0.0f) {
            const float hv = __bfloat162float(__float2bfloat16_rn(g * u));
            const float d = __bfloat162float(__float2bfloat16_rn(__bfloat162float(dh[i]) + l1_scale * ((hv > 0.0f) - (hv < 0.0f))));
            dg = d * u;
            du = d * g;
        }
        dgu[r * 2 * h + c] = __float2bfloat16_rn(dg);
        dgu[r * 2 * h + h + c] = __float2bfloat16_rn(du);
    }
}

__global__ void relu_kernel(__nv_bfloat16 *x, int64_t n) {
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        if (!(__bfloat162float(x[i]) > 0.0f)) x[i] = __float2bfloat16_rn(0.0f);
}

}  // namespace

void relu_mul(cudaStream_t stream, const void *gu, int64_t m, int64_t h, void *out) {
    relu_mul_kernel<<<1056, 256, 0, stream>>>(static_cast<const __nv_bfloat16 *>(gu), m, h,
                                              static_cast<__nv_bfloat16 *>(out));
}

void relu_mul_backward(cudaStream_t stream, const void *gu, const void *dh, int64_t m, int64_t h, float l1_scale,
                       void *dgu) {
    relu_mul_backward_kernel<<<1056, 256, 0, stream>>>(static_cast<const __nv_bfloat16 *>(gu),
                                                       static_cast<const __nv_bfloat16 *>(dh), m, h, l1_scale,
                                                       static_cast<__nv_bfloat16 *>(dgu));
}

void relu_inplace(cudaStream_t stream, void *x, int64_t n) {
    relu_kernel<<<1056, 256, 0, stream>>>(static_cast<__nv_bfloat16 *>(x), n);
}

}  // namespace twbench
