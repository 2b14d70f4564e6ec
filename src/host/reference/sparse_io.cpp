#include "sparse_io.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <numeric>

#include "host/container_checks.hpp"
#include "host/error.hpp"
#include "host/numeric.hpp"

namespace twblas::reference {

namespace {

template <class T>
T *at(uint8_t *base, size_t offset) {
    return reinterpret_cast<T *>(base + offset);
}
template <class T>
const T *at(const uint8_t *base, size_t offset) {
    return reinterpret_cast<const T *>(base + offset);
}

ValueBits read_bits(const uint8_t *p, size_t i, size_t value_bytes) {
    if (value_bytes == 4) return reinterpret_cast<const uint32_t *>(p)[i];
    return reinterpret_cast<const uint16_t *>(p)[i];
}
void write_bits(uint8_t *p, size_t i, size_t value_bytes, ValueBits b) {
    if (value_bytes == 4)
        reinterpret_cast<uint32_t *>(p)[i] = b;
    else
        reinterpret_cast<uint16_t *>(p)[i] = static_cast<uint16_t>(b);
}

}  // namespace

ValueBits to_bits(twDataType_t t, float v) {
    if (t == TW_R_32F) return float_bits(v);
    return bits16_of(t, v);
}

// ---- writer --------------------------------------------------------------------------------

SparseWriter::SparseWriter(const twSpMatDescr &s) : s_(s), base_(static_cast<uint8_t *>(s.buffer)) {
    if (s_.format == TW_FORMAT_TWELL)
        at<uint32_t>(base_, s_.twell.overflow_offset_words() * 4)[0] = 0;
    else
        at<int32_t>(base_, s_.hybrid.backup_count)[0] = 0;
}

void SparseWriter::write_row(int64_t row, const int32_t *cols, const ValueBits *bits, int64_t n) {
    if (s_.format == TW_FORMAT_TWELL)
        write_twell(row, cols, bits, n);
    else
        write_hybrid(row, cols, bits, n);
}

void SparseWriter::write_twell(int64_t row, const int32_t *cols, const ValueBits *bits, int64_t n) {
    const TwellLayout &l = s_.twell;
    uint32_t *words = at<uint32_t>(base_, 0);
    bool overflowed = false;
    int64_t i = 0;
    for (int64_t t = 0; t < l.tiles; ++t) {
        const int64_t end = std::min<int64_t>((t + 1) * l.tile_width, l.cols);
        int64_t in_tile = 0;
        uint32_t *block = words + l.block(row, t);
        for (; i < n && cols[i] < end; ++i, ++in_tile)
            if (in_tile < l.slots) block[1 + in_tile] = twell_entry(cols[i], static_cast<uint16_t>(bits[i]));
        const bool over = in_tile > l.slots;
        block[0] = static_cast<uint32_t>(std::min(in_tile, l.slots)) | (over ? kTwellOverflowBit : 0u);
        overflowed |= over;
    }
    if (overflowed) {
        uint32_t *record = words + l.overflow_offset_words();
        record[1 + overflow_] = static_cast<uint32_t>(row);
        record[0] = static_cast<uint32_t>(++overflow_);
        ++lost_rows_;
    }
}

void SparseWriter::write_hybrid(int64_t row, const int32_t *cols, const ValueBits *bits, int64_t n) {
    const HybridLayout &l = s_.hybrid;
    at<int32_t>(base_, l.row_nnz)[row] = static_cast<int32_t>(n);
    int32_t *map = at<int32_t>(base_, l.backup_map);
    if (n <= l.ell_width) {
        uint16_t *ecols = at<uint16_t>(base_, l.ell_cols) + row * l.ell_width;
        uint8_t *evals = base_ + l.ell_vals + static_cast<size_t>(row * l.ell_width) * l.value_bytes;
        for (int64_t i = 0; i < n; ++i) {
            ecols[i] = static_cast<uint16_t>(cols[i]);
            write_bits(evals, static_cast<size_t>(i), l.value_bytes, bits[i]);
        }
        map[row] = -1;
        return;
    }
    const int64_t slot = overflow_++;
    at<int32_t>(base_, l.backup_count)[0] = static_cast<int32_t>(overflow_);
    if (slot >= l.backup_rows) {  // recorded (backup_count > B), not stored
        map[row] = -1;
        ++lost_rows_;
        return;
    }
    map[row] = static_cast<int32_t>(slot);
    at<int32_t>(base_, l.backup_row_ids)[slot] = static_cast<int32_t>(row);
    uint8_t *dense = base_ + l.backup_vals + static_cast<size_t>(slot * l.cols) * l.value_bytes;
    std::memset(dense, 0, static_cast<size_t>(l.cols) * l.value_bytes);
    for (int64_t i = 0; i < n; ++i) write_bits(dense, static_cast<size_t>(cols[i]), l.value_bytes, bits[i]);
}

// ---- reader --------------------------------------------------------------------------------

SparseReader::SparseReader(const twSpMatDescr &s) : s_(s), base_(static_cast<const uint8_t *>(s.buffer)) {}

int64_t SparseReader::incomplete_rows() const {
    if (s_.format == TW_FORMAT_TWELL) return at<uint32_t>(base_, s_.twell.overflow_offset_words() * 4)[0];
    const int64_t needed = at<int32_t>(base_, s_.hybrid.backup_count)[0];
    return std::max<int64_t>(0, needed - s_.hybrid.backup_rows);
}

float SparseReader::value(ValueBits b) const {
    if (s_.type == TW_R_32F) return bits_float(b);
    return value_of_bits16(s_.type, static_cast<uint16_t>(b));
}

void SparseReader::row(int64_t r, std::vector<int32_t> &cols, std::vector<ValueBits> &bits) const {
    const size_t first = cols.size();
    if (s_.format == TW_FORMAT_TWELL) {
        const TwellLayout &l = s_.twell;
        const uint32_t *words = at<uint32_t>(base_, 0);
        for (int64_t t = 0; t < l.tiles; ++t) {
            const uint32_t *block = words + l.block(r, t);
            const int64_t count = std::min<int64_t>(block[0] & kTwellCountMask, l.slots);
            for (int64_t i = 0; i < count; ++i) {
                if (!is_stored_nonzero(twell_entry_bits(block[1 + i]))) continue;  // a stored +0: no value
                cols.push_back(static_cast<int32_t>(twell_entry_col(block[1 + i])));
                bits.push_back(twell_entry_bits(block[1 + i]));
            }
        }
    } else {
        const HybridLayout &l = s_.hybrid;
        const int64_t n = at<int32_t>(base_, l.row_nnz)[r];
        const int32_t slot = at<int32_t>(base_, l.backup_map)[r];
        if (n <= l.ell_width) {
            const uint16_t *ecols = at<uint16_t>(base_, l.ell_cols) + r * l.ell_width;
            const uint8_t *evals = base_ + l.ell_vals + static_cast<size_t>(r * l.ell_width) * l.value_bytes;
            for (int64_t i = 0; i < n; ++i) {
                const ValueBits b = read_bits(evals, static_cast<size_t>(i), l.value_bytes);
                if (!is_stored_nonzero(b)) continue;  // a stored +0: no value
                cols.push_back(ecols[i]);
                bits.push_back(b);
            }
        } else if (slot >= 0) {
            const uint8_t *dense = base_ + l.backup_vals + static_cast<size_t>(slot * l.cols) * l.value_bytes;
            for (int64_t c = 0; c < l.cols; ++c) {
                const ValueBits b = read_bits(dense, static_cast<size_t>(c), l.value_bytes);
                if (is_stored_nonzero(b)) {
                    cols.push_back(static_cast<int32_t>(c));
                    bits.push_back(b);
                }
            }
        }
    }
    // entry order inside a block / ELL row is unspecified: sort this row's entries by column
    const size_t n = cols.size() - first;
    if (n > 1 && !std::is_sorted(cols.begin() + first, cols.end())) {
        std::vector<size_t> order(n);
        std::iota(order.begin(), order.end(), 0);
        std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return cols[first + a] < cols[first + b]; });
        std::vector<int32_t> c2(n);
        std::vector<ValueBits> b2(n);
        for (size_t i = 0; i < n; ++i) {
            c2[i] = cols[first + order[i]];
            b2[i] = bits[first + order[i]];
        }
        std::copy(c2.begin(), c2.end(), cols.begin() + first);
        std::copy(b2.begin(), b2.end(), bits.begin() + first);
    }
}

