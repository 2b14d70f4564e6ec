// Hostile arguments on the CPU backend: sizes that wrap size_t, overlapping inputs and outputs,
// misaligned pointers, the training calls with no tokens, and stale descriptors whose address a
// new object could take. Every failure must be TW_STATUS_INVALID_VALUE (NOT_INITIALIZED for
// stale objects) naming the argument, with the outputs untouched.
#include "test_support.hpp"

#include <cctype>
#include <cstring>
#include <set>

using namespace twtest;

namespace {

constexpr size_t kPoisonBytes = 12345;

std::string message(twHandle_t h = nullptr) { return twGetErrorMessage(h); }

/// `text` names `word` as a whole word.
bool names(const std::string &text, const std::string &word) {
    auto is_word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
    for (size_t p = text.find(word); p != std::string::npos; p = text.find(word, p + 1)) {
        const size_t e = p + word.size();
        if ((p == 0 || !is_word(text[p - 1])) && (e >= text.size() || !is_word(text[e]))) return true;
    }
    return false;
}

#define CHECK_FAILS(call, status, handle, word)                                            \
    do {                                                                                   \
        const twStatus_t st_ = (call);                                                     \
        const std::string msg_ = message(handle);                                          \
        INFO(#call << " -> " << twGetStatusName(st_) << ": " << msg_);                     \
        CHECK(st_ == (status));                                                            \
        CHECK(names(msg_, word));                                                          \
    } while (0)

/// 256-byte aligned bytes, filled with a pattern.
struct Bytes {
    std::vector<uint8_t> raw;
    uint8_t *p;
    size_t n;
    explicit Bytes(size_t bytes, uint8_t fill = 0xA5) : raw(bytes + 512, fill), n(bytes) {
        const uintptr_t a = reinterpret_cast<uintptr_t>(raw.data());
        p = raw.data() + (256 - a % 256) % 256;
    }
    std::vector<uint8_t> snapshot() const { return std::vector<uint8_t>(p, p + n); }
};

/// `p` rounded up to a multiple of 16.
template <class T>
T *align16(T *p) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    return reinterpret_cast<T *>((a + 15) & ~uintptr_t{15});
}

/// A small bf16 FFN (gated or plain) on random weights, H x D each.
struct SmallFfn {
    int64_t d, hd;
    Dense wg, wu, wd;
    twFfnDescr_t ffn = nullptr;
    SmallFfn(twHandle_t h, int64_t d_, int64_t h_, bool gated = true, twDataType_t t = TW_R_16BF)
        : d(d_), hd(h_), wg(h_, d_, t), wu(h_, d_, t), wd(h_, d_, t) {
        wg.fill(random_normal(static_cast<size_t>(hd * d), 11, 0.3f));
        wu.fill(random_normal(static_cast<size_t>(hd * d), 12, 0.3f));
        wd.fill(random_normal(static_cast<size_t>(hd * d), 13, 0.3f));
        TW_REQUIRE_OK(h, twCreateFfn(h, &ffn, gated ? TW_FFN_GATED_RELU : TW_FFN_RELU, gated ? wg.d : nullptr, wu, wd));
    }
    ~SmallFfn() { twDestroyFfn(ffn); }
    operator twFfnDescr_t() const { return ffn; }
};

/// The exact hybrid buffer size of formats.md in 128-bit arithmetic.
unsigned __int128 hybrid_bytes_exact(int64_t rows, int64_t cols, int64_t e, int64_t b, int64_t vsize) {
    auto align = [](unsigned __int128 x) { return (x + 255) / 256 * 256; };
    using U = unsigned __int128;
    U at = 0;
    at = align(at + U(4) * U(rows));
    at = align(at + U(2) * U(rows) * U(e));
    at = align(at + U(vsize) * U(rows) * U(e));
    at = align(at + 4);
    at = align(at + U(4) * U(b));
    at = align(at + U(4) * U(rows));
    at = align(at + U(vsize) * U(b) * U(cols));
    return at;
}

}  // namespace

// =============================================================================================
// 1. Size arithmetic
// =============================================================================================

TEST_CASE("hostile sizes: the hybrid buffer size never wraps", "[hostile][sizes]") {
    SECTION("the reported case: 1464503524 rows x ellWidth 2099317136, fp32") {
        size_t bytes = kPoisonBytes;
        CHECK_FAILS(twHybridBufferSize(1464503524, 1, 2099317136, 0, TW_R_32F, &bytes), TW_STATUS_INVALID_VALUE,
                    nullptr, "ellWidth");
        CHECK(bytes == kPoisonBytes);
        // the create call over a (small) buffer refuses it too: nothing can read past the buffer
        Bytes buf(1024);
        twSpMatDescr_t d = reinterpret_cast<twSpMatDescr_t>(&bytes);
        CHECK_FAILS(twCreateHybrid(&d, 1464503524, 1, 2099317136, 0, buf.p, TW_R_32F), TW_STATUS_INVALID_VALUE, nullptr,
                    "ellWidth");
        CHECK(d == reinterpret_cast<twSpMatDescr_t>(&bytes));
    }
    SECTION("every size either fits size_t exactly or is refused") {
        const int64_t rows_list[] = {0, 1, 1000, 1464503524, INT32_MAX};
        const int64_t cols_list[] = {1, 65536};
        const int32_t ells[] = {8, 1 << 20, 1 << 30, 2099317136, INT32_MAX - 7};
        const twDataType_t types[] = {TW_R_16BF, TW_R_32F};
        for (int64_t rows : rows_list)
            for (int64_t cols : cols_list)
                for (int32_t e : ells)
                    for (int64_t b : {int64_t{0}, rows})
                        for (twDataType_t t : types) {
                            const int64_t vsize = t == TW_R_32F ? 4 : 2;
                            const unsigned __int128 exact = hybrid_bytes_exact(rows, cols, e, b, vsize);
                            size_t bytes = kPoisonBytes;
                            const twStatus_t st = twHybridBufferSize(rows, cols, e, b, t, &bytes);
                            INFO("rows " << rows << " cols " << cols << " E " << e << " B " << b << " vsize " << vsize
                                         << ": " << message());
                            if (exact <= SIZE_MAX) {
                                CHECK(st == TW_STATUS_SUCCESS);
                                CHECK(bytes == static_cast<size_t>(exact));
                            } else {
                                CHECK(st == TW_STATUS_INVALID_VALUE);
                                CHECK((names(message(), "ellWidth") || names(message(), "backupRows")));
                                CHECK(bytes == kPoisonBytes);
                            }
                        }
    }
}

