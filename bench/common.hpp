// What the benchmark's files share: the cache of generated problems on the GPU, timing (graph
// replay and eager), verification helpers and registration. Only public twblas headers and
// src/testing: the benchmark runs against any build of libtwblas.so.
#pragma once

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>
#include <twblas/twblas.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "testing/cuda/dense_ffn.hpp"
#include "testing/cuda/dense_fused_ffn.hpp"
#include "testing/cuda/device_memory.hpp"
#include "testing/problem.hpp"

namespace twbench {

namespace tt = twblas::testing;
using tt::DeviceMemory;

void ck(cudaError_t e, const char *what);
inline void ck(twStatus_t s, twHandle_t h, const char *what) {
    if (s != TW_STATUS_SUCCESS)
        throw std::runtime_error(std::string(what) + ": " + twGetStatusName(s) + ": " + twGetErrorMessage(h));
}

constexpr int kInstances = 3;  // copies of X and of the weights, rotated between runs

struct Shape {
    int64_t d, h;
};

/// One generated problem on the GPU (the largest M it is used at), three copies.
struct Problem {
    Shape shape{};
    std::string profile;
    int64_t max_m = 0;
    tt::FfnProblem host;
    std::vector<std::unique_ptr<DeviceMemory>> x, wgu, wd_lin;  // X; [Wg; Wu] (2H x D); Wd as nn.Linear (D x H)
    std::vector<std::unique_ptr<DeviceMemory>> wd_ffn;  // Wd as H x D rows: the layout the FFN reads in place
    std::unique_ptr<DeviceMemory> wd_rows;                      // Wd as H x D rows (cuSPARSE's B, dH = dY Wd^T)
    std::unique_ptr<DeviceMemory> train_dy;                     // dL/dY (max_m x D) of the training benchmarks
    std::vector<std::unique_ptr<DeviceMemory>> wgu_interleaved;  // [Wg; Wu] as dense_fused reads it (made on first use)
    twHandle_t handle = nullptr;                                // CUDA backend, on env.stream
    std::vector<twFfnDescr_t> ffn;
    std::map<int64_t, std::vector<uint16_t>> dense_y;  // dense cuBLAS output per M (verification)
    std::map<int64_t, int64_t> union_units;           // per M: see active_union() in bench_inference.cpp

