// The training path on the CUDA backend alone, against the CPU reference: recomputed rows
// through cuBLAS, past the capacity the statistics suggested and in dense mode, every profile,
// type and compute mode, more than 65536 tokens, CUDA graph capture, finite differences of the
// GPU forward. Linked into test_cuda_training with the shared cases of test_ffn_backward.cpp
// built for CUDA; without a usable GPU the program is skipped (cuda_test_main.cpp).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "cuda_test_support.hpp"
#include "test_support.hpp"
#include "testing/problem.hpp"
#include "training_support.hpp"

using namespace twtest;
namespace tt = twblas::testing;

namespace {

/// Steps in dense mode: small integers (results bit-identical to the reference), D = 72 keeps Y's
/// rows on 16 bytes (dense mode's condition), M = 512 makes M x hp x 2 bytes a multiple of 256 (the
/// kept z and u are the saved state's tail). The warm step fires most units of every token, which
/// puts the FFN in dense mode; the step fires them for every 5th token.
struct DenseModeSteps {
    TrainCase c;
    TrainData warm, data;
};
DenseModeSteps dense_mode_steps(TrainCase c) {
    c.integers = true;
    c.m = 512;
    c.d = 72;
    c.l1 = static_cast<float>(c.m);
    TrainCase w = c;
    w.heavy_every = 1;
    c.heavy_every = 5;
    return {c, make_data(w), make_data(c)};
}

/// Bytes of the kept z and u (u for a gated FFN) at the saved state's tail.
size_t kept_z_u_bytes(const TrainCase &c) { return static_cast<size_t>((c.gated ? 2 : 1) * c.m * ((c.h + 7) / 8 * 8) * 2); }

/// `run` with the kept z and u set to +0 after each forward: every unit then looks inactive to a
/// backward that reads them.
TrainRun zeroing_kept(TrainRun run, size_t kept) {
    run.between = [kept](Buffers &b, void *saved, size_t bytes) {
        REQUIRE(bytes > kept);
        b.zero(static_cast<char *>(saved) + (bytes - kept), kept);
    };
    return run;
}

/// The backward read the zeroed z and u: every gradient is +0, and y is the reference's.
void check_read_zeroed(const TrainCase &c, const TrainResult &r, const TrainExpected &want) {
    const auto zero = [](const std::vector<double> &g) {
        return std::all_of(g.begin(), g.end(), [](double e) { return e == 0.0; });
    };
    CHECK(zero(r.dx));
    CHECK(zero(r.dwu));
    CHECK(zero(r.dwd));
    if (c.gated) CHECK(zero(r.dwg));
    CHECK(r.y == want.r.y);  // the forward is not affected
}

}  // namespace

TEST_CASE("CUDA training: recomputed rows through cuBLAS, past the capacity the statistics suggested, dense mode",
          "[cuda][train]") {
    // a first step with 1 row in 200 on the dense path sets the cuBLAS capacity (128 rows here);
    // then 1 row in 5 (400 rows) needs the device-count GEMMs too. Small integers: bit-identical.
    for (bool gated : {true, false}) {
        TrainCase c;
        c.integers = true;
        c.gated = gated;
        c.m = 2000;
        c.l1 = static_cast<float>(c.m);
        // 5: every recomputed row within the capacity; 1: a first step with every row dense
        // puts the FFN in dense mode (cuBLAS forward, every row recomputed through cuBLAS)
        for (int warm_every : {5, 200, 1}) {
            TrainCase w = c;
            w.heavy_every = warm_every;
            const TrainData warm = make_data(w);
            c.heavy_every = 5;
            DYNAMIC_SECTION((gated ? "gated" : "plain") << ", warmed with 1 row in " << warm_every) {
                check_train_case(c, &warm.x);
            }
        }
    }
}

