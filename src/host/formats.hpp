// Byte-level layouts of the TwELL and hybrid buffers (docs/formats.md). Pure arithmetic,
// shared by every backend, so that a buffer written by one backend reads the same in another.
#pragma once

#include <cstddef>
#include <cstdint>

#include "checked_size.hpp"
#include "twblas/twblas.h"

namespace twblas {

constexpr int64_t kMaxSparseCols = 65536;       // column indices are uint16
constexpr int64_t kMaxSparseRows = INT32_MAX;   // row ids are int32 / uint32
constexpr uint32_t kTwellOverflowBit = 0x80000000u;
constexpr uint32_t kTwellCountMask = 0x0000ffffu;

/// TwELL: rows x ld uint32 words, then the overflow record: uint32 count + uint32 row ids[rows].
/// make() checks that the buffer size fits size_t (INVALID_VALUE naming the argument), so the
/// accessors below cannot wrap for a layout it returned.
struct TwellLayout {
    int64_t rows = 0, cols = 0;
    int32_t tile_width = 256;   // T
    int32_t compression = 8;    // C
    int64_t words_per_block = 0;  // W = T / C
    int64_t slots = 0;            // S = W - 1
    int64_t tiles = 0;            // NT = ceil(cols / T)
    int64_t ld = 0;               // words per row = NT * W

    static TwellLayout make(int64_t rows, int64_t cols, int32_t tile_width, int32_t compression) {
        TwellLayout l;
        l.rows = rows;
        l.cols = cols;
        l.tile_width = tile_width;
        l.compression = compression;
        l.words_per_block = tile_width / compression;
        l.slots = l.words_per_block - 1;
        l.tiles = (cols + tile_width - 1) / tile_width;
        l.ld = l.tiles * l.words_per_block;
        // (rows * ld + 1 + rows) words, checked term by term
        const size_t r = to_size(rows, "rows");
        const size_t words = checked_add(checked_mul(r, to_size(l.ld, "cols"), "rows"), r + 1, "rows");
        checked_mul(words, 4, "rows");
        return l;
    }
    size_t matrix_words() const { return static_cast<size_t>(rows * ld); }
    /// Word offset of the overflow record (its count), then the row ids follow.
    size_t overflow_offset_words() const { return matrix_words(); }
    size_t bytes() const { return (matrix_words() + 1 + static_cast<size_t>(rows)) * 4; }
    size_t block(int64_t r, int64_t t) const { return static_cast<size_t>(r * ld + t * words_per_block); }
};

inline uint32_t twell_entry(int64_t col, uint16_t value_bits) {
    return static_cast<uint32_t>(col & 0xffff) | (static_cast<uint32_t>(value_bits) << 16);
}
inline int64_t twell_entry_col(uint32_t w) { return w & 0xffffu; }
inline uint16_t twell_entry_bits(uint32_t w) { return static_cast<uint16_t>(w >> 16); }

/// Hybrid: each array starts on a 256-byte boundary from the buffer start. make() computes the
/// offsets with checked arithmetic: a size that does not fit size_t is INVALID_VALUE naming the
/// argument that makes it large (ellWidth for the ELL arrays, backupRows for the backup rows).
struct HybridLayout {
    int64_t rows = 0, cols = 0;
    int32_t ell_width = 128;  // E
    int64_t backup_rows = 0;  // B
    size_t value_bytes = 2;
    // byte offsets
    size_t row_nnz = 0, ell_cols = 0, ell_vals = 0, backup_count = 0, backup_row_ids = 0,
           backup_map = 0, backup_vals = 0, total = 0;

    static size_t align(size_t x) { return (x + 255) & ~static_cast<size_t>(255); }
    static HybridLayout make(int64_t rows, int64_t cols, int32_t ell_width, int64_t backup_rows,
                             size_t value_bytes) {
        HybridLayout l;
        l.rows = rows;
        l.cols = cols;
        l.ell_width = ell_width;
        l.backup_rows = backup_rows;
        l.value_bytes = value_bytes;
        const size_t r = to_size(rows, "rows"), e = to_size(ell_width, "ellWidth"),
                     b = to_size(backup_rows, "backupRows"), c = to_size(cols, "cols");
        CheckedLayout at(256);
        l.row_nnz = at.take(r, 4, "rows");
        l.ell_cols = at.take(checked_mul(r, e, "ellWidth"), 2, "ellWidth");
        l.ell_vals = at.take(checked_mul(r, e, "ellWidth"), value_bytes, "ellWidth");
        l.backup_count = at.take(1, 4, "rows");
        l.backup_row_ids = at.take(b, 4, "backupRows");
        l.backup_map = at.take(r, 4, "rows");
        l.backup_vals = at.take(checked_mul(b, c, "backupRows"), value_bytes, "backupRows");
        l.total = at.total();
        return l;
    }
};

}  // namespace twblas
