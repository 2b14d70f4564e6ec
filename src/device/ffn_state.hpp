// The CUDA backend's state of one FFN descriptor, made by twCreateFfn: where the kernels read the
// weights (in place, or the FFN's copy), the device statistics and neuron counts, the statistics
// feedback that steers the path choice, the cuBLASLt plans and the captured calls. Everything a compute call needs that
// depends only on the FFN and the shape lives here, so that a call does no other host work.
#pragma once

#include <cstdint>
#include <mutex>

#include "call_graphs.hpp"
#include "common/device_buffer.hpp"
#include "ffn_layout.hpp"
#include "plan/forward_plan.hpp"
#include "gemm/lt_gemm.hpp"
#include "common/device_info.hpp"
#include "common/pointer_check.hpp"
#include "host/backend.hpp"
#include "host/memory_range.hpp"

namespace twblas::cuda {

/// What each recent training forward of this FFN did, by its saved state's address and token
/// count: whether it ran in dense mode, and whether it also kept z and u of every row there
/// (save_dense). Its backward follows that forward, not the mode the latest statistics ask for:
/// a dense-mode forward's backward recomputes every row through cuBLAS (or reads z and u), where
/// the gathered GEMM, sized for a few rows, would take milliseconds. A state not listed (moved,
/// or pushed out by newer ones) is still exact: its backward goes by the latest statistics.
/// Host memory only; guarded by the state's mutex.
class TrainForwards {
  public:
    struct Record {
        bool dense_mode = false;
        bool kept_z_u = false;
    };
    void remember(const void *saved, int64_t tokens, Record r) {
        forget(saved);
        slots_[next_] = {saved, tokens, r};
        next_ = (next_ + 1) % kSlots;
    }
    void forget(const void *saved) {
        for (Entry &e : slots_)
            if (e.saved == saved) e = Entry{};
    }
    /// The record of the forward that wrote `saved` for `tokens` tokens, or NULL.
    const Record *find(const void *saved, int64_t tokens) const {
        for (const Entry &e : slots_)
            if (saved && e.saved == saved && e.tokens == tokens) return &e.record;
        return nullptr;
    }

  private:
    // forwards whose backward has not run yet: micro-batches of gradient accumulation, pipeline
    // stages; more than this many in flight go by the latest statistics
    static constexpr int kSlots = 32;
    struct Entry {
        const void *saved = nullptr;
        int64_t tokens = 0;
        Record record;
    };
    Entry slots_[kSlots];
    int next_ = 0;
};

struct CudaFfnState final : FfnState {
    // The weights the kernels read (FfnWeights, without fp8): the caller's matrices in place, or
    // rows of `weight_copy` for those that cannot be read there (ffn_weights.cu). `copied`: bit
    // i set when matrix i (gate, up, down) lives in the copy, -1 before the first placement.
    FfnWeights placed{};
    DeviceBuffer weight_copy;
    int copied = -1;
    // the caller's memory read in place (the gradients and outputs must not overlap it)
    ByteRange in_place[3]{};
    const char *in_place_name[3]{};
    // TW_COMPUTE_FP8_WEIGHTS: the FP8 copy of the up and down rows (Fp8Rows), allocated when the
    // mode is first set; made again by the first FP8 forward after twCreateFfn or
    // twFfnUpdateWeights (`fp8_stale`, guarded by `mutex`), in that forward's stream order
    DeviceBuffer fp8_q, fp8_scale;
    size_t fp8_q_bytes = 0, fp8_scale_bytes = 0;  // what they take (make_ffn_state)
    bool fp8_stale = true;
    DeviceBuffer stats;                // FfnStatsBlock
    DeviceBuffer counts;               // per-unit activation counts (H x int64)
    MappedHost<FfnFeedback> feedback;  // the finishing kernel publishes the statistics here
    int sm_count = 132;
    int64_t hidden = 0;  // H
    int device = 0;
    bool masked_gate = false;    // the masked gate GEMM runs here (built for sm_90a, an sm_90 GPU)
    bool pdl = false;            // DeviceInfo::pdl
    int smem_optin = 48 * 1024;  // DeviceInfo::smem_optin
    GemmRunner gemm;             // cuBLASLt plans of this FFN's shapes (bounded)
    CallGraphs calls{8};
    StreamBranch branch;  // dense mode's statistics beside its down GEMM; the dense path beside the sparse rows