TEST_CASE("CUDA training: weights read in place or copied give the reference's bits", "[cuda][train][weights]") {
    // the forward, the recompute (cuBLAS and the gathered GEMM, reading Wd and Wu in place) and
    // the token phase over weights read in place (rows padded with NaN included) or copied (Wd
    // column-major, ld or base off 16 bytes, odd D). Small integers: bit-identical; 1 row in 5
    // recomputed, then (warmed with every row dense) dense mode.
    struct Placement {
        const char *name;
        int64_t d;
        twOrder_t wd_order;
        WeightLayout wg, wu, wd;
    };
    const Placement placements[] = {
        {"in place", 96, TW_ORDER_ROW, {}, {}, {}},
        {"in place, padded rows holding NaN", 96, TW_ORDER_ROW, {8, 0}, {16, 0}, {24, 0}},
        {"Wd column-major (nn.Linear)", 96, TW_ORDER_COL, {}, {}, {}},
        {"ld off 16 bytes", 96, TW_ORDER_ROW, {3, 0}, {5, 0}, {}},
        {"base off 16 bytes", 96, TW_ORDER_ROW, {0, 8}, {}, {0, 8}},
        {"odd D", 93, TW_ORDER_ROW, {}, {}, {}},
    };
    for (const Placement &p : placements)
        for (twDataType_t t : {TW_R_16BF, TW_R_32F})
            for (bool gated : {true, false})
                for (int warm_every : {0, 1}) {
                    if (warm_every && t == TW_R_32F) continue;  // dense mode is for 16-bit values
                    TrainCase c;
                    c.integers = true;
                    c.type = t;
                    c.gated = gated;
                    c.m = 400;
                    c.d = p.d;
                    c.h = 300;
                    c.l1 = static_cast<float>(c.m);
                    c.heavy_every = 5;
                    c.wd_order = p.wd_order;
                    c.wg_layout = p.wg;
                    c.wu_layout = p.wu;
                    c.wd_layout = p.wd;
                    TrainCase w = c;
                    w.heavy_every = 1;
                    const TrainData warm = make_data(w);
                    DYNAMIC_SECTION(p.name << " type " << t << (gated ? " gated" : " plain")
                                           << (warm_every ? ", dense mode" : "")) {
                        check_train_case(c, warm_every ? &warm.x : nullptr);
                    }
                }
}

TEST_CASE("CUDA training: SAVE_DENSE keeps z and u in dense mode, and the backward reads them", "[cuda][train]") {
    // A first step with every row dense puts the FFN in dense mode; the step then keeps z and u
    // of every row in the saved state. Small integers: bit-identical to the reference whether
    // the backward reads them (row-major gradients, or column-major ones whose leading
    // dimension H is a whole number of 16-byte chunks) or recomputes (column-major with H = 601:
    // cuBLAS cannot write those; or a saved state moved to another address). D = 72 keeps Y's
    // rows on 16 bytes (dense mode's condition), H = 601 pads the hidden rows. Stacked [Wg; Wu]
    // and [dWg; dWu] (one matrix each): dX and the two gradients each one GEMM over both halves
    // (H = 600), or the separate GEMMs where pads would lie between the halves (H = 601).
    struct Variant {
        bool gated;
        twOrder_t order;
        int64_t h;
        bool reads_kept;  // the backward reads the kept z and u (else it recomputes)
        bool stacked = false;
    };
    for (const Variant v : {Variant{true, TW_ORDER_ROW, 601, true}, Variant{false, TW_ORDER_ROW, 601, true},
                            Variant{true, TW_ORDER_COL, 600, true}, Variant{false, TW_ORDER_COL, 600, true},
                            Variant{true, TW_ORDER_COL, 601, false}, Variant{true, TW_ORDER_ROW, 600, true, true},
                            Variant{true, TW_ORDER_ROW, 601, true, true}}) {
        TrainCase base;
        base.gated = v.gated;
        base.stacked = v.stacked;
        base.h = v.h;
        base.x_order = base.grad_order = v.order;
        base.save_dense = TW_SAVE_DENSE_ALWAYS;
        const DenseModeSteps steps = dense_mode_steps(base);
        const TrainCase &c = steps.c;
        const TrainData &warm = steps.warm, &data = steps.data;
        DYNAMIC_SECTION((v.gated ? "gated" : "plain") << (v.order == TW_ORDER_ROW ? " row-major" : " column-major")
                                                      << " H " << v.h << (v.stacked ? " stacked" : "")) {
            const TrainExpected want = expected_train(c, data);
            SECTION("kept") { check_train(c, run_train(c, data, kBackend, TrainRun().warmed_with(&warm.x)), want); }
            SECTION("replayed") {
                check_train(c, run_train(c, data, kBackend, TrainRun().warmed_with(&warm.x).times(2).replayed(graph_replay)),
                            want);
            }
            SECTION("the FFN told to leave dense mode before the backward") {
                // the backward follows its forward's mode (z and u kept; without save_dense, every
                // row recomputed through cuBLAS), not the one the newer statistics ask for
                TrainRun run = TrainRun().warmed_with(&warm.x);
                run.sparse_forward_between = true;
                check_train(c, run_train(c, data, kBackend, run), want);
                TrainCase recomputed = c;
                recomputed.save_dense = TW_SAVE_DENSE_NEVER;
                check_train(recomputed, run_train(recomputed, data, kBackend, run), want);
            }
            SECTION("moved: recomputed") {
                check_train(c, run_train(c, data, kBackend, TrainRun().warmed_with(&warm.x).saved_moved()), want);
            }
            SECTION("the kept z and u are what the backward reads") {
                // z and u set to +0 after the forward: every gradient is zero where the backward
                // reads them, and exact where it recomputes
                const TrainResult r =
                    run_train(c, data, kBackend, zeroing_kept(TrainRun().warmed_with(&warm.x), kept_z_u_bytes(c)));
                if (v.reads_kept)
                    check_read_zeroed(c, r, want);
                else
                    check_train(c, r, want);
            }
        }
    }
}

