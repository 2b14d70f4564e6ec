// twSpGEMMFused against the naive fp64 feed-forward: odd shapes, both kinds, both down-weight
// layouts, every generator profile (heavy rows and dead units included), hidden outputs,
// statistics and neuron counts.
#include "testing/problem.hpp"
#include "test_support.hpp"

using namespace twtest;
namespace tt = twblas::testing;

namespace {

/// An FFN built from a generated problem, in `type`, with Wd in `down_order`.
struct FfnFixture {
    Handle h;
    tt::FfnProblem p;
    twDataType_t type;
    int64_t m, d, hd;
    std::unique_ptr<Dense> wg, wu, wd, x, y;
    twFfnDescr_t ffn = nullptr;

    FfnFixture(const tt::ProblemSpec &spec, twDataType_t t, twOrder_t down_order = TW_ORDER_ROW)
        : p(tt::make_ffn_problem(spec)), type(t), m(spec.tokens), d(spec.model_dim), hd(spec.hidden_dim) {
        if (spec.gated) {
            wg = std::make_unique<Dense>(hd, d, t);
            wg->fill(p.w_gate);
        }
        wu = std::make_unique<Dense>(hd, d, t);
        wu->fill(p.w_up);
        wd = std::make_unique<Dense>(hd, d, t, down_order);
        wd->fill(p.w_down);
        x = std::make_unique<Dense>(m, d, t);
        x->fill(p.x);
        y = std::make_unique<Dense>(m, d, t);
        y->poison();
        TW_REQUIRE_OK(h, twCreateFfn(h, &ffn, spec.gated ? TW_FFN_GATED_RELU : TW_FFN_RELU, wg ? wg->d : nullptr, *wu, *wd));
    }
    ~FfnFixture() { twDestroyFfn(ffn); }

    void set_mode(twComputeMode_t mode) {
        const int32_t v = mode;
        TW_REQUIRE_OK(h, twFfnSetAttribute(ffn, TW_FFN_ATTR_COMPUTE_MODE, &v, sizeof v));
    }
    void run(twSpMatDescr_t hidden = nullptr) {
        size_t bytes = 0;
        TW_REQUIRE_OK(h, twSpGEMMFused_bufferSize(h, ffn, *x, *y, &bytes));
        std::vector<uint8_t> ws(bytes);
        TW_REQUIRE_OK(h, twSpGEMMFused(h, ffn, *x, *y, hidden, ws.data()));
    }
    /// The naive forward on the values the library actually sees (rounded to `type`).
    NaiveFfn naive(bool emulate_rounding) const {
        const twDataType_t t = type;
        return naive_ffn(m, d, hd, rounded(p.x, t), p.w_gate.empty() ? p.w_gate : rounded(p.w_gate, t), rounded(p.w_up, t),
                         rounded(p.w_down, t), emulate_rounding ? &t : nullptr);
    }
};

tt::ProblemSpec spec(int64_t m, int64_t d, int64_t h, tt::Profile profile, double k, bool gated, uint64_t seed) {
    tt::ProblemSpec s;
    s.tokens = m;
    s.model_dim = d;
    s.hidden_dim = h;
    s.profile = profile;
    s.active_units = k;
    s.gated = gated;
    s.seed = seed;
    return s;
}

}  // namespace

TEST_CASE("fused forward matches the naive fp64 FFN on odd shapes, all profiles", "[ffn][forward]") {
    // Bounds: HIGHEST_PRECISION in fp32 only accumulates in fp32 (<= D + k terms, random signs):
    // 1e-5 normwise is a wide margin. DEFAULT in bf16 rounds g, u, h and y; against a reference
    // that rounds the same intermediates, the difference is the final rounding (u = 2^-8, so
    // about 0.2 % normwise) plus rare 1-ulp flips of intermediates: bound 4u = 1.6 %.
    const int64_t tokens[] = {0, 1, 7, 333};
    uint64_t seed = 40;
    for (int64_t m : tokens)
        for (tt::Profile profile : {tt::Profile::Uniform, tt::Profile::Heavy, tt::Profile::Llm})
            for (bool gated : {true, false}) {
                if (m < 333 && profile != tt::Profile::Uniform) continue;
                DYNAMIC_SECTION("M " << m << " " << tt::profile_name(profile) << (gated ? " gated" : " plain")) {
                    const auto s = spec(m, 96, 600, profile, 12, gated, ++seed);  // H = 600: 3 tiles, last partial
                    {
                        FfnFixture f(s, TW_R_32F);
                        f.set_mode(TW_COMPUTE_HIGHEST_PRECISION);
                        f.run();
                        const ErrorReport e = compare(f.y->to_double(), f.naive(false).y, f.d);
                        INFO(e.worst);
                        CHECK(e.rel < 1e-5);
                    }
                    {
                        FfnFixture f(s, TW_R_16BF, TW_ORDER_COL);
                        f.run();
                        const ErrorReport e = compare(f.y->to_double(), f.naive(true).y, f.d);
                        INFO(e.worst);
                        CHECK(e.rel < 4 * unit_roundoff(TW_R_16BF));
                    }
                }
            }
}

