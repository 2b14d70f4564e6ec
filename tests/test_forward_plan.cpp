// The CUDA forward's plan (src/device/plan), tested on the CPU: a pure function of the problem,
// the call's arguments, the algorithm attribute, the tuning and the last forward's statistics.
// Every path is reachable, each crossover sits where the tuning says, a pinned algorithm runs its
// path or says why it cannot, and the knobs by name round-trip.
#include <catch2/catch.hpp>

#include <set>
#include <string>
#include <vector>

#include "host/error.hpp"
#include "plan/forward_plan.hpp"

using namespace twblas;
using namespace twblas::cuda;

namespace {

/// The paper's FFN (D 2048, H 5632, bf16) on an sm_90a build: every path available.
PlanInput paper(int64_t m) {
    PlanInput in;
    in.m = m, in.d = 2048, in.h = 5632, in.dp = 2048;
    in.masked_gate_fits = m > 0;
    return in;
}
/// Llama-3-8B's FFN (D 4096, H 14336): a gate past serve_gate_large_weights.
PlanInput llama(int64_t m) {
    PlanInput in = paper(m);
    in.d = in.dp = 4096, in.h = 14336;
    return in;
}

/// How many tokens, from one up, take serve_gate's CUDA-core instance (serve_gate_rows) under `t`.
int64_t gate_rows_tokens(PlanInput (*shape)(int64_t), const FfnTuning &t) {
    int64_t m = 0;
    while (m < 64 && plan_forward(shape(m + 1), {}, t).serve.gate_rows) ++m;
    return m;
}

FfnPath path_of(const PlanInput &in, const PlanFeedback &fb = {}, const FfnTuning &t = {}) {
    return plan_forward(in, fb, t).path;
}

twStatus_t refusal(const PlanInput &in, const PlanFeedback &fb = {}) {
    try {
        (void)plan_forward(in, fb, FfnTuning{});
    } catch (const Error &e) {
        return e.status();
    }
    return TW_STATUS_SUCCESS;
}

}  // namespace

TEST_CASE("plan: the default paths by token count at the paper's shape", "[plan]") {
    for (int64_t m : {1, 2, 8, 16, 17, 64, 128, 129, 256}) {
        INFO("M = " << m);
        const ForwardPlan p = plan_forward(paper(m), {}, {});
        CHECK(p.path == FfnPath::Serve);
        CHECK(p.serve.own_gate == (m <= 16));
        CHECK(p.serve.stats_kernel == (m > 1));
        CHECK(p.serve.token_warps == (m >= 129 ? 8 : 16));
    }
    for (int64_t m : {257, 512, 4096, 4097, 16384}) {
        INFO("M = " << m);
        const ForwardPlan p = plan_forward(paper(m), {}, {});
        CHECK(p.path == FfnPath::TwoPass);
        CHECK(p.masked_gate);
        CHECK(p.lists_in_fwd_u == (m <= 4096));
        CHECK(p.cublas_rows == 0);  // no rows on the dense path seen yet
    }
    // the masked gate GEMM's tile: 192 wide where 256-wide tiles leave SMs idle in their one wave
    CHECK(plan_forward(paper(512), {}, {}).masked_gate_tile_n == 192);
    CHECK(plan_forward(paper(16384), {}, {}).masked_gate_tile_n == 256);
    // no tokens: a plan, nothing runs
    CHECK_NOTHROW(plan_forward(paper(0), {}, {}));
}

