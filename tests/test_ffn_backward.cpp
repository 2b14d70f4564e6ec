// The training path (twSpGEMMFusedForwardTrain + twSpGEMMFusedBackward), compiled for both
// backends (tests/CMakeLists.txt): into test_ffn_backward (the CPU reference) and, with
// TWTEST_BACKEND_CUDA, into test_cuda_training. The shared cases run training steps on the
// program's backend against its oracle (training_support.hpp): the naive fp64 forward and
// gradients on the CPU, the CPU reference on CUDA. Small-integer data (exact, recomputed rows
// included), heavy rows beyond the saved ELL width, odd shapes and layouts, determinism, M = 0.
// Then the cases of the CPU reference alone: every profile against naive fp64 gradients with the
// L1 term, finite differences of the naive forward, a saved state from another problem.
#include "test_support.hpp"
#include "testing/problem.hpp"
#include "training_support.hpp"

using namespace twtest;
namespace tt = twblas::testing;

TEST_CASE("training: small-integer data give exact gradients, recomputed rows included", "[ffn][backward][train][quick]" TWTEST_BACKEND_TAG) {
    // Every sum is exact in fp32 (|values| < 2^24), so fp32 outputs are exact, and bf16 rounds
    // exact values: bit-identical on every backend (against the naive math, which does not
    // round: fp32 bit for bit, bf16 within the bounds of training_support.hpp).
    for (twDataType_t type : {TW_R_16BF, TW_R_32F})
        for (bool gated : {true, false})
            for (int64_t m : {1, 7, 130})
                for (int heavy : {0, 5}) {
                    TrainCase c;
                    c.integers = true;
                    c.type = type;
                    c.gated = gated;
                    c.m = m;
                    c.heavy_every = heavy;
                    c.l1 = static_cast<float>(m);  // l1Coeff / M = 1: integer shifts of dh
                    DYNAMIC_SECTION((type == TW_R_32F ? "fp32 " : "bf16 ") << (gated ? "gated" : "plain") << " M " << m
                                                                        << (heavy ? " with recomputed rows" : "")) {
                        check_train_case(c);
                    }
                }
}

TEST_CASE("training: heavy rows beyond the saved ELL width are recomputed exactly", "[ffn][backward][train][overflow][quick]" TWTEST_BACKEND_TAG) {
    // k = 60 of H = 400 with 3 % heavy rows (a = 0.25): heavy rows have far more than the 128
    // saved entries, so the backward recomputes them from X.
    TrainCase c;
    c.m = 100, c.d = 32, c.h = 400;
    c.profile = tt::Profile::Heavy;
    c.k = 60;
    c.seed = 77;
    c.type = TW_R_32F;
    c.mode = TW_COMPUTE_HIGHEST_PRECISION;
    c.wd_order = TW_ORDER_COL;
    c.l1 = 0.0f;
    REQUIRE(tt::measure_activations(tt::make_ffn_problem(problem_spec(c))).max_row_nnz > 128);
    check_train_case(c);
}

TEST_CASE("training: odd shapes and layouts", "[ffn][backward][train]" TWTEST_BACKEND_TAG) {
    struct Shape {
        int64_t m, d, h;
        twOrder_t wd, x, grad;
    };
    const Shape shapes[] = {{1, 8, 64, TW_ORDER_ROW, TW_ORDER_ROW, TW_ORDER_ROW},
                            {37, 100, 264, TW_ORDER_COL, TW_ORDER_ROW, TW_ORDER_COL},
                            {257, 264, 700, TW_ORDER_ROW, TW_ORDER_COL, TW_ORDER_ROW},
                            {65, 2100, 300, TW_ORDER_COL, TW_ORDER_ROW, TW_ORDER_ROW}};
    for (const Shape &s : shapes)
        for (bool gated : {true, false}) {
            TrainCase c;
            c.m = s.m, c.d = s.d, c.h = s.h, c.wd_order = s.wd, c.x_order = s.x, c.grad_order = s.grad;
            c.gated = gated;
            c.k = std::min<double>(29, static_cast<double>(s.h) / 8);
            c.profile = tt::Profile::Heavy;
            DYNAMIC_SECTION("M " << s.m << " D " << s.d << " H " << s.h << (gated ? " gated" : " plain")) {
                check_train_case(c);
            }
        }
}

