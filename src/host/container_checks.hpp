// The invariants of docs/formats.md as small checks, one per item of a container, each throwing
// Error(INVALID_VALUE) with the message of its first violation. twSpMatValidate reports the first
// violation in a fixed order (header counts, then the TwELL record or hybrid backup slots in
// order, then rows in order, then the hybrid's total). The reference backend runs every check in
// that order over host memory; the CUDA backend finds the first failing item on the device and
// runs that item's check on the few bytes it reads back, so both backends say the same words.
// Each check takes the item's values, not the buffer, so that it never reads past what its
// caller fetched.
#pragma once

#include <cstdint>
#include <vector>

#include "formats.hpp"
#include "objects.hpp"

namespace twblas::checks {

// ---- TwELL

/// The overflow record's count against the row count.
void twell_record_count(const TwellLayout &l, const char *name, int64_t listed);
/// Record entry i (row id `id`; `previous` is entry i - 1, unused for i = 0): in range, ascending.
void twell_record_entry(const TwellLayout &l, const char *name, int64_t i, uint32_t id, uint32_t previous);
/// Row r's l.ld words: every block's header and entries, then the overflow bits against whether
/// the record lists the row. `seen` is scratch of at least l.cols bytes, all 0 (left all 0).
void twell_row(const TwellLayout &l, const char *name, int64_t r, const uint32_t *words, bool listed,
               std::vector<uint8_t> &seen);

// ---- hybrid

/// The backup count (rows that need a backup row) against the row count.
void hybrid_backup_count(const HybridLayout &l, const char *name, int64_t needed);
/// Filled backup slot `slot` holds row `row_id`, whose backup_map entry is `map_of_row` (read
/// only when row_id is in range).
void hybrid_slot(const HybridLayout &l, const char *name, int64_t slot, int64_t row_id, int64_t map_of_row);

/// What the check of one hybrid row reads. `slot_row_id` and `backup_nonzeros` are read only for
/// a row over the ELL width whose map names a filled slot (0 <= slot < min(needed, B)).
struct HybridRow {
    int64_t nnz = 0;                  // row_nnz[r]
    int64_t slot = -1;                // backup_map[r]
    const uint16_t *ell_cols = nullptr;  // the row's ELL columns (its first nnz, when nnz <= E)
    int64_t slot_row_id = -1;         // backup_row_ids[slot]
    int64_t backup_nonzeros = 0;      // non-+0 values of the backup row at slot
};
/// Row r (`needed` is the backup count). Returns whether it exceeds the ELL width.
bool hybrid_row(const HybridLayout &l, const char *name, int64_t r, const HybridRow &row, int64_t needed,
                std::vector<uint8_t> &seen);
/// The backup count against the rows over the ELL width (`over`), after every row.
void hybrid_total(const char *name, int64_t needed, int64_t over);

// ---- conversions

/// A dense -> sparse analysis that found `misses` rows the compact part of `out` cannot hold:
/// CAPACITY_EXCEEDED when `out` cannot store them (a TwELL never; a hybrid past its backup rows).
void dense_to_sparse_capacity(const twSpMatDescr &out, int64_t misses);
/// A sparse input of a conversion that records `incomplete` rows it could not hold:
/// INCOMPLETE_INPUT (the result would not be exact).
void complete_input(const char *name, int64_t incomplete);

}  // namespace twblas::checks
