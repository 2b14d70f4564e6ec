// The formats bit by bit: the worked example of docs/formats.md, hand-built hybrid rows, the
// overflow rules, and the validator on corrupted buffers.
#include "test_support.hpp"

using namespace twtest;

namespace {

/// 1 x 512 bf16 row with 1.5 at column 3, 0.25 at 200 and 2.0 at 300 (docs/formats.md).
std::unique_ptr<Dense> worked_example_row() {
    auto d = std::make_unique<Dense>(1, 512, TW_R_16BF);
    std::fill(d->storage.begin(), d->storage.end(), 0u);
    d->set(0, 3, 1.5f);
    d->set(0, 200, 0.25f);
    d->set(0, 300, 2.0f);
    return d;
}

/// 3 x 20 bf16: row 0 = 1.0 at column 5, -2.0 at 17; row 1 empty; row 2 = 1..12 at columns 4..15.
std::unique_ptr<Dense> hybrid_example() {
    auto d = std::make_unique<Dense>(3, 20, TW_R_16BF);
    std::fill(d->storage.begin(), d->storage.end(), 0u);
    d->set(0, 5, 1.0f);
    d->set(0, 17, -2.0f);
    for (int c = 0; c < 12; ++c) d->set(2, c + 4, float(c + 1));
    return d;
}

twStatus_t convert(twHandle_t h, twDnMatDescr_t in, twSpMatDescr_t out, twConvertOp_t op = TW_CONVERT_PLAIN) {
    size_t bytes = 0;
    if (twDenseToSparse_bufferSize(h, in, out, op, &bytes) != TW_STATUS_SUCCESS) return TW_STATUS_INTERNAL_ERROR;
    std::vector<uint8_t> ws(bytes + 1);
    const twStatus_t a = twDenseToSparse_analysis(h, in, out, op, ws.data());
    if (a != TW_STATUS_SUCCESS && a != TW_STATUS_CAPACITY_EXCEEDED) return a;
    const twStatus_t c = twDenseToSparse_convert(h, in, out, op, ws.data());
    REQUIRE(c == a);  // the analysis predicts the conversion's outcome
    return c;
}

}  // namespace

TEST_CASE("TwELL buffer size follows the layout", "[formats]") {
    size_t bytes = 0;
    REQUIRE(twTwellBufferSize(16384, 5632, 256, 8, &bytes) == TW_STATUS_SUCCESS);
    CHECK(bytes == (16384u * 704u + 1u + 16384u) * 4u);  // 2816 bytes a row + the overflow record
    REQUIRE(twTwellBufferSize(3, 300, 128, 4, &bytes) == TW_STATUS_SUCCESS);
    CHECK(bytes == (3u * 3u * 32u + 1u + 3u) * 4u);  // 3 tiles (last partial) of 32 words
    REQUIRE(twTwellBufferSize(0, 0, 64, 2, &bytes) == TW_STATUS_SUCCESS);
    CHECK(bytes == 4u);
}

TEST_CASE("dense -> TwELL reproduces the worked example of formats.md bit for bit", "[formats]") {
    Handle h;
    auto dense = worked_example_row();
    auto tw = Sparse::twell(1, 512);
    REQUIRE(convert(h, *dense, *tw) == TW_STATUS_SUCCESS);
    const uint32_t *w = tw->words();
    CHECK(w[0] == 0x00000002u);
    CHECK(w[1] == 0x3FC00003u);
    CHECK(w[2] == 0x3E8000C8u);
    CHECK(w[32] == 0x00000001u);
    CHECK(w[33] == 0x4000012Cu);
    CHECK(w[64] == 0u);  // overflow record: no rows
    TW_REQUIRE_OK(h, twSpMatValidate(h, *tw));
    const twSpMatInfo_t info = info_of(h, *tw);
    CHECK(info.nnz == 3);
    CHECK(info.maxRowNnz == 3);
    CHECK(info.overflowRows == 0);
    CHECK(info.droppedValues == 0);

    // and back, bit-exact
    Dense back(1, 512, TW_R_16BF);
    back.poison();
    TW_REQUIRE_OK(h, twSparseToDense(h, *tw, back));
    for (int64_t c = 0; c < 512; ++c) REQUIRE(back.bits(0, c) == dense->bits(0, c));
}

TEST_CASE("TwELL entries written by hand decode in any order", "[formats]") {
    Handle h;
    auto tw = Sparse::twell(1, 512);
    uint32_t *w = tw->words();
    w[0] = 2;
    w[1] = 0x3E8000C8u;  // column 200 first: order inside a block is unspecified
    w[2] = 0x3FC00003u;
    w[32] = 1;
    w[33] = 0x4000012Cu;
    w[64] = 0;
    TW_REQUIRE_OK(h, twSpMatValidate(h, *tw));
    Dense out(1, 512, TW_R_16BF);
    TW_REQUIRE_OK(h, twSparseToDense(h, *tw, out));
    auto want = worked_example_row();
    for (int64_t c = 0; c < 512; ++c) REQUIRE(out.bits(0, c) == want->bits(0, c));
}

