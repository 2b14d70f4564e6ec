// twblas benchmark suite (Google Benchmark): the fused sparse FFN against what a user can pick
// today on the same GPU, in the same run:
//   twblas        twSpGEMMFused (CUDA backend), replayed from a CUDA graph
//   dense         the dense cuBLAS FFN (src/testing/cuda/dense_ffn): cuBLASLt gate+up GEMM (one GEMM
//                 over [Wg; Wu]), ReLU*product kernel, down GEMM; replayed from a CUDA graph
//   dense_fused   the dense FFN as tuned inference engines run it (src/testing/cuda/dense_fused_ffn):
//                 gate+up as one CUTLASS sm_90a GEMM over interleaved weights with ReLU(z)*u in its
//                 epilogue (only h is written), then the cuBLASLt down GEMM; replayed from a CUDA
//                 graph, verified against dense (counter rel_err_vs_dense); skipped, with the
//                 reason, on GPUs other than sm_90 (TWBLAS_BENCH_DENSE_FUSED_TILE=wide|narrow
//                 forces its tile)
//   twblas_eager  twSpGEMMFused called as a C program calls it: no graph, one handle on its own
//                 non-blocking stream; counter host_us (host time per call)
//   dense_eager   the dense cuBLAS FFN called the same way; counter host_us
//   gate          the gate GEMM alone (X Wg^T): the floor no sparse method skips
//   cusparse      gate+up GEMM, ReLU*product, cusparseDenseToSparse (CSR), cusparseSpMM; cuSPARSE
//                 SDDMM has no bf16, so the up projection is dense (phases reported as counters)
//   cpu           the reference backend and a dense Eigen fp32 FFN (small M)
// Inputs come from the project's one generator (src/testing), are verified (twblas and
// dense_fused against the dense cuBLAS FFN) before timing, and rotate over three copies of X and
// of the weights so that repeated runs do not sit in L2. Timing: CUDA events, warm-up, 5
// repetitions (3 in suite sweep; the median reported).
// Eager variants: warm-up (for twblas several calls per instance and twFfnGetStats, so that the
// path settles, then more calls), then per iteration N back-to-back calls: host_us is the host
// time of the N enqueues (before any synchronisation) / N, the time is the stream time (CUDA
// events) / N, launch gaps included.
//
//   train_*       forward + backward: twSpGEMMFusedForwardTrain + twSpGEMMFusedBackward against
//                 the dense step (nine GEMMs' worth: [g|u], h, y; dH, dX, [dWg; dWu], dWd),
//                 gradients verified against it before timing
//
// The benchmark uses the public C API only (and src/testing, which does not use the library) and
// links libtwblas.so, so that one binary can time two builds: LD_LIBRARY_PATH=<old build>/src.
// Files: common.{hpp,cpp} (problem cache, timing, verification, registration helpers),
// bench_inference.cpp, bench_training.cpp, read_floor.cu (the read floor's kernel), and this one
// (suites, main).
//
//   twblas-bench [--tuning=name=value,...] [--algorithm=N] [--suite=full|profiles|decode|train|train-eager|eager|serving|serving-paper|
//                         serving-llama|crossover|crossover-serve|dense-crossover|heavy-rows|conversions|fp8|
//                         sweep|smoke]
//                [Google Benchmark flags]
// --tuning and --algorithm set every twblas FFN of the run (twFfnSetTuning, TW_FFN_ATTR_ALGORITHM):
// run twice, with and without, to compare two variants of the library without a rebuild.
// Suite eager: the eager points (uniform-29, M = 1, 8, 64, 512, both shapes) next to twblas and
// dense at the same M, for quick runs; full and decode include the eager points too. Suite
// crossover: M = 128 to 1024 at the paper's shape, to place the two-pass crossover. Suite
// crossover-serve: M = 128 to 256 in steps of 32, both shapes and Llama-3.2-3B's (3072 x 8192, also
// M = 16), where the serving path and serve_gate end for gates near 25 M weights. Suite
// serving: M = 1 to 512 (powers of two), both shapes, uniform-29 and llm-29, graph and eager,
// with the copy bandwidth and each shape's read floor measured first (floor/read/d<D>_h<H>/wg: a
// plain read of Wg's bytes from DRAM, counter read_bw); twblas points carry need_bw (bytes that
// must move per second: Wg, the union of the batch's active rows of Wu and Wd, X and Y),
// bytes_needed (those that must be read: all but Y) and read_rate (bytes_needed per second, which
// scripts/bench-report.py sets against read_bw); serving-paper and serving-llama run one shape
// each. Suite conversions
// (bench_conversions.cpp): twblas's dense <-> TwELL / hybrid conversions, validate, info and the
// hybrid transpose against cuSPARSE's dense <-> CSR on the FFN hidden activation (uniform-29 and
// llm-29, M = 4096, 16384, 65536), host time per call sequence, with the copy bandwidth first.
// Suite heavy-rows: llm-29 and heavy-29 at M = 512 to 4096, the batches whose rows on the dense path
// decide between dense mode and the sparse path (tuning knob dense_rows_dense_mode_max_tokens), and
// uniform-100 / uniform-911 at 512 (dense mode).
// Suite train-eager: the training step at the PyTorch example's layer sizes (d_model 512 and 1024,
// uniform-6, 8192 and 16384 tokens), graph-replayed and eager (train_twblas_eager,
// train_dense_eager: GPU time and host_us per step). Suite fp8: twblas_fp8 (TW_COMPUTE_FP8_WEIGHTS) next to twblas,
// dense and the gate GEMM at the paper's shape, M = 1 to 65536, and heavy-29 / llm-29 at 16384; groups from M = 64
// carry it too. Suite sweep: where sparse stops paying, at the paper's shape: uniform-29, -100, -300,
// -911 and -2816 (half the units) at 512 and 16384 tokens, each with twblas, twblas_fp8, dense,
// dense_fused and gate, and the training step (train_twblas, train_dense); 3 repetitions, so
// that the suite fits one device call (161 s on an H200). Every inference group (the groups of
// full, profiles, fp8, heavy-rows, crossover-serve, sweep, smoke) carries dense_fused beside
// dense.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common.hpp"

