// Entry points: FFN descriptors, the fused forward, statistics, training forward and backward.
#include <cinttypes>
#include <cmath>
#include <cstring>

#include "boundary.hpp"
#include "host/numeric.hpp"

using namespace twblas;

namespace {

const char *kWeightHint = " (H x D)";  // for the gradients
const char *kDownHint = " (H x D; TW_ORDER_COL for nn.Linear's down_proj.weight)";

/// Checks the weights of an FFN of kind `kind`; returns {D, H}. The first weight in the argument
/// list (wGate when gated, else wUp) sets H x D; the others must match it.
std::pair<int64_t, int64_t> check_weights(twFfnKind_t kind, twDnMatDescr_t wGate, const twDnMatDescr &wu,
                                          const twDnMatDescr &wd, const twDnMatDescr **wg_out) {
    *wg_out = nullptr;
    const twDnMatDescr *first = &wu;
    const char *first_name = "wUp";
    if (kind == TW_FFN_GATED_RELU) {
        if (!wGate) fail(TW_STATUS_INVALID_VALUE, "wGate: NULL, but TW_FFN_GATED_RELU needs the gate weights");
        *wg_out = first = &get_dn(wGate, "wGate");
        first_name = "wGate";
    } else if (wGate) {
        fail(TW_STATUS_INVALID_VALUE, "wGate: must be NULL for TW_FFN_RELU");
    }
    const int64_t h = first->rows, d = first->cols;
    if (h == 0 || d == 0)
        fail(TW_STATUS_INVALID_VALUE, "%s: expected H x D with H, D >= 1, got %" PRId64 " x %" PRId64, first_name, h, d);
    if (d > kMaxSparseCols || h > kMaxSparseCols)
        fail(TW_STATUS_NOT_SUPPORTED, "%s: %" PRId64 " x %" PRId64 ": D and H are limited to 65536 (16-bit indices)",
             first_name, h, d);
    const std::string hint = format(" (H x D as %s)", first_name);
    if (*wg_out) require_shape(wu, h, d, "wUp", hint.c_str());
    require_shape(wd, h, d, "wDown", kDownHint);
    require_same_type(first->type, wu.type, "wUp");
    require_same_type(first->type, wd.type, "wDown");
    return {d, h};
}

void check_kind(twFfnKind_t kind) {
    if (kind != TW_FFN_GATED_RELU && kind != TW_FFN_RELU)
        fail(TW_STATUS_INVALID_VALUE, "kind: %d is not a twFfnKind_t (TW_FFN_GATED_RELU, TW_FFN_RELU)", static_cast<int>(kind));
}

/// Tokens of one call. The backends keep token ids and counts in 32 bits (saved state, dense-row
/// lists, sort keys), so one call takes at most INT32_MAX tokens. That bound, with D and H at most
/// 65536, also keeps every size a backend derives from the token count (a few hundred kB per
/// token at most) far inside a 64-bit size_t: a tokens argument that would wrap a _bufferSize
/// is refused here, before any backend computes with it.
constexpr int64_t kMaxTokens = INT32_MAX;
static_assert(sizeof(size_t) >= 8, "the token bound above relies on a 64-bit size_t");

void check_tokens(int64_t tokens, const char *name) {
    require_nonnegative(tokens, name);
    if (tokens > kMaxTokens)
        fail(TW_STATUS_INVALID_VALUE, "%s: %" PRId64 " tokens; one call takes at most INT32_MAX = %" PRId64
             " tokens (32-bit token ids): split the batch", name, tokens, kMaxTokens);
}

/// X: M x D, and y (named y_name: Y or dY): M x D, both of the FFN's value type.
void check_activations(const twFfnDescr &ffn, const twDnMatDescr &x, const twDnMatDescr &y, const char *y_name = "Y") {
    check_tokens(x.rows, "X");
    if (x.cols != ffn.model_dim)
        fail(TW_STATUS_INVALID_VALUE, "X: expected M x %" PRId64 " (D), got %" PRId64 " x %" PRId64, ffn.model_dim, x.rows,
             x.cols);
    require_shape(y, x.rows, ffn.model_dim, y_name, " (M x D, M = X's rows)");
    require_same_type(ffn.type, x.type, "X");
    require_same_type(ffn.type, y.type, y_name);
}

/// Y may be X itself (the same memory, ld and order: the in-place forward, row by row); any
/// other overlap of Y with X is INVALID_VALUE.
void check_forward_overlap(const twDnMatDescr &x, const twDnMatDescr &y) {
    if (x.values == y.values && x.ld == y.ld && x.order == y.order) return;  // shape and type match already
    require_disjoint(byte_range(y), "Y", byte_range(x), "X");
}

bool is_pointer_attribute(twFfnAttribute_t attr) {
    return attr == TW_FFN_ATTR_L1_OUTPUT || attr == TW_FFN_ATTR_L1_COEFF_POINTER;
}
/// An attribute's value size: a pointer for the pointer attributes, int32 for the rest (an
/// unknown attribute is reported by the caller's switch).
void require_attribute_size(twFfnAttribute_t attr, size_t size) {
    if (attr == TW_FFN_ATTR_WEIGHT_COPY_BYTES) {
        if (size != sizeof(int64_t)) fail(TW_STATUS_INVALID_VALUE, "size: %zu, expected sizeof(int64_t) = 8", size);
    } else if (is_pointer_attribute(attr)) {
        if (size != sizeof(void *)) fail(TW_STATUS_INVALID_VALUE, "size: %zu, expected sizeof(void *) = %zu", size, sizeof(void *));
    } else if (size != sizeof(int32_t)) {
        fail(TW_STATUS_INVALID_VALUE, "size: %zu, expected sizeof(int32_t) = 4", size);
    }
}

/// The FFN's l1 output, when set: reachable by the backend (checked before a forward writes
/// anything) and apart from the call's other operands.
void require_l1_output(const twContext &ctx, const twFfnDescr &f, std::initializer_list<std::pair<ByteRange, const char *>> others) {
    if (!f.l1_output) return;
    ctx.impl->require_accessible(f.l1_output, "TW_FFN_ATTR_L1_OUTPUT");
    const ByteRange l1 = byte_range(f.l1_output, sizeof(float));
    for (const auto &o : others) require_disjoint(l1, "TW_FFN_ATTR_L1_OUTPUT", o.first, o.second);
}

/// A saved-state pointer: present and aligned as a workspace (scratch_alignment).
/// TW_COMPUTE_FP8_WEIGHTS is an inference mode: the training calls say so.
void require_not_fp8(const twFfnDescr &f, const char *call) {
    if (f.compute_mode == TW_COMPUTE_FP8_WEIGHTS)
        fail(TW_STATUS_NOT_SUPPORTED, "ffn: TW_COMPUTE_FP8_WEIGHTS is for inference (twSpGEMMFused); %s needs "
             "TW_COMPUTE_DEFAULT or TW_COMPUTE_HIGHEST_PRECISION", call);
}

/// TW_COMPUTE_FP8_WEIGHTS on a backend without it.
void require_fp8_available(const twContext &ctx, const twFfnDescr &f) {
    if (f.compute_mode == TW_COMPUTE_FP8_WEIGHTS && !ctx.impl->ffn_fp8_weights())
        fail(TW_STATUS_NOT_SUPPORTED, "ffn: TW_COMPUTE_FP8_WEIGHTS is not implemented by this handle's backend yet "
             "(the CPU reference has it)");
}

void require_saved(const twContext &ctx, const void *saved) {
    require_ptr(saved, "saved");
    require_aligned(saved, scratch_alignment(ctx), "saved",
                    ctx.backend == TW_BACKEND_CUDA ? "the CUDA backend's rule for workspaces and saved state"
                                                   : "the CPU backend's rule for workspaces and saved state");
}

}  // namespace

