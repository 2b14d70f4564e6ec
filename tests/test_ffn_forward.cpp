// twSpGEMMFused, compiled for both backends (tests/CMakeLists.txt): into test_ffn_forward (the
// CPU reference) and, with TWTEST_BACKEND_CUDA, into test_cuda_backend. The shared cases run
// the forward on the program's backend against its oracle (forward_support.hpp): the naive fp64
// FFN on the CPU, the CPU reference on CUDA. Small-integer data (exact outputs, statistics,
// neuron counts, hidden values, dead units, counts reset), odd shapes and both layouts of Wd and
// X, heavy rows (flagged, exact, recorded by the hidden outputs), M = 0, determinism.
// Then the cases of the CPU reference alone: the naive fp64 FFN on odd shapes and every profile
// in both precisions, identical bits for both Wd layouts, weight updates.
#include "forward_support.hpp"
#include "test_support.hpp"
#include "testing/problem.hpp"

using namespace twtest;
namespace tt = twblas::testing;

TEST_CASE("forward: small-integer inputs give exact outputs, statistics and hidden values", "[ffn][forward][quick]" TWTEST_BACKEND_TAG) {
    // Integers keep every product and sum exact in fp32 (all |values| < 2^24), so any indexing
    // error shows as a wrong value, not as rounding noise; the roundings of bf16 then act on
    // exact values, the same on every backend.
    SECTION("fp32, dead units, a hybrid hidden output that holds every row, counts reset") {
        FfnCase c;
        c.m = 13, c.d = 10, c.h = 260;
        c.type = TW_R_32F;
        c.wd_order = TW_ORDER_COL;
        c.integers = true;
        c.hidden = 2, c.ell_width = 64, c.backup_rows = c.m;
        std::mt19937_64 rng(5);
        std::uniform_int_distribution<int> small(-2, 2);
        FfnData data;
        for (auto *v : {&data.x, &data.wg, &data.wu, &data.wd}) {
            v->resize(static_cast<size_t>((v == &data.x ? c.m : c.h) * c.d));
            for (float &e : *v) e = float(small(rng));
        }
        const int64_t dead = 250;  // units 250 and up have zero gate weights: they never fire
        for (int64_t j = dead; j < c.h; ++j)
            for (int64_t k = 0; k < c.d; ++k) data.wg[static_cast<size_t>(j * c.d + k)] = 0.0f;
        const FfnResult got = run_ffn(c, data, kBackend, FfnRun().with_reset_counts());
        check_forward(c, got, expected_forward(c, data));
        REQUIRE(!got.hidden_bits.empty());  // the container holds every row: the whole pattern was compared
        for (int64_t j = dead; j < c.h; ++j) CHECK(got.counts[static_cast<size_t>(j)] == 0);  // the dead units are found
        CHECK(std::all_of(got.counts_after_reset.begin(), got.counts_after_reset.end(), [](int64_t n) { return n == 0; }));
    }
    SECTION("bf16, gated and plain, 1 to 300 tokens, every kind of hidden output") {
        // 300 tokens: on the CUDA backend the masked gate GEMM's path (sm_90), H off its 256 tiles
        for (bool gated : {true, false})
            for (int64_t m : {1, 7, 130, 300})
                for (int hidden : {0, 1, 2}) {
                    FfnCase c;
                    c.integers = true;
                    c.gated = gated;
                    c.m = m;
                    c.d = 40;
                    c.h = 300;
                    c.hidden = hidden;
                    c.seed = static_cast<uint64_t>(m * 10 + hidden);
                    check_forward_case(c);
                }
    }
}

