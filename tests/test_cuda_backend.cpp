// The fused forward on the CUDA backend alone, against the CPU reference: every profile, type
// and compute mode, dense mode, heavy rows through cuBLAS and past the capacity the statistics
// suggested, CUDA graph capture. Linked into test_cuda_backend with the shared cases of
// test_ffn_forward.cpp and test_building_blocks.cpp built for CUDA; without a usable GPU the
// program is skipped (cuda_test_main.cpp).
#include <cuda_runtime.h>

#include <cmath>
#include <memory>
#include <string>
#include <thread>

#include "cuda_test_support.hpp"
#include "forward_support.hpp"
#include "test_support.hpp"
#include "testing/problem.hpp"

using namespace twtest;
namespace tt = twblas::testing;

TEST_CASE("CUDA FFN: profiles, types and modes against the reference", "[cuda][ffn][quick]") {
    for (tt::Profile p : {tt::Profile::Uniform, tt::Profile::Heavy, tt::Profile::Llm})
        for (twDataType_t t : {TW_R_16BF, TW_R_16F, TW_R_32F})
            for (twComputeMode_t mode : {TW_COMPUTE_DEFAULT, TW_COMPUTE_HIGHEST_PRECISION})
                for (bool gated : {true, false}) {
                    if (t == TW_R_32F && mode == TW_COMPUTE_HIGHEST_PRECISION) continue;  // same as DEFAULT
                    FfnCase c;
                    c.profile = p;
                    c.type = t;
                    c.mode = mode;
                    c.gated = gated;
                    c.m = 333;
                    c.d = 128;
                    c.h = 600;
                    c.seed = 11;
                    check_forward_case(c);
                }
}

TEST_CASE("CUDA FFN: the masked gate GEMM's path (sm_90) at sizes off its tiles, padded X rows", "[cuda][ffn][quick]") {
    // 600 and 1000 tokens: 128-row tiles with a partial last one; H = 1001 and 777: a partial
    // 256-column tile and a partial last active-unit word; X rows padded (ld = D + 8). Without a
    // hidden output the GEMM writes only the gate chunks holding an active unit (the workspace
    // holds garbage, never zeros): the dense path's rows (heavy, llm) must see the rest as +0.
    uint64_t seed = 40;
    for (tt::Profile profile : {tt::Profile::Uniform, tt::Profile::Heavy, tt::Profile::Llm})
        for (twDataType_t t : {TW_R_16BF, TW_R_16F})
            for (bool with_hidden : {false, true}) {
                FfnCase c;
                c.profile = profile;
                c.type = t;
                c.m = t == TW_R_16BF ? 600 : 1000;
                c.d = 264;
                c.h = t == TW_R_16BF ? 1001 : 777;
                c.x_pad = 8;
                c.gated = profile != tt::Profile::Llm;
                c.hidden = !with_hidden ? 0 : profile == tt::Profile::Heavy ? 2 : 1;
                c.seed = ++seed;
                check_forward_case(c);
            }
    // the GEMM's tile width follows the problem (the plan's masked_gate_tile_n): on a 132-SM H100
    // the sizes above take 192-wide tiles, 4100 tokens at H = 1001 the 256-wide ones
    for (twDataType_t t : {TW_R_16BF, TW_R_16F}) {
        FfnCase c;
        c.type = t;
        c.m = 4100;
        c.d = 264;
        c.h = 1001;
        c.x_pad = 8;
        c.hidden = t == TW_R_16BF ? 1 : 0;
        c.seed = ++seed;
        check_forward_case(c);
    }
    // H past 8192 units: more active-unit words than fwd_u's 256 threads, so fwd_u lists its row
    // from them in two block-wide passes (up to kFwdUListsMaxTokens tokens); heavy rows too
    for (tt::Profile profile : {tt::Profile::Uniform, tt::Profile::Heavy}) {
        FfnCase c;
        c.profile = profile;
        c.m = 300;
        c.d = 136;
        c.h = 8500;
        c.seed = ++seed;
        check_forward_case(c);
    }
}

namespace {
bool sm90_gpu() {
    int device = 0, major = 0;
    return cudaGetDevice(&device) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major == 9;
}
/// Whether a pinned algorithm runs this case (the API's rules, written out independently of the
/// plan; the masked gate GEMM: an sm_90a build, which the CUDA tests are, on an sm_90 GPU).
bool algorithm_runs(const FfnCase &c) {
    const bool x_rows_16b = c.x_order == TW_ORDER_ROW && (c.d + c.x_pad) % 8 == 0 && c.type != TW_R_32F;
    switch (c.algorithm) {
    case TW_FFN_ALG_SERVE: return x_rows_16b && c.mode != TW_COMPUTE_HIGHEST_PRECISION;
    case TW_FFN_ALG_DECODE: return c.m <= 4 && c.type != TW_R_32F && c.mode == TW_COMPUTE_DEFAULT;
    case TW_FFN_ALG_DENSE: return c.type != TW_R_32F && c.mode == TW_COMPUTE_DEFAULT && !c.deterministic;
    case TW_FFN_ALG_FUSED: return c.mode != TW_COMPUTE_FP8_WEIGHTS;
    case TW_FFN_ALG_MASKED_TWO_PASS: return x_rows_16b && c.mode != TW_COMPUTE_HIGHEST_PRECISION && sm90_gpu();
    default: return true;
    }
}
}  // namespace

TEST_CASE("CUDA FFN: every algorithm, pinned, against the reference", "[cuda][ffn][algorithm][quick]") {
    // each path run explicitly (TW_FFN_ATTR_ALGORITHM) at token counts on both sides of its
    // default reach, sizes off every tile, rows on the dense path (heavy), hidden outputs; small
    // integers make every sum exact, so every path must give the reference's bits
    const twFfnAlgorithm_t algorithms[] = {TW_FFN_ALG_SERVE, TW_FFN_ALG_DECODE,   TW_FFN_ALG_DENSE,
                                           TW_FFN_ALG_FUSED, TW_FFN_ALG_TWO_PASS, TW_FFN_ALG_MASKED_TWO_PASS};
    uint64_t seed = 900;
    int ran = 0;
    for (twFfnAlgorithm_t alg : algorithms)
        for (int64_t m : {1, 4, 13, 300})
            for (bool integers : {true, false})
                for (tt::Profile profile : {tt::Profile::Uniform, tt::Profile::Heavy}) {
                    FfnCase c;
                    c.algorithm = alg;
                    c.m = m;
                    c.d = 200;
                    c.h = 1001;
                    c.integers = integers;
                    c.profile = profile;
                    c.heavy_fraction = 0.2;
                    c.gated = seed % 2 == 0;
                    c.type = seed % 3 == 0 ? TW_R_16F : TW_R_16BF;
                    c.hidden = static_cast<int>(seed % 3);
                    c.seed = ++seed;
                    if (!algorithm_runs(c)) continue;
                    check_forward_case(c);
                    ++ran;
                }
    CHECK(ran >= 60);
    // fp32 and HIGHEST_PRECISION take the sparse paths only; FP8 weights the serving and two-pass
    // paths (within the FP8 mode's own tolerance, check_forward_case)
    for (twFfnAlgorithm_t alg : algorithms)
        for (int variant = 0; variant < 3; ++variant) {
            FfnCase c;
            c.algorithm = alg;
            c.m = 37;
            c.d = 96;
            c.h = 700;
            if (variant == 0) c.type = TW_R_32F;
            if (variant == 1) c.mode = TW_COMPUTE_HIGHEST_PRECISION;
            if (variant == 2) c.mode = TW_COMPUTE_FP8_WEIGHTS;
            c.seed = ++seed;
            if (algorithm_runs(c)) check_forward_case(c);
        }
}