TEST_CASE("CUDA training: by default a dense-mode step sized after the statistics keeps z and u", "[cuda][train][quick]") {
    // TW_SAVE_DENSE_AUTO (the default): the saved state's size follows the statistics. A fresh
    // FFN answers with the compact state; after a step that put it in dense mode the answer has
    // room for z and u, and a step in a state of that size keeps them and its backward reads them
    // (zeroed after the forward, they zero every gradient). A size queried before the warm step
    // stays valid: its step recomputes, with the same results. After a sparse step the answer is
    // the compact size again.
    for (const bool gated : {true, false}) {
        TrainCase base;
        base.gated = gated;
        base.h = 601;
        REQUIRE(base.save_dense == TW_SAVE_DENSE_AUTO);
        const DenseModeSteps steps = dense_mode_steps(base);
        const TrainCase &c = steps.c;
        const TrainData &warm = steps.warm, &data = steps.data;
        const size_t kept = kept_z_u_bytes(c);
        DYNAMIC_SECTION((gated ? "gated" : "plain")) {
            const TrainExpected want = expected_train(c, data);
            SECTION("sized after the dense step: kept, and read") {
                const TrainResult r = run_train(c, data, kBackend, TrainRun().warmed_with(&warm.x).sized_after_warm());
                CHECK(r.saved_bytes == r.saved_bytes_before + kept);
                check_train(c, r, want);
                const TrainResult zeroed =
                    run_train(c, data, kBackend, zeroing_kept(TrainRun().warmed_with(&warm.x).sized_after_warm(), kept));
                check_read_zeroed(c, zeroed, want);
            }
            SECTION("replayed") {
                check_train(c, run_train(c, data, kBackend,
                                         TrainRun().warmed_with(&warm.x).sized_after_warm().times(2).replayed(graph_replay)),
                            want);
            }
            SECTION("sized before the dense step: recomputed") {
                const TrainResult r = run_train(c, data, kBackend, TrainRun().warmed_with(&warm.x));
                CHECK(r.saved_bytes == r.saved_bytes_before);
                check_train(c, r, want);
            }
            SECTION("sized after a step with no active unit: compact") {
                const std::vector<float> none(static_cast<size_t>(c.m * c.d), 0.0f);
                const TrainResult r = run_train(c, data, kBackend, TrainRun().warmed_with(&none).sized_after_warm());
                CHECK(r.saved_bytes == r.saved_bytes_before);
                check_train(c, r, want);
            }
            SECTION("never, in the warm step's saved state") {
                TrainCase never = c;
                never.save_dense = TW_SAVE_DENSE_NEVER;
                check_train(never, run_train(never, data, kBackend, TrainRun().warmed_with(&warm.x)), want);
            }
            SECTION("never") {
                TrainCase never = c;
                never.save_dense = TW_SAVE_DENSE_NEVER;
                const TrainResult r = run_train(never, data, kBackend, TrainRun().warmed_with(&warm.x).sized_after_warm());
                CHECK(r.saved_bytes == r.saved_bytes_before);
                check_train(never, r, want);
            }
        }
    }
}

