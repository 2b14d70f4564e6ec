// The CUDA backend's inspection and conversions (src/device/container_ops.cu) against the CPU
// reference: the same statuses and messages, the same container bits wherever the format gives
// them a meaning, the same dense values. Then validation of corrupted containers (verdict and
// message from the device search must be the reference's), and matrices of a million rows for
// every tile width and compression, checked by round trips on the GPU.
#include <algorithm>
#include <cstring>
#include <random>
#include <string>

#include "backend_support.hpp"
#include "cuda_test_support.hpp"

using namespace twtest;

namespace {

/// A container: TwELL(tile, compression) or hybrid(ELL width, backup rows).
struct Spec {
    bool twell;
    int32_t a;
    int64_t b;
};

twSpMatDescr_t make(Buffers &buf, const Spec &s, int64_t rows, int64_t cols, twDataType_t t) {
    return s.twell ? buf.twell(rows, cols, t, s.a, static_cast<int32_t>(s.b)) : buf.hybrid(rows, cols, s.a, s.b, t);
}

/// The layouts of docs/formats.md, derived here from the spec (not from the library's code).
struct TwellWords {
    int64_t rows, cols, tile, slots, words_per_block, tiles, ld;
    TwellWords(int64_t r, int64_t c, int64_t t, int64_t comp)
        : rows(r), cols(c), tile(t), slots(t / comp - 1), words_per_block(t / comp), tiles((c + t - 1) / t),
          ld(tiles * words_per_block) {}
    size_t block(int64_t r, int64_t t) const { return static_cast<size_t>(r * ld + t * words_per_block); }
    size_t record() const { return static_cast<size_t>(rows * ld); }
};
struct HybridBytes {  // byte offsets, each array on a 256-byte boundary
    size_t row_nnz, ell_cols, ell_vals, backup_count, backup_row_ids, backup_map, backup_vals;
    int64_t ell_width, backup_rows;
    HybridBytes(int64_t rows, int64_t cols, int64_t e, int64_t b, size_t vb) : ell_width(e), backup_rows(b) {
        size_t at = 0;
        auto take = [&](size_t bytes) {
            const size_t here = at;
            at = (at + bytes + 255) / 256 * 256;
            return here;
        };
        row_nnz = take(static_cast<size_t>(rows) * 4);
        ell_cols = take(static_cast<size_t>(rows * e) * 2);
        ell_vals = take(static_cast<size_t>(rows * e) * vb);
        backup_count = take(4);
        backup_row_ids = take(static_cast<size_t>(b) * 4);
        backup_map = take(static_cast<size_t>(rows) * 4);
        backup_vals = take(static_cast<size_t>(b * cols) * vb);
    }
};

/// A call's status and, when it failed, its message.
struct Outcome {
    twStatus_t status = TW_STATUS_SUCCESS;
    std::string message;
    bool operator==(const Outcome &o) const { return status == o.status && message == o.message; }
};
std::ostream &operator<<(std::ostream &os, const Outcome &o) { return os << twGetStatusName(o.status) << " " << o.message; }
Outcome outcome(twHandle_t h, twStatus_t s) { return {s, s == TW_STATUS_SUCCESS ? "" : twGetErrorMessage(h)}; }

/// The words of a container that carry meaning (docs/formats.md): block headers and their first
/// `count` entries, the record; row counts, maps, the first `n` ELL entries of each row, the
/// backup count, ids and filled backup rows. Slots past a count are free and not compared.
std::vector<uint32_t> meaningful(const std::vector<uint32_t> &w, const Spec &s, int64_t rows, int64_t cols, twDataType_t t) {
    std::vector<uint32_t> out;
    if (s.twell) {
        const TwellWords l(rows, cols, s.a, s.b);
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t tile = 0; tile < l.tiles; ++tile) {
                const size_t at = l.block(r, tile);
                const int64_t count = std::min<int64_t>(w[at] & 0xffffu, l.slots);
                out.insert(out.end(), w.begin() + at, w.begin() + at + 1 + count);
            }
        const size_t rec = l.record();
        const int64_t listed = std::min<int64_t>(w[rec], rows);
        out.insert(out.end(), w.begin() + rec, w.begin() + rec + 1 + listed);
        return out;
    }
    const size_t vb = t == TW_R_32F ? 4 : 2;
    const HybridBytes l(rows, cols, s.a, s.b, vb);
    const auto *base = reinterpret_cast<const uint8_t *>(w.data());
    auto i32 = [&](size_t off, int64_t i) { return reinterpret_cast<const int32_t *>(base + off)[i]; };
    auto val = [&](size_t off, int64_t i) -> uint32_t {
        return vb == 4 ? reinterpret_cast<const uint32_t *>(base + off)[i] : reinterpret_cast<const uint16_t *>(base + off)[i];
    };
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t n = i32(l.row_nnz, r);
        out.push_back(static_cast<uint32_t>(n));
        out.push_back(static_cast<uint32_t>(i32(l.backup_map, r)));
        if (n <= l.ell_width)
            for (int64_t i = 0; i < n; ++i) {
                out.push_back(reinterpret_cast<const uint16_t *>(base + l.ell_cols)[r * l.ell_width + i]);
                out.push_back(val(l.ell_vals, r * l.ell_width + i));
            }
    }
    const int64_t needed = i32(l.backup_count, 0);
    out.push_back(static_cast<uint32_t>(needed));
    for (int64_t slot = 0; slot < std::min(needed, l.backup_rows); ++slot) {
        out.push_back(static_cast<uint32_t>(i32(l.backup_row_ids, slot)));
        for (int64_t c = 0; c < cols; ++c) out.push_back(val(l.backup_vals, slot * cols + c));
    }
    return out;
}