TEST_CASE("a hybrid row holds its entries in ELL slots, a heavy row densely", "[formats]") {
    Handle h;
    // 3 rows x 20 columns, E = 8, B = 1: row 0 has 2 entries, row 1 none, row 2 has 12 (> E)
    auto example = hybrid_example();
    const Dense &d = *example;
    auto hy = Sparse::hybrid(3, 20, 8, 1);
    REQUIRE(convert(h, d, *hy) == TW_STATUS_SUCCESS);
    TW_REQUIRE_OK(h, twSpMatValidate(h, *hy));

    // the layout: arrays at 256-byte boundaries (docs/formats.md)
    const uint8_t *b = hy->buffer;
    const int32_t *row_nnz = reinterpret_cast<const int32_t *>(b);
    CHECK(row_nnz[0] == 2);
    CHECK(row_nnz[1] == 0);
    CHECK(row_nnz[2] == 12);
    const uint16_t *ell_cols = reinterpret_cast<const uint16_t *>(b + 256);
    CHECK(ell_cols[0] == 5);
    CHECK(ell_cols[1] == 17);
    const uint16_t *ell_vals = reinterpret_cast<const uint16_t *>(b + 512);
    CHECK(ell_vals[0] == 0x3F80);
    CHECK(ell_vals[1] == 0xC000);
    CHECK(*reinterpret_cast<const int32_t *>(b + 768) == 1);    // backup_count
    CHECK(*reinterpret_cast<const int32_t *>(b + 1024) == 2);   // backup_rows[0] = row 2
    const int32_t *map = reinterpret_cast<const int32_t *>(b + 1280);
    CHECK(map[0] == -1);
    CHECK(map[1] == -1);
    CHECK(map[2] == 0);
    const uint16_t *backup = reinterpret_cast<const uint16_t *>(b + 1536);
    CHECK(backup[3] == 0);
    CHECK(backup[4] == 0x3F80);   // 1.0
    CHECK(backup[15] == 0x4140);  // 12.0
    const twSpMatInfo_t info = info_of(h, *hy);
    CHECK(info.nnz == 14);
    CHECK(info.maxRowNnz == 12);
    CHECK(info.overflowRows == 1);

    Dense back(3, 20, TW_R_16BF);
    back.poison();
    TW_REQUIRE_OK(h, twSparseToDense(h, *hy, back));
    for (int64_t r = 0; r < 3; ++r)
        for (int64_t c = 0; c < 20; ++c) REQUIRE(back.bits(r, c) == d.bits(r, c));
}

TEST_CASE("a TwELL tile over capacity is flagged and recorded, never silently dropped", "[formats][overflow]") {
    Handle h;
    // row 1 has 40 non-zeros in tile 0 (31 slots at T = 256, C = 8); rows 0 and 2 are light
    Dense d(3, 300, TW_R_16BF);
    std::fill(d.storage.begin(), d.storage.end(), 0u);
    d.set(0, 7, 1.0f);
    for (int c = 0; c < 40; ++c) d.set(1, 3 * c, 0.5f + c);
    d.set(1, 290, 3.0f);
    d.set(2, 299, -1.0f);
    auto tw = Sparse::twell(3, 300);
    REQUIRE(convert(h, d, *tw) == TW_STATUS_CAPACITY_EXCEEDED);
    INFO(twGetErrorMessage(h));
    CHECK(std::string(twGetErrorMessage(h)).find("31") != std::string::npos);

    const uint32_t *w = tw->words();
    const int64_t ld = 2 * 32;
    CHECK(w[ld + 0] == (0x80000000u | 31u));  // row 1, tile 0: full and flagged
    for (int i = 0; i < 31; ++i) CHECK((w[ld + 1 + i] & 0xFFFF) == uint32_t(3 * i));  // first 31, ascending
    CHECK(w[ld + 32] == 1u);                 // row 1, tile 1: its one entry, not flagged
    CHECK(w[3 * ld] == 1u);                  // overflow record: one row ...
    CHECK(w[3 * ld + 1] == 1u);              // ... row 1
    TW_REQUIRE_OK(h, twSpMatValidate(h, *tw));
    const twSpMatInfo_t info = info_of(h, *tw);
    CHECK(info.overflowRows == 1);
    CHECK(info.droppedValues == 0);

    // consumers refuse the incomplete object rather than return an inexact result
    Dense back(3, 300, TW_R_16BF);
    back.poison();
    const auto before = back.storage;
    CHECK(twSparseToDense(h, *tw, back) == TW_STATUS_INCOMPLETE_INPUT);
    CHECK(back.storage == before);

    // with C = 2 (127 slots) the same data fits
    auto wide = Sparse::twell(3, 300, TW_R_16BF, 256, 2);
    CHECK(convert(h, d, *wide) == TW_STATUS_SUCCESS);
    TW_REQUIRE_OK(h, twSparseToDense(h, *wide, back));
    for (int64_t r = 0; r < 3; ++r)
        for (int64_t c = 0; c < 300; ++c) REQUIRE(back.bits(r, c) == d.bits(r, c));
}

