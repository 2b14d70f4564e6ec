#include "container_checks.hpp"

#include <cinttypes>

#include "error.hpp"

namespace twblas::checks {

void twell_record_count(const TwellLayout &l, const char *name, int64_t listed) {
    if (listed > l.rows)
        fail(TW_STATUS_INVALID_VALUE, "%s: overflow record lists %" PRId64 " rows, more than the %" PRId64 " rows", name,
             listed, l.rows);
}

void twell_record_entry(const TwellLayout &l, const char *name, int64_t i, uint32_t id, uint32_t previous) {
    if (id >= l.rows)
        fail(TW_STATUS_INVALID_VALUE, "%s: overflow record entry %" PRId64 " names row %" PRId64 ", out of range", name, i,
             static_cast<int64_t>(id));
    if (i > 0 && id <= previous)
        fail(TW_STATUS_INVALID_VALUE,
             "%s: overflow record entry %" PRId64 " (row %" PRId64 ") is not in ascending order or repeats a row", name, i,
             static_cast<int64_t>(id));
}

void twell_row(const TwellLayout &l, const char *name, int64_t r, const uint32_t *words, bool listed,
               std::vector<uint8_t> &seen) {
    bool row_overflow = false;
    for (int64_t t = 0; t < l.tiles; ++t) {
        const uint32_t *block = words + t * l.words_per_block;
        const uint32_t header = block[0];
        if (header & ~(kTwellCountMask | kTwellOverflowBit))
            fail(TW_STATUS_INVALID_VALUE,
                 "%s: row %" PRId64 ", tile %" PRId64 ", slot 0: reserved header bits set (0x%08x)", name, r, t, header);
        const int64_t count = header & kTwellCountMask;
        if (count > l.slots)
            fail(TW_STATUS_INVALID_VALUE,
                 "%s: row %" PRId64 ", tile %" PRId64 ", slot 0: count %" PRId64 " exceeds the %" PRId64 " slots", name, r,
                 t, count, l.slots);
        if ((header & kTwellOverflowBit) && count != l.slots)
            fail(TW_STATUS_INVALID_VALUE,
                 "%s: row %" PRId64 ", tile %" PRId64 ", slot 0: overflow bit set with count %" PRId64
                 " below the %" PRId64 " slots",
                 name, r, t, count, l.slots);
        row_overflow |= (header & kTwellOverflowBit) != 0;
        const int64_t lo = t * l.tile_width, hi = std::min<int64_t>(lo + l.tile_width, l.cols);
        for (int64_t i = 0; i < count; ++i) {
            const int64_t col = twell_entry_col(block[1 + i]);
            if (col < lo || col >= hi) {
                for (int64_t j = 0; j < i; ++j) seen[static_cast<size_t>(twell_entry_col(block[1 + j]))] = 0;
                fail(TW_STATUS_INVALID_VALUE,
                     "%s: row %" PRId64 ", tile %" PRId64 ", slot %" PRId64 ": column %" PRId64
                     " lies outside the tile [%" PRId64 ", %" PRId64 ")",
                     name, r, t, i + 1, col, lo, hi);
            }
            if (seen[static_cast<size_t>(col)]) {
                for (int64_t j = 0; j < i; ++j) seen[static_cast<size_t>(twell_entry_col(block[1 + j]))] = 0;
                fail(TW_STATUS_INVALID_VALUE,
                     "%s: row %" PRId64 ", tile %" PRId64 ", slot %" PRId64 ": duplicate column %" PRId64, name, r, t,
                     i + 1, col);
            }
            seen[static_cast<size_t>(col)] = 1;
        }
        for (int64_t i = 0; i < count; ++i) seen[static_cast<size_t>(twell_entry_col(block[1 + i]))] = 0;
    }
    if (row_overflow != listed)
        fail(TW_STATUS_INVALID_VALUE, "%s: row %" PRId64 ": overflow bit %s but the row is %slisted in the overflow record",
             name, r, row_overflow ? "set" : "clear", listed ? "" : "not ");
}

void hybrid_backup_count(const HybridLayout &l, const char *name, int64_t needed) {
    if (needed < 0 || needed > l.rows)
        fail(TW_STATUS_INVALID_VALUE, "%s: backup_count %" PRId64 " outside [0, %" PRId64 "]", name, needed, l.rows);
}

void hybrid_slot(const HybridLayout &l, const char *name, int64_t slot, int64_t row_id, int64_t map_of_row) {
    if (row_id < 0 || row_id >= l.rows)
        fail(TW_STATUS_INVALID_VALUE, "%s: backup slot %" PRId64 ": row id %" PRId64 " out of range", name, slot, row_id);
    if (map_of_row != slot)
        fail(TW_STATUS_INVALID_VALUE,
             "%s: backup slot %" PRId64 " holds row %" PRId64 " but backup_map[%" PRId64 "] = %" PRId64, name, slot, row_id,
             row_id, map_of_row);
}

bool hybrid_row(const HybridLayout &l, const char *name, int64_t r, const HybridRow &row, int64_t needed,
                std::vector<uint8_t> &seen) {
    const int64_t n = row.nnz;
    if (n < 0 || n > l.cols)
        fail(TW_STATUS_INVALID_VALUE, "%s: row %" PRId64 ": row_nnz %" PRId64 " outside [0, cols = %" PRId64 "]", name, r, n,
             l.cols);
    const int64_t slot = row.slot;
    if (n <= l.ell_width) {
        if (slot != -1)
            fail(TW_STATUS_INVALID_VALUE,
                 "%s: row %" PRId64 ": %" PRId64 " non-zeros fit the ELL width but backup_map is %" PRId64, name, r, n, slot);
        const uint16_t *rc = row.ell_cols;
        auto clear = [&](int64_t upto) {
            for (int64_t j = 0; j < upto; ++j) seen[rc[j]] = 0;
        };
        for (int64_t i = 0; i < n; ++i) {
            if (rc[i] >= l.cols) {
                clear(i);
                fail(TW_STATUS_INVALID_VALUE, "%s: row %" PRId64 ", slot %" PRId64 ": column %d >= cols = %" PRId64, name, r,
                     i, rc[i], l.cols);
            }
            if (seen[rc[i]]) {
                clear(i);
                fail(TW_STATUS_INVALID_VALUE, "%s: row %" PRId64 ", slot %" PRId64 ": duplicate column %d", name, r, i, rc[i]);
            }
            seen[rc[i]] = 1;
        }
        clear(n);
        return false;
    }
    if (slot == -1) {
        if (needed <= l.backup_rows)
            fail(TW_STATUS_INVALID_VALUE,
                 "%s: row %" PRId64 ": %" PRId64 " non-zeros exceed the ELL width %d but the row has no backup slot", name, r, n,
                 l.ell_width);
        return true;  // recorded as not stored (capacity exceeded)
    }
    const int64_t stored = std::min(needed, l.backup_rows);
    if (slot < 0 || slot >= stored)
        fail(TW_STATUS_INVALID_VALUE, "%s: row %" PRId64 ": backup_map %" PRId64 " is not a filled backup slot", name, r,
             slot);
    // the slot must hold this row: a row pointing at another row's slot would read that row's values
    if (row.slot_row_id != r)
        fail(TW_STATUS_INVALID_VALUE, "%s: row %" PRId64 ": backup_map %" PRId64 " names the backup slot of row %" PRId64,
             name, r, slot, row.slot_row_id);
    if (row.backup_nonzeros != n)
        fail(TW_STATUS_INVALID_VALUE, "%s: row %" PRId64 ": backup row holds %" PRId64 " non-zeros, row_nnz says %" PRId64,
             name, r, row.backup_nonzeros, n);
    return true;
}

void hybrid_total(const char *name, int64_t needed, int64_t over) {
    if (over != needed)
        fail(TW_STATUS_INVALID_VALUE, "%s: backup_count is %" PRId64 " but %" PRId64 " rows exceed the ELL width", name,
             needed, over);
}

void dense_to_sparse_capacity(const twSpMatDescr &out, int64_t misses) {
    if (out.format == TW_FORMAT_TWELL && misses > 0)
        fail(TW_STATUS_CAPACITY_EXCEEDED,
             "out: %" PRId64 " rows have a tile with more than %" PRId64 " non-zeros (the TwELL slots of tile width %d, "
             "compression %d); use a smaller compression or a hybrid",
             misses, out.twell.slots, out.twell.tile_width, out.twell.compression);
    if (out.format == TW_FORMAT_HYBRID && misses > out.hybrid.backup_rows)
        fail(TW_STATUS_CAPACITY_EXCEEDED,
             "out: %" PRId64 " rows have more than %d non-zeros but the hybrid has %" PRId64 " backup rows", misses,
             out.hybrid.ell_width, out.hybrid.backup_rows);
}

void complete_input(const char *name, int64_t incomplete) {
    if (incomplete > 0)
        fail(TW_STATUS_INCOMPLETE_INPUT,
             "%s: %" PRId64 " rows did not fit this container when it was filled and are not stored "
             "completely; the result would not be exact (use a hybrid with enough backup rows)",
             name, incomplete);
}

}  // namespace twblas::checks