TEST_CASE("forward: odd shapes and layouts", "[ffn][forward]" TWTEST_BACKEND_TAG) {
    struct Shape {
        int64_t m, d, h;
    };
    for (Shape s : {Shape{1, 64, 256}, Shape{5, 100, 333}, Shape{66, 8, 64}, Shape{257, 264, 1000}, Shape{3, 2100, 700}})
        for (twOrder_t wd : {TW_ORDER_ROW, TW_ORDER_COL})
            for (twOrder_t xo : {TW_ORDER_ROW, TW_ORDER_COL}) {
                FfnCase c;
                c.m = s.m;
                c.d = s.d;
                c.h = s.h;
                c.k = std::min(29.0, s.h / 4.0);
                c.wd_order = wd;
                c.x_order = xo;
                c.x_pad = 3;
                c.profile = tt::Profile::Heavy;
                check_forward_case(c);
            }
}

TEST_CASE("forward: serving sizes, 1 to 512 tokens, odd D and H, every profile", "[ffn][forward][serving][quick]" TWTEST_BACKEND_TAG) {
    // The CUDA backend's serving path (kernels/serve.cuh): its own gate and serve_down up to 16
    // tokens (x rows of 8 and 16 tokens), cuBLAS's gate with serve_token up to 256 (4, 2 and 1
    // column splits; one with a hidden output; 17, the first size past serve_gate); past that the
    // cuBLAS-gate paths. D = 203 (x rows padded to 208, so they start on 16 bytes but end in a
    // partial chunk), H = 1001 (a partial last mask word and TwELL tile).
    uint64_t seed = 900;
    for (int64_t m : {1, 2, 3, 5, 8, 13, 17, 21, 32, 33, 48, 64, 100, 257, 512})
        for (tt::Profile profile : {tt::Profile::Uniform, tt::Profile::Heavy, tt::Profile::Llm})
            for (bool gated : {true, false}) {
                FfnCase c;
                c.m = m;
                c.d = 203;
                c.h = 1001;
                c.x_pad = 5;
                c.k = 29;
                c.gated = gated;
                c.profile = profile;
                c.hidden = m % 2 == 1 ? 1 : 0;  // a TwELL hidden output on every other size
                c.seed = ++seed;
                check_forward_case(c);
            }
    // D a multiple of 8 (a gate GEMM's operands on 16 bytes) without a hidden output, around
    // serve_token's 8-warp blocks from 129 tokens; both 16-bit types, every profile
    for (int64_t m : {17, 100, 128, 129})
        for (tt::Profile profile : {tt::Profile::Uniform, tt::Profile::Heavy, tt::Profile::Llm}) {
            FfnCase c;
            c.m = m;
            c.d = 136;
            c.h = 1001;
            c.k = 29;
            c.gated = profile != tt::Profile::Heavy;
            c.type = m % 2 == 0 ? TW_R_16BF : TW_R_16F;
            c.profile = profile;
            c.seed = ++seed;
            check_forward_case(c);
        }
    // the team shapes of the model dimensions users run: 1, 2 and 4 warps per token; past 128
    // tokens serve_token's 8-warp blocks (one column split, two at D = 4096), and 16-warp blocks
    // of one split with a hidden output (M = 160). At D = 4096 and H = 8232 (a gate past 25 M
    // weights: heuristics::serve_gate_max_tokens, serve_max_tokens) 13 tokens take cuBLAS's gate
    // and serve_token, 160 and 256 the two-pass path with the masked gate GEMM; at D = 256 and
    // 2048, and at D = 4096 with H = 1000, serve_gate and serve_token
    for (int64_t d : {256, 2048, 4096})
        for (int64_t h : {2 * d + 40, int64_t{1000}})
            for (int64_t m : {1, 13, 29, 64, 160, 256}) {
                if (h == 1000 && (d != 4096 || m < 160)) continue;
                FfnCase c;
                c.m = m;
                c.d = d;
                c.h = h;
                c.k = 29;
                c.profile = tt::Profile::Llm;
                c.hidden = m == 160 ? 1 : 0;
                c.seed = ++seed;
                check_forward_case(c);
            }
    // D past 4096. x rows padded to 4104 values (on 16 bytes): serve_token needs two column
    // splits for its 513 chunks (M = 100), or, with a hidden output (one split), two chunks a
    // thread (M = 20). Unpadded rows (8200 bytes) leave the serving path: the fused kernel's team
    // of 5 warps (M = 20; its launch bound once refused it)
    for (int64_t m : {20, 100})
        for (int64_t pad : {4, 0}) {
            FfnCase c;
            c.m = m;
            c.d = 4100;
            c.h = 700;
            c.k = 29;
            c.x_pad = pad;
            c.hidden = m == 20 ? 1 : 0;
            c.seed = ++seed;
            check_forward_case(c);
        }
    // heavy rows of ~1360 active units (of 3000): serve_token lists a token's units 512 at a time,
    // so these go in three windows (M = 40 and 200)
    for (int64_t m : {40, 200}) {
        FfnCase c;
        c.m = m;
        c.d = 72;
        c.h = 3000;
        c.k = 29;
        c.profile = tt::Profile::Heavy;
        c.heavy_fraction = 0.05;
        c.heavy_scale = 0.05;
        c.seed = 5;
        REQUIRE(tt::measure_activations(tt::make_ffn_problem(problem_spec(c))).max_row_nnz > 1024);
        check_forward_case(c);
    }
}