    // Path choice from the measured sparsity of the last forward whose statistics have arrived
    // (read without a wait; see absorb_feedback). Guarded by `mutex`, as is everything above that
    // a compute call changes (plans, captured calls).
    std::mutex mutex;
    PlanFeedback feedback_seen;  // what the last published statistics said
    FfnTuning tuning;            // twFfnSetTuning
    TrainForwards train_forwards;
    int64_t dense_room_tokens = -1;    // TW_SAVE_DENSE_AUTO: tokens of the latest size query that gave room for z, u
    ReachablePointers train_pointers;  // the training calls' arguments, checked once each

    FfnWeights weights(const FfnProblem &p) const {
        FfnWeights w = placed;
        w.fp8 = {fp8_q.get<uint8_t>(), fp8_scale.get<float2>(), Fp8Rows::row_bytes(p.dp, p.gated),
                 Fp8Rows::half_bytes(p.dp)};
        return w;
    }
    int64_t weight_copy_bytes() const override {
        return static_cast<int64_t>(weight_copy.bytes() + fp8_q.bytes() + fp8_scale.bytes());
    }
    void prepare_compute_mode(int32_t mode) override;
    bool set_tuning(const char *name, double value) override;
    bool get_tuning(const char *name, double *value) const override;
    /// Writes the tuning's dense-mode limits into the statistics block (a blocking copy).
    void write_dense_mode_limits(int64_t hidden_dim, cudaStream_t stream);
    FfnStatsBlock *stats_block() const { return stats.get<FfnStatsBlock>(); }
    unsigned long long *neuron_counts() const { return counts.get<unsigned long long>(); }
};

inline CudaFfnState &state_of(const twFfnDescr &ffn) { return static_cast<CudaFfnState &>(*ffn.state); }

/// The problem of a call with `tokens` rows on this FFN (its attributes as they are now).
FfnProblem problem_of(const twFfnDescr &ffn, int64_t tokens);

/// Allocates the state (weights not yet copied) and checks the limits of the CUDA FFN.
std::unique_ptr<CudaFfnState> make_ffn_state(const twFfnDescr &ffn, const DeviceInfo &device, cudaStream_t stream);

/// Takes the record the finished forwards last published into feedback_seen. Never waits; call
/// with the state's mutex held.
void absorb_feedback(CudaFfnState &st);

}  // namespace twblas::cuda

namespace twblas::cuda {

/// The training problem: token ids in the backward's sort are 32-bit slot numbers, so one call
/// takes fewer than 2^31 / kSavedEll tokens (NOT_SUPPORTED beyond).
FfnProblem training_problem_of(const twFfnDescr &ffn, int64_t tokens);

/// What the plan knows of a call from the FFN and the problem alone (the call's arguments add
/// the layouts, the hidden output and whether the masked gate GEMM fits).
PlanInput problem_plan_input(const twFfnDescr &ffn, const FfnProblem &p, bool training);

/// The problem of a saved-state size query (twSpGEMMFusedSaved_bufferSize). TW_SAVE_DENSE_AUTO:
/// room for z and u (p.save_dense) when the FFN's statistics put a training forward of `tokens`
/// tokens in dense mode now; the FFN remembers the answer (dense_room_tokens) for its forwards.
FfnProblem saved_size_problem(const twFfnDescr &ffn, int64_t tokens);
/// The problem of a training forward: with TW_SAVE_DENSE_AUTO, room for z and u when the latest
/// size query answered with it for these tokens. Call with the state's mutex held.
FfnProblem training_forward_problem(const twFfnDescr &ffn, const CudaFfnState &st, int64_t tokens);

/// Bytes of `saved` a training forward of `tokens` tokens will write (backward = false), or that
/// the forward which wrote it wrote (backward = true: z and u only where it kept them). For the
/// overlap checks: unlike saved_size_problem it changes nothing.
size_t saved_extent(const twFfnDescr &ffn, int64_t tokens, const void *saved, bool backward);

/// twFfnGetStats: the statistics of the last forward (blocking by contract); also steers the next
/// forward's path at once.
twFfnStats_t read_ffn_stats(cudaStream_t stream, CudaFfnState &st);

}  // namespace twblas::cuda