extern "C" {

twStatus_t twCreateFfn(twHandle_t h, twFfnDescr_t *ffn, twFfnKind_t kind, twDnMatDescr_t wGate, twDnMatDescr_t wUp,
                       twDnMatDescr_t wDown) {
    return guarded(h, [&] {
        twContext &ctx = get_handle(h);
        require_ptr(ffn, "ffn");
        check_kind(kind);
        const twDnMatDescr &wu = get_dn(wUp, "wUp");
        const twDnMatDescr &wd = get_dn(wDown, "wDown");
        const twDnMatDescr *wg = nullptr;
        const auto [d, hdim] = check_weights(kind, wGate, wu, wd, &wg);
        auto f = std::make_unique<twFfnDescr>();
        f->kind = kind;
        f->model_dim = d;
        f->hidden_dim = hdim;
        f->type = wu.type;
        f->backend = ctx.backend;
        f->state = ctx.impl->ffn_create(*f, wg, wu, wd);
        registry_add(f.get(), ObjectKind::Ffn);
        *ffn = f.release();
        return TW_STATUS_SUCCESS;
    });
}

twStatus_t twFfnUpdateWeights(twHandle_t h, twFfnDescr_t ffn, twDnMatDescr_t wGate, twDnMatDescr_t wUp,
                              twDnMatDescr_t wDown) {
    return guarded(h, [&] {
        twContext &ctx = get_handle(h);
        twFfnDescr &f = get_ffn(ffn, "ffn");
        require_same_backend(ctx, f, "ffn");
        const twDnMatDescr &wu = get_dn(wUp, "wUp");
        const twDnMatDescr &wd = get_dn(wDown, "wDown");
        const twDnMatDescr *wg = nullptr;
        const auto [d, hdim] = check_weights(f.kind, wGate, wu, wd, &wg);
        if (d != f.model_dim || hdim != f.hidden_dim)
            fail(TW_STATUS_INVALID_VALUE, "%s: expected %" PRId64 " x %" PRId64 " as at twCreateFfn, got %" PRId64 " x %" PRId64,
                 wg ? "wGate" : "wUp", f.hidden_dim, f.model_dim, hdim, d);
        require_same_type(f.type, wg ? wg->type : wu.type, wg ? "wGate" : "wUp");
        ctx.impl->ffn_update_weights(f, wg, wu, wd);
        return TW_STATUS_SUCCESS;
    });
}

twStatus_t twDestroyFfn(twFfnDescr_t ffn) {
    return guarded(nullptr, [&] {
        if (!ffn) return TW_STATUS_SUCCESS;
        if (!registry_destroy(ffn, ObjectKind::Ffn)) fail_not_live(ffn, ObjectKind::Ffn, "ffn");
        return TW_STATUS_SUCCESS;
    });
}

twStatus_t twFfnGetSize(twFfnDescr_t ffn, int64_t *modelDim, int64_t *hiddenDim) {
    return guarded(nullptr, [&] {
        const twFfnDescr &f = get_ffn(ffn, "ffn");
        if (modelDim) *modelDim = f.model_dim;
        if (hiddenDim) *hiddenDim = f.hidden_dim;
        return TW_STATUS_SUCCESS;
    });
}

twStatus_t twFfnSetAttribute(twFfnDescr_t ffn, twFfnAttribute_t attr, const void *value, size_t size) {
    return guarded(nullptr, [&] {
        twFfnDescr &f = get_ffn(ffn, "ffn");
        if (attr == TW_FFN_ATTR_WEIGHT_COPY_BYTES)
            fail(TW_STATUS_INVALID_VALUE, "attr: TW_FFN_ATTR_WEIGHT_COPY_BYTES is read-only (twFfnGetAttribute)");
        require_ptr(value, "value");
        require_attribute_size(attr, size);
        if (is_pointer_attribute(attr)) {
            void *p;
            std::memcpy(&p, value, sizeof p);
            if (p) require_aligned(p, alignof(float), "value", "a float's address");
            if (attr == TW_FFN_ATTR_L1_OUTPUT) f.l1_output = static_cast<float *>(p);
            else f.l1_coeff_pointer = static_cast<const float *>(p);
            return TW_STATUS_SUCCESS;
        }
        int32_t v;
        std::memcpy(&v, value, sizeof v);
        switch (attr) {
            case TW_FFN_ATTR_TILE_WIDTH:
                if (v != 64 && v != 128 && v != 256) fail(TW_STATUS_INVALID_VALUE, "value: tile width %d is not 64, 128 or 256", v);
                f.tile_width = v;
                break;
            case TW_FFN_ATTR_COMPRESSION:
                if (v != 2 && v != 4 && v != 8) fail(TW_STATUS_INVALID_VALUE, "value: compression %d is not 2, 4 or 8", v);
                f.compression = v;
                break;
            case TW_FFN_ATTR_COMPUTE_MODE:
                if (v != TW_COMPUTE_DEFAULT && v != TW_COMPUTE_HIGHEST_PRECISION && v != TW_COMPUTE_FP8_WEIGHTS)
                    fail(TW_STATUS_INVALID_VALUE, "value: %d is not a twComputeMode_t", v);
                if (v == TW_COMPUTE_FP8_WEIGHTS && f.type == TW_R_32F)
                    fail(TW_STATUS_NOT_SUPPORTED, "value: TW_COMPUTE_FP8_WEIGHTS is for 16-bit FFNs; this one is fp32");
                if (f.state) f.state->prepare_compute_mode(v);
                f.compute_mode = v;
                break;
            case TW_FFN_ATTR_DETERMINISTIC:
                if (v != 0 && v != 1) fail(TW_STATUS_INVALID_VALUE, "value: deterministic must be 0 or 1, got %d", v);
                f.deterministic = v;
                break;
            case TW_FFN_ATTR_SAVE_DENSE:
                if (v != TW_SAVE_DENSE_NEVER && v != TW_SAVE_DENSE_ALWAYS && v != TW_SAVE_DENSE_AUTO)
                    fail(TW_STATUS_INVALID_VALUE, "value: %d is not a twSaveDense_t (0, 1 or 2)", v);
                f.save_dense = v;
                break;
            case TW_FFN_ATTR_CALL_GRAPHS:
                if (v != 0 && v != 1) fail(TW_STATUS_INVALID_VALUE, "value: call_graphs must be 0 or 1, got %d", v);
                f.call_graphs = v;
                break;
            case TW_FFN_ATTR_ALGORITHM:
                if (v < TW_FFN_ALG_DEFAULT || v > TW_FFN_ALG_MASKED_TWO_PASS)
                    fail(TW_STATUS_INVALID_VALUE, "value: %d is not a twFfnAlgorithm_t", v);
                f.algorithm = v;
                break;
            default: fail(TW_STATUS_INVALID_VALUE, "attr: %d is not a twFfnAttribute_t", static_cast<int>(attr));
        }
        return TW_STATUS_SUCCESS;
    });
}

twStatus_t twFfnGetAttribute(twFfnDescr_t ffn, twFfnAttribute_t attr, void *value, size_t size) {
    return guarded(nullptr, [&] {
        const twFfnDescr &f = get_ffn(ffn, "ffn");
        require_ptr(value, "value");
        require_attribute_size(attr, size);
        if (is_pointer_attribute(attr)) {
            const void *p = attr == TW_FFN_ATTR_L1_OUTPUT ? static_cast<const void *>(f.l1_output) : f.l1_coeff_pointer;
            std::memcpy(value, &p, sizeof p);
            return TW_STATUS_SUCCESS;
        }
        if (attr == TW_FFN_ATTR_WEIGHT_COPY_BYTES) {
            const int64_t bytes = f.state ? f.state->weight_copy_bytes() : 0;
            std::memcpy(value, &bytes, sizeof bytes);
            return TW_STATUS_SUCCESS;
        }
        int32_t v = 0;
        switch (attr) {
            case TW_FFN_ATTR_TILE_WIDTH: v = f.tile_width; break;
            case TW_FFN_ATTR_COMPRESSION: v = f.compression; break;
            case TW_FFN_ATTR_COMPUTE_MODE: v = f.compute_mode; break;
            case TW_FFN_ATTR_DETERMINISTIC: v = f.deterministic; break;
            case TW_FFN_ATTR_SAVE_DENSE: v = f.save_dense; break;
            case TW_FFN_ATTR_CALL_GRAPHS: v = f.call_graphs; break;
            case TW_FFN_ATTR_ALGORITHM: v = f.algorithm; break;
            default: fail(TW_STATUS_INVALID_VALUE, "attr: %d is not a twFfnAttribute_t", static_cast<int>(attr));
        }
        std::memcpy(value, &v, sizeof v);
        return TW_STATUS_SUCCESS;
    });
}

twStatus_t twFfnSetTuning(twFfnDescr_t ffn, const char *name, double value) {
    return guarded(nullptr, [&] {
        twFfnDescr &f = get_ffn(ffn, "ffn");
        require_ptr(name, "name");
        if (!f.state || !f.state->set_tuning(name, value))
            fail(TW_STATUS_NOT_SUPPORTED, "ffn: this backend has no tuning knobs");
        return TW_STATUS_SUCCESS;
    });
}

twStatus_t twFfnGetTuning(twFfnDescr_t ffn, const char *name, double *value) {
    return guarded(nullptr, [&] {
        const twFfnDescr &f = get_ffn(ffn, "ffn");
        require_ptr(name, "name");
        require_ptr(value, "value");
        if (!f.state || !f.state->get_tuning(name, value))
            fail(TW_STATUS_NOT_SUPPORTED, "ffn: this backend has no tuning knobs");
        return TW_STATUS_SUCCESS;
    });
}

twStatus_t twSpGEMMFused_bufferSize(twHandle_t h, twFfnDescr_t ffn, twDnMatDescr_t X, twDnMatDescr_t Y, size_t *bytes) {
    return guarded(h, [&] {
        twContext &ctx = get_handle(h);
        twFfnDescr &f = get_ffn(ffn, "ffn");
        require_same_backend(ctx, f, "ffn");
        require_fp8_available(ctx, f);
        const twDnMatDescr &x = get_dn(X, "X");
        const twDnMatDescr &y = get_dn(Y, "Y");
        require_ptr(bytes, "bytes");
        check_activations(f, x, y);
        check_forward_overlap(x, y);  // the same checks as the call
        *bytes = x.rows == 0 ? 0 : ctx.impl->ffn_forward_workspace(f, x.rows);
        return TW_STATUS_SUCCESS;
    });
}

twStatus_t twSpGEMMFused(twHandle_t h, twFfnDescr_t ffn, twDnMatDescr_t X, twDnMatDescr_t Y, twSpMatDescr_t hidden,
                         void *workspace) {
    return guarded(h, [&] {
        twContext &ctx = get_handle(h);
        twFfnDescr &f = get_ffn(ffn, "ffn");
        require_same_backend(ctx, f, "ffn");
        require_fp8_available(ctx, f);
        const twDnMatDescr &x = get_dn(X, "X");
        const twDnMatDescr &y = get_dn(Y, "Y");
        check_activations(f, x, y);
        check_forward_overlap(x, y);
        const twSpMatDescr *hid = nullptr;
        if (hidden) {
            hid = &get_sp(hidden, "hidden");
            if (hid->rows != x.rows || hid->cols != f.hidden_dim)
                fail(TW_STATUS_INVALID_VALUE, "hidden: expected %" PRId64 " x %" PRId64 " (M x H), got %" PRId64 " x %" PRId64,
                     x.rows, f.hidden_dim, hid->rows, hid->cols);
            require_disjoint(byte_range(*hid), "hidden", byte_range(x), "X");
            require_disjoint(byte_range(*hid), "hidden", byte_range(y), "Y");
        }
        if (x.rows == 0) return TW_STATUS_SUCCESS;
        const ByteRange ws = require_workspace(ctx, workspace, ctx.impl->ffn_forward_workspace(f, x.rows));
        require_disjoint(ws, "workspace", byte_range(x), "X");
        require_disjoint(ws, "workspace", byte_range(y), "Y");
        if (hid) require_disjoint(ws, "workspace", byte_range(*hid), "hidden");
        require_l1_output(ctx, f, {{byte_range(x), "X"}, {byte_range(y), "Y"}, {ws, "workspace"}});
        ctx.impl->ffn_forward(f, x, y, hid, workspace);
        if (f.l1_output) ctx.impl->ffn_write_l1(f, f.l1_output);
        return TW_STATUS_SUCCESS;
    });
}

twStatus_t twFfnGetStats(twHandle_t h, twFfnDescr_t ffn, twFfnStats_t *stats) {
    return guarded(h, [&] {
        twContext &ctx = get_handle(h);
        twFfnDescr &f = get_ffn(ffn, "ffn");
        require_same_backend(ctx, f, "ffn");
        require_ptr(stats, "stats");
        *stats = ctx.impl->ffn_stats(f);
        return TW_STATUS_SUCCESS;
    });
}

twStatus_t twFfnGetNeuronCounts(twHandle_t h, twFfnDescr_t ffn, int64_t *counts) {
    return guarded(h, [&] {
        twContext &ctx = get_handle(h);
        twFfnDescr &f = get_ffn(ffn, "ffn");
        require_same_backend(ctx, f, "ffn");
        require_ptr(counts, "counts");
        require_aligned(counts, alignof(int64_t), "counts", "an int64_t array");
        ctx.impl->ffn_neuron_counts(f, counts);
        return TW_STATUS_SUCCESS;
    });
}

twStatus_t twFfnResetNeuronCounts(twHandle_t h, twFfnDescr_t ffn) {
    return guarded(h, [&] {
        twContext &ctx = get_handle(h);
        twFfnDescr &f = get_ffn(ffn, "ffn");
        require_same_backend(ctx, f, "ffn");
        ctx.impl->ffn_reset_neuron_counts(f);
        return TW_STATUS_SUCCESS;
    });
}

twStatus_t twSpGEMMFusedSaved_bufferSize(twHandle_t h, twFfnDescr_t ffn, int64_t tokens, size_t *bytes) {
    return guarded(h, [&] {
        twContext &ctx = get_handle(h);
        twFfnDescr &f = get_ffn(ffn, "ffn");
        require_same_backend(ctx, f, "ffn");
        require_not_fp8(f, "twSpGEMMFusedSaved_bufferSize");
        check_tokens(tokens, "tokens");
        require_ptr(bytes, "bytes");
        // no tokens: the training forward and the backward do not touch the saved state
        *bytes = tokens == 0 ? 0 : ctx.impl->ffn_saved_bytes(f, tokens);
        return TW_STATUS_SUCCESS;
    });
}

twStatus_t twSpGEMMFusedForwardTrain(twHandle_t h, twFfnDescr_t ffn, twDnMatDescr_t X, twDnMatDescr_t Y, void *saved,
                                     void *workspace) {
    return guarded(h, [&] {
        twContext &ctx = get_handle(h);
        twFfnDescr &f = get_ffn(ffn, "ffn");
        require_same_backend(ctx, f, "ffn");
        require_not_fp8(f, "twSpGEMMFusedForwardTrain");
        const twDnMatDescr &x = get_dn(X, "X");
        const twDnMatDescr &y = get_dn(Y, "Y");
        check_activations(f, x, y);
        check_forward_overlap(x, y);
        if (x.rows == 0) return TW_STATUS_SUCCESS;  // touches nothing: saved and workspace may be NULL
        require_saved(ctx, saved);
        const ByteRange sv = byte_range(saved, ctx.impl->ffn_saved_extent(f, x.rows, saved, false));
        require_disjoint(sv, "saved", byte_range(x), "X");
        require_disjoint(sv, "saved", byte_range(y), "Y");
        const ByteRange ws = require_workspace(ctx, workspace, ctx.impl->ffn_forward_workspace(f, x.rows));
        require_disjoint(ws, "workspace", byte_range(x), "X");
        require_disjoint(ws, "workspace", byte_range(y), "Y");
        require_disjoint(ws, "workspace", sv, "saved");
        require_l1_output(ctx, f, {{byte_range(x), "X"}, {byte_range(y), "Y"}, {sv, "saved"}, {ws, "workspace"}});
        ctx.impl->ffn_forward_train(f, x, y, saved, workspace);
        if (f.l1_output) ctx.impl->ffn_write_l1(f, f.l1_output);
        return TW_STATUS_SUCCESS;
    });
}

twStatus_t twSpGEMMFusedBackward_bufferSize(twHandle_t h, twFfnDescr_t ffn, int64_t tokens, size_t *bytes) {
    return guarded(h, [&] {
        twContext &ctx = get_handle(h);
        twFfnDescr &f = get_ffn(ffn, "ffn");
        require_same_backend(ctx, f, "ffn");
        require_not_fp8(f, "twSpGEMMFusedBackward_bufferSize");
        check_tokens(tokens, "tokens");
        require_ptr(bytes, "bytes");
        // no tokens: the backward only writes zero weight gradients, without a workspace
        *bytes = tokens == 0 ? 0 : ctx.impl->ffn_backward_workspace(f, tokens);
        return TW_STATUS_SUCCESS;
    });
}

twStatus_t twSpGEMMFusedBackward(twHandle_t h, twFfnDescr_t ffn, twDnMatDescr_t X, const void *saved, twDnMatDescr_t dY,
                                 float l1Coeff, twDnMatDescr_t dX, twDnMatDescr_t dWgate, twDnMatDescr_t dWup,
                                 twDnMatDescr_t dWdown, void *workspace) {
    return guarded(h, [&] {
        twContext &ctx = get_handle(h);
        twFfnDescr &f = get_ffn(ffn, "ffn");
        require_same_backend(ctx, f, "ffn");
        require_not_fp8(f, "twSpGEMMFusedBackward");
        const twDnMatDescr &x = get_dn(X, "X");
        const twDnMatDescr &dy = get_dn(dY, "dY");
        check_activations(f, x, dy, "dY");
        const twDnMatDescr &dx = get_dn(dX, "dX");
        require_shape(dx, x.rows, f.model_dim, "dX", " (M x D)");
        require_same_type(f.type, dx.type, "dX");
        const twDnMatDescr *dwg = nullptr;
        if (f.gated()) {
            if (!dWgate) fail(TW_STATUS_INVALID_VALUE, "dWgate: NULL, but TW_FFN_GATED_RELU has gate weights to differentiate");
            dwg = &get_dn(dWgate, "dWgate");
            require_shape(*dwg, f.hidden_dim, f.model_dim, "dWgate", kWeightHint);
            require_same_type(f.type, dwg->type, "dWgate");
        } else if (dWgate) {
            fail(TW_STATUS_INVALID_VALUE, "dWgate: must be NULL for TW_FFN_RELU");
        }
        const twDnMatDescr &dwu = get_dn(dWup, "dWup");
        require_shape(dwu, f.hidden_dim, f.model_dim, "dWup", kWeightHint);
        require_same_type(f.type, dwu.type, "dWup");
        const twDnMatDescr &dwd = get_dn(dWdown, "dWdown");
        require_shape(dwd, f.hidden_dim, f.model_dim, "dWdown", kDownHint);
        require_same_type(f.type, dwd.type, "dWdown");
        // l1Coeff from the call, or read where TW_FFN_ATTR_L1_COEFF_POINTER says when the backward runs
        const L1Coefficient l1{f.l1_coeff_pointer ? 0.0f : l1Coeff, f.l1_coeff_pointer};
        if (!l1.at && !std::isfinite(l1Coeff)) fail(TW_STATUS_INVALID_VALUE, "l1Coeff: must be finite");
        if (l1.at) ctx.impl->require_accessible(l1.at, "TW_FFN_ATTR_L1_COEFF_POINTER");
        // outputs apart from the inputs and from each other
        const std::pair<const twDnMatDescr *, const char *> outputs[] = {
            {&dx, "dX"}, {dwg, "dWgate"}, {&dwu, "dWup"}, {&dwd, "dWdown"}};
        for (size_t i = 0; i < 4; ++i) {
            if (!outputs[i].first) continue;
            const ByteRange o = byte_range(*outputs[i].first);
            require_disjoint(o, outputs[i].second, byte_range(x), "X");
            require_disjoint(o, outputs[i].second, byte_range(dy), "dY");
            for (size_t j = 0; j < i; ++j)
                if (outputs[j].first) require_disjoint(o, outputs[i].second, byte_range(*outputs[j].first), outputs[j].second);
        }
        if (x.rows == 0) {
            // no tokens: the weight gradients are zero ("outputs are overwritten"); X, dY, dX,
            // saved and workspace are not touched (may be NULL)
            for (const twDnMatDescr *dw : {dwg, &dwu, &dwd})
                if (dw) ctx.impl->fill_zero(*dw);
            return TW_STATUS_SUCCESS;
        }
        require_saved(ctx, saved);
        const ByteRange sv = byte_range(saved, ctx.impl->ffn_saved_extent(f, x.rows, saved, true));
        const ByteRange ws = require_workspace(ctx, workspace, ctx.impl->ffn_backward_workspace(f, x.rows));
        require_disjoint(ws, "workspace", byte_range(x), "X");
        require_disjoint(ws, "workspace", byte_range(dy), "dY");
        require_disjoint(ws, "workspace", sv, "saved");
        for (const auto &o : outputs) {
            if (!o.first) continue;
            require_disjoint(byte_range(*o.first), o.second, sv, "saved");
            require_disjoint(ws, "workspace", byte_range(*o.first), o.second);
        }
        ctx.impl->ffn_backward(f, x, saved, dy, l1, dx, dwg, dwu, dwd, workspace);
        return TW_STATUS_SUCCESS;
    });
}

}  // extern "C"
