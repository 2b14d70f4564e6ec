#include "testing/cuda/dense_ffn.hpp"

#include <cuda_bf16.h>

#include <stdexcept>
#include <string>

namespace twblas::testing {

namespace {

void lt_check(cublasStatus_t s, const char *what) {
    if (s != CUBLAS_STATUS_SUCCESS)
        throw std::runtime_error(std::string("cuBLASLt ") + what + " failed (status " +
                                 std::to_string(static_cast<int>(s)) + ")");
}

size_t bf16_bytes(int64_t count) { return static_cast<size_t>(count) * sizeof(__nv_bfloat16); }

}  // namespace

// ---- LtGemm

// cuBLASLt is column-major. The row-major M x N output is the column-major N x M matrix
// Z^T = B * A^T, so cuBLASLt's first operand is B (N x K) and its second A^T (K x M).
struct LtGemm::Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t lb = nullptr, la = nullptr, lz = nullptr;
    cublasLtMatmulAlgo_t algo{};
    ~Plan() {
        if (op) cublasLtMatmulDescDestroy(op);
        if (lb) cublasLtMatrixLayoutDestroy(lb);
        if (la) cublasLtMatrixLayoutDestroy(la);
        if (lz) cublasLtMatrixLayoutDestroy(lz);
    }
};

LtGemm::LtGemm() { lt_check(cublasLtCreate(&lt_), "create"); }

LtGemm::~LtGemm() {
    plans_.clear();  // the descriptors go before the handle
    if (lt_) cublasLtDestroy(lt_);
}

LtGemm::Plan &LtGemm::plan_for(const GemmOperand &a, const GemmOperand &b, const GemmOutput &z,
                               size_t workspace_bytes) {
    const Key key = std::make_tuple(a.rows, b.rows, a.cols, a.ld, b.ld, z.ld, static_cast<int>(a.order),
                                    static_cast<int>(b.order), static_cast<int>(z.type), workspace_bytes);
    auto it = plans_.find(key);
    if (it != plans_.end()) return *it->second;

    auto plan = std::make_unique<Plan>();
    const int64_t m = a.rows, n = b.rows, k = a.cols;
    lt_check(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor");
    // B row-major N x K is column-major K x N: transposed; column-major B is N x K as it stands
    const cublasOperation_t op_b = b.order == Order::Row ? CUBLAS_OP_T : CUBLAS_OP_N;
    // A^T (K x M): row-major A is column-major K x M as it stands; column-major A is transposed
    const cublasOperation_t op_a = a.order == Order::Row ? CUBLAS_OP_N : CUBLAS_OP_T;
    lt_check(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof(op_b)), "TRANSA");
    lt_check(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_a, sizeof(op_a)), "TRANSB");
    lt_check(cublasLtMatrixLayoutCreate(&plan->lb, CUDA_R_16BF, b.order == Order::Row ? k : n,
                                        b.order == Order::Row ? n : k, b.ld),
             "layout of B");
    lt_check(cublasLtMatrixLayoutCreate(&plan->la, CUDA_R_16BF, a.order == Order::Row ? k : m,
                                        a.order == Order::Row ? m : k, a.ld),
             "layout of A");
    lt_check(cublasLtMatrixLayoutCreate(&plan->lz, z.type == OutputType::Fp32 ? CUDA_R_32F : CUDA_R_16BF, n, m, z.ld),
             "layout of Z");

    cublasLtMatmulPreference_t pref = nullptr;
    lt_check(cublasLtMatmulPreferenceCreate(&pref), "preference");
    const uint64_t ws = workspace_bytes;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t s =
        cublasLtMatmulAlgoGetHeuristic(lt_, plan->op, plan->lb, plan->la, plan->lz, plan->lz, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (s != CUBLAS_STATUS_SUCCESS || found == 0)
        throw std::runtime_error("cuBLASLt has no algorithm for a " + std::to_string(m) + " x " + std::to_string(n) +
                                 " x " + std::to_string(k) + " GEMM with these layouts");
    plan->algo = result.algo;
    return *plans_.emplace(key, std::move(plan)).first->second;
}

void LtGemm::run(cudaStream_t stream, const GemmOperand &a, const GemmOperand &b, const GemmOutput &z, void *workspace,
                 size_t workspace_bytes) {
    if (a.rows == 0 || b.rows == 0) return;
    if (a.cols == 0) {  // an empty sum: Z = 0 (cuBLASLt wants K >= 1)
        const size_t elem = z.type == OutputType::Fp32 ? 4 : 2;
        cuda_check(cudaMemsetAsync(z.ptr, 0, static_cast<size_t>(a.rows * z.ld) * elem, stream),
                   "cudaMemsetAsync (K = 0)");
        return;
    }
    Plan &p = plan_for(a, b, z, workspace_bytes);
    const float alpha = 1.0f, beta = 0.0f;
    lt_check(cublasLtMatmul(lt_, p.op, &alpha, b.ptr, p.lb, a.ptr, p.la, &beta, z.ptr, p.lz, z.ptr, p.lz, &p.algo,
                            workspace, workspace_bytes, stream),
             "matmul");
}

// ---- element-wise kernels: grid-stride loops over 1056 blocks (8 per SM of an H100)

