// Checked size arithmetic: every byte count twblas derives from caller dimensions goes through
// these, so that a product or sum that does not fit size_t is TW_STATUS_INVALID_VALUE naming the
// argument that caused it, never a wrapped (small) size. Header-only and free of CUDA, so that
// the C boundary and every backend's size functions can use the same helpers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

#include "error.hpp"

namespace twblas {

constexpr size_t kSizeMax = std::numeric_limits<size_t>::max();

/// INVALID_VALUE: `name` makes a size that does not fit size_t.
[[noreturn]] inline void fail_size_overflow(const char *name) {
    fail(TW_STATUS_INVALID_VALUE, "%s: the size in bytes it implies does not fit size_t (too large)", name);
}

/// A non-negative int64 as size_t (INVALID_VALUE naming `name` when negative or too large).
inline size_t to_size(int64_t v, const char *name) {
    if (v < 0) fail(TW_STATUS_INVALID_VALUE, "%s: must be >= 0, got %lld", name, static_cast<long long>(v));
    if (static_cast<uint64_t>(v) > static_cast<uint64_t>(kSizeMax)) fail_size_overflow(name);
    return static_cast<size_t>(v);
}

/// a * b, or INVALID_VALUE naming `name`.
inline size_t checked_mul(size_t a, size_t b, const char *name) {
    if (b != 0 && a > kSizeMax / b) fail_size_overflow(name);
    return a * b;
}
inline size_t checked_mul(size_t a, size_t b, size_t c, const char *name) {
    return checked_mul(checked_mul(a, b, name), c, name);
}

/// a + b, or INVALID_VALUE naming `name`.
inline size_t checked_add(size_t a, size_t b, const char *name) {
    if (a > kSizeMax - b) fail_size_overflow(name);
    return a + b;
}

/// a rounded up to a multiple of `alignment` (a power of two), or INVALID_VALUE naming `name`.
inline size_t checked_align_up(size_t a, size_t alignment, const char *name) {
    return checked_add(a, alignment - 1, name) & ~(alignment - 1);
}

/// Byte offsets of consecutive arrays, each starting on an `alignment` boundary counted from the
/// start (the layouts of formats.md and of the backends' workspaces), checked as they grow.
class CheckedLayout {
  public:
    explicit CheckedLayout(size_t alignment) : alignment_(alignment) {}
    /// Places `count` elements of `elem_bytes` bytes; returns their offset. `name`: the argument
    /// that makes `count` large. When the running total overflows, the largest array so far
    /// takes the blame.
    size_t take(size_t count, size_t elem_bytes, const char *name) {
        const size_t bytes = checked_mul(count, elem_bytes, name);
        if (!largest_name_ || bytes > largest_) largest_ = bytes, largest_name_ = name;
        const size_t offset = checked_align_up(at_, alignment_, largest_name_);
        at_ = checked_add(offset, bytes, largest_name_);
        return offset;
    }
    /// The total, rounded up to the alignment.
    size_t total() const { return checked_align_up(at_, alignment_, largest_name_ ? largest_name_ : "size"); }

  private:
    size_t alignment_;
    size_t at_ = 0;
    size_t largest_ = 0;
    const char *largest_name_ = nullptr;
};

}  // namespace twblas
