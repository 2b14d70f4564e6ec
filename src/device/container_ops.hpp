// Inspection and conversions of TwELL / hybrid containers on the device: twSpMatGetInfo,
// twSpMatValidate, the dense -> sparse analysis, sparse -> dense, re-packing and the transpose.
// These are setup calls whose contract returns a result to the host (counts, a validation
// verdict, CAPACITY_EXCEEDED, INCOMPLETE_INPUT): each runs its kernels on the handle's stream
// and reads back only the bytes that decide it (and, for a failed validation, the one row or
// record entry that the message describes). No matrix is ever copied to the host. The sparse ->
// sparse conversions take temporary device memory for their sorted entry lists, stream-ordered
// (from the handle's own memory pool, ScratchPool), since their API has no workspace.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/check.hpp"
#include "common/device_buffer.hpp"
#include "common/device_info.hpp"
#include "host/objects.hpp"

namespace twblas::cuda {

struct InspectResult;

/// The memory pool of a handle's conversion scratch, made at its first use: memory freed at the
/// end of a call stays (up to kKeepBytes) for the next one. The device's default pool gives its
/// free memory back to the driver at every synchronisation (release threshold 0), so every call
/// allocated afresh; changing the default pool's threshold would change the user's process.
class ScratchPool {
  public:
    static constexpr uint64_t kKeepBytes = uint64_t{256} << 20;
    explicit ScratchPool(int device) : device_(device) {}
    ~ScratchPool();  // the driver releases the memory once the last free has run
    ScratchPool(const ScratchPool &) = delete;
    ScratchPool &operator=(const ScratchPool &) = delete;
    cudaMemPool_t get();

  private:
    int device_;
    cudaMemPool_t pool_ = nullptr;
};

class ContainerOps {
  public:
    explicit ContainerOps(const DeviceInfo &device);
    twSpMatInfo_t info(cudaStream_t stream, const twSpMatDescr &s);
    /// Throws INVALID_VALUE with the reference's message for the first violation, naming `name`.
    void validate(cudaStream_t stream, const twSpMatDescr &s, const char *name);
    /// The reference's capacity verdict on `in` (op), counted on the device.
    twStatus_t dense_to_sparse_analysis(cudaStream_t stream, const twDnMatDescr &in, const twSpMatDescr &out,
                                        twConvertOp_t op);
    /// The dense -> sparse writer into `out`, then capacity_status.
    twStatus_t dense_to_sparse_convert(cudaStream_t stream, const twDnMatDescr &in, const twSpMatDescr &out,
                                       twConvertOp_t op, void *workspace);
    twStatus_t sparse_to_dense(cudaStream_t stream, const twSpMatDescr &in, const twDnMatDescr &out);
    twStatus_t sparse_convert(cudaStream_t stream, const twSpMatDescr &in, const twSpMatDescr &out);
    twStatus_t sparse_transpose(cudaStream_t stream, const twSpMatDescr &in, const twSpMatDescr &out);

