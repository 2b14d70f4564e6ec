// Writes into the training forward's saved state: its header, and in dense mode also the marking
// of every row as one the backward recomputes.
#pragma once

#include "ffn_layout.hpp"

namespace twblas::cuda {

__global__ void write_header(SavedHeader h, SavedHeader *out) { *out = h; }

/// Dense mode: the header, and every row on the dense list, in order (after the statistics have
/// been taken from count).
__global__ void write_dense_mode_state(SavedHeader h, SavedHeader *out, int32_t *count, int32_t *rows,
                                       uint32_t *dense_count, int64_t m) {
    for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < m;
         r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        count[r] = count[r] < 0 ? count[r] : -2;
        rows[r] = static_cast<int32_t>(r);
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) *dense_count = static_cast<uint32_t>(m), *out = h;
}

}  // namespace twblas::cuda
