// The building blocks (twGemmToSparse, twDenseToSparse, twSpMM), compiled for both backends
// (tests/CMakeLists.txt): into test_building_blocks (the CPU reference) and, with
// TWTEST_BACKEND_CUDA, into test_cuda_backend. The shared cases run on the program's backend
// with small-integer data, exact everywhere, against its oracle: the naive fp64 computation on
// the CPU, the CPU reference (values and counts bit for bit) on CUDA. Then the cases of the CPU
// reference alone: a hand-built TwELL overflow record, twSpMM on real values against naive fp64.
#include <string>

#include "backend_support.hpp"
#include "test_support.hpp"

using namespace twtest;

namespace {

/// A container format: TwELL(tile, compression), or hybrid(ELL width) with a backup row for
/// every row.
struct Format {
    bool twell;
    int32_t width;  // TwELL tile; hybrid ELL width
    int32_t compression;
};

/// A filled container read back: its counts, twSpMatValidate's verdict and, when it holds
/// every row, its values (row-major bits).
struct SparseResult {
    twSpMatInfo_t info{};
    twStatus_t valid = TW_STATUS_SUCCESS;
    std::string message;
    std::vector<uint32_t> bits;
};

twSpMatDescr_t make_container(Buffers &buf, const Format &f, int64_t rows, int64_t cols, twDataType_t t) {
    return f.twell ? buf.twell(rows, cols, t, f.width, f.compression) : buf.hybrid(rows, cols, f.width, rows, t);
}

SparseResult read_back(twHandle_t h, Buffers &buf, twSpMatDescr_t s, twDataType_t t) {
    SparseResult r;
    r.info = info_of(h, s);
    r.valid = twSpMatValidate(h, s);
    if (r.valid != TW_STATUS_SUCCESS) r.message = twGetErrorMessage(h);
    twFormat_t format;
    REQUIRE(twSpMatGetFormat(s, &format) == TW_STATUS_SUCCESS);
    // a TwELL with an overflowing row does not hold it (the hybrids here back up every row)
    if (format == TW_FORMAT_HYBRID || r.info.overflowRows == 0) {
        const std::unique_ptr<Dense> dense = buf.to_dense(h, s, t);
        for (int64_t i = 0; i < dense->rows; ++i)
            for (int64_t j = 0; j < dense->cols; ++j) r.bits.push_back(dense->bits(i, j));
    }
    return r;
}

/// A container against its oracle: a CPU reference container (counts and values bit for bit),
/// or naive values (compared wherever the container holds every row).
void check_container(const SparseResult &got, const SparseResult &want, bool want_from_backend) {
    INFO(got.message);
    REQUIRE(got.valid == TW_STATUS_SUCCESS);
    if (want_from_backend) {
        CHECK(got.info.nnz == want.info.nnz);
        CHECK(got.info.overflowRows == want.info.overflowRows);
        CHECK(got.info.maxRowNnz == want.info.maxRowNnz);
        if (!want.bits.empty()) REQUIRE(got.bits == want.bits);
    } else if (!got.bits.empty()) {
        REQUIRE(got.bits == want.bits);
    }
}

/// act(alpha A B^T) into a container of `f`, on `backend`.
SparseResult gemm_to_sparse(twBackend_t backend, float alpha, const Dense &a, const Dense &b, const Format &f,
                            twConvertOp_t act) {
    Handle h(backend);
    Buffers buf(backend);
    const twDnMatDescr_t A = buf.input(a), B = buf.input(b);
    const twSpMatDescr_t c = make_container(buf, f, a.rows, b.rows, a.type);
    size_t bytes = 0;
    TW_REQUIRE_OK(h, twGemmToSparse_bufferSize(h, A, B, c, act, &bytes));
    TW_REQUIRE_OK(h, twGemmToSparse(h, alpha, A, B, c, act, buf.memory(bytes)));
    return read_back(h, buf, c, a.type);
}

/// The oracle of gemm_to_sparse on the backend under test.
SparseResult expected_gemm_to_sparse(float alpha, const Dense &a, const Dense &b, const Format &f, twConvertOp_t act,
                                     twDataType_t t = TW_R_16BF) {
    if (kOnCuda) return gemm_to_sparse(TW_BACKEND_CPU, alpha, a, b, f, act);
    SparseResult r;
    for (int64_t i = 0; i < a.rows; ++i)
        for (int64_t j = 0; j < b.rows; ++j) {
            double z = 0;
            for (int64_t q = 0; q < a.cols; ++q) z += double(a.get(i, q)) * b.get(j, q);
            z *= alpha;  // exact in bf16 here: small integers times 0.5
            r.bits.push_back(value_bits(t, static_cast<float>(act == TW_CONVERT_RELU ? std::max(z, 0.0) : z)));
        }
    return r;
}

/// S converted into a container of `f` (twDenseToSparse), then Y' = 2 S W - Y (twSpMM), on
/// `backend`.
struct ConvertAndMultiply {
    SparseResult s;
    std::vector<double> y;
};
ConvertAndMultiply convert_and_multiply(twBackend_t backend, const Dense &s, const Dense &w, const Dense &y0, const Format &f) {
    Handle h(backend);
    Buffers buf(backend);
    const twDnMatDescr_t S = buf.input(s), W = buf.input(w);
    const twSpMatDescr_t c = make_container(buf, f, s.rows, s.cols, s.type);
    size_t bytes = 0;
    TW_REQUIRE_OK(h, twDenseToSparse_bufferSize(h, S, c, TW_CONVERT_PLAIN, &bytes));
    void *ws = buf.memory(bytes);
    TW_REQUIRE_OK(h, twDenseToSparse_analysis(h, S, c, TW_CONVERT_PLAIN, ws));
    TW_REQUIRE_OK(h, twDenseToSparse_convert(h, S, c, TW_CONVERT_PLAIN, ws));
    Dense y(y0.rows, y0.cols, y0.type);
    for (int64_t i = 0; i < y.rows; ++i)
        for (int64_t j = 0; j < y.cols; ++j) y.set(i, j, y0.get(i, j));
    const twDnMatDescr_t Y = buf.output(y);
    TW_REQUIRE_OK(h, twSpMM_bufferSize(h, c, W, Y, &bytes));
    TW_REQUIRE_OK(h, twSpMM(h, 2.0f, c, W, -1.0f, Y, buf.memory(bytes)));
    buf.fetch();
    return {read_back(h, buf, c, s.type), y.to_double()};
}

/// The oracle of convert_and_multiply on the backend under test.
ConvertAndMultiply expected_convert_and_multiply(const Dense &s, const Dense &w, const Dense &y0, const Format &f) {
    if (kOnCuda) return convert_and_multiply(TW_BACKEND_CPU, s, w, y0, f);
    ConvertAndMultiply r;
    for (int64_t i = 0; i < s.rows; ++i)
        for (int64_t j = 0; j < s.cols; ++j) r.s.bits.push_back(s.bits(i, j));
    for (int64_t i = 0; i < s.rows; ++i)
        for (int64_t j = 0; j < w.cols; ++j) {
            double acc = 0;
            for (int64_t q = 0; q < s.cols; ++q) acc += double(s.get(i, q)) * w.get(q, j);
            r.y.push_back(2.0 * acc - y0.get(i, j));
        }
    return r;
}

void fill_integers(Dense &m, std::mt19937_64 &rng, int bound) {
    std::uniform_int_distribution<int> small(-bound, bound);
    for (int64_t r = 0; r < m.rows; ++r)
        for (int64_t c = 0; c < m.cols; ++c) m.set(r, c, static_cast<float>(small(rng)));
}

}  // namespace

