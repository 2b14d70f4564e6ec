// Entry points: sparse descriptors, info, validation, conversions and the building blocks.
#include <cinttypes>

#include "boundary.hpp"
#include "host/numeric.hpp"

using namespace twblas;

namespace {

void check_twell_params(int64_t rows, int64_t cols, int32_t tileWidth, int32_t compression) {
    require_nonnegative(rows, "rows");
    require_nonnegative(cols, "cols");
    if (tileWidth != 64 && tileWidth != 128 && tileWidth != 256)
        fail(TW_STATUS_INVALID_VALUE, "tileWidth: %d is not 64, 128 or 256", tileWidth);
    if (compression != 2 && compression != 4 && compression != 8)
        fail(TW_STATUS_INVALID_VALUE, "compression: %d is not 2, 4 or 8", compression);
    if (cols > kMaxSparseCols)
        fail(TW_STATUS_NOT_SUPPORTED, "cols: %" PRId64 " exceeds 65536, the limit of 16-bit column indices", cols);
    if (rows > kMaxSparseRows) fail(TW_STATUS_NOT_SUPPORTED, "rows: %" PRId64 " exceeds INT32_MAX", rows);
}

void check_hybrid_params(int64_t rows, int64_t cols, int32_t ellWidth, int64_t backupRows, twDataType_t valueType) {
    require_nonnegative(rows, "rows");
    require_nonnegative(cols, "cols");
    if (ellWidth <= 0 || ellWidth % 8 != 0)
        fail(TW_STATUS_INVALID_VALUE, "ellWidth: %d is not a positive multiple of 8", ellWidth);
    if (backupRows < 0 || backupRows > rows)
        fail(TW_STATUS_INVALID_VALUE, "backupRows: %" PRId64 " is outside [0, rows = %" PRId64 "]", backupRows, rows);
    require_data_type(valueType, "valueType");
    if (cols > kMaxSparseCols)
        fail(TW_STATUS_NOT_SUPPORTED, "cols: %" PRId64 " exceeds 65536, the limit of 16-bit column indices", cols);
    if (rows > kMaxSparseRows) fail(TW_STATUS_NOT_SUPPORTED, "rows: %" PRId64 " exceeds INT32_MAX", rows);
}

void check_twell_type(twDataType_t valueType) {
    require_data_type(valueType, "valueType");
    if (!is_16bit(valueType))
        fail(TW_STATUS_NOT_SUPPORTED, "valueType: TwELL stores 16-bit values (TW_R_16BF or TW_R_16F), not TW_R_32F");
}

/// The buffer's last byte must not pass the end of the address space.
void require_buffer_fits(const void *buffer, size_t bytes) {
    if (reinterpret_cast<uintptr_t>(buffer) > UINTPTR_MAX - bytes)
        fail(TW_STATUS_INVALID_VALUE, "buffer: %p plus the container's %zu bytes passes the end of the address space",
             buffer, bytes);
}

twSpMatDescr_t register_sp(std::unique_ptr<twSpMatDescr> d) {
    registry_add(d.get(), ObjectKind::SpMat);
    return d.release();
}

void require_same_size(const twSpMatDescr &s, int64_t rows, int64_t cols, const char *name) {
    if (s.rows != rows || s.cols != cols)
        fail(TW_STATUS_INVALID_VALUE, "%s: expected %" PRId64 " x %" PRId64 ", got %" PRId64 " x %" PRId64, name, rows,
             cols, s.rows, s.cols);
}

}  // namespace