TEST_CASE("plan: serve_down splits rows of hundreds of units into groups of blocks", "[plan]") {
    PlanFeedback fb;
    fb.mean_active = 29;  // one batch of loads a warp: one group
    CHECK(plan_forward(paper(1), fb, {}).serve.down_groups == 1);
    CHECK(plan_forward(paper(1), {}, {}).serve.down_groups == 1);  // no forward yet
    fb.mean_active = 600;  // 5 batches of 16 warps x 8 rows
    CHECK(plan_forward(paper(1), fb, {}).serve.down_groups == 5);
    // at most 256 blocks: 8 column slices x 16 tokens leave room for 2 groups
    CHECK(plan_forward(paper(16), fb, {}).serve.down_groups == 2);
    fb.mean_active = 5000;  // capped at 16 groups
    CHECK(plan_forward(paper(1), fb, {}).serve.down_groups == 16);
    // whatever the shape, the groups' blocks fit the workspace's partial rows (the launcher relies on it)
    for (int64_t d : {8, 264, 2048, 4096, 8192})
        for (int64_t m = 1; m <= 16; ++m) {
            PlanInput in = paper(m);
            in.d = in.dp = d;
            const int groups = plan_forward(in, fb, {}).serve.down_groups;
            INFO("D " << d << " M " << m << " groups " << groups);
            CHECK((groups == 1 || (d + kServeDownCols - 1) / kServeDownCols * m * groups <= kServeDownMaxBlocks));
        }
    // past serve_gate's tokens serve_token runs: no groups
    fb.mean_active = 600;
    const ForwardPlan p = plan_forward(paper(17), fb, {});
    REQUIRE(p.path == FfnPath::Serve);
    CHECK(p.serve.down_groups == 1);
}

TEST_CASE("plan: large gates end the serving path and serve_gate earlier", "[plan]") {
    CHECK(plan_forward(llama(8), {}, {}).serve.own_gate);
    CHECK_FALSE(plan_forward(llama(9), {}, {}).serve.own_gate);
    CHECK(path_of(llama(128)) == FfnPath::Serve);
    const ForwardPlan p = plan_forward(llama(129), {}, {});
    CHECK(p.path == FfnPath::TwoPass);
    CHECK(p.masked_gate);  // right after the serving path ends
}

TEST_CASE("plan: arguments the serving path cannot take", "[plan]") {
    // X rows off 16 bytes: decode up to 4 tokens, then the fused kernel, then two passes
    for (int64_t m : {1, 4, 5, 128, 129}) {
        PlanInput in = paper(m);
        in.x_rows_16b = false;
        in.masked_gate_fits = false;
        INFO("M = " << m);
        CHECK(path_of(in) == (m <= 4 ? FfnPath::Decode : m < 129 ? FfnPath::Fused : FfnPath::TwoPass));
    }
    // fp32 and HIGHEST_PRECISION: no tensor-core gate of ours, no cuBLAS dense parts
    for (bool f32 : {true, false}) {
        PlanInput in = paper(1);
        if (f32)
            in.type = TW_R_32F;
        else
            in.highest = true;
        CHECK(path_of(in) == FfnPath::Fused);
        in.m = 16384;
        const ForwardPlan p = plan_forward(in, {true, 900.0, 0.5}, {});
        CHECK(p.path == FfnPath::TwoPass);
        CHECK_FALSE(p.masked_gate);
        CHECK(p.cublas_rows == 0);
    }
    // D past the decode kernel's registers
    PlanInput wide = paper(2);
    wide.x_rows_16b = false;
    wide.d = wide.dp = 8192;
    CHECK(path_of(wide) == FfnPath::Fused);
}