TEST_CASE("training: deterministic mode gives identical bits run to run", "[ffn][backward][train][quick]" TWTEST_BACKEND_TAG) {
    // bits are promised for one path: deterministic mode never changes path (no cuBLAS capacity
    // from earlier statistics); without it, a step's path follows the previous step's statistics
    TrainCase c;
    c.profile = tt::Profile::Heavy;
    c.m = 700;
    c.d = 256;
    c.h = 1024;
    c.deterministic = 1;
    const TrainData data = make_data(c);
    const TrainResult a = run_train(c, data, kBackend);
    const TrainResult b = run_train(c, data, kBackend, TrainRun().times(3));
    REQUIRE(a.bits == b.bits);
}

TEST_CASE("training: M = 0 gives zero weight gradients", "[ffn][backward][train]" TWTEST_BACKEND_TAG) {
    TrainCase c;
    c.m = 0;
    const TrainData data = make_data(c);
    const TrainResult r = run_train(c, data, kBackend);
    CHECK(r.stats.tokens == 0);
    for (double v : r.dwd) REQUIRE(v == 0.0);
    for (double v : r.dwg) REQUIRE(v == 0.0);
}

TEST_CASE("training: the l1 output and the l1Coeff pointer give the bits of the stats and of the argument",
          "[ffn][backward][train][l1]" TWTEST_BACKEND_TAG) {
    // TW_FFN_ATTR_L1_OUTPUT and TW_FFN_ATTR_L1_COEFF_POINTER (the argument is NaN then: were it
    // read, the gradients would be NaN). Random data in deterministic mode, and small integers
    // with recomputed rows after a warm step (every sum exact: the bits are the same on any path,
    // the cuBLAS recompute of CUDA included).
    TrainCase random;
    random.profile = tt::Profile::Heavy;
    random.deterministic = 1;
    random.l1 = 0.75f;
    TrainCase integers;
    integers.integers = true;
    integers.heavy_every = 5;
    integers.m = 130;
    integers.l1 = 130.0f;
    for (const TrainCase &c : {random, integers}) {
        DYNAMIC_SECTION(describe(c)) {
            const TrainData data = make_data(c);
            TrainRun plain, pointers;
            plain.warmed_with(&data.x);
            pointers.warmed_with(&data.x).with_l1_pointers();
            const TrainResult a = run_train(c, data, kBackend, plain);
            const TrainResult b = run_train(c, data, kBackend, pointers);
            REQUIRE(b.stats.l1 > 0.0);
            CHECK(b.l1_output == static_cast<float>(b.stats.l1));
            REQUIRE(a.bits == b.bits);
        }
    }
}

TEST_CASE("inference: the l1 output holds the forward's l1; M = 0 leaves it", "[ffn][forward][l1]" TWTEST_BACKEND_TAG) {
    TrainCase c;
    c.profile = tt::Profile::Heavy;
    const TrainData data = make_data(c);
    Handle h(kBackend);
    Buffers buf(kBackend);
    Dense x(c.m, c.d, c.type), y(c.m, c.d, c.type), wg(c.h, c.d, c.type), wu(c.h, c.d, c.type), wd(c.h, c.d, c.type);
    Dense x0(0, c.d, c.type), y0(0, c.d, c.type);
    x.fill(data.x);
    wg.fill(data.wg);
    wu.fill(data.wu);
    wd.fill(data.wd);
    const twDnMatDescr_t X = buf.input(x), Y = buf.output(y), X0 = buf.input(x0), Y0 = buf.output(y0);
    twFfnDescr_t ffn = nullptr;
    TW_REQUIRE_OK(h, twCreateFfn(h, &ffn, TW_FFN_GATED_RELU, buf.input(wg), buf.input(wu), buf.input(wd)));
    size_t fw = 0;
    TW_REQUIRE_OK(h, twSpGEMMFused_bufferSize(h, ffn, X, Y, &fw));
    void *ws = buf.memory(fw), *out = buf.memory(sizeof(float));
    TW_REQUIRE_OK(h, twFfnSetAttribute(ffn, TW_FFN_ATTR_L1_OUTPUT, &out, sizeof out));
    TW_REQUIRE_OK(h, twSpGEMMFused(h, ffn, X, Y, nullptr, ws));
    twFfnStats_t stats{};
    TW_REQUIRE_OK(h, twFfnGetStats(h, ffn, &stats));
    const float l1 = buf.read<float>(out, 1)[0];
    REQUIRE(stats.l1 > 0.0);
    CHECK(l1 == static_cast<float>(stats.l1));
    buf.write(out, std::vector<float>{-1.0f});
    TW_REQUIRE_OK(h, twSpGEMMFused(h, ffn, X0, Y0, nullptr, nullptr));
    CHECK(buf.read<float>(out, 1)[0] == -1.0f);
    twDestroyFfn(ffn);
}

