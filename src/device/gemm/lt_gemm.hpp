// Dense GEMMs through cuBLASLt, in the row-major terms of the rest of the library:
//   Z[M x N] = alpha * A[M x K] * B[N x K]^T, with A and B in either order and any ld.
// Plans (layouts + heuristic algorithm) are cached per shape in the object that owns the
// GemmRunner (an FFN, or a handle for the building blocks), so a compute call does no host-side
// search after its first use of a shape; the cache is bounded (least recently used out).
#pragma once

#include <cublasLt.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "host/objects.hpp"
#include "twblas/twblas.h"

namespace twblas::cuda {

struct GemmOperand {
    const void *ptr;
    int64_t rows, cols, ld;  // logical rows x cols
    twOrder_t order;
    twDataType_t type;
};
/// A dense descriptor as a GEMM operand.
inline GemmOperand gemm_operand(const twDnMatDescr &d) { return {d.values, d.rows, d.cols, d.ld, d.order, d.type}; }
/// The same memory read as the transposed matrix.
inline GemmOperand transposed(const GemmOperand &a) {
    return {a.ptr, a.cols, a.rows, a.ld, a.order == TW_ORDER_ROW ? TW_ORDER_COL : TW_ORDER_ROW, a.type};
}
struct GemmOutput {
    void *ptr;
    int64_t ld;  // row-major, ld >= N
    twDataType_t type;
};
/// A strided batch: `count` GEMMs, the i-th reading and writing each operand `stride` elements
/// further on (0: every GEMM shares it).
struct GemmBatch {
    int count = 1;
    int64_t a_stride = 0, b_stride = 0, z_stride = 0;
};
/// The SMs cuBLASLt's heuristic sizes the GEMM for (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET): fewer
/// than the GPU's leaves the rest to kernels running beside it. 0: all of them.
struct GemmSms {
    int target = 0;
};

class GemmRunner {
  public:
    /// cuBLASLt's workspace: part of each compute call's workspace.
    static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

    GemmRunner();
    ~GemmRunner();
    GemmRunner(const GemmRunner &) = delete;
    GemmRunner &operator=(const GemmRunner &) = delete;

    /// Enqueues Z = alpha * A * B^T on `stream` (each GEMM of `batch`). Accumulation is fp32 (true
    /// fp32 for fp32 data).
    void run(cudaStream_t stream, float alpha, const GemmOperand &a, const GemmOperand &b, const GemmOutput &z,
             void *workspace, size_t workspace_bytes, const GemmBatch &batch = {}, GemmSms sms = {});

  private:
    struct Plan;
    using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int, int, int, int, int64_t,
                           int64_t, int64_t, int>;
    Plan &plan_for(const GemmOperand &a, const GemmOperand &b, const GemmOutput &z, size_t workspace_bytes,
                   const GemmBatch &batch, GemmSms sms);
    cublasLtHandle_t lt_ = nullptr;
    std::mutex mutex_;
    struct Cached {
        std::unique_ptr<Plan> plan;
        uint64_t last_use;
    };
    static constexpr size_t kMaxPlans = 64;
    std::map<Key, Cached> plans_;
    uint64_t clock_ = 0;
};

}  // namespace twblas::cuda