/// Bit patterns at the edges of what a conversion keeps, of a 16-bit type or fp32: -0, NaNs of
/// both signs (the quiet ones and those just past infinity), both infinities, the smallest
/// subnormals and the largest finite values.
std::vector<uint32_t> edge_patterns(twDataType_t t) {
    if (t == TW_R_16BF) return {0x8000, 0x7fc0, 0xffc0, 0x7f81, 0xff81, 0x7f80, 0xff80, 0x0001, 0x8001, 0x7f7f, 0xff7f};
    if (t == TW_R_16F) return {0x8000, 0x7e00, 0xfe00, 0x7c01, 0xfc01, 0x7c00, 0xfc00, 0x0001, 0x8001, 0x7bff, 0xfbff};
    return {0x80000000u, 0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7f800000u, 0xff800000u,
            0x00000001u, 0x80000001u, 0x7f7fffffu, 0xff7fffffu};
}

/// A random dense matrix: about `density` non-zeros (with -0.0, NaN and the other edge
/// patterns), and every `heavy`-th row (when heavy > 0) mostly non-zero. Rows `pad` columns
/// longer than `cols` hold non-zeros past the end, which no conversion may read.
std::unique_ptr<Dense> random_dense(int64_t rows, int64_t cols, twDataType_t t, double density, int64_t heavy,
                                    uint64_t seed, int64_t pad = 0) {
    auto out = std::make_unique<Dense>(rows, cols, t, TW_ORDER_ROW, pad);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = cols; c < cols + pad; ++c) out->set(r, c, 1.0f);
    Dense &d = *out;
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> u01(0.0, 1.0);
    std::normal_distribution<float> n01;
    const std::vector<uint32_t> edges = edge_patterns(t);
    for (int64_t r = 0; r < rows; ++r) {
        const double p = heavy > 0 && r % heavy == heavy - 1 ? 0.8 : density;
        for (int64_t c = 0; c < cols; ++c) {
            const float v = u01(rng) < p ? n01(rng) : 0.0f;
            const double special = u01(rng);
            if (special < 0.002)
                d.set(r, c, -0.0f);
            else if (special < 0.004)
                d.set_bits(r, c, edges[static_cast<size_t>(rng() % edges.size())]);
            else
                d.set(r, c, v);
        }
    }
    return out;
}

/// One backend's run of every conversion on the same inputs.
struct Run {
    Outcome analysis, convert, validate, to_dense, repack, transpose;
    twSpMatInfo_t info{};
    std::vector<uint32_t> container, repacked, transposed;  // meaningful words
    std::vector<uint32_t> dense;                           // twSparseToDense's bits (when it succeeded)
};

