// Weight repacking (setup): user weights in any order into the kernels' row layouts.
#pragma once

#include "common/matrix_arg.hpp"

namespace twblas::cuda {

// ---- weight repacking (setup)

__global__ void repack(MatrixArg in, bool transpose, void *out, int64_t ldo, int64_t out_rows, int64_t out_cols,
                       int elem) {
    const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const int64_t r = blockIdx.y;
    if (c >= out_cols) return;
    // out (r, c) = in(r, c), or in(c, r) when transposed; zero in the padding
    const int64_t ir = transpose ? c : r, ic = transpose ? r : c;
    uint32_t v = 0;
    if (ir < in.rows && ic < in.cols) {
        const int64_t i = ir * in.rs + ic * in.cs;
        v = elem == 4 ? static_cast<const uint32_t *>(in.ptr)[i] : static_cast<const uint16_t *>(in.ptr)[i];
    }
    if (elem == 4)
        static_cast<uint32_t *>(out)[r * ldo + c] = v;
    else
        static_cast<uint16_t *>(out)[r * ldo + c] = static_cast<uint16_t>(v);
    (void)out_rows;
}

}  // namespace twblas::cuda