TEST_CASE("plan: dense mode from the statistics", "[plan]") {
    const PlanFeedback dense{true, 600.0, 0.0};
    // few tokens still gather while tokens x units <= 0.34 H (1914.9 at H = 5632)
    CHECK(path_of(paper(1), dense) == FfnPath::Serve);
    CHECK(path_of(paper(3), dense) == FfnPath::Serve);
    CHECK(path_of(paper(4), dense) == FfnPath::DenseMode);
    CHECK(path_of(paper(16384), dense) == FfnPath::DenseMode);
    // rows on the dense path: dense mode up to 512 tokens, the sparse path with cuBLAS rows past it
    const PlanFeedback heavy{false, 29.0, 0.01};
    CHECK(path_of(paper(300), heavy) == FfnPath::DenseMode);
    CHECK(path_of(paper(512), heavy) == FfnPath::DenseMode);
    const ForwardPlan p = plan_forward(paper(513), heavy, {});
    CHECK(p.path == FfnPath::TwoPass);
    CHECK(p.cublas_rows == 128);  // 1.25 x 5.13 + 64, rounded up to 64
    CHECK(dense_path_cublas_rows(0.5, 100) == 100);  // never past the tokens
    // its statistics: beside the down GEMM up to 128 tokens, then with h, counting by atomics
    // while tokens x units <= 262144, else in shared memory
    CHECK(plan_forward(paper(128), dense, {}).dense_stats == DenseStats::Beside);
    CHECK(plan_forward(paper(129), dense, {}).dense_stats == DenseStats::Atomics);
    CHECK(plan_forward(paper(300), heavy, {}).dense_stats == DenseStats::Atomics);
    CHECK(plan_forward(paper(437), dense, {}).dense_stats == DenseStats::SharedCounts);  // 262200 values
    // beside, the down GEMM leaves min(16, tokens / 2) SMs to the statistics (132 here)
    CHECK(plan_forward(paper(16), dense, {}).down_gemm_sms == 124);
    CHECK(plan_forward(paper(128), dense, {}).down_gemm_sms == 116);
    CHECK(plan_forward(paper(300), heavy, {}).down_gemm_sms == 0);
    // the one pass: two blocks an SM, up to four while each keeps 16 rows
    CHECK(plan_forward(paper(512), dense, {}).hidden_blocks == 264);
    CHECK(plan_forward(paper(8192), dense, {}).hidden_blocks == 512);
    CHECK(plan_forward(paper(16384), dense, {}).hidden_blocks == 528);
    FfnTuning counts_in_shared;
    counts_in_shared.dense_stats_atomics_max_values = 0;
    CHECK(plan_forward(paper(300), heavy, counts_in_shared).dense_stats == DenseStats::SharedCounts);
    // deterministic mode never switches (its bits would depend on history)
    PlanInput det = paper(16384);
    det.deterministic = true;
    const ForwardPlan d = plan_forward(det, dense, {});
    CHECK(d.path == FfnPath::TwoPass);
    CHECK(d.cublas_rows == 0);
    // Y that dense mode's GEMM cannot write
    PlanInput y_col = paper(16384);
    y_col.y_row_major_ld8 = false;
    CHECK(path_of(y_col, dense) == FfnPath::TwoPass);
}

TEST_CASE("plan: FP8 weights and training", "[plan]") {
    PlanInput fp8 = paper(64);
    fp8.fp8 = true;
    CHECK(path_of(fp8) == FfnPath::Serve);
    FfnTuning no_serve_fp8;
    no_serve_fp8.serve_fp8 = false;
    CHECK(path_of(fp8, {}, no_serve_fp8) == FfnPath::TwoPass);
    fp8.m = 16384;
    // FP8 takes DEFAULT's decisions: dense mode and the dense path's cuBLAS rows (16-bit weights)
    CHECK(path_of(fp8, {true, 900.0, 0.3}) == FfnPath::DenseMode);
    const ForwardPlan p = plan_forward(fp8, {false, 29.0, 0.01}, {});
    CHECK(p.path == FfnPath::TwoPass);
    CHECK(p.cublas_rows == 320);  // 1.25 x 163.84 + 64, rounded up to 64
    CHECK(p.lists_in_fwd_u == false);  // past 4096 tokens
    fp8.m = 512;
    CHECK(plan_forward(fp8, {}, {}).lists_in_fwd_u);
    CHECK(path_of(fp8, {false, 29.0, 0.01}) == FfnPath::DenseMode);

    PlanInput train = paper(8);
    train.training = true;
    CHECK(path_of(train) == FfnPath::TwoPass);
    CHECK(path_of(train, {true, 900.0, 0.0}) == FfnPath::DenseMode);
    train.m = 16384;
    CHECK(plan_forward(train, {}, {}).masked_gate);
}

