// The operations every backend provides, declared once. The reference (Eigen, host memory)
// and CUDA backends each implement this interface; `override` makes the compiler check that
// their signatures match. Arguments arrive already validated by the C boundary.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "objects.hpp"

namespace twblas {

/// The backward's l1Coeff: the call's value, or (`at` not NULL, TW_FFN_ATTR_L1_COEFF_POINTER)
/// read from this backend's memory when the backward runs.
struct L1Coefficient {
    float value = 0.0f;
    const float *at = nullptr;
};

/// Backend-private state of an FFN descriptor (packed weights, statistics, neuron counts).
struct FfnState {
    virtual ~FfnState() = default;
    /// Called by twFfnSetAttribute before the FFN's compute mode becomes `mode`: a backend that
    /// needs memory for it (the CUDA backend's FP8 copy) takes it here, in a setup call, never in
    /// a compute call. Throws (the mode stays as it was) when it cannot.
    virtual void prepare_compute_mode(int32_t mode) { (void)mode; }
    /// Bytes of weight copies this FFN holds in the backend's memory (TW_FFN_ATTR_WEIGHT_COPY_BYTES):
    /// 0 when the weights are read where the caller keeps them.
    virtual int64_t weight_copy_bytes() const = 0;
    /// Tuning knobs by name (twFfnSetTuning): false when the backend has none. A backend with
    /// knobs throws INVALID_VALUE for an unknown name or a value out of range.
    virtual bool set_tuning(const char *name, double value) {
        (void)name, (void)value;
        return false;
    }
    virtual bool get_tuning(const char *name, double *value) const {
        (void)name, (void)value;
        return false;
    }
};

class Backend {
  public:
    virtual ~Backend() = default;
    virtual twBackend_t kind() const = 0;
    /// Throws INVALID_VALUE naming `name` when this backend's kernels cannot reach `p` (a host
    /// backend reaches any address it is given).
    virtual void require_accessible(const void *p, const char *name) const {
        (void)p;
        (void)name;
    }

    // ---- sparse containers
    virtual twSpMatInfo_t sparse_info(const twSpMatDescr &s) = 0;
    /// Throws Error(TW_STATUS_INVALID_VALUE, first violation) when an invariant fails.
    virtual void sparse_validate(const twSpMatDescr &s) = 0;

    // ---- conversions (setup calls; return CAPACITY_EXCEEDED when `out` was too small; throw
    // INCOMPLETE_INPUT, writing nothing, when a sparse `in` records rows it could not hold)
    virtual size_t dense_to_sparse_workspace(const twDnMatDescr &in, const twSpMatDescr &out) = 0;
    virtual twStatus_t dense_to_sparse_analysis(const twDnMatDescr &in, const twSpMatDescr &out,
                                                twConvertOp_t op, void *workspace) = 0;
    virtual twStatus_t dense_to_sparse_convert(const twDnMatDescr &in, const twSpMatDescr &out,
                                               twConvertOp_t op, void *workspace) = 0;
    virtual twStatus_t sparse_to_dense(const twSpMatDescr &in, const twDnMatDescr &out) = 0;
    virtual twStatus_t sparse_convert(const twSpMatDescr &in, const twSpMatDescr &out) = 0;
    virtual twStatus_t sparse_transpose(const twSpMatDescr &in, const twSpMatDescr &out) = 0;

    // ---- building blocks (compute calls)
    virtual size_t gemm_to_sparse_workspace(const twDnMatDescr &a, const twDnMatDescr &b,
                                            const twSpMatDescr &c) = 0;
    virtual void gemm_to_sparse(float alpha, const twDnMatDescr &a, const twDnMatDescr &b,
                                const twSpMatDescr &c, twConvertOp_t act, void *workspace) = 0;
    virtual size_t spmm_workspace(const twSpMatDescr &s, const twDnMatDescr &w,
                                  const twDnMatDescr &y) = 0;
    /// Y untouched and INCOMPLETE_INPUT (or, where the backend cannot tell without a
    /// synchronisation, NaN rows) when S records rows it could not hold.
    virtual twStatus_t spmm(float alpha, const twSpMatDescr &s, const twDnMatDescr &w, float beta,
                            const twDnMatDescr &y, void *workspace) = 0;

