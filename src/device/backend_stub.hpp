// A backend whose every operation reports TW_STATUS_NOT_SUPPORTED with one reason. It stands in
// for the CUDA backend until its kernels exist, so the rest of the library never special-cases.
#pragma once

#include <string>

#include "host/backend.hpp"
#include "host/error.hpp"

namespace twblas {

class UnavailableBackend final : public Backend {
  public:
    UnavailableBackend(twBackend_t kind, std::string reason) : kind_(kind), reason_(std::move(reason)) {}
    twBackend_t kind() const override { return kind_; }

    twSpMatInfo_t sparse_info(const twSpMatDescr &) override { no("twSpMatGetInfo"); }
    void sparse_validate(const twSpMatDescr &) override { no("twSpMatValidate"); }
    size_t dense_to_sparse_workspace(const twDnMatDescr &, const twSpMatDescr &) override { no("twDenseToSparse"); }
    twStatus_t dense_to_sparse_analysis(const twDnMatDescr &, const twSpMatDescr &, twConvertOp_t, void *) override {
        no("twDenseToSparse_analysis");
    }
    twStatus_t dense_to_sparse_convert(const twDnMatDescr &, const twSpMatDescr &, twConvertOp_t, void *) override {
        no("twDenseToSparse_convert");
    }
    twStatus_t sparse_to_dense(const twSpMatDescr &, const twDnMatDescr &) override { no("twSparseToDense"); }
    twStatus_t sparse_convert(const twSpMatDescr &, const twSpMatDescr &) override { no("twSparseConvert"); }
    twStatus_t sparse_transpose(const twSpMatDescr &, const twSpMatDescr &) override { no("twSparseTranspose"); }
    size_t gemm_to_sparse_workspace(const twDnMatDescr &, const twDnMatDescr &, const twSpMatDescr &) override {
        no("twGemmToSparse");
    }
    void gemm_to_sparse(float, const twDnMatDescr &, const twDnMatDescr &, const twSpMatDescr &, twConvertOp_t,
                        void *) override {
        no("twGemmToSparse");
    }
    size_t spmm_workspace(const twSpMatDescr &, const twDnMatDescr &, const twDnMatDescr &) override { no("twSpMM"); }
    twStatus_t spmm(float, const twSpMatDescr &, const twDnMatDescr &, float, const twDnMatDescr &, void *) override {
        no("twSpMM");
    }
    std::unique_ptr<FfnState> ffn_create(const twFfnDescr &, const twDnMatDescr *, const twDnMatDescr &,
                                         const twDnMatDescr &) override {
        no("twCreateFfn");
    }
    void ffn_update_weights(twFfnDescr &, const twDnMatDescr *, const twDnMatDescr &, const twDnMatDescr &) override {
        no("twFfnUpdateWeights");
    }
    size_t ffn_forward_workspace(const twFfnDescr &, int64_t) override { no("twSpGEMMFused"); }
    void ffn_forward(twFfnDescr &, const twDnMatDescr &, const twDnMatDescr &, const twSpMatDescr *, void *) override {
        no("twSpGEMMFused");
    }
    twFfnStats_t ffn_stats(const twFfnDescr &) override { no("twFfnGetStats"); }
    void ffn_neuron_counts(const twFfnDescr &, int64_t *) override { no("twFfnGetNeuronCounts"); }
    void ffn_reset_neuron_counts(twFfnDescr &) override { no("twFfnResetNeuronCounts"); }
    size_t ffn_saved_bytes(const twFfnDescr &, int64_t) override { no("twSpGEMMFusedSaved_bufferSize"); }
    void ffn_forward_train(twFfnDescr &, const twDnMatDescr &, const twDnMatDescr &, void *, void *) override {
        no("twSpGEMMFusedForwardTrain");
    }
    size_t ffn_backward_workspace(const twFfnDescr &, int64_t) override { no("twSpGEMMFusedBackward"); }
    void ffn_backward(twFfnDescr &, const twDnMatDescr &, const void *, const twDnMatDescr &, float,
                      const twDnMatDescr &, const twDnMatDescr *, const twDnMatDescr &, const twDnMatDescr &,
                      void *) override {
        no("twSpGEMMFusedBackward");
    }

  private:
    [[noreturn]] void no(const char *routine) const {
        fail(TW_STATUS_NOT_SUPPORTED, "%s: %s", routine, reason_.c_str());
    }
    twBackend_t kind_;
    std::string reason_;
};

}  // namespace twblas
