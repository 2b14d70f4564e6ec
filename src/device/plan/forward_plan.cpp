#include "plan/forward_plan.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>
#include <string_view>

#include "host/error.hpp"

namespace twblas::cuda {

const char *path_name(FfnPath path) {
    switch (path) {
    case FfnPath::Serve: return "serving";
    case FfnPath::Decode: return "decode";
    case FfnPath::DenseMode: return "dense mode";
    case FfnPath::Fused: return "fused";
    case FfnPath::TwoPass: return "two-pass";
    }
    return "?";
}

int64_t max_model_dim(twDataType_t type) {
    const int64_t values_per_chunk = type == TW_R_32F ? 4 : 8;
    return int64_t{kFusedMaxTeamWarps} * kFusedWarpChunks * 32 * values_per_chunk;
}

int fused_splits(int64_t tokens) {
    if (tokens <= 0 || tokens > kFusedSplitMaxTokens) return 1;
    return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(32, 512 / tokens)));
}

bool decode_fits(int64_t m, int64_t dp, bool gate_f32) {
    return m >= 1 && m <= kDecodeMaxTokens && !gate_f32 && dp <= kDecodeMaxModelDim;
}

int32_t dense_path_row_limit(int64_t hidden_dim) {
    return static_cast<int32_t>(std::max<int64_t>(hidden_dim / 32, 64));
}

int serve_token_warps(const FfnTuning &t, int64_t tokens, bool writes_h) {
    return tokens >= t.serve_token_narrow_min_tokens && !writes_h ? 8 : 16;
}

int serve_token_splits(const FfnTuning &t, int64_t tokens, int64_t dp, bool writes_h, int warps) {
    if (writes_h) return 1;  // split 0 writes h over the gate buffer, where other splits read g
    const int64_t threads = 32 * warps, per_16_warps = 16 / warps;  // 1 or 2
    const int64_t chunks = (dp + 7) / 8, at_least = (chunks + threads - 1) / threads;
    return static_cast<int>(std::max<int64_t>(
        at_least, std::min<int64_t>(4 * per_16_warps,
                                    std::max<int64_t>(1, t.serve_token_blocks) * per_16_warps / std::max<int64_t>(1, tokens))));
}

int masked_gate_tile_n(int64_t m, int64_t n, int sm_count) {
    const int64_t slots = std::max(1, sm_count / 2);  // clusters of two CTAs
    const auto up = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
    const auto waves = [&](int64_t tile_n) { return up(up(m, 256) * up(n, tile_n), slots); };
    // in units of a 256-wide wave's time / 4: a 192-wide wave is 3 of them, plus 5 %
    return waves(192) * 3 * 105 < waves(256) * 4 * 100 ? 192 : 256;
}

int64_t dense_path_cublas_rows(double dense_row_fraction, int64_t tokens) {
    if (dense_row_fraction <= 0.0) return 0;
    const double want = 1.25 * dense_row_fraction * static_cast<double>(tokens) + 64.0;
    return std::min<int64_t>(tokens, (static_cast<int64_t>(want) + 63) / 64 * 64);
}

