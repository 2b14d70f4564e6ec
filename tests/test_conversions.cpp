// Random round trips dense -> sparse -> dense (bit-exact), sparse -> sparse, transposes, on sizes
// off every tile multiple, for every value type and container parameter.
#include "test_support.hpp"
#include "host/formats.hpp"

using namespace twtest;

namespace {

/// A dense matrix with about `density` of its entries non-zero, including -0.0 and NaN patterns.
void fill_sparse_random(Dense &d, double density, uint64_t seed, bool specials = true) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> u01(0.0, 1.0);
    std::normal_distribution<float> n01;
    for (int64_t r = 0; r < d.rows; ++r)
        for (int64_t c = 0; c < d.cols; ++c) {
            float v = 0.0f;
            if (u01(rng) < density) v = n01(rng);
            if (specials && u01(rng) < 0.002) v = -0.0f;
            if (specials && u01(rng) < 0.001) v = NAN;
            d.set(r, c, v);
        }
}

void convert_ok(twHandle_t h, twDnMatDescr_t in, twSpMatDescr_t out, twConvertOp_t op, twStatus_t expect) {
    size_t bytes = 0;
    TW_REQUIRE_OK(h, twDenseToSparse_bufferSize(h, in, out, op, &bytes));
    std::vector<uint8_t> ws(bytes);
    REQUIRE(twDenseToSparse_analysis(h, in, out, op, ws.data()) == expect);
    REQUIRE(twDenseToSparse_convert(h, in, out, op, ws.data()) == expect);
}

void require_same_bits(const Dense &a, const Dense &b) {
    for (int64_t r = 0; r < a.rows; ++r)
        for (int64_t c = 0; c < a.cols; ++c) {
            INFO("row " << r << " col " << c);
            REQUIRE(a.bits(r, c) == b.bits(r, c));
        }
}

/// The dense matrix after ReLU (torch.relu semantics: NaN stays, -0.0 and negatives become +0).
void apply_relu(Dense &d) {
    for (int64_t r = 0; r < d.rows; ++r)
        for (int64_t c = 0; c < d.cols; ++c) {
            const float v = d.get(r, c);
            if (!twblas::relu_keeps(v)) d.set(r, c, 0.0f);
        }
}

}  // namespace

TEST_CASE("dense -> TwELL -> dense is bit-exact on odd shapes", "[conversions]") {
    Handle h;
    const int64_t rows_list[] = {0, 1, 7, 333};
    const int64_t cols_list[] = {1, 255, 257, 300, 1000};
    const twDataType_t types[] = {TW_R_16BF, TW_R_16F};
    const int32_t tiles[] = {64, 128, 256};
    const int32_t comps[] = {2, 4, 8};
    uint64_t seed = 1;
    for (int64_t rows : rows_list)
        for (int64_t cols : cols_list)
            for (twDataType_t t : types)
                for (int32_t tile : tiles)
                    for (int32_t comp : comps) {
                        if (rows > 7 && (tile != 256 || comp == 4)) continue;  // keep the sweep quick
                        DYNAMIC_SECTION("rows " << rows << " cols " << cols << " type " << t << " T " << tile << " C " << comp) {
                            Dense d(rows, cols, t, (seed & 1) ? TW_ORDER_ROW : TW_ORDER_COL, seed % 3);
                            // density low enough that no tile overflows even at C = 8, T = 64 (7 slots)
                            fill_sparse_random(d, 0.02, ++seed);
                            auto tw = Sparse::twell(rows, cols, t, tile, comp);
                            convert_ok(h, d, *tw, TW_CONVERT_PLAIN, TW_STATUS_SUCCESS);
                            TW_REQUIRE_OK(h, twSpMatValidate(h, *tw));
                            Dense back(rows, cols, t);
                            back.poison();
                            TW_REQUIRE_OK(h, twSparseToDense(h, *tw, back));
                            require_same_bits(d, back);
                        }
                    }
}

TEST_CASE("dense -> hybrid -> dense is bit-exact, heavy rows included", "[conversions]") {
    Handle h;
    const twDataType_t types[] = {TW_R_16BF, TW_R_16F, TW_R_32F};
    for (twDataType_t t : types)
        for (int64_t rows : {0, 1, 7, 333})
            for (int64_t cols : {1, 300, 1000}) {
                DYNAMIC_SECTION("type " << t << " rows " << rows << " cols " << cols) {
                    Dense d(rows, cols, t);
                    fill_sparse_random(d, 0.03, 99 + rows + cols);
                    for (int64_t r = 3; r < rows; r += 50)  // heavy rows: 60 % dense
                        for (int64_t c = 0; c < cols; ++c)
                            if ((c * 7 + r) % 5 < 3) d.set(r, c, 0.5f + float(c % 13));
                    auto hy = Sparse::hybrid(rows, cols, 16, rows, t);
                    convert_ok(h, d, *hy, TW_CONVERT_PLAIN, TW_STATUS_SUCCESS);
                    TW_REQUIRE_OK(h, twSpMatValidate(h, *hy));
                    Dense back(rows, cols, t, TW_ORDER_COL, 3);
                    back.poison();
                    TW_REQUIRE_OK(h, twSparseToDense(h, *hy, back));
                    require_same_bits(d, back);
                }
            }
}

