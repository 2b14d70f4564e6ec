// The saved state of the reference backend's training forward (twSpGEMMFusedForwardTrain on
// TW_BACKEND_CPU), the backend's own format:
//
//   header | row_nnz int32[M] | cols uint16[M x E] | g fp32[M x E] | u fp32[M x E]
//
// each array starting at a multiple of 256 bytes. Token t keeps its number of active units in
// row_nnz[t]; when that is at most E, its units' ids (strictly ascending, each < H) and their g
// and u (u = 0 for plain ReLU) fill the first row_nnz[t] slots of row t. A token with more than
// E active units (at most H) keeps only its count: the backward recomputes it from X (exact, the
// same code computes it), which keeps the saved state small. The buffer comes back from the
// caller, so the backward checks all of it first (ffn.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace twblas::reference {

constexpr int64_t kSavedEllWidth = 128;
constexpr uint64_t kSavedMagic = 0x7477736176656431ull;  // "twsaved1"

struct SavedHeader {
    uint64_t magic;
    int64_t tokens, model_dim, hidden_dim;
    int32_t kind, type, compute_mode, ell_width;
};

struct SavedLayout {
    size_t row_nnz, cols, g, u, total;
    static size_t align(size_t v) { return (v + 255) & ~static_cast<size_t>(255); }
    explicit SavedLayout(int64_t tokens) {
        const size_t m = static_cast<size_t>(tokens), e = static_cast<size_t>(kSavedEllWidth);
        row_nnz = align(sizeof(SavedHeader));
        cols = align(row_nnz + m * 4);
        g = align(cols + m * e * 2);
        u = align(g + m * e * 4);
        total = align(u + m * e * 4);
    }
};

}  // namespace twblas::reference