namespace {

bool large_gate(const PlanInput &in, const FfnTuning &t) { return in.h * in.d > t.serve_gate_large_weights; }

int64_t serve_max_tokens(const PlanInput &in, const FfnTuning &t) {
    return large_gate(in, t) ? std::min(t.serve_max_tokens, t.serve_max_tokens_large) : t.serve_max_tokens;
}

int64_t serve_gate_max_tokens(const PlanInput &in, const FfnTuning &t) {
    const int64_t tokens = std::min(t.serve_gate_max_tokens, kServeGateTokenCapacity);
    return large_gate(in, t) ? std::min<int64_t>(tokens, 8) : tokens;
}

int64_t serve_gate_rows_max_tokens(const PlanInput &in, const FfnTuning &t) {
    const int64_t tokens = large_gate(in, t) ? t.serve_gate_rows_max_tokens_large : t.serve_gate_rows_max_tokens;
    return std::min(tokens, kServeGateRowsMaxTokens);
}

int64_t masked_gate_min_tokens(const PlanInput &in, const FfnTuning &t) {
    // where the serving path ends early, the masked GEMM takes over right after it
    return large_gate(in, t) ? std::min(t.masked_gate_min_tokens, t.serve_max_tokens_large + 1) : t.masked_gate_min_tokens;
}

// What each path needs of the call, whatever the tuning (NULL: it can run).
const char *serve_refuses(const PlanInput &in) {
    if (in.training) return "the serving path is inference only";
    if (in.gate_f32()) return "the serving path runs 16-bit DEFAULT or FP8 FFNs";
    if (in.dp > max_model_dim(in.type)) return "the serving path takes D up to max_model_dim";
    if (!in.x_rows_16b) return "the serving path needs X row-major with rows on 16 bytes";
    return nullptr;
}
const char *decode_refuses(const PlanInput &in) {
    if (in.training) return "the decode path is inference only";
    if (in.fp8) return "the decode path reads 16-bit weights (not TW_COMPUTE_FP8_WEIGHTS)";
    if (!decode_fits(in.m, in.dp, in.gate_f32()))
        return "the decode path runs 1 to 4 tokens of a 16-bit DEFAULT FFN with D <= 4096";
    return nullptr;
}
const char *dense_refuses(const PlanInput &in) {
    if (!in.cublas()) return "dense mode runs 16-bit DEFAULT FFNs, not in deterministic mode";
    if (!in.y_row_major_ld8) return "dense mode needs Y row-major with a leading dimension a multiple of 8";
    return nullptr;
}
const char *fused_refuses(const PlanInput &in) {
    if (in.training) return "the fused kernel is inference only (training saves through the two-pass kernels)";
    if (in.fp8) return "the fused kernel reads 16-bit weights (not TW_COMPUTE_FP8_WEIGHTS)";
    return nullptr;
}
const char *masked_refuses(const PlanInput &in) {
    if (in.gate_f32()) return "the masked gate GEMM runs 16-bit DEFAULT or FP8 FFNs";
    if (!in.masked_gate_fits)
        return "the masked gate GEMM needs an sm_90a build on an sm_90 GPU, X row-major and 16-byte rows";
    return nullptr;
}

/// serve_down's groups: one per batch of active units each of its warps would otherwise chain
/// (a block of kServeDownWarps warps loads kServeDownBatch rows a warp at a time), as the last
/// forward's mean suggests; at most kServeDownMaxGroups, and kServeDownMaxBlocks blocks in all.
int serve_down_groups(const PlanInput &in, double mean_active) {
    const int64_t slices = (in.dp + kServeDownCols - 1) / kServeDownCols, per_round = int64_t{kServeDownWarps} * kServeDownBatch;
    const int64_t wanted = static_cast<int64_t>(std::ceil(mean_active / static_cast<double>(per_round)));
    const int64_t room = kServeDownMaxBlocks / std::max<int64_t>(1, slices * in.m);
    return static_cast<int>(std::clamp<int64_t>(std::min({wanted, room, int64_t{kServeDownMaxGroups}}), 1, kServeDownMaxGroups));
}

ServePlan serve_plan(const PlanInput &in, const FfnTuning &t, bool writes_h, const PlanFeedback &fb) {
    ServePlan s;
    s.own_gate = in.m <= serve_gate_max_tokens(in, t);
    s.gate_rows = s.own_gate && in.m <= serve_gate_rows_max_tokens(in, t);
    s.down_groups = s.own_gate ? serve_down_groups(in, fb.mean_active) : 1;
    s.stats_kernel = in.m > 1 && (s.own_gate ? t.serve_stats_kernel_few : t.serve_stats_kernel);
    s.token_warps = serve_token_warps(t, in.m, writes_h);
    s.token_splits = serve_token_splits(t, in.m, in.dp, writes_h, s.token_warps);
    return s;
}

[[noreturn]] void refuse(twFfnAlgorithm_t alg, const char *why) {
    fail(TW_STATUS_NOT_SUPPORTED, "TW_FFN_ATTR_ALGORITHM %d: %s", static_cast<int>(alg), why);
}

}  // namespace

bool dense_mode_wanted(int64_t tokens, const PlanFeedback &fb, const FfnTuning &t) {
    return fb.dense_mode || (fb.dense_row_fraction > 0.0 && tokens <= t.dense_rows_dense_mode_max_tokens);
}

bool training_dense_mode_likely(const PlanInput &in, const PlanFeedback &fb, const FfnTuning &t) {
    if (!in.training || in.m <= 0 || dense_refuses(in)) return false;
    if (in.algorithm == TW_FFN_ALG_DENSE) return true;
    return in.algorithm == TW_FFN_ALG_DEFAULT && dense_mode_wanted(in.m, fb, t);
}