Run run_all(twBackend_t backend, const Dense &in, const Spec &spec, twConvertOp_t op, const Spec &other,
            const Spec *transpose_spec) {
    Handle h(backend);
    Buffers buf(backend);
    Run out;
    const twDnMatDescr_t din = buf.input(in);
    const twSpMatDescr_t s = make(buf, spec, in.rows, in.cols, in.type);
    size_t bytes = 0;
    TW_REQUIRE_OK(h, twDenseToSparse_bufferSize(h, din, s, op, &bytes));
    void *ws = buf.memory(bytes);
    out.analysis = outcome(h, twDenseToSparse_analysis(h, din, s, op, ws));
    out.convert = outcome(h, twDenseToSparse_convert(h, din, s, op, ws));
    out.container = meaningful(buf.words(s), spec, in.rows, in.cols, in.type);
    out.info = info_of(h, s);
    out.validate = outcome(h, twSpMatValidate(h, s));

    Dense back(in.rows, in.cols, in.type);
    back.poison();
    Buffers local(backend);
    out.to_dense = outcome(h, twSparseToDense(h, s, local.output(back)));
    local.fetch();
    for (int64_t r = 0; r < back.rows; ++r)
        for (int64_t c = 0; c < back.cols; ++c) out.dense.push_back(back.bits(r, c));

    const twSpMatDescr_t o = make(buf, other, in.rows, in.cols, in.type);
    out.repack = outcome(h, twSparseConvert(h, s, o));
    if (out.repack.status != TW_STATUS_INCOMPLETE_INPUT)
        out.repacked = meaningful(buf.words(o), other, in.rows, in.cols, in.type);
    if (transpose_spec) {
        const twSpMatDescr_t tr = make(buf, *transpose_spec, in.cols, in.rows, in.type);
        out.transpose = outcome(h, twSparseTranspose(h, s, tr));
        if (out.transpose.status != TW_STATUS_INCOMPLETE_INPUT)
            out.transposed = meaningful(buf.words(tr), *transpose_spec, in.cols, in.rows, in.type);
    }
    return out;
}

void require_same(const Run &gpu, const Run &cpu) {
    CHECK(gpu.analysis == cpu.analysis);
    CHECK(gpu.convert == cpu.convert);
    CHECK(gpu.validate == cpu.validate);
    CHECK(gpu.info.nnz == cpu.info.nnz);
    CHECK(gpu.info.maxRowNnz == cpu.info.maxRowNnz);
    CHECK(gpu.info.overflowRows == cpu.info.overflowRows);
    CHECK(gpu.to_dense == cpu.to_dense);
    CHECK(gpu.repack == cpu.repack);
    CHECK(gpu.transpose == cpu.transpose);
    REQUIRE(gpu.container == cpu.container);
    REQUIRE(gpu.dense == cpu.dense);  // poison where the call refused: the output stayed untouched
    REQUIRE(gpu.repacked == cpu.repacked);
    REQUIRE(gpu.transposed == cpu.transposed);
}

}  // namespace

