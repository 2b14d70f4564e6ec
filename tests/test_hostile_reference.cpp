// Hostile inputs on the CPU reference backend: a training saved state corrupted past its header
// (every count and unit id is an index in the backward), a hybrid whose backup slots disagree
// with its rows, and incomplete sparse inputs, which must be told apart by status from outputs
// that are too small. Each case checks the status, the message and that no output changed.
#include <cstring>

#include "host/reference/saved_state.hpp"
#include "test_support.hpp"

using namespace twtest;
namespace ref = twblas::reference;

namespace {

bool mentions(const std::string &message, const std::string &what) { return message.find(what) != std::string::npos; }

// ---- a training step on the CPU reference, with its saved state at hand ----------------------

struct Training {
    Handle h;
    int64_t m, d, hd;
    bool gated;
    std::unique_ptr<Dense> X, Y, DY, WG, WU, WD, DX, DWG, DWU, DWD;
    twFfnDescr_t ffn = nullptr;
    std::vector<uint8_t> saved;
    ref::SavedLayout layout;

    /// fp32 data, normal or (integers) in {-1, 0, 1}: then every sum is exact in any order.
    Training(int64_t m_, int64_t d_, int64_t hd_, bool gated_, bool integers = false, uint64_t seed = 11)
        : m(m_), d(d_), hd(hd_), gated(gated_), layout(m_) {
        const twDataType_t t = TW_R_32F;
        auto data = [&](int64_t n, uint64_t s) {
            std::vector<float> v = random_normal(static_cast<size_t>(n), s);
            if (integers)
                for (float &e : v) e = e > 0.5f ? 1.0f : e < -0.5f ? -1.0f : 0.0f;
            return v;
        };
        X = std::make_unique<Dense>(m, d, t);
        X->fill(data(m * d, seed));
        Y = std::make_unique<Dense>(m, d, t);
        DY = std::make_unique<Dense>(m, d, t);
        DY->fill(data(m * d, seed + 1));
        if (gated) {
            WG = std::make_unique<Dense>(hd, d, t);
            WG->fill(data(hd * d, seed + 2));
            DWG = std::make_unique<Dense>(hd, d, t);
        }
        WU = std::make_unique<Dense>(hd, d, t);
        WU->fill(data(hd * d, seed + 3));
        WD = std::make_unique<Dense>(hd, d, t);
        WD->fill(data(hd * d, seed + 4));
        DX = std::make_unique<Dense>(m, d, t);
        DWU = std::make_unique<Dense>(hd, d, t);
        DWD = std::make_unique<Dense>(hd, d, t);
        TW_REQUIRE_OK(h, twCreateFfn(h, &ffn, gated ? TW_FFN_GATED_RELU : TW_FFN_RELU, WG ? WG->d : nullptr, *WU, *WD));
        size_t bytes = 0;
        TW_REQUIRE_OK(h, twSpGEMMFusedSaved_bufferSize(h, ffn, m, &bytes));
        REQUIRE(bytes == layout.total);
        saved.assign(bytes, 0xCD);
        TW_REQUIRE_OK(h, twSpGEMMFusedForwardTrain(h, ffn, *X, *Y, saved.data(), nullptr));
        poison_outputs();
    }
    ~Training() { twDestroyFfn(ffn); }
    Training(const Training &) = delete;
    Training &operator=(const Training &) = delete;

    void poison_outputs() {
        for (Dense *o : outputs()) o->poison();
    }
    std::vector<Dense *> outputs() {
        std::vector<Dense *> o{DX.get(), DWU.get(), DWD.get()};
        if (DWG) o.push_back(DWG.get());
        return o;
    }
    std::vector<std::vector<uint32_t>> snapshot() {
        std::vector<std::vector<uint32_t>> s;
        for (Dense *o : outputs()) s.push_back(o->storage);
        return s;
    }
    twStatus_t backward() {
        return twSpGEMMFusedBackward(h, ffn, *X, saved.data(), *DY, 0.01f, *DX, DWG ? DWG->d : nullptr, *DWU, *DWD,
                                     nullptr);
    }