TEST_CASE("both down-weight layouts give identical bits", "[ffn][forward]") {
    const auto s = spec(57, 64, 300, tt::Profile::Heavy, 20, true, 7);
    FfnFixture row(s, TW_R_16BF, TW_ORDER_ROW), col(s, TW_R_16BF, TW_ORDER_COL);
    row.run();
    col.run();
    CHECK(row.y->storage == col.y->storage);
}

TEST_CASE("small-integer inputs give exact outputs and an exact hidden pattern", "[ffn][forward]") {
    // Integers keep every product and sum exact in fp32 (all |values| < 2^24), so any indexing
    // error shows as a wrong value, not as rounding noise.
    Handle h;
    const int64_t m = 13, d = 10, hd = 260;
    std::mt19937_64 rng(5);
    std::uniform_int_distribution<int> small(-2, 2);
    std::vector<float> x(m * d), wg(hd * d), wu(hd * d), wd(hd * d);
    for (auto *v : {&x, &wg, &wu, &wd})
        for (float &e : *v) e = float(small(rng));
    for (int64_t j = 250; j < hd; ++j)  // dead units
        for (int64_t k = 0; k < d; ++k) wg[j * d + k] = 0.0f;
    Dense X(m, d, TW_R_32F), Y(m, d, TW_R_32F), WG(hd, d, TW_R_32F), WU(hd, d, TW_R_32F), WD(hd, d, TW_R_32F, TW_ORDER_COL);
    X.fill(x);
    WG.fill(wg);
    WU.fill(wu);
    WD.fill(wd);
    twFfnDescr_t ffn = nullptr;
    TW_REQUIRE_OK(h, twCreateFfn(h, &ffn, TW_FFN_GATED_RELU, WG, WU, WD));
    auto hidden = Sparse::hybrid(m, hd, 64, m, TW_R_32F);
    Y.poison();
    TW_REQUIRE_OK(h, twSpGEMMFused(h, ffn, X, Y, *hidden, nullptr));
    const NaiveFfn want = naive_ffn(m, d, hd, x, wg, wu, wd, nullptr);
    for (int64_t i = 0; i < m * d; ++i) REQUIRE(Y.get(i / d, i % d) == want.y[i]);
    Dense H(m, hd, TW_R_32F);
    TW_REQUIRE_OK(h, twSparseToDense(h, *hidden, H));
    int64_t active = 0, max_row = 0;
    for (int64_t t = 0; t < m; ++t) {
        int64_t row = 0;
        for (int64_t j = 0; j < hd; ++j) {
            REQUIRE(H.get(t, j) == want.hidden[t * hd + j]);
            row += want.z[t * hd + j] > 0;
        }
        active += row;
        max_row = std::max(max_row, row);
    }
    twFfnStats_t st;
    TW_REQUIRE_OK(h, twFfnGetStats(h, ffn, &st));
    CHECK(st.tokens == m);
    CHECK(st.meanRowNnz == Approx(double(active) / m));
    CHECK(st.maxRowNnz == max_row);
    double l1 = 0;
    for (double v : want.hidden) l1 += std::fabs(v);
    CHECK(st.l1 == Approx(l1 / m));
    std::vector<int64_t> counts(hd, -1);
    TW_REQUIRE_OK(h, twFfnGetNeuronCounts(h, ffn, counts.data()));
    for (int64_t j = 0; j < hd; ++j) {
        int64_t c = 0;
        for (int64_t t = 0; t < m; ++t) c += want.z[t * hd + j] > 0;
        REQUIRE(counts[j] == c);
    }
    for (int64_t j = 250; j < hd; ++j) CHECK(counts[j] == 0);  // the dead units are found
    TW_REQUIRE_OK(h, twFfnResetNeuronCounts(h, ffn));
    TW_REQUIRE_OK(h, twFfnGetNeuronCounts(h, ffn, counts.data()));
    CHECK(std::all_of(counts.begin(), counts.end(), [](int64_t c) { return c == 0; }));
    twDestroyFfn(ffn);
}

