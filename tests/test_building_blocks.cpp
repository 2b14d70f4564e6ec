// twGemmToSparse and twSpMM against naive fp64 computations.
#include "test_support.hpp"

using namespace twtest;

TEST_CASE("twGemmToSparse writes act(alpha A B^T) exactly with small-integer inputs", "[building_blocks]") {
    Handle h;
    const int64_t m = 37, k = 19, n = 300;
    Dense a(m, k, TW_R_16BF), b(n, k, TW_R_16BF, TW_ORDER_COL, 1);
    std::mt19937_64 rng(3);
    std::uniform_int_distribution<int> small(-3, 3);
    for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < k; ++c) a.set(r, c, float(small(rng)));
    for (int64_t r = 0; r < n; ++r)
        for (int64_t c = 0; c < k; ++c) b.set(r, c, float(small(rng)));
    for (twConvertOp_t act : {TW_CONVERT_RELU, TW_CONVERT_PLAIN}) {
        auto hy = Sparse::hybrid(m, n, 64, m);
        size_t bytes = 0;
        TW_REQUIRE_OK(h, twGemmToSparse_bufferSize(h, a, b, *hy, act, &bytes));
        std::vector<uint8_t> ws(bytes);
        TW_REQUIRE_OK(h, twGemmToSparse(h, 0.5f, a, b, *hy, act, ws.data()));
        TW_REQUIRE_OK(h, twSpMatValidate(h, *hy));
        Dense c(m, n, TW_R_16BF);
        c.poison();
        TW_REQUIRE_OK(h, twSparseToDense(h, *hy, c));
        for (int64_t r = 0; r < m; ++r)
            for (int64_t j = 0; j < n; ++j) {
                double z = 0;
                for (int64_t q = 0; q < k; ++q) z += double(a.get(r, q)) * b.get(j, q);
                z *= 0.5;  // exact in bf16: |z| <= 0.5 * 19 * 9, a multiple of 0.5
                const double want = act == TW_CONVERT_RELU ? std::max(z, 0.0) : z;
                REQUIRE(c.get(r, j) == want);
            }
    }
}

TEST_CASE("twGemmToSparse records TwELL overflow rows", "[building_blocks]") {
    Handle h;
    const int64_t m = 5, k = 4, n = 256;
    Dense a(m, k, TW_R_32F), b(n, k, TW_R_32F);
    for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < k; ++c) a.set(r, c, r == 2 ? 1.0f : (c == 0 ? 1.0f : 0.0f));
    for (int64_t r = 0; r < n; ++r)
        for (int64_t c = 0; c < k; ++c) b.set(r, c, c == 0 ? (r < 10 ? 1.0f : -1.0f) : 1.0f);
    // rows != 2: 10 positives; row 2: all 256 positive (-1 + 3 > 0 too)
    Dense a16(m, k, TW_R_16BF), b16(n, k, TW_R_16BF);
    for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < k; ++c) a16.set(r, c, a.get(r, c));
    for (int64_t r = 0; r < n; ++r)
        for (int64_t c = 0; c < k; ++c) b16.set(r, c, b.get(r, c));
    auto tw = Sparse::twell(m, n);
    TW_REQUIRE_OK(h, twGemmToSparse(h, 1.0f, a16, b16, *tw, TW_CONVERT_RELU, nullptr));
    TW_REQUIRE_OK(h, twSpMatValidate(h, *tw));
    const twSpMatInfo_t info = info_of(h, *tw);
    CHECK(info.overflowRows == 1);
    CHECK(tw->words()[m * 32 + 1] == 2u);  // the overflow record names row 2
}

TEST_CASE("twSpMM computes alpha S W + beta Y for TwELL and hybrid S", "[building_blocks]") {
    Handle h;
    const int64_t m = 45, k = 300, n = 33;
    Dense s_dense(m, k, TW_R_16BF);
    std::mt19937_64 rng(11);
    std::uniform_real_distribution<double> u01(0, 1);
    std::normal_distribution<float> n01;
    for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < k; ++c) s_dense.set(r, c, u01(rng) < (r == 4 ? 0.3 : 0.03) ? n01(rng) : 0.0f);
    auto tw = Sparse::twell(m, k, TW_R_16BF, 256, 2);
    auto hy = Sparse::hybrid(m, k, 16, m);
    size_t bytes = 0;
    for (twSpMatDescr_t s : {tw->d, hy->d}) {
        TW_REQUIRE_OK(h, twDenseToSparse_bufferSize(h, s_dense, s, TW_CONVERT_PLAIN, &bytes));
        std::vector<uint8_t> ws(bytes);
        TW_REQUIRE_OK(h, twDenseToSparse_analysis(h, s_dense, s, TW_CONVERT_PLAIN, ws.data()));
        TW_REQUIRE_OK(h, twDenseToSparse_convert(h, s_dense, s, TW_CONVERT_PLAIN, ws.data()));
    }
    for (twOrder_t order : {TW_ORDER_ROW, TW_ORDER_COL})
        for (twSpMatDescr_t s : {tw->d, hy->d}) {
            Dense w(k, n, TW_R_32F, order, 2), y(m, n, TW_R_32F);
            for (int64_t r = 0; r < k; ++r)
                for (int64_t c = 0; c < n; ++c) w.set(r, c, n01(rng));
            for (int64_t r = 0; r < m; ++r)
                for (int64_t c = 0; c < n; ++c) y.set(r, c, n01(rng));
            std::vector<double> want(static_cast<size_t>(m * n));
            for (int64_t r = 0; r < m; ++r)
                for (int64_t c = 0; c < n; ++c) {
                    double acc = 0;
                    for (int64_t q = 0; q < k; ++q) acc += double(s_dense.get(r, q)) * w.get(q, c);
                    want[r * n + c] = 1.5 * acc - 0.5 * y.get(r, c);
                }
            TW_REQUIRE_OK(h, twSpMM_bufferSize(h, s, w, y, &bytes));
            std::vector<uint8_t> ws(bytes);
            TW_REQUIRE_OK(h, twSpMM(h, 1.5f, s, w, -0.5f, y, ws.data()));
            const ErrorReport e = compare(y.to_double(), want, n);
            INFO(e.worst);
            CHECK(e.rel < 1e-5);  // fp32 accumulation over <= 300 terms
        }
    // beta = 0 never reads Y (a NaN-poisoned Y gives a clean result)
    Dense w(k, n, TW_R_16BF), y(m, n, TW_R_16BF);
    for (int64_t r = 0; r < k; ++r)
        for (int64_t c = 0; c < n; ++c) w.set(r, c, 1.0f);
    y.poison();
    TW_REQUIRE_OK(h, twSpMM(h, 1.0f, *hy, w, 0.0f, y, nullptr));
    for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < n; ++c) REQUIRE_FALSE(std::isnan(y.get(r, c)));
}