    // the fields of the saved state (saved_state.hpp)
    int32_t &count(int64_t t) { return reinterpret_cast<int32_t *>(saved.data() + layout.row_nnz)[t]; }
    uint16_t &unit(int64_t t, int64_t i) {
        return reinterpret_cast<uint16_t *>(saved.data() + layout.cols)[t * ref::kSavedEllWidth + i];
    }
    float &g(int64_t t, int64_t i) { return reinterpret_cast<float *>(saved.data() + layout.g)[t * ref::kSavedEllWidth + i]; }
    ref::SavedHeader header() const {
        ref::SavedHeader hdr;
        std::memcpy(&hdr, saved.data(), sizeof hdr);
        return hdr;
    }
    void set_header(const ref::SavedHeader &hdr) { std::memcpy(saved.data(), &hdr, sizeof hdr); }

    /// The first token with at least `n` kept units.
    int64_t token_with(int64_t n) {
        for (int64_t t = 0; t < m; ++t)
            if (count(t) >= n && count(t) <= ref::kSavedEllWidth) return t;
        FAIL("no token with " << n << " kept units");
        return -1;
    }

    /// The backward refuses the saved state: INVALID_VALUE, a message naming `saved` and each of
    /// `words`, and every output untouched.
    void require_refused(const std::vector<std::string> &words) {
        const auto before = snapshot();
        const twStatus_t st = backward();
        const std::string msg = twGetErrorMessage(h);
        INFO(twGetStatusName(st) << ": " << msg);
        REQUIRE(st == TW_STATUS_INVALID_VALUE);
        CHECK(mentions(msg, "saved"));
        for (const std::string &w : words) CHECK(mentions(msg, w));
        CHECK(snapshot() == before);
    }
};

// ---- sparse containers whose content a test builds or corrupts -------------------------------

/// Offsets of the hybrid arrays, as docs/formats.md section 2.2 gives them.
struct HybridOffsets {
    size_t row_nnz, ell_cols, ell_vals, backup_count, backup_rows, backup_map, backup_vals, bytes;
    HybridOffsets(int64_t rows, int64_t cols, int64_t e, int64_t b, size_t vsize) {
        auto align = [](size_t x) { return (x + 255) / 256 * 256; };
        const size_t r = static_cast<size_t>(rows);
        row_nnz = 0;
        ell_cols = align(row_nnz + 4 * r);
        ell_vals = align(ell_cols + 2 * r * static_cast<size_t>(e));
        backup_count = align(ell_vals + vsize * r * static_cast<size_t>(e));
        backup_rows = align(backup_count + 4);
        backup_map = align(backup_rows + 4 * static_cast<size_t>(b));
        backup_vals = align(backup_map + 4 * r);
        bytes = align(backup_vals + vsize * static_cast<size_t>(b * cols));
    }
};

twStatus_t dense_to_sparse(twHandle_t h, twDnMatDescr_t in, twSpMatDescr_t out) {
    size_t bytes = 0;
    TW_REQUIRE_OK(h, twDenseToSparse_bufferSize(h, in, out, TW_CONVERT_PLAIN, &bytes));
    std::vector<uint8_t> ws(bytes + 1);
    const twStatus_t a = twDenseToSparse_analysis(h, in, out, TW_CONVERT_PLAIN, ws.data());
    if (a != TW_STATUS_SUCCESS && a != TW_STATUS_CAPACITY_EXCEEDED) return a;
    return twDenseToSparse_convert(h, in, out, TW_CONVERT_PLAIN, ws.data());
}

/// rows x cols bf16: row r holds `heavy` non-zeros when r is odd, 2 otherwise.
std::unique_ptr<Dense> rows_of(int64_t rows, int64_t cols, int64_t heavy) {
    auto d = std::make_unique<Dense>(rows, cols, TW_R_16BF);
    std::fill(d->storage.begin(), d->storage.end(), 0u);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < (r % 2 ? heavy : 2); ++c) d->set(r, (c * 7 + r) % cols, 1.0f + float(c % 5));
    return d;
}

}  // namespace

// =============================================================================================
// Item: the CPU backward trusts the saved state past its header.