TEST_CASE("plan: the saved state's room for z and u follows the training plan", "[plan]") {
    // what TW_SAVE_DENSE_AUTO sizes for must agree with the path the training forward then takes
    const std::vector<PlanFeedback> feedbacks = {
        {}, {true, 900.0, 0.3}, {false, 29.0, 0.01}, {false, 29.0, 0.0}, {true, 120.0, 0.0}};
    for (int64_t m : {0, 1, 8, 300, 512, 513, 16384})
        for (const PlanFeedback &fb : feedbacks) {
            PlanInput train = paper(m);
            train.training = true;
            INFO("M = " << m << ", dense mode " << fb.dense_mode << ", dense rows " << fb.dense_row_fraction);
            CHECK(training_dense_mode_likely(train, fb, {}) == (m > 0 && path_of(train, fb) == FfnPath::DenseMode));
            train.algorithm = TW_FFN_ALG_DENSE;
            CHECK(training_dense_mode_likely(train, fb, {}) == (m > 0));
            train.algorithm = TW_FFN_ALG_TWO_PASS;
            CHECK_FALSE(training_dense_mode_likely(train, fb, {}));
            train.algorithm = TW_FFN_ALG_DEFAULT;
            train.deterministic = true;  // no dense mode there
            CHECK_FALSE(training_dense_mode_likely(train, fb, {}));
            train.deterministic = false;
            train.training = false;  // inference keeps no saved state
            CHECK_FALSE(training_dense_mode_likely(train, fb, {}));
        }
}

TEST_CASE("plan: a pinned algorithm runs its path or says why not", "[plan]") {
    const struct {
        twFfnAlgorithm_t alg;
        FfnPath path;
    } pins[] = {{TW_FFN_ALG_SERVE, FfnPath::Serve},         {TW_FFN_ALG_DECODE, FfnPath::Decode},
                {TW_FFN_ALG_DENSE, FfnPath::DenseMode},     {TW_FFN_ALG_FUSED, FfnPath::Fused},
                {TW_FFN_ALG_TWO_PASS, FfnPath::TwoPass},    {TW_FFN_ALG_MASKED_TWO_PASS, FfnPath::TwoPass}};
    for (const auto &pin : pins) {
        PlanInput in = paper(3);
        in.algorithm = pin.alg;
        INFO("algorithm " << pin.alg);
        const ForwardPlan p = plan_forward(in, {}, {});
        CHECK(p.path == pin.path);
        CHECK(p.masked_gate == (pin.alg == TW_FFN_ALG_MASKED_TWO_PASS));
        // the serving path pinned past its default reach, and the others at a prefill's size
        if (pin.alg != TW_FFN_ALG_DECODE) {
            in.m = 1000;
            CHECK(plan_forward(in, {}, {}).path == pin.path);
        }
    }
    // pinned away from dense mode, a dense forward still runs the pinned path
    PlanInput two = paper(16384);
    two.algorithm = TW_FFN_ALG_TWO_PASS;
    CHECK(path_of(two, {true, 900.0, 0.0}) == FfnPath::TwoPass);
    CHECK_FALSE(plan_forward(two, {}, {}).masked_gate);

    auto refused = [](PlanInput in, twFfnAlgorithm_t alg) {
        in.algorithm = alg;
        return refusal(in);
    };
    PlanInput five = paper(5);
    CHECK(refused(five, TW_FFN_ALG_DECODE) == TW_STATUS_NOT_SUPPORTED);
    PlanInput train = paper(8);
    train.training = true;
    CHECK(refused(train, TW_FFN_ALG_SERVE) == TW_STATUS_NOT_SUPPORTED);
    CHECK(refused(train, TW_FFN_ALG_DECODE) == TW_STATUS_NOT_SUPPORTED);
    CHECK(refused(train, TW_FFN_ALG_FUSED) == TW_STATUS_NOT_SUPPORTED);
    CHECK(refused(train, TW_FFN_ALG_DENSE) == TW_STATUS_SUCCESS);
    CHECK(refused(train, TW_FFN_ALG_MASKED_TWO_PASS) == TW_STATUS_SUCCESS);
    PlanInput det = paper(8);
    det.deterministic = true;
    CHECK(refused(det, TW_FFN_ALG_DENSE) == TW_STATUS_NOT_SUPPORTED);
    PlanInput f32 = paper(8);
    f32.type = TW_R_32F;
    for (twFfnAlgorithm_t a : {TW_FFN_ALG_SERVE, TW_FFN_ALG_DECODE, TW_FFN_ALG_DENSE, TW_FFN_ALG_MASKED_TWO_PASS})
        CHECK(refused(f32, a) == TW_STATUS_NOT_SUPPORTED);
    CHECK(refused(f32, TW_FFN_ALG_FUSED) == TW_STATUS_SUCCESS);
    PlanInput fp8 = paper(2);
    fp8.fp8 = true;
    CHECK(refused(fp8, TW_FFN_ALG_DECODE) == TW_STATUS_NOT_SUPPORTED);
    CHECK(refused(fp8, TW_FFN_ALG_FUSED) == TW_STATUS_NOT_SUPPORTED);
    CHECK(refused(fp8, TW_FFN_ALG_SERVE) == TW_STATUS_SUCCESS);
    CHECK(refused(fp8, TW_FFN_ALG_DENSE) == TW_STATUS_SUCCESS);
    PlanInput no_sm90a = paper(512);
    no_sm90a.masked_gate_fits = false;
    CHECK(refused(no_sm90a, TW_FFN_ALG_MASKED_TWO_PASS) == TW_STATUS_NOT_SUPPORTED);
    CHECK_FALSE(plan_forward(no_sm90a, {}, {}).masked_gate);  // DEFAULT goes without it
    PlanInput odd = paper(8);
    odd.x_rows_16b = false;
    CHECK(refused(odd, TW_FFN_ALG_SERVE) == TW_STATUS_NOT_SUPPORTED);
    // no tokens: nothing runs, whatever is pinned
    CHECK(refused(paper(0), TW_FFN_ALG_DECODE) == TW_STATUS_SUCCESS);
}

