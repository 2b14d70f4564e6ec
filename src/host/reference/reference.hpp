// The Eigen reference backend: simple and obviously right, the oracle every other backend is
// tested against. Dense parts use Eigen fp32 GEMMs (multi-threaded through OpenMP when
// available); sparse parts touch active units only; accumulation is fp32 throughout.
// Host memory only. It allocates host memory inside compute calls (Eigen temporaries); the
// no-allocation rule is the CUDA backend's, where graph capture depends on it.
#pragma once

#include <Eigen/Core>

#include "host/backend.hpp"

namespace twblas::reference {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Rows [r0, r0 + n) of a dense matrix as fp32 (exact for every value type).
RowMatrix load_rows(const twDnMatDescr &m, int64_t r0, int64_t n);
inline RowMatrix load(const twDnMatDescr &m) { return load_rows(m, 0, m.rows); }
/// Stores fp32 `src` (cols values) as row r of m, rounded to m's type.
void store_row(const twDnMatDescr &m, int64_t r, const float *src);
/// Stores every row of `src` (m.rows x m.cols) into m.
void store(const twDnMatDescr &m, const RowMatrix &src);

/// Rows handled together by the reference's blocked loops (bounds its scratch memory).
constexpr int64_t kRowBlock = 128;

class ReferenceBackend final : public Backend {
  public:
    twBackend_t kind() const override { return TW_BACKEND_CPU; }

    twSpMatInfo_t sparse_info(const twSpMatDescr &s) override;
    void sparse_validate(const twSpMatDescr &s) override;

    size_t dense_to_sparse_workspace(const twDnMatDescr &in, const twSpMatDescr &out) override;
    twStatus_t dense_to_sparse_analysis(const twDnMatDescr &in, const twSpMatDescr &out, twConvertOp_t op,
                                        void *workspace) override;
    twStatus_t dense_to_sparse_convert(const twDnMatDescr &in, const twSpMatDescr &out, twConvertOp_t op,
                                       void *workspace) override;
    twStatus_t sparse_to_dense(const twSpMatDescr &in, const twDnMatDescr &out) override;
    twStatus_t sparse_convert(const twSpMatDescr &in, const twSpMatDescr &out) override;
    twStatus_t sparse_transpose(const twSpMatDescr &in, const twSpMatDescr &out) override;

    size_t gemm_to_sparse_workspace(const twDnMatDescr &a, const twDnMatDescr &b, const twSpMatDescr &c) override;
    void gemm_to_sparse(float alpha, const twDnMatDescr &a, const twDnMatDescr &b, const twSpMatDescr &c,
                        twConvertOp_t act, void *workspace) override;
    size_t spmm_workspace(const twSpMatDescr &s, const twDnMatDescr &w, const twDnMatDescr &y) override;
    twStatus_t spmm(float alpha, const twSpMatDescr &s, const twDnMatDescr &w, float beta, const twDnMatDescr &y,
                    void *workspace) override;

    std::unique_ptr<FfnState> ffn_create(const twFfnDescr &ffn, const twDnMatDescr *wg, const twDnMatDescr &wu,
                                         const twDnMatDescr &wd) override;
    void ffn_update_weights(twFfnDescr &ffn, const twDnMatDescr *wg, const twDnMatDescr &wu,
                            const twDnMatDescr &wd) override;
    bool ffn_fp8_weights() const override { return true; }
    size_t ffn_forward_workspace(const twFfnDescr &ffn, int64_t tokens) override;
    void ffn_forward(twFfnDescr &ffn, const twDnMatDescr &x, const twDnMatDescr &y, const twSpMatDescr *hidden,
                     void *workspace) override;
    twFfnStats_t ffn_stats(const twFfnDescr &ffn) override;
    void ffn_write_l1(const twFfnDescr &ffn, float *dst) override;
    void ffn_neuron_counts(const twFfnDescr &ffn, int64_t *counts) override;
    void ffn_reset_neuron_counts(twFfnDescr &ffn) override;

    size_t ffn_saved_bytes(const twFfnDescr &ffn, int64_t tokens) override;
    void ffn_forward_train(twFfnDescr &ffn, const twDnMatDescr &x, const twDnMatDescr &y, void *saved,
                           void *workspace) override;
    size_t ffn_backward_workspace(const twFfnDescr &ffn, int64_t tokens) override;
    void ffn_backward(twFfnDescr &ffn, const twDnMatDescr &x, const void *saved, const twDnMatDescr &dy,
                      L1Coefficient l1, const twDnMatDescr &dx, const twDnMatDescr *dwg, const twDnMatDescr &dwu,
                      const twDnMatDescr &dwd, void *workspace) override;
};

}  // namespace twblas::reference
