// Where a descriptor meets the CUDA backend: its memory must be reachable by kernels (device,
// managed, or pinned host memory). Plain malloc'd memory would fault inside a kernel; it is an
// INVALID_VALUE naming the argument instead. One query per pointer: the callers check once per
// object or per argument set, never on a replayed call.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstddef>

#include "check.hpp"

namespace twblas::cuda {

inline void require_device_accessible(const void *ptr, const char *name) {
    if (!ptr) return;  // NULL is the C boundary's business
    cudaPointerAttributes attr{};
    const cudaError_t e = cudaPointerGetAttributes(&attr, ptr);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        fail(TW_STATUS_INVALID_VALUE, "%s: not memory the CUDA device can reach (%s); a CUDA handle needs device memory",
             name, cudaGetErrorString(e));
    }
    if (attr.type == cudaMemoryTypeUnregistered)
        fail(TW_STATUS_INVALID_VALUE,
             "%s: host memory that is not registered with CUDA; a CUDA handle needs device (or pinned) memory", name);
}

/// The pointers an FFN's training calls found reachable, most recent ones kept: a training step's
/// tensors come back from the caller's allocator at the same addresses call after call, so each
/// is queried once instead of on every call (the forward and backward pass twelve pointers; the
/// inference path checks once per argument set, for the same reason). Guarded by its owner.
class ReachablePointers {
public:
    void require(const void *ptr, const char *name) {
        if (!ptr) return;
        for (const void *p : seen_)
            if (p == ptr) return;
        require_device_accessible(ptr, name);
        seen_[next_] = ptr;
        next_ = (next_ + 1) % seen_.size();
    }

private:
    std::array<const void *, 64> seen_{};
    std::size_t next_ = 0;
};

}  // namespace twblas::cuda