TEST_CASE("plan: the tuning moves each crossover", "[plan]") {
    FfnTuning t;
    t.serve_max_tokens = 0;
    t.two_pass_min_tokens = 64;
    t.masked_gate_min_tokens = 100000;
    CHECK(path_of(paper(63), {}, t) == FfnPath::Fused);
    CHECK(path_of(paper(64), {}, t) == FfnPath::TwoPass);
    CHECK_FALSE(plan_forward(paper(64), {}, t).masked_gate);
    t.masked_gate_min_tokens = 64;
    CHECK(plan_forward(paper(64), {}, t).masked_gate);
    t.fwd_u_lists_max_tokens = 63;
    CHECK_FALSE(plan_forward(paper(64), {}, t).lists_in_fwd_u);

    FfnTuning s;
    s.serve_gate_max_tokens = 8;
    s.serve_token_narrow_min_tokens = 32;
    s.serve_stats_kernel = false;
    const ForwardPlan p = plan_forward(paper(32), {}, s);
    CHECK_FALSE(p.serve.own_gate);
    CHECK_FALSE(p.serve.stats_kernel);
    CHECK(p.serve.token_warps == 8);
    s.serve_gate_max_tokens = 64;  // past serve_gate's capacity: held at 16
    CHECK_FALSE(plan_forward(paper(17), {}, s).serve.own_gate);

    // serve_gate's CUDA-core instance: 2 tokens by default, 1 when asked, never past its
    // instances or where serve_gate does not run
    const FfnTuning r;
    CHECK(gate_rows_tokens(paper, r) == 2);
    FfnTuning r2;
    r2.serve_gate_rows_max_tokens = 1;
    CHECK(gate_rows_tokens(paper, r2) == 1);
    r2.serve_gate_rows_max_tokens = 16;  // held at its instances' 2 tokens
    CHECK(gate_rows_tokens(paper, r2) == 2);
    r2.serve_gate_rows_max_tokens = 0;
    CHECK(gate_rows_tokens(paper, r2) == 0);
    r2.serve_gate_rows_max_tokens = 2;
    r2.serve_gate_max_tokens = 0;  // cuBLAS's gate from the first token
    CHECK(gate_rows_tokens(paper, r2) == 0);
    // gates past serve_gate_large_weights: 2 tokens by default, their own knob
    CHECK(gate_rows_tokens(llama, r) == 2);
    FfnTuning r3;
    r3.serve_gate_rows_max_tokens_large = 1;
    CHECK(gate_rows_tokens(llama, r3) == 1);
    r3.serve_gate_rows_max_tokens = 0;  // the paper's knob leaves large gates alone
    CHECK(gate_rows_tokens(llama, r3) == 1);

    FfnTuning g;
    g.dense_mode_gather_share = 1.0;
    CHECK(path_of(paper(9), {true, 600.0, 0.0}, g) == FfnPath::Serve);
    g.dense_rows_dense_mode_max_tokens = 256;
    CHECK(path_of(paper(300), {false, 29.0, 0.01}, g) == FfnPath::TwoPass);

    // serve_token's splits: about 128 blocks of 16 warps, at most 4 a token, one with a hidden
    // output; at least one 16-byte chunk a thread
    const FfnTuning d;
    CHECK(serve_token_splits(d, 32, 2048, false, 16) == 4);
    CHECK(serve_token_splits(d, 64, 2048, false, 16) == 2);
    CHECK(serve_token_splits(d, 256, 2048, false, 8) == 1);
    CHECK(serve_token_splits(d, 1, 2048, true, 16) == 1);
    CHECK(serve_token_splits(d, 256, 8192, false, 8) == 4);
}