TEST_CASE("building blocks: twGemmToSparse writes act(alpha A B^T) exactly with small-integer inputs",
          "[building_blocks]" TWTEST_BACKEND_TAG) {
    // |A B^T| <= 19 * 9 and 24 * 4: exact in fp32, and alpha = 0.5 keeps it exact in bf16
    struct Inputs {
        int64_t k, b_pad;
        int bound;
        uint64_t seed;
        std::vector<Format> formats;
    };
    const Inputs inputs[] = {{19, 1, 3, 3, {{false, 64, 0}}}, {24, 0, 2, 5, {{true, 64, 4}, {false, 16, 0}}}};
    const int64_t m = 37, n = 300;
    for (const Inputs &in : inputs) {
        std::mt19937_64 rng(in.seed);
        Dense a(m, in.k, TW_R_16BF), b(n, in.k, TW_R_16BF, TW_ORDER_COL, in.b_pad);
        fill_integers(a, rng, in.bound);
        fill_integers(b, rng, in.bound);
        for (const Format &f : in.formats)
            for (twConvertOp_t act : {TW_CONVERT_RELU, TW_CONVERT_PLAIN}) {
                INFO("K " << in.k << (f.twell ? " TwELL" : " hybrid") << " width " << f.width << " act " << act);
                const SparseResult got = gemm_to_sparse(kBackend, 0.5f, a, b, f, act);
                if (!f.twell) REQUIRE(!got.bits.empty());  // a hybrid with a backup row per row holds all
                check_container(got, expected_gemm_to_sparse(0.5f, a, b, f, act), kOnCuda);
            }
    }
}

