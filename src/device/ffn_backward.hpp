// The backward of the fused FFN from the training forward's saved state: the sequence of GEMMs,
// sorts and kernels, and their launchers. Nothing here allocates or synchronises.
#pragma once

#include <cuda_runtime.h>

#include "ffn_state.hpp"

namespace twblas::cuda {

/// twSpGEMMFusedBackward: dX, dWg (gated), dWu, dWd; scratch from `workspace`
/// (carve_train_scratch). Bitwise reproducible for a given path (no atomics on values).
void ffn_backward(cudaStream_t stream, const twFfnDescr &ffn, const twDnMatDescr &x, const void *saved,
                  const twDnMatDescr &dy, L1Coefficient l1, const twDnMatDescr &dx, const twDnMatDescr *dwg,
                  const twDnMatDescr &dwu, const twDnMatDescr &dwd, void *workspace);

}  // namespace twblas::cuda