TEST_CASE("plan: capacities the workspace layout depends on", "[plan]") {
    CHECK(fused_splits(1) == 32);
    CHECK(fused_splits(64) == 8);
    CHECK(fused_splits(128) == 4);
    CHECK(fused_splits(129) == 1);
    CHECK(fused_splits(0) == 1);
    CHECK(decode_fits(4, 4096, false));
    CHECK_FALSE(decode_fits(5, 2048, false));
    CHECK_FALSE(decode_fits(1, 4104, false));
    CHECK_FALSE(decode_fits(1, 2048, true));
    CHECK(dense_path_row_limit(5632) == 176);
    CHECK(dense_path_row_limit(1000) == 64);
    CHECK(max_model_dim(TW_R_16BF) == 8192);
    CHECK(max_model_dim(TW_R_32F) == 4096);
}

TEST_CASE("plan: tuning knobs by name", "[plan]") {
    FfnTuning t;
    std::set<std::string> names;
    for (const char *const *n = tuning_knob_names(); *n; ++n) {
        INFO(*n);
        CHECK(names.insert(*n).second);
        double v = -1.0;
        REQUIRE(get_tuning_knob(t, *n, &v));
        CHECK(set_tuning_knob(t, *n, v));  // every default is in its own range
    }
    CHECK(names.size() == 23);
    CHECK(set_tuning_knob(t, "two_pass_min_tokens", 300));
    CHECK(t.two_pass_min_tokens == 300);
    CHECK_FALSE(set_tuning_knob(t, "two_pass_min_tokens", 2.5));
    CHECK_FALSE(set_tuning_knob(t, "two_pass_min_tokens", -1));
    CHECK_FALSE(set_tuning_knob(t, "serve_fp8", 2));
    CHECK(set_tuning_knob(t, "serve_fp8", 0));
    CHECK_FALSE(t.serve_fp8);
    CHECK_FALSE(set_tuning_knob(t, "dense_mode_gather_share", 1.5));
    CHECK(set_tuning_knob(t, "dense_mode_gather_share", 0.5));
    CHECK(t.dense_mode_gather_share == 0.5);
    CHECK_FALSE(set_tuning_knob(t, "no_such_knob", 1));
    CHECK_FALSE(set_tuning_knob(t, nullptr, 1));
    double v = 0;
    CHECK_FALSE(get_tuning_knob(t, "no_such_knob", &v));
    CHECK(t.two_pass_min_tokens == 300);  // failed sets changed nothing
}