TEST_CASE("hostile sizes: TwELL buffer sizes are exact at the largest shapes", "[hostile][sizes]") {
    for (int32_t tile : {64, 128, 256})
        for (int32_t comp : {2, 4, 8}) {
            const int64_t rows = INT32_MAX, cols = 65536;
            const int64_t ld = (cols + tile - 1) / tile * (tile / comp);
            const unsigned __int128 exact = (static_cast<unsigned __int128>(rows) * ld + 1 + rows) * 4;
            size_t bytes = 0;
            INFO("T " << tile << " C " << comp);
            REQUIRE(twTwellBufferSize(rows, cols, tile, comp, &bytes) == TW_STATUS_SUCCESS);
            CHECK(bytes == static_cast<size_t>(exact));
        }
}

TEST_CASE("hostile sizes: a dense matrix must fit the address space", "[hostile][sizes]") {
    twDnMatDescr_t d = nullptr;
    // 4 x 4 fp32 (64 bytes) starting 16 bytes before the end of the address space
    void *near_end = reinterpret_cast<void *>(UINTPTR_MAX - 15);
    CHECK_FAILS(twCreateDnMat(&d, 4, 4, 4, near_end, TW_R_32F, TW_ORDER_ROW), TW_STATUS_INVALID_VALUE, nullptr, "values");
    CHECK(d == nullptr);
    CHECK_FAILS(twCreateDnMat(&d, INT64_MAX / 2, 2, 2, near_end, TW_R_16BF, TW_ORDER_ROW), TW_STATUS_INVALID_VALUE,
                nullptr, "ld");
    // a sparse buffer likewise
    size_t bytes = 0;
    REQUIRE(twTwellBufferSize(4, 64, 64, 8, &bytes) == TW_STATUS_SUCCESS);
    twSpMatDescr_t s = nullptr;
    void *near_end16 = reinterpret_cast<void *>((UINTPTR_MAX - 15) & ~uintptr_t{15});
    CHECK_FAILS(twCreateTwell(&s, 4, 64, 64, 8, near_end16, TW_R_16BF), TW_STATUS_INVALID_VALUE, nullptr, "buffer");
    CHECK_FAILS(twCreateHybrid(&s, 4, 64, 8, 4, near_end16, TW_R_16BF), TW_STATUS_INVALID_VALUE, nullptr, "buffer");
    CHECK(s == nullptr);
}

TEST_CASE("hostile sizes: the FFN size queries refuse token counts that would wrap", "[hostile][sizes]") {
    Handle h;
    SmallFfn ffn(h, 16, 40);
    using Query = twStatus_t (*)(twHandle_t, twFfnDescr_t, int64_t, size_t *);
    for (Query q : {Query{twSpGEMMFusedSaved_bufferSize}, Query{twSpGEMMFusedBackward_bufferSize}}) {
        for (int64_t tokens : {int64_t{28733246220731389}, int64_t{INT32_MAX} + 1, INT64_MAX}) {
            size_t bytes = kPoisonBytes;
            CHECK_FAILS(q(h, ffn, tokens, &bytes), TW_STATUS_INVALID_VALUE, h.h, "tokens");
            CHECK(bytes == kPoisonBytes);
        }
        // the largest count is fine, and its size is not a wrapped one
        size_t bytes = 0;
        TW_REQUIRE_OK(h, q(h, ffn, INT32_MAX, &bytes));
        if (q == twSpGEMMFusedSaved_bufferSize) CHECK(bytes >= static_cast<size_t>(INT32_MAX) * 128 * 4);
    }
    // X with more than INT32_MAX rows (never read: the size query refuses it)
    alignas(16) static uint16_t storage[16];
    twDnMatDescr_t x = nullptr, y = nullptr;
    TW_REQUIRE_OK(nullptr, twCreateDnMat(&x, int64_t{INT32_MAX} + 1, 16, 16, storage, TW_R_16BF, TW_ORDER_ROW));
    TW_REQUIRE_OK(nullptr, twCreateDnMat(&y, int64_t{INT32_MAX} + 1, 16, 16, storage + 8, TW_R_16BF, TW_ORDER_ROW));
    size_t bytes = kPoisonBytes;
    CHECK_FAILS(twSpGEMMFused_bufferSize(h, ffn, x, y, &bytes), TW_STATUS_INVALID_VALUE, h.h, "X");
    CHECK(bytes == kPoisonBytes);
    CHECK_FAILS(twSpGEMMFused(h, ffn, x, y, nullptr, nullptr), TW_STATUS_INVALID_VALUE, h.h, "X");
    twDestroyDnMat(x);
    twDestroyDnMat(y);
}

