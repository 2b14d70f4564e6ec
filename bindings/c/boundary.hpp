// Shared anatomy of every extern "C" entry point: look up the handle, check arguments, run the
// body, and turn every C++ exception into a status plus a message (on the handle, or on the
// calling thread when there is no valid handle). Nothing escapes into C.
#pragma once

#include <new>
#include <string>

#include "host/backend.hpp"
#include "host/error.hpp"
#include "host/memory_range.hpp"
#include "host/objects.hpp"

namespace twblas {

/// Message of the last failed call on this thread that had no valid handle (like errno).
void set_thread_error(const std::string &message);
const char *thread_error();

/// Runs `body` (returning twStatus_t) for a call made with `handle` (may be NULL or invalid:
/// the body's own checks report that). Messages go to the handle when it is live.
template <class Body>
twStatus_t guarded(twHandle_t handle, Body &&body) noexcept {
    auto record = [&](const std::string &message) {
        if (registry_contains(handle, ObjectKind::Handle)) {
            try {
                handle->last_error = message;
                return;
            } catch (...) {
            }
        }
        set_thread_error(message);
    };
    try {
        return body();
    } catch (const Error &e) {
        record(e.what());
        return e.status();
    } catch (const std::bad_alloc &) {
        record("out of host memory");
        return TW_STATUS_ALLOC_FAILED;
    } catch (const std::exception &e) {
        record(std::string("internal error: ") + e.what());
        return TW_STATUS_INTERNAL_ERROR;
    } catch (...) {
        record("internal error: unknown exception");
        return TW_STATUS_INTERNAL_ERROR;
    }
}

// ---- object look-ups: NOT_INITIALIZED unless the pointer is a live object of that kind
/// NOT_INITIALIZED for `object`, argument `name`, which is not a live object of `kind`; the
/// message says whether it is NULL, destroyed (still in the registry's quarantine), a live
/// object of another kind, or unknown.
[[noreturn]] void fail_not_live(const void *object, ObjectKind kind, const char *name);
twContext &get_handle(twHandle_t h);
const twDnMatDescr &get_dn(twDnMatDescr_t d, const char *name);
const twSpMatDescr &get_sp(twSpMatDescr_t d, const char *name);
twFfnDescr &get_ffn(twFfnDescr_t d, const char *name);

// ---- argument checks: INVALID_VALUE naming the argument
void require_ptr(const void *p, const char *name);
void require_nonnegative(int64_t v, const char *name);
void require_data_type(twDataType_t t, const char *name);
void require_convert_op(twConvertOp_t op, const char *name);
/// `m` must be rows x cols (logical); `what` explains the expected shape.
void require_shape(const twDnMatDescr &m, int64_t rows, int64_t cols, const char *name,
                   const char *what = "");
void require_same_type(twDataType_t expected, twDataType_t got, const char *name);
/// INVALID_VALUE naming `name` unless `p` is a multiple of `alignment` (a power of two); `what`
/// says what needs it.
void require_aligned(const void *p, size_t alignment, const char *name, const char *what);
/// Alignment a backend needs of workspace and saved-state pointers: 256 bytes on the CUDA
/// backend (it carves them into 256-byte aligned pieces relative to the start, cuBLASLt's
/// workspace among them, and reads them with 16-byte vector loads), 16 on the CPU backend.
size_t scratch_alignment(const twContext &ctx);
/// A workspace of `bytes` bytes: a pointer when bytes > 0, aligned to scratch_alignment(ctx).
/// Returns its byte range for the overlap checks (empty when bytes == 0).
ByteRange require_workspace(const twContext &ctx, const void *workspace, size_t bytes);
/// Sparse output/input memory must live where the handle's backend computes; the C layer can
/// not check device pointers without CUDA, so this only checks the FFN's backend.
void require_same_backend(const twContext &ctx, const twFfnDescr &ffn, const char *name);
const char *type_name(twDataType_t t);

/// CAPACITY_EXCEEDED with a message built from the container's counts; SUCCESS passes.
twStatus_t report_capacity(twContext &ctx, twStatus_t status, const twSpMatDescr &container,
                           const char *name);

}  // namespace twblas