TEST_CASE("CUDA FFN: a pinned algorithm that cannot run says so and writes nothing", "[cuda][ffn][algorithm]") {
    Handle h(TW_BACKEND_CUDA);
    Buffers buf(TW_BACKEND_CUDA);
    FfnCase c;
    c.m = 13;
    c.d = 64;
    c.h = 300;
    const FfnData data = make_data(c);
    Dense x(c.m, c.d, c.type), y(c.m, c.d, c.type), wg(c.h, c.d, c.type), wu(c.h, c.d, c.type), wd(c.h, c.d, c.type);
    x.fill(data.x);
    wg.fill(data.wg);
    wu.fill(data.wu);
    wd.fill(data.wd);
    y.poison();
    const twDnMatDescr_t X = buf.input(x), Y = buf.output(y);
    twFfnDescr_t ffn = nullptr;
    TW_REQUIRE_OK(h, twCreateFfn(h, &ffn, TW_FFN_GATED_RELU, buf.input(wg), buf.input(wu), buf.input(wd)));
    const int32_t decode = TW_FFN_ALG_DECODE;
    REQUIRE(twFfnSetAttribute(ffn, TW_FFN_ATTR_ALGORITHM, &decode, sizeof decode) == TW_STATUS_SUCCESS);
    size_t bytes = 0;
    TW_REQUIRE_OK(h, twSpGEMMFused_bufferSize(h, ffn, X, Y, &bytes));
    void *ws = buf.memory(bytes);
    CHECK(twSpGEMMFused(h, ffn, X, Y, nullptr, ws) == TW_STATUS_NOT_SUPPORTED);
    CHECK(std::string(twGetErrorMessage(h)).find("decode") != std::string::npos);
    // tuning knobs by name: unknown names and values out of range are refused, the rest read back
    CHECK(twFfnSetTuning(ffn, "no_such_knob", 1) == TW_STATUS_INVALID_VALUE);
    CHECK(twFfnSetTuning(ffn, "two_pass_min_tokens", -3) == TW_STATUS_INVALID_VALUE);
    CHECK(twFfnSetTuning(ffn, "two_pass_min_tokens", 64) == TW_STATUS_SUCCESS);
    double v = 0;
    CHECK(twFfnGetTuning(ffn, "two_pass_min_tokens", &v) == TW_STATUS_SUCCESS);
    CHECK(v == 64);
    CHECK(twFfnSetTuning(ffn, "dense_mode_units_per_hidden", 0.5) == TW_STATUS_SUCCESS);
    buf.fetch();
    for (int64_t i = 0; i < c.m; ++i)
        for (int64_t k = 0; k < c.d; ++k) CHECK(std::isnan(y.to_double()[static_cast<size_t>(i * c.d + k)]));
    // DEFAULT again, with the tuning changed: the reference's results
    const int32_t def = TW_FFN_ALG_DEFAULT;
    REQUIRE(twFfnSetAttribute(ffn, TW_FFN_ATTR_ALGORITHM, &def, sizeof def) == TW_STATUS_SUCCESS);
    TW_REQUIRE_OK(h, twSpGEMMFused(h, ffn, X, Y, nullptr, ws));
    twDestroyFfn(ffn);
    buf.fetch();
    const FfnExpected want = expected_forward(c, data);
    CHECK(compare(y.to_double(), want.r.y, c.d).rel <= want.bound);
}

TEST_CASE("CUDA FFN: dense mode (chosen after a dense forward) matches the reference", "[cuda][ffn]") {
    // a quarter of the units active is far above the gather break-even (H / 128): the second
    // forward runs the up and down projections as cuBLAS GEMMs over every row, h and the
    // statistics by one pass (on 132 SMs a row a block at M = 200, two at 333, three at 600; at
    // M = 20 h alone, the statistics beside the down GEMM).
    // H = 4500: 18 steps of 256 columns a row, several for each of the row's warps, the last one
    // part-filled
    for (int64_t m : {20, 200, 333, 600})
        for (bool gated : {true, false})
            for (int hidden : {0, 1, 2}) {
                FfnCase c;
                c.m = m;
                c.d = 128;
                c.h = hidden == 1 ? 4500 : 600;
                c.k = c.h / 4;
                c.gated = gated;
                c.hidden = hidden;
                c.type = hidden == 0 ? TW_R_16F : TW_R_16BF;
                const FfnData data = make_data(c);
                const FfnResult cpu = run_ffn(c, data, TW_BACKEND_CPU);
                const FfnResult gpu = run_ffn(c, data, TW_BACKEND_CUDA, FfnRun().times(2).with_stats_between());
                const ErrorReport e = compare(gpu.y, cpu.y, c.d);
                INFO("M " << m << " H " << c.h << (gated ? " gated" : " plain") << " hidden " << hidden << ": "
                          << e.worst);
                REQUIRE(e.rel <= type_bound(c));
                CHECK(gpu.stats.overflowRows == cpu.stats.overflowRows);
                CHECK(gpu.stats.meanRowNnz == Approx(cpu.stats.meanRowNnz).epsilon(0.01));
                CHECK(gpu.stats.l1 == Approx(cpu.stats.l1).epsilon(0.01));
                if (hidden) CHECK(gpu.hidden_info.nnz == Approx(cpu.hidden_info.nnz).epsilon(0.01));
            }
    // and the same with small-integer data: bit-identical in dense mode too, every unit's count
    // exact, whichever way the statistics are formed (the tuning's choice, then each of the
    // three forced): beside the down GEMM, or with h with the counts by atomics or in shared
    // memory, rows a block from 1 (M = 100) to 64 (M = 17000, its most), clusters of 8 adding
    // the counts on sm_90 (a partial last cluster at 100 and 17000 tokens); H a whole and a
    // part-filled last step; H = 9000 two batches of loads a row for the first warps, three rows
    // a block
    struct Variant {
        const char *name;
        double beside_max_tokens, atomics_max_values;
    };
    const Variant variants[] = {{"the tuning's", -1, -1}, {"beside", 1e9, 0}, {"atomics", 0, 1e15}, {"shared", 0, 0}};
    struct Shape {
        int64_t m, d, h;
    };
    for (const Shape s : {Shape{40, 40, 300}, Shape{100, 40, 300}, Shape{1000, 40, 4500}, Shape{17000, 16, 300},
                          Shape{600, 16, 9000}})
        for (bool gated : {true, false}) {
            if (gated && s.h == 4500) continue;  // the next test case
            FfnCase c;
            c.integers = true;
            c.m = s.m;
            c.d = s.d;
            c.h = s.h;
            c.gated = gated;
            c.hidden = 1;
            const FfnData data = make_data(c);
            const FfnResult cpu = run_ffn(c, data, TW_BACKEND_CPU);
            INFO("M " << s.m << " H " << s.h << (gated ? " gated" : " plain"));
            REQUIRE(cpu.stats.meanRowNnz > s.h / 128.0);
            for (const Variant &v : variants) {
                FfnRun run = FfnRun().times(2).with_stats_between();
                if (v.beside_max_tokens >= 0)
                    run.tuned("dense_stats_beside_max_tokens", v.beside_max_tokens)
                        .tuned("dense_stats_atomics_max_values", v.atomics_max_values);
                const FfnResult gpu = run_ffn(c, data, TW_BACKEND_CUDA, run);
                INFO("statistics: " << v.name);
                REQUIRE(gpu.y_bits.size() == cpu.y_bits.size());
                int64_t wrong_y = 0, first = -1;
                for (size_t k = 0; k < cpu.y_bits.size(); ++k)
                    if (gpu.y_bits[k] != cpu.y_bits[k])
                        wrong_y += 1, first = first < 0 ? static_cast<int64_t>(k) : first;
                INFO("first different y: row " << first / s.d << " column " << first % s.d);
                CHECK(wrong_y == 0);
                // two forwards (sparse, then dense mode) on the GPU, one on the CPU
                REQUIRE(gpu.counts.size() == cpu.counts.size());
                int64_t wrong = 0;
                for (size_t j = 0; j < cpu.counts.size(); ++j) wrong += gpu.counts[j] != 2 * cpu.counts[j];
                CHECK(wrong == 0);
                CHECK(gpu.hidden_bits == cpu.hidden_bits);
                CHECK(gpu.stats.l1 == Approx(cpu.stats.l1).epsilon(1e-6));
                CHECK(gpu.stats.overflowRows == cpu.stats.overflowRows);
                CHECK(gpu.stats.maxRowNnz == cpu.stats.maxRowNnz);
            }
        }
}

TEST_CASE("CUDA FFN: dense mode, gated, 1000 tokens x 4500 units of small integers: y bit-identical",
          "[cuda][ffn]") {
    // Every sum here is an integer below 2^24, so any order of summation gives the same bits, but
    // a split-K GEMM that adds its parts in the output's 16-bit type (cuBLASLt's INPLACE and
    // OUTPUT_TYPE reduction schemes) rounds them: the down GEMM (K = 4500, N = 40) takes split K,
    // and its partial sums are past bf16's integers. lt_gemm.cpp allows the fp32 scheme only.
    FfnCase c;
    c.integers = true;
    c.m = 1000;
    c.d = 40;
    c.h = 4500;
    c.hidden = 1;
    const FfnData data = make_data(c);
    const FfnResult cpu = run_ffn(c, data, TW_BACKEND_CPU);
    const FfnResult gpu = run_ffn(c, data, TW_BACKEND_CUDA, FfnRun().times(2).with_stats_between());
    REQUIRE(gpu.y_bits.size() == cpu.y_bits.size());
    int64_t wrong_y = 0;
    for (size_t k = 0; k < cpu.y_bits.size(); ++k) wrong_y += gpu.y_bits[k] != cpu.y_bits[k];
    CHECK(wrong_y == 0);
}