TEST_CASE("CUDA conversions: statuses, messages and bits of the reference", "[cuda][conversions]") {
    struct Shape {
        int64_t rows, cols, heavy, pad;
    };
    // 97 x 1003 and 5 x 5636 have rows on 16 bytes that end inside a chunk of eight columns
    const Shape shapes[] = {{1, 1, 0, 0},        {7, 257, 3, 0},    {333, 1000, 50, 0}, {1000, 300, 0, 0},
                            {2049, 5632, 400, 0}, {97, 1003, 13, 5}, {5, 5636, 0, 4},    {0, 40, 0, 0}};
    uint64_t seed = 11;
    for (const Shape &sh : shapes)
        for (twDataType_t t : {TW_R_16BF, TW_R_16F, TW_R_32F})
            for (const Spec &spec : {Spec{true, 64, 2}, Spec{true, 128, 4}, Spec{true, 256, 8}, Spec{false, 16, std::min(sh.rows, sh.rows / 4 + 1)},
                                     Spec{false, 64, std::min<int64_t>(2, sh.rows)}}) {
                if (spec.twell && t == TW_R_32F) continue;  // TwELL holds 16-bit values
                const twConvertOp_t op = seed % 2 ? TW_CONVERT_RELU : TW_CONVERT_PLAIN;
                DYNAMIC_SECTION("rows " << sh.rows << " cols " << sh.cols << " type " << t << (spec.twell ? " TwELL " : " hybrid ")
                                        << spec.a << "/" << spec.b << " op " << op) {
                    const std::unique_ptr<Dense> dense = random_dense(sh.rows, sh.cols, t, 0.03, sh.heavy, ++seed, sh.pad);
                    const Dense &in = *dense;
                    // the re-packed container: the other format, all rows backed up
                    const Spec other = spec.twell || t == TW_R_32F ? Spec{false, 8, sh.rows} : Spec{true, 128, 2};
                    const Spec transposed{false, 16, sh.cols / 8 + 1};
                    const Spec *tr = sh.rows > 0 ? &transposed : nullptr;
                    const Run cpu = run_all(TW_BACKEND_CPU, in, spec, op, other, tr);
                    const Run gpu = run_all(TW_BACKEND_CUDA, in, spec, op, other, tr);
                    require_same(gpu, cpu);
                }
            }
}

namespace {

/// The words of container `sc` (CPU backend) after the reference converts `in` into it (analysis
/// and convert; their statuses are not asserted: a container too small is a case too).
std::vector<uint32_t> reference_words(twHandle_t hc, Buffers &bc, twSpMatDescr_t sc, const Dense &in) {
    size_t bytes = 0;
    const twDnMatDescr_t din = bc.input(in);
    REQUIRE(twDenseToSparse_bufferSize(hc, din, sc, TW_CONVERT_PLAIN, &bytes) == TW_STATUS_SUCCESS);
    void *ws = bc.memory(bytes);
    (void)twDenseToSparse_analysis(hc, din, sc, TW_CONVERT_PLAIN, ws);
    (void)twDenseToSparse_convert(hc, din, sc, TW_CONVERT_PLAIN, ws);
    return bc.words(sc);
}

/// Validation, twSparseToDense and info of the same words on both backends (CPU `sc`, GPU `sg`):
/// the same verdicts and messages, the same dense bits (the poison kept where the call refused:
/// the GPU's one-pass kernel obeys the device verdict), the same counts. Returns the CPU verdict.
Outcome require_same_inspection(twHandle_t hc, twSpMatDescr_t sc, twHandle_t hg, twSpMatDescr_t sg, int64_t rows,
                                int64_t cols) {
    const Outcome vc = outcome(hc, twSpMatValidate(hc, sc)), vg = outcome(hg, twSpMatValidate(hg, sg));
    REQUIRE(vg == vc);
    Dense dc(rows, cols, TW_R_16BF), dg(rows, cols, TW_R_16BF);
    dc.poison();
    dg.poison();
    Buffers out_g(TW_BACKEND_CUDA);
    const Outcome tc = outcome(hc, twSparseToDense(hc, sc, dc.d));
    const Outcome tg = outcome(hg, twSparseToDense(hg, sg, out_g.output(dg)));
    out_g.fetch();
    REQUIRE(tg == tc);
    REQUIRE(dg.storage == dc.storage);
    const twSpMatInfo_t ic = info_of(hc, sc), ig = info_of(hg, sg);
    CHECK(ig.nnz == ic.nnz);
    CHECK(ig.maxRowNnz == ic.maxRowNnz);
    CHECK(ig.overflowRows == ic.overflowRows);
    return vc;
}

}  // namespace

