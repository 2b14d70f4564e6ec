// Dispatch on the run-time value type: f(tag) with a value of the matching C++ type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "twblas/twblas.h"

namespace twblas::cuda {

template <class F> void by_type(twDataType_t t, F &&f) {
    switch (t) {
        case TW_R_16BF: f(__nv_bfloat16{}); break;
        case TW_R_16F: f(__half{}); break;
        default: f(float{}); break;
    }
}

/// by_type for code that exists for the 16-bit types only (tensor cores, cuBLAS paths).
template <class F> void by_16bit_type(twDataType_t t, F &&f) {
    by_type(t, [&](auto tag) {
        if constexpr (!std::is_same_v<decltype(tag), float>) f(tag);
    });
}

}  // namespace twblas::cuda