TEST_CASE("building blocks: twGemmToSparse in the gate's shape (row-major 16-bit A and B, RELU, alpha 1)",
          "[building_blocks]" TWTEST_BACKEND_TAG) {
    // The operands the CUDA backend gives the masked gate GEMM on sm_90 (it writes the active
    // values only, into a workspace holding garbage): M = 300 and N = 600 off its 128 x 256
    // tiles, K = 40. Small integers and a bias column (a[:, 0] = 1, b[:, 0] = -8) leave a few
    // percent of C positive; `heavy` rows (a[r, 0] = -1) are mostly positive and overflow the
    // TwELL tiles (their count is compared) and the hybrid's ELL width (backed up, compared).
    const int64_t m = 300, n = 600, k = 40;
    for (twDataType_t t : {TW_R_16BF, TW_R_16F})
        for (bool heavy : {false, true}) {
            std::mt19937_64 rng(heavy ? 17 : 13);
            Dense a(m, k, t), b(n, k, t);
            fill_integers(a, rng, 1);
            fill_integers(b, rng, 1);
            for (int64_t r = 0; r < m; ++r) a.set(r, 0, heavy && r % 37 == 5 ? -1.0f : 1.0f);
            for (int64_t r = 0; r < n; ++r) b.set(r, 0, -8.0f);
            // TwELL tiles of 256, 64 and 128 columns: one, four and two to an output tile of the
            // GEMM, whose epilogue writes the TwELL blocks itself on sm_90
            for (const Format &f : {Format{true, 256, 4}, Format{true, 64, 8}, Format{true, 128, 2}, Format{false, 32, 0}}) {
                INFO((t == TW_R_16BF ? "bf16" : "fp16") << (heavy ? " heavy" : "") << (f.twell ? " TwELL " : " hybrid ")
                                                        << f.width << "/" << f.compression);
                const SparseResult got = gemm_to_sparse(kBackend, 1.0f, a, b, f, TW_CONVERT_RELU);
                const SparseResult want = expected_gemm_to_sparse(1.0f, a, b, f, TW_CONVERT_RELU, t);
                CHECK(got.info.nnz > 0);
                if (f.twell) CHECK((got.info.overflowRows > 0) == heavy);
                if (!f.twell || !heavy) REQUIRE(!got.bits.empty());
                check_container(got, want, kOnCuda);
            }
        }
}

TEST_CASE("building blocks: twDenseToSparse and twSpMM are exact on small-integer data",
          "[building_blocks]" TWTEST_BACKEND_TAG) {
    const int64_t m = 37, n = 300, cols = 50;
    std::mt19937_64 rng(5);
    std::uniform_int_distribution<int> small(-2, 2);
    std::bernoulli_distribution keep(0.05);
    Dense s(m, n, TW_R_16BF);
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) s.set(i, j, keep(rng) ? static_cast<float>(small(rng)) : 0.0f);
    Dense w(n, cols, TW_R_16BF), y(m, cols, TW_R_16BF);
    fill_integers(w, rng, 2);
    fill_integers(y, rng, 2);
    for (const Format &f : {Format{true, 256, 8}, Format{false, 8, 0}}) {
        INFO((f.twell ? "TwELL" : "hybrid"));
        const ConvertAndMultiply got = convert_and_multiply(kBackend, s, w, y, f);
        const ConvertAndMultiply want = expected_convert_and_multiply(s, w, y, f);
        REQUIRE(!got.s.bits.empty());  // no row over capacity: the container holds S
        check_container(got.s, want.s, kOnCuda);
        REQUIRE(got.y == want.y);  // integer data: exact
    }
}

// ---- the CPU reference alone ------------------------------------------------------------------
#if !defined(TWTEST_BACKEND_CUDA)

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

#endif  // !TWTEST_BACKEND_CUDA