// ---- info and validation -------------------------------------------------------------------

twSpMatInfo_t info(const twSpMatDescr &s) {
    twSpMatInfo_t out{0, 0, 0, 0};
    const uint8_t *base = static_cast<const uint8_t *>(s.buffer);
    if (s.format == TW_FORMAT_TWELL) {
        const TwellLayout &l = s.twell;
        const uint32_t *words = at<uint32_t>(base, 0);
        for (int64_t r = 0; r < l.rows; ++r) {
            int64_t row_nnz = 0;
            for (int64_t t = 0; t < l.tiles; ++t)
                row_nnz += std::min<int64_t>(words[l.block(r, t)] & kTwellCountMask, l.slots);
            out.nnz += row_nnz;
            out.maxRowNnz = std::max(out.maxRowNnz, row_nnz);
        }
        out.overflowRows = words[l.overflow_offset_words()];
    } else {
        const HybridLayout &l = s.hybrid;
        const int32_t *nnz = at<int32_t>(base, l.row_nnz);
        const int32_t *map = at<int32_t>(base, l.backup_map);
        for (int64_t r = 0; r < l.rows; ++r) {
            const bool stored = nnz[r] <= l.ell_width || map[r] >= 0;
            if (stored) out.nnz += nnz[r];
            out.maxRowNnz = std::max<int64_t>(out.maxRowNnz, nnz[r]);
        }
        out.overflowRows = at<int32_t>(base, l.backup_count)[0];
    }
    return out;
}