// =============================================================================================
// 4. Overlapping inputs and outputs
// =============================================================================================

TEST_CASE("hostile overlap: conversions refuse an output over their input", "[hostile][overlap]") {
    Handle h;
    constexpr int64_t R = 8, C = 100;
    Dense a(R, C, TW_R_16BF);
    std::vector<float> v(R * C, 0.0f);
    for (size_t i = 0; i < v.size(); i += 7) v[i] = 1.0f + static_cast<float>(i % 5);
    a.fill(v);
    auto tw = Sparse::twell(R, C);
    size_t ws_bytes = 0;
    TW_REQUIRE_OK(h, twDenseToSparse_bufferSize(h, a, *tw, TW_CONVERT_PLAIN, &ws_bytes));
    Bytes ws(ws_bytes);
    TW_REQUIRE_OK(h, twDenseToSparse_analysis(h, a, *tw, TW_CONVERT_PLAIN, ws.p));
    TW_REQUIRE_OK(h, twDenseToSparse_convert(h, a, *tw, TW_CONVERT_PLAIN, ws.p));

    SECTION("sparse -> dense with the dense output over the sparse buffer") {
        twDnMatDescr_t out = nullptr;  // R x C bf16 row-major from the start of the TwELL buffer
        TW_REQUIRE_OK(nullptr, twCreateDnMat(&out, R, C, C, tw->buffer, TW_R_16BF, TW_ORDER_ROW));
        const std::vector<uint8_t> before(tw->buffer, tw->buffer + tw->bytes);
        CHECK_FAILS(twSparseToDense(h, *tw, out), TW_STATUS_INVALID_VALUE, h.h, "out");
        CHECK(std::equal(before.begin(), before.end(), tw->buffer));
        twDestroyDnMat(out);
        // two bytes of overlap are enough: a dense output whose last element is the first of
        // the sparse buffer
        const size_t dense_bytes = R * C * 2;  // 1600, a multiple of 16
        Bytes mem(dense_bytes + tw->bytes);
        std::memcpy(mem.p + dense_bytes, tw->buffer, tw->bytes);
        twSpMatDescr_t moved = nullptr;
        TW_REQUIRE_OK(nullptr, twCreateTwell(&moved, R, C, 256, 8, mem.p + dense_bytes, TW_R_16BF));
        TW_REQUIRE_OK(nullptr, twCreateDnMat(&out, R, C, C, mem.p + 2, TW_R_16BF, TW_ORDER_ROW));
        CHECK_FAILS(twSparseToDense(h, moved, out), TW_STATUS_INVALID_VALUE, h.h, "out");
        twDestroyDnMat(out);
        // adjacent but apart: fine
        TW_REQUIRE_OK(nullptr, twCreateDnMat(&out, R, C, C, mem.p, TW_R_16BF, TW_ORDER_ROW));
        TW_REQUIRE_OK(h, twSparseToDense(h, moved, out));
        const auto *got = reinterpret_cast<const uint16_t *>(mem.p);
        for (int64_t i = 0; i < R * C; ++i) REQUIRE(got[i] == a.bits(i / C, i % C));
        twDestroyDnMat(out);
        twDestroySpMat(moved);
    }
    SECTION("dense -> sparse with the sparse buffer over the dense input") {
        twSpMatDescr_t out = nullptr;
        TW_REQUIRE_OK(nullptr, twCreateTwell(&out, R, C, 256, 8, a.storage.data(), TW_R_16BF));
        const std::vector<uint32_t> before = a.storage;
        CHECK_FAILS(twDenseToSparse_bufferSize(h, a, out, TW_CONVERT_PLAIN, &ws_bytes), TW_STATUS_INVALID_VALUE, h.h,
                    "out");
        CHECK_FAILS(twDenseToSparse_analysis(h, a, out, TW_CONVERT_PLAIN, ws.p), TW_STATUS_INVALID_VALUE, h.h, "out");
        CHECK_FAILS(twDenseToSparse_convert(h, a, out, TW_CONVERT_PLAIN, ws.p), TW_STATUS_INVALID_VALUE, h.h, "out");
        CHECK(a.storage == before);
        twDestroySpMat(out);
        // the workspace over the input
        CHECK_FAILS(twDenseToSparse_analysis(h, a, *tw, TW_CONVERT_PLAIN, align16(a.storage.data())),
                    TW_STATUS_INVALID_VALUE, h.h, "workspace");
        CHECK(a.storage == before);
    }
    SECTION("sparse -> sparse with partly overlapping buffers (different descriptors)") {
        auto hy = Sparse::hybrid(R, C, 16, R);
        TW_REQUIRE_OK(h, twSparseConvert(h, *tw, *hy));
        size_t hbytes = 0;
        REQUIRE(twHybridBufferSize(R, C, 16, R, TW_R_16BF, &hbytes) == TW_STATUS_SUCCESS);
        twSpMatDescr_t shifted = nullptr;  // a second hybrid 256 bytes into the first one
        TW_REQUIRE_OK(nullptr, twCreateHybrid(&shifted, R, C, 16, R, hy->buffer + 256, TW_R_16BF));
        const std::vector<uint8_t> before(hy->buffer, hy->buffer + hbytes);
        CHECK_FAILS(twSparseConvert(h, *hy, shifted), TW_STATUS_INVALID_VALUE, h.h, "out");
        CHECK(std::equal(before.begin(), before.end(), hy->buffer));
        twSpMatDescr_t twT = nullptr;  // C x R TwELL over the hybrid
        TW_REQUIRE_OK(nullptr, twCreateTwell(&twT, C, R, 64, 8, hy->buffer + 16, TW_R_16BF));
        CHECK_FAILS(twSparseTranspose(h, *hy, twT), TW_STATUS_INVALID_VALUE, h.h, "out");
        CHECK(std::equal(before.begin(), before.end(), hy->buffer));
        twDestroySpMat(twT);
        twDestroySpMat(shifted);
    }
}