TEST_CASE("forward: heavy rows are exact and flagged; the hidden outputs record them", "[ffn][forward][overflow][quick]" TWTEST_BACKEND_TAG) {
    SECTION("TwELL and hybrid hidden outputs") {
        FfnCase c;
        c.m = 200, c.d = 64, c.h = 1000;
        c.profile = tt::Profile::Heavy;
        c.k = 10;
        c.heavy_fraction = 0.02;
        c.seed = 3;
        c.hidden = 1;
        const FfnData data = make_data(c);
        const FfnResult got = run_ffn(c, data, kBackend);
        const FfnExpected want = expected_forward(c, data);
        const ErrorReport e = compare(got.y, want.r.y, c.d);
        INFO(e.worst);
        CHECK(e.rel < want.bound);
        // the heavy rows made on purpose overflow the 31 slots of a 256-column tile
        const tt::ActivationStats measured = tt::measure_activations(tt::make_ffn_problem(problem_spec(c)));
        CHECK(got.stats.overflowRows == measured.rows_over_tile_capacity);
        CHECK(got.stats.overflowRows >= 1);
        CHECK(got.stats.maxRowNnz == measured.max_row_nnz);
        INFO(got.hidden_message);
        CHECK(got.hidden_valid == TW_STATUS_SUCCESS);
        CHECK(got.hidden_info.overflowRows == got.stats.overflowRows);
        // the same forward into a hybrid with enough backup rows holds h exactly
        c.hidden = 2, c.ell_width = 32, c.backup_rows = c.m;
        const FfnResult hy = run_ffn(c, data, kBackend);
        const FfnExpected hy_want = expected_forward(c, data);
        REQUIRE(!hy.hidden_bits.empty());
        REQUIRE(hy.hidden_bits.size() == hy_want.r.hidden_bits.size());
        int64_t mismatches = 0;
        for (size_t i = 0; i < hy.hidden_bits.size(); ++i)
            mismatches += nonzero_bits(hy.hidden_bits[i], c.type) != nonzero_bits(hy_want.r.hidden_bits[i], c.type);
        CHECK(mismatches <= 2);  // pattern equal up to pre-activations within fp32 rounding of zero
    }
    SECTION("400 tokens, no hidden output") {
        FfnCase c;
        c.m = 400, c.d = 256, c.h = 1024;
        c.profile = tt::Profile::Heavy;
        c.k = 29;
        const FfnData data = make_data(c);
        const FfnResult got = run_ffn(c, data, kBackend);
        const FfnExpected want = expected_forward(c, data);
        REQUIRE(want.r.stats.overflowRows >= 4);
        CHECK(got.stats.overflowRows == want.r.stats.overflowRows);
        const ErrorReport e = compare(got.y, want.r.y, c.d);
        INFO(e.worst);
        REQUIRE(e.rel <= want.bound);
        // every unit fires for some heavy rows: the counts agree within near-zero flips
        int64_t diff = 0, total = 0;
        for (size_t j = 0; j < want.r.counts.size(); ++j)
            diff += std::llabs(want.r.counts[j] - got.counts[j]), total += want.r.counts[j];
        CHECK(diff <= total / 100);
    }
}