TEST_CASE("CUDA validation: corrupted containers get the reference's verdict and message", "[cuda][conversions]") {
    for (const Spec &spec : {Spec{true, 64, 4}, Spec{false, 16, 6}}) {
        const int64_t rows = 300, cols = 1000;
        const std::unique_ptr<Dense> dense = random_dense(rows, cols, TW_R_16BF, 0.01, 37, 5);
        const Dense &in = *dense;
        Handle hc(TW_BACKEND_CPU), hg(TW_BACKEND_CUDA);
        Buffers bc(TW_BACKEND_CPU), bg(TW_BACKEND_CUDA);
        const twSpMatDescr_t sc = make(bc, spec, rows, cols, TW_R_16BF), sg = make(bg, spec, rows, cols, TW_R_16BF);
        const std::vector<uint32_t> valid = reference_words(hc, bc, sc, in);
        const TwellWords tl(rows, cols, 64, 4);
        const HybridBytes hl(rows, cols, 16, 6, 2);
        std::mt19937_64 rng(99);
        int failures = 0;
        for (int trial = 0; trial < 600; ++trial) {
            std::vector<uint32_t> w = valid;
            // one word changed: anywhere, or where the invariants live (headers, record, counts, maps)
            size_t at = rng() % w.size();
            if (trial % 3 == 1) {
                at = spec.twell ? tl.block(static_cast<int64_t>(rng() % rows), static_cast<int64_t>(rng() % tl.tiles)) + (rng() % 3)
                                : (std::vector<size_t>{hl.row_nnz, hl.backup_map, hl.ell_cols, hl.backup_row_ids}[rng() % 4]) / 4 +
                                      rng() % rows;
            } else if (trial % 3 == 2) {
                at = spec.twell ? tl.record() + rng() % 8 : hl.backup_count / 4 + (rng() % 2) * (hl.backup_row_ids / 4 - hl.backup_count / 4) + rng() % 4;
            }
            at = std::min(at, w.size() - 1);
            switch (rng() % 4) {
            case 0: w[at] ^= 1u << (rng() % 32); break;
            case 1: w[at] = static_cast<uint32_t>(rng()); break;
            case 2: w[at] += 1; break;
            default: w[at] -= 1; break;
            }
            bc.write_words(sc, w);
            bg.write_words(sg, w);
            INFO("trial " << trial << " word " << at);
            failures += require_same_inspection(hc, sc, hg, sg, rows, cols).status != TW_STATUS_SUCCESS;
        }
        INFO("corruptions the validation refused: " << failures);
        CHECK(failures > 200);  // many changes break an invariant; the rest touch free slots or counts that stay legal
    }
}