    // ---- fused feed-forward
    /// Setup: copies the weights into the backend's layout (wg NULL for plain ReLU).
    virtual std::unique_ptr<FfnState> ffn_create(const twFfnDescr &ffn, const twDnMatDescr *wg,
                                                 const twDnMatDescr &wu,
                                                 const twDnMatDescr &wd) = 0;
    virtual void ffn_update_weights(twFfnDescr &ffn, const twDnMatDescr *wg,
                                    const twDnMatDescr &wu, const twDnMatDescr &wd) = 0;
    virtual size_t ffn_forward_workspace(const twFfnDescr &ffn, int64_t tokens) = 0;
    /// Whether ffn_forward implements TW_COMPUTE_FP8_WEIGHTS (the API refuses it otherwise).
    virtual bool ffn_fp8_weights() const { return false; }
    virtual void ffn_forward(twFfnDescr &ffn, const twDnMatDescr &x, const twDnMatDescr &y,
                             const twSpMatDescr *hidden, void *workspace) = 0;
    virtual twFfnStats_t ffn_stats(const twFfnDescr &ffn) = 0;
    /// The l1 of the last forward (ffn_stats' l1, rounded to float) to `dst` in this backend's
    /// memory, in stream order, without blocking (TW_FFN_ATTR_L1_OUTPUT).
    virtual void ffn_write_l1(const twFfnDescr &ffn, float *dst) = 0;
    virtual void ffn_neuron_counts(const twFfnDescr &ffn, int64_t *counts) = 0;
    virtual void ffn_reset_neuron_counts(twFfnDescr &ffn) = 0;

    // ---- training
    /// Sets every element of the dense matrix `m` (in this backend's memory) to +0: the weight
    /// gradients of a backward over no tokens, which the C boundary answers without calling
    /// ffn_backward. The default writes host memory, which is right for a host backend such as
    /// the reference; any other backend must override it (the default refuses with
    /// NOT_SUPPORTED rather than write device memory from the host).
    virtual void fill_zero(const twDnMatDescr &m);
    /// twSpGEMMFusedSaved_bufferSize (a backend may remember its answer: TW_SAVE_DENSE_AUTO).
    virtual size_t ffn_saved_bytes(const twFfnDescr &ffn, int64_t tokens) = 0;
    /// Bytes of `saved` that a training forward (backward = false) will write, or that the
    /// forward which wrote it wrote (backward = true): the overlap checks' extent. No side effect.
    /// The default, for backends whose size query remembers nothing, is that query's answer.
    virtual size_t ffn_saved_extent(const twFfnDescr &ffn, int64_t tokens, const void *saved, bool backward) {
        (void)saved, (void)backward;
        return ffn_saved_bytes(ffn, tokens);
    }
    virtual void ffn_forward_train(twFfnDescr &ffn, const twDnMatDescr &x, const twDnMatDescr &y,
                                   void *saved, void *workspace) = 0;
    virtual size_t ffn_backward_workspace(const twFfnDescr &ffn, int64_t tokens) = 0;
    virtual void ffn_backward(twFfnDescr &ffn, const twDnMatDescr &x, const void *saved,
                              const twDnMatDescr &dy, L1Coefficient l1, const twDnMatDescr &dx,
                              const twDnMatDescr *dwg, const twDnMatDescr &dwu,
                              const twDnMatDescr &dwd, void *workspace) = 0;
};

/// The Eigen reference backend (src/host/reference).
std::unique_ptr<Backend> make_reference_backend();
/// The CUDA backend (src/device), or an Error(NOT_SUPPORTED) saying why it is unavailable.
/// `stream_slot` points at the handle's stream, which the backend reads at each call.
std::unique_ptr<Backend> make_cuda_backend(void *const *stream_slot);
/// Whether the CUDA backend was compiled in and a usable GPU is present.
bool cuda_backend_usable();

}  // namespace twblas