TEST_CASE("forward: M = 0 succeeds without touching pointers", "[ffn][forward]" TWTEST_BACKEND_TAG) {
    SECTION("NULL activations and workspace") {
        Handle h(kBackend);
        Buffers buf(kBackend);
        Dense wg(40, 16, TW_R_16BF), wu(40, 16, TW_R_16BF), wd(40, 16, TW_R_16BF);
        twFfnDescr_t ffn = nullptr;
        TW_REQUIRE_OK(h, twCreateFfn(h, &ffn, TW_FFN_GATED_RELU, buf.input(wg), buf.input(wu), buf.input(wd)));
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
    SECTION("a whole run") {
        FfnCase c;
        c.m = 0;
        const FfnResult r = run_ffn(c, make_data(c), kBackend);
        CHECK(r.y.empty());
        CHECK(r.stats.tokens == 0);
    }
}

TEST_CASE("forward: deterministic mode gives identical bits run to run and sorted TwELL entries", "[ffn][forward][quick]" TWTEST_BACKEND_TAG) {
    // one forward of a new FFN against the third of three of another: deterministic mode never
    // lets the statistics of earlier forwards change the path
    FfnCase llm;
    llm.m = 150, llm.d = 64, llm.h = 700;
    llm.profile = tt::Profile::Llm;
    llm.k = 20;
    llm.seed = 12;
    llm.hidden = 1, llm.twell_compression = 2;
    FfnCase heavy;
    heavy.m = 300, heavy.d = 128, heavy.h = 700;
    heavy.profile = tt::Profile::Heavy;
    heavy.hidden = 2;
    for (FfnCase c : {llm, heavy}) {
        c.deterministic = 1;
        INFO(describe(c));
        const FfnData data = make_data(c);
        const FfnResult a = run_ffn(c, data, kBackend), b = run_ffn(c, data, kBackend, FfnRun().times(3));
        REQUIRE(a.y_bits == b.y_bits);
        CHECK(a.stats.l1 == b.stats.l1);
        // neuron counts accumulate over the forwards since the last reset
        for (size_t j = 0; j < a.counts.size(); ++j) CHECK(b.counts[j] == 3 * a.counts[j]);
        if (c.hidden != 1) continue;
        // TwELL: ascending columns inside every block, and identical buffers (bar unused slots)
        const int64_t block = 256 / c.twell_compression, ld = (c.h + 255) / 256 * block;
        REQUIRE(a.hidden_words.size() == b.hidden_words.size());
        REQUIRE(a.hidden_words.size() >= static_cast<size_t>(c.m * ld));
        for (int64_t r = 0; r < c.m; ++r)
            for (int64_t t = 0; t < ld / block; ++t) {
                const uint32_t *wa = a.hidden_words.data() + r * ld + t * block, *wb = b.hidden_words.data() + r * ld + t * block;
                REQUIRE(wa[0] == wb[0]);
                for (uint32_t i = 1; i <= (wa[0] & 0xFFFF); ++i) {
                    REQUIRE(wa[i] == wb[i]);
                    if (i > 1) REQUIRE((wa[i] & 0xFFFF) > (wa[i - 1] & 0xFFFF));
                }
            }
    }
}

// ---- non-finite values (twblas.h, twSpGEMMFused): light rows (no TwELL tile over capacity, at
// most 64 active units) with DETERMINISTIC = 1 (no cuBLAS paths), so that every token takes the
// sparse path on either backend --------------------------------------------------------------------

namespace {

/// The units whose ReLU input is below -0.05 for every token (the naive fp64 pre-activation on
/// the rounded data: no rounding of either backend makes them fire).
std::vector<int64_t> units_inactive_everywhere(const FfnCase &c, const FfnData &data) {
    const twDataType_t t = c.type;
    const NaiveFfn n = naive_ffn(c.m, c.d, c.h, rounded(data.x, t), data.wg.empty() ? data.wg : rounded(data.wg, t),
                                 rounded(data.wu, t), rounded(data.wd, t), nullptr);
    std::vector<int64_t> units;
    for (int64_t j = 0; j < c.h; ++j) {
        bool off = true;
        for (int64_t i = 0; i < c.m && off; ++i) off = n.z[static_cast<size_t>(i * c.h + j)] < -0.05;
        if (off) units.push_back(j);
    }
    return units;
}

/// Row j of an H x D weight (row-major) set to `v`, or to `v` and `w` alternately.
void set_row(std::vector<float> &weight, int64_t d, int64_t j, float v, float w) {
    for (int64_t k = 0; k < d; ++k) weight[static_cast<size_t>(j * d + k)] = k % 2 ? w : v;
}

/// Every token of the run was light enough for the CUDA backend's sparse path: no tile over
/// capacity, and at most max(H / 32, 64) = 64 active units at H = 600.
void require_sparse_path(const FfnResult &got) {
    REQUIRE(got.stats.overflowRows == 0);
    REQUIRE(got.stats.maxRowNnz <= 64);
}

/// The weight whose ReLU makes the sparsity: Wg (gated) or Wu (plain).
std::vector<float> &gate_weight(FfnData &data, bool gated) { return gated ? data.wg : data.wu; }

}  // namespace

TEST_CASE("forward: an inactive unit contributes an exact zero whatever its u, Wu row and Wd row hold",
          "[ffn][forward][nonfinite]" TWTEST_BACKEND_TAG) {
    // Dense IEEE math would give 0 * Inf = NaN for each of these units; the sparse FFN never reads
    // them. Y must stay finite and match the oracle, which skips inactive units.
    const float inf = INFINITY, nan = NAN;
    for (twDataType_t type : {TW_R_16BF, TW_R_32F})
        for (bool gated : {true, false}) {
            DYNAMIC_SECTION((type == TW_R_32F ? "fp32 " : "bf16 ") << (gated ? "gated" : "plain")) {
                FfnCase c;
                c.m = 6, c.d = 64, c.h = 600;
                c.type = type;
                c.gated = gated;
                c.deterministic = 1;
                c.seed = gated ? 41 : 42;
                FfnData data = make_data(c);
                const std::vector<int64_t> off = units_inactive_everywhere(c, data);
                REQUIRE(off.size() >= 4);
                // three units that never fire, with non-finite Wd rows (and Wu rows when gated,
                // which make their u non-finite), and a fourth whose gate row is zero (g = +0)
                set_row(data.wd, c.d, off[0], nan, nan);
                set_row(data.wd, c.d, off[1], inf, -inf);
                set_row(data.wd, c.d, off[2], -inf, nan);
                set_row(data.wd, c.d, off[3], nan, inf);
                set_row(gate_weight(data, gated), c.d, off[3], 0.0f, 0.0f);
                if (gated) {
                    set_row(data.wu, c.d, off[0], inf, inf);
                    set_row(data.wu, c.d, off[1], nan, nan);
                    set_row(data.wu, c.d, off[2], -inf, inf);
                    set_row(data.wu, c.d, off[3], inf, -inf);
                }
                const FfnResult got = run_ffn(c, data, kBackend);
                require_sparse_path(got);
                check_forward(c, got, expected_forward(c, data));  // y finite, within the bound
                for (size_t i = 0; i < 4; ++i) CHECK(got.counts[static_cast<size_t>(off[i])] == 0);
            }
        }
}

TEST_CASE("forward: a unit whose rounded g is -0.0 is inactive", "[ffn][forward][nonfinite]" TWTEST_BACKEND_TAG) {
    // fp16 DEFAULT: x[:, 0] = 2^-12 and the unit's gate row (-2^-14, 0, ..., 0) give z = -2^-26,
    // which rounds to -0.0 in fp16. With an infinite Wu row and a NaN Wd row the unit would turn
    // Y into NaN if -0.0 counted as active (-0 * Inf = NaN).
    REQUIRE(std::signbit(twblas::round_to(TW_R_16F, -std::ldexp(1.0f, -26))));
    REQUIRE(twblas::round_to(TW_R_16F, -std::ldexp(1.0f, -26)) == 0.0f);
    for (bool gated : {true, false}) {
        DYNAMIC_SECTION((gated ? "gated" : "plain")) {
            FfnCase c;
            c.m = 5, c.d = 64, c.h = 600;
            c.type = TW_R_16F;
            c.gated = gated;
            c.deterministic = 1;
            c.k = 15;
            c.seed = 43;
            FfnData data = make_data(c);
            for (int64_t i = 0; i < c.m; ++i) data.x[static_cast<size_t>(i * c.d)] = std::ldexp(1.0f, -12);
            const std::vector<int64_t> off = units_inactive_everywhere(c, data);
            REQUIRE(!off.empty());
            const int64_t j = off[0];
            set_row(gate_weight(data, gated), c.d, j, 0.0f, 0.0f);
            gate_weight(data, gated)[static_cast<size_t>(j * c.d)] = -std::ldexp(1.0f, -14);
            if (gated) set_row(data.wu, c.d, j, INFINITY, INFINITY);
            set_row(data.wd, c.d, j, NAN, NAN);
            const FfnResult got = run_ffn(c, data, kBackend);
            require_sparse_path(got);
            check_forward(c, got, expected_forward(c, data));
            CHECK(got.counts[static_cast<size_t>(j)] == 0);
        }
    }
}

TEST_CASE("forward: ReLU(NaN) is active and its NaN propagates to Y", "[ffn][forward][nonfinite]" TWTEST_BACKEND_TAG) {
    // a NaN in a gate row makes that unit's g NaN for every token (NaN * x is NaN, x = 0 too):
    // the unit fires for every token (as torch.relu passes NaN) and h = NaN reaches every y
    for (twDataType_t type : {TW_R_16BF, TW_R_32F})
        for (bool gated : {true, false}) {
            DYNAMIC_SECTION((type == TW_R_32F ? "fp32 " : "bf16 ") << (gated ? "gated" : "plain")) {
                FfnCase c;
                c.m = 4, c.d = 64, c.h = 600;
                c.type = type;
                c.gated = gated;
                c.deterministic = 1;
                c.seed = 44;
                FfnData data = make_data(c);
                const std::vector<int64_t> off = units_inactive_everywhere(c, data);
                REQUIRE(!off.empty());
                const int64_t j = off[0];  // a unit that would never fire
                gate_weight(data, gated)[static_cast<size_t>(j * c.d + 3)] = NAN;
                const FfnResult got = run_ffn(c, data, kBackend);
                require_sparse_path(got);
                for (double v : got.y) REQUIRE(std::isnan(v));
                CHECK(got.counts[static_cast<size_t>(j)] == c.m);
                CHECK(got.stats.tokens == c.m);
                CHECK(got.stats.maxRowNnz >= 1);
            }
        }
}

TEST_CASE("forward: TW_FFN_ATTR_WEIGHT_COPY_BYTES counts the weight copies the backend holds",
          "[ffn][forward][weights]" TWTEST_BACKEND_TAG) {
    // the CPU reference keeps every weight as fp32 (and the FP8 rows once made); the CUDA backend
    // reads TW_ORDER_ROW weights with D a multiple of 8 on 16-byte rows in place, and copies the
    // others, H x roundup(D, 8) values each; its FP8 copy counts from when the mode is set
    for (bool gated : {true, false})
        for (twOrder_t wd_order : {TW_ORDER_ROW, TW_ORDER_COL})
            for (int64_t d : {64, 61})
                for (twDataType_t t : {TW_R_16BF, TW_R_32F}) {
                    FfnCase c;
                    c.m = 5;
                    c.d = d;
                    c.h = 300;
                    c.gated = gated;
                    c.wd_order = wd_order;
                    c.type = t;
                    INFO(describe(c));
                    const FfnResult r = run_ffn(c, make_data(c), kBackend);
                    const int64_t mats = gated ? 3 : 2, dp = (d + 7) / 8 * 8, eb = t == TW_R_32F ? 4 : 2;
                    const int64_t copied = d % 8 ? mats : wd_order == TW_ORDER_COL ? 1 : 0;
                    CHECK(r.weight_copy_bytes == (kOnCuda ? copied * c.h * dp * eb : mats * c.h * d * 4));
                }
    for (bool gated : {true, false}) {
        FfnCase c;
        c.m = 5;
        c.d = 64;
        c.h = 300;
        c.gated = gated;
        c.mode = TW_COMPUTE_FP8_WEIGHTS;
        INFO(describe(c));
        const FfnResult r = run_ffn(c, make_data(c), kBackend);
        // CPU: the fp32 weights and the FP8 rows (Wu of a gated FFN, and Wd) as fp32; CUDA: the
        // FP8 rows (16-byte multiples) and a pair of scales per unit
        const int64_t rows = gated ? 2 : 1;
        CHECK(r.weight_copy_bytes ==
              (kOnCuda ? c.h * (rows * 64 + 8) : ((gated ? 3 : 2) + rows) * c.h * c.d * 4));
    }
}

// ---- the CPU reference alone ------------------------------------------------------------------
#if !defined(TWTEST_BACKEND_CUDA)

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

namespace {

/// v to the nearest FP8 E4M3 value (ties to the even code, saturating at 448), from a table of
/// every value: independent of the library's arithmetic rule.
double e4m3_nearest(double v) {
    static const std::vector<double> values = [] {
        std::vector<double> t;  // codes 0..126 ascending: 0x00-0x07 subnormal, 0x7F is NaN
        for (int e = 0; e < 16; ++e)
            for (int m = 0; m < 8; ++m) {
                if (e == 15 && m == 7) break;
                t.push_back(e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10));
            }
        return t;
    }();
    const double a = std::min(std::fabs(v), values.back());
    const size_t hi = static_cast<size_t>(std::lower_bound(values.begin(), values.end(), a) - values.begin());
    size_t pick = hi;
    if (hi > 0 && values[hi] != a) {
        const double below = a - values[hi - 1], above = values[hi] - a;
        pick = below < above ? hi - 1 : above < below ? hi : (hi % 2 == 0 ? hi : hi - 1);
    }
    return std::copysign(values[pick], v);
}

/// An H x D matrix's rows as TW_COMPUTE_FP8_WEIGHTS reads them (twblas.h).
std::vector<float> fp8_rows(const std::vector<float> &w, int64_t h, int64_t d) {
    std::vector<float> q(w.size());
    for (int64_t j = 0; j < h; ++j) {
        float amax = 0.0f;
        for (int64_t k = 0; k < d; ++k) amax = std::max(amax, std::fabs(w[j * d + k]));
        const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
        for (int64_t k = 0; k < d; ++k)
            q[j * d + k] = static_cast<float>(e4m3_nearest(w[j * d + k] / scale)) * scale;
    }
    return q;
}

}  // namespace

