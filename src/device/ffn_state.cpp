#include "ffn_state.hpp"

#include <cstring>

#include "heuristics.hpp"

namespace twblas::cuda {

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
    // dense mode runs only where cuBLAS may (and never in deterministic mode: it would switch)
    p.save_dense = ffn.save_dense != 0 && p.cublas_ok() && !p.deterministic;
    return p;
}

std::unique_ptr<CudaFfnState> make_ffn_state(const twFfnDescr &ffn, const DeviceInfo &device, cudaStream_t stream) {
    const FfnProblem p = problem_of(ffn, 0);
    if (p.dp > heuristics::max_model_dim(p.type))
        fail(TW_STATUS_NOT_SUPPORTED, "the CUDA FFN supports a model dimension up to %lld for this type; D = %lld",
             static_cast<long long>(heuristics::max_model_dim(p.type)), static_cast<long long>(p.d));
    if (p.h > kMaxSparseCols)
        fail(TW_STATUS_NOT_SUPPORTED, "the CUDA FFN keeps unit ids in 16 bits: H up to %lld; H = %lld",
             static_cast<long long>(kMaxSparseCols), static_cast<long long>(p.h));
    auto st = std::make_unique<CudaFfnState>();
    st->sm_count = device.sm_count;
    st->device = device.device;
    st->masked_gate = device.masked_gate;
    st->pdl = device.pdl;
    st->stats.reset(sizeof(FfnStatsBlock));
    st->counts.reset(static_cast<size_t>(p.h) * 8);
    st->fp8_q_bytes = static_cast<size_t>(p.h * Fp8Rows::row_bytes(p.dp, p.gated));
    st->fp8_scale_bytes = static_cast<size_t>(p.h) * sizeof(float2);
    check(cudaMemsetAsync(st->stats.get(), 0, st->stats.bytes(), stream), "cudaMemsetAsync");
    check(cudaMemsetAsync(st->counts.get(), 0, st->counts.bytes(), stream), "cudaMemsetAsync");
    return st;
}

void CudaFfnState::prepare_compute_mode(int32_t mode) {
    if (mode != TW_COMPUTE_FP8_WEIGHTS || fp8_q.get()) return;
    int current = 0;
    check(cudaGetDevice(&current), "cudaGetDevice");
    if (current != device) check(cudaSetDevice(device), "cudaSetDevice");
    struct Restore {
        int dev, was;
        ~Restore() {
            if (dev != was) (void)cudaSetDevice(was);
        }
    } restore{device, current};
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
    st.dense_mode = (f.mode & 1u) != 0;
    st.mean_active = feedback_mean(f.mode);
    st.dense_row_fraction = f.dense_share;
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