TEST_CASE("CUDA training: profiles, types and modes against the reference", "[cuda][train][quick]") {
    for (tt::Profile profile : {tt::Profile::Uniform, tt::Profile::Heavy, tt::Profile::Llm})
        for (twDataType_t type : {TW_R_16BF, TW_R_16F, TW_R_32F})
            for (twComputeMode_t mode : {TW_COMPUTE_DEFAULT, TW_COMPUTE_HIGHEST_PRECISION})
                for (bool gated : {true, false}) {
                    if (type == TW_R_32F && mode == TW_COMPUTE_HIGHEST_PRECISION) continue;  // the same computation
                    TrainCase c;
                    c.profile = profile;
                    c.type = type;
                    c.mode = mode;
                    c.gated = gated;
                    c.m = 300;
                    c.d = 128;
                    c.h = 1000;
                    DYNAMIC_SECTION(tt::profile_name(profile) << " type " << type << " mode " << mode << (gated ? " gated" : " plain")) {
                        check_train_case(c);
                    }
                }
}

TEST_CASE("CUDA training: units active on most tokens (the hot units' token groups)", "[cuda][train]") {
    // backward_hot_units sums the units with more than max(256, M / 32) slots (token groups, a
    // cluster of blocks a unit on sm_90) beside the other units' kernel; D = 600 gives it two
    // column slices, 66 hot units make its 64 clusters stride over the list. A unit's gate row
    // negated fires for ~all tokens instead of ~29/H (twblas::testing::make_units_hot).
    struct Shape {
        int64_t m, d, h, hot;
    };
    for (const Shape s : {Shape{700, 600, 1000, 5}, Shape{1300, 40, 4096, 66}})
        for (bool gated : {true, false}) {
            TrainCase c;
            c.m = s.m;
            c.d = s.d;
            c.h = s.h;
            c.gated = gated;
            TrainData data = make_data(c);
            tt::make_units_hot(gated ? data.wg : data.wu, s.h, s.d, s.hot);
            DYNAMIC_SECTION(describe(c) << " hot units " << s.hot) {
                const TrainExpected want = expected_train(c, data);
                const TrainResult got = run_train(c, data, kBackend);
                // the hot units fire, and their slots are in sparse rows (no TwELL tile over
                // capacity; a few rows past the long-row limit may go to the dense path)
                REQUIRE(want.r.stats.overflowRows == 0);
                REQUIRE(want.r.stats.meanRowNnz > 0.9 * static_cast<double>(s.hot));
                REQUIRE(want.r.stats.meanRowNnz < static_cast<double>(std::max<int64_t>(64, s.h / 32)));
                check_train(c, got, want);
            }
        }
}

TEST_CASE("CUDA training: more than 65536 tokens (token ids are not 16-bit)", "[cuda][train]") {
    TrainCase c;
    c.m = 70001;
    c.d = 16;
    c.h = 128;
    c.k = 8;
    c.integers = true;
    c.heavy_every = 997;
    c.l1 = static_cast<float>(c.m);
    check_train_case(c);
}

TEST_CASE("CUDA training: a replayed CUDA graph gives the deterministic bits", "[cuda][train]") {
    // (the same steps without a graph: "training: deterministic mode ..." in test_ffn_backward.cpp)
    TrainCase c;
    c.profile = tt::Profile::Heavy;
    c.m = 700;
    c.d = 256;
    c.h = 1024;
    c.deterministic = 1;
    const TrainData data = make_data(c);
    const TrainResult a = run_train(c, data, TW_BACKEND_CUDA);
    const TrainResult g = run_train(c, data, TW_BACKEND_CUDA, TrainRun().times(2).replayed(graph_replay));
    REQUIRE(a.bits == g.bits);
}