TEST_CASE("CUDA FFN: the serving path with rows of hundreds of units (serve_down in groups) gives the reference's bits",
          "[cuda][ffn]") {
    // small-integer data fires about half of the 4500 units a token: after the first forward the
    // plan splits serve_down's units into groups of blocks (16 at 40 columns; at 520 columns,
    // three slices, 16 tokens leave room for 5), each writing a partial row that the last adds in
    // group order; the second forward is compared. 2056 and 4104 columns (9 and 17 slices) give
    // many blocks that do not count the row: the partial rows they release before the ticket
    // (under racecheck's timing a missing release showed as stale columns)
    for (int64_t d : {40, 520, 2056, 4104})
        for (int64_t m : {1, 3, 16})
            for (bool gated : {true, false}) {
                FfnCase c;
                c.integers = true;
                c.algorithm = TW_FFN_ALG_SERVE;
                c.m = m;
                c.d = d;
                c.h = 4500;
                c.gated = gated;
                c.hidden = m == 3 ? 1 : 0;
                INFO(describe(c));
                const FfnData data = make_data(c);
                const FfnResult cpu = run_ffn(c, data, TW_BACKEND_CPU);
                REQUIRE(cpu.stats.meanRowNnz > 2 * 128);
                const FfnResult gpu = run_ffn(c, data, TW_BACKEND_CUDA, FfnRun().times(2).with_stats_between());
                REQUIRE(gpu.y_bits.size() == cpu.y_bits.size());
                int64_t wrong_y = 0;
                for (size_t k = 0; k < cpu.y_bits.size(); ++k) wrong_y += gpu.y_bits[k] != cpu.y_bits[k];
                CHECK(wrong_y == 0);
                REQUIRE(gpu.counts.size() == cpu.counts.size());
                int64_t wrong = 0;
                for (size_t j = 0; j < cpu.counts.size(); ++j) wrong += gpu.counts[j] != 2 * cpu.counts[j];
                CHECK(wrong == 0);
                if (c.hidden) CHECK(gpu.hidden_bits == cpu.hidden_bits);
                CHECK(gpu.stats.meanRowNnz == Approx(cpu.stats.meanRowNnz).epsilon(1e-9));
                CHECK(gpu.stats.maxRowNnz == cpu.stats.maxRowNnz);
                CHECK(gpu.stats.overflowRows == cpu.stats.overflowRows);
                CHECK(gpu.stats.l1 == Approx(cpu.stats.l1).epsilon(1e-6));
            }
}

TEST_CASE("CUDA FFN: serve_gate's gate on CUDA cores and on tensor cores gives the reference's bits", "[cuda][ffn]") {
    // 1 and 2 tokens take serve_gate_rows (a warp a weight row) with serve_gate_rows_max_tokens = 2
    // and serve_gate's tensor-core tiles with 0: small integers, so both sum orders
    // give the reference's bits. D = 203 (x rows padded, a partial last chunk), 2056 (a second
    // round of row loads for one lane) and 4104; H = 1001 (a partial last tile and mask word)
    uint64_t seed = 4100;
    for (int64_t d : {203, 2056, 4104})
        for (int64_t m : {1, 2})
            for (int rows : {0, 2})
                for (bool gated : {true, false}) {
                    FfnCase c;
                    c.integers = true;
                    c.algorithm = TW_FFN_ALG_SERVE;
                    c.type = gated ? TW_R_16BF : TW_R_16F;
                    c.m = m;
                    c.d = d;
                    c.h = 1001;
                    c.x_pad = d == 203 ? 5 : 0;
                    c.gated = gated;
                    c.hidden = m == 2 ? 1 : 0;
                    c.seed = ++seed;
                    INFO(describe(c) << " serve_gate_rows_max_tokens " << rows);
                    const FfnData data = make_data(c);
                    const FfnResult cpu = run_ffn(c, data, TW_BACKEND_CPU);
                    const FfnResult gpu = run_ffn(
                        c, data, TW_BACKEND_CUDA,
                        FfnRun().times(2).with_stats_between().tuned("serve_gate_rows_max_tokens", rows));
                    CHECK(gpu.y_bits == cpu.y_bits);
                    if (c.hidden) CHECK(gpu.hidden_bits == cpu.hidden_bits);
                    REQUIRE(gpu.counts.size() == cpu.counts.size());
                    int64_t wrong = 0;
                    for (size_t j = 0; j < cpu.counts.size(); ++j) wrong += gpu.counts[j] != 2 * cpu.counts[j];
                    CHECK(wrong == 0);
                    CHECK(gpu.stats.maxRowNnz == cpu.stats.maxRowNnz);
                    CHECK(gpu.stats.meanRowNnz == Approx(cpu.stats.meanRowNnz).epsilon(1e-9));
                    CHECK(gpu.stats.l1 == Approx(cpu.stats.l1).epsilon(1e-6));
                }
}

TEST_CASE("CUDA FFN: dense mode in the caller's graph and in captured eager calls gives the reference's bits",
          "[cuda][ffn]") {
    // small-integer data, so that the reference's bits are the answer whatever the GEMMs' order
    // of summation (M = 20, 64 and 300: the packing pass publishes the statistics; 600: count and
    // finalize do)
    for (int64_t m : {20, 64, 300, 600}) {
        FfnCase c;
        c.integers = true;
        c.m = m;
        c.d = 40;
        c.h = 300;
        c.hidden = 1;
        INFO(describe(c));
        const FfnData data = make_data(c);
        const FfnResult cpu = run_ffn(c, data, TW_BACKEND_CPU);
        REQUIRE(cpu.stats.meanRowNnz > 300.0 / 128);  // the warm-up forward puts the FFN in dense mode
        const FfnResult replayed =
            run_ffn(c, data, TW_BACKEND_CUDA, FfnRun().warmed_with(&data.x).times(3).replayed(graph_replay));
        // the second eager call is captured into a graph, the later ones replay it
        const FfnResult eager = run_ffn(c, data, TW_BACKEND_CUDA, FfnRun().warmed_with(&data.x).times(4));
        for (const FfnResult *g : {&replayed, &eager}) {
            REQUIRE(g->y_bits == cpu.y_bits);
            CHECK(g->hidden_bits == cpu.hidden_bits);
            const int64_t forwards = g == &replayed ? 4 : 5;  // the warm-up's included
            for (size_t j = 0; j < cpu.counts.size(); ++j) REQUIRE(g->counts[j] == forwards * cpu.counts[j]);
        }
    }
}

TEST_CASE("CUDA FFN: heavy rows through cuBLAS, and past the capacity the statistics suggested", "[cuda][ffn][quick]") {
    // M = 400: after the warm-up's heavy rows the FFN runs in dense mode (up to 512 tokens,
    // heuristics::kDenseRowsDenseModeMaxTokens); 600: the dense path (cuBLAS GEMMs over the rows
    // the statistics suggested, the gathered GEMM past them) beside the sparse rows
    for (int64_t m : {400, 600})
        for (bool gated : {true, false})
            for (int hidden : {0, 1}) {
                FfnCase c;
                c.m = m;
                c.d = 256;
                c.h = 1024;
                c.profile = tt::Profile::Heavy;
                c.gated = gated;
                c.hidden = hidden;
                const tt::FfnProblem prob = tt::make_ffn_problem(problem_spec(c));
                REQUIRE(!prob.heavy_rows.empty());
                FfnData data{prob.x, prob.w_gate, prob.w_up, prob.w_down};
                // the warm-up forward sees 1 % heavy rows (capacity 128); the measured one 300
                FfnData many = data;
                for (int64_t r = 0; r < 300; ++r) {
                    const int64_t src = prob.heavy_rows[static_cast<size_t>(r) % prob.heavy_rows.size()];
                    std::copy_n(prob.x.begin() + src * c.d, c.d, many.x.begin() + r * c.d);
                }
                for (const FfnData *d : {&data, &many}) {
                    const FfnResult cpu = run_ffn(c, *d, TW_BACKEND_CPU);
                    const FfnResult gpu = run_ffn(c, *d, TW_BACKEND_CUDA, FfnRun().warmed_with(&data.x));
                    const ErrorReport e = compare(gpu.y, cpu.y, c.d);
                    INFO("M " << m << (gated ? " gated" : " plain") << " hidden " << hidden << " rows "
                              << cpu.stats.overflowRows << ": " << e.worst);
                    REQUIRE(cpu.stats.overflowRows >= (d == &data ? m / 100 : 300));
                    for (double v : gpu.y) REQUIRE(std::isfinite(v));
                    REQUIRE(e.rel <= type_bound(c));
                    CHECK(gpu.stats.overflowRows == cpu.stats.overflowRows);
                    CHECK(gpu.stats.l1 == Approx(cpu.stats.l1).epsilon(0.01));
                    if (hidden) CHECK(gpu.hidden_info.overflowRows == cpu.hidden_info.overflowRows);
                }
            }
}

TEST_CASE("CUDA FFN: graph capture replays the deterministic bits", "[cuda][ffn][quick]") {
    // (the same runs without a graph: "forward: deterministic mode ..." in test_ffn_forward.cpp)
    FfnCase c;
    c.m = 300;
    c.d = 128;
    c.h = 700;
    c.profile = tt::Profile::Heavy;
    c.deterministic = 1;
    c.hidden = 2;
    const FfnData data = make_data(c);
    const FfnResult a = run_ffn(c, data, TW_BACKEND_CUDA);
    const FfnResult g = run_ffn(c, data, TW_BACKEND_CUDA, FfnRun().times(2).replayed(graph_replay));
    REQUIRE(a.y_bits == g.y_bits);
    REQUIRE(a.hidden_bits == g.hidden_bits);
    CHECK(a.stats.overflowRows == g.stats.overflowRows);
    // neuron counts accumulate over the forwards since the last reset
    for (size_t j = 0; j < a.counts.size(); ++j) CHECK(g.counts[j] == 2 * a.counts[j]);
}