TEST_CASE("backward: an intact saved state is accepted", "[hostile][backward]") {
    for (bool gated : {true, false}) {
        Training tr(9, 16, 64, gated);
        TW_REQUIRE_OK(tr.h, tr.backward());
    }
}

TEST_CASE("backward: a saved state set to 0xff past its header is refused, outputs untouched", "[hostile][backward]") {
    for (bool gated : {true, false}) {
        DYNAMIC_SECTION((gated ? "gated" : "plain")) {
            Training tr(9, 16, 64, gated);
            std::fill(tr.saved.begin() + sizeof(ref::SavedHeader), tr.saved.end(), uint8_t{0xff});
            tr.require_refused({"token 0", "-1"});
        }
    }
}

TEST_CASE("backward: a unit id or count out of range in the saved state is refused", "[hostile][backward]") {
    Training tr(9, 16, 64, true);
    SECTION("one unit whose id is H") {
        const int64_t t = 3;
        tr.count(t) = 1;
        tr.unit(t, 0) = static_cast<uint16_t>(tr.hd);
        tr.require_refused({"token 3", "unit id 64"});
    }
    SECTION("a unit id of 60000") {
        const int64_t t = tr.token_with(2);
        tr.unit(t, 1) = 60000;
        tr.require_refused({"token " + std::to_string(t), "60000"});
    }
    SECTION("a negative count") {
        tr.count(5) = -7;
        tr.require_refused({"token 5", "-7"});
    }
    SECTION("a count above H") {
        tr.count(8) = static_cast<int32_t>(tr.hd + 1);
        tr.require_refused({"token 8", "65"});
    }
    SECTION("a count of INT32_MAX") {
        tr.count(0) = INT32_MAX;
        tr.require_refused({"token 0", "2147483647"});
    }
}

TEST_CASE("backward: saved unit ids must ascend and their g be active", "[hostile][backward]") {
    Training tr(9, 16, 64, true);
    const int64_t t = tr.token_with(3);
    const std::string token = "token " + std::to_string(t);
    SECTION("two ids swapped") {
        std::swap(tr.unit(t, 1), tr.unit(t, 2));
        tr.require_refused({token, "entry 2", "ascend"});
    }
    SECTION("an id repeated") {
        tr.unit(t, 1) = tr.unit(t, 0);
        tr.require_refused({token, "entry 1", "ascend"});
    }
    SECTION("a negative g") {
        tr.g(t, 0) = -1.5f;
        tr.require_refused({token, "entry 0", "-1.5"});
    }
    SECTION("a g of -0.0") {
        tr.g(t, 2) = -0.0f;
        tr.require_refused({token, "entry 2", "active"});
    }
    SECTION("a NaN g is an active unit's (ReLU(NaN) = NaN): accepted") {
        tr.g(t, 0) = NAN;
        TW_REQUIRE_OK(tr.h, tr.backward());
    }
}

TEST_CASE("backward: the saved header must give the backend's kept width", "[hostile][backward]") {
    Training tr(4, 16, 64, false);
    ref::SavedHeader hdr = tr.header();
    hdr.ell_width = 4096;
    tr.set_header(hdr);
    tr.require_refused({"4096"});
}

TEST_CASE("backward: a count past the kept width means 'recompute the token' and gives the same gradients",
          "[hostile][backward]") {
    // H = 200 > 128: a count in (128, H] keeps no ids and sends the token to the recompute from
    // X; on small-integer data (every sum exact) it gives bit-identical gradients
    for (bool gated : {true, false}) {
        DYNAMIC_SECTION((gated ? "gated" : "plain")) {
            Training tr(6, 16, 200, gated, true);
            REQUIRE(tr.count(2) <= ref::kSavedEllWidth);
            TW_REQUIRE_OK(tr.h, tr.backward());
            const auto want = tr.snapshot();
            tr.poison_outputs();
            tr.count(2) = 150;
            TW_REQUIRE_OK(tr.h, tr.backward());
            CHECK(tr.snapshot() == want);
            tr.count(2) = 201;  // but never more than H
            tr.require_refused({"token 2", "201"});
        }
    }
}