TEST_CASE("hostile overlap: SpMM and GEMM-to-sparse refuse an output over an input", "[hostile][overlap]") {
    Handle h;
    constexpr int64_t M = 4, K = 64, N = 8;
    Dense a(M, K, TW_R_16BF), w(K, N, TW_R_16BF);
    a.fill(rounded(random_normal(M * K, 3), TW_R_16BF));
    w.fill(rounded(random_normal(K * N, 4), TW_R_16BF));
    auto s = Sparse::hybrid(M, K, 64, M);
    {  // S = A as sparse
        size_t n = 0;
        TW_REQUIRE_OK(h, twDenseToSparse_bufferSize(h, a, *s, TW_CONVERT_PLAIN, &n));
        Bytes ws(n);
        TW_REQUIRE_OK(h, twDenseToSparse_analysis(h, a, *s, TW_CONVERT_PLAIN, ws.p));
        TW_REQUIRE_OK(h, twDenseToSparse_convert(h, a, *s, TW_CONVERT_PLAIN, ws.p));
    }
    const std::vector<uint32_t> w_before = w.storage;
    twDnMatDescr_t y_over_w = nullptr;  // M x N bf16 inside W's memory
    TW_REQUIRE_OK(nullptr, twCreateDnMat(&y_over_w, M, N, N, w.storage.data() + 4, TW_R_16BF, TW_ORDER_ROW));
    CHECK_FAILS(twSpMM(h, 1.0f, *s, w, 0.0f, y_over_w, nullptr), TW_STATUS_INVALID_VALUE, h.h, "Y");
    CHECK(w.storage == w_before);
    twDnMatDescr_t y_over_s = nullptr;
    TW_REQUIRE_OK(nullptr, twCreateDnMat(&y_over_s, M, N, N, s->buffer, TW_R_16BF, TW_ORDER_ROW));
    CHECK_FAILS(twSpMM(h, 1.0f, *s, w, 0.0f, y_over_s, nullptr), TW_STATUS_INVALID_VALUE, h.h, "Y");
    twDestroyDnMat(y_over_w);
    twDestroyDnMat(y_over_s);

    // C = relu(A B^T) with C's buffer over A
    Dense b(N, K, TW_R_16BF);
    b.fill(rounded(random_normal(N * K, 5), TW_R_16BF));
    twSpMatDescr_t c_over_a = nullptr;
    TW_REQUIRE_OK(nullptr, twCreateHybrid(&c_over_a, M, N, 8, 0, a.storage.data(), TW_R_16BF));
    const std::vector<uint32_t> a_before = a.storage;
    CHECK_FAILS(twGemmToSparse(h, 1.0f, a, b, c_over_a, TW_CONVERT_RELU, nullptr), TW_STATUS_INVALID_VALUE, h.h, "C");
    CHECK(a.storage == a_before);
    twDestroySpMat(c_over_a);
}

