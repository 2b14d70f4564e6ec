// The per-unit arithmetic of the backward, as the reference computes it: shared by the token
// kernels, the recompute GEMM's epilogue and the cuBLAS recompute.
#pragma once

#include "common/l1_scale.hpp"
#include "common/values.cuh"

namespace twblas::cuda {

/// The gradients of one active unit of one token, as the reference computes them: dh from its
/// dot product (with the L1 term), then du = dh g and dz = dh u (gated) or dz = dh (plain).
struct UnitGrad {
    float h, dz, du;
};
template <class T> __device__ inline UnitGrad unit_grad(float g, float u, float dot, bool gated, bool highest, float l1_scale) {
    auto r = [&](float v) { return highest ? v : round_to<T>(v); };
    UnitGrad out;
    out.h = gated ? r(g * u) : g;
    const float sign = static_cast<float>((out.h > 0.0f) - (out.h < 0.0f));
    const float dh = r(r(dot) + l1_scale * sign);
    out.du = gated ? r(dh * g) : 0.0f;
    out.dz = gated ? r(dh * u) : dh;
    return out;
}

}  // namespace twblas::cuda