// ---- the CPU reference alone ------------------------------------------------------------------
#if !defined(TWTEST_BACKEND_CUDA)

namespace {

struct TrainFixture {
    Handle h;
    int64_t m, d, hd;
    bool gated;
    twDataType_t type;
    std::vector<float> x, wg, wu, wd, dy;
    std::unique_ptr<Dense> X, Y, WG, WU, WD, DY, DX, DWG, DWU, DWD;
    twFfnDescr_t ffn = nullptr;
    std::vector<uint8_t> saved;

    TrainFixture(const tt::FfnProblem &p, twDataType_t t, twComputeMode_t mode, twOrder_t grad_order = TW_ORDER_ROW)
        : m(p.spec.tokens), d(p.spec.model_dim), hd(p.spec.hidden_dim), gated(p.spec.gated), type(t),
          x(rounded(p.x, t)), wg(p.w_gate.empty() ? p.w_gate : rounded(p.w_gate, t)), wu(rounded(p.w_up, t)),
          wd(rounded(p.w_down, t)), dy(rounded(random_normal(m * d, p.spec.seed + 1000), t)) {
        X = std::make_unique<Dense>(m, d, t);
        X->fill(x);
        Y = std::make_unique<Dense>(m, d, t);
        DY = std::make_unique<Dense>(m, d, t);
        DY->fill(dy);
        if (gated) {
            WG = std::make_unique<Dense>(hd, d, t);
            WG->fill(wg);
            DWG = std::make_unique<Dense>(hd, d, t, grad_order);
            DWG->poison();
        }
        WU = std::make_unique<Dense>(hd, d, t);
        WU->fill(wu);
        WD = std::make_unique<Dense>(hd, d, t, TW_ORDER_COL);
        WD->fill(wd);
        DX = std::make_unique<Dense>(m, d, t);
        DWU = std::make_unique<Dense>(hd, d, t, grad_order);
        DWD = std::make_unique<Dense>(hd, d, t, grad_order);
        for (Dense *o : {DX.get(), DWU.get(), DWD.get()}) o->poison();
        TW_REQUIRE_OK(h, twCreateFfn(h, &ffn, gated ? TW_FFN_GATED_RELU : TW_FFN_RELU, WG ? WG->d : nullptr, *WU, *WD));
        const int32_t v = mode;
        TW_REQUIRE_OK(h, twFfnSetAttribute(ffn, TW_FFN_ATTR_COMPUTE_MODE, &v, sizeof v));
    }
    ~TrainFixture() { twDestroyFfn(ffn); }

    void run(float l1) {
        size_t bytes = 0, fw = 0, bw = 0;
        TW_REQUIRE_OK(h, twSpGEMMFusedSaved_bufferSize(h, ffn, m, &bytes));
        saved.assign(bytes, 0xCD);
        TW_REQUIRE_OK(h, twSpGEMMFused_bufferSize(h, ffn, *X, *Y, &fw));
        TW_REQUIRE_OK(h, twSpGEMMFusedBackward_bufferSize(h, ffn, m, &bw));
        std::vector<uint8_t> wsf(fw), wsb(bw);
        TW_REQUIRE_OK(h, twSpGEMMFusedForwardTrain(h, ffn, *X, *Y, saved.data(), wsf.data()));
        TW_REQUIRE_OK(h, twSpGEMMFusedBackward(h, ffn, *X, saved.data(), *DY, l1, *DX, DWG ? DWG->d : nullptr, *DWU, *DWD,
                                               wsb.data()));
    }