TEST_CASE("CUDA FFN: repeated eager calls (captured once, then replayed) give the first call's bits", "[cuda][ffn]") {
    // the second call with the same arguments captures the call into a graph, later ones replay
    // it: every path (decode, fused, two-pass; a hidden output) must give the bits of one call
    for (const int64_t m : {3, 70, 300}) {
        FfnCase c;
        c.m = m;
        c.d = 128;
        c.h = 700;
        c.profile = tt::Profile::Heavy;
        c.deterministic = 1;
        c.hidden = 1;
        INFO(describe(c));
        const FfnData data = make_data(c);
        const FfnResult once = run_ffn(c, data, TW_BACKEND_CUDA);
        const FfnResult many = run_ffn(c, data, TW_BACKEND_CUDA, FfnRun().times(5));
        REQUIRE(once.y_bits == many.y_bits);
        REQUIRE(once.hidden_words == many.hidden_words);
        for (size_t j = 0; j < once.counts.size(); ++j) REQUIRE(many.counts[j] == 5 * once.counts[j]);
    }
}

TEST_CASE("CUDA FFN: a replayed call follows new buffers and attributes", "[cuda][ffn]") {
    // a captured call is keyed on every pointer, layout and attribute it depends on: changing
    // any of them between calls must never replay a graph of the old arguments
    for (const int64_t m : {2, 64, 300}) {
        FfnCase c;
        c.m = m;
        c.d = 96;
        c.h = 500;
        c.deterministic = 1;
        INFO(describe(c));
        FfnCase c2 = c;
        c2.seed = 99;
        REQUIRE(make_data(c2).x != make_data(c).x);
        const FfnData data = make_data(c);
        FfnData data2 = data;  // the same weights, another X
        data2.x = make_data(c2).x;
        const FfnResult want = run_ffn(c, data, TW_BACKEND_CUDA), want2 = run_ffn(c, data2, TW_BACKEND_CUDA);
        FfnCase hi = c;
        hi.mode = TW_COMPUTE_HIGHEST_PRECISION;
        const FfnResult want_hi = run_ffn(hi, data, TW_BACKEND_CUDA);

        Handle h(TW_BACKEND_CUDA);
        Buffers buf(TW_BACKEND_CUDA);
        Dense x(c.m, c.d, c.type), x2(c.m, c.d, c.type), wg(c.h, c.d, c.type), wu(c.h, c.d, c.type), wd(c.h, c.d, c.type);
        x.fill(data.x);
        x2.fill(data2.x);
        wg.fill(data.wg);
        wu.fill(data.wu);
        wd.fill(data.wd);
        Dense y1(c.m, c.d, c.type), y2(c.m, c.d, c.type), y3(c.m, c.d, c.type), y4(c.m, c.d, c.type);
        for (Dense *y : {&y1, &y2, &y3, &y4}) y->poison();
        const twDnMatDescr_t X = buf.input(x), X2 = buf.input(x2), Y1 = buf.output(y1), Y2 = buf.output(y2),
                             Y3 = buf.output(y3), Y4 = buf.output(y4);
        twFfnDescr_t ffn = nullptr;
        TW_REQUIRE_OK(h, twCreateFfn(h, &ffn, TW_FFN_GATED_RELU, buf.input(wg), buf.input(wu), buf.input(wd)));
        REQUIRE(twFfnSetAttribute(ffn, TW_FFN_ATTR_DETERMINISTIC, &c.deterministic, sizeof c.deterministic) ==
                TW_STATUS_SUCCESS);
        size_t ws_bytes = 0;
        TW_REQUIRE_OK(h, twSpGEMMFused_bufferSize(h, ffn, X, Y1, &ws_bytes));
        void *ws = buf.memory(ws_bytes);
        for (int i = 0; i < 3; ++i) TW_REQUIRE_OK(h, twSpGEMMFused(h, ffn, X, Y1, nullptr, ws));  // eager, capture, replay
        TW_REQUIRE_OK(h, twSpGEMMFused(h, ffn, X, Y2, nullptr, ws));                              // another Y
        TW_REQUIRE_OK(h, twSpGEMMFused(h, ffn, X2, Y3, nullptr, ws));                             // another X
        const int32_t highest = TW_COMPUTE_HIGHEST_PRECISION;
        REQUIRE(twFfnSetAttribute(ffn, TW_FFN_ATTR_COMPUTE_MODE, &highest, sizeof highest) == TW_STATUS_SUCCESS);
        TW_REQUIRE_OK(h, twSpGEMMFused_bufferSize(h, ffn, X, Y4, &ws_bytes));
        void *ws_hi = buf.memory(ws_bytes);
        TW_REQUIRE_OK(h, twSpGEMMFused(h, ffn, X, Y4, nullptr, ws_hi));  // another mode
        buf.fetch();
        auto bits = [&](const Dense &y) {
            std::vector<uint32_t> b;
            for (int64_t i = 0; i < c.m; ++i)
                for (int64_t k = 0; k < c.d; ++k) b.push_back(y.bits(i, k));
            return b;
        };
        REQUIRE(bits(y1) == want.y_bits);
        REQUIRE(bits(y2) == want.y_bits);
        REQUIRE(bits(y3) == want2.y_bits);
        REQUIRE(bits(y4) == want_hi.y_bits);
        twDestroyFfn(ffn);
    }
}

TEST_CASE("CUDA FFN: twFfnUpdateWeights is ordered on the handle's stream and can be captured", "[cuda][ffn]") {
    // the new weights are written, re-read and used on one stream with no host wait in between,
    // eagerly and inside a captured graph (a blocking update could not be captured); with FP8
    // weights the forward after each update quantizes the new rows first (inside the capture too)
    const twComputeMode_t mode = GENERATE(TW_COMPUTE_DEFAULT, TW_COMPUTE_FP8_WEIGHTS);
    INFO("mode " << mode);
    FfnCase c;
    c.m = 40;
    c.d = 96;
    c.h = 500;
    c.deterministic = 1;
    c.mode = mode;
    const FfnData data = make_data(c);
    FfnData doubled = data;  // Wd x 2: exact in bf16
    for (float &v : doubled.wd) v *= 2.0f;
    const FfnResult want = run_ffn(c, data, TW_BACKEND_CUDA), want2 = run_ffn(c, doubled, TW_BACKEND_CUDA);
    REQUIRE(want.y_bits != want2.y_bits);

    Handle h(TW_BACKEND_CUDA);
    Buffers buf(TW_BACKEND_CUDA);
    Dense x(c.m, c.d, c.type), wg(c.h, c.d, c.type), wu(c.h, c.d, c.type), wd(c.h, c.d, c.type),
        wd_orig(c.h, c.d, c.type), wd_doubled(c.h, c.d, c.type);
    x.fill(data.x);
    wg.fill(data.wg);
    wu.fill(data.wu);
    wd.fill(data.wd);
    wd_orig.fill(data.wd);
    wd_doubled.fill(doubled.wd);
    Dense y1(c.m, c.d, c.type), y2(c.m, c.d, c.type), y3(c.m, c.d, c.type);
    for (Dense *y : {&y1, &y2, &y3}) y->poison();
    const twDnMatDescr_t X = buf.input(x), WG = buf.input(wg), WU = buf.input(wu), WD = buf.input(wd);
    const twDnMatDescr_t Y1 = buf.output(y1), Y2 = buf.output(y2), Y3 = buf.output(y3);
    auto values = [](twDnMatDescr_t m) {
        int64_t rows = 0, cols = 0, ld = 0;
        void *v = nullptr;
        twDataType_t t;
        twOrder_t o;
        REQUIRE(twDnMatGet(m, &rows, &cols, &ld, &v, &t, &o) == TW_STATUS_SUCCESS);
        return std::make_pair(v, static_cast<size_t>(rows * ld) * (t == TW_R_32F ? 4 : 2));
    };
    const auto [wd_mem, wd_bytes] = values(WD);
    void *const orig_mem = values(buf.input(wd_orig)).first, *const doubled_mem = values(buf.input(wd_doubled)).first;
    twFfnDescr_t ffn = nullptr;
    TW_REQUIRE_OK(h, twCreateFfn(h, &ffn, TW_FFN_GATED_RELU, WG, WU, WD));
    TW_REQUIRE_OK(h, twFfnSetAttribute(ffn, TW_FFN_ATTR_DETERMINISTIC, &c.deterministic, sizeof c.deterministic));
    const int32_t mode_value = mode;
    TW_REQUIRE_OK(h, twFfnSetAttribute(ffn, TW_FFN_ATTR_COMPUTE_MODE, &mode_value, sizeof mode_value));
    size_t ws_bytes = 0;
    TW_REQUIRE_OK(h, twSpGEMMFused_bufferSize(h, ffn, X, Y1, &ws_bytes));
    void *ws = buf.memory(ws_bytes);
    TW_REQUIRE_OK(h, twSpGEMMFused(h, ffn, X, Y1, nullptr, ws));
    // eager, on a stream of its own: write Wd x 2, re-read it, forward
    cudaStream_t s;
    cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    TW_REQUIRE_OK(h, twSetStream(h, s));
    cuda_ok(cudaMemcpyAsync(wd_mem, doubled_mem, wd_bytes, cudaMemcpyDeviceToDevice, s));
    TW_REQUIRE_OK(h, twFfnUpdateWeights(h, ffn, WG, WU, WD));
    TW_REQUIRE_OK(h, twSpGEMMFused(h, ffn, X, Y2, nullptr, ws));
    cuda_ok(cudaStreamSynchronize(s));
    TW_REQUIRE_OK(h, twSetStream(h, nullptr));
    cudaStreamDestroy(s);
    // captured: the original Wd back, re-read, forward
    replay_captured(h, 1, [&]() -> twStatus_t {
        void *stream = nullptr;
        twStatus_t st = twGetStream(h, &stream);
        if (st != TW_STATUS_SUCCESS) return st;
        const auto cs = static_cast<cudaStream_t>(stream);
        if (cudaMemcpyAsync(wd_mem, orig_mem, wd_bytes, cudaMemcpyDeviceToDevice, cs) != cudaSuccess)
            return TW_STATUS_EXECUTION_FAILED;
        if ((st = twFfnUpdateWeights(h, ffn, WG, WU, WD)) != TW_STATUS_SUCCESS) return st;
        return twSpGEMMFused(h, ffn, X, Y3, nullptr, ws);
    });
    buf.fetch();
    auto bits = [&](const Dense &y) {
        std::vector<uint32_t> b;
        for (int64_t i = 0; i < c.m; ++i)
            for (int64_t k = 0; k < c.d; ++k) b.push_back(y.bits(i, k));
        return b;
    };
    CHECK(bits(y1) == want.y_bits);
    CHECK(bits(y2) == want2.y_bits);
    CHECK(bits(y3) == want.y_bits);
    twDestroyFfn(ffn);
}