TEST_CASE("CUDA TwELL: tiles with more than seven entries, validated and written by the whole warp",
          "[cuda][conversions]") {
    // Every third row fills its tiles with 8 .. S entries (llm-29's first tokens): the entries past
    // the seventh, which the validation and TwELL -> dense spread over the warp's lanes, over two
    // rounds of 32 tiles where T = 64 and several spans of the row; then single words of those
    // tails corrupted (a column repeated, a column outside its tile), which both must refuse.
    const int64_t rows = 150, cols = 2501;
    for (const int32_t tile : {64, 128, 256})
        for (const int32_t comp : {2, 4, 8}) {
            if (tile / comp - 1 < 8) continue;  // S = 7: no tile has a tail
            DYNAMIC_SECTION("T " << tile << " C " << comp) {
                const TwellWords tl(rows, cols, tile, comp);
                std::mt19937_64 rng(static_cast<uint64_t>(tile * 10 + comp));
                Dense in(rows, cols, TW_R_16BF);
                for (int64_t r = 0; r < rows; ++r)
                    for (int64_t t = 0; t < tl.tiles; ++t) {
                        const int64_t width = std::min<int64_t>(cols - t * tile, tile);
                        const int64_t full = std::min<int64_t>(width, tl.slots);
                        const int64_t n =
                            r % 3 == 0 ? std::min<int64_t>(full, 8 + static_cast<int64_t>(rng() % (tl.slots - 7)))
                                       : static_cast<int64_t>(rng() % 4);
                        std::vector<int64_t> at(static_cast<size_t>(width));
                        for (int64_t c = 0; c < width; ++c) at[static_cast<size_t>(c)] = t * tile + c;
                        std::shuffle(at.begin(), at.end(), rng);
                        for (int64_t i = 0; i < n; ++i)
                            in.set(r, at[static_cast<size_t>(i)], 1.0f + static_cast<float>(rng() % 64) / 8.0f);
                    }
                Handle hc(TW_BACKEND_CPU), hg(TW_BACKEND_CUDA);
                Buffers bc(TW_BACKEND_CPU), bg(TW_BACKEND_CUDA);
                const Spec spec{true, tile, comp};
                const twSpMatDescr_t sc = make(bc, spec, rows, cols, TW_R_16BF),
                                     sg = make(bg, spec, rows, cols, TW_R_16BF);
                const std::vector<uint32_t> valid = reference_words(hc, bc, sc, in);
                bg.write_words(sg, valid);
                REQUIRE(require_same_inspection(hc, sc, hg, sg, rows, cols).status == TW_STATUS_SUCCESS);
                int refused = 0;
                for (int trial = 0; trial < 30; ++trial) {
                    std::vector<uint32_t> w = valid;
                    int64_t r = 0, t = 0;
                    do {  // a block with a tail (a row's last tile may be narrower than 8 columns)
                        r = 3 * static_cast<int64_t>(rng() % (rows / 3));
                        t = static_cast<int64_t>(rng() % tl.tiles);
                    } while ((w[tl.block(r, t)] & 0xffffu) < 8);
                    const size_t block = tl.block(r, t);
                    const int64_t count = w[block] & 0xffffu;
                    const size_t i = block + 8 + rng() % static_cast<size_t>(count - 7);  // a word of the tail
                    if (trial % 2 == 0) {  // the column of an earlier entry of the block
                        const size_t j = block + 1 + rng() % (i - block - 1);
                        w[i] = (w[i] & 0xffff0000u) | (w[j] & 0xffffu);
                    } else {  // the first column past the tile, or the last before it
                        const int64_t col = t + 1 < tl.tiles ? (t + 1) * tile : t * tile - 1;
                        w[i] = (w[i] & 0xffff0000u) | static_cast<uint32_t>(col);
                    }
                    bc.write_words(sc, w);
                    bg.write_words(sg, w);
                    INFO("trial " << trial << " row " << r << " tile " << t);
                    refused += require_same_inspection(hc, sc, hg, sg, rows, cols).status != TW_STATUS_SUCCESS;
                }
                CHECK(refused == 30);
            }
        }
}

TEST_CASE("CUDA conversions: a TwELL buffer on 4 bytes, not 16", "[cuda][conversions]") {
    // formats.md asks only 4-byte alignment of a buffer; the device readers of a block's head and
    // its entries past the seventh take 16-byte loads only where the buffer allows them, and must
    // give the same verdicts, counts and values from a buffer 4 bytes into an allocation
    const int64_t rows = 200, cols = 700;
    // ~210 values a row: tiles of 19 to 77 entries, past the seventh; they fit compression 2, and
    // overflow T = 256, C = 8 (the record and INCOMPLETE_INPUT)
    const std::unique_ptr<Dense> dense = random_dense(rows, cols, TW_R_16BF, 0.3, 0, 21);
    const Dense &in = *dense;
    for (const Spec &spec : {Spec{true, 64, 2}, Spec{true, 128, 2}, Spec{true, 256, 2}, Spec{true, 256, 8}}) {
        INFO("T " << spec.a << " C " << spec.b);
        Handle hc(TW_BACKEND_CPU), hg(TW_BACKEND_CUDA);
        Buffers bc(TW_BACKEND_CPU), bg(TW_BACKEND_CUDA);
        const twSpMatDescr_t sc = make(bc, spec, rows, cols, TW_R_16BF);
        const std::vector<uint32_t> valid = reference_words(hc, bc, sc, in);

        size_t twell_bytes = 0;
        REQUIRE(twTwellBufferSize(rows, cols, spec.a, static_cast<int32_t>(spec.b), &twell_bytes) == TW_STATUS_SUCCESS);
        void *shifted = static_cast<uint8_t *>(bg.memory(twell_bytes + 16)) + 4;
        twSpMatDescr_t sg = nullptr;
        REQUIRE(twCreateTwell(&sg, rows, cols, spec.a, static_cast<int32_t>(spec.b), shifted, TW_R_16BF) == TW_STATUS_SUCCESS);
        const TwellWords tl(rows, cols, spec.a, spec.b);
        std::mt19937_64 rng(7);
        for (int trial = 0; trial < 40; ++trial) {
            std::vector<uint32_t> w = valid;
            if (trial > 0) {  // one header or entry word changed (trial 0: the valid container)
                const size_t at = tl.block(static_cast<int64_t>(rng() % rows), static_cast<int64_t>(rng() % tl.tiles)) +
                                  rng() % std::min<int64_t>(12, tl.words_per_block);
                w[at] ^= 1u << (rng() % 32);
            }
            bc.write_words(sc, w);
            bg.write(shifted, w);
            INFO("trial " << trial);
            (void)require_same_inspection(hc, sc, hg, sg, rows, cols);
        }
        // some tile holds more than seven entries: the readers' tails ran
        CHECK(info_of(hc, sc).maxRowNnz > 7 * tl.tiles);
        twDestroySpMat(sg);
    }
}