// =============================================================================================
// Item: the validator accepted a hybrid row pointing at another row's backup slot.

TEST_CASE("validator: each backup slot belongs to the row that maps to it", "[hostile][validate]") {
    Handle h;
    // rows 1 and 3 need backup rows (12 non-zeros > E = 8, the same columns); B = 1 holds row 1
    const int64_t rows = 4, cols = 20, e = 8, b = 1;
    auto d = rows_of(rows, cols, 12);
    for (int64_t c = 0; c < cols; ++c) d->set(3, c, d->get(1, c));  // row 3 = row 1
    auto hy = Sparse::hybrid(rows, cols, e, b);
    const HybridOffsets off(rows, cols, e, b, 2);
    REQUIRE(off.bytes == hy->bytes);
    REQUIRE(dense_to_sparse(h, *d, *hy) == TW_STATUS_CAPACITY_EXCEEDED);
    TW_REQUIRE_OK(h, twSpMatValidate(h, *hy));
    auto *map = reinterpret_cast<int32_t *>(hy->buffer + off.backup_map);
    const auto *ids = reinterpret_cast<const int32_t *>(hy->buffer + off.backup_rows);
    REQUIRE(*reinterpret_cast<const int32_t *>(hy->buffer + off.backup_count) == 2);
    REQUIRE(ids[0] == 1);
    REQUIRE(map[1] == 0);
    REQUIRE(map[3] == -1);  // past the capacity: recorded, not stored

    SECTION("a row past the capacity pointing at another row's slot") {
        map[3] = 0;
        const twStatus_t st = twSpMatValidate(h, *hy);
        const std::string msg = twGetErrorMessage(h);
        INFO(msg);
        CHECK(st == TW_STATUS_INVALID_VALUE);
        CHECK(mentions(msg, "row 3"));
        CHECK(mentions(msg, "row 1"));
        // every routine that reads a sparse input validates it first
        Dense out(rows, cols, TW_R_16BF);
        CHECK(twSparseToDense(h, *hy, out) == TW_STATUS_INVALID_VALUE);
    }
    SECTION("a row pointing at a slot that names another row, with the counts consistent") {
        // B = 2: rows 1 and 3 stored in slots 0 and 1; then slot 1 claims row 1 too
        auto hy2 = Sparse::hybrid(rows, cols, e, 2);
        const HybridOffsets o2(rows, cols, e, 2, 2);
        TW_REQUIRE_OK(h, dense_to_sparse(h, *d, *hy2));
        auto *map2 = reinterpret_cast<int32_t *>(hy2->buffer + o2.backup_map);
        auto *ids2 = reinterpret_cast<int32_t *>(hy2->buffer + o2.backup_rows);
        REQUIRE(ids2[1] == 3);
        map2[3] = 0;
        CHECK(twSpMatValidate(h, *hy2) == TW_STATUS_INVALID_VALUE);
        ids2[1] = 1;
        CHECK(twSpMatValidate(h, *hy2) == TW_STATUS_INVALID_VALUE);
    }
}

// =============================================================================================
// Item: an incomplete input and a too-small output were both CAPACITY_EXCEEDED.

TEST_CASE("status names: INCOMPLETE_INPUT", "[hostile][incomplete]") {
    CHECK(static_cast<int>(TW_STATUS_INCOMPLETE_INPUT) == 10);
    CHECK(std::string(twGetStatusName(TW_STATUS_INCOMPLETE_INPUT)) == "TW_STATUS_INCOMPLETE_INPUT");
    const std::string s = twGetStatusString(TW_STATUS_INCOMPLETE_INPUT);
    CHECK(mentions(s, "input"));
    CHECK(s != twGetStatusString(TW_STATUS_CAPACITY_EXCEEDED));
}