    /// Instance `inst`'s weights as the dense baseline takes them.
    tt::DenseFfnWeights weights(int inst) const { return {wgu[inst]->get(), wd_lin[inst]->get(), wd_rows->get()}; }
    /// Instance `inst`'s weights as the dense_fused baseline takes them (interleaved on first use).
    tt::DenseFusedWeights fused_weights(int inst);
    ~Problem();
};

/// The benchmark's stream (non-blocking) and timing events, made in main, and what every twblas
/// FFN of the run is set to (--tuning, --algorithm): two variants compared without a rebuild.
struct Env {
    cudaStream_t stream = nullptr;
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    std::vector<std::pair<std::string, double>> tuning;  // twFfnSetTuning(name, value)
    int32_t algorithm = TW_FFN_ALG_DEFAULT;               // TW_FFN_ATTR_ALGORITHM
};
/// Applies env's tuning and algorithm to a CUDA FFN the benchmark made.
void configure_ffn(twFfnDescr_t ffn, twHandle_t h);
extern Env env;

/// The problem of (shape, profile, max_m), generated on first use; one is kept at a time.
std::shared_ptr<Problem> problem(Shape s, const std::string &profile, int64_t max_m);
/// Frees the kept problem (before the CUDA context goes).
void release_problems();

/// Copies `count` bf16 values back after the work queued on env.stream.
std::vector<uint16_t> download(const void *device, size_t count);
/// The dense cuBLAS FFN's output on instance 0 (M x D), computed once per problem and M.
const std::vector<uint16_t> &dense_reference(Problem &p, int64_t m);
/// Normwise relative error of bf16 `got` against `want`.
double rel_error(const std::vector<uint16_t> &got, const std::vector<uint16_t> &want);
void add_problem_counters(benchmark::State &state, const Problem &p, int64_t m);

/// Calls per timed interval: enough back-to-back work to hide the events' own resolution.
inline int batch_for(int64_t m) { return m <= 512 ? 20 : m <= 4096 ? 4 : 1; }

/// Times `launch(i)` (i = run number) with CUDA events; `batch` launches per timed interval.
template <class F>
void time_loop(benchmark::State &state, int batch, F &&launch) {
    int run = 0;
    for (int i = 0; i < 3 * kInstances; ++i) launch(run++);  // warm-up
    ck(cudaStreamSynchronize(env.stream), "warm-up");
    for (auto _ : state) {
        ck(cudaEventRecord(env.e0, env.stream), "cudaEventRecord");
        for (int b = 0; b < batch; ++b) launch(run++);
        ck(cudaEventRecord(env.e1, env.stream), "cudaEventRecord");
        ck(cudaEventSynchronize(env.e1), "cudaEventSynchronize");
        float ms = 0;
        ck(cudaEventElapsedTime(&ms, env.e0, env.e1), "cudaEventElapsedTime");
        state.SetIterationTime(ms * 1e-3 / batch);
    }
}

/// Eager timing, the call as a C program makes it (no graph): after warm-up calls, each
/// iteration enqueues `batch` calls back to back. The host time of the enqueues alone (before
/// any synchronisation) per call is the counter host_us; the iteration's time is the stream's
/// time per call (CUDA events around the batch), launch gaps included.
template <class F>
void time_eager(benchmark::State &state, int batch, F &&call) {
    int run = 0;
    for (int i = 0; i < 3 * kInstances; ++i) call(run++);  // warm-up
    ck(cudaStreamSynchronize(env.stream), "warm-up");
    double host_seconds = 0;
    int64_t calls = 0;
    for (auto _ : state) {
        ck(cudaEventRecord(env.e0, env.stream), "cudaEventRecord");
        const auto t0 = std::chrono::steady_clock::now();
        for (int b = 0; b < batch; ++b) call(run++);
        const auto t1 = std::chrono::steady_clock::now();
        ck(cudaEventRecord(env.e1, env.stream), "cudaEventRecord");
        ck(cudaEventSynchronize(env.e1), "cudaEventSynchronize");
        float ms = 0;
        ck(cudaEventElapsedTime(&ms, env.e0, env.e1), "cudaEventElapsedTime");
        state.SetIterationTime(ms * 1e-3 / batch);
        host_seconds += std::chrono::duration<double>(t1 - t0).count();
        calls += batch;
    }
    state.counters["host_us"] = calls ? host_seconds * 1e6 / static_cast<double>(calls) : 0.0;
}

/// One captured graph per instance (`count` of them); replaying graphs keeps launch gaps out (as
/// for decode in performance.md) and shows that the call works under capture.
template <class F>
std::vector<cudaGraphExec_t> capture(F &&body, int count = kInstances) {
    std::vector<cudaGraphExec_t> execs;
    for (int i = 0; i < count; ++i) {
        cudaGraph_t g;
        ck(cudaStreamBeginCapture(env.stream, cudaStreamCaptureModeThreadLocal), "begin capture");
        body(i);
        ck(cudaStreamEndCapture(env.stream, &g), "end capture");
        cudaGraphExec_t e;
        ck(cudaGraphInstantiate(&e, g, 0), "instantiate");
        cudaGraphDestroy(g);
        execs.push_back(e);
    }
    return execs;
}
/// Times the replay of captured graphs (time_loop, rotating over them), then destroys them.
void time_graphs(benchmark::State &state, int batch, std::vector<cudaGraphExec_t> &execs);

// ---- registration: ffn/<variant>/d<D>_h<H>/<profile>/m<M> (design/performance.md)

using BenchFn = void (*)(benchmark::State &, Shape, std::string, int64_t, int64_t);
std::string bench_name(const char *variant, Shape s, const std::string &profile, int64_t m);
/// Each repetition's timed loop runs about this long. The timers report a call's time (an
/// iteration's divided by its calls), and Google Benchmark's minimum time counts that reported
/// time, so a benchmark asks for kMinTimedSeconds / calls an iteration: at 20 calls an iteration
/// a minimum of 0.05 s would run each repetition for a second.
constexpr double kMinTimedSeconds = 0.05;
/// A GPU benchmark: manual time in microseconds, median of `repetitions` (set_repetitions, 5 by
/// default); `calls_per_iteration`: what its timer divides an iteration's time by.
void add(const std::string &name, BenchFn fn, Shape s, const std::string &profile, int64_t max_m, int64_t m,
         int calls_per_iteration);
/// The repetitions of the benchmarks add() registers from now on (a long suite takes fewer).
void set_repetitions(int repetitions);

// bench_inference.cpp
/// Every inference variant of one (shape, profile) over a list of M, all from one generated problem
/// (twblas_fp8 from `fp8_from` tokens on): twblas, twblas_fp8, dense, dense_fused, gate, then
/// cusparse and cpu where asked.
void register_group(Shape s, const std::string &profile, const std::vector<int64_t> &ms, bool cusparse, bool cpu,
                    int64_t fp8_from = 64);
/// twblas_eager and dense_eager at each M (after the graph-replayed twblas and dense when
/// `with_graph_replay`), from the problem of (s, profile, max_m).
void register_eager(Shape s, const std::string &profile, const std::vector<int64_t> &ms, int64_t max_m,
                    bool with_graph_replay);
/// copy/d2d/256MiB: the copy bandwidth, measured in the same run as the serving points.
void register_copy();
/// floor/read/d<D>_h<H>/wg: the read floor of the shape's gate weights, measured in the same run
/// as the serving points.
void register_read_floor(Shape s);
// read_floor.cu
/// Reads `bytes` (a multiple of 16) at `src` (16-byte aligned) once: 16-byte loads, 4 blocks an
/// SM; writes read_floor_out_bytes() at `out`.
void launch_read_floor(cudaStream_t stream, const void *src, size_t bytes, void *out);
size_t read_floor_out_bytes();
// bench_training.cpp
/// train_twblas and train_dense at each M; train_twblas_save_dense too when `save_dense`.
void register_train(Shape s, const std::string &profile, const std::vector<int64_t> &ms, bool save_dense);
/// train_twblas and train_dense with their eager twins (train_twblas_eager, train_dense_eager).
void register_train_eager(Shape s, const std::string &profile, const std::vector<int64_t> &ms);
// bench_conversions.cpp
/// conv/<variant>/d5632/<profile>/m<M>: twblas's conversions and cuSPARSE's on the FFN hidden
/// activation, uniform-29 and llm-29, M = 4096, 16384, 65536.
void register_conversions();
/// Frees the kept activation matrix (before the CUDA context goes).
void release_conversions();

}  // namespace twbench