    void check_against_naive(float l1, double bound) {
        const NaiveGrads want = naive_backward(m, d, hd, x, wg, wu, wd, dy, l1);
        auto check = [&](const char *name, const Dense &got, const std::vector<double> &w, int64_t cols) {
            const ErrorReport e = compare(got.to_double(), w, cols);
            INFO(name << ": " << e.worst);
            CHECK(e.rel < bound);
        };
        check("dX", *DX, want.dx, d);
        if (gated) check("dWgate", *DWG, want.dwg, d);
        check("dWup", *DWU, want.dwu, d);
        check("dWdown", *DWD, want.dwd, d);
    }
};

tt::FfnProblem problem(int64_t m, int64_t d, int64_t hd, tt::Profile profile, double k, bool gated, uint64_t seed) {
    tt::ProblemSpec s;
    s.tokens = m;
    s.model_dim = d;
    s.hidden_dim = hd;
    s.profile = profile;
    s.active_units = k;
    s.gated = gated;
    s.seed = seed;
    s.heavy_fraction = 0.03;
    return tt::make_ffn_problem(s);
}

}  // namespace

TEST_CASE("backward matches naive fp64 gradients, L1 term included", "[ffn][backward]") {
    // fp32 + HIGHEST_PRECISION: fp32 accumulation only, bound 1e-4 (sums of up to M terms of
    // mixed sign). bf16 DEFAULT rounds dh, du, dz and every output: bound 8u = 3 % normwise,
    // against a reference without any rounding.
    uint64_t seed = 300;
    for (int64_t m : {1, 7, 333})
        for (tt::Profile profile : {tt::Profile::Uniform, tt::Profile::Heavy, tt::Profile::Llm})
            for (bool gated : {true, false}) {
                if (m < 333 && profile != tt::Profile::Uniform) continue;
                DYNAMIC_SECTION("M " << m << " " << tt::profile_name(profile) << (gated ? " gated" : " plain")) {
                    const tt::FfnProblem p = problem(m, 48, 520, profile, 10, gated, ++seed);
                    {
                        TrainFixture f(p, TW_R_32F, TW_COMPUTE_HIGHEST_PRECISION, (seed & 1) ? TW_ORDER_COL : TW_ORDER_ROW);
                        f.run(0.05f);
                        f.check_against_naive(0.05f, 1e-4);
                    }
                    {
                        TrainFixture f(p, TW_R_16BF, TW_COMPUTE_DEFAULT);
                        f.run(0.05f);
                        f.check_against_naive(0.05f, 8 * unit_roundoff(TW_R_16BF));
                    }
                }
            }
}

