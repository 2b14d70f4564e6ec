// Captured calls: a compute call's kernels captured once into a CUDA graph and replayed when the
// same arguments come back, so that an eager call costs one graph launch of host time instead of
// one launch per kernel (measured on the H100 machine: ~4 us per kernel launch, ~2-4 us per graph
// launch). Bounded (least recently used out), owned by an FFN, guarded by the caller's lock.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/check.hpp"

namespace twblas::cuda {

/// Everything the enqueued work depends on (pointers, shapes, path choices), as words.
class CallKey {
  public:
    static constexpr size_t kMaxWords = 64;
    template <class T> CallKey &add(const T &v) {
        static_assert(sizeof(T) <= 8, "add fields one by one");
        if (n_ == kMaxWords) fail(TW_STATUS_INTERNAL_ERROR, "CallKey: more than %zu words", kMaxWords);
        uint64_t w = 0;
        std::memcpy(&w, &v, sizeof(T));
        words_[n_++] = w;
        return *this;
    }
    bool operator==(const CallKey &o) const {
        return n_ == o.n_ && std::memcmp(words_.data(), o.words_.data(), n_ * sizeof(uint64_t)) == 0;
    }

  private:
    std::array<uint64_t, kMaxWords> words_{};
    size_t n_ = 0;
};

class CallGraphs {
  public:
    /// `capacity` graphs at most; captures happen on `capture_stream` (never executes work).
    explicit CallGraphs(size_t capacity);
    ~CallGraphs();
    CallGraphs(const CallGraphs &) = delete;
    CallGraphs &operator=(const CallGraphs &) = delete;

    /// Enqueues the work of `enqueue(s)` on `stream`: replays the graph of `key` when there is
    /// one; the second time a key is seen, captures `enqueue` into a graph and launches it; else
    /// (first sight, a capturing `stream`, capture unavailable, or not `allowed`: the FFN's
    /// TW_FFN_ATTR_CALL_GRAPHS) calls enqueue(stream) directly.
    template <class F> void run(cudaStream_t stream, const CallKey &key, bool allowed, F &&enqueue) {
        if (!allowed) {
            enqueue(stream);
            return;
        }
        cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
        check(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing");
        Entry *e = disabled_ || status != cudaStreamCaptureStatusNone ? nullptr : find(key);
        if (!e) {  // first sight (or the caller's own graph records the kernels): run directly
            if (!disabled_ && status == cudaStreamCaptureStatusNone) insert(key);
            enqueue(stream);
            return;
        }
        if (!e->exec) {
            begin_capture();
            bool invalidated = false;  // by another thread's device synchronisation: not this call's error
            try {
                enqueue(capture_stream_);
            } catch (...) {
                invalidated = capture_invalidated();
                abandon_capture();
                if (!invalidated) throw;
            }
            e->exec = invalidated ? nullptr : end_capture();
            if (!e->exec) {  // this call runs directly; after kMaxFailedCaptures every call does
                // (a capture also fails when another thread synchronises the device meanwhile)
                disabled_ = ++failed_captures_ >= kMaxFailedCaptures;
                enqueue(stream);
                return;
            }
        }
        launch(*e, stream);
    }

    /// Whether `key` was seen before (its arguments were checked then).
    bool seen(const CallKey &key) const {
        for (const Entry &e : entries_)
            if (e.key == key) return true;
        return false;
    }

  private:
    struct Entry {
        CallKey key;
        cudaGraphExec_t exec = nullptr;  // NULL: seen once, not captured yet
        uint64_t last_use = 0;
    };
    Entry *find(const CallKey &key);
    Entry &insert(const CallKey &key);
    void begin_capture();
    void abandon_capture();
    bool capture_invalidated() const;
    cudaGraphExec_t end_capture();
    void launch(Entry &e, cudaStream_t stream);

    size_t capacity_;
    std::vector<Entry> entries_;
    uint64_t clock_ = 0;
    cudaStream_t capture_stream_ = nullptr;
    static constexpr int kMaxFailedCaptures = 3;
    int failed_captures_ = 0;
    bool disabled_ = false;  // captures failed kMaxFailedCaptures times: every call runs directly
};

}  // namespace twblas::cuda