TEST_CASE("hostile overlap: the fused forward runs in place, and refuses any other overlap", "[hostile][overlap]") {
    Handle h;
    const int64_t m = 300, d = 64, hd = 256;  // several of the reference's 128-row blocks
    for (bool gated : {true, false}) {
        INFO((gated ? "gated" : "plain ReLU"));
        SmallFfn ffn(h, d, hd, gated);
        const std::vector<float> xv = rounded(random_normal(static_cast<size_t>(m * d), 21), TW_R_16BF);
        Dense x(m, d, TW_R_16BF), y(m, d, TW_R_16BF), z(m, d, TW_R_16BF);
        x.fill(xv);
        z.fill(xv);
        size_t bytes = 0;
        TW_REQUIRE_OK(h, twSpGEMMFused_bufferSize(h, ffn, x, y, &bytes));
        Bytes ws(bytes);
        TW_REQUIRE_OK(h, twSpGEMMFused(h, ffn, x, y, nullptr, ws.p));
        // in place: the same descriptor as X and Y, and two descriptors over the same memory
        TW_REQUIRE_OK(h, twSpGEMMFused(h, ffn, z, z, nullptr, ws.p));
        CHECK(z.storage == y.storage);
        Dense z2(m, d, TW_R_16BF);
        z2.fill(xv);
        twDnMatDescr_t z2_as_y = nullptr;
        TW_REQUIRE_OK(nullptr, twCreateDnMat(&z2_as_y, m, d, d, z2.storage.data(), TW_R_16BF, TW_ORDER_ROW));
        TW_REQUIRE_OK(h, twSpGEMMFused(h, ffn, z2, z2_as_y, nullptr, ws.p));
        CHECK(z2.storage == y.storage);
        twDestroyDnMat(z2_as_y);
        // the training forward in place writes the same Y
        size_t saved_bytes = 0;
        TW_REQUIRE_OK(h, twSpGEMMFusedSaved_bufferSize(h, ffn, m, &saved_bytes));
        Bytes saved(saved_bytes);
        Dense z3(m, d, TW_R_16BF);
        z3.fill(xv);
        TW_REQUIRE_OK(h, twSpGEMMFusedForwardTrain(h, ffn, z3, z3, saved.p, ws.p));
        CHECK(z3.storage == y.storage);

        // Y one row after X in the same memory: rows would be overwritten before they are read
        Dense big(m + 1, d, TW_R_16BF);
        big.fill(rounded(random_normal(static_cast<size_t>((m + 1) * d), 21), TW_R_16BF));
        const std::vector<uint32_t> before = big.storage;
        twDnMatDescr_t xs = nullptr, ys = nullptr;
        auto *base = reinterpret_cast<uint16_t *>(big.storage.data());
        TW_REQUIRE_OK(nullptr, twCreateDnMat(&xs, m, d, d, base, TW_R_16BF, TW_ORDER_ROW));
        TW_REQUIRE_OK(nullptr, twCreateDnMat(&ys, m, d, d, base + d, TW_R_16BF, TW_ORDER_ROW));
        CHECK_FAILS(twSpGEMMFused(h, ffn, xs, ys, nullptr, ws.p), TW_STATUS_INVALID_VALUE, h.h, "Y");
        CHECK_FAILS(twSpGEMMFusedForwardTrain(h, ffn, xs, ys, saved.p, ws.p), TW_STATUS_INVALID_VALUE, h.h, "Y");
        // the same memory with another ld is not in place either
        twDnMatDescr_t ywide = nullptr;
        TW_REQUIRE_OK(nullptr, twCreateDnMat(&ywide, m / 2, d, 2 * d, base, TW_R_16BF, TW_ORDER_ROW));
        twDnMatDescr_t xhalf = nullptr;
        TW_REQUIRE_OK(nullptr, twCreateDnMat(&xhalf, m / 2, d, d, base, TW_R_16BF, TW_ORDER_ROW));
        CHECK_FAILS(twSpGEMMFused(h, ffn, xhalf, ywide, nullptr, ws.p), TW_STATUS_INVALID_VALUE, h.h, "Y");
        CHECK(big.storage == before);
        // hidden output over X; saved state over Y
        twSpMatDescr_t hid = nullptr;
        TW_REQUIRE_OK(nullptr, twCreateTwell(&hid, m, hd, 256, 8, x.storage.data(), TW_R_16BF));
        CHECK_FAILS(twSpGEMMFused(h, ffn, x, y, hid, ws.p), TW_STATUS_INVALID_VALUE, h.h, "hidden");
        Bytes ymem(static_cast<size_t>(m * d * 2));
        twDnMatDescr_t y2 = nullptr;
        TW_REQUIRE_OK(nullptr, twCreateDnMat(&y2, m, d, d, ymem.p, TW_R_16BF, TW_ORDER_ROW));
        CHECK_FAILS(twSpGEMMFusedForwardTrain(h, ffn, x, y2, ymem.p + 512, ws.p), TW_STATUS_INVALID_VALUE, h.h,
                    "saved");
        twDestroyDnMat(y2);
        for (twDnMatDescr_t t : {xs, ys, ywide, xhalf}) twDestroyDnMat(t);
        twDestroySpMat(hid);
    }
}

TEST_CASE("hostile overlap: the backward refuses outputs over inputs or over each other", "[hostile][overlap]") {
    Handle h;
    const int64_t m = 5, d = 16, hd = 40;
    SmallFfn ffn(h, d, hd);
    Dense x(m, d, TW_R_16BF), y(m, d, TW_R_16BF), dy(m, d, TW_R_16BF), dx(m, d, TW_R_16BF);
    Dense dwg(hd, d, TW_R_16BF), dwu(hd, d, TW_R_16BF), dwd(hd, d, TW_R_16BF);
    x.fill(rounded(random_normal(m * d, 31), TW_R_16BF));
    dy.fill(rounded(random_normal(m * d, 32), TW_R_16BF));
    size_t saved_bytes = 0, bwd = 0;
    TW_REQUIRE_OK(h, twSpGEMMFusedSaved_bufferSize(h, ffn, m, &saved_bytes));
    TW_REQUIRE_OK(h, twSpGEMMFusedBackward_bufferSize(h, ffn, m, &bwd));
    Bytes saved(saved_bytes), ws(bwd);
    TW_REQUIRE_OK(h, twSpGEMMFusedForwardTrain(h, ffn, x, y, saved.p, nullptr));
    TW_REQUIRE_OK(h, twSpGEMMFusedBackward(h, ffn, x, saved.p, dy, 0.0f, dx, dwg, dwu, dwd, ws.p));

    const std::vector<uint32_t> dy_before = dy.storage, x_before = x.storage;
    // dX over dY (an in-place backward is not supported)
    CHECK_FAILS(twSpGEMMFusedBackward(h, ffn, x, saved.p, dy, 0.0f, dy, dwg, dwu, dwd, ws.p), TW_STATUS_INVALID_VALUE,
                h.h, "dX");
    CHECK(dy.storage == dy_before);
    // dWdown over dWup
    CHECK_FAILS(twSpGEMMFusedBackward(h, ffn, x, saved.p, dy, 0.0f, dx, dwg, dwu, dwu, ws.p), TW_STATUS_INVALID_VALUE,
                h.h, "dWdown");
    // dWgate over X's memory
    twDnMatDescr_t dwg_over_x = nullptr;
    TW_REQUIRE_OK(nullptr, twCreateDnMat(&dwg_over_x, hd, d, d, x.storage.data(), TW_R_16BF, TW_ORDER_ROW));
    CHECK_FAILS(twSpGEMMFusedBackward(h, ffn, x, saved.p, dy, 0.0f, dx, dwg_over_x, dwu, dwd, ws.p),
                TW_STATUS_INVALID_VALUE, h.h, "dWgate");
    CHECK(x.storage == x_before);
    twDestroyDnMat(dwg_over_x);
    // dX over the saved state
    twDnMatDescr_t dx_over_saved = nullptr;
    TW_REQUIRE_OK(nullptr, twCreateDnMat(&dx_over_saved, m, d, d, saved.p + 256, TW_R_16BF, TW_ORDER_ROW));
    const std::vector<uint8_t> saved_before = saved.snapshot();
    CHECK_FAILS(twSpGEMMFusedBackward(h, ffn, x, saved.p, dy, 0.0f, dx_over_saved, dwg, dwu, dwd, ws.p),
                TW_STATUS_INVALID_VALUE, h.h, "dX");
    CHECK(saved.snapshot() == saved_before);
    twDestroyDnMat(dx_over_saved);
}