namespace {

/// Where the weights of a case lie, and how many of the three matrices the CUDA FFN then copies
/// (gated, plain: a plain FFN's gate is Wu).
struct WeightPlacement {
    const char *name;
    int64_t d;
    twOrder_t wd_order;
    WeightLayout wg, wu, wd;
    int copied_gated, copied_plain;
};

const WeightPlacement kPlacements[] = {
    {"in place", 96, TW_ORDER_ROW, {}, {}, {}, 0, 0},
    {"in place, padded rows holding NaN", 96, TW_ORDER_ROW, {8, 0}, {16, 0}, {24, 0}, 0, 0},
    {"Wd column-major (nn.Linear)", 96, TW_ORDER_COL, {}, {}, {}, 1, 1},
    {"ld off 16 bytes", 96, TW_ORDER_ROW, {3, 0}, {}, {5, 0}, 2, 1},
    {"base off 16 bytes", 96, TW_ORDER_ROW, {}, {0, 8}, {}, 1, 1},
    {"odd D", 93, TW_ORDER_ROW, {}, {}, {}, 3, 2},
};

FfnCase placed(FfnCase c, const WeightPlacement &w) {
    c.d = w.d;
    c.wd_order = w.wd_order;
    c.wg_layout = w.wg;
    c.wu_layout = w.wu;
    c.wd_layout = w.wd;
    return c;
}

int64_t expected_copy_bytes(const FfnCase &c, const WeightPlacement &w) {
    const int64_t copied = c.gated ? w.copied_gated : w.copied_plain;
    return copied * c.h * ((c.d + 7) / 8 * 8) * (c.type == TW_R_32F ? 4 : 2);
}

}  // namespace

TEST_CASE("CUDA FFN: weights read in place or copied give the reference's results", "[cuda][ffn][weights]") {
    // every placement of the weights: read in place (no copy) or copied (Wd column-major, rows
    // whose ld or base is off 16 bytes, an odd D), against the CPU reference. Small integers,
    // bit for bit: 1 and 5 tokens (the serving path), 100 tokens dense enough that every row
    // takes the dense path (the gathered GEMM reading Wd^T in place), then dense mode (cuBLAS,
    // gate and up as one batched GEMM or two); random data on the sparse kernels (333 tokens),
    // deterministic: the placements of one D give the same bits.
    for (twDataType_t t : {TW_R_16BF, TW_R_32F})
        for (bool gated : {true, false}) {
            std::vector<uint32_t> sparse_bits;  // of the first placement with D = 96
            for (const WeightPlacement &w : kPlacements) {
                FfnCase base;
                base.type = t;
                base.gated = gated;
                base.h = 300;
                INFO(w.name << " type " << t << (gated ? " gated" : " plain"));
                for (int64_t m : {1, 5, 100}) {
                    if (m < 100 && t == TW_R_32F) continue;  // the serving path is 16-bit
                    FfnCase c = placed(base, w);
                    c.integers = true;
                    c.m = m;
                    INFO(describe(c));
                    const FfnData data = make_data(c);
                    const FfnResult cpu = run_ffn(c, data, TW_BACKEND_CPU);
                    const FfnResult gpu = run_ffn(c, data, TW_BACKEND_CUDA, FfnRun().times(2).with_stats_between());
                    REQUIRE(gpu.y_bits == cpu.y_bits);
                    CHECK(gpu.weight_copy_bytes == expected_copy_bytes(c, w));
                    for (size_t j = 0; j < cpu.counts.size(); ++j) CHECK(gpu.counts[j] == 2 * cpu.counts[j]);
                }
                FfnCase c = placed(base, w);
                c.m = 333;
                c.deterministic = 1;
                INFO(describe(c));
                const FfnData data = make_data(c);
                const FfnResult cpu = run_ffn(c, data, TW_BACKEND_CPU);
                const FfnResult gpu = run_ffn(c, data, TW_BACKEND_CUDA);
                const ErrorReport e = compare(gpu.y, cpu.y, c.d);
                INFO(e.worst);
                for (double v : gpu.y) REQUIRE(std::isfinite(v));
                REQUIRE(e.rel <= type_bound(c));
                CHECK(gpu.weight_copy_bytes == expected_copy_bytes(c, w));
                if (w.d == 96) {
                    if (sparse_bits.empty()) sparse_bits = gpu.y_bits;
                    CHECK(gpu.y_bits == sparse_bits);
                }
            }
        }
}

TEST_CASE("CUDA FFN: FP8 weights beside weights read in place or copied", "[cuda][ffn][weights][fp8]") {
    // the FP8 copy is the same bytes wherever the 16-bit weights lie: the same bits (serving path
    // at 1 and 13 tokens, the two-pass kernels at 200), and the copy is counted
    for (bool gated : {true, false})
        for (int64_t m : {1, 13, 200}) {
            std::vector<uint32_t> bits;
            for (const WeightPlacement &w : kPlacements) {
                if (w.d != 96) continue;
                FfnCase c;
                c.gated = gated;
                c.h = 300;
                c.m = m;
                c.mode = TW_COMPUTE_FP8_WEIGHTS;
                c.deterministic = 1;
                c = placed(c, w);
                INFO(w.name << ": " << describe(c));
                const FfnResult gpu = run_ffn(c, make_data(c), TW_BACKEND_CUDA);
                for (double v : gpu.y) REQUIRE(std::isfinite(v));
                if (bits.empty()) bits = gpu.y_bits;
                CHECK(gpu.y_bits == bits);
                CHECK(gpu.weight_copy_bytes == expected_copy_bytes(c, w) + c.h * ((gated ? 2 : 1) * 96 + 8));
            }
        }
}

