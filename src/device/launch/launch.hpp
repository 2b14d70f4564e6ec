// The forward's launchers: one file per path (serve, decode, dense_mode, fused, two_pass) and
// the pieces the sparse paths share (gate, dense_path, finish). Each enqueues kernels with the
// values the plan chose (plan/forward_plan.hpp); ffn_forward.cu puts them in sequence. None
// allocates, synchronises or chooses a path.
#pragma once

#include <cuda_runtime.h>

#include <functional>

#include "common/matrix_arg.hpp"
#include "ffn_state.hpp"
#include "gemm/lt_gemm.hpp"
#include "plan/forward_plan.hpp"
#include "sparse_ops.hpp"

namespace twblas::cuda {

/// What every launcher of one forward reads: the FFN, the call and its plan.
struct FfnCall {
    CudaFfnState &st;
    const FfnProblem &p;
    const ForwardPlan &plan;
    const twDnMatDescr &x, &y;
    const FfnScratch &s;
    FfnWeights w;
    MatrixArg xa, ya;
};

// ---- gate.cu: the gate and the unit lists of the sparse paths

/// z = X Wg^T into `s.gate`, rounded to the gate type (cuBLASLt).
void run_gate_gemm(cudaStream_t stream, CudaFfnState &st, const FfnProblem &p, const GemmOperand &x,
                   const FfnScratch &s);
/// What the unit lists are made from after the masked gate GEMM (its words).
MaskListArgs mask_list_args(const FfnProblem &p, const FfnScratch &s, unsigned long long *neuron_counts);
/// The masked gate GEMM and the lists from its words (unless fwd_u makes them), or cuBLAS's gate
/// GEMM and the packing pass (zeroing the inactive units' values when `zero_inactive`).
void run_gate_and_lists(cudaStream_t stream, const FfnCall &c, bool zero_inactive);

// ---- the paths

/// serve.cu: the serving path (16-bit weights, or their FP8 rows): its own gate and serve_down, or cuBLAS's gate and
/// serve_token; `write_h`: h over the gate buffer for the hidden output.
void launch_serve(cudaStream_t stream, const FfnCall &c, bool write_h);
/// decode.cu: the one-kernel decode path and its reduction (16-bit).
void launch_decode(cudaStream_t stream, const FfnCall &c, bool write_h);

/// Where dense mode keeps z, u and h (M x ldg each).
struct DenseModeBuffers {
    void *z, *up, *h;
};
/// dense_mode.cu: projections as cuBLAS GEMMs over every row, h by one pass, the statistics on a
/// branch beside the down GEMM (16-bit); `after_stats` enqueues work on that branch after them.
void run_dense_mode(cudaStream_t stream, const FfnCall &c, const DenseModeBuffers &b,
                    const std::function<void(cudaStream_t)> &after_stats = {});

/// fused.cu: the fused kernel over the sparse rows (h over the gate buffer when `write_h`), then
/// the sum of the teams' partial rows when a token's units were split.
void launch_fused(cudaStream_t stream, const FfnCall &c, bool write_h);

/// two_pass.cu: u and h per active unit, then y by column slices; `lists`: fwd_u makes the unit
/// lists from the masked gate's words; `after_u` enqueues what follows fwd_u directly.
void launch_two_pass(cudaStream_t stream, const FfnCall &c, const MaskListArgs *lists,
                     const std::function<void()> &after_u);

/// dense_path.cu: the rows of the dense list (more active units than the sparse kernels take):
/// the first plan.cublas_rows through cuBLAS and the rest through the gathered GEMM, on the
/// 16-bit weights (FP8 mode too).
void enqueue_dense_path(cudaStream_t stream, const FfnCall &c, bool write_hidden);

// ---- finish.cu

/// The optional hidden output from h: the gate buffer's (inactive units zeroed, or outside
/// `gate_mask`), or `h_values` (ldg apart).
void write_hidden_output(cudaStream_t stream, const FfnProblem &p, const FfnScratch &s, const twSpMatDescr *hidden,
                         const ActiveMask &gate_mask = {}, void *h_values = nullptr);
/// Statistics (and the l1 of dense-path rows from list position `first` on when `dense_l1`),
/// published for the plan, then the optional hidden output.
void launch_finish(cudaStream_t stream, const FfnCall &c, bool dense_l1, int64_t first, const twSpMatDescr *hidden,
                   const ActiveMask &gate_mask = {});

}  // namespace twblas::cuda