// =============================================================================================
// 5. Alignment
// =============================================================================================

TEST_CASE("hostile alignment: values, buffers, workspaces and saved state", "[hostile][alignment]") {
    alignas(16) static uint8_t mem[4096];
    twDnMatDescr_t d = nullptr;
    SECTION("dense values: aligned to the element size") {
        CHECK_FAILS(twCreateDnMat(&d, 4, 4, 4, mem + 1, TW_R_16BF, TW_ORDER_ROW), TW_STATUS_INVALID_VALUE, nullptr,
                    "values");
        CHECK_FAILS(twCreateDnMat(&d, 4, 4, 4, mem + 1, TW_R_16F, TW_ORDER_COL), TW_STATUS_INVALID_VALUE, nullptr,
                    "values");
        CHECK_FAILS(twCreateDnMat(&d, 4, 4, 4, mem + 2, TW_R_32F, TW_ORDER_ROW), TW_STATUS_INVALID_VALUE, nullptr,
                    "values");
        CHECK(d == nullptr);
        REQUIRE(twCreateDnMat(&d, 4, 4, 4, mem + 2, TW_R_16BF, TW_ORDER_ROW) == TW_STATUS_SUCCESS);  // 2 is enough
        twDestroyDnMat(d);
        REQUIRE(twCreateDnMat(&d, 4, 4, 4, mem + 4, TW_R_32F, TW_ORDER_ROW) == TW_STATUS_SUCCESS);
        twDestroyDnMat(d);
    }
    SECTION("sparse buffers: TwELL 4 bytes, hybrid 16") {
        twSpMatDescr_t s = nullptr;
        CHECK_FAILS(twCreateTwell(&s, 2, 64, 64, 8, mem + 2, TW_R_16BF), TW_STATUS_INVALID_VALUE, nullptr, "buffer");
        CHECK_FAILS(twCreateHybrid(&s, 2, 64, 8, 2, mem + 4, TW_R_16BF), TW_STATUS_INVALID_VALUE, nullptr, "buffer");
        CHECK(s == nullptr);
    }
    SECTION("workspaces, saved state and neuron counts (CPU backend: 16 and 8 bytes)") {
        Handle h;
        const int64_t m = 3, dm = 16, hd = 40;
        SmallFfn ffn(h, dm, hd);
        Dense x(m, dm, TW_R_16BF), y(m, dm, TW_R_16BF), dy(m, dm, TW_R_16BF), dx(m, dm, TW_R_16BF);
        Dense dwg(hd, dm, TW_R_16BF), dwu(hd, dm, TW_R_16BF), dwd(hd, dm, TW_R_16BF);
        x.fill(rounded(random_normal(m * dm, 41), TW_R_16BF));
        size_t saved_bytes = 0;
        TW_REQUIRE_OK(h, twSpGEMMFusedSaved_bufferSize(h, ffn, m, &saved_bytes));
        Bytes saved(saved_bytes + 64);
        CHECK_FAILS(twSpGEMMFusedForwardTrain(h, ffn, x, y, saved.p + 8, nullptr), TW_STATUS_INVALID_VALUE, h.h,
                    "saved");
        CHECK_FAILS(twSpGEMMFusedForwardTrain(h, ffn, x, y, saved.p + 1, nullptr), TW_STATUS_INVALID_VALUE, h.h,
                    "saved");
        TW_REQUIRE_OK(h, twSpGEMMFusedForwardTrain(h, ffn, x, y, saved.p + 16, nullptr));
        CHECK_FAILS(twSpGEMMFusedBackward(h, ffn, x, saved.p + 24, dy, 0.0f, dx, dwg, dwu, dwd, nullptr),
                    TW_STATUS_INVALID_VALUE, h.h, "saved");
        TW_REQUIRE_OK(h, twSpGEMMFusedBackward(h, ffn, x, saved.p + 16, dy, 0.0f, dx, dwg, dwu, dwd, nullptr));

        auto sp = Sparse::twell(m, dm);
        size_t n = 0;
        TW_REQUIRE_OK(h, twDenseToSparse_bufferSize(h, x, *sp, TW_CONVERT_PLAIN, &n));
        REQUIRE(n > 0);
        Bytes ws(n + 64);
        CHECK_FAILS(twDenseToSparse_analysis(h, x, *sp, TW_CONVERT_PLAIN, ws.p + 8), TW_STATUS_INVALID_VALUE, h.h,
                    "workspace");
        CHECK_FAILS(twDenseToSparse_convert(h, x, *sp, TW_CONVERT_PLAIN, ws.p + 3), TW_STATUS_INVALID_VALUE, h.h,
                    "workspace");
        TW_REQUIRE_OK(h, twDenseToSparse_analysis(h, x, *sp, TW_CONVERT_PLAIN, ws.p + 16));

        Bytes counts(static_cast<size_t>(hd) * 8 + 16);
        CHECK_FAILS(twFfnGetNeuronCounts(h, ffn, reinterpret_cast<int64_t *>(counts.p + 4)), TW_STATUS_INVALID_VALUE,
                    h.h, "counts");
        TW_REQUIRE_OK(h, twFfnGetNeuronCounts(h, ffn, reinterpret_cast<int64_t *>(counts.p + 8)));
    }
}