TEST_CASE("heavy rows are exact and flagged; the TwELL hidden output records them", "[ffn][forward][overflow]") {
    auto s = spec(200, 64, 1000, tt::Profile::Heavy, 10, true, 3);
    s.heavy_fraction = 0.02;
    FfnFixture f(s, TW_R_16BF);
    auto tw = Sparse::twell(200, 1000);
    f.run(*tw);
    const ErrorReport e = compare(f.y->to_double(), f.naive(true).y, f.d);
    INFO(e.worst);
    CHECK(e.rel < 4 * unit_roundoff(TW_R_16BF));
    // the heavy rows made on purpose overflow the 31 slots of a 256-column tile
    twFfnStats_t st;
    TW_REQUIRE_OK(f.h, twFfnGetStats(f.h, f.ffn, &st));
    const tt::ActivationStats measured = tt::measure_activations(f.p);
    CHECK(st.overflowRows == measured.rows_over_tile_capacity);
    CHECK(st.overflowRows >= 1);
    CHECK(st.maxRowNnz == measured.max_row_nnz);
    TW_REQUIRE_OK(f.h, twSpMatValidate(f.h, *tw));
    CHECK(info_of(f.h, *tw).overflowRows == st.overflowRows);
    // the same run into a hybrid with enough backup rows holds h exactly
    auto hy = Sparse::hybrid(200, 1000, 32, 200);
    f.run(*hy);
    Dense hd(200, 1000, TW_R_16BF);
    TW_REQUIRE_OK(f.h, twSparseToDense(f.h, *hy, hd));
    const NaiveFfn want = f.naive(true);
    int64_t mismatches = 0;
    for (int64_t i = 0; i < 200 * 1000; ++i) mismatches += (hd.get(i / 1000, i % 1000) != 0) != (want.hidden[i] != 0);
    CHECK(mismatches <= 2);  // pattern equal up to pre-activations within fp32 rounding of zero
}

TEST_CASE("M = 0 succeeds without touching pointers", "[ffn][forward]") {
    Handle h;
    Dense wg(40, 16, TW_R_16BF), wu(40, 16, TW_R_16BF), wd(40, 16, TW_R_16BF);
    twFfnDescr_t ffn = nullptr;
    TW_REQUIRE_OK(h, twCreateFfn(h, &ffn, TW_FFN_GATED_RELU, wg, wu, wd));
    twDnMatDescr_t x = nullptr, y = nullptr;
    TW_REQUIRE_OK(h, twCreateDnMat(&x, 0, 16, 16, nullptr, TW_R_16BF, TW_ORDER_ROW));
    TW_REQUIRE_OK(h, twCreateDnMat(&y, 0, 16, 16, nullptr, TW_R_16BF, TW_ORDER_ROW));
    size_t bytes = 1;
    TW_REQUIRE_OK(h, twSpGEMMFused_bufferSize(h, ffn, x, y, &bytes));
    CHECK(bytes == 0);
    TW_REQUIRE_OK(h, twSpGEMMFused(h, ffn, x, y, nullptr, nullptr));
    twDestroyDnMat(x);
    twDestroyDnMat(y);
    twDestroyFfn(ffn);
}

TEST_CASE("twFfnUpdateWeights makes later forwards use the new weights", "[ffn][forward]") {
    const auto s = spec(9, 32, 300, tt::Profile::Uniform, 20, true, 8);
    FfnFixture f(s, TW_R_32F);
    f.run();
    const auto before = f.y->storage;
    for (int64_t r = 0; r < f.hd; ++r)
        for (int64_t c = 0; c < f.d; ++c) f.wd->set(r, c, 2.0f * f.wd->get(r, c));
    f.run();
    CHECK(f.y->storage == before);  // the FFN holds its own copy
    TW_REQUIRE_OK(f.h, twFfnUpdateWeights(f.h, f.ffn, *f.wg, *f.wu, *f.wd));
    f.run();
    for (int64_t r = 0; r < f.m; ++r)
        for (int64_t c = 0; c < f.d; ++c)
            REQUIRE(f.y->get(r, c) == Approx(2.0 * twblas::load_value(before.data(), f.y->at(r, c), TW_R_32F)).margin(1e-6));
}

TEST_CASE("deterministic mode gives identical bits run to run and sorted TwELL entries", "[ffn][forward]") {
    const auto s = spec(150, 64, 700, tt::Profile::Llm, 20, true, 12);
    FfnFixture f(s, TW_R_16BF);
    const int32_t on = 1;
    TW_REQUIRE_OK(f.h, twFfnSetAttribute(f.ffn, TW_FFN_ATTR_DETERMINISTIC, &on, sizeof on));
    auto first = Sparse::twell(150, 700, TW_R_16BF, 256, 2), second = Sparse::twell(150, 700, TW_R_16BF, 256, 2);
    f.run(*first);
    const auto y1 = f.y->storage;
    f.y->poison();
    f.run(*second);
    CHECK(f.y->storage == y1);
    // ascending columns inside every block, and identical buffers (bar unused slots)
    const int64_t ld = 3 * 128;
    for (int64_t r = 0; r < 150; ++r)
        for (int64_t t = 0; t < 3; ++t) {
            const uint32_t *a = first->words() + r * ld + t * 128, *b = second->words() + r * ld + t * 128;
            REQUIRE(a[0] == b[0]);
            for (uint32_t i = 1; i <= (a[0] & 0xFFFF); ++i) {
                REQUIRE(a[i] == b[i]);
                if (i > 1) REQUIRE((a[i] & 0xFFFF) > (a[i - 1] & 0xFFFF));
            }
        }
}