namespace {

constexpr int kBlocks = 1056, kThreads = 256;

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
            const float sign = static_cast<float>((hv > 0.0f) - (hv < 0.0f));
            const float d = __bfloat162float(__float2bfloat16_rn(__bfloat162float(dh[i]) + l1_scale * sign));
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
        if (!(__bfloat162float(x[i]) > 0.0f)) x[i] = __float2bfloat16_rn(0.0f);  // NaN -> 0 too
}

}  // namespace

void relu_mul(cudaStream_t stream, const void *gu, int64_t m, int64_t h, void *out) {
    relu_mul_kernel<<<kBlocks, kThreads, 0, stream>>>(static_cast<const __nv_bfloat16 *>(gu), m, h,
                                                      static_cast<__nv_bfloat16 *>(out));
    cuda_check(cudaGetLastError(), "relu_mul launch");
}

void relu_mul_backward(cudaStream_t stream, const void *gu, const void *dh, int64_t m, int64_t h, float l1_scale,
                       void *dgu) {
    relu_mul_backward_kernel<<<kBlocks, kThreads, 0, stream>>>(static_cast<const __nv_bfloat16 *>(gu),
                                                               static_cast<const __nv_bfloat16 *>(dh), m, h, l1_scale,
                                                               static_cast<__nv_bfloat16 *>(dgu));
    cuda_check(cudaGetLastError(), "relu_mul_backward launch");
}

void relu_inplace(cudaStream_t stream, void *x, int64_t n) {
    relu_kernel<<<kBlocks, kThreads, 0, stream>>>(static_cast<__nv_bfloat16 *>(x), n);
    cuda_check(cudaGetLastError(), "relu launch");
}

// ---- DenseFfn

DenseFfn::DenseFfn(const DenseFfnShape &shape)
    : shape_(shape),
      workspace_(LtGemm::kWorkspaceBytes),
      gate_up_(shape.gated ? bf16_bytes(shape.max_tokens * 2 * shape.hidden_dim) : 0),
      hidden_(bf16_bytes(shape.max_tokens * shape.hidden_dim)) {
    if (shape.training) {
        if (!shape.gated) throw std::runtime_error("DenseFfn: the training step is for the gated FFN only");
        dhidden_ = std::make_unique<DeviceMemory>(bf16_bytes(shape.max_tokens * shape.hidden_dim));
        dgate_up_ = std::make_unique<DeviceMemory>(bf16_bytes(shape.max_tokens * 2 * shape.hidden_dim));
    }
}

void DenseFfn::run_gemm(cudaStream_t stream, const GemmOperand &a, const GemmOperand &b, void *z, int64_t ldz) {
    gemm_.run(stream, a, b, GemmOutput{z, ldz}, workspace_.get(), workspace_.bytes());
}

void DenseFfn::compute_hidden(cudaStream_t stream, const void *x, const DenseFfnWeights &w, int64_t m) {
    if (m > shape_.max_tokens) throw std::runtime_error("DenseFfn: more tokens than max_tokens");
    const int64_t d = shape_.model_dim, h = shape_.hidden_dim;
    if (shape_.gated) {
        // [g | u] = X [Wg; Wu]^T in one GEMM, then one element-wise pass
        run_gemm(stream, {x, m, d, d}, {w.gate_up, 2 * h, d, d}, gate_up_.get(), 2 * h);
        relu_mul(stream, gate_up_.get(), m, h, hidden_.get());
    } else {
        run_gemm(stream, {x, m, d, d}, {w.gate_up, h, d, d}, hidden_.get(), h);
        relu_inplace(stream, hidden_.get(), m * h);
    }
}

void DenseFfn::forward(cudaStream_t stream, const void *x, const DenseFfnWeights &w, int64_t m, void *y) {
    compute_hidden(stream, x, w, m);
    const int64_t d = shape_.model_dim, h = shape_.hidden_dim;
    run_gemm(stream, {hidden_.get(), m, h, h}, {w.down, d, h, h}, y, d);
}

void DenseFfn::train_step(cudaStream_t stream, const void *x, const DenseFfnWeights &w, const void *dy, int64_t m,
                          float l1_coeff, void *y, const DenseFfnGrads &grads) {
    if (!shape_.training) throw std::runtime_error("DenseFfn: train_step needs DenseFfnShape::training");
    const int64_t d = shape_.model_dim, h = shape_.hidden_dim;
    forward(stream, x, w, m, y);
    run_gemm(stream, {dy, m, d, d}, {w.down_rows, h, d, d}, dhidden_->get(), h);
    relu_mul_backward(stream, gate_up_.get(), dhidden_->get(), m, h, m > 0 ? l1_coeff / static_cast<float>(m) : 0.0f,
                      dgate_up_->get());
    // dX = dGU [Wg; Wu]: B = [Wg; Wu]^T (D x 2H) is the column-major view of the 2H x D weights
    run_gemm(stream, {dgate_up_->get(), m, 2 * h, 2 * h}, {w.gate_up, d, 2 * h, d, Order::Col}, grads.dx, d);
    // [dWg; dWu] = dGU^T X and dWd = H^T dY: column-major views of the M-row matrices
    run_gemm(stream, {dgate_up_->get(), 2 * h, m, 2 * h, Order::Col}, {x, d, m, d, Order::Col}, grads.dw_gate_up, d);
    run_gemm(stream, {hidden_.get(), h, m, h, Order::Col}, {dy, d, m, d, Order::Col}, grads.dw_down, d);
}

}  // namespace twblas::testing
