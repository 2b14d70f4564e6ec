// The CUDA training path (twSpGEMMFusedForwardTrain + twSpGEMMFusedBackward) against the CPU
// reference: bit-identical on small-integer data (sparse rows and recomputed heavy rows), within
// stated bounds on every profile, type and compute mode, odd shapes and layouts, more than 65536
// tokens, finite differences of the GPU forward, determinism and CUDA graph capture. Without a
// usable GPU every case says so and passes (CI machines have none).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "cuda_test_support.hpp"
#include "test_support.hpp"
#include "testing/problem.hpp"

using namespace twtest;
namespace tt = twblas::testing;

namespace {

struct TrainCase {
    int64_t m = 130, d = 64, h = 600;
    bool gated = true;
    twDataType_t type = TW_R_16BF;
    twComputeMode_t mode = TW_COMPUTE_DEFAULT;
    twOrder_t wd_order = TW_ORDER_ROW, x_order = TW_ORDER_ROW, grad_order = TW_ORDER_ROW;
    tt::Profile profile = tt::Profile::Uniform;
    double k = 29;
    bool integers = false;  // small integers: every sum exact, results bit-identical
    int heavy_every = 0;    // integers: every n-th token fires most units (recomputed rows)
    int32_t deterministic = 0;
    float l1 = 0.5f;
    uint64_t seed = 11;
};

struct TrainData {
    std::vector<float> x, wg, wu, wd, dy;
};

/// Small-integer data whose gate fires for a few percent of the units: column 0 of X is 1 and
/// column 0 of the gate weights a negative integer bias; tokens with X[t][0] = -1 fire most units.
TrainData integer_data(const TrainCase &c) {
    TrainData data;
    std::mt19937_64 rng(c.seed);
    std::uniform_int_distribution<int> small(-1, 1), bias(6, 14);
    auto fill = [&](std::vector<float> &v, int64_t rows) {
        v.resize(static_cast<size_t>(rows * c.d));
        for (float &f : v) f = static_cast<float>(small(rng));
    };
    fill(data.x, c.m);
    fill(data.wg, c.h);
    fill(data.wu, c.h);
    fill(data.wd, c.h);
    fill(data.dy, c.m);
    std::vector<float> &ws = c.gated ? data.wg : data.wu;
    for (int64_t t = 0; t < c.m; ++t)
        data.x[static_cast<size_t>(t * c.d)] = c.heavy_every && t % c.heavy_every == c.heavy_every - 1 ? -1.0f : 1.0f;
    for (int64_t j = 0; j < c.h; ++j) ws[static_cast<size_t>(j * c.d)] = -static_cast<float>(bias(rng));
    if (!c.gated) data.wg.clear();
    return data;
}

TrainData make_data(const TrainCase &c) {
    if (c.integers) return integer_data(c);
    tt::ProblemSpec spec;
    spec.tokens = c.m;
    spec.model_dim = c.d;
    spec.hidden_dim = c.h;
    spec.profile = c.profile;
    spec.active_units = c.k;
    spec.gated = c.gated;
    spec.seed = c.seed;
    spec.heavy_fraction = 0.03;
    const tt::FfnProblem p = tt::make_ffn_problem(spec);
    return {p.x, p.w_gate, p.w_up, p.w_down, random_normal(static_cast<size_t>(c.m * c.d), c.seed + 99)};
}

struct TrainResult {
    std::vector<double> y, dx, dwg, dwu, dwd;
    std::vector<uint32_t> bits;  // y, dx, dwg, dwu, dwd
    twFfnStats_t stats{};
};

void append_bits(std::vector<uint32_t> &bits, const Dense &m) {
    for (int64_t r = 0; r < m.rows; ++r)
        for (int64_t c = 0; c < m.cols; ++c) bits.push_back(m.bits(r, c));
}

/// A forward with saved state and a backward on `backend` (repeated `repeats` times, inside one
/// captured CUDA graph when `capture`); everything read back. `warm_x`: a first step on these
/// inputs, then its statistics (blocking), which steer the paths of the steps on data.x: the
/// share of rows on the dense path sets how many of them go through cuBLAS.
TrainResult run_train(const TrainCase &c, const TrainData &data, twBackend_t backend, int repeats = 1,
                      bool capture = false, const std::vector<float> *warm_x = nullptr) {
    const bool dev = backend == TW_BACKEND_CUDA;
    Handle h(backend);
    Dense x(c.m, c.d, c.type, c.x_order), y(c.m, c.d, c.type), dy(c.m, c.d, c.type), dx(c.m, c.d, c.type);
    Dense wu(c.h, c.d, c.type), wd(c.h, c.d, c.type, c.wd_order);
    Dense dwu(c.h, c.d, c.type, c.grad_order), dwd(c.h, c.d, c.type, c.grad_order);
    std::unique_ptr<Dense> wg, dwg;
    x.fill(data.x);
    dy.fill(data.dy);
    wu.fill(data.wu);
    wd.fill(data.wd);
    if (c.gated) {
        wg = std::make_unique<Dense>(c.h, c.d, c.type);
        wg->fill(data.wg);
        dwg = std::make_unique<Dense>(c.h, c.d, c.type, c.grad_order);
        dwg->poison();
    }
    for (Dense *o : {&y, &dx, &dwu, &dwd}) o->poison();
    std::vector<std::unique_ptr<DeviceDense>> mirrors;
    auto on = [&](Dense &m) -> twDnMatDescr_t {
        if (!dev) return m;
        mirrors.push_back(std::make_unique<DeviceDense>(m));
        return *mirrors.back();
    };
    const twDnMatDescr_t X = on(x), Y = on(y), DY = on(dy), DX = on(dx), WU = on(wu), WD = on(wd), DWU = on(dwu),
                         DWD = on(dwd);
    const twDnMatDescr_t WG = wg ? on(*wg) : nullptr, DWG = dwg ? on(*dwg) : nullptr;
    twFfnDescr_t ffn = nullptr;
    TW_REQUIRE_OK(h, twCreateFfn(h, &ffn, c.gated ? TW_FFN_GATED_RELU : TW_FFN_RELU, WG, WU, WD));
    const int32_t mode = c.mode;
    TW_REQUIRE_OK(h, twFfnSetAttribute(ffn, TW_FFN_ATTR_COMPUTE_MODE, &mode, sizeof mode));
    TW_REQUIRE_OK(h, twFfnSetAttribute(ffn, TW_FFN_ATTR_DETERMINISTIC, &c.deterministic, sizeof c.deterministic));

    size_t saved_bytes = 0, fw = 0, bw = 0;
    TW_REQUIRE_OK(h, twSpGEMMFusedSaved_bufferSize(h, ffn, c.m, &saved_bytes));
    TW_REQUIRE_OK(h, twSpGEMMFused_bufferSize(h, ffn, X, Y, &fw));
    TW_REQUIRE_OK(h, twSpGEMMFusedBackward_bufferSize(h, ffn, c.m, &bw));
    std::unique_ptr<DeviceCopy> dsaved, dwsf, dwsb;
    std::vector<uint8_t> hsaved, hwsf, hwsb;
    void *saved = nullptr, *wsf = nullptr, *wsb = nullptr;
    if (dev) {
        dsaved = std::make_unique<DeviceCopy>(saved_bytes), saved = dsaved->ptr;
        dwsf = std::make_unique<DeviceCopy>(fw), wsf = dwsf->ptr;
        dwsb = std::make_unique<DeviceCopy>(bw), wsb = dwsb->ptr;
    } else {
        hsaved.assign(std::max<size_t>(saved_bytes, 1), 0xCD), saved = hsaved.data();
        hwsf.resize(std::max<size_t>(fw, 1)), wsf = hwsf.data();
        hwsb.resize(std::max<size_t>(bw, 1)), wsb = hwsb.data();
    }
    auto step = [&]() -> twStatus_t {
        twStatus_t st = twSpGEMMFusedForwardTrain(h, ffn, X, Y, saved, wsf);
        if (st != TW_STATUS_SUCCESS) return st;
        return twSpGEMMFusedBackward(h, ffn, X, saved, DY, c.l1, DX, DWG, DWU, DWD, wsb);
    };
    if (warm_x) {
        Dense xw(c.m, c.d, c.type, c.x_order);
        xw.fill(*warm_x);
        std::unique_ptr<DeviceDense> dxw;
        twDnMatDescr_t XW = xw;
        if (dev) dxw = std::make_unique<DeviceDense>(xw), XW = *dxw;
        TW_REQUIRE_OK(h, twSpGEMMFusedForwardTrain(h, ffn, XW, Y, saved, wsf));
        TW_REQUIRE_OK(h, twSpGEMMFusedBackward(h, ffn, XW, saved, DY, c.l1, DX, DWG, DWU, DWD, wsb));
        twFfnStats_t warm{};
        TW_REQUIRE_OK(h, twFfnGetStats(h, ffn, &warm));
    }
    if (capture) {
        replay_captured(h, repeats, step);
    } else {
        for (int i = 0; i < repeats; ++i) TW_REQUIRE_OK(h, step());
    }
    TrainResult r;
    TW_REQUIRE_OK(h, twFfnGetStats(h, ffn, &r.stats));
    if (dev) {
        cuda_ok(cudaDeviceSynchronize());
        for (auto &m : mirrors) m->fetch();
    }
    twDestroyFfn(ffn);
    r.y = y.to_double();
    r.dx = dx.to_double();
    if (dwg) r.dwg = dwg->to_double();
    r.dwu = dwu.to_double();
    r.dwd = dwd.to_double();
    for (const Dense *m : {&y, &dx, dwg.get(), &dwu, &dwd})
        if (m) append_bits(r.bits, *m);
    return r;
}

/// Normwise bounds. y as in the inference tests (8 u). The gradients round dh, dz and du to the
/// value type in DEFAULT mode; GPU and CPU sum in different orders, so a rounding can land one
/// ulp apart (u relative on that term): 16 u normwise. fp32: summation order only.
double bound(const TrainCase &c, bool gradient) {
    if (c.type == TW_R_32F || (c.mode == TW_COMPUTE_HIGHEST_PRECISION && !gradient)) return c.type == TW_R_32F ? 1e-4 : 8 * unit_roundoff(c.type);
    return (gradient ? 16 : 8) * unit_roundoff(c.type);
}

/// Tokens and units with a pre-activation within rounding of zero (|z| < 1e-5 |x| |w|, in fp64
/// on the rounded data): GPU and CPU sum z in different orders, so such a unit may fire on one
/// side only. Its h is then about 0 (Y and dWdown do not notice) but dz = dh u is not, so the
/// token's dX row and the unit's dWgate (dWup when plain) row may differ: those rows are left
/// out of the comparison, and there must be few of them.
struct Kinks {
    std::vector<char> token, unit;
    int64_t pairs = 0;
};
Kinks near_kinks(const TrainCase &c, const TrainData &data) {
    const std::vector<float> x = rounded(data.x, c.type), w = rounded(c.gated ? data.wg : data.wu, c.type);
    Kinks k{std::vector<char>(static_cast<size_t>(c.m), 0), std::vector<char>(static_cast<size_t>(c.h), 0), 0};
    std::vector<double> wn(static_cast<size_t>(c.h), 0.0);
    for (int64_t j = 0; j < c.h; ++j)
        for (int64_t q = 0; q < c.d; ++q) wn[j] += double(w[j * c.d + q]) * w[j * c.d + q];
    for (int64_t t = 0; t < c.m; ++t) {
        double xn = 0;
        for (int64_t q = 0; q < c.d; ++q) xn += double(x[t * c.d + q]) * x[t * c.d + q];
        for (int64_t j = 0; j < c.h; ++j) {
            double z = 0;
            for (int64_t q = 0; q < c.d; ++q) z += double(x[t * c.d + q]) * w[j * c.d + q];
            if (std::fabs(z) < 1e-5 * std::sqrt(xn * wn[j])) k.token[t] = k.unit[j] = 1, ++k.pairs;
        }
    }
    return k;
}

/// `v` (rows x cols, row-major) with the flagged rows set to zero.
std::vector<double> without_rows(std::vector<double> v, const std::vector<char> &rows, int64_t cols) {
    for (size_t r = 0; r < rows.size(); ++r)
        if (rows[r]) std::fill(v.begin() + static_cast<long>(r * cols), v.begin() + static_cast<long>((r + 1) * cols), 0.0);
    return v;
}

void check_against_reference(const TrainCase &c, const std::vector<float> *warm_x = nullptr) {
    const TrainData data = make_data(c);
    const TrainResult cpu = run_train(c, data, TW_BACKEND_CPU);
    const TrainResult gpu = run_train(c, data, TW_BACKEND_CUDA, 1, false, warm_x);
    INFO("M " << c.m << " D " << c.d << " H " << c.h << (c.gated ? " gated" : " plain") << " type " << c.type << " mode "
              << c.mode << " profile " << tt::profile_name(c.profile) << (c.integers ? " integers" : ""));
    CHECK(gpu.stats.tokens == cpu.stats.tokens);
    CHECK(gpu.stats.overflowRows == cpu.stats.overflowRows);
    if (c.integers) {
        CHECK(gpu.stats.meanRowNnz == cpu.stats.meanRowNnz);
        REQUIRE(gpu.bits == cpu.bits);
        return;
    }
    const Kinks kinks = near_kinks(c, data);
    INFO(kinks.pairs << " (token, unit) pairs within rounding of the ReLU kink");
    const auto flagged = [](const std::vector<char> &v) { return std::count(v.begin(), v.end(), 1); };
    CHECK(flagged(kinks.token) <= std::max<int64_t>(3, c.m / 4));  // most rows are compared
    CHECK(flagged(kinks.unit) <= std::max<int64_t>(3, c.h / 10));
    const std::vector<char> none;
    auto check = [&](const char *name, const std::vector<double> &got, const std::vector<double> &want, bool gradient,
                     const std::vector<char> &skip) {
        for (double v : got) REQUIRE(std::isfinite(v));  // every element written (outputs poisoned with NaN)
        const ErrorReport e = skip.empty() ? compare(got, want, c.d)
                                           : compare(without_rows(got, skip, c.d), without_rows(want, skip, c.d), c.d);
        INFO(name << ": relative error " << e.rel << ", worst " << e.worst);
        CHECK(e.rel <= bound(c, gradient));
    };
    check("Y", gpu.y, cpu.y, false, none);
    check("dX", gpu.dx, cpu.dx, true, kinks.token);
    if (c.gated) check("dWgate", gpu.dwg, cpu.dwg, true, kinks.unit);
    check("dWup", gpu.dwu, cpu.dwu, true, c.gated ? none : kinks.unit);
    check("dWdown", gpu.dwd, cpu.dwd, true, none);
}

}  // namespace

