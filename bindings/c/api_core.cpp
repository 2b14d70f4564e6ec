// Entry points: statuses, handles, version, dense descriptors.
#include <cinttypes>

#include "boundary.hpp"
#include "host/numeric.hpp"

using namespace twblas;

namespace twblas {

static thread_local std::string t_thread_error;
void set_thread_error(const std::string &message) { t_thread_error = message; }
const char *thread_error() { return t_thread_error.c_str(); }

void fail_not_live(const void *object, ObjectKind kind, const char *name) {
    const char *what = object_kind_name(kind);
    if (!object) fail(TW_STATUS_NOT_INITIALIZED, "%s: NULL %s", name, what);
    switch (registry_state(object, kind)) {
        case ObjectState::Destroyed:
            fail(TW_STATUS_NOT_INITIALIZED, "%s: this %s has been destroyed (used after its destroy call)", name, what);
        case ObjectState::LiveOtherKind:
            fail(TW_STATUS_NOT_INITIALIZED, "%s: not a %s (a live twblas object of another kind)", name, what);
        case ObjectState::Live:  // destroyed and re-created by another thread meanwhile: still not usable here
        case ObjectState::Unknown: break;
    }
    fail(TW_STATUS_NOT_INITIALIZED, "%s: not a live twblas %s (foreign, or destroyed long ago)", name, what);
}

twContext &get_handle(twHandle_t h) {
    if (!registry_contains(h, ObjectKind::Handle)) fail_not_live(h, ObjectKind::Handle, "handle");
    return *h;
}
const twDnMatDescr &get_dn(twDnMatDescr_t d, const char *name) {
    if (!registry_contains(d, ObjectKind::DnMat)) fail_not_live(d, ObjectKind::DnMat, name);
    return *d;
}
const twSpMatDescr &get_sp(twSpMatDescr_t d, const char *name) {
    if (!registry_contains(d, ObjectKind::SpMat)) fail_not_live(d, ObjectKind::SpMat, name);
    return *d;
}
twFfnDescr &get_ffn(twFfnDescr_t d, const char *name) {
    if (!registry_contains(d, ObjectKind::Ffn)) fail_not_live(d, ObjectKind::Ffn, name);
    return *d;
}

void require_ptr(const void *p, const char *name) {
    if (!p) fail(TW_STATUS_INVALID_VALUE, "%s: NULL pointer", name);
}
void require_nonnegative(int64_t v, const char *name) {
    if (v < 0) fail(TW_STATUS_INVALID_VALUE, "%s: must be >= 0, got %" PRId64, name, v);
}
void require_data_type(twDataType_t t, const char *name) {
    if (t != TW_R_32F && t != TW_R_16F && t != TW_R_16BF)
        fail(TW_STATUS_INVALID_VALUE, "%s: %d is not a twDataType_t (TW_R_32F, TW_R_16F, TW_R_16BF)", name, static_cast<int>(t));
}
void require_convert_op(twConvertOp_t op, const char *name) {
    if (op != TW_CONVERT_PLAIN && op != TW_CONVERT_RELU)
        fail(TW_STATUS_INVALID_VALUE, "%s: %d is not a twConvertOp_t (TW_CONVERT_PLAIN, TW_CONVERT_RELU)", name, static_cast<int>(op));
}
void require_shape(const twDnMatDescr &m, int64_t rows, int64_t cols, const char *name, const char *what) {
    if (m.rows != rows || m.cols != cols)
        fail(TW_STATUS_INVALID_VALUE, "%s: expected %" PRId64 " x %" PRId64 "%s, got %" PRId64 " x %" PRId64,
             name, rows, cols, what, m.rows, m.cols);
}
const char *type_name(twDataType_t t) {
    switch (t) {
        case TW_R_32F: return "TW_R_32F";
        case TW_R_16F: return "TW_R_16F";
        case TW_R_16BF: return "TW_R_16BF";
    }
    return "?";
}
void require_same_type(twDataType_t expected, twDataType_t got, const char *name) {
    if (expected != got)
        fail(TW_STATUS_NOT_SUPPORTED, "%s: value type %s, expected %s (mixed value types are not supported)", name,
             type_name(got), type_name(expected));
}
void require_aligned(const void *p, size_t alignment, const char *name, const char *what) {
    if (reinterpret_cast<uintptr_t>(p) % alignment != 0)
        fail(TW_STATUS_INVALID_VALUE, "%s: %p is not %zu-byte aligned (%s)", name, p, alignment, what);
}
size_t scratch_alignment(const twContext &ctx) { return ctx.backend == TW_BACKEND_CUDA ? 256 : 16; }
ByteRange require_workspace(const twContext &ctx, const void *workspace, size_t bytes) {
    if (bytes == 0) return ByteRange{};
    if (!workspace)
        fail(TW_STATUS_INVALID_VALUE, "workspace: NULL, but the call needs %zu bytes (see its _bufferSize)", bytes);
    require_aligned(workspace, scratch_alignment(ctx), "workspace",
                    ctx.backend == TW_BACKEND_CUDA ? "the CUDA backend's workspace rule; cudaMalloc gives 256"
                                                   : "the CPU backend's workspace rule; malloc gives 16");
    return byte_range(workspace, bytes);
}
void require_same_backend(const twContext &ctx, const twFfnDescr &ffn, const char *name) {
    if (ctx.backend != ffn.backend)
        fail(TW_STATUS_INVALID_VALUE, "%s: created on the %s backend, used with a %s handle", name,
             ffn.backend == TW_BACKEND_CUDA ? "CUDA" : "CPU", ctx.backend == TW_BACKEND_CUDA ? "CUDA" : "CPU");
}

twStatus_t report_capacity(twContext &ctx, twStatus_t status, const twSpMatDescr &c, const char *name) {
    if (status != TW_STATUS_CAPACITY_EXCEEDED) return status;
    const twSpMatInfo_t info = ctx.impl->sparse_info(c);
    if (c.format == TW_FORMAT_TWELL)
        ctx.last_error = format("%s: %" PRId64 " rows have a tile with more than %" PRId64
                                " non-zeros (the TwELL slots); their first entries are stored and the rows are "
                                "listed as overflow rows",
                                name, info.overflowRows, c.twell.slots);
    else
        ctx.last_error = format("%s: %" PRId64 " rows have more than %d non-zeros but only %" PRId64
                                " backup rows exist; the rows past the capacity are not stored",
                                name, info.overflowRows, c.hybrid.ell_width, c.hybrid.backup_rows);
    return status;
}

}  // namespace twblas