namespace {

using twbench::register_conversions;
using twbench::register_copy;
using twbench::register_eager;
using twbench::register_group;
using twbench::register_read_floor;
using twbench::register_train;
using twbench::register_train_eager;
using twbench::Shape;

void register_suite(const std::string &suite) {
    const Shape paper{2048, 5632}, llama{4096, 14336};
    const std::vector<int64_t> eager_ms{1, 8, 64, 512};
    if (suite == "smoke") {
        register_group({256, 1000}, "uniform-12", {64, 512}, true, true);
        register_train({256, 1000}, "heavy-12", {1000}, true);
        return;
    }
    if (suite == "eager") {  // the eager points next to their graph-replayed twins, for quick runs
        for (const Shape s : {paper, llama}) register_eager(s, "uniform-29", eager_ms, 512, true);
        return;
    }
    // the serving sizes: the copy bandwidth first, then per shape its read floor and M = 1 to 512;
    // serving-paper and serving-llama are its halves (the same names); a profile at a time
    // (--benchmark_filter='uniform-29|copy|floor', then 'llm-29|floor') keeps a run short
    if (suite == "serving" || suite == "serving-paper" || suite == "serving-llama") {
        register_copy();
        const std::vector<int64_t> serving_ms{1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
        for (const Shape s : {paper, llama}) {
            if ((suite == "serving-paper" && s.d != paper.d) || (suite == "serving-llama" && s.d != llama.d)) continue;
            register_read_floor(s);
            for (const char *prof : {"uniform-29", "llm-29"}) register_eager(s, prof, serving_ms, 512, true);
        }
        return;
    }
    if (suite == "conversions") {  // conversions against cuSPARSE; the copy bandwidth first
        register_copy();
        register_conversions();
        return;
    }
    if (suite == "fp8") {  // TW_COMPUTE_FP8_WEIGHTS next to DEFAULT, dense and the gate GEMM
        register_group(paper, "uniform-29", {1, 8, 64, 512, 4096, 16384, 65536}, false, false, 1);
        for (const char *prof : {"heavy-29", "llm-29"}) register_group(paper, prof, {16384}, false, false);
        return;
    }
    if (suite == "sweep") {  // the sparse/dense crossover: every variant from 29 to 2816 active units a token
        twbench::set_repetitions(3);
        for (const char *prof : {"uniform-29", "uniform-100", "uniform-300", "uniform-911", "uniform-2816"}) {
            register_group(paper, prof, {512, 16384}, false, false);
            register_train(paper, prof, {512, 16384}, false);  // the same problem (max_m 16384): generated once
        }
        return;
    }
    if (suite == "heavy-rows") {  // batches with rows on the dense path: each M its own problem (llm-29: the
        // first M tokens of a sequence, the first ~100 with hundreds of units; heavy-29: 1 % of rows)
        for (const char *prof : {"llm-29", "heavy-29"})
            for (int64_t m : {512, 1024, 2048, 4096}) register_group(paper, prof, {m}, false, false);
        // and dense mode proper (many units a token) at the sizes where its statistics pass folds
        for (const char *prof : {"uniform-100", "uniform-911"}) register_group(paper, prof, {512}, false, false);
        return;
    }
    if (suite == "dense-crossover") {  // dense mode against the gathers after a dense forward
        // (tuning knob dense_mode_gather_share): many active units a token, 2 to 48 tokens
        for (const char *prof : {"llm-29", "uniform-100", "uniform-300"})
            register_eager(paper, prof, {2, 4, 8, 16, 32, 48}, 512, true);
        return;
    }
    if (suite == "crossover") {  // the two-pass crossover (tuning knob two_pass_min_tokens), M = 128 to 1024
        register_eager(paper, "uniform-29", {128, 192, 256, 384, 512, 768, 1024}, 1024, true);
        return;
    }
    if (suite == "crossover-serve") {  // where the serving path ends (tuning knob serve_max_tokens), both shapes
        for (const Shape s : {paper, llama}) register_group(s, "uniform-29", {128, 160, 192, 224, 256}, false, false);
        // Llama-3.2-3B's FFN (3072 x 8192: 25.2 M gate weights, at tuning knob serve_gate_large_weights)
        register_group(Shape{3072, 8192}, "uniform-29", {16, 128, 160, 192, 224, 256}, false, false);
        return;
    }
    if (suite == "train-eager") {
        // the layers of examples/pytorch/train_sparse_lm.py (d_model 512 and 1024, d_ff
        // 4 d_model) at the tokens a GPU takes there and the sparsity training reaches (~6 active
        // units), graph-replayed and eager: how much of a small layer's step is host time
        for (const Shape s : {Shape{512, 2048}, Shape{1024, 4096}}) register_train_eager(s, "uniform-6", {8192, 16384});
        // and with 8 units firing on about every token (backward_hot_units' case)
        register_train_eager(Shape{512, 2048}, "uniform-6+hot-8", {8192});
        return;
    }
    if (suite == "full" || suite == "train") {
        register_train(paper, "uniform-29", {16384, 65536}, true);
        for (const char *prof : {"uniform-24", "uniform-39", "heavy-29", "llm-29"}) register_train(paper, prof, {16384}, false);
        for (const char *prof : {"uniform-100", "uniform-911"}) register_train(paper, prof, {16384}, true);
    }
    if (suite == "full" || suite == "decode") {
        register_group(paper, "uniform-29", {1, 8, 64, 512, 4096, 16384, 65536}, suite == "full", true);
        register_eager(paper, "uniform-29", eager_ms, 65536, false);  // the group's problem, not a new one
        if (suite == "decode") register_eager(llama, "uniform-29", eager_ms, 512, false);
    }
    if (suite == "full" || suite == "profiles") {
        for (const char *prof :
             {"uniform-24", "uniform-39", "uniform-100", "uniform-300", "uniform-911", "heavy-29", "llm-29"})
            register_group(paper, prof, {16384}, std::string(prof) == "heavy-29", false);
        register_group(llama, "uniform-29", {1, 64, 16384}, false, false);
    }
    if (suite == "full") register_eager(llama, "uniform-29", eager_ms, 16384, false);  // the llama group's problem
}

/// --benchmark_list_tests[=true|1]: listing needs no GPU.
bool listing_only(int argc, char **argv) {
    bool list = false;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--benchmark_list_tests" || a == "--benchmark_list_tests=true" || a == "--benchmark_list_tests=1")
            list = true;
        else if (a.rfind("--benchmark_list_tests=", 0) == 0)
            list = false;
    }
    return list;
}

}  // namespace

