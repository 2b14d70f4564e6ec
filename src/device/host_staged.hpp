// Inspection and conversions whose contract returns a result to the host: they run the reference
// code on a host copy of the device buffers ("host-staged"), which is exact and shares its
// messages, and synchronise the handle's stream. Setup calls only; compute calls never come here.
#pragma once

#include <cuda_runtime.h>

#include "host/backend.hpp"

namespace twblas::cuda {

class HostStaged {
  public:
    explicit HostStaged(Backend &reference) : ref_(reference) {}
    twSpMatInfo_t sparse_info(cudaStream_t stream, const twSpMatDescr &s);
    void sparse_validate(cudaStream_t stream, const twSpMatDescr &s);
    /// The reference's capacity check of DenseToSparse, on a host copy of `in`.
    twStatus_t dense_to_sparse_analysis(cudaStream_t stream, const twDnMatDescr &in, const twSpMatDescr &out,
                                        twConvertOp_t op);
    twStatus_t sparse_to_dense(cudaStream_t stream, const twSpMatDescr &in, const twDnMatDescr &out);
    twStatus_t sparse_convert(cudaStream_t stream, const twSpMatDescr &in, const twSpMatDescr &out);
    twStatus_t sparse_transpose(cudaStream_t stream, const twSpMatDescr &in, const twSpMatDescr &out);
    /// After a device conversion into `out`: CAPACITY_EXCEEDED when its record or backup count
    /// says rows did not fit (reads 4 bytes back: synchronises).
    twStatus_t capacity_status(cudaStream_t stream, const twSpMatDescr &out);

  private:
    /// A sparse -> sparse operation of the reference on host copies; `out` is copied back.
    twStatus_t sparse_to_sparse(cudaStream_t stream, const twSpMatDescr &in, const twSpMatDescr &out,
                                twStatus_t (Backend::*op)(const twSpMatDescr &, const twSpMatDescr &));
    Backend &ref_;
};

}  // namespace twblas::cuda