  private:
    /// Blocks of 4 warps for a kernel whose warps take the rows in turn: one per 4 rows, at most
    /// full_grid_.
    unsigned stride_blocks(int64_t rows) const;
    /// After a device conversion into `out` whose overflow count went to published<int32_t>()
    /// too (or that has no rows): CAPACITY_EXCEEDED when it says rows did not fit (synchronises).
    /// Returned, not thrown, as the reference does, so that the C boundary words the same message
    /// from twSpMatGetInfo.
    twStatus_t capacity_status(cudaStream_t stream, const twSpMatDescr &out);
    /// Where a kernel leaves the few bytes that decide a setup call's status for the host: the
    /// mapped staging memory, read after the stream's work with no copy queued behind it (a
    /// kernel + sync took 12.7 us on an H100 against 16.0 with a pinned copy after it).
    template <class T> T *published() const {
        static_assert(sizeof(T) <= sizeof(Staging), "what is published fits the staging memory");
        return reinterpret_cast<T *>(staging_.device());
    }
    /// Waits for the stream's work, then reads what its kernels published.
    template <class T> T read_published(cudaStream_t stream) {
        check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
        return staged<T>();
    }
    /// For a call whose status is decided before its last kernel ends: clears the posted word,
    /// which a kernel sets (system-scope release) after publishing; returns its device address.
    unsigned *arm_post();
    /// Waits only until the word is posted (not for the stream's later work), then reads what was
    /// published. The kernels after the post go on in the stream, as a compute call's do.
    template <class T> T await_posted(cudaStream_t stream) {
        wait_for_post(stream);
        return staged<T>();
    }
    void wait_for_post(cudaStream_t stream);
    /// What the staging memory holds now.
    template <class T> T staged() const {
        T v;
        std::memcpy(&v, const_cast<const Staging *>(staging_.host())->bytes, sizeof v);
        return v;
    }
    /// Validates `in` and refuses one that records rows it could not hold (INCOMPLETE_INPUT).
    void require_complete(cudaStream_t stream, const twSpMatDescr &in);
    /// validate(), returning what the device found (the record / backup count included).
    InspectResult checked(cudaStream_t stream, const twSpMatDescr &s, const char *name);
    /// The validation kernel, queued: it leaves its findings in the result it returns.
    const InspectResult *launch_validation(cudaStream_t stream, const twSpMatDescr &s);
    InspectResult fetch_result(cudaStream_t stream, const InspectResult *result);
    /// The host side of validation: the first failing item's check, which throws its message.
    void report(cudaStream_t stream, const twSpMatDescr &s, const char *name, const InspectResult &r);
    /// INCOMPLETE_INPUT when a validated `in` records rows it could not hold.
    static void complete_verdict(const twSpMatDescr &in, const InspectResult &r);
    /// The two result slots of an inspection: `use` is clear (the call before cleared it), and
    /// the inspection's first kernel clears `clear`, the slot the call before used, for the next
    /// one, so no call spends a launch on clearing. After that kernel is queued, advance().
    struct Slots {
        InspectResult *use, *clear;
    };
    /// The slots for a call on `stream`. A TwELL -> dense call returns once its verdict is
    /// posted, while its writer still reads the verdict's slot; a call on another stream first
    /// orders itself after that writer (writer_done_), so that it never overwrites the slot under
    /// it (same stream: the stream's order does it).
    Slots slots(cudaStream_t stream);
    void advance() { slot_ ^= 1; }
    /// Copies `bytes` at `src` to `dst` after the stream's work and waits for it: through pinned
    /// memory when they fit it (a copy into pageable memory costs the driver a staging copy and a
    /// wait of its own), straight otherwise (the failing row a validation message describes).
    void read_back(cudaStream_t stream, void *dst, const void *src, size_t bytes);
    template <class T> T read_one(cudaStream_t stream, const uint8_t *base, size_t byte_offset) {
        T v{};
        read_back(stream, &v, base + byte_offset, sizeof v);
        return v;
    }
    struct Staging {
        alignas(16) unsigned char bytes[64];
        unsigned posted;  // arm_post / await_posted
    };
    DeviceBuffer result_;     // two InspectResult slots, used in turn by the calls (they synchronise)
    int slot_ = 0;            // the slot the next call uses
    bool pdl_;                // DeviceInfo::pdl: twell_rows_to_dense by programmatic dependent launch
    bool slot_held_ = false;  // a twell_rows_to_dense on held_stream_ may still read a slot
    cudaStream_t held_stream_ = nullptr;
    OrderEvent writer_done_;  // recorded after that writer (the stream may be gone by the next call)
    unsigned full_grid_;      // blocks of 4 warps that fill the GPU once (16 an SM)
    ScratchPool scratch_pool_;  // the sparse -> sparse conversions' temporaries
    MappedHost<Staging> staging_;  // the pinned landing place of every small read-back
};

}  // namespace twblas::cuda