TEST_CASE("CUDA training: gradients agree with finite differences of the GPU forward", "[cuda][train]") {
    // fp32 + HIGHEST_PRECISION on the GPU: L = sum(dY * y) + l1 * mean_t sum |h| from the GPU's
    // forward and twFfnGetStats, central differences (step 1e-3, fp64 loss) of each element of X
    // and of the weights; steps that cross a kink of ReLU or |h| (second difference far above a
    // quadratic's) are skipped. Tolerance 2e-3 absolute on gradients of order 1.
    for (bool gated : {true, false}) {
        DYNAMIC_SECTION((gated ? "gated" : "plain")) {
            TrainCase c;
            c.m = 3, c.d = 8, c.h = 12, c.gated = gated, c.type = TW_R_32F, c.mode = TW_COMPUTE_HIGHEST_PRECISION;
            c.l1 = 0.3f;
            std::mt19937_64 rng(gated ? 3 : 4);
            std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
            TrainData data;
            for (auto *v : {&data.x, &data.dy}) v->resize(static_cast<size_t>(c.m * c.d));
            for (auto *v : {&data.wg, &data.wu, &data.wd}) v->resize(static_cast<size_t>(c.h * c.d));
            if (!gated) data.wg.clear();
            for (auto *v : {&data.x, &data.wg, &data.wu, &data.wd, &data.dy})
                for (float &e : *v) e = uni(rng);
            const TrainResult grads = run_train(c, data, TW_BACKEND_CUDA);

            Handle h(TW_BACKEND_CUDA);
            auto loss = [&](const TrainData &p) {
                Dense x(c.m, c.d, TW_R_32F), y(c.m, c.d, TW_R_32F), wu(c.h, c.d, TW_R_32F), wd(c.h, c.d, TW_R_32F);
                std::unique_ptr<Dense> wg;
                x.fill(p.x), wu.fill(p.wu), wd.fill(p.wd);
                if (gated) wg = std::make_unique<Dense>(c.h, c.d, TW_R_32F), wg->fill(p.wg);
                Buffers buf(TW_BACKEND_CUDA);
                const twDnMatDescr_t X = buf.input(x), Y = buf.output(y), WU = buf.input(wu), WD = buf.input(wd);
                twFfnDescr_t ffn = nullptr;
                TW_REQUIRE_OK(h, twCreateFfn(h, &ffn, gated ? TW_FFN_GATED_RELU : TW_FFN_RELU, wg ? buf.input(*wg) : nullptr, WU, WD));
                const int32_t mode = TW_COMPUTE_HIGHEST_PRECISION;
                TW_REQUIRE_OK(h, twFfnSetAttribute(ffn, TW_FFN_ATTR_COMPUTE_MODE, &mode, sizeof mode));
                size_t bytes = 0;
                TW_REQUIRE_OK(h, twSpGEMMFused_bufferSize(h, ffn, X, Y, &bytes));
                TW_REQUIRE_OK(h, twSpGEMMFused(h, ffn, X, Y, nullptr, buf.memory(bytes)));
                twFfnStats_t st{};
                TW_REQUIRE_OK(h, twFfnGetStats(h, ffn, &st));
                buf.fetch();
                twDestroyFfn(ffn);
                double l = c.l1 * st.l1;
                for (int64_t t = 0; t < c.m; ++t)
                    for (int64_t k = 0; k < c.d; ++k) l += double(p.dy[static_cast<size_t>(t * c.d + k)]) * y.get(t, k);
                return l;
            };
            const double step = 1e-3;
            int checked = 0;
            auto probe = [&](std::vector<float> TrainData::*member, const std::vector<double> &grad, const char *name) {
                for (size_t i = 0; i < grad.size(); ++i) {
                    TrainData plus = data, minus = data;
                    (plus.*member)[i] += static_cast<float>(step);
                    (minus.*member)[i] -= static_cast<float>(step);
                    const double lp = loss(plus), lm = loss(minus), l0 = loss(data);
                    if (std::fabs(lp - 2 * l0 + lm) > 1e-5) continue;  // a kink inside the step
                    const double fd = (lp - lm) / (2 * step);
                    INFO(name << "[" << i << "]: finite difference " << fd << ", gradient " << grad[i]);
                    CHECK(std::fabs(fd - grad[i]) < 2e-3);
                    ++checked;
                }
            };
            probe(&TrainData::x, grads.dx, "dX");
            if (gated) probe(&TrainData::wg, grads.dwg, "dWgate");
            probe(&TrainData::wu, grads.dwu, "dWup");
            probe(&TrainData::wd, grads.dwd, "dWdown");
            CHECK(checked > 100);  // most parameters are away from a kink
        }
    }
}

