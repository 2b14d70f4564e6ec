// The CUDA backend's state of one FFN descriptor, made by twCreateFfn: the weights in the kernels'
// layouts, the device statistics and neuron counts, the statistics feedback that steers the path
// choice, the cuBLASLt plans and the captured calls. Everything a compute call needs that depends
// only on the FFN and the shape lives here, so that a call does no other host work.
#pragma once

#include <cstdint>
#include <mutex>

#include "call_graphs.hpp"
#include "common/device_buffer.hpp"
#include "ffn_layout.hpp"
#include "gemm/lt_gemm.hpp"
#include "common/device_info.hpp"
#include "host/backend.hpp"

namespace twblas::cuda {

struct CudaFfnState final : FfnState {
    DeviceBuffer gate, pair, down_t;  // FfnWeights
    DeviceBuffer stats;               // FfnStatsBlock
    DeviceBuffer counts;              // per-unit activation counts (H x int64)
    MappedHost<FfnFeedback> feedback;  // the finishing kernel publishes the statistics here
    int sm_count = 132;
    int device = 0;
    bool masked_gate = false;  // the masked gate GEMM runs here (built for sm_90a, an sm_90 GPU)
    GemmRunner gemm;  // cuBLASLt plans of this FFN's shapes (bounded)
    CallGraphs calls{8};

    // Path choice from the measured sparsity of the last forward whose statistics have arrived
    // (read without a wait; see absorb_feedback). Guarded by `mutex`, as is everything above that
    // a compute call changes (plans, captured calls).
    std::mutex mutex;
    bool dense_mode = false;
    double mean_active = 0.0;  // active units per token (feedback_mean: up to ~19 % above)
    double dense_row_fraction = 0.0;

    FfnWeights weights(const FfnProblem &p) const {
        return {gate.get(), pair.get(), p.gated ? 2 * p.dp : p.dp, down_t.get()};
    }
    FfnStatsBlock *stats_block() const { return stats.get<FfnStatsBlock>(); }
    unsigned long long *neuron_counts() const { return counts.get<unsigned long long>(); }
};

inline CudaFfnState &state_of(const twFfnDescr &ffn) { return static_cast<CudaFfnState &>(*ffn.state); }

/// The problem of a call with `tokens` rows on this FFN (its attributes as they are now).
FfnProblem problem_of(const twFfnDescr &ffn, int64_t tokens);

/// Allocates the state (weights not yet copied) and checks the limits of the CUDA FFN.
std::unique_ptr<CudaFfnState> make_ffn_state(const twFfnDescr &ffn, const DeviceInfo &device, cudaStream_t stream);

/// Takes the record the finished forwards last published into the path choice. Never waits; call
/// with the state's mutex held.
void absorb_feedback(CudaFfnState &st);

}  // namespace twblas::cuda

namespace twblas::cuda {

/// The training problem: token ids in the backward's sort are 32-bit slot numbers, so one call
/// takes fewer than 2^31 / kSavedEll tokens (NOT_SUPPORTED beyond).
FfnProblem training_problem_of(const twFfnDescr &ffn, int64_t tokens);

/// twFfnGetStats: the statistics of the last forward (blocking by contract); also steers the next
/// forward's path at once.
twFfnStats_t read_ffn_stats(cudaStream_t stream, CudaFfnState &st);

}  // namespace twblas::cuda
