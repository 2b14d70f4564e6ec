// The forward of the fused FFN, inference and training (ffn_forward.cu: the plan, then the path's
// launchers in sequence), and the placement of the weights it reads. Nothing here allocates or
// synchronises in a compute call.
#pragma once

#include <cuda_runtime.h>

#include "ffn_state.hpp"

namespace twblas::cuda {

/// twSpGEMMFused: Y (and the hidden output when not NULL) from X; scratch from `workspace`
/// (carve_ffn_scratch). Repeated calls with the same arguments replay a captured graph.
void ffn_forward(cudaStream_t stream, const twFfnDescr &ffn, const twDnMatDescr &x, const twDnMatDescr &y,
                 const twSpMatDescr *hidden, void *workspace);

/// TW_FFN_ATTR_L1_OUTPUT: the last forward's l1 (twFfnGetStats' l1, as float) to `dst` (device
/// memory), in stream order, without blocking.
void write_forward_l1(cudaStream_t stream, const twFfnDescr &ffn, float *dst);

/// twSpGEMMFusedForwardTrain: as ffn_forward, and the saved state the backward reads
/// (SavedLayout) written into `saved`.
void ffn_forward_train(cudaStream_t stream, const twFfnDescr &ffn, const twDnMatDescr &x, const twDnMatDescr &y,
                       void *saved, void *workspace);

/// Whether the kernels read `w` (one of the FFN's H x D weights) where it is: TW_ORDER_ROW, D a
/// multiple of 8 (no pads), a 16-byte aligned base and ld.
bool readable_in_place(const FfnProblem &p, const twDnMatDescr &w);

/// Where the kernels read the weights (twCreateFfn, twFfnUpdateWeights; ffn_weights.cu): in place
/// (readable_in_place), else in rows of the FFN's copy, enqueued on `stream` (allocated, blocking,
/// when which matrices are copied changes); `wait`: block until the copy is there (twCreateFfn:
/// the FFN may then be used on any stream), else stream-ordered (twFfnUpdateWeights: no host
/// wait, capturable).
void ffn_place_weights(cudaStream_t stream, CudaFfnState &st, const FfnProblem &p, const twDnMatDescr *wg,
                       const twDnMatDescr &wu, const twDnMatDescr &wd, bool wait);

/// INVALID_VALUE naming `out_name` when `out` overlaps a weight the FFN reads in place.
void require_apart_from_weights(const CudaFfnState &st, const ByteRange &out, const char *out_name);

/// TW_COMPUTE_FP8_WEIGHTS: the FP8 copy of the up and down rows made from them, enqueued on
/// `stream` (the state's FP8 buffers exist: CudaFfnState::prepare_compute_mode).
void quantize_fp8_weights(cudaStream_t stream, CudaFfnState &st, const FfnProblem &p);

}  // namespace twblas::cuda