TEST_CASE("FP8 weights: e4m3 rows with per-row scales, the DEFAULT pattern, and the distance to DEFAULT",
          "[ffn][forward][fp8]") {
    for (const bool gated : {true, false})
        for (const twDataType_t t : {TW_R_16BF, TW_R_16F}) {
            DYNAMIC_SECTION((gated ? "gated " : "plain ") << (t == TW_R_16BF ? "bf16" : "fp16")) {
                const auto s = spec(300, 96, 600, tt::Profile::Uniform, 12, gated, gated ? 61 : 62);
                FfnFixture def(s, t), fp8(s, t);
                fp8.set_mode(TW_COMPUTE_FP8_WEIGHTS);
                def.run();
                fp8.run();
                twFfnStats_t sd{}, sf{};
                TW_REQUIRE_OK(def.h, twFfnGetStats(def.h, def.ffn, &sd));
                TW_REQUIRE_OK(fp8.h, twFfnGetStats(fp8.h, fp8.ffn, &sf));
                CHECK(sf.meanRowNnz == sd.meanRowNnz);  // the gate, in the value type, picks the units
                CHECK(sf.maxRowNnz == sd.maxRowNnz);
                // against the naive FFN on FP8 rows (the gate's matrix kept): DEFAULT's bound
                const auto &p = fp8.p;
                const NaiveFfn want = naive_ffn(
                    fp8.m, fp8.d, fp8.hd, rounded(p.x, t), gated ? rounded(p.w_gate, t) : std::vector<float>{},
                    gated ? fp8_rows(rounded(p.w_up, t), fp8.hd, fp8.d) : rounded(p.w_up, t),
                    fp8_rows(rounded(p.w_down, t), fp8.hd, fp8.d), &t);
                const ErrorReport e = compare(fp8.y->to_double(), want.y, fp8.d);
                INFO("against the FP8 oracle: " << e.rel << ", worst " << e.worst);
                CHECK(e.rel < 4 * unit_roundoff(t));
                // the distance to DEFAULT (normwise over Y; docs/api-guide.md states it)
                const ErrorReport gap = compare(fp8.y->to_double(), def.y->to_double(), fp8.d);
                INFO("FP8 against DEFAULT: " << gap.rel);
                CHECK(gap.rel > 1e-3);  // the weights really are read as FP8
                CHECK(gap.rel < 0.06);
            }
        }
}