extern "C" {

twStatus_t twTwellBufferSize(int64_t rows, int64_t cols, int32_t tileWidth, int32_t compression, size_t *bytes) {
    return guarded(nullptr, [&] {
        require_ptr(bytes, "bytes");
        check_twell_params(rows, cols, tileWidth, compression);
        *bytes = TwellLayout::make(rows, cols, tileWidth, compression).bytes();
        return TW_STATUS_SUCCESS;
    });
}

twStatus_t twCreateTwell(twSpMatDescr_t *descr, int64_t rows, int64_t cols, int32_t tileWidth, int32_t compression,
                         void *buffer, twDataType_t valueType) {
    return guarded(nullptr, [&] {
        require_ptr(descr, "descr");
        check_twell_params(rows, cols, tileWidth, compression);
        check_twell_type(valueType);
        require_ptr(buffer, "buffer");
        require_aligned(buffer, 4, "buffer", "a TwELL buffer is an array of uint32 words");
        const TwellLayout layout = TwellLayout::make(rows, cols, tileWidth, compression);
        require_buffer_fits(buffer, layout.bytes());
        auto d = std::make_unique<twSpMatDescr>();
        d->format = TW_FORMAT_TWELL;
        d->rows = rows;
        d->cols = cols;
        d->type = valueType;
        d->buffer = buffer;
        d->twell = layout;
        *descr = register_sp(std::move(d));
        return TW_STATUS_SUCCESS;
    });
}

twStatus_t twHybridBufferSize(int64_t rows, int64_t cols, int32_t ellWidth, int64_t backupRows,
                              twDataType_t valueType, size_t *bytes) {
    return guarded(nullptr, [&] {
        require_ptr(bytes, "bytes");
        check_hybrid_params(rows, cols, ellWidth, backupRows, valueType);
        *bytes = HybridLayout::make(rows, cols, ellWidth, backupRows, value_size(valueType)).total;
        return TW_STATUS_SUCCESS;
    });
}

twStatus_t twCreateHybrid(twSpMatDescr_t *descr, int64_t rows, int64_t cols, int32_t ellWidth, int64_t backupRows,
                          void *buffer, twDataType_t valueType) {
    return guarded(nullptr, [&] {
        require_ptr(descr, "descr");
        check_hybrid_params(rows, cols, ellWidth, backupRows, valueType);
        require_ptr(buffer, "buffer");
        require_aligned(buffer, 16, "buffer", "the hybrid format's rule (formats.md)");
        const HybridLayout layout = HybridLayout::make(rows, cols, ellWidth, backupRows, value_size(valueType));
        require_buffer_fits(buffer, layout.total);
        auto d = std::make_unique<twSpMatDescr>();
        d->format = TW_FORMAT_HYBRID;
        d->rows = rows;
        d->cols = cols;
        d->type = valueType;
        d->buffer = buffer;
        d->hybrid = layout;
        *descr = register_sp(std::move(d));
        return TW_STATUS_SUCCESS;
    });
}

twStatus_t twDestroySpMat(twSpMatDescr_t descr) {
    return guarded(nullptr, [&] {
        if (!descr) return TW_STATUS_SUCCESS;
        if (!registry_destroy(descr, ObjectKind::SpMat)) fail_not_live(descr, ObjectKind::SpMat, "descr");
        return TW_STATUS_SUCCESS;
    });
}

twStatus_t twSpMatGetFormat(twSpMatDescr_t descr, twFormat_t *format) {
    return guarded(nullptr, [&] {
        const twSpMatDescr &d = get_sp(descr, "descr");
        require_ptr(format, "format");
        *format = d.format;
        return TW_STATUS_SUCCESS;
    });
}

twStatus_t twSpMatGetSize(twSpMatDescr_t descr, int64_t *rows, int64_t *cols) {
    return guarded(nullptr, [&] {
        const twSpMatDescr &d = get_sp(descr, "descr");
        if (rows) *rows = d.rows;
        if (cols) *cols = d.cols;
        return TW_STATUS_SUCCESS;
    });
}

twStatus_t twSpMatGetBuffer(twSpMatDescr_t descr, void **buffer, twDataType_t *valueType) {
    return guarded(nullptr, [&] {
        const twSpMatDescr &d = get_sp(descr, "descr");
        if (buffer) *buffer = d.buffer;
        if (valueType) *valueType = d.type;
        return TW_STATUS_SUCCESS;
    });
}

twStatus_t twSpMatGetInfo(twHandle_t handle, twSpMatDescr_t descr, twSpMatInfo_t *info) {
    return guarded(handle, [&] {
        twContext &ctx = get_handle(handle);
        const twSpMatDescr &d = get_sp(descr, "descr");
        require_ptr(info, "info");
        *info = ctx.impl->sparse_info(d);
        return TW_STATUS_SUCCESS;
    });
}

twStatus_t twSpMatValidate(twHandle_t handle, twSpMatDescr_t descr) {
    return guarded(handle, [&] {
        twContext &ctx = get_handle(handle);
        ctx.impl->sparse_validate(get_sp(descr, "descr"));
        return TW_STATUS_SUCCESS;
    });
}

// ---- conversions ---------------------------------------------------------------------------

static void check_dense_to_sparse(const twDnMatDescr &in, const twSpMatDescr &out, twConvertOp_t op) {
    require_convert_op(op, "op");
    require_same_size(out, in.rows, in.cols, "out");
    require_same_type(out.type, in.type, "in");
    require_disjoint(byte_range(out), "out", byte_range(in), "in");
}

/// The workspace of a dense -> sparse phase: present, aligned, apart from in and out.
static void check_d2s_workspace(twContext &ctx, const twDnMatDescr &in, const twSpMatDescr &out, void *workspace) {
    const ByteRange ws = require_workspace(ctx, workspace, ctx.impl->dense_to_sparse_workspace(in, out));
    require_disjoint(ws, "workspace", byte_range(in), "in");
    require_disjoint(ws, "workspace", byte_range(out), "out");
}

twStatus_t twDenseToSparse_bufferSize(twHandle_t h, twDnMatDescr_t in, twSpMatDescr_t out, twConvertOp_t op,
                                      size_t *bytes) {
    return guarded(h, [&] {
        twContext &ctx = get_handle(h);
        const twDnMatDescr &din = get_dn(in, "in");
        const twSpMatDescr &sout = get_sp(out, "out");
        require_ptr(bytes, "bytes");
        check_dense_to_sparse(din, sout, op);
        *bytes = ctx.impl->dense_to_sparse_workspace(din, sout);
        return TW_STATUS_SUCCESS;
    });
}

twStatus_t twDenseToSparse_analysis(twHandle_t h, twDnMatDescr_t in, twSpMatDescr_t out, twConvertOp_t op,
                                    void *workspace) {
    return guarded(h, [&] {
        twContext &ctx = get_handle(h);
        const twDnMatDescr &din = get_dn(in, "in");
        const twSpMatDescr &sout = get_sp(out, "out");
        check_dense_to_sparse(din, sout, op);
        check_d2s_workspace(ctx, din, sout, workspace);
        return ctx.impl->dense_to_sparse_analysis(din, sout, op, workspace);
    });
}

twStatus_t twDenseToSparse_convert(twHandle_t h, twDnMatDescr_t in, twSpMatDescr_t out, twConvertOp_t op,
                                   void *workspace) {
    return guarded(h, [&] {
        twContext &ctx = get_handle(h);
        const twDnMatDescr &din = get_dn(in, "in");
        const twSpMatDescr &sout = get_sp(out, "out");
        check_dense_to_sparse(din, sout, op);
        check_d2s_workspace(ctx, din, sout, workspace);
        return report_capacity(ctx, ctx.impl->dense_to_sparse_convert(din, sout, op, workspace), sout, "out");
    });
}

twStatus_t twSparseToDense(twHandle_t h, twSpMatDescr_t in, twDnMatDescr_t out) {
    return guarded(h, [&] {
        twContext &ctx = get_handle(h);
        const twSpMatDescr &sin = get_sp(in, "in");
        const twDnMatDescr &dout = get_dn(out, "out");
        require_shape(dout, sin.rows, sin.cols, "out");
        require_same_type(sin.type, dout.type, "out");
        require_disjoint(byte_range(dout), "out", byte_range(sin), "in");
        return ctx.impl->sparse_to_dense(sin, dout);
    });
}

twStatus_t twSparseConvert(twHandle_t h, twSpMatDescr_t in, twSpMatDescr_t out) {
    return guarded(h, [&] {
        twContext &ctx = get_handle(h);
        const twSpMatDescr &sin = get_sp(in, "in");
        const twSpMatDescr &sout = get_sp(out, "out");
        require_same_size(sout, sin.rows, sin.cols, "out");
        require_same_type(sin.type, sout.type, "out");
        require_disjoint(byte_range(sout), "out", byte_range(sin), "in");  // the same descriptor included
        return report_capacity(ctx, ctx.impl->sparse_convert(sin, sout), sout, "out");
    });
}

twStatus_t twSparseTranspose(twHandle_t h, twSpMatDescr_t in, twSpMatDescr_t out) {
    return guarded(h, [&] {
        twContext &ctx = get_handle(h);
        const twSpMatDescr &sin = get_sp(in, "in");
        const twSpMatDescr &sout = get_sp(out, "out");
        require_same_size(sout, sin.cols, sin.rows, "out");
        require_same_type(sin.type, sout.type, "out");
        require_disjoint(byte_range(sout), "out", byte_range(sin), "in");  // the same descriptor included
        return report_capacity(ctx, ctx.impl->sparse_transpose(sin, sout), sout, "out");
    });
}

// ---- building blocks -----------------------------------------------------------------------

static void check_gemm_to_sparse(const twDnMatDescr &a, const twDnMatDescr &b, const twSpMatDescr &c,
                                 twConvertOp_t act) {
    require_convert_op(act, "act");
    if (b.cols != a.cols)
        fail(TW_STATUS_INVALID_VALUE, "B: expected N x %" PRId64 " (K = A's columns), got %" PRId64 " x %" PRId64,
             a.cols, b.rows, b.cols);
    require_same_size(c, a.rows, b.rows, "C");
    require_same_type(a.type, b.type, "B");
    require_disjoint(byte_range(c), "C", byte_range(a), "A");
    require_disjoint(byte_range(c), "C", byte_range(b), "B");
}

twStatus_t twGemmToSparse_bufferSize(twHandle_t h, twDnMatDescr_t A, twDnMatDescr_t B, twSpMatDescr_t C,
                                     twConvertOp_t act, size_t *bytes) {
    return guarded(h, [&] {
        twContext &ctx = get_handle(h);
        const twDnMatDescr &a = get_dn(A, "A");
        const twDnMatDescr &b = get_dn(B, "B");
        const twSpMatDescr &c = get_sp(C, "C");
        require_ptr(bytes, "bytes");
        check_gemm_to_sparse(a, b, c, act);
        *bytes = ctx.impl->gemm_to_sparse_workspace(a, b, c);
        return TW_STATUS_SUCCESS;
    });
}

twStatus_t twGemmToSparse(twHandle_t h, float alpha, twDnMatDescr_t A, twDnMatDescr_t B, twSpMatDescr_t C,
                          twConvertOp_t act, void *workspace) {
    return guarded(h, [&] {
        twContext &ctx = get_handle(h);
        const twDnMatDescr &a = get_dn(A, "A");
        const twDnMatDescr &b = get_dn(B, "B");
        const twSpMatDescr &c = get_sp(C, "C");
        check_gemm_to_sparse(a, b, c, act);
        const ByteRange ws = require_workspace(ctx, workspace, ctx.impl->gemm_to_sparse_workspace(a, b, c));
        require_disjoint(ws, "workspace", byte_range(a), "A");
        require_disjoint(ws, "workspace", byte_range(b), "B");
        require_disjoint(ws, "workspace", byte_range(c), "C");
        ctx.impl->gemm_to_sparse(alpha, a, b, c, act, workspace);
        return TW_STATUS_SUCCESS;
    });
}

static void check_spmm(const twSpMatDescr &s, const twDnMatDescr &w, const twDnMatDescr &y) {
    if (w.rows != s.cols)
        fail(TW_STATUS_INVALID_VALUE, "W: expected %" PRId64 " x N (K = S's columns), got %" PRId64 " x %" PRId64, s.cols,
             w.rows, w.cols);
    require_shape(y, s.rows, w.cols, "Y");
    require_same_type(w.type, y.type, "Y");
    require_disjoint(byte_range(y), "Y", byte_range(s), "S");
    require_disjoint(byte_range(y), "Y", byte_range(w), "W");
}

twStatus_t twSpMM_bufferSize(twHandle_t h, twSpMatDescr_t S, twDnMatDescr_t W, twDnMatDescr_t Y, size_t *bytes) {
    return guarded(h, [&] {
        twContext &ctx = get_handle(h);
        const twSpMatDescr &s = get_sp(S, "S");
        const twDnMatDescr &w = get_dn(W, "W");
        const twDnMatDescr &y = get_dn(Y, "Y");
        require_ptr(bytes, "bytes");
        check_spmm(s, w, y);
        *bytes = ctx.impl->spmm_workspace(s, w, y);
        return TW_STATUS_SUCCESS;
    });
}

twStatus_t twSpMM(twHandle_t h, float alpha, twSpMatDescr_t S, twDnMatDescr_t W, float beta, twDnMatDescr_t Y,
                  void *workspace) {
    return guarded(h, [&] {
        twContext &ctx = get_handle(h);
        const twSpMatDescr &s = get_sp(S, "S");
        const twDnMatDescr &w = get_dn(W, "W");
        const twDnMatDescr &y = get_dn(Y, "Y");
        check_spmm(s, w, y);
        const ByteRange ws = require_workspace(ctx, workspace, ctx.impl->spmm_workspace(s, w, y));
        require_disjoint(ws, "workspace", byte_range(s), "S");
        require_disjoint(ws, "workspace", byte_range(w), "W");
        require_disjoint(ws, "workspace", byte_range(y), "Y");
        return ctx.impl->spmm(alpha, s, w, beta, y, workspace);
    });
}

}  // extern "C"