int main(int argc, char **argv) {
    using twbench::ck;
    using twbench::env;
    std::string suite = "full";
    std::vector<char *> args;
    std::string tuning_text, algorithm_text;
    for (int i = 0; i < argc; ++i) {
        if (std::strncmp(argv[i], "--suite=", 8) == 0) {
            suite = argv[i] + 8;
        } else if (std::strncmp(argv[i], "--tuning=", 9) == 0) {
            // name=value[,name=value...]: twFfnSetTuning on every twblas FFN of the run
            tuning_text = argv[i] + 9;
            std::string rest = tuning_text;
            while (!rest.empty()) {
                const size_t comma = rest.find(','), eq = rest.find('=');
                const std::string item = rest.substr(0, comma);
                if (eq == std::string::npos || eq > item.size()) {
                    std::fprintf(stderr, "twblas-bench: --tuning wants name=value[,name=value...], got %s\n", item.c_str());
                    return 2;
                }
                env.tuning.emplace_back(item.substr(0, eq), std::atof(item.c_str() + eq + 1));
                rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
            }
        } else if (std::strncmp(argv[i], "--algorithm=", 12) == 0) {
            algorithm_text = argv[i] + 12;  // TW_FFN_ATTR_ALGORITHM's value, 0 to 6
            env.algorithm = std::atoi(argv[i] + 12);
        } else {
            args.push_back(argv[i]);
        }
    }
    const bool list = listing_only(static_cast<int>(args.size()), args.data());
    int n = static_cast<int>(args.size());
    benchmark::Initialize(&n, args.data());
    register_suite(suite);
    if (list) {  // the names only: no GPU needed
        benchmark::RunSpecifiedBenchmarks();
        benchmark::Shutdown();
        return 0;
    }
    int device = 0;
    cudaDeviceProp prop{};
    if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
        std::fprintf(stderr, "twblas-bench: no usable GPU\n");
        return 1;
    }
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    benchmark::AddCustomContext("gpu", prop.name);
    benchmark::AddCustomContext("sm_count", std::to_string(prop.multiProcessorCount));
    benchmark::AddCustomContext("cuda_driver", std::to_string(driver));
    benchmark::AddCustomContext("cuda_runtime", std::to_string(runtime));
    benchmark::AddCustomContext("suite", suite);
    if (!tuning_text.empty()) benchmark::AddCustomContext("tuning", tuning_text);
    if (!algorithm_text.empty()) benchmark::AddCustomContext("algorithm", algorithm_text);
    ck(cudaStreamCreateWithFlags(&env.stream, cudaStreamNonBlocking), "stream");
    ck(cudaEventCreate(&env.e0), "event");
    ck(cudaEventCreate(&env.e1), "event");
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    twbench::release_conversions();
    twbench::release_problems();
    cudaEventDestroy(env.e0);
    cudaEventDestroy(env.e1);
    cudaStreamDestroy(env.stream);
    return 0;
}