TEST_CASE("CUDA FFN: weights read in place are read as they are; twFfnUpdateWeights re-points and re-copies",
          "[cuda][ffn][weights]") {
    // an FFN over in-place weights sees a change of their values at once (no update); one over
    // a copied Wd (column-major) sees it after twFfnUpdateWeights. Updates that move the weights
    // elsewhere, or change which are copied, are followed by the FFN's captured calls (the third
    // eager call of an argument set replays a graph captured with the weights' addresses).
    FfnCase c;
    c.m = 40;
    c.d = 96;
    c.h = 500;
    c.deterministic = 1;
    const FfnData data = make_data(c);
    FfnData doubled = data;  // Wd x 2: exact in bf16
    for (float &v : doubled.wd) v *= 2.0f;
    const FfnResult want = run_ffn(c, data, TW_BACKEND_CUDA), want2 = run_ffn(c, doubled, TW_BACKEND_CUDA);
    REQUIRE(want.y_bits != want2.y_bits);
    const int64_t wd_copy = c.h * c.d * 2;

    Handle h(TW_BACKEND_CUDA);
    Buffers buf(TW_BACKEND_CUDA);
    Dense x(c.m, c.d, c.type), wg(c.h, c.d, c.type), wu(c.h, c.d, c.type), wd(c.h, c.d, c.type),
        wd2(c.h, c.d, c.type), wd_col(c.h, c.d, c.type, TW_ORDER_COL), wd2_col(c.h, c.d, c.type, TW_ORDER_COL);
    x.fill(data.x);
    wg.fill(data.wg);
    wu.fill(data.wu);
    wd.fill(data.wd);
    wd2.fill(doubled.wd);
    wd_col.fill(data.wd);
    wd2_col.fill(doubled.wd);
    Dense y(c.m, c.d, c.type);
    const twDnMatDescr_t X = buf.input(x), WG = buf.input(wg), WU = buf.input(wu), WD = buf.input(wd),
                         WD2 = buf.input(wd2), WDC = buf.input(wd_col), WDC2 = buf.input(wd2_col), Y = buf.output(y);
    auto memory = [](twDnMatDescr_t m) {
        int64_t rows = 0, cols = 0, ld = 0;
        void *v = nullptr;
        twDataType_t t;
        twOrder_t o;
        REQUIRE(twDnMatGet(m, &rows, &cols, &ld, &v, &t, &o) == TW_STATUS_SUCCESS);
        return std::make_pair(v, static_cast<size_t>((o == TW_ORDER_ROW ? rows : cols) * ld) * 2);
    };
    twFfnDescr_t ffn = nullptr;
    TW_REQUIRE_OK(h, twCreateFfn(h, &ffn, TW_FFN_GATED_RELU, WG, WU, WD));
    TW_REQUIRE_OK(h, twFfnSetAttribute(ffn, TW_FFN_ATTR_DETERMINISTIC, &c.deterministic, sizeof c.deterministic));
    size_t ws_bytes = 0;
    TW_REQUIRE_OK(h, twSpGEMMFused_bufferSize(h, ffn, X, Y, &ws_bytes));
    void *ws = buf.memory(ws_bytes);
    const auto [y_mem, y_bytes] = memory(Y);
    auto y_bits = [&] {
        buf.fetch();
        std::vector<uint32_t> b;
        for (int64_t i = 0; i < c.m; ++i)
            for (int64_t k = 0; k < c.d; ++k) b.push_back(y.bits(i, k));
        return b;
    };
    // three calls each: the third replays the captured graph
    auto forward3 = [&] {
        for (int i = 0; i < 3; ++i) {
            cuda_ok(cudaMemset(y_mem, 0xff, y_bytes));  // NaN: each call writes every value
            TW_REQUIRE_OK(h, twSpGEMMFused(h, ffn, X, Y, nullptr, ws));
        }
        return y_bits();
    };
    auto copy_bytes = [&] {
        int64_t b = -1;
        REQUIRE(twFfnGetAttribute(ffn, TW_FFN_ATTR_WEIGHT_COPY_BYTES, &b, sizeof b) == TW_STATUS_SUCCESS);
        return b;
    };
    CHECK(copy_bytes() == 0);
    CHECK(forward3() == want.y_bits);
    // in place: the values as they are now, no update
    const auto [wd_mem, wd_bytes] = memory(WD);
    const auto [wd2_mem, wd2_bytes] = memory(WD2);
    REQUIRE(wd_bytes == wd2_bytes);
    std::vector<uint8_t> saved(wd_bytes);
    cuda_ok(cudaMemcpy(saved.data(), wd_mem, wd_bytes, cudaMemcpyDeviceToHost));
    cuda_ok(cudaMemcpy(wd_mem, wd2_mem, wd_bytes, cudaMemcpyDeviceToDevice));
    CHECK(forward3() == want2.y_bits);
    cuda_ok(cudaMemcpy(wd_mem, saved.data(), wd_bytes, cudaMemcpyHostToDevice));
    CHECK(forward3() == want.y_bits);
    // re-pointed to other memory: the captured graph of the old addresses is not replayed
    TW_REQUIRE_OK(h, twFfnUpdateWeights(h, ffn, WG, WU, WD2));
    CHECK(copy_bytes() == 0);
    CHECK(forward3() == want2.y_bits);
    // Wd column-major: copied (allocated), and that copy is what the FFN reads
    TW_REQUIRE_OK(h, twFfnUpdateWeights(h, ffn, WG, WU, WDC));
    CHECK(copy_bytes() == wd_copy);
    CHECK(forward3() == want.y_bits);
    const auto [wdc_mem, wdc_bytes] = memory(WDC);
    const auto [wdc2_mem, wdc2_bytes] = memory(WDC2);
    cuda_ok(cudaMemcpy(wdc_mem, wdc2_mem, wdc_bytes, cudaMemcpyDeviceToDevice));
    CHECK(forward3() == want.y_bits);  // the copy keeps the values of the update
    TW_REQUIRE_OK(h, twFfnUpdateWeights(h, ffn, WG, WU, WDC));  // the same descriptor: copied again
    CHECK(copy_bytes() == wd_copy);
    CHECK(forward3() == want2.y_bits);
    // back in place: the copy is given back
    TW_REQUIRE_OK(h, twFfnUpdateWeights(h, ffn, WG, WU, WD));
    CHECK(copy_bytes() == 0);
    CHECK(forward3() == want.y_bits);
    // outputs may not overlap weights read in place
    const twDnMatDescr_t onto_weights = [&] {
        twDnMatDescr_t d = nullptr;
        REQUIRE(twCreateDnMat(&d, c.m, c.d, c.d, wd_mem, c.type, TW_ORDER_ROW) == TW_STATUS_SUCCESS);
        return d;
    }();
    CHECK(twSpGEMMFused(h, ffn, X, onto_weights, nullptr, ws) == TW_STATUS_INVALID_VALUE);
    CHECK(std::string(twGetErrorMessage(h)).find("wDown") != std::string::npos);
    twDestroyDnMat(onto_weights);
    twDestroyFfn(ffn);
}

namespace {
/// TW_COMPUTE_FP8_WEIGHTS: each token's y is the FP8 forward's (the reference's, `fp8`) or, for a
/// token the CUDA backend runs on the 16-bit weights (its dense path, dense mode), DEFAULT's
/// (`dflt`). Checks the run against the closer of the two, row by row, within the reference's
/// bound, and returns how many rows were closer to FP8.
int64_t check_fp8_rows(const FfnCase &c, const FfnResult &got, const FfnResult &fp8, const FfnResult &dflt) {
    FfnResult want = fp8;
    int64_t fp8_rows = 0;
    for (int64_t i = 0; i < c.m; ++i) {
        double to_fp8 = 0, to_default = 0;
        for (int64_t k = 0; k < c.d; ++k) {
            const size_t at = static_cast<size_t>(i * c.d + k);
            to_fp8 += (got.y[at] - fp8.y[at]) * (got.y[at] - fp8.y[at]);
            to_default += (got.y[at] - dflt.y[at]) * (got.y[at] - dflt.y[at]);
        }
        if (to_fp8 <= to_default) {
            ++fp8_rows;
            continue;
        }
        for (int64_t k = 0; k < c.d; ++k) want.y[static_cast<size_t>(i * c.d + k)] = dflt.y[static_cast<size_t>(i * c.d + k)];
    }
    FfnExpected e;
    e.r = want;
    e.bound = type_bound(c);
    check_forward(c, got, e);
    return fp8_rows;
}
}  // namespace

TEST_CASE("CUDA FFN: TW_COMPUTE_FP8_WEIGHTS against the reference's FP8 forward", "[cuda][ffn][fp8]") {
    // the serving path's FP8 instances (serve_gate and serve_down at 1 and 13 tokens, the 13 with
    // a hidden output; cuBLAS's gate and serve_token at 37 and at 200, its 8-warp blocks) and the
    // two-pass kernels' (600 tokens, the masked gate GEMM); H and D off every tile; heavy and llm
    // rows (the serving path's windows; past it the dense path on the 16-bit weights); hidden
    // outputs from the h the kernels leave in the gate buffer
    uint64_t seed = 70;
    for (tt::Profile profile : {tt::Profile::Uniform, tt::Profile::Heavy, tt::Profile::Llm})
        for (twDataType_t t : {TW_R_16BF, TW_R_16F})
            for (bool gated : {true, false})
                for (int64_t m : {1, 13, 37, 200, 600}) {
                    FfnCase c;
                    c.profile = profile;
                    c.type = t;
                    c.mode = TW_COMPUTE_FP8_WEIGHTS;
                    c.gated = gated;
                    c.m = m;
                    c.d = gated ? 264 : 100;
                    c.h = 1001;
                    c.x_pad = m == 37 ? 8 : 0;
                    c.hidden = m == 600 || m == 13 ? (profile == tt::Profile::Heavy ? 2 : 1) : 0;
                    c.seed = ++seed;
                    const FfnData data = make_data(c);
                    FfnCase def = c;
                    def.mode = TW_COMPUTE_DEFAULT;
                    const FfnResult got = run_ffn(c, data, TW_BACKEND_CUDA), cpu = run_ffn(c, data, TW_BACKEND_CPU),
                                    cpu_default = run_ffn(def, data, TW_BACKEND_CPU);
                    const int64_t fp8_rows = check_fp8_rows(c, got, cpu, cpu_default);
                    // the bound (8 u) is near FP8's own distance from DEFAULT: show that these are
                    // FP8's results where no row is on the dense path (a row whose FP8 and DEFAULT
                    // results lie within rounding of each other may fall on either side; heavy and
                    // llm rows take the dense path, on the 16-bit weights, at any size)
                    const double to_fp8 = compare(got.y, cpu.y, c.d).rel, to_default = compare(got.y, cpu_default.y, c.d).rel;
                    INFO(describe(c) << ": from the reference's FP8 " << to_fp8 << ", from DEFAULT " << to_default
                                     << ", rows closer to FP8 " << fp8_rows);
                    if (profile == tt::Profile::Uniform) {
                        CHECK(to_default > 1e-3);
                        CHECK(10 * fp8_rows >= 9 * c.m);
                    }
                }
    // past 4096 columns with a hidden output: one split, two chunks a thread
    FfnCase c;
    c.mode = TW_COMPUTE_FP8_WEIGHTS;
    c.m = 20;
    c.d = 4100;
    c.h = 700;
    c.hidden = 1;
    c.seed = ++seed;
    const FfnData data = make_data(c);
    check_forward(c, run_ffn(c, data, TW_BACKEND_CUDA), expected_forward(c, data));
}

