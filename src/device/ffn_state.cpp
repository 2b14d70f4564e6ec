#include "ffn_state.hpp"

#include <cstring>
#include <string>

#include "plan/forward_plan.hpp"

namespace twblas::cuda {

namespace {
/// The FFN's device current for a setup call, the caller's again after it.
class DeviceGuard {
  public:
    explicit DeviceGuard(int device) : device_(device) {
        check(cudaGetDevice(&was_), "cudaGetDevice");
        if (was_ != device_) check(cudaSetDevice(device_), "cudaSetDevice");
    }
    ~DeviceGuard() {
        if (was_ != device_) (void)cudaSetDevice(was_);
    }
    DeviceGuard(const DeviceGuard &) = delete;
    DeviceGuard &operator=(const DeviceGuard &) = delete;

  private:
    int device_, was_ = 0;
};
}  // namespace

FfnProblem problem_of(const twFfnDescr &ffn, int64_t tokens) {
    FfnProblem p{};
    p.m = tokens;
    p.d = ffn.model_dim;
    p.h = ffn.hidden_dim;
    p.dp = (p.d + 7) / 8 * 8;
    p.hp = (p.h + 7) / 8 * 8;
    p.type = ffn.type;
    p.gated = ffn.gated();
    p.highest = ffn.compute_mode == TW_COMPUTE_HIGHEST_PRECISION;
    p.fp8 = ffn.compute_mode == TW_COMPUTE_FP8_WEIGHTS;
    p.deterministic = ffn.deterministic != 0;
    p.tile = ffn.tile_width;
    p.slots = ffn.tile_width / ffn.compression - 1;
    // TW_SAVE_DENSE_AUTO's room is the training calls' to decide (saved_size_problem)
    p.save_dense = ffn.save_dense == TW_SAVE_DENSE_ALWAYS && p.dense_mode_possible();
    return p;
}

std::unique_ptr<CudaFfnState> make_ffn_state(const twFfnDescr &ffn, const DeviceInfo &device, cudaStream_t stream) {
    const FfnProblem p = problem_of(ffn, 0);
    if (p.dp > max_model_dim(p.type))
        fail(TW_STATUS_NOT_SUPPORTED, "the CUDA FFN supports a model dimension up to %lld for this type; D = %lld",
             static_cast<long long>(max_model_dim(p.type)), static_cast<long long>(p.d));
    if (p.h > kMaxSparseCols)
        fail(TW_STATUS_NOT_SUPPORTED, "the CUDA FFN keeps unit ids in 16 bits: H up to %lld; H = %lld",
             static_cast<long long>(kMaxSparseCols), static_cast<long long>(p.h));
    auto st = std::make_unique<CudaFfnState>();
    st->sm_count = device.sm_count;
    st->hidden = p.h;
    st->device = device.device;
    st->masked_gate = device.masked_gate;
    st->pdl = device.pdl;
    st->smem_optin = device.smem_optin;
    st->stats.reset(sizeof(FfnStatsBlock));
    st->counts.reset(static_cast<size_t>(p.h) * 8);
    st->fp8_q_bytes = static_cast<size_t>(p.h * Fp8Rows::row_bytes(p.dp, p.gated));
    st->fp8_scale_bytes = static_cast<size_t>(p.h) * sizeof(float2);
    check(cudaMemsetAsync(st->stats.get(), 0, st->stats.bytes(), stream), "cudaMemsetAsync");
    check(cudaMemsetAsync(st->counts.get(), 0, st->counts.bytes(), stream), "cudaMemsetAsync");
    st->write_dense_mode_limits(p.h, stream);
    return st;
}

void CudaFfnState::write_dense_mode_limits(int64_t hidden_dim, cudaStream_t stream) {
    const double mean = static_cast<double>(hidden_dim) * tuning.dense_mode_units_per_hidden;
    const float share = static_cast<float>(tuning.dense_mode_dense_share);
    auto *block = stats_block();
    // pageable sources: the copies have taken them when the calls return
    check(cudaMemcpyAsync(&block->dense_mode_mean, &mean, sizeof mean, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
    check(cudaMemcpyAsync(&block->dense_mode_share, &share, sizeof share, cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync");
}

bool CudaFfnState::set_tuning(const char *name, double value) {
    std::lock_guard<std::mutex> lock(mutex);
    FfnTuning t = tuning;
    if (!set_tuning_knob(t, name, value)) {
        std::string names;
        for (const char *const *n = tuning_knob_names(); *n; ++n) names += std::string(names.empty() ? "" : ", ") + *n;
        double unused;
        if (get_tuning_knob(t, name, &unused))
            fail(TW_STATUS_INVALID_VALUE, "value: %g is out of range for tuning knob %s", value, name);
        fail(TW_STATUS_INVALID_VALUE, "name: %s is not a tuning knob; the CUDA backend's knobs: %s", name, names.c_str());
    }
    const bool limits = t.dense_mode_units_per_hidden != tuning.dense_mode_units_per_hidden ||
                        t.dense_mode_dense_share != tuning.dense_mode_dense_share;
    tuning = t;
    if (limits) {
        const DeviceGuard guard(device);
        write_dense_mode_limits(hidden, nullptr);
        check(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize");
    }
    return true;
}

bool CudaFfnState::get_tuning(const char *name, double *value) const {
    if (!get_tuning_knob(tuning, name, value)) fail(TW_STATUS_INVALID_VALUE, "name: %s is not a tuning knob", name);
    return true;
}

void CudaFfnState::prepare_compute_mode(int32_t mode) {
    if (mode != TW_COMPUTE_FP8_WEIGHTS || fp8_q.get()) return;
    const DeviceGuard guard(device);
    fp8_q.reset(fp8_q_bytes);
    fp8_scale.reset(fp8_scale_bytes);
    std::lock_guard<std::mutex> lock(mutex);
    fp8_stale = true;
}

void absorb_feedback(CudaFfnState &st) {
    // two 8-byte loads of memory the GPU writes (a torn pair fails the check)
    const volatile uint64_t *src = reinterpret_cast<const volatile uint64_t *>(st.feedback.host());
    const uint64_t words[2] = {src[0], src[1]};
    FfnFeedback f;
    std::memcpy(&f, words, sizeof f);
    uint32_t share_bits;
    std::memcpy(&share_bits, &f.dense_share, 4);
    if (f.published != 1u || f.check != feedback_check(f.mode, share_bits)) return;  // none yet, or torn
    st.feedback_seen = {(f.mode & 1u) != 0, feedback_mean(f.mode), f.dense_share};
}

}  // namespace twblas::cuda

namespace twblas::cuda {

FfnProblem training_problem_of(const twFfnDescr &ffn, int64_t tokens) {
    const FfnProblem p = problem_of(ffn, tokens);
    if (tokens * int64_t{kSavedEll} >= (int64_t{1} << 31))
        fail(TW_STATUS_NOT_SUPPORTED, "CUDA training: up to %lld tokens per call; got %lld",
             static_cast<long long>(((int64_t{1} << 31) - 1) / kSavedEll), static_cast<long long>(tokens));
    return p;
}

PlanInput problem_plan_input(const twFfnDescr &ffn, const FfnProblem &p, bool training) {
    PlanInput in;
    in.m = p.m, in.d = p.d, in.h = p.h, in.dp = p.dp;
    in.type = p.type;
    in.gated = p.gated, in.highest = p.highest, in.fp8 = p.fp8, in.deterministic = p.deterministic;
    in.training = training;
    in.algorithm = static_cast<twFfnAlgorithm_t>(ffn.algorithm);
    return in;
}

FfnProblem saved_size_problem(const twFfnDescr &ffn, int64_t tokens) {
    FfnProblem p = training_problem_of(ffn, tokens);
    if (ffn.save_dense != TW_SAVE_DENSE_AUTO || !p.dense_mode_possible()) return p;
    CudaFfnState &st = state_of(ffn);
    std::lock_guard<std::mutex> lock(st.mutex);
    absorb_feedback(st);
    p.save_dense = training_dense_mode_likely(problem_plan_input(ffn, p, true), st.feedback_seen, st.tuning);
    st.dense_room_tokens = p.save_dense ? tokens : -1;
    return p;
}

FfnProblem training_forward_problem(const twFfnDescr &ffn, const CudaFfnState &st, int64_t tokens) {
    FfnProblem p = training_problem_of(ffn, tokens);
    if (ffn.save_dense == TW_SAVE_DENSE_AUTO && p.dense_mode_possible())
        p.save_dense = st.dense_room_tokens == tokens && tokens > 0;
    return p;
}

size_t saved_extent(const twFfnDescr &ffn, int64_t tokens, const void *saved, bool backward) {
    CudaFfnState &st = state_of(ffn);
    std::lock_guard<std::mutex> lock(st.mutex);
    FfnProblem p = training_forward_problem(ffn, st, tokens);
    if (backward) {
        const TrainForwards::Record *r = st.train_forwards.find(saved, tokens);
        if (r && r->kept_z_u)
            p.save_dense = true;
        else if (ffn.save_dense == TW_SAVE_DENSE_AUTO)
            p.save_dense = false;
    }
    return saved_layout(p).total;
}

twFfnStats_t read_ffn_stats(cudaStream_t stream, CudaFfnState &st) {
    FfnDeviceStats d{};
    check(cudaMemcpyAsync(&d, &st.stats_block()->last, sizeof d, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    {
        std::lock_guard<std::mutex> lock(st.mutex);
        absorb_feedback(st);  // complete now: steer the next forward
    }
    twFfnStats_t out{};
    out.tokens = d.tokens;
    out.meanRowNnz = d.tokens ? static_cast<double>(d.total_nnz) / static_cast<double>(d.tokens) : 0.0;
    out.maxRowNnz = d.max_row;
    out.overflowRows = d.overflow_rows;
    out.l1 = d.tokens ? d.l1_sum / static_cast<double>(d.tokens) : 0.0;
    return out;
}

}  // namespace twblas::cuda