TEST_CASE("backward agrees with finite differences of the forward", "[ffn][backward]") {
    // Tiny fp32 case in HIGHEST_PRECISION: L(theta) = sum(dY * y) + l1 * mean_t sum |h|, central
    // differences (step 1e-3, loss in fp64) of a loss that is quadratic in each parameter away
    // from the kinks of ReLU and |h|, so the quotient is exact there; parameters whose step
    // crosses a kink show a second difference far above a quadratic's (~1e-6) and are skipped.
    // The library computes in fp32: tolerance 2e-3 absolute on gradients of order 1.
    for (bool gated : {true, false}) {
        DYNAMIC_SECTION((gated ? "gated" : "plain")) {
            const int64_t m = 3, d = 4, hd = 6;
            std::mt19937_64 rng(gated ? 1 : 2);
            std::uniform_real_distribution<float> u(-1.0f, 1.0f);
            std::vector<float> x(m * d), wg(gated ? hd * d : 0), wu(hd * d), wd(hd * d), dy(m * d);
            for (auto *v : {&x, &wg, &wu, &wd, &dy})
                for (float &e : *v) e = u(rng);
            const float l1 = 0.3f;
            auto loss = [&](const std::vector<float> &xx, const std::vector<float> &g, const std::vector<float> &up,
                            const std::vector<float> &dn) {
                const NaiveFfn f = naive_ffn(m, d, hd, xx, g, up, dn, nullptr);
                double L = 0, s1 = 0;
                for (int64_t i = 0; i < m * d; ++i) L += double(dy[i]) * f.y[i];
                for (double hv : f.hidden) s1 += std::fabs(hv);
                return L + l1 * s1 / m;
            };
            // analytic gradients from the library
            Handle h;
            Dense X(m, d, TW_R_32F), Y(m, d, TW_R_32F), DY(m, d, TW_R_32F), DX(m, d, TW_R_32F);
            Dense WG(hd, d, TW_R_32F), WU(hd, d, TW_R_32F), WD(hd, d, TW_R_32F), DWG(hd, d, TW_R_32F), DWU(hd, d, TW_R_32F),
                DWD(hd, d, TW_R_32F);
            X.fill(x);
            DY.fill(dy);
            if (gated) WG.fill(wg);
            WU.fill(wu);
            WD.fill(wd);
            twFfnDescr_t ffn = nullptr;
            TW_REQUIRE_OK(h, twCreateFfn(h, &ffn, gated ? TW_FFN_GATED_RELU : TW_FFN_RELU, gated ? WG.d : nullptr, WU, WD));
            const int32_t mode = TW_COMPUTE_HIGHEST_PRECISION;
            TW_REQUIRE_OK(h, twFfnSetAttribute(ffn, TW_FFN_ATTR_COMPUTE_MODE, &mode, sizeof mode));
            size_t bytes = 0;
            TW_REQUIRE_OK(h, twSpGEMMFusedSaved_bufferSize(h, ffn, m, &bytes));
            std::vector<uint8_t> saved(bytes);
            TW_REQUIRE_OK(h, twSpGEMMFusedForwardTrain(h, ffn, X, Y, saved.data(), nullptr));
            TW_REQUIRE_OK(h, twSpGEMMFusedBackward(h, ffn, X, saved.data(), DY, l1, DX, gated ? DWG.d : nullptr, DWU, DWD,
                                                   nullptr));
            twDestroyFfn(ffn);

            const double step = 1e-3;
            size_t checked = 0, total = 0;
            auto fd_check = [&](const char *name, std::vector<float> &param, const Dense &grad) {
                total += param.size();
                for (size_t i = 0; i < param.size(); ++i) {
                    const float keep = param[i];
                    param[i] = keep + float(step);
                    const double lp = loss(x, wg, wu, wd);
                    param[i] = keep - float(step);
                    const double lm = loss(x, wg, wu, wd);
                    param[i] = keep;
                    // skip parameters whose perturbation crosses a ReLU kink (the FD is then not a derivative)
                    const double l0 = loss(x, wg, wu, wd);
                    const double curvature = std::fabs(lp - 2 * l0 + lm);
                    if (curvature > 1e-4) continue;
                    ++checked;
                    const double fd = (lp - lm) / (2 * step);
                    INFO(name << "[" << i << "]: finite difference " << fd << ", backward " << grad.get(int64_t(i) / d, int64_t(i) % d));
                    CHECK(grad.get(int64_t(i) / d, int64_t(i) % d) == Approx(fd).margin(2e-3));
                }
            };
            fd_check("dX", x, DX);
            if (gated) fd_check("dWgate", wg, DWG);
            fd_check("dWup", wu, DWU);
            fd_check("dWdown", wd, DWD);
            CHECK(checked * 10 >= total * 8);  // kinks are rare: most parameters are checked
        }
    }
}

TEST_CASE("backward rejects a saved state from another problem", "[ffn][backward]") {
    const tt::FfnProblem p = problem(7, 16, 64, tt::Profile::Uniform, 8, true, 5);
    TrainFixture f(p, TW_R_32F, TW_COMPUTE_DEFAULT);
    std::vector<uint8_t> garbage(1 << 16, 0x11);
    const auto before = f.DX->storage;
    CHECK(twSpGEMMFusedBackward(f.h, f.ffn, *f.X, garbage.data(), *f.DY, 0.0f, *f.DX, *f.DWG, *f.DWU, *f.DWD, nullptr) ==
          TW_STATUS_INVALID_VALUE);
    CHECK(std::string(twGetErrorMessage(f.h)).find("saved") != std::string::npos);
    CHECK(f.DX->storage == before);
}