TEST_CASE("CUDA FFN: the serving path's FP8 instances in serve_down's groups against the reference's FP8 forward",
          "[cuda][ffn][fp8]") {
    // 300 units a token of 16384 (under the dense path's row limit, 512, and every tile's capacity):
    // after the first forward the plan gives serve_down three groups a (slice, token); the second
    // forward is checked row by row against the reference's FP8 forward
    uint64_t seed = 90;
    for (int64_t m : {1, 5, 16})
        for (bool gated : {true, false}) {
            FfnCase c;
            c.mode = TW_COMPUTE_FP8_WEIGHTS;
            c.algorithm = TW_FFN_ALG_SERVE;
            c.k = 300;
            c.h = 16384;
            c.d = 264;
            c.m = m;
            c.gated = gated;
            c.seed = ++seed;
            INFO(describe(c));
            const FfnData data = make_data(c);
            FfnCase def = c;
            def.mode = TW_COMPUTE_DEFAULT;
            const FfnResult cpu = run_ffn(c, data, TW_BACKEND_CPU), cpu_default = run_ffn(def, data, TW_BACKEND_CPU);
            REQUIRE(cpu.stats.meanRowNnz > 2 * 128);
            REQUIRE(cpu.stats.overflowRows == 0);
            const FfnResult got = run_ffn(c, data, TW_BACKEND_CUDA, FfnRun().times(2).with_stats_between());
            const int64_t fp8_rows = check_fp8_rows(c, got, cpu, cpu_default);
            CHECK(compare(got.y, cpu_default.y, c.d).rel > 1e-3);
            CHECK(fp8_rows == c.m);
        }
}

TEST_CASE("CUDA FFN: FP8 weights fall back to the 16-bit weights where a forward runs dense", "[cuda][ffn][fp8]") {
    // 40 units a token, past H / 128 but under the dense path's row limit (64): after the first
    // forward the statistics ask for dense mode, and FP8 follows DEFAULT there (cuBLAS on the
    // 16-bit weights): the second forward's y is DEFAULT's; pinned to the two-pass path, FP8's
    FfnCase c;
    c.mode = TW_COMPUTE_FP8_WEIGHTS;
    c.m = 700;
    c.d = 128;
    c.h = 1200;
    c.k = 40;
    c.seed = 77;
    const FfnData data = make_data(c);
    FfnCase def = c;
    def.mode = TW_COMPUTE_DEFAULT;
    const FfnResult cpu = run_ffn(c, data, TW_BACKEND_CPU), cpu_default = run_ffn(def, data, TW_BACKEND_CPU);
    const FfnResult dense = run_ffn(c, data, TW_BACKEND_CUDA, FfnRun().times(2).with_stats_between());
    CHECK(check_fp8_rows(c, dense, cpu, cpu_default) == 0);
    FfnCase pinned = c;
    pinned.algorithm = TW_FFN_ALG_TWO_PASS;
    const FfnResult sparse = run_ffn(pinned, data, TW_BACKEND_CUDA, FfnRun().times(2).with_stats_between());
    // (the few rows past the dense path's row limit read the 16-bit weights there too)
    CHECK(10 * check_fp8_rows(pinned, sparse, cpu, cpu_default) >= 9 * c.m);
}

TEST_CASE("CUDA backend: host memory in a descriptor is INVALID_VALUE naming the argument", "[cuda][errors]") {
    // plain malloc'd memory would fault inside a kernel; the backend checks where a descriptor
    // meets it (once per argument set for the fused forward)
    const int64_t m = 4, d = 64, hd = 300;
    Handle h(TW_BACKEND_CUDA);
    Buffers buf(TW_BACKEND_CUDA);
    FfnCase c;
    c.m = m, c.d = d, c.h = hd;
    const FfnData data = make_data(c);
    Dense x(m, d, c.type), y(m, d, c.type), wg(hd, d, c.type), wu(hd, d, c.type), wd(hd, d, c.type);
    x.fill(data.x), wg.fill(data.wg), wu.fill(data.wu), wd.fill(data.wd);
    const twDnMatDescr_t X = buf.input(x), Y = buf.output(y), WG = buf.input(wg), WU = buf.input(wu), WD = buf.input(wd);
    // the same matrices over host memory (the Dense storage itself)
    twDnMatDescr_t Xh = nullptr, Wgh = nullptr;
    REQUIRE(twCreateDnMat(&Xh, m, d, d, x.storage.data(), c.type, TW_ORDER_ROW) == TW_STATUS_SUCCESS);
    REQUIRE(twCreateDnMat(&Wgh, hd, d, d, wg.storage.data(), c.type, TW_ORDER_ROW) == TW_STATUS_SUCCESS);
    auto expect_invalid = [&](twStatus_t st, const char *name) {
        INFO(twGetErrorMessage(h));
        REQUIRE(st == TW_STATUS_INVALID_VALUE);
        REQUIRE(std::string(twGetErrorMessage(h)).find(name) == 0);
    };
    twFfnDescr_t ffn = nullptr;
    expect_invalid(twCreateFfn(h, &ffn, TW_FFN_GATED_RELU, Wgh, WU, WD), "wGate");
    REQUIRE(ffn == nullptr);
    TW_REQUIRE_OK(h, twCreateFfn(h, &ffn, TW_FFN_GATED_RELU, WG, WU, WD));
    size_t bytes = 0;
    TW_REQUIRE_OK(h, twSpGEMMFused_bufferSize(h, ffn, X, Y, &bytes));
    void *ws = buf.memory(bytes);
    std::vector<uint8_t> host_ws(bytes + 256);
    for (int i = 0; i < 3; ++i) {  // also after the device call was captured and replayed
        TW_REQUIRE_OK(h, twSpGEMMFused(h, ffn, X, Y, nullptr, ws));
        expect_invalid(twSpGEMMFused(h, ffn, Xh, Y, nullptr, ws), "X");
        expect_invalid(twSpGEMMFused(h, ffn, X, Y, nullptr, host_ws.data()), "workspace");
    }
    // the training calls check each pointer once and remember it: a host pointer is refused
    // every time, also between calls with device memory at the same arguments
    size_t saved_bytes = 0, bwd_bytes = 0;
    TW_REQUIRE_OK(h, twSpGEMMFusedSaved_bufferSize(h, ffn, m, &saved_bytes));
    TW_REQUIRE_OK(h, twSpGEMMFusedBackward_bufferSize(h, ffn, m, &bwd_bytes));
    void *saved = buf.memory(saved_bytes), *bws = buf.memory(bwd_bytes);
    Dense dx(m, d, c.type), dwg(hd, d, c.type), dwu(hd, d, c.type), dwd(hd, d, c.type);
    const twDnMatDescr_t DX = buf.output(dx), DWG = buf.output(dwg), DWU = buf.output(dwu), DWD = buf.output(dwd);
    for (int i = 0; i < 3; ++i) {
        TW_REQUIRE_OK(h, twSpGEMMFusedForwardTrain(h, ffn, X, Y, saved, ws));
        expect_invalid(twSpGEMMFusedForwardTrain(h, ffn, Xh, Y, saved, ws), "X");
        expect_invalid(twSpGEMMFusedForwardTrain(h, ffn, X, Y, host_ws.data(), ws), "saved");
        TW_REQUIRE_OK(h, twSpGEMMFusedBackward(h, ffn, X, saved, Y, 0.0f, DX, DWG, DWU, DWD, bws));
        expect_invalid(twSpGEMMFusedBackward(h, ffn, X, saved, Xh, 0.0f, DX, DWG, DWU, DWD, bws), "dY");
        expect_invalid(twSpGEMMFusedBackward(h, ffn, X, saved, Y, 0.0f, DX, DWG, DWU, DWD, host_ws.data()),
                       "workspace");
    }
    cuda_ok(cudaDeviceSynchronize());  // the accepted calls ran without a fault
    // a sparse container over host memory
    size_t tb = 0;
    REQUIRE(twTwellBufferSize(m, hd, 256, 8, &tb) == TW_STATUS_SUCCESS);
    std::vector<uint32_t> host_buf(tb / 4 + 1);
    twSpMatDescr_t S = nullptr;
    REQUIRE(twCreateTwell(&S, m, hd, 256, 8, host_buf.data(), c.type) == TW_STATUS_SUCCESS);
    expect_invalid(twSpMatValidate(h, S), "descr");
    twSpMatInfo_t info{};
    expect_invalid(twSpMatGetInfo(h, S, &info), "descr");
    twDestroySpMat(S);
    twDestroyFfn(ffn);
    twDestroyDnMat(Xh);
    twDestroyDnMat(Wgh);
}

