// The fused gate+up GEMM of the dense_fused baseline (dense_fused_ffn.hpp): its operands and the
// launchers, which exist only in builds with sm_90a code (TWBLAS_TESTING_HAVE_SM90A). No CUTLASS
// here, so that the callers compile for every architecture of the build.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace twblas::testing::fused {

/// h (M x H) = relu(X Wg^T) * (X Wu^T), one GEMM of N = 2H over the interleaved weights
/// (interleave_gate_up): rows 16 b .. 16 b + 7 of `w` are Wg's rows 8 b .. 8 b + 7, the next eight
/// Wu's, so that every 16 output columns hold 8 units' z and u. All bf16, row-major.
struct GateUpRelu {
    const void *x;  // M x D
    int64_t ldx;
    const void *w;  // 2H x D, interleaved
    int64_t ldw;
    int64_t m, h, d;
    void *hidden;  // M x H
    int64_t ldh;
};

/// 128 x 256 tiles (two consumer warpgroups), clusters of two along M: large M.
void launch_wide(cudaStream_t stream, const GateUpRelu &g, int device, int sm_count);
/// 64 x 128 tiles, ping-pong consumers (one's epilogue under the other's mainloop): small M.
void launch_narrow(cudaStream_t stream, const GateUpRelu &g, int device, int sm_count);

}  // namespace twblas::testing::fused
