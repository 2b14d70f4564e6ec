// Memory owned by setup-time objects (FFN weights, counters, the statistics the host reads).
// Compute calls never allocate: they take their scratch from the caller's workspace.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "check.hpp"

namespace twblas::cuda {

/// Device memory.
class DeviceBuffer {
  public:
    DeviceBuffer() = default;
    explicit DeviceBuffer(size_t bytes) { reset(bytes); }
    ~DeviceBuffer() { release(); }
    DeviceBuffer(const DeviceBuffer &) = delete;
    DeviceBuffer &operator=(const DeviceBuffer &) = delete;
    void reset(size_t bytes) {
        release();
        if (bytes == 0) return;
        if (cudaMalloc(&ptr_, bytes) != cudaSuccess) {
            (void)cudaGetLastError();
            ptr_ = nullptr;
            fail(TW_STATUS_ALLOC_FAILED, "cudaMalloc of %zu bytes failed", bytes);
        }
        bytes_ = bytes;
    }
    template <class T = void> T *get() const { return static_cast<T *>(ptr_); }
    size_t bytes() const { return bytes_; }

  private:
    void release() {
        if (ptr_) (void)cudaFree(ptr_);
        ptr_ = nullptr;
        bytes_ = 0;
    }
    void *ptr_ = nullptr;
    size_t bytes_ = 0;
};

/// Pinned host memory mapped into the device's address space: kernels write it directly, the
/// host reads it without a copy or a wait.
template <class T> class MappedHost {
  public:
    MappedHost() {
        if (cudaHostAlloc(reinterpret_cast<void **>(&host_), sizeof(T), cudaHostAllocMapped) != cudaSuccess) {
            (void)cudaGetLastError();
            fail(TW_STATUS_ALLOC_FAILED, "cudaHostAlloc of %zu mapped bytes failed", sizeof(T));
        }
        *host_ = T{};
        check(cudaHostGetDevicePointer(reinterpret_cast<void **>(&device_), host_, 0), "cudaHostGetDevicePointer");
    }
    ~MappedHost() { cudaFreeHost(host_); }
    MappedHost(const MappedHost &) = delete;
    MappedHost &operator=(const MappedHost &) = delete;
    volatile T *host() const { return host_; }
    T *device() const { return device_; }

  private:
    T *host_ = nullptr;
    T *device_ = nullptr;
};

/// A CUDA event for ordering only (no timing), owned.
class OrderEvent {
  public:
    OrderEvent() { check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreateWithFlags"); }
    ~OrderEvent() { cudaEventDestroy(event_); }
    OrderEvent(const OrderEvent &) = delete;
    OrderEvent &operator=(const OrderEvent &) = delete;
    cudaEvent_t get() const { return event_; }

  private:
    cudaEvent_t event_ = nullptr;
};

/// A branch beside the caller's stream: work enqueued on the stream fork(main) returns runs
/// beside main's later work, and main's work after join(main) waits for it. Only events connect
/// the two streams, so a captured call records the branch into its graph (the side stream joins
/// the capture at the fork) and an eager call keeps main's order. One call at a time (an FFN's
/// lock).
class StreamBranch {
  public:
    StreamBranch() { check(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"); }
    ~StreamBranch() { cudaStreamDestroy(side_); }
    StreamBranch(const StreamBranch &) = delete;
    StreamBranch &operator=(const StreamBranch &) = delete;
    /// The side stream, after main's work so far.
    cudaStream_t fork(cudaStream_t main) {
        mark(main);
        return fork_from_mark();
    }
    /// A fork in two steps, so that main's next work is enqueued before the side's: the point
    /// of main's work so far, then the side stream after that point.
    void mark(cudaStream_t main) { check(cudaEventRecord(forked_.get(), main), "cudaEventRecord"); }
    cudaStream_t fork_from_mark() {
        check(cudaStreamWaitEvent(side_, forked_.get(), 0), "cudaStreamWaitEvent");
        return side_;
    }
    /// Main's later work after the side stream's.
    void join(cudaStream_t main) {
        check(cudaEventRecord(joined_.get(), side_), "cudaEventRecord");
        check(cudaStreamWaitEvent(main, joined_.get(), 0), "cudaStreamWaitEvent");
    }

  private:
    OrderEvent forked_, joined_;
    cudaStream_t side_ = nullptr;
};

}  // namespace twblas::cuda
