// Row-wise access to TwELL and hybrid containers in host memory: one writer and one reader
// that every reference operation goes through, so the format rules live in one place.
#pragma once

#include <cstdint>
#include <vector>

#include "host/formats.hpp"
#include "host/objects.hpp"

namespace twblas::reference {

/// Raw value bits of one stored entry (16-bit pattern, or the fp32 bits of a TW_R_32F hybrid).
using ValueBits = uint32_t;

/// Writes rows into a TwELL or hybrid container. Construction resets the container's overflow
/// record; then every row must be written exactly once, in ascending row order, each with its
/// non-zeros in ascending column order. Nothing is dropped silently: rows that do not fit are
/// recorded in the container (TwELL overflow record, hybrid backup count past capacity).
class SparseWriter {
  public:
    explicit SparseWriter(const twSpMatDescr &s);
    void write_row(int64_t row, const int32_t *cols, const ValueBits *bits, int64_t n);
    /// True when every row written so far is held completely.
    bool complete() const { return lost_rows_ == 0; }

  private:
    void write_twell(int64_t row, const int32_t *cols, const ValueBits *bits, int64_t n);
    void write_hybrid(int64_t row, const int32_t *cols, const ValueBits *bits, int64_t n);
    const twSpMatDescr &s_;
    uint8_t *base_;
    int64_t overflow_ = 0;   // TwELL overflow rows / hybrid rows needing backup
    int64_t lost_rows_ = 0;  // rows not held completely
};

/// Reads a container that twSpMatValidate accepts (callers validate first).
class SparseReader {
  public:
    explicit SparseReader(const twSpMatDescr &s);
    /// Rows whose values are not all stored (TwELL overflow rows; hybrid rows past capacity).
    int64_t incomplete_rows() const;
    /// Appends row r's values to cols/bits, sorted by column: its stored entries but those holding
    /// +0 (legal in a container, docs/formats.md 1.3), so that a stored zero reads as an unstored
    /// one and a re-packed row never counts it among its non-zeros.
    void row(int64_t r, std::vector<int32_t> &cols, std::vector<ValueBits> &bits) const;
    /// Value of stored bits as fp32.
    float value(ValueBits b) const;

  private:
    const twSpMatDescr &s_;
    const uint8_t *base_;
};

/// Every invariant of docs/formats.md; throws Error(INVALID_VALUE) naming the first violation.
void validate(const twSpMatDescr &s, const char *name);
twSpMatInfo_t info(const twSpMatDescr &s);

/// Bits of fp32 v stored as the container's value type (rounded to nearest even).
ValueBits to_bits(twDataType_t t, float v);
/// Whether stored bits count as a non-zero: any pattern but +0 (so -0.0 round-trips).
inline bool is_stored_nonzero(ValueBits b) { return b != 0; }

}  // namespace twblas::reference
