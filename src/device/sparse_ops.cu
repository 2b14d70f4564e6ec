// The building blocks' launchers: the dense -> sparse writer (DenseToSparse, GemmToSparse, the
// FFN's hidden output) and SpMM.
#include "sparse_ops.hpp"

#include <algorithm>

#include "common/pointer_check.hpp"
#include "common/workspace.hpp"
#include "gemm/masked_gate_gemm.hpp"
#include "plan/forward_plan.hpp"
#include "kernels/sparse_containers.cuh"

namespace twblas::cuda {

namespace {

struct GemmScratch {
    void *lt, *z;
    int32_t *flags;
    size_t total;
};
GemmScratch carve_gemm_scratch(const twDnMatDescr &a, const twDnMatDescr &b, const twSpMatDescr &c, void *ws) {
    WorkspaceCarver carve(ws);
    GemmScratch s{};
    s.lt = carve.take<char>(GemmRunner::kWorkspaceBytes);
    // the fp32 GEMM output; or the masked gate GEMM's 16-bit output and its active-unit words
    // (2 M ldz + 4 M ceil(N / 32) bytes: never more)
    s.z = carve.take<float>(static_cast<size_t>(a.rows * std::max<int64_t>(1, (b.rows + 7) / 8 * 8)));
    s.flags = carve.take<int32_t>(sparse_writer_workspace(c) / 4 + 1);
    s.total = carve.used();
    return s;
}

}  // namespace

size_t gemm_to_sparse_workspace(const twDnMatDescr &a, const twDnMatDescr &b, const twSpMatDescr &c) {
    return carve_gemm_scratch(a, b, c, nullptr).total;
}

namespace {

/// The masked gate GEMM's operands for C = relu(A B^T), when it takes them: RELU, alpha 1, A and
/// B row-major of one 16-bit type, C of that type, on 16 bytes (TMA). Its output goes where the
/// fp32 GEMM output would: the 16-bit values (active ones only), then the active-unit words.
bool masked_operands(const DeviceInfo &dev, float alpha, const twDnMatDescr &a, const twDnMatDescr &b,
                     const twSpMatDescr &c, twConvertOp_t act, const GemmScratch &s, int64_t ldz, MaskedGateGemm &g) {
    if (!dev.masked_gate || act != TW_CONVERT_RELU || alpha != 1.0f || a.order != TW_ORDER_ROW ||
        b.order != TW_ORDER_ROW || a.type != b.type || c.type != a.type || a.rows == 0 || b.rows == 0)
        return false;
    auto *masks = reinterpret_cast<uint32_t *>(static_cast<uint8_t *>(s.z) + static_cast<size_t>(a.rows * ldz) * 2);
    g = {a.values, a.ld, b.values, b.ld, a.rows, b.rows, a.cols, s.z, ldz, masks, (b.rows + 31) / 32};
    return masked_gate_gemm_fits(a.type, g);
}

}  // namespace

void gemm_to_sparse(cudaStream_t stream, GemmRunner &gemm, const DeviceInfo &dev, float alpha, const twDnMatDescr &a,
                    const twDnMatDescr &b, const twSpMatDescr &c, twConvertOp_t act, void *workspace) {
    require_device_accessible(a.values, "A");
    require_device_accessible(b.values, "B");
    require_device_accessible(c.buffer, "C");
    require_device_accessible(workspace, "workspace");
    const GemmScratch s = carve_gemm_scratch(a, b, c, workspace);
    const int64_t ldz = std::max<int64_t>(1, (b.rows + 7) / 8 * 8);
    MaskedGateGemm g{};
    if (masked_operands(dev, alpha, a, b, c, act, s, ldz, g)) {
        // the writer reads the active values only (the others were never written)
        launch_masked_gate_gemm(stream, a.type, g, masked_gate_tile_n(a.rows, b.rows, dev.sm_count), dev.device,
                                dev.sm_count);
        write_sparse(stream, {s.z, a.rows, b.rows, ldz, 1, a.type}, act, c, s.flags, {g.masks, g.words});
        return;
    }
    gemm.run(stream, alpha, gemm_operand(a), gemm_operand(b),
             {s.z, ldz, TW_R_32F}, s.lt, GemmRunner::kWorkspaceBytes);
    const MatrixArg z{s.z, a.rows, b.rows, ldz, 1, TW_R_32F};
    write_sparse(stream, z, act, c, s.flags);
}

size_t sparse_writer_workspace(const twSpMatDescr &out) { return static_cast<size_t>(out.rows) * 4 + 256; }

void write_sparse(cudaStream_t stream, const MatrixArg &in, twConvertOp_t op, const twSpMatDescr &out,
                  void *workspace, const ActiveMask &mask, int32_t *published) {
    if (out.rows == 0) return write_empty(stream, out);
    const ContainerArgs args = container_args(out);
    auto *flags = static_cast<int32_t *>(workspace);
    const int warps_per_block = 4;
    const int blocks = ceil_div(out.rows, warps_per_block);
    const bool twell = out.format == TW_FORMAT_TWELL;
    const bool vec = dense_rows_vectorizable(in, out.type);
    if (twell && mask.words && vec)
        write_twell_rows_masked<<<blocks, 32 * warps_per_block, 0, stream>>>(in, mask, op, args, flags);
    else if (twell && vec)
        write_twell_rows16<<<blocks, 32 * warps_per_block, 0, stream>>>(in, op, args, flags);
    else if (twell)
        write_twell_rows<<<blocks, 32 * warps_per_block, 0, stream>>>(in, mask, op, args, vec, flags);
    else if (vec && !mask.words)
        write_hybrid_rows16<<<blocks, 32 * warps_per_block, 0, stream>>>(in, op, args, flags);
    else
        write_hybrid_rows<<<blocks, 32 * warps_per_block, 0, stream>>>(in, mask, op, args, vec, flags);
    check_launch("write_sparse rows");
    assign_overflow_slots(stream, flags, out, published);
    if (!twell) {
        write_hybrid_backup<<<static_cast<unsigned>(out.rows), 256, 0, stream>>>(in, mask, op, args, flags);
        check_launch("write_hybrid_backup");
    }
}

void write_empty(cudaStream_t stream, const twSpMatDescr &out) {
    check(cudaMemsetAsync(static_cast<uint8_t *>(out.buffer) + overflow_count_offset(out), 0, 4, stream), "cudaMemsetAsync");
}

void assign_overflow_slots(cudaStream_t stream, int32_t *flags, const twSpMatDescr &out, int32_t *published) {
    assign_flagged_rows<<<1, kScanThreads, 0, stream>>>(flags, out.rows, container_args(out),
                                                        out.format == TW_FORMAT_TWELL, published);
    check_launch("assign_flagged_rows");
}

void spmm(cudaStream_t stream, float alpha, const twSpMatDescr &s, const MatrixArg &w, float beta,
          const MatrixArg &y) {
    if (y.rows == 0 || y.cols == 0) return;
    require_device_accessible(s.buffer, "S");
    require_device_accessible(w.ptr, "W");
    require_device_accessible(y.ptr, "Y");
    spmm_rows<<<static_cast<unsigned>(y.rows), kSpmmThreads, 0, stream>>>(alpha, container_args(s),
                                                                         s.format == TW_FORMAT_TWELL, w, beta, y);
    check_launch("spmm_rows");
}

}  // namespace twblas::cuda