TEST_CASE("CUDA training: small-integer data give bit-identical gradients", "[cuda][train]") {
    for (bool gated : {true, false})
        for (int64_t m : {1, 7, 130})
            for (int heavy : {0, 5}) {
                TrainCase c;
                c.integers = true;
                c.gated = gated;
                c.m = m;
                c.heavy_every = heavy;
                c.l1 = static_cast<float>(m);  // l1Coeff / M = 1: integer shifts of dh
                DYNAMIC_SECTION((gated ? "gated" : "plain") << " M " << m << (heavy ? " with recomputed rows" : "")) {
                    check_against_reference(c);
                }
            }
}

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
                check_against_reference(c, &warm.x);
            }
        }
    }
}

TEST_CASE("CUDA training: profiles, types and modes against the reference", "[cuda][train]") {
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
                        check_against_reference(c);
                    }
                }
}

TEST_CASE("CUDA training: odd shapes and layouts", "[cuda][train]") {
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
                check_against_reference(c);
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
    check_against_reference(c);
}

TEST_CASE("CUDA training: deterministic bits, also inside a replayed CUDA graph", "[cuda][train]") {
    // bits are promised for one path: deterministic mode never changes path (no cuBLAS capacity
    // from earlier statistics); without it, a step's path follows the previous step's statistics
    TrainCase c;
    c.profile = tt::Profile::Heavy;
    c.m = 700;
    c.d = 256;
    c.h = 1024;
    c.deterministic = 1;
    const TrainData data = make_data(c);
    const TrainResult a = run_train(c, data, TW_BACKEND_CUDA);
    const TrainResult b = run_train(c, data, TW_BACKEND_CUDA, 3);
    const TrainResult g = run_train(c, data, TW_BACKEND_CUDA, 2, true);
    REQUIRE(a.bits == b.bits);
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
                DeviceDense X(x), Y(y), WU(wu), WD(wd);
                std::unique_ptr<DeviceDense> WG;
                if (wg) WG = std::make_unique<DeviceDense>(*wg);
                twFfnDescr_t ffn = nullptr;
                TW_REQUIRE_OK(h, twCreateFfn(h, &ffn, gated ? TW_FFN_GATED_RELU : TW_FFN_RELU, WG ? WG->d : nullptr, WU, WD));
                const int32_t mode = TW_COMPUTE_HIGHEST_PRECISION;
                TW_REQUIRE_OK(h, twFfnSetAttribute(ffn, TW_FFN_ATTR_COMPUTE_MODE, &mode, sizeof mode));
                size_t bytes = 0;
                TW_REQUIRE_OK(h, twSpGEMMFused_bufferSize(h, ffn, X, Y, &bytes));
                DeviceCopy ws(bytes);
                TW_REQUIRE_OK(h, twSpGEMMFused(h, ffn, X, Y, nullptr, ws.ptr));
                twFfnStats_t st{};
                TW_REQUIRE_OK(h, twFfnGetStats(h, ffn, &st));
                Y.fetch();
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

TEST_CASE("CUDA training: M = 0 gives zero weight gradients", "[cuda][train]") {
    TrainCase c;
    c.m = 0;
    const TrainData data = make_data(c);
    const TrainResult r = run_train(c, data, TW_BACKEND_CUDA);
    CHECK(r.stats.tokens == 0);
    for (double v : r.dwd) REQUIRE(v == 0.0);
    for (double v : r.dwg) REQUIRE(v == 0.0);
}