namespace {

/// A cheap deterministic pattern for very large matrices: about 1 in `every` elements non-zero.
uint16_t big_value(uint64_t i, uint64_t every) {
    uint64_t z = i + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return z % every ? 0 : static_cast<uint16_t>(0x3f80u + (z >> 40) % 0x7f);  // positive bf16 in [1, 2)
}

}  // namespace

TEST_CASE("CUDA conversions: a million rows, every tile width and compression", "[cuda][conversions][large]") {
    const int64_t rows = 1 << 20, cols = 1031;
    Dense in(rows, cols, TW_R_16BF);
    auto *v = reinterpret_cast<uint16_t *>(in.storage.data());
    for (int64_t i = 0; i < rows * cols; ++i) v[i] = big_value(static_cast<uint64_t>(i), 97);
    // non-zeros per (row, 64-column tile), from which every tile width's counts follow
    const int64_t tiles64 = (cols + 63) / 64;
    std::vector<uint8_t> per64(static_cast<size_t>(rows * tiles64), 0);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) per64[static_cast<size_t>(r * tiles64 + c / 64)] += v[r * cols + c] != 0;
    Handle h(TW_BACKEND_CUDA);
    Buffers buf(TW_BACKEND_CUDA);
    const twDnMatDescr_t din = buf.input(in);
    for (const int32_t tile : {64, 128, 256})
        for (const int32_t comp : {2, 4, 8}) {
            DYNAMIC_SECTION("T " << tile << " C " << comp) {
                const TwellWords l(rows, cols, tile, comp);
                int64_t nnz = 0, over_rows = 0;
                for (int64_t r = 0; r < rows; ++r) {
                    bool over = false;
                    for (int64_t t = 0; t < l.tiles; ++t) {
                        int64_t n = 0;
                        for (int64_t q = t * tile / 64; q < std::min(tiles64, (t + 1) * tile / 64); ++q)
                            n += per64[static_cast<size_t>(r * tiles64 + q)];
                        over |= n > l.slots;
                        nnz += std::min<int64_t>(n, l.slots);
                    }
                    over_rows += over;
                }
                Buffers local(TW_BACKEND_CUDA);
                const twSpMatDescr_t s = local.twell(rows, cols, TW_R_16BF, tile, comp);
                size_t bytes = 0;
                TW_REQUIRE_OK(h, twDenseToSparse_bufferSize(h, din, s, TW_CONVERT_RELU, &bytes));
                void *ws = local.memory(bytes);
                const twStatus_t want = over_rows ? TW_STATUS_CAPACITY_EXCEEDED : TW_STATUS_SUCCESS;
                REQUIRE(twDenseToSparse_analysis(h, din, s, TW_CONVERT_RELU, ws) == want);
                REQUIRE(twDenseToSparse_convert(h, din, s, TW_CONVERT_RELU, ws) == want);
                TW_REQUIRE_OK(h, twSpMatValidate(h, s));
                const twSpMatInfo_t info = info_of(h, s);
                CHECK(info.nnz == nnz);
                CHECK(info.overflowRows == over_rows);
                // the round trips move the matrix over PCIe four times: two (T, C) pairs only
                if (over_rows || !((tile == 64 && comp == 2) || (tile == 256 && comp == 8))) return;
                Dense back(rows, cols, TW_R_16BF);
                auto round_trip = [&](twSpMatDescr_t from) {
                    back.poison();
                    Buffers out(TW_BACKEND_CUDA);
                    TW_REQUIRE_OK(h, twSparseToDense(h, from, out.output(back)));
                    out.fetch();
                    REQUIRE(std::memcmp(back.storage.data(), in.storage.data(), static_cast<size_t>(rows * cols) * 2) == 0);
                };
                round_trip(s);
                // and re-packed into a hybrid (about 11 values per row: all in the ELL part)
                const twSpMatDescr_t hy = local.hybrid(rows, cols, 32, rows / 64, TW_R_16BF);
                TW_REQUIRE_OK(h, twSparseConvert(h, s, hy));
                TW_REQUIRE_OK(h, twSpMatValidate(h, hy));
                round_trip(hy);
            }
        }
}

