// The backward's l1Coeff / M as its kernels see it: the call's value, or l1Coeff read from device
// memory when a kernel runs (TW_FFN_ATTR_L1_COEFF_POINTER), so that a framework's l1 gradient,
// which lives on the device, needs no read-back per layer. Both divide in float (IEEE, as the
// host does), so the same l1Coeff gives the same bits either way.
#pragma once

#include <cuda_runtime.h>

namespace twblas::cuda {

struct L1Scale {
    float value = 0.0f;            // l1Coeff / M, used when coeff is NULL
    const float *coeff = nullptr;  // l1Coeff in device memory, or NULL
    float m = 1.0f;                // M
#ifdef __CUDACC__
    __device__ float get() const { return coeff ? __ldg(coeff) / m : value; }
#endif
};

}  // namespace twblas::cuda
