// The dense cuBLAS FFN that twblas is measured and checked against: what a user writes today
// with the public CUDA libraries (cuBLASLt and one element-wise kernel), shared by the benchmark
// and the demo. It uses no part of the twblas library, so that the baseline cannot inherit a
// change made to the library it is compared with.
//
// All matrices are bf16 on the device; "row-major M x N" means element (i, j) at ptr[i * ld + j].
// Failures throw std::runtime_error.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "testing/cuda/device_memory.hpp"

namespace twblas::testing {

// ---- GEMM: Z[M x N] = A[M x K] * B[N x K]^T through cuBLASLt

enum class Order { Row, Col };
enum class OutputType { Bf16, Fp32 };

/// A logical rows x cols bf16 matrix, stored in `order` with leading dimension `ld`.
struct GemmOperand {
    const void *ptr;
    int64_t rows, cols, ld;
    Order order = Order::Row;
};
/// The row-major M x N output.
struct GemmOutput {
    void *ptr;
    int64_t ld;
    OutputType type = OutputType::Bf16;
};

/// Row-major GEMMs over cuBLASLt's public API, fp32 accumulation. The plan (layouts and the
/// heuristic's algorithm) is cached per shape, so repeated calls, and calls under stream
/// capture, do no host-side search. Not thread-safe: one runner per thread.
class LtGemm {
  public:
    /// The workspace size the runner is tuned for; callers pass at least this much.
    static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

    LtGemm();
    ~LtGemm();
    LtGemm(const LtGemm &) = delete;
    LtGemm &operator=(const LtGemm &) = delete;

    /// Enqueues Z = A * B^T on `stream`: A is M x K, B is N x K, Z is row-major M x N.
    void run(cudaStream_t stream, const GemmOperand &a, const GemmOperand &b, const GemmOutput &z, void *workspace,
             size_t workspace_bytes);

  private:
    struct Plan;
    using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int, size_t>;
    Plan &plan_for(const GemmOperand &a, const GemmOperand &b, const GemmOutput &z, size_t workspace_bytes);
    cublasLtHandle_t lt_ = nullptr;
    std::map<Key, std::unique_ptr<Plan>> plans_;
};

// ---- element-wise kernels (bf16, rounding after each op as PyTorch does in bf16)

/// out (M x H) = relu(g) * u, with gu = [g | u] (M x 2H).
void relu_mul(cudaStream_t stream, const void *gu, int64_t m, int64_t h, void *out);
/// The backward of relu_mul with the L1 term: d = dh + l1_scale * sign(h) on active units,
/// dgu = [d * u * relu'(g) | d * relu(g)] (M x 2H), from gu = [g | u] and dh (M x H).
void relu_mul_backward(cudaStream_t stream, const void *gu, const void *dh, int64_t m, int64_t h, float l1_scale,
                       void *dgu);
/// x = relu(x), n values.
void relu_inplace(cudaStream_t stream, void *x, int64_t n);

// ---- the dense FFN

struct DenseFfnShape {
    int64_t model_dim = 0;   // D
    int64_t hidden_dim = 0;  // H
    int64_t max_tokens = 0;  // the largest M of any call: sizes the intermediates
    bool gated = true;       // gated ReLU ([Wg; Wu] in one GEMM, relu(g) * u) or plain ReLU (Wu, relu)
    bool training = false;   // also hold the backward's intermediates (train_step; gated only)
};

struct DenseFfnWeights {
    const void *gate_up = nullptr;    // gated: [Wg; Wu] (2H x D row-major); plain: Wu (H x D)
    const void *down = nullptr;       // Wd as nn.Linear's down_proj.weight: D x H row-major
    const void *down_rows = nullptr;  // Wd as H x D row-major: only train_step reads it (dH = dY Wd^T)
};

/// The training step's outputs, row-major: dX (M x D), [dWg; dWu] (2H x D), dWd (H x D).
struct DenseFfnGrads {
    void *dx = nullptr;
    void *dw_gate_up = nullptr;
    void *dw_down = nullptr;
};

/// Y = (relu(X Wg^T) * X Wu^T) Wd (or relu(X Wu^T) Wd), and its training step, as dense
/// cuBLASLt GEMMs. Owns its intermediates, its GEMM runner and the runner's workspace, so a call
/// only enqueues work on `stream` (no allocation, no synchronisation) and can be captured.
class DenseFfn {
  public:
    explicit DenseFfn(const DenseFfnShape &shape);

    /// The hidden activations h (M x H) into hidden(): the gate+up GEMM, then relu_mul.
    void compute_hidden(cudaStream_t stream, const void *x, const DenseFfnWeights &w, int64_t m);
    /// y (M x D, row-major) from x (M x D): compute_hidden, then the down GEMM.
    void forward(cudaStream_t stream, const void *x, const DenseFfnWeights &w, int64_t m, void *y);
    /// The dense training step: forward (keeping [g | u] and h), dH = dY Wd^T, relu_mul_backward
    /// with the L1 term l1_coeff / M * sign(h) (twSpGEMMFusedBackward's definition),
    /// dX = dGU [Wg; Wu], [dWg; dWu] = dGU^T X, dWd = H^T dY: nine GEMMs' worth of flops.
    void train_step(cudaStream_t stream, const void *x, const DenseFfnWeights &w, const void *dy, int64_t m,
                    float l1_coeff, void *y, const DenseFfnGrads &grads);

    /// h (M x H, row-major) of the last call.
    void *hidden() const { return hidden_.get(); }

  private:
    DenseFfnShape shape_;
    LtGemm gemm_;
    DeviceMemory workspace_, gate_up_, hidden_;
    std::unique_ptr<DeviceMemory> dhidden_, dgate_up_;  // training only
    void run_gemm(cudaStream_t stream, const GemmOperand &a, const GemmOperand &b, void *z, int64_t ldz);
};

}  // namespace twblas::testing