ForwardPlan plan_forward(const PlanInput &in, const PlanFeedback &fb, const FfnTuning &t) {
    ForwardPlan plan;
    const twFfnAlgorithm_t alg = in.m > 0 ? in.algorithm : TW_FFN_ALG_DEFAULT;  // no tokens: nothing runs
    // FP8 weights too: rows on the dense path and dense mode read the 16-bit weights
    const bool cublas = in.cublas() && in.m > 0;
    // a pinned algorithm that cannot run says why, before anything is enqueued
    const char *why = nullptr;
    switch (alg) {
    case TW_FFN_ALG_DEFAULT: break;
    case TW_FFN_ALG_SERVE: why = serve_refuses(in); break;
    case TW_FFN_ALG_DECODE: why = decode_refuses(in); break;
    case TW_FFN_ALG_DENSE: why = dense_refuses(in); break;
    case TW_FFN_ALG_FUSED: why = fused_refuses(in); break;
    case TW_FFN_ALG_TWO_PASS: break;
    case TW_FFN_ALG_MASKED_TWO_PASS: why = masked_refuses(in); break;
    default: why = "unknown algorithm";
    }
    if (why) refuse(alg, why);

    if (alg == TW_FFN_ALG_DEFAULT) {
        // after a forward that chose dense mode the cuBLAS projections win, unless few tokens
        // gather fewer weight rows than they read
        const bool gathers = !fb.dense_mode || in.deterministic ||
                             static_cast<double>(in.m) * fb.mean_active <=
                                 t.dense_mode_gather_share * static_cast<double>(in.h);
        if (!serve_refuses(in) && gathers && (!in.fp8 || t.serve_fp8) && in.m >= 1 && in.m <= serve_max_tokens(in, t))
            plan.path = FfnPath::Serve;
        else if (!decode_refuses(in) && gathers)
            plan.path = FfnPath::Decode;
        else if (!dense_refuses(in) && in.m > 0 && dense_mode_wanted(in.m, fb, t))
            plan.path = FfnPath::DenseMode;
        else
            plan.path = in.training || in.fp8 || in.m >= t.two_pass_min_tokens ? FfnPath::TwoPass : FfnPath::Fused;
        plan.masked_gate = (plan.path == FfnPath::TwoPass || plan.path == FfnPath::Fused) && !masked_refuses(in) &&
                           in.m >= masked_gate_min_tokens(in, t);
    } else {
        switch (alg) {
        case TW_FFN_ALG_SERVE: plan.path = FfnPath::Serve; break;
        case TW_FFN_ALG_DECODE: plan.path = FfnPath::Decode; break;
        case TW_FFN_ALG_DENSE: plan.path = FfnPath::DenseMode; break;
        case TW_FFN_ALG_FUSED: plan.path = FfnPath::Fused; break;
        default: plan.path = FfnPath::TwoPass; break;
        }
        plan.masked_gate = alg == TW_FFN_ALG_MASKED_TWO_PASS;
    }

    switch (plan.path) {
    case FfnPath::Serve: plan.serve = serve_plan(in, t, in.writes_hidden, fb); break;
    case FfnPath::Decode: break;
    case FfnPath::DenseMode:
        plan.dense_stats = in.m <= t.dense_stats_beside_max_tokens ? DenseStats::Beside
                           : static_cast<double>(in.m) * fb.mean_active <= static_cast<double>(t.dense_stats_atomics_max_values)
                               ? DenseStats::Atomics
                               : DenseStats::SharedCounts;
        // two blocks an SM, more while each keeps 16 rows: a block's counts cost H atomics
        // whatever its rows, its rows' loads are what keeps DRAM busy
        plan.hidden_blocks = std::clamp<int64_t>((in.m + 15) / 16, int64_t{2} * in.sm_count,
                                                 std::max<int64_t>(2, t.dense_hidden_blocks_per_sm) * in.sm_count);
        // the statistics beside the down GEMM (a block a row) need SMs its tiles leave free
        if (plan.dense_stats == DenseStats::Beside) {
            const int64_t spare = std::min(t.dense_stats_spare_sms, in.m / 2);
            if (spare > 0 && spare < in.sm_count) plan.down_gemm_sms = static_cast<int>(in.sm_count - spare);
        }
        break;
    case FfnPath::Fused:
    case FfnPath::TwoPass:
        if (plan.masked_gate) plan.masked_gate_tile_n = masked_gate_tile_n(in.m, in.h, in.sm_count);
        plan.lists_in_fwd_u = plan.masked_gate && plan.path == FfnPath::TwoPass && (!in.fp8 || t.fwd_u_lists_fp8) &&
                              in.m <= t.fwd_u_lists_max_tokens;
        plan.cublas_rows = cublas ? dense_path_cublas_rows(fb.dense_row_fraction, in.m) : 0;
        break;
    }
    return plan;
}

