// The dense FFN as tuned inference engines run it, a stronger baseline than dense_ffn.hpp's:
// gate and up as ONE GEMM (N = 2H) over weights interleaved so that each output tile holds the
// matching z and u columns, with ReLU(z) * u formed in the GEMM's epilogue (only h, M x H, is
// written: no [g | u] round trip through memory, no element-wise pass), then the down GEMM
// through cuBLASLt. The fused GEMM is a CUTLASS sm_90a kernel (gate_up_relu_gemm.cuh), so it runs
// on compute capability 9.0 GPUs (H100, H200) only: dense_fused_unsupported says why not.
// Like dense_ffn.hpp it uses no part of the twblas library. All matrices bf16, row-major.
//
// Against the cuBLAS baseline (DenseFfn) on an H200, paper's shape (D 2048, H 5632), graph replay:
// 1.03x at 512 tokens, 1.12x at 1024, 1.20x at 4096 and 16384, 1.10x at 65536; at 1 and 8 tokens
// it trails (0.92x, 0.95x: one 64 x 128 tile per 128 weight rows, 88 CTAs stream the weights, no
// split-K). At Llama-3-8B's shape (4096 x 14336) it only ties at 16384 tokens (tile order and
// swizzle are CUTLASS's defaults, not tuned).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "testing/cuda/dense_ffn.hpp"
#include "testing/cuda/device_memory.hpp"

namespace twblas::testing {

/// Empty when DenseFusedFfn runs here with model dimension D and hidden dimension H; otherwise
/// why not (this build holds no sm_90a code, the current GPU is not sm_90, or D or H is not a
/// multiple of 8).
std::string dense_fused_unsupported(int64_t model_dim, int64_t hidden_dim);

/// The weights DenseFusedFfn reads as gate+up (2H x D) from [Wg; Wu] (2H x D): rows 16 b .. 16 b + 7
/// are Wg's rows 8 b .. 8 b + 7 and the next eight Wu's (H a multiple of 8). Enqueued on `stream`.
void interleave_gate_up(cudaStream_t stream, const void *gate_up, int64_t hidden_dim, int64_t model_dim, void *out);

/// The fused GEMM's tile: Auto picks by M (wide tiles from kWideMinTokens tokens).
enum class FusedTile { Auto, Wide, Narrow };

struct DenseFusedWeights {
    const void *gate_up_interleaved = nullptr;  // interleave_gate_up's output (2H x D)
    const void *down = nullptr;                 // Wd as nn.Linear's down_proj.weight: D x H
};

/// Y = (relu(X Wg^T) * X Wu^T) Wd in two launches. Owns h, the cuBLASLt runner and its workspace,
/// so a call only enqueues work (no allocation, no synchronisation) and can be captured.
class DenseFusedFfn {
  public:
    /// From this many tokens the 128 x 256 tiles; below, 64 x 128 tiles keep more SMs busy (H200,
    /// paper's shape: narrow 66 / 117 us at 512 / 1024 tokens, wide 69 / 107).
    static constexpr int64_t kWideMinTokens = 1024;

    /// Throws std::runtime_error where dense_fused_unsupported is not empty, or for a shape that
    /// is not gated or is for training.
    explicit DenseFusedFfn(const DenseFfnShape &shape, FusedTile tile = FusedTile::Auto);

    /// h (M x H) into hidden(): the fused gate+up GEMM.
    void compute_hidden(cudaStream_t stream, const void *x, const void *gate_up_interleaved, int64_t m);
    /// y (M x D) from x (M x D): compute_hidden, then the down GEMM.
    void forward(cudaStream_t stream, const void *x, const DenseFusedWeights &w, int64_t m, void *y);

    /// Whether a call with M tokens takes the wide tiles.
    bool wide_tiles(int64_t m) const { return tile_ == FusedTile::Wide || (tile_ == FusedTile::Auto && m >= kWideMinTokens); }
    void *hidden() const { return hidden_.get(); }

  private:
    DenseFfnShape shape_;
    FusedTile tile_;
    int device_ = 0, sm_count_ = 0;
    LtGemm gemm_;
    DeviceMemory workspace_, hidden_;
};

}  // namespace twblas::testing