void validate(const twSpMatDescr &s, const char *name) {
    const uint8_t *base = static_cast<const uint8_t *>(s.buffer);
    std::vector<uint8_t> seen(static_cast<size_t>(std::max<int64_t>(s.cols, 1)), 0);
    if (s.format == TW_FORMAT_TWELL) {
        const TwellLayout &l = s.twell;
        const uint32_t *words = at<uint32_t>(base, 0);
        const uint32_t *record = words + l.overflow_offset_words();
        const int64_t listed = record[0];
        checks::twell_record_count(l, name, listed);
        for (int64_t i = 0; i < listed; ++i) checks::twell_record_entry(l, name, i, record[1 + i], i > 0 ? record[i] : 0);
        int64_t next_listed = 0;
        for (int64_t r = 0; r < l.rows; ++r) {
            const bool is_listed = next_listed < listed && record[1 + next_listed] == static_cast<uint32_t>(r);
            checks::twell_row(l, name, r, words + l.block(r, 0), is_listed, seen);
            if (is_listed) ++next_listed;
        }
        return;
    }
    const HybridLayout &l = s.hybrid;
    const int32_t *nnz = at<int32_t>(base, l.row_nnz);
    const uint16_t *ecols = at<uint16_t>(base, l.ell_cols);
    const int32_t *map = at<int32_t>(base, l.backup_map);
    const int32_t *ids = at<int32_t>(base, l.backup_row_ids);
    const int64_t needed = at<int32_t>(base, l.backup_count)[0];
    checks::hybrid_backup_count(l, name, needed);
    const int64_t stored = std::min(needed, l.backup_rows);
    for (int64_t slot = 0; slot < stored; ++slot) {
        const int64_t r = ids[slot];
        checks::hybrid_slot(l, name, slot, r, r >= 0 && r < l.rows ? map[r] : -1);
    }
    int64_t over = 0;
    for (int64_t r = 0; r < l.rows; ++r) {
        checks::HybridRow row;
        row.nnz = nnz[r];
        row.slot = map[r];
        row.ell_cols = ecols + r * l.ell_width;
        if (row.nnz > l.ell_width && row.slot >= 0 && row.slot < stored) {
            row.slot_row_id = ids[row.slot];
            const uint8_t *dense = base + l.backup_vals + static_cast<size_t>(row.slot * l.cols) * l.value_bytes;
            for (int64_t c = 0; c < l.cols; ++c)
                row.backup_nonzeros += is_stored_nonzero(read_bits(dense, static_cast<size_t>(c), l.value_bytes));
        }
        over += checks::hybrid_row(l, name, r, row, needed, seen);
    }
    checks::hybrid_total(name, needed, over);
}

}  // namespace twblas::reference
