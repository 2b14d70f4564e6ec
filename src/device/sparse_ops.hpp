// Launchers of the building blocks on sparse containers (compute calls: they enqueue on the given
// stream, never allocate, never synchronise).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "common/device_info.hpp"
#include "common/matrix_arg.hpp"
#include "gemm/lt_gemm.hpp"
#include "host/objects.hpp"

namespace twblas::cuda {

/// Workspace of write_sparse: one flag per row.
size_t sparse_writer_workspace(const twSpMatDescr &out);
/// Writes `in` (op RELU keeps > 0 and NaN; PLAIN keeps every pattern but +0) into `out`,
/// rounding to its value type when the types differ, with the overflow record / backup slots
/// assigned in ascending row order (deterministic). Under an active mask only the masked entries
/// are read; the others count as +0.
/// `published` (or null): host memory that also gets the container's overflow count (a setup
/// call's status without a copy; out.rows > 0).
void write_sparse(cudaStream_t stream, const MatrixArg &in, twConvertOp_t op, const twSpMatDescr &out,
                  void *workspace, const ActiveMask &mask = {}, int32_t *published = nullptr);
/// Byte offset of a container's overflow count: the TwELL record's count, the hybrid's backup count.
inline size_t overflow_count_offset(const twSpMatDescr &s) {
    return s.format == TW_FORMAT_TWELL ? s.twell.overflow_offset_words() * 4 : s.hybrid.backup_count;
}
/// Writes a container of no rows: its overflow count, which must read 0.
void write_empty(cudaStream_t stream, const twSpMatDescr &out);
/// After a writer flagged rows that do not fit the compact part of `out` (flags[r] = 1): gives
/// them record entries (TwELL) or backup slots (hybrid; flags[r] becomes 2 + slot) in ascending
/// row order, and sets the record / backup count (also into `published`, when not null).
void assign_overflow_slots(cudaStream_t stream, int32_t *flags, const twSpMatDescr &out, int32_t *published = nullptr);
/// Y = alpha * S * W + beta * Y (rows of S that are incomplete come out as NaN).
void spmm(cudaStream_t stream, float alpha, const twSpMatDescr &s, const MatrixArg &w, float beta,
          const MatrixArg &y);

/// GemmToSparse: C = act(alpha A B^T) into a sparse container: through the masked gate GEMM
/// (its active values and words, then the writer under the words) where it runs and takes the
/// operands (sm_90, RELU, alpha 1, row-major 16-bit A and B, C of their type), otherwise through
/// an fp32 cuBLASLt output and the writer.
size_t gemm_to_sparse_workspace(const twDnMatDescr &a, const twDnMatDescr &b, const twSpMatDescr &c);
void gemm_to_sparse(cudaStream_t stream, GemmRunner &gemm, const DeviceInfo &dev, float alpha, const twDnMatDescr &a,
                    const twDnMatDescr &b, const twSpMatDescr &c, twConvertOp_t act, void *workspace);

}  // namespace twblas::cuda