extern "C" {

const char *twGetStatusName(twStatus_t status) {
    switch (status) {
        case TW_STATUS_SUCCESS: return "TW_STATUS_SUCCESS";
        case TW_STATUS_NOT_INITIALIZED: return "TW_STATUS_NOT_INITIALIZED";
        case TW_STATUS_ALLOC_FAILED: return "TW_STATUS_ALLOC_FAILED";
        case TW_STATUS_INVALID_VALUE: return "TW_STATUS_INVALID_VALUE";
        case TW_STATUS_ARCH_MISMATCH: return "TW_STATUS_ARCH_MISMATCH";
        case TW_STATUS_EXECUTION_FAILED: return "TW_STATUS_EXECUTION_FAILED";
        case TW_STATUS_INTERNAL_ERROR: return "TW_STATUS_INTERNAL_ERROR";
        case TW_STATUS_NOT_SUPPORTED: return "TW_STATUS_NOT_SUPPORTED";
        case TW_STATUS_INSUFFICIENT_WORKSPACE: return "TW_STATUS_INSUFFICIENT_WORKSPACE";
        case TW_STATUS_CAPACITY_EXCEEDED: return "TW_STATUS_CAPACITY_EXCEEDED";
        case TW_STATUS_INCOMPLETE_INPUT: return "TW_STATUS_INCOMPLETE_INPUT";
    }
    return "TW_STATUS_<unknown>";
}

const char *twGetStatusString(twStatus_t status) {
    switch (status) {
        case TW_STATUS_SUCCESS: return "The call succeeded.";
        case TW_STATUS_NOT_INITIALIZED: return "A handle or descriptor is NULL, destroyed or not a twblas object.";
        case TW_STATUS_ALLOC_FAILED: return "Memory could not be allocated.";
        case TW_STATUS_INVALID_VALUE: return "An argument is invalid (pointer, dimension, layout or enum value).";
        case TW_STATUS_ARCH_MISMATCH: return "The device lacks a feature the routine needs.";
        case TW_STATUS_EXECUTION_FAILED: return "A kernel or vendor-library call failed.";
        case TW_STATUS_INTERNAL_ERROR: return "An internal twblas error occurred.";
        case TW_STATUS_NOT_SUPPORTED: return "The request is valid but not supported by this build or backend.";
        case TW_STATUS_INSUFFICIENT_WORKSPACE: return "The workspace is smaller than the routine needs.";
        case TW_STATUS_CAPACITY_EXCEEDED: return "A sparse container was too small for the data; see twSpMatGetInfo.";
        case TW_STATUS_INCOMPLETE_INPUT: return "A sparse input records rows it could not hold, so no exact result exists.";
    }
    return "Unknown twblas status value.";
}

twStatus_t twCreate(twHandle_t *handle) { return twCreateWithBackend(handle, TW_BACKEND_DEFAULT); }

twStatus_t twCreateWithBackend(twHandle_t *handle, twBackend_t backend) {
    return guarded(nullptr, [&] {
        require_ptr(handle, "handle");
        if (backend != TW_BACKEND_DEFAULT && backend != TW_BACKEND_CPU && backend != TW_BACKEND_CUDA)
            fail(TW_STATUS_INVALID_VALUE, "backend: %d is not a twBackend_t", static_cast<int>(backend));
        if (backend == TW_BACKEND_DEFAULT) backend = cuda_backend_usable() ? TW_BACKEND_CUDA : TW_BACKEND_CPU;
        auto ctx = std::make_unique<twContext>();
        ctx->backend = backend;
        ctx->impl = backend == TW_BACKEND_CUDA ? make_cuda_backend(&ctx->stream) : make_reference_backend();
        registry_add(ctx.get(), ObjectKind::Handle);
        *handle = ctx.release();
        return TW_STATUS_SUCCESS;
    });
}

twStatus_t twDestroy(twHandle_t handle) {
    return guarded(nullptr, [&] {
        if (!handle) return TW_STATUS_SUCCESS;
        if (!registry_destroy(handle, ObjectKind::Handle)) fail_not_live(handle, ObjectKind::Handle, "handle");
        return TW_STATUS_SUCCESS;
    });
}

twStatus_t twGetBackend(twHandle_t handle, twBackend_t *backend) {
    return guarded(handle, [&] {
        twContext &ctx = get_handle(handle);
        require_ptr(backend, "backend");
        *backend = ctx.backend;
        return TW_STATUS_SUCCESS;
    });
}

twStatus_t twSetStream(twHandle_t handle, void *stream) {
    return guarded(handle, [&] {
        get_handle(handle).stream = stream;
        return TW_STATUS_SUCCESS;
    });
}

twStatus_t twGetStream(twHandle_t handle, void **stream) {
    return guarded(handle, [&] {
        twContext &ctx = get_handle(handle);
        require_ptr(stream, "stream");
        *stream = ctx.stream;
        return TW_STATUS_SUCCESS;
    });
}

const char *twGetErrorMessage(twHandle_t handle) {
    if (registry_contains(handle, ObjectKind::Handle)) return handle->last_error.c_str();
    return thread_error();
}

twStatus_t twGetVersion(int *version) {
    return guarded(nullptr, [&] {
        require_ptr(version, "version");
        *version = TWBLAS_VERSION;
        return TW_STATUS_SUCCESS;
    });
}

twStatus_t twCreateDnMat(twDnMatDescr_t *descr, int64_t rows, int64_t cols, int64_t ld, void *values,
                         twDataType_t valueType, twOrder_t order) {
    return guarded(nullptr, [&] {
        require_ptr(descr, "descr");
        require_nonnegative(rows, "rows");
        require_nonnegative(cols, "cols");
        require_data_type(valueType, "valueType");
        if (order != TW_ORDER_ROW && order != TW_ORDER_COL)
            fail(TW_STATUS_INVALID_VALUE, "order: %d is not a twOrder_t (TW_ORDER_ROW, TW_ORDER_COL)", static_cast<int>(order));
        const int64_t min_ld = order == TW_ORDER_ROW ? cols : rows;
        const int64_t lines = order == TW_ORDER_ROW ? rows : cols;
        if (ld < min_ld)
            fail(TW_STATUS_INVALID_VALUE, "ld: %" PRId64 " is less than %s (%" PRId64 ") for %s", ld,
                 order == TW_ORDER_ROW ? "cols" : "rows", min_ld, order == TW_ORDER_ROW ? "TW_ORDER_ROW" : "TW_ORDER_COL");
        if (ld > 0 && lines > INT64_MAX / 4 / ld)
            fail(TW_STATUS_INVALID_VALUE, "ld: %" PRId64 " x %" PRId64 " elements overflow the address space", ld, lines);
        if (rows > 0 && cols > 0 && !values) fail(TW_STATUS_INVALID_VALUE, "values: NULL for a %" PRId64 " x %" PRId64 " matrix", rows, cols);
        const size_t esize = value_size(valueType);
        if (values) {
            require_aligned(values, esize, "values", "values are aligned to their element size");
            // lines * ld * esize fits int64 (above); the last byte must not pass the end of the
            // address space either
            twDnMatDescr probe;
            probe.rows = rows;
            probe.cols = cols;
            probe.ld = ld;
            probe.type = valueType;
            probe.order = order;
            if (reinterpret_cast<uintptr_t>(values) > UINTPTR_MAX - dense_extent_bytes(probe))
                fail(TW_STATUS_INVALID_VALUE, "values: %p plus the matrix's %zu bytes passes the end of the address space",
                     values, dense_extent_bytes(probe));
        }
        auto d = std::make_unique<twDnMatDescr>();
        d->rows = rows;
        d->cols = cols;
        d->ld = ld;
        d->values = values;
        d->type = valueType;
        d->order = order;
        registry_add(d.get(), ObjectKind::DnMat);
        *descr = d.release();
        return TW_STATUS_SUCCESS;
    });
}

twStatus_t twDestroyDnMat(twDnMatDescr_t descr) {
    return guarded(nullptr, [&] {
        if (!descr) return TW_STATUS_SUCCESS;
        if (!registry_destroy(descr, ObjectKind::DnMat)) fail_not_live(descr, ObjectKind::DnMat, "descr");
        return TW_STATUS_SUCCESS;
    });
}

twStatus_t twDnMatGet(twDnMatDescr_t descr, int64_t *rows, int64_t *cols, int64_t *ld, void **values,
                      twDataType_t *valueType, twOrder_t *order) {
    return guarded(nullptr, [&] {
        const twDnMatDescr &d = get_dn(descr, "descr");
        if (rows) *rows = d.rows;
        if (cols) *cols = d.cols;
        if (ld) *ld = d.ld;
        if (values) *values = d.values;
        if (valueType) *valueType = d.type;
        if (order) *order = d.order;
        return TW_STATUS_SUCCESS;
    });
}

}  // extern "C"