TEST_CASE("CUDA TwELL -> dense returns with its verdict; a call on another stream does not disturb the rows still being written",
          "[cuda][conversions]") {
    // twSparseToDense returns once the device has posted its verdict and writes the rows in the
    // stream's order; the writer reads that verdict from the handle's result slot until its last
    // block. Inspections on another stream reuse the slots (the second one writes a refusal into
    // the slot the writer reads) and must wait for it first.
    const int64_t rows = 40000, cols = 1500;
    const std::unique_ptr<Dense> dense = random_dense(rows, cols, TW_R_16BF, 0.01, 0, 41);
    const Dense &in = *dense;
    Handle h(TW_BACKEND_CUDA);
    Buffers b(TW_BACKEND_CUDA);
    const twSpMatDescr_t s = b.twell(rows, cols, TW_R_16BF, 256, 8);
    size_t bytes = 0;
    const twDnMatDescr_t din = b.input(in);
    TW_REQUIRE_OK(h, twDenseToSparse_bufferSize(h, din, s, TW_CONVERT_PLAIN, &bytes));
    void *ws = b.memory(bytes);
    TW_REQUIRE_OK(h, twDenseToSparse_analysis(h, din, s, TW_CONVERT_PLAIN, ws));
    TW_REQUIRE_OK(h, twDenseToSparse_convert(h, din, s, TW_CONVERT_PLAIN, ws));
    // a small TwELL whose first block claims more entries than it has slots
    const TwellWords tl(8, 300, 64, 4);
    const twSpMatDescr_t bad = b.twell(8, 300, TW_R_16BF, 64, 4);
    std::vector<uint32_t> w = b.words(bad);
    std::fill(w.begin(), w.end(), 0u);  // no entries, an empty record: valid
    w[tl.block(0, 0)] = 0xffffu;
    b.write_words(bad, w);
    cudaStream_t s2;
    cuda_ok(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    Dense back(rows, cols, TW_R_16BF);
    for (int round = 0; round < 3; ++round) {
        INFO("round " << round);
        back.poison();
        Buffers out(TW_BACKEND_CUDA);
        const twDnMatDescr_t dout = out.output(back);
        cudaStream_t s1;
        cuda_ok(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
        TW_REQUIRE_OK(h, twSetStream(h, s1));
        TW_REQUIRE_OK(h, twSparseToDense(h, s, dout));
        TW_REQUIRE_OK(h, twSetStream(h, s2));
        if (round == 2) cuda_ok(cudaStreamDestroy(s1));  // the writer's stream may be gone by the next call
        for (int i = 0; i < 2; ++i) REQUIRE(twSpMatValidate(h, bad) == TW_STATUS_INVALID_VALUE);
        out.fetch();
        REQUIRE(std::memcmp(back.storage.data(), in.storage.data(), static_cast<size_t>(rows * cols) * 2) == 0);
        if (round != 2) cuda_ok(cudaStreamDestroy(s1));
    }
    TW_REQUIRE_OK(h, twSetStream(h, nullptr));
    cuda_ok(cudaStreamDestroy(s2));
}