TEST_CASE("backward: an inactive unit adds exact zeros whatever its u, Wu row and Wd row hold",
          "[ffn][backward][nonfinite]") {
    // Units that never fire get non-finite Wu rows (so non-finite u) and Wd rows: dense IEEE math
    // would give 0 * Inf = NaN in dh, dX and the weight gradients; the sparse backward never
    // reads them, so the gradients match the naive ones (which skip inactive units) and the
    // units' gradient rows are exact zeros.
    const float inf = INFINITY, nan = NAN;
    for (bool gated : {true, false})
        for (twDataType_t type : {TW_R_32F, TW_R_16BF}) {
            DYNAMIC_SECTION((gated ? "gated " : "plain ") << (type == TW_R_32F ? "fp32" : "bf16")) {
                tt::FfnProblem p = problem(7, 48, 520, tt::Profile::Uniform, 10, gated, gated ? 61 : 62);
                const int64_t m = 7, d = 48, hd = 520;
                std::vector<float> &gate = gated ? p.w_gate : p.w_up;
                const NaiveFfn n = naive_ffn(m, d, hd, rounded(p.x, type), gated ? rounded(gate, type) : std::vector<float>(),
                                             rounded(p.w_up, type), rounded(p.w_down, type), nullptr);
                std::vector<int64_t> off;
                for (int64_t j = 0; j < hd && off.size() < 4; ++j) {
                    bool never = true;
                    for (int64_t t = 0; t < m && never; ++t) never = n.z[static_cast<size_t>(t * hd + j)] < -0.05;
                    if (never) off.push_back(j);
                }
                REQUIRE(off.size() == 4);
                auto set_row = [&](std::vector<float> &w, int64_t j, float a, float b) {
                    for (int64_t k = 0; k < d; ++k) w[static_cast<size_t>(j * d + k)] = k % 2 ? b : a;
                };
                set_row(p.w_down, off[0], nan, nan);
                set_row(p.w_down, off[1], inf, -inf);
                set_row(p.w_down, off[2], -inf, nan);
                set_row(p.w_down, off[3], nan, inf);
                set_row(gate, off[3], 0.0f, 0.0f);  // g = +0 exactly
                if (gated) {
                    set_row(p.w_up, off[0], inf, inf);
                    set_row(p.w_up, off[1], nan, nan);
                    set_row(p.w_up, off[2], -inf, inf);
                    set_row(p.w_up, off[3], inf, -inf);
                }
                const twComputeMode_t mode = type == TW_R_32F ? TW_COMPUTE_HIGHEST_PRECISION : TW_COMPUTE_DEFAULT;
                TrainFixture f(p, type, mode);
                f.run(0.05f);
                for (double v : f.DX->to_double()) REQUIRE(std::isfinite(v));
                f.check_against_naive(0.05f, type == TW_R_32F ? 1e-4 : 8 * unit_roundoff(type));
                for (int64_t j : off)
                    for (int64_t k = 0; k < d; ++k) {
                        INFO("unit " << j << ", column " << k);
                        REQUIRE(f.DWD->bits(j, k) == 0u);
                        REQUIRE(f.DWU->bits(j, k) == 0u);
                        if (gated) REQUIRE(f.DWG->bits(j, k) == 0u);
                    }
            }
        }
}

TEST_CASE("backward: a unit whose g is NaN propagates NaN", "[ffn][backward][nonfinite]") {
    for (bool gated : {true, false}) {
        DYNAMIC_SECTION((gated ? "gated" : "plain")) {
            tt::FfnProblem p = problem(7, 48, 520, tt::Profile::Uniform, 10, gated, 63);
            const int64_t j = 17, d = 48;
            (gated ? p.w_gate : p.w_up)[static_cast<size_t>(j * d + 5)] = NAN;  // g = NaN for every token
            TrainFixture f(p, TW_R_32F, TW_COMPUTE_HIGHEST_PRECISION);
            f.run(0.05f);
            for (int64_t k = 0; k < d; ++k) CHECK(std::isnan(f.DWD->get(j, k)));  // dWd_j = sum_t h_tj dY_t, h = NaN
            for (int64_t t = 0; t < f.m; ++t) CHECK(std::isnan(f.DX->get(t, 5)));  // through the NaN weight or du = dh g
        }
    }
}

#endif  // !TWTEST_BACKEND_CUDA
