#include "gemm/lt_gemm.hpp"

#include <cuda_runtime.h>

#include "host/error.hpp"

namespace twblas::cuda {

namespace {

void check_lt(cublasStatus_t s, const char *what) {
    if (s != CUBLAS_STATUS_SUCCESS)
        fail(s == CUBLAS_STATUS_NOT_SUPPORTED ? TW_STATUS_NOT_SUPPORTED : TW_STATUS_EXECUTION_FAILED,
             "cuBLASLt %s failed (status %d)", what, static_cast<int>(s));
}

cudaDataType_t cuda_type(twDataType_t t) {
    switch (t) {
        case TW_R_16BF: return CUDA_R_16BF;
        case TW_R_16F: return CUDA_R_16F;
        default: return CUDA_R_32F;
    }
}

}  // namespace

// cuBLASLt is column-major. A row-major M x N output is a column-major N x M matrix, so we ask
// for Z^T = B * A^T: the first operand is B (N x K), the second A^T (K x M).
struct GemmRunner::Plan {
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

GemmRunner::GemmRunner() { check_lt(cublasLtCreate(&lt_), "create"); }
GemmRunner::~GemmRunner() {
    plans_.clear();
    if (lt_) cublasLtDestroy(lt_);
}

GemmRunner::Plan &GemmRunner::plan_for(const GemmOperand &a, const GemmOperand &b, const GemmOutput &z,
                                       size_t workspace_bytes, const GemmBatch &batch, GemmSms sms) {
    const Key key{a.rows, b.rows, a.cols, a.ld, b.ld, z.ld, a.order, b.order, a.type, z.type,
                  static_cast<int>(workspace_bytes >> 20), batch.count, batch.a_stride, batch.b_stride,
                  batch.z_stride, sms.target};
    auto it = plans_.find(key);
    if (it != plans_.end()) {
        it->second.last_use = ++clock_;
        return *it->second.plan;
    }
    if (plans_.size() >= kMaxPlans) {  // a plan is host state only: enqueued GEMMs keep working
        auto oldest = plans_.begin();
        for (auto i = plans_.begin(); i != plans_.end(); ++i)
            if (i->second.last_use < oldest->second.last_use) oldest = i;
        plans_.erase(oldest);
    }

    auto plan = std::make_unique<Plan>();
    const int64_t m = a.rows, n = b.rows, k = a.cols;
    const cublasComputeType_t compute = CUBLAS_COMPUTE_32F;  // true fp32 for fp32 data (no TF32)
    check_lt(cublasLtMatmulDescCreate(&plan->op, compute, CUDA_R_32F), "matmul desc");
    // first operand B: row-major N x K is column-major K x N (needs T); column-major is N x K
    const cublasOperation_t tb = b.order == TW_ORDER_ROW ? CUBLAS_OP_T : CUBLAS_OP_N;
    // second operand A^T (K x M): row-major A is column-major K x M (N); column-major A needs T
    const cublasOperation_t ta = a.order == TW_ORDER_ROW ? CUBLAS_OP_N : CUBLAS_OP_T;
    check_lt(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &tb, sizeof(tb)), "transa");
    check_lt(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &ta, sizeof(ta)), "transb");
    if (sms.target > 0) {
        const int32_t target = sms.target;
        check_lt(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &target, sizeof(target)),
                 "SM count target");
    }
    check_lt(cublasLtMatrixLayoutCreate(&plan->lb, cuda_type(b.type), b.order == TW_ORDER_ROW ? k : n,
                                        b.order == TW_ORDER_ROW ? n : k, b.ld),
             "layout B");
    check_lt(cublasLtMatrixLayoutCreate(&plan->la, cuda_type(a.type), a.order == TW_ORDER_ROW ? k : m,
                                        a.order == TW_ORDER_ROW ? m : k, a.ld),
             "layout A");
    check_lt(cublasLtMatrixLayoutCreate(&plan->lz, cuda_type(z.type), n, m, z.ld), "layout Z");
    if (batch.count > 1) {
        const auto batched = [&](cublasLtMatrixLayout_t l, int64_t stride) {
            check_lt(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch.count,
                                                      sizeof(batch.count)),
                     "batch count");
            check_lt(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                      sizeof(stride)),
                     "batch stride");
        };
        batched(plan->lb, batch.b_stride);
        batched(plan->la, batch.a_stride);
        batched(plan->lz, batch.z_stride);
    }

    cublasLtMatmulPreference_t pref = nullptr;
    check_lt(cublasLtMatmulPreferenceCreate(&pref), "preference");
    uint64_t ws = workspace_bytes;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    // split-K parts are added in fp32 only: the INPLACE and OUTPUT_TYPE schemes add them in the
    // output's 16-bit type, a rounding the library's numerics do not have
    const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof(schemes));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt_, plan->op, plan->lb, plan->la, plan->lz, plan->lz,
                                                             pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (hs != CUBLAS_STATUS_SUCCESS || found == 0)
        fail(TW_STATUS_NOT_SUPPORTED, "cuBLASLt has no algorithm for a %lld x %lld x %lld GEMM with these layouts",
             static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k));
    plan->algo = result.algo;
    return *plans_.emplace(key, Cached{std::move(plan), ++clock_}).first->second.plan;
}

void GemmRunner::run(cudaStream_t stream, float alpha, const GemmOperand &a, const GemmOperand &b,
                     const GemmOutput &z, void *workspace, size_t workspace_bytes, const GemmBatch &batch,
                     GemmSms sms) {
    if (a.rows == 0 || b.rows == 0) return;
    if (a.cols == 0) {  // empty sum: Z = 0 (cuBLASLt wants K >= 1)
        const size_t eb = z.type == TW_R_32F ? 4 : 2;
        for (int i = 0; i < batch.count; ++i)
            if (cudaMemsetAsync(static_cast<char *>(z.ptr) + i * batch.z_stride * static_cast<int64_t>(eb), 0,
                                static_cast<size_t>(a.rows * z.ld) * eb, stream) != cudaSuccess)
                fail(TW_STATUS_EXECUTION_FAILED, "cudaMemsetAsync of a K = 0 GEMM output failed");
        return;
    }
    std::lock_guard<std::mutex> lock(mutex_);  // held while the plan is used: eviction cannot free it
    Plan &p = plan_for(a, b, z, workspace_bytes, batch, sms);
    const float beta = 0.0f;
    check_lt(cublasLtMatmul(lt_, p.op, &alpha, b.ptr, p.lb, a.ptr, p.la, &beta, z.ptr, p.lz, z.ptr, p.lz, &p.algo,
                            workspace, workspace_bytes, stream),
             "matmul");
}

}  // namespace twblas::cuda