namespace {

/// One thread's work on one GPU, with nothing shared: its own handle, device buffers, FFN and
/// workspace; `repeats` forwards, then Y's bits. No Catch2 macro here (they are not
/// thread-safe): the first failure is returned as text, checked after the join.
struct GpuForward {
    std::string error;
    std::vector<uint32_t> y_bits;
};

GpuForward forward_on_gpu(int device, const FfnCase &c, const Dense &x, const Dense *wg, const Dense &wu,
                          const Dense &wd, int repeats) {
    GpuForward out;
    std::vector<void *> mem;
    twHandle_t h = nullptr;
    std::vector<twDnMatDescr_t> descr;
    twFfnDescr_t ffn = nullptr;
    auto cuda = [&](cudaError_t e, const char *what) {
        if (e != cudaSuccess && out.error.empty()) out.error = std::string(what) + ": " + cudaGetErrorString(e);
        return e == cudaSuccess;
    };
    auto tw = [&](twStatus_t s, const char *what) {
        if (s != TW_STATUS_SUCCESS && out.error.empty())
            out.error = std::string(what) + ": " + twGetStatusName(s) + " " + twGetErrorMessage(h);
        return s == TW_STATUS_SUCCESS;
    };
    auto upload = [&](const Dense &m) -> twDnMatDescr_t {
        void *p = nullptr;
        const size_t bytes = m.storage.size() * 4;
        if (!cuda(cudaMalloc(&p, bytes), "cudaMalloc")) return nullptr;
        mem.push_back(p);
        if (!cuda(cudaMemcpy(p, m.storage.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy")) return nullptr;
        twDnMatDescr_t d = nullptr;
        if (!tw(twCreateDnMat(&d, m.rows, m.cols, m.ld, p, m.type, m.order), "twCreateDnMat")) return nullptr;
        descr.push_back(d);
        return d;
    };
    const size_t y_elems = static_cast<size_t>(c.m * c.d);
    const size_t y_bytes = y_elems * (c.type == TW_R_32F ? 4 : 2);
    void *y = nullptr, *ws = nullptr;
    twDnMatDescr_t Y = nullptr;
    size_t ws_bytes = 0;
    if (cuda(cudaSetDevice(device), "cudaSetDevice") && tw(twCreateWithBackend(&h, TW_BACKEND_CUDA), "twCreate")) {
        const twDnMatDescr_t X = upload(x), WU = upload(wu), WD = upload(wd), WG = wg ? upload(*wg) : nullptr;
        if (out.error.empty() && cuda(cudaMalloc(&y, y_bytes), "cudaMalloc") &&
            tw(twCreateDnMat(&Y, c.m, c.d, c.d, y, c.type, TW_ORDER_ROW), "twCreateDnMat") &&
            tw(twCreateFfn(h, &ffn, c.gated ? TW_FFN_GATED_RELU : TW_FFN_RELU, WG, WU, WD), "twCreateFfn") &&
            tw(twSpGEMMFused_bufferSize(h, ffn, X, Y, &ws_bytes), "twSpGEMMFused_bufferSize") &&
            cuda(cudaMalloc(&ws, std::max<size_t>(ws_bytes, 1)), "cudaMalloc")) {
            for (int i = 0; i < repeats && out.error.empty(); ++i) tw(twSpGEMMFused(h, ffn, X, Y, nullptr, ws), "twSpGEMMFused");
            std::vector<uint16_t> half(y_elems);
            std::vector<uint32_t> full(y_elems);
            // the handle's stream (the legacy default one), not cudaDeviceSynchronize: that fails
            // while another thread's FFN captures its call graph (docs/api-guide.md, eager calls)
            if (out.error.empty() && cuda(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize") &&
                cuda(cudaMemcpy(c.type == TW_R_32F ? static_cast<void *>(full.data()) : half.data(), y, y_bytes,
                                cudaMemcpyDeviceToHost),
                     "cudaMemcpy")) {
                for (size_t i = 0; i < y_elems; ++i) out.y_bits.push_back(c.type == TW_R_32F ? full[i] : half[i]);
            }
        }
    }
    twDestroyFfn(ffn);
    twDestroyDnMat(Y);
    for (twDnMatDescr_t d : descr) twDestroyDnMat(d);
    twDestroy(h);
    cudaFree(y);
    cudaFree(ws);
    for (void *p : mem) cudaFree(p);
    return out;
}

}  // namespace

TEST_CASE("CUDA FFN: eager calls with and without call graphs give the reference's bits", "[cuda]") {
    // Three calls an argument set (first sight, capture, replay), over more argument sets than an
    // FFN keeps graphs of (8), with TW_FFN_ATTR_CALL_GRAPHS 1 and 0 (every call launched
    // directly); small-integer data, so every sum is exact.
    FfnCase c;
    c.integers = true;
    c.m = 33;
    c.d = 72;
    c.h = 300;
    c.seed = 29;
    const FfnData data = make_data(c);
    const FfnResult cpu = run_ffn(c, data, TW_BACKEND_CPU);
    const FfnOperands in(c, data);
    for (int32_t graphs : {1, 0}) {
        DYNAMIC_SECTION("TW_FFN_ATTR_CALL_GRAPHS " << graphs) {
            Handle h(TW_BACKEND_CUDA);
            Buffers buf(TW_BACKEND_CUDA);
            twFfnDescr_t ffn = nullptr;
            TW_REQUIRE_OK(h, twCreateFfn(h, &ffn, TW_FFN_GATED_RELU, buf.input(in.wg), buf.input(in.wu), buf.input(in.wd)));
            REQUIRE(twFfnSetAttribute(ffn, TW_FFN_ATTR_CALL_GRAPHS, &graphs, sizeof graphs) == TW_STATUS_SUCCESS);
            const twDnMatDescr_t X = buf.input(in.x);
            constexpr int kOutputs = 10;
            std::vector<std::unique_ptr<Dense>> ys;
            std::vector<twDnMatDescr_t> Y;
            for (int i = 0; i < kOutputs; ++i) {
                ys.push_back(std::make_unique<Dense>(c.m, c.d, c.type));
                ys.back()->poison();
                Y.push_back(buf.output(*ys.back()));
            }
            size_t ws_bytes = 0;
            TW_REQUIRE_OK(h, twSpGEMMFused_bufferSize(h, ffn, X, Y[0], &ws_bytes));
            void *ws = buf.memory(ws_bytes);
            for (int i = 0; i < kOutputs; ++i)
                for (int call = 0; call < 3; ++call) TW_REQUIRE_OK(h, twSpGEMMFused(h, ffn, X, Y[static_cast<size_t>(i)], nullptr, ws));
            buf.fetch();
            for (int i = 0; i < kOutputs; ++i) {
                std::vector<uint32_t> bits;
                for (int64_t r = 0; r < c.m; ++r)
                    for (int64_t col = 0; col < c.d; ++col) bits.push_back(ys[static_cast<size_t>(i)]->bits(r, col));
                CHECK(bits == cpu.y_bits);
            }
            twDestroyFfn(ffn);
        }
    }
}

TEST_CASE("CUDA: threads on every GPU, each with its own handle and FFN, give the reference's bits", "[cuda][multi-gpu]") {
    // small-integer data: every sum is exact, so each GPU must give the CPU reference's bits; two
    // threads per GPU, so that threads also share a device (and one GPU is a valid machine)
    int gpus = 0;
    REQUIRE(cudaGetDeviceCount(&gpus) == cudaSuccess);
    REQUIRE(gpus >= 1);
    for (twDataType_t type : {TW_R_16BF, TW_R_32F}) {
        FfnCase c;
        c.integers = true;
        c.type = type;
        c.m = 257;
        c.d = 72;
        c.h = 300;
        c.seed = 23;
        const FfnData data = make_data(c);
        const FfnResult cpu = run_ffn(c, data, TW_BACKEND_CPU);
        const FfnOperands in(c, data);
        const int threads = 2 * gpus;
        std::vector<GpuForward> got(static_cast<size_t>(threads));
        std::vector<std::thread> pool;
        for (int i = 0; i < threads; ++i)
            pool.emplace_back(
                [&, i] { got[static_cast<size_t>(i)] = forward_on_gpu(i % gpus, c, in.x, &in.wg, in.wu, in.wd, 3); });
        for (std::thread &t : pool) t.join();
        for (int i = 0; i < threads; ++i) {
            INFO("type " << type << ", thread " << i << " on GPU " << i % gpus << " of " << gpus << ": "
                         << got[static_cast<size_t>(i)].error);
            REQUIRE(got[static_cast<size_t>(i)].error.empty());
            CHECK(got[static_cast<size_t>(i)].y_bits == cpu.y_bits);
        }
    }
}
