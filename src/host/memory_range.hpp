// The bytes a descriptor or a raw buffer covers, and the one overlap check every routine uses
// (the C boundary checks each output against each input it would corrupt). Addresses are
// compared as integers, so this works the same for host and device pointers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "error.hpp"
#include "objects.hpp"

namespace twblas {

/// Bytes [begin, end) of memory; empty when begin == end.
struct ByteRange {
    uintptr_t begin = 0, end = 0;
    bool empty() const { return begin == end; }
    bool overlaps(const ByteRange &o) const { return !empty() && !o.empty() && begin < o.end && o.begin < end; }
};

inline ByteRange byte_range(const void *p, size_t bytes) {
    const uintptr_t b = reinterpret_cast<uintptr_t>(p);
    return p && bytes ? ByteRange{b, b + bytes} : ByteRange{};
}

/// Bytes from the first to one past the last element of a dense matrix (twCreateDnMat checked
/// that they fit the address space); empty for an empty matrix.
inline size_t dense_extent_bytes(const twDnMatDescr &m) {
    if (m.empty()) return 0;
    const int64_t lines = m.order == TW_ORDER_ROW ? m.rows : m.cols;
    const int64_t inner = m.order == TW_ORDER_ROW ? m.cols : m.rows;
    const size_t esize = m.type == TW_R_32F ? 4 : 2;
    return (static_cast<size_t>(lines - 1) * static_cast<size_t>(m.ld) + static_cast<size_t>(inner)) * esize;
}
inline ByteRange byte_range(const twDnMatDescr &m) { return byte_range(m.values, dense_extent_bytes(m)); }

/// The whole buffer of a sparse container (its layout's size).
inline size_t sparse_buffer_bytes(const twSpMatDescr &s) {
    return s.format == TW_FORMAT_TWELL ? s.twell.bytes() : s.hybrid.total;
}
inline ByteRange byte_range(const twSpMatDescr &s) { return byte_range(s.buffer, sparse_buffer_bytes(s)); }

/// INVALID_VALUE naming `out_name` when `out` (memory a call writes) overlaps `in` (memory it
/// reads, or another output), whose argument is `in_name`.
inline void require_disjoint(const ByteRange &out, const char *out_name, const ByteRange &in, const char *in_name) {
    if (out.overlaps(in))
        fail(TW_STATUS_INVALID_VALUE, "%s: its memory overlaps the memory of %s (in-place use is not supported here)",
             out_name, in_name);
}

}  // namespace twblas
