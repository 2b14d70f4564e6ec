// A dense matrix as kernels see it, and the one test of whether its rows take 16-byte loads.
#pragma once

#include <cstdint>

#include "check.hpp"
#include "host/objects.hpp"

namespace twblas::cuda {

/// Element (r, c) at ptr + (r * rs + c * cs) elements.
struct MatrixArg {
    void *ptr;
    int64_t rows, cols, rs, cs;
    twDataType_t type;
};

inline MatrixArg matrix_arg(const twDnMatDescr &d) {
    return d.order == TW_ORDER_ROW ? MatrixArg{d.values, d.rows, d.cols, d.ld, 1, d.type}
                                   : MatrixArg{d.values, d.rows, d.cols, 1, d.ld, d.type};
}

/// Rows of `cols` values (a multiple of 8) that are contiguous and 16-byte aligned: kernels read
/// and write them in 16-byte chunks.
/// Row-major with every row starting on 16 bytes (a row's last partial chunk is the reader's).
inline bool rows_aligned16(const MatrixArg &m) {
    return m.cs == 1 && (m.rs * static_cast<int64_t>(elem_bytes(m.type))) % 16 == 0 &&
           reinterpret_cast<uintptr_t>(m.ptr) % 16 == 0;
}
inline bool rows_vectorizable(const MatrixArg &m, int64_t cols) { return rows_aligned16(m) && cols % 8 == 0; }

/// The active entries of a dense matrix whose other entries were never written (the masked gate
/// GEMM's output): bit c % 32 of word r * ld + c / 32 set for each active (r, c). Readers take
/// the other entries as +0 without reading them. NULL words: every entry is to be read.
struct ActiveMask {
    const uint32_t *words = nullptr;
    int64_t ld = 0;
};

}  // namespace twblas::cuda