TEST_CASE("CUDA training: a corrupted saved state never faults the backward", "[cuda][train][errors]") {
    // the CUDA backward cannot return a status that depends on the saved bytes without a sync:
    // every count and unit id it reads is clamped or skipped instead (gpu-check runs this case
    // under compute-sanitizer memcheck, which reports any out-of-bounds access)
    TrainCase c;
    c.m = 96;
    c.d = 64;
    c.h = 300;
    const TrainData data = make_data(c);
    Handle h(TW_BACKEND_CUDA);
    Buffers buf(TW_BACKEND_CUDA);
    Dense x(c.m, c.d, c.type), y(c.m, c.d, c.type), dy(c.m, c.d, c.type), dx(c.m, c.d, c.type);
    Dense wg(c.h, c.d, c.type), wu(c.h, c.d, c.type), wd(c.h, c.d, c.type);
    Dense dwg(c.h, c.d, c.type), dwu(c.h, c.d, c.type), dwd(c.h, c.d, c.type);
    x.fill(data.x), dy.fill(data.dy), wg.fill(data.wg), wu.fill(data.wu), wd.fill(data.wd);
    const twDnMatDescr_t X = buf.input(x), Y = buf.output(y), DY = buf.input(dy), DX = buf.output(dx);
    const twDnMatDescr_t DWG = buf.output(dwg), DWU = buf.output(dwu), DWD = buf.output(dwd);
    twFfnDescr_t ffn = nullptr;
    TW_REQUIRE_OK(h, twCreateFfn(h, &ffn, TW_FFN_GATED_RELU, buf.input(wg), buf.input(wu), buf.input(wd)));
    size_t saved_bytes = 0, fw = 0, bw = 0;
    TW_REQUIRE_OK(h, twSpGEMMFusedSaved_bufferSize(h, ffn, c.m, &saved_bytes));
    TW_REQUIRE_OK(h, twSpGEMMFused_bufferSize(h, ffn, X, Y, &fw));
    TW_REQUIRE_OK(h, twSpGEMMFusedBackward_bufferSize(h, ffn, c.m, &bw));
    auto *saved = static_cast<uint8_t *>(buf.memory(saved_bytes));
    void *wsf = buf.memory(fw), *wsb = buf.memory(bw);
    const size_t header = 256;  // the saved state's header (SavedLayout::header) stays intact
    REQUIRE(saved_bytes > header);
    std::mt19937_64 rng(123);
    for (int trial = 0; trial < 4; ++trial) {
        TW_REQUIRE_OK(h, twSpGEMMFusedForwardTrain(h, ffn, X, Y, saved, wsf));
        if (trial == 0) {
            cuda_ok(cudaMemset(saved + header, 0xff, saved_bytes - header));
        } else {
            std::vector<uint8_t> noise(saved_bytes - header);
            for (uint8_t &b : noise) b = static_cast<uint8_t>(rng());
            if (trial == 2)  // mostly valid: a few counts and unit ids out of range
                for (size_t i = 0; i < noise.size(); ++i) noise[i] = i % 97 == 0 ? 0xff : 0;
            cuda_ok(cudaMemcpy(saved + header, noise.data(), noise.size(), cudaMemcpyHostToDevice));
        }
        INFO("trial " << trial);
        TW_REQUIRE_OK(h, twSpGEMMFusedBackward(h, ffn, X, saved, DY, 1e-3f, DX, DWG, DWU, DWD, wsb));
        cuda_ok(cudaDeviceSynchronize());
    }
    twDestroyFfn(ffn);
}