TEST_CASE("a hybrid with too few backup rows records every heavy row", "[formats][overflow]") {
    Handle h;
    Dense d(4, 40, TW_R_16BF);
    std::fill(d.storage.begin(), d.storage.end(), 0u);
    for (int r = 0; r < 4; ++r)
        for (int c = 0; c < (r == 0 ? 3 : 20); ++c) d.set(r, c, 1.0f + c);  // rows 1..3 exceed E = 8
    auto hy = Sparse::hybrid(4, 40, 8, 2);
    REQUIRE(convert(h, d, *hy) == TW_STATUS_CAPACITY_EXCEEDED);
    TW_REQUIRE_OK(h, twSpMatValidate(h, *hy));
    const twSpMatInfo_t info = info_of(h, *hy);
    CHECK(info.overflowRows == 3);  // recorded past the capacity of 2
    CHECK(info.nnz == 3 + 20 + 20);
    Dense back(4, 40, TW_R_16BF);
    CHECK(twSparseToDense(h, *hy, back) == TW_STATUS_INCOMPLETE_INPUT);
}

TEST_CASE("the validator reports the first violation of a corrupted TwELL buffer", "[formats][validate]") {
    Handle h;
    auto dense = worked_example_row();
    auto tw = Sparse::twell(1, 512);
    REQUIRE(convert(h, *dense, *tw) == TW_STATUS_SUCCESS);
    uint32_t *w = tw->words();
    const std::vector<uint32_t> good(w, w + 65);
    auto expect_violation = [&](const char *what, const char *needle) {
        INFO(what);
        const twStatus_t s = twSpMatValidate(h, *tw);
        CHECK(s == TW_STATUS_INVALID_VALUE);
        const std::string msg = twGetErrorMessage(h);
        INFO(msg);
        CHECK(msg.find(needle) != std::string::npos);
        std::copy(good.begin(), good.end(), w);
        TW_REQUIRE_OK(h, twSpMatValidate(h, *tw));
    };
    w[32] = 32;  // count > 31 slots
    expect_violation("count > slots", "row 0, tile 1, slot 0: count 32 exceeds the 31 slots");
    w[33] = 0x40000005u;  // column 5 in tile 1
    expect_violation("column outside its tile", "row 0, tile 1, slot 1: column 5 lies outside the tile [256, 512)");
    w[2] = 0x3E800003u;  // column 3 twice in tile 0
    expect_violation("duplicate column", "row 0, tile 0, slot 2: duplicate column 3");
    w[0] = 2u | (1u << 20);  // reserved header bit
    expect_violation("reserved bits", "row 0, tile 0, slot 0: reserved header bits");
    w[0] = 31u | 0x80000000u;  // overflow bit but the row is not in the record (count also wrong)
    for (int i = 3; i <= 31; ++i) w[i] = 0x3F800000u | uint32_t(i + 10);
    expect_violation("overflow bit without record", "row 0: overflow bit set but the row is not listed");
    w[64] = 1;
    w[65 - 0] = 0;  // record lists row 0 though no tile overflowed
    expect_violation("record without overflow bit", "row 0: overflow bit clear but the row is listed");
    w[64] = 2;  // more rows listed than exist
    expect_violation("record count", "overflow record lists 2 rows");
}

TEST_CASE("the validator reports the first violation of a corrupted hybrid buffer", "[formats][validate]") {
    Handle h;
    auto example = hybrid_example();
    const Dense &d = *example;
    auto hy = Sparse::hybrid(3, 20, 8, 1);
    REQUIRE(convert(h, d, *hy) == TW_STATUS_SUCCESS);
    const std::vector<uint8_t> good(hy->buffer, hy->buffer + hy->bytes);
    auto expect_violation = [&](const char *needle) {
        CHECK(twSpMatValidate(h, *hy) == TW_STATUS_INVALID_VALUE);
        const std::string msg = twGetErrorMessage(h);
        INFO(msg);
        CHECK(msg.find(needle) != std::string::npos);
        std::copy(good.begin(), good.end(), hy->buffer);
        TW_REQUIRE_OK(h, twSpMatValidate(h, *hy));
    };
    int32_t *row_nnz = reinterpret_cast<int32_t *>(hy->buffer);
    uint16_t *ell_cols = reinterpret_cast<uint16_t *>(hy->buffer + 256);
    int32_t *map = reinterpret_cast<int32_t *>(hy->buffer + 1280);
    uint16_t *backup = reinterpret_cast<uint16_t *>(hy->buffer + 1536);
    ell_cols[1] = 25;
    expect_violation("row 0, slot 1: column 25 >= cols = 20");
    ell_cols[1] = 5;
    expect_violation("row 0, slot 1: duplicate column 5");
    row_nnz[1] = 21;
    expect_violation("row 1: row_nnz 21 outside [0, cols = 20]");
    map[2] = -1;
    expect_violation("backup slot 0 holds row 2 but backup_map[2] = -1");
    backup[0] = 0x3F80;  // an extra non-zero in the backup row
    expect_violation("row 2: backup row holds 13 non-zeros, row_nnz says 12");
}
