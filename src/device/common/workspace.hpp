// Carving a caller's workspace into aligned pieces; the same code measures it (base NULL), so
// sizing and use always agree.
#pragma once

#include <cstddef>

namespace twblas::cuda {

class WorkspaceCarver {
  public:
    explicit WorkspaceCarver(void *base) : base_(static_cast<char *>(base)) {}
    /// `count` elements of T on a 256-byte boundary (NULL while measuring).
    template <class T> T *take(size_t count) {
        at_ = (at_ + 255) & ~static_cast<size_t>(255);
        T *p = base_ ? reinterpret_cast<T *>(base_ + at_) : nullptr;
        at_ += count * sizeof(T);
        return p;
    }
    /// Byte offset of the next piece (for layouts described by offsets).
    size_t offset_of_next() const { return (at_ + 255) & ~static_cast<size_t>(255); }
    size_t used() const { return (at_ + 255) & ~static_cast<size_t>(255); }

  private:
    char *base_;
    size_t at_ = 0;
};

}  // namespace twblas::cuda