TEST_CASE("FP8 weights: re-quantized after twFfnUpdateWeights; refused where they do not apply", "[ffn][forward][fp8]") {
    const auto s = spec(40, 64, 300, tt::Profile::Uniform, 10, true, 63);
    FfnFixture f(s, TW_R_16BF);
    f.set_mode(TW_COMPUTE_FP8_WEIGHTS);
    f.run();
    const auto before = f.y->to_double();
    // Wd x 2: each row's scale doubles and its FP8 codes stay, so Y doubles exactly
    for (int64_t r = 0; r < f.hd; ++r)
        for (int64_t c = 0; c < f.d; ++c) f.wd->set(r, c, 2.0f * f.wd->get(r, c));
    TW_REQUIRE_OK(f.h, twFfnUpdateWeights(f.h, f.ffn, f.wg ? f.wg->d : nullptr, *f.wu, *f.wd));
    f.run();
    const auto after = f.y->to_double();
    for (size_t i = 0; i < after.size(); ++i) REQUIRE(after[i] == 2.0 * before[i]);
    // an inference mode: the training calls say NOT_SUPPORTED and name it
    size_t bytes = 0;
    CHECK(twSpGEMMFusedSaved_bufferSize(f.h, f.ffn, f.m, &bytes) == TW_STATUS_NOT_SUPPORTED);
    CHECK(std::string(twGetErrorMessage(f.h)).find("TW_COMPUTE_FP8_WEIGHTS") != std::string::npos);
    CHECK(twSpGEMMFusedBackward_bufferSize(f.h, f.ffn, f.m, &bytes) == TW_STATUS_NOT_SUPPORTED);
}

#endif  // !TWTEST_BACKEND_CUDA