TEST_CASE("an incomplete input gives INCOMPLETE_INPUT with every output untouched", "[hostile][incomplete]") {
    const int64_t rows = 6, cols = 300;
    auto d = rows_of(rows, cols, 40);  // rows 1, 3, 5: 40 non-zeros in tile 0 (31 slots at C = 8)
    for (int kind = 0; kind < 2; ++kind) {
        DYNAMIC_SECTION((kind == 0 ? "TwELL with overflow rows" : "hybrid with rows past its backup capacity")) {
            Handle h;
            auto in = kind == 0 ? Sparse::twell(rows, cols) : Sparse::hybrid(rows, cols, 8, 1);
            REQUIRE(dense_to_sparse(h, *d, *in) == TW_STATUS_CAPACITY_EXCEEDED);
            TW_REQUIRE_OK(h, twSpMatValidate(h, *in));
            const std::vector<uint8_t> in_before = in->raw;

            Dense dense(rows, cols, TW_R_16BF);
            dense.poison();
            const auto dense_before = dense.storage;
            CHECK(twSparseToDense(h, *in, dense) == TW_STATUS_INCOMPLETE_INPUT);
            CHECK(mentions(twGetErrorMessage(h), "in: "));
            CHECK(dense.storage == dense_before);

            auto out = Sparse::hybrid(rows, cols, 8, rows);  // large enough for every row
            const std::vector<uint8_t> out_before = out->raw;
            CHECK(twSparseConvert(h, *in, *out) == TW_STATUS_INCOMPLETE_INPUT);
            CHECK(out->raw == out_before);

            auto tr = Sparse::hybrid(cols, rows, 8, cols);
            const std::vector<uint8_t> tr_before = tr->raw;
            CHECK(twSparseTranspose(h, *in, *tr) == TW_STATUS_INCOMPLETE_INPUT);
            CHECK(tr->raw == tr_before);

            Dense w(cols, 5, TW_R_16BF), y(rows, 5, TW_R_16BF);
            w.fill(random_normal(static_cast<size_t>(cols * 5), 3));
            y.fill(random_normal(static_cast<size_t>(rows * 5), 4));
            const auto y_before = y.storage;
            for (float beta : {0.0f, 1.0f}) {
                CHECK(twSpMM(h, 1.0f, *in, w, beta, y, nullptr) == TW_STATUS_INCOMPLETE_INPUT);
                CHECK(mentions(twGetErrorMessage(h), "S: "));
                CHECK(y.storage == y_before);
            }
            CHECK(in->raw == in_before);  // inputs are never written
        }
    }
}

TEST_CASE("a complete input into a too-small output still gives CAPACITY_EXCEEDED", "[hostile][incomplete]") {
    Handle h;
    const int64_t rows = 6, cols = 300;
    auto d = rows_of(rows, cols, 40);
    auto in = Sparse::hybrid(rows, cols, 8, rows);
    TW_REQUIRE_OK(h, dense_to_sparse(h, *d, *in));
    auto small = Sparse::twell(rows, cols);  // 31 slots a tile: the heavy rows overflow
    CHECK(twSparseConvert(h, *in, *small) == TW_STATUS_CAPACITY_EXCEEDED);
    CHECK(info_of(h, *small).overflowRows == 3);  // written, rows recorded
    TW_REQUIRE_OK(h, twSpMatValidate(h, *small));
    // a transpose whose output has too few backup rows: column 0 of a 20 x 40 matrix is full,
    // so row 0 of the transpose has 20 entries, more than E = 8, and B = 0
    Dense d2(20, 40, TW_R_16BF);
    std::fill(d2.storage.begin(), d2.storage.end(), 0u);
    for (int64_t r = 0; r < 20; ++r) d2.set(r, 0, 1.0f + float(r));
    auto in2 = Sparse::hybrid(20, 40, 8, 0);
    TW_REQUIRE_OK(h, dense_to_sparse(h, d2, *in2));
    auto small_t = Sparse::hybrid(40, 20, 8, 0);
    CHECK(twSparseTranspose(h, *in2, *small_t) == TW_STATUS_CAPACITY_EXCEEDED);
    CHECK(info_of(h, *small_t).overflowRows == 1);
    // and the output, now incomplete, is refused as an input
    Dense back(rows, cols, TW_R_16BF);
    CHECK(twSparseToDense(h, *small, back) == TW_STATUS_INCOMPLETE_INPUT);
}