TEST_CASE("ReLU conversion keeps positives and NaN only", "[conversions]") {
    Handle h;
    Dense d(9, 700, TW_R_16BF);
    fill_sparse_random(d, 0.05, 5);
    auto tw = Sparse::twell(9, 700);
    auto hy = Sparse::hybrid(9, 700, 8, 9);
    convert_ok(h, d, *tw, TW_CONVERT_RELU, TW_STATUS_SUCCESS);
    convert_ok(h, d, *hy, TW_CONVERT_RELU, TW_STATUS_SUCCESS);
    apply_relu(d);
    Dense back(9, 700, TW_R_16BF);
    TW_REQUIRE_OK(h, twSparseToDense(h, *tw, back));
    require_same_bits(d, back);
    back.poison();
    TW_REQUIRE_OK(h, twSparseToDense(h, *hy, back));
    require_same_bits(d, back);
}

TEST_CASE("TwELL -> hybrid -> TwELL keeps every value", "[conversions]") {
    Handle h;
    Dense d(333, 600, TW_R_16BF);
    fill_sparse_random(d, 0.03, 17);
    auto tw = Sparse::twell(333, 600);
    convert_ok(h, d, *tw, TW_CONVERT_PLAIN, TW_STATUS_SUCCESS);
    auto hy = Sparse::hybrid(333, 600, 8, 333);  // E = 8: most rows go to backup rows
    TW_REQUIRE_OK(h, twSparseConvert(h, *tw, *hy));
    TW_REQUIRE_OK(h, twSpMatValidate(h, *hy));
    CHECK(info_of(h, *hy).nnz == info_of(h, *tw).nnz);
    auto tw2 = Sparse::twell(333, 600, TW_R_16BF, 128, 4);
    TW_REQUIRE_OK(h, twSparseConvert(h, *hy, *tw2));
    Dense back(333, 600, TW_R_16BF);
    back.poison();
    TW_REQUIRE_OK(h, twSparseToDense(h, *tw2, back));
    require_same_bits(d, back);

    // a hybrid too small for the heavy rows: recorded, status says so
    auto small = Sparse::hybrid(333, 600, 8, 2);
    CHECK(twSparseConvert(h, *tw, *small) == TW_STATUS_CAPACITY_EXCEEDED);
    CHECK(info_of(h, *small).overflowRows > 2);
    // the same buffer viewed twice must not be converted into itself
    twSpMatDescr_t alias = nullptr;
    TW_REQUIRE_OK(h, twCreateHybrid(&alias, 333, 600, 8, 333, hy->buffer, TW_R_16BF));
    CHECK(twSparseConvert(h, *hy, alias) == TW_STATUS_INVALID_VALUE);
    twDestroySpMat(alias);
}

TEST_CASE("hybrid transpose is exact", "[conversions]") {
    Handle h;
    Dense d(70, 300, TW_R_16BF);
    fill_sparse_random(d, 0.05, 23);
    for (int64_t c = 0; c < 300; ++c) d.set(5, c, 1.0f + float(c % 7));  // a dense row -> dense column
    auto hy = Sparse::hybrid(70, 300, 16, 70);
    convert_ok(h, d, *hy, TW_CONVERT_PLAIN, TW_STATUS_SUCCESS);
    auto ht = Sparse::hybrid(300, 70, 8, 300);
    TW_REQUIRE_OK(h, twSparseTranspose(h, *hy, *ht));
    TW_REQUIRE_OK(h, twSpMatValidate(h, *ht));
    Dense back(300, 70, TW_R_16BF);
    back.poison();
    TW_REQUIRE_OK(h, twSparseToDense(h, *ht, back));
    for (int64_t r = 0; r < 70; ++r)
        for (int64_t c = 0; c < 300; ++c) REQUIRE(back.bits(c, r) == d.bits(r, c));
}

TEST_CASE("a stored +0 entry (legal) is no value when re-packed or transposed", "[conversions]") {
    // one TwELL row of 10 entries, the fifth holding +0: 9 values
    Handle h;
    auto tw = Sparse::twell(1, 64, TW_R_16BF, 64, 2);
    uint32_t *w = tw->words();
    w[0] = 10;  // header: 10 entries
    for (uint32_t i = 0; i < 10; ++i) w[1 + i] = twblas::twell_entry(3 * i, i == 4 ? 0x0000 : 0x3f80);
    w[32] = 0;  // overflow record: empty
    TW_REQUIRE_OK(h, twSpMatValidate(h, *tw));
    Dense want(1, 64, TW_R_16BF);
    TW_REQUIRE_OK(h, twSparseToDense(h, *tw, want));

    auto hy = Sparse::hybrid(1, 64, 8, 1);  // 9 values > E = 8: a backup row
    TW_REQUIRE_OK(h, twSparseConvert(h, *tw, *hy));
    TW_REQUIRE_OK(h, twSpMatValidate(h, *hy));
    CHECK(info_of(h, *hy).nnz == 9);
    Dense back(1, 64, TW_R_16BF);
    back.poison();
    TW_REQUIRE_OK(h, twSparseToDense(h, *hy, back));
    require_same_bits(want, back);

    auto tr = Sparse::hybrid(64, 1, 8, 64);
    TW_REQUIRE_OK(h, twSparseTranspose(h, *tw, *tr));
    TW_REQUIRE_OK(h, twSpMatValidate(h, *tr));
    CHECK(info_of(h, *tr).nnz == 9);
}