// ---- knobs by name

namespace {

enum class Kind { Count, Switch, Share };
struct Knob {
    const char *name;
    Kind kind;
    int64_t FfnTuning::*count;
    bool FfnTuning::*flag;
    double FfnTuning::*share;
};

#define TW_COUNT(n) Knob{#n, Kind::Count, &FfnTuning::n, nullptr, nullptr}
#define TW_SWITCH(n) Knob{#n, Kind::Switch, nullptr, &FfnTuning::n, nullptr}
#define TW_SHARE(n) Knob{#n, Kind::Share, nullptr, nullptr, &FfnTuning::n}
const Knob kKnobs[] = {
    TW_COUNT(serve_max_tokens),
    TW_COUNT(serve_max_tokens_large),
    TW_COUNT(serve_gate_max_tokens),
    TW_COUNT(serve_gate_rows_max_tokens),
    TW_COUNT(serve_gate_rows_max_tokens_large),
    TW_COUNT(serve_gate_large_weights),
    TW_COUNT(serve_token_narrow_min_tokens),
    TW_COUNT(serve_token_blocks),
    TW_SWITCH(serve_stats_kernel),
    TW_SWITCH(serve_stats_kernel_few),
    TW_SWITCH(serve_fp8),
    TW_SHARE(dense_mode_units_per_hidden),
    TW_SHARE(dense_mode_dense_share),
    TW_COUNT(dense_rows_dense_mode_max_tokens),
    TW_SHARE(dense_mode_gather_share),
    TW_COUNT(dense_stats_beside_max_tokens),
    TW_COUNT(dense_stats_atomics_max_values),
    TW_COUNT(dense_stats_spare_sms),
    TW_COUNT(dense_hidden_blocks_per_sm),
    TW_COUNT(masked_gate_min_tokens),
    TW_COUNT(two_pass_min_tokens),
    TW_COUNT(fwd_u_lists_max_tokens),
    TW_SWITCH(fwd_u_lists_fp8),
};
#undef TW_COUNT
#undef TW_SWITCH
#undef TW_SHARE

const Knob *find_knob(const char *name) {
    if (!name) return nullptr;
    for (const Knob &k : kKnobs)
        if (std::string_view(k.name) == name) return &k;
    return nullptr;
}

}  // namespace

bool set_tuning_knob(FfnTuning &t, const char *name, double value) {
    const Knob *k = find_knob(name);
    if (!k || !(value >= 0.0)) return false;  // also NaN
    switch (k->kind) {
    case Kind::Count:
        if (value != static_cast<double>(static_cast<int64_t>(value)) || value > 9.0e18) return false;
        t.*(k->count) = static_cast<int64_t>(value);
        return true;
    case Kind::Switch:
        if (value != 0.0 && value != 1.0) return false;
        t.*(k->flag) = value != 0.0;
        return true;
    case Kind::Share:
        if (value > 1.0) return false;
        t.*(k->share) = value;
        return true;
    }
    return false;
}

bool get_tuning_knob(const FfnTuning &t, const char *name, double *value) {
    const Knob *k = find_knob(name);
    if (!k || !value) return false;
    *value = k->kind == Kind::Count    ? static_cast<double>(t.*(k->count))
             : k->kind == Kind::Switch ? (t.*(k->flag) ? 1.0 : 0.0)
                                       : t.*(k->share);
    return true;
}

const char *const *tuning_knob_names() {
    static const auto names = [] {
        std::array<const char *, std::size(kKnobs) + 1> n{};
        for (size_t i = 0; i < std::size(kKnobs); ++i) n[i] = kKnobs[i].name;
        return n;
    }();
    return names.data();
}

}  // namespace twblas::cuda