// =============================================================================================
// 8. Training with no tokens
// =============================================================================================

TEST_CASE("hostile M = 0: the training calls touch no pointer; the backward zeroes dW", "[hostile][train]") {
    Handle h;
    const int64_t d = 16, hd = 40;
    for (bool gated : {true, false}) {
        INFO((gated ? "gated" : "plain ReLU"));
        SmallFfn ffn(h, d, hd, gated);
        twDnMatDescr_t x0 = nullptr, y0 = nullptr, dy0 = nullptr, dx0 = nullptr;
        for (twDnMatDescr_t *m : {&x0, &y0, &dy0, &dx0})
            TW_REQUIRE_OK(nullptr, twCreateDnMat(m, 0, d, d, nullptr, TW_R_16BF, TW_ORDER_ROW));
        size_t saved_bytes = kPoisonBytes, bwd = kPoisonBytes, fwd = kPoisonBytes;
        TW_REQUIRE_OK(h, twSpGEMMFusedSaved_bufferSize(h, ffn, 0, &saved_bytes));
        TW_REQUIRE_OK(h, twSpGEMMFusedBackward_bufferSize(h, ffn, 0, &bwd));
        TW_REQUIRE_OK(h, twSpGEMMFused_bufferSize(h, ffn, x0, y0, &fwd));
        CHECK(saved_bytes == 0);
        CHECK(bwd == 0);
        CHECK(fwd == 0);

        // a forward on 3 tokens first: its statistics stay
        Dense x(3, d, TW_R_16BF), y(3, d, TW_R_16BF);
        x.fill(rounded(random_normal(3 * d, 51), TW_R_16BF));
        TW_REQUIRE_OK(h, twSpGEMMFused(h, ffn, x, y, nullptr, nullptr));

        // NULL saved and workspace: fine; a real saved buffer: not written
        TW_REQUIRE_OK(h, twSpGEMMFusedForwardTrain(h, ffn, x0, y0, nullptr, nullptr));
        Bytes saved(1024);
        const std::vector<uint8_t> before = saved.snapshot();
        TW_REQUIRE_OK(h, twSpGEMMFusedForwardTrain(h, ffn, x0, y0, saved.p, nullptr));
        CHECK(saved.snapshot() == before);
        twFfnStats_t stats{};
        TW_REQUIRE_OK(h, twFfnGetStats(h, ffn, &stats));
        CHECK(stats.tokens == 3);

        // the backward: NULL saved and workspace; dW overwritten with zeros
        Dense dwg(hd, d, TW_R_16BF), dwu(hd, d, TW_R_16BF), dwd(hd, d, TW_R_16BF, TW_ORDER_COL, 3);
        for (Dense *m : {&dwg, &dwu, &dwd}) m->poison();
        TW_REQUIRE_OK(h, twSpGEMMFusedBackward(h, ffn, x0, nullptr, dy0, 0.5f, dx0, gated ? dwg.d : nullptr, dwu, dwd,
                                               nullptr));
        for (Dense *m : {&dwg, &dwu, &dwd}) {
            if (m == &dwg && !gated) continue;
            bool zero = true;
            for (int64_t r = 0; r < hd; ++r)
                for (int64_t c = 0; c < d; ++c) zero = zero && m->bits(r, c) == 0;
            CHECK(zero);
        }
        // the padding of a strided dW is not written
        const auto *pad = reinterpret_cast<const uint16_t *>(dwd.storage.data());
        bool pad_kept = true;
        for (int64_t c = 0; c < d; ++c)
            for (int64_t p = hd; p < dwd.ld; ++p) pad_kept = pad_kept && pad[c * dwd.ld + p] == 0x7fc1;
        CHECK(pad_kept);
        // arguments are still checked with no tokens
        CHECK_FAILS(twSpGEMMFusedBackward(h, ffn, x0, nullptr, dy0, NAN, dx0, gated ? dwg.d : nullptr, dwu, dwd,
                                          nullptr),
                    TW_STATUS_INVALID_VALUE, h.h, "l1Coeff");
        for (twDnMatDescr_t m : {x0, y0, dy0, dx0}) twDestroyDnMat(m);
    }
}

// =============================================================================================
// 9. Stale descriptors
// =============================================================================================

