// twSpGEMMFusedForwardTrain + twSpGEMMFusedBackward against naive fp64 gradients (with the L1
// term), finite differences on a tiny case, heavy rows (recomputed in the backward), both kinds.
#include "testing/problem.hpp"
#include "test_support.hpp"

using namespace twtest;
namespace tt = twblas::testing;

namespace {

struct NaiveGrads {
    std::vector<double> dx, dwg, dwu, dwd;
};

/// fp64 gradients of L = sum(dY * y) + l1 * mean_t sum_j |h_tj|.
NaiveGrads naive_backward(int64_t m, int64_t d, int64_t hd, const std::vector<float> &x, const std::vector<float> &wg,
                          const std::vector<float> &wu, const std::vector<float> &wd, const std::vector<float> &dy,
                          double l1) {
    const bool gated = !wg.empty();
    const std::vector<float> &ws = gated ? wg : wu;
    NaiveGrads g{std::vector<double>(m * d, 0.0), std::vector<double>(gated ? hd * d : 0, 0.0),
                 std::vector<double>(hd * d, 0.0), std::vector<double>(hd * d, 0.0)};
    for (int64_t t = 0; t < m; ++t)
        for (int64_t j = 0; j < hd; ++j) {
            double z = 0, u = 0;
            for (int64_t k = 0; k < d; ++k) {
                z += double(x[t * d + k]) * ws[j * d + k];
                if (gated) u += double(x[t * d + k]) * wu[j * d + k];
            }
            if (!(z > 0)) continue;
            const double h = gated ? z * u : z;
            double dh = 0;
            for (int64_t k = 0; k < d; ++k) dh += double(dy[t * d + k]) * wd[j * d + k];
            dh += l1 / m * ((h > 0) - (h < 0));
            const double dz = gated ? dh * u : dh, du = gated ? dh * z : 0.0;
            for (int64_t k = 0; k < d; ++k) {
                g.dwd[j * d + k] += h * dy[t * d + k];
                if (gated) {
                    g.dwg[j * d + k] += dz * x[t * d + k];
                    g.dwu[j * d + k] += du * x[t * d + k];
                    g.dx[t * d + k] += dz * wg[j * d + k] + du * wu[j * d + k];
                } else {
                    g.dwu[j * d + k] += dz * x[t * d + k];
                    g.dx[t * d + k] += dz * wu[j * d + k];
                }
            }
        }
    return g;
}

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

TEST_CASE("heavy rows beyond the saved ELL width are recomputed exactly", "[ffn][backward][overflow]") {
    // k = 60 of H = 400 with 3 % heavy rows (a = 0.25): heavy rows have far more than the 128
    // saved entries, so the backward recomputes them from X.
    const tt::FfnProblem p = problem(100, 32, 400, tt::Profile::Heavy, 60, true, 77);
    REQUIRE(tt::measure_activations(p).max_row_nnz > 128);
    TrainFixture f(p, TW_R_32F, TW_COMPUTE_HIGHEST_PRECISION);
    f.run(0.0f);
    f.check_against_naive(0.0f, 1e-4);
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