namespace {

/// Creates and destroys `n` objects through `make` / `destroy`; returns their addresses.
template <class T>
std::vector<T> churn(int n, const std::function<T()> &make, twStatus_t (*destroy)(T)) {
    std::vector<T> out;
    for (int i = 0; i < n; ++i) {
        const T t = make();
        REQUIRE(t != nullptr);
        REQUIRE(destroy(t) == TW_STATUS_SUCCESS);
        out.push_back(t);
    }
    return out;
}

/// After destroying `n` objects, `n` new ones never take one of their addresses, and every
/// stale one gives NOT_INITIALIZED (destroyed) without touching the live ones.
template <class T>
void check_quarantine(const char *kind, const std::function<T()> &make, twStatus_t (*destroy)(T),
                      const std::function<twStatus_t(T)> &use) {
    INFO(kind);
    const int n = 1000;  // within the quarantine of each kind (1024)
    const std::vector<T> stale = churn<T>(n, make, destroy);
    const std::set<T> stale_set(stale.begin(), stale.end());
    CHECK(stale_set.size() == stale.size());  // the destroyed objects had distinct addresses too
    std::vector<T> live;
    size_t reused = 0;
    for (int i = 0; i < n; ++i) {
        live.push_back(make());
        reused += stale_set.count(live.back());
    }
    CHECK(reused == 0);
    // the most recent stale object, used and destroyed again
    const T last = stale.back();
    CHECK_FAILS(use(last), TW_STATUS_NOT_INITIALIZED, nullptr, "destroyed");
    CHECK_FAILS(destroy(last), TW_STATUS_NOT_INITIALIZED, nullptr, "destroyed");
    for (T t : live) REQUIRE(use(t) == TW_STATUS_SUCCESS);  // untouched by the stale calls
    for (T t : live) REQUIRE(destroy(t) == TW_STATUS_SUCCESS);
}

}  // namespace

TEST_CASE("hostile stale objects: a destroyed object's address is not reused while it is remembered",
          "[hostile][stale]") {
    static float values[16];
    alignas(256) static uint8_t sbuf[1 << 14];
    check_quarantine<twDnMatDescr_t>(
        "dense descriptors",
        [] {
            twDnMatDescr_t d = nullptr;
            REQUIRE(twCreateDnMat(&d, 4, 4, 4, values, TW_R_32F, TW_ORDER_ROW) == TW_STATUS_SUCCESS);
            return d;
        },
        twDestroyDnMat,
        [](twDnMatDescr_t d) { return twDnMatGet(d, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr); });
    check_quarantine<twSpMatDescr_t>(
        "sparse descriptors",
        [] {
            twSpMatDescr_t s = nullptr;
            REQUIRE(twCreateHybrid(&s, 4, 16, 8, 4, sbuf, TW_R_32F) == TW_STATUS_SUCCESS);
            return s;
        },
        twDestroySpMat, [](twSpMatDescr_t s) { return twSpMatGetSize(s, nullptr, nullptr); });
    check_quarantine<twHandle_t>(
        "handles",
        [] {
            twHandle_t h = nullptr;
            REQUIRE(twCreateWithBackend(&h, TW_BACKEND_CPU) == TW_STATUS_SUCCESS);
            return h;
        },
        twDestroy,
        [](twHandle_t h) {
            twBackend_t b;
            return twGetBackend(h, &b);
        });
    Handle h;
    Dense wu(8, 8, TW_R_32F), wd(8, 8, TW_R_32F);
    check_quarantine<twFfnDescr_t>(
        "FFN descriptors",
        [&] {
            twFfnDescr_t f = nullptr;
            REQUIRE(twCreateFfn(h, &f, TW_FFN_RELU, nullptr, wu, wd) == TW_STATUS_SUCCESS);
            return f;
        },
        twDestroyFfn, [](twFfnDescr_t f) { return twFfnGetSize(f, nullptr, nullptr); });
}

TEST_CASE("hostile stale objects: destroying a stale descriptor never destroys a live one", "[hostile][stale]") {
    static float values[16];
    twDnMatDescr_t a = nullptr, b = nullptr;
    REQUIRE(twCreateDnMat(&a, 4, 4, 4, values, TW_R_32F, TW_ORDER_ROW) == TW_STATUS_SUCCESS);
    REQUIRE(twDestroyDnMat(a) == TW_STATUS_SUCCESS);
    REQUIRE(twCreateDnMat(&b, 2, 2, 2, values, TW_R_32F, TW_ORDER_ROW) == TW_STATUS_SUCCESS);
    CHECK(a != b);
    CHECK_FAILS(twDestroyDnMat(a), TW_STATUS_NOT_INITIALIZED, nullptr, "destroyed");
    int64_t rows = -1;
    REQUIRE(twDnMatGet(b, &rows, nullptr, nullptr, nullptr, nullptr, nullptr) == TW_STATUS_SUCCESS);
    CHECK(rows == 2);
    // a stale descriptor as an argument of a call on a live handle: the message on the handle
    Handle h;
    auto s = Sparse::twell(4, 4, TW_R_16BF, 64, 8);
    CHECK_FAILS(twSparseToDense(h, *s, a), TW_STATUS_NOT_INITIALIZED, h.h, "destroyed");
    CHECK(names(message(h), "out"));
    // a foreign pointer is not called destroyed
    int foreign = 0;
    CHECK_FAILS(twDnMatGet(reinterpret_cast<twDnMatDescr_t>(&foreign), &rows, nullptr, nullptr, nullptr, nullptr, nullptr),
                TW_STATUS_NOT_INITIALIZED, nullptr, "foreign");
    // a live object of another kind is named as such
    CHECK_FAILS(twDnMatGet(reinterpret_cast<twDnMatDescr_t>(s->d), &rows, nullptr, nullptr, nullptr, nullptr, nullptr),
                TW_STATUS_NOT_INITIALIZED, nullptr, "kind");
    twDestroyDnMat(b);
}
