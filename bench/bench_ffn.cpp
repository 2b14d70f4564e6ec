// twblas benchmark suite (Google Benchmark): the fused sparse FFN against what a user can pick
// today on the same GPU, in the same run:
//   twblas      twSpGEMMFused (CUDA backend), replayed from a CUDA graph
//   dense       cuBLASLt gate+up GEMM (one GEMM over [Wg; Wu]), ReLU*product kernel, down GEMM
//   gate        the gate GEMM alone (X Wg^T): the floor no sparse method skips
//   cusparse    gate+up GEMM, ReLU*product, cusparseDenseToSparse (CSR), cusparseSpMM; cuSPARSE
//               SDDMM has no bf16, so the up projection is dense (phases reported as counters)
//   cpu         the reference backend and a dense Eigen fp32 FFN (small M)
// Inputs come from the project's one generator (src/testing), are verified (twblas against the
// dense cuBLAS FFN) before timing, and rotate over three copies of X and of the weights so that
// repeated runs do not sit in L2. Timing: CUDA events, warm-up, 5 repetitions (median reported).
//
//   train_*     forward + backward: twSpGEMMFusedForwardTrain + twSpGEMMFusedBackward against the
//               dense step (nine GEMMs' worth: [g|u], h, y; dH, dX, [dWg; dWu], dWd), gradients
//               verified against it before timing
//
//   twblas-bench [--suite=full|profiles|decode|train|smoke] [Google Benchmark flags]
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>
#include <cusparse.h>
#include <twblas/twblas.h>

#include <Eigen/Dense>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "baselines.hpp"
#include "device/lt_gemm.hpp"
#include "testing/problem.hpp"

namespace tt = twblas::testing;
using twblas::cuda::GemmOperand;
using twblas::cuda::GemmOutput;
using twblas::cuda::GemmRunner;

namespace {

void ck(cudaError_t e, const char *what) {
    if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
void ck(twStatus_t s, twHandle_t h, const char *what) {
    if (s != TW_STATUS_SUCCESS)
        throw std::runtime_error(std::string(what) + ": " + twGetStatusName(s) + ": " + twGetErrorMessage(h));
}
void ck(cusparseStatus_t s, const char *what) {
    if (s != CUSPARSE_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + ": " + cusparseGetErrorString(s));
}

struct DevMem {
    void *p = nullptr;
    explicit DevMem(size_t bytes) { ck(cudaMalloc(&p, std::max<size_t>(bytes, 256)), "cudaMalloc"); }
    ~DevMem() { cudaFree(p); }
    DevMem(const DevMem &) = delete;
    DevMem &operator=(const DevMem &) = delete;
    template <class T = void> T *get() const { return static_cast<T *>(p); }
};

float bf16_to_float(uint16_t b) {
    const uint32_t bits = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

constexpr int kInstances = 3;  // copies of X and of the weights, rotated between runs

struct Shape {
    int64_t d, h;
};

/// One generated problem on the GPU (the largest M it is used at), three copies.
struct Problem {
    Shape shape;
    std::string profile;
    int64_t max_m;
    tt::FfnProblem host;
    std::vector<std::unique_ptr<DevMem>> x, wgu, wd_lin;  // X; [Wg; Wu] (2H x D); Wd as nn.Linear (D x H)
    std::unique_ptr<DevMem> wd_rows;                        // Wd as H x D rows (cuSPARSE's B)
    twHandle_t handle = nullptr;
    std::vector<twFfnDescr_t> ffn;
    std::map<int64_t, std::vector<uint16_t>> dense_y;  // dense cuBLAS output per M (verification)

    ~Problem() {
        for (twFfnDescr_t f : ffn) twDestroyFfn(f);
        twDestroy(handle);
    }
};

struct Env {
    cudaStream_t stream = nullptr;
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    std::unique_ptr<GemmRunner> gemm;
    std::unique_ptr<DevMem> lt_ws;
    std::shared_ptr<Problem> current;
    std::string current_key;
} env;

std::shared_ptr<Problem> problem(Shape s, const std::string &profile, int64_t max_m) {
    const std::string key = std::to_string(s.d) + "/" + std::to_string(s.h) + "/" + profile + "/" + std::to_string(max_m);
    if (env.current_key == key) return env.current;
    env.current.reset();  // free the previous problem's memory first
    auto p = std::make_shared<Problem>();
    p->shape = s;
    p->profile = profile;
    p->max_m = max_m;
    tt::ProblemSpec spec;
    spec.tokens = max_m;
    spec.model_dim = s.d;
    spec.hidden_dim = s.h;
    spec.seed = 2026;
    if (!tt::parse_profile(profile, &spec.profile, &spec.active_units)) throw std::runtime_error("bad profile " + profile);
    p->host = tt::make_ffn_problem(spec);
    const auto x16 = tt::to_bf16(p->host.x);
    std::vector<uint16_t> gu16 = tt::to_bf16(p->host.w_gate);
    const auto u16 = tt::to_bf16(p->host.w_up);
    gu16.insert(gu16.end(), u16.begin(), u16.end());
    const auto wd_rows16 = tt::to_bf16(p->host.w_down);
    std::vector<uint16_t> wd_lin16(wd_rows16.size());
    for (int64_t j = 0; j < s.h; ++j)
        for (int64_t c = 0; c < s.d; ++c) wd_lin16[c * s.h + j] = wd_rows16[j * s.d + c];
    auto upload = [](const std::vector<uint16_t> &v) {
        auto m = std::make_unique<DevMem>(v.size() * 2);
        ck(cudaMemcpy(m->p, v.data(), v.size() * 2, cudaMemcpyHostToDevice), "upload");
        return m;
    };
    ck(twCreateWithBackend(&p->handle, TW_BACKEND_CUDA), nullptr, "twCreateWithBackend(CUDA)");
    ck(twSetStream(p->handle, env.stream), p->handle, "twSetStream");
    for (int i = 0; i < kInstances; ++i) {
        p->x.push_back(upload(x16));
        p->wgu.push_back(upload(gu16));
        p->wd_lin.push_back(upload(wd_lin16));
        twDnMatDescr_t wg, wu, wd;
        ck(twCreateDnMat(&wg, s.h, s.d, s.d, p->wgu[i]->get<uint16_t>(), TW_R_16BF, TW_ORDER_ROW), nullptr, "Wg");
        ck(twCreateDnMat(&wu, s.h, s.d, s.d, p->wgu[i]->get<uint16_t>() + s.h * s.d, TW_R_16BF, TW_ORDER_ROW), nullptr, "Wu");
        ck(twCreateDnMat(&wd, s.h, s.d, s.h, p->wd_lin[i]->p, TW_R_16BF, TW_ORDER_COL), nullptr, "Wd");
        twFfnDescr_t f = nullptr;
        ck(twCreateFfn(p->handle, &f, TW_FFN_GATED_RELU, wg, wu, wd), p->handle, "twCreateFfn");
        p->ffn.push_back(f);
        for (twDnMatDescr_t d : {wg, wu, wd}) twDestroyDnMat(d);
    }
    p->wd_rows = upload(wd_rows16);
    env.current = p;
    env.current_key = key;
    return p;
}

/// Times `launch(i)` (i = run number) with CUDA events; `batch` launches per timed interval.
template <class F> void time_loop(benchmark::State &state, int batch, F &&launch) {
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

int batch_for(int64_t m) { return m <= 512 ? 20 : m <= 4096 ? 4 : 1; }

/// One captured graph per instance; replaying graphs keeps launch gaps out (as for decode in
/// performance.md) and shows that the call works under capture.
template <class F> std::vector<cudaGraphExec_t> capture(F &&body) {
    std::vector<cudaGraphExec_t> execs;
    for (int i = 0; i < kInstances; ++i) {
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
void destroy(std::vector<cudaGraphExec_t> &execs) {
    for (auto e : execs) cudaGraphExecDestroy(e);
    execs.clear();
}

// ---- the dense cuBLAS FFN

struct DenseBuffers {
    std::unique_ptr<DevMem> gu, hbuf, y;
    DenseBuffers(int64_t m, Shape s)
        : gu(new DevMem(static_cast<size_t>(m * 2 * s.h) * 2)), hbuf(new DevMem(static_cast<size_t>(m * s.h) * 2)),
          y(new DevMem(static_cast<size_t>(m * s.d) * 2)) {}
};

void dense_ffn(Problem &p, int inst, int64_t m, DenseBuffers &b) {
    const Shape s = p.shape;
    env.gemm->run(env.stream, 1.0f, GemmOperand{p.x[inst]->p, m, s.d, s.d, TW_ORDER_ROW, TW_R_16BF},
                  GemmOperand{p.wgu[inst]->p, 2 * s.h, s.d, s.d, TW_ORDER_ROW, TW_R_16BF},
                  GemmOutput{b.gu->p, 2 * s.h, TW_R_16BF}, env.lt_ws->p, GemmRunner::kWorkspaceBytes);
    twbench::relu_mul(env.stream, b.gu->p, m, s.h, b.hbuf->p);
    env.gemm->run(env.stream, 1.0f, GemmOperand{b.hbuf->p, m, s.h, s.h, TW_ORDER_ROW, TW_R_16BF},
                  GemmOperand{p.wd_lin[inst]->p, s.d, s.h, s.h, TW_ORDER_ROW, TW_R_16BF},
                  GemmOutput{b.y->p, s.d, TW_R_16BF}, env.lt_ws->p, GemmRunner::kWorkspaceBytes);
}

const std::vector<uint16_t> &dense_reference(Problem &p, int64_t m) {
    auto it = p.dense_y.find(m);
    if (it != p.dense_y.end()) return it->second;
    DenseBuffers b(m, p.shape);
    dense_ffn(p, 0, m, b);
    std::vector<uint16_t> y(static_cast<size_t>(m * p.shape.d));
    ck(cudaMemcpyAsync(y.data(), b.y->p, y.size() * 2, cudaMemcpyDeviceToHost, env.stream), "download");
    ck(cudaStreamSynchronize(env.stream), "dense reference");
    return p.dense_y[m] = std::move(y);
}

double rel_error(const std::vector<uint16_t> &got, const std::vector<uint16_t> &want) {
    double num = 0, den = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double a = bf16_to_float(got[i]), b = bf16_to_float(want[i]);
        num += (a - b) * (a - b);
        den += b * b;
    }
    return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

void add_problem_counters(benchmark::State &state, Problem &p, int64_t m) {
    state.counters["tokens"] = static_cast<double>(m);
    state.counters["d"] = static_cast<double>(p.shape.d);
    state.counters["h"] = static_cast<double>(p.shape.h);
    state.SetLabel(p.profile);
}

// ---- benchmarks

void bm_twblas(benchmark::State &state, Shape s, std::string profile, int64_t max_m, int64_t m) {
    auto p = problem(s, profile, max_m);
    twDnMatDescr_t x[kInstances], y;
    DevMem ybuf(static_cast<size_t>(m * s.d) * 2);
    for (int i = 0; i < kInstances; ++i)
        ck(twCreateDnMat(&x[i], m, s.d, s.d, p->x[i]->p, TW_R_16BF, TW_ORDER_ROW), nullptr, "X");
    ck(twCreateDnMat(&y, m, s.d, s.d, ybuf.p, TW_R_16BF, TW_ORDER_ROW), nullptr, "Y");
    size_t bytes = 0;
    ck(twSpGEMMFused_bufferSize(p->handle, p->ffn[0], x[0], y, &bytes), p->handle, "bufferSize");
    DevMem ws(bytes);
    // the path (sparse, dense-path capacity, dense mode) follows the statistics of the previous
    // forward: every instance gets one forward before it is verified and captured
    for (int i = 0; i < kInstances; ++i) {
        ck(twSpGEMMFused(p->handle, p->ffn[i], x[i], y, nullptr, ws.p), p->handle, "twSpGEMMFused");
        twFfnStats_t si{};
        ck(twFfnGetStats(p->handle, p->ffn[i], &si), p->handle, "stats");
    }
    // verify before timing: against the dense cuBLAS FFN of the same data
    ck(cudaMemsetAsync(ybuf.p, 0xff, static_cast<size_t>(m * s.d) * 2, env.stream), "poison");
    ck(twSpGEMMFused(p->handle, p->ffn[0], x[0], y, nullptr, ws.p), p->handle, "twSpGEMMFused");
    std::vector<uint16_t> got(static_cast<size_t>(m * s.d));
    ck(cudaMemcpyAsync(got.data(), ybuf.p, got.size() * 2, cudaMemcpyDeviceToHost, env.stream), "download");
    ck(cudaStreamSynchronize(env.stream), "twblas forward");
    const double err = rel_error(got, dense_reference(*p, m));
    twFfnStats_t st{};
    ck(twFfnGetStats(p->handle, p->ffn[0], &st), p->handle, "stats");
    if (!(err < 2e-2)) state.SkipWithError(("twblas differs from the dense FFN: rel. error " + std::to_string(err)).c_str());

    auto execs = capture([&](int i) { ck(twSpGEMMFused(p->handle, p->ffn[i], x[i], y, nullptr, ws.p), p->handle, "capture"); });
    time_loop(state, batch_for(m), [&](int run) { ck(cudaGraphLaunch(execs[run % kInstances], env.stream), "launch"); });
    destroy(execs);
    add_problem_counters(state, *p, m);
    state.counters["rel_err_vs_dense"] = err;
    state.counters["mean_nnz"] = st.meanRowNnz;
    state.counters["max_nnz"] = static_cast<double>(st.maxRowNnz);
    state.counters["overflow_rows"] = static_cast<double>(st.overflowRows);
    for (auto &d : x) twDestroyDnMat(d);
    twDestroyDnMat(y);
}

void bm_dense(benchmark::State &state, Shape s, std::string profile, int64_t max_m, int64_t m) {
    auto p = problem(s, profile, max_m);
    DenseBuffers b(m, s);
    dense_reference(*p, m);
    auto execs = capture([&](int i) { dense_ffn(*p, i, m, b); });
    time_loop(state, batch_for(m), [&](int run) { ck(cudaGraphLaunch(execs[run % kInstances], env.stream), "launch"); });
    destroy(execs);
    add_problem_counters(state, *p, m);
}

void bm_gate(benchmark::State &state, Shape s, std::string profile, int64_t max_m, int64_t m) {
    auto p = problem(s, profile, max_m);
    DevMem g(static_cast<size_t>(m * s.h) * 2);
    auto execs = capture([&](int i) {
        env.gemm->run(env.stream, 1.0f, GemmOperand{p->x[i]->p, m, s.d, s.d, TW_ORDER_ROW, TW_R_16BF},
                      GemmOperand{p->wgu[i]->p, s.h, s.d, s.d, TW_ORDER_ROW, TW_R_16BF},
                      GemmOutput{g.p, s.h, TW_R_16BF}, env.lt_ws->p, GemmRunner::kWorkspaceBytes);
    });
    time_loop(state, batch_for(m), [&](int run) { ck(cudaGraphLaunch(execs[run % kInstances], env.stream), "launch"); });
    destroy(execs);
    add_problem_counters(state, *p, m);
}

/// cuSPARSE pipeline; dense -> CSR needs the nnz on the host, so it is not capturable: each
/// phase is timed with its own events and the sum is the benchmark's time.
void bm_cusparse(benchmark::State &state, Shape s, std::string profile, int64_t max_m, int64_t m) {
    auto p = problem(s, profile, max_m);
    DenseBuffers b(m, s);
    cusparseHandle_t sp;
    ck(cusparseCreate(&sp), "cusparseCreate");
    ck(cusparseSetStream(sp, env.stream), "cusparseSetStream");
    const int64_t cap = m * s.h / 4;  // CSR capacity: 25 % density
    DevMem offsets(static_cast<size_t>(m + 1) * 4), cols(static_cast<size_t>(cap) * 4), vals(static_cast<size_t>(cap) * 2);
    cusparseDnMatDescr_t hd, wd, yd;
    cusparseSpMatDescr_t hs;
    ck(cusparseCreateDnMat(&hd, m, s.h, s.h, b.hbuf->p, CUDA_R_16BF, CUSPARSE_ORDER_ROW), "dn H");
    ck(cusparseCreateDnMat(&wd, s.h, s.d, s.d, p->wd_rows->p, CUDA_R_16BF, CUSPARSE_ORDER_ROW), "dn Wd");
    ck(cusparseCreateDnMat(&yd, m, s.d, s.d, b.y->p, CUDA_R_16BF, CUSPARSE_ORDER_ROW), "dn Y");
    ck(cusparseCreateCsr(&hs, m, s.h, 0, offsets.p, nullptr, nullptr, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                         CUSPARSE_INDEX_BASE_ZERO, CUDA_R_16BF),
       "csr");
    size_t conv_bytes = 0, mm_bytes = 0;
    ck(cusparseDenseToSparse_bufferSize(sp, hd, hs, CUSPARSE_DENSETOSPARSE_ALG_DEFAULT, &conv_bytes), "d2s size");
    DevMem conv_ws(conv_bytes);
    const float one = 1.0f, zero = 0.0f;
    // SpMM workspace is sized with the real pattern, after a first conversion
    auto convert = [&]() {
        ck(cusparseDenseToSparse_analysis(sp, hd, hs, CUSPARSE_DENSETOSPARSE_ALG_DEFAULT, conv_ws.p), "d2s analysis");
        int64_t r, c, nnz;
        ck(cusparseSpMatGetSize(hs, &r, &c, &nnz), "get size");  // synchronises
        if (nnz > cap) throw std::runtime_error("cuSPARSE pipeline: CSR capacity too small");
        ck(cusparseCsrSetPointers(hs, offsets.p, cols.p, vals.p), "set pointers");
        ck(cusparseDenseToSparse_convert(sp, hd, hs, CUSPARSE_DENSETOSPARSE_ALG_DEFAULT, conv_ws.p), "d2s convert");
    };
    auto front = [&](int i) {
        env.gemm->run(env.stream, 1.0f, GemmOperand{p->x[i]->p, m, s.d, s.d, TW_ORDER_ROW, TW_R_16BF},
                      GemmOperand{p->wgu[i]->p, 2 * s.h, s.d, s.d, TW_ORDER_ROW, TW_R_16BF},
                      GemmOutput{b.gu->p, 2 * s.h, TW_R_16BF}, env.lt_ws->p, GemmRunner::kWorkspaceBytes);
        twbench::relu_mul(env.stream, b.gu->p, m, s.h, b.hbuf->p);
    };
    front(0);
    convert();
    ck(cusparseSpMM_bufferSize(sp, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, hs, wd,
                               &zero, yd, CUDA_R_32F, CUSPARSE_SPMM_ALG_DEFAULT, &mm_bytes),
       "spmm size");
    DevMem mm_ws(mm_bytes);
    auto spmm = [&]() {
        ck(cusparseSpMM(sp, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, hs, wd, &zero, yd,
                        CUDA_R_32F, CUSPARSE_SPMM_ALG_DEFAULT, mm_ws.p),
           "spmm");
    };
    spmm();
    std::vector<uint16_t> got(static_cast<size_t>(m * s.d));
    ck(cudaMemcpyAsync(got.data(), b.y->p, got.size() * 2, cudaMemcpyDeviceToHost, env.stream), "download");
    ck(cudaStreamSynchronize(env.stream), "cusparse");
    const double err = rel_error(got, dense_reference(*p, m));

    cudaEvent_t ev[4];
    for (auto &e : ev) ck(cudaEventCreate(&e), "event");
    double t_front = 0, t_conv = 0, t_mm = 0;
    int n = 0, run = 0;
    for (auto _ : state) {
        const int i = run++ % kInstances;
        ck(cudaEventRecord(ev[0], env.stream), "rec");
        front(i);
        ck(cudaEventRecord(ev[1], env.stream), "rec");
        convert();
        ck(cudaEventRecord(ev[2], env.stream), "rec");
        spmm();
        ck(cudaEventRecord(ev[3], env.stream), "rec");
        ck(cudaEventSynchronize(ev[3]), "sync");
        float a, c, d;
        cudaEventElapsedTime(&a, ev[0], ev[1]);
        cudaEventElapsedTime(&c, ev[1], ev[2]);
        cudaEventElapsedTime(&d, ev[2], ev[3]);
        t_front += a, t_conv += c, t_mm += d, ++n;
        state.SetIterationTime((a + c + d) * 1e-3);
    }
    for (auto &e : ev) cudaEventDestroy(e);
    add_problem_counters(state, *p, m);
    state.counters["rel_err_vs_dense"] = err;
    state.counters["gemm_relu_mul_ms"] = n ? t_front / n : 0;
    state.counters["dense_to_csr_ms"] = n ? t_conv / n : 0;
    state.counters["csr_spmm_ms"] = n ? t_mm / n : 0;
    cusparseDestroySpMat(hs);
    cusparseDestroyDnMat(hd);
    cusparseDestroyDnMat(wd);
    cusparseDestroyDnMat(yd);
    cusparseDestroy(sp);
}

/// The reference backend (host memory), and a dense Eigen fp32 FFN on the same data.
void bm_cpu(benchmark::State &state, Shape s, std::string profile, int64_t max_m, int64_t m, bool sparse) {
    auto p = problem(s, profile, max_m);
    using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    const tt::FfnProblem &hp = p->host;
    auto run_timed = [&](auto &&f) {
        f();
        for (auto _ : state) {
            const auto t0 = std::chrono::steady_clock::now();
            f();
            state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
    };
    if (sparse) {
        twHandle_t h;
        ck(twCreateWithBackend(&h, TW_BACKEND_CPU), nullptr, "cpu handle");
        twDnMatDescr_t x, y, wg, wu, wd;
        std::vector<float> yv(static_cast<size_t>(m * s.d));
        ck(twCreateDnMat(&x, m, s.d, s.d, const_cast<float *>(hp.x.data()), TW_R_32F, TW_ORDER_ROW), h, "x");
        ck(twCreateDnMat(&y, m, s.d, s.d, yv.data(), TW_R_32F, TW_ORDER_ROW), h, "y");
        ck(twCreateDnMat(&wg, s.h, s.d, s.d, const_cast<float *>(hp.w_gate.data()), TW_R_32F, TW_ORDER_ROW), h, "wg");
        ck(twCreateDnMat(&wu, s.h, s.d, s.d, const_cast<float *>(hp.w_up.data()), TW_R_32F, TW_ORDER_ROW), h, "wu");
        ck(twCreateDnMat(&wd, s.h, s.d, s.d, const_cast<float *>(hp.w_down.data()), TW_R_32F, TW_ORDER_ROW), h, "wd");
        twFfnDescr_t f;
        ck(twCreateFfn(h, &f, TW_FFN_GATED_RELU, wg, wu, wd), h, "ffn");
        size_t bytes = 0;
        ck(twSpGEMMFused_bufferSize(h, f, x, y, &bytes), h, "size");
        std::vector<uint8_t> ws(std::max<size_t>(bytes, 1));
        run_timed([&] { ck(twSpGEMMFused(h, f, x, y, nullptr, ws.data()), h, "cpu forward"); });
        twDestroyFfn(f);
        for (auto d : {x, y, wg, wu, wd}) twDestroyDnMat(d);
        twDestroy(h);
    } else {
        const Eigen::Map<const RowMatrix> x(hp.x.data(), m, s.d), wg(hp.w_gate.data(), s.h, s.d),
            wu(hp.w_up.data(), s.h, s.d), wd(hp.w_down.data(), s.h, s.d);
        RowMatrix g(m, s.h), u(m, s.h), y(m, s.d);
        run_timed([&] {
            g.noalias() = x * wg.transpose();
            u.noalias() = x * wu.transpose();
            g = g.cwiseMax(0.0f).cwiseProduct(u);
            y.noalias() = g * wd;
        });
    }
    add_problem_counters(state, *p, m);
}


// ---- training: forward + backward

constexpr float kL1Coeff = 1e-3f;

/// Gradient buffers (bf16, row-major): dX (M x D), [dWg; dWu] (2H x D), dWd (H x D).
struct TrainGrads {
    std::unique_ptr<DevMem> dx, dwgu, dwd;
    TrainGrads(int64_t m, Shape s)
        : dx(new DevMem(static_cast<size_t>(m * s.d) * 2)), dwgu(new DevMem(static_cast<size_t>(2 * s.h * s.d) * 2)),
          dwd(new DevMem(static_cast<size_t>(s.h * s.d) * 2)) {}
    std::vector<uint16_t> download(const DevMem &b, size_t n) const {
        std::vector<uint16_t> v(n);
        ck(cudaMemcpyAsync(v.data(), b.p, n * 2, cudaMemcpyDeviceToHost, env.stream), "download");
        ck(cudaStreamSynchronize(env.stream), "download");
        return v;
    }
};

/// dL/dY of the training benchmarks (bf16, M x D, seeded), one per problem.
const DevMem &train_dy(Problem &p) {
    static std::map<Problem *, std::unique_ptr<DevMem>> cache;
    auto &slot = cache[&p];
    if (!slot) {
        std::vector<float> v(static_cast<size_t>(p.max_m * p.shape.d));
        uint64_t state = 0x9e3779b97f4a7c15ull;
        for (float &f : v) {  // uniform in [-1, 1): xorshift, reproducible everywhere
            state ^= state << 13, state ^= state >> 7, state ^= state << 17;
            f = static_cast<float>(static_cast<double>(state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
        }
        const auto b16 = tt::to_bf16(v);
        slot = std::make_unique<DevMem>(b16.size() * 2);
        ck(cudaMemcpy(slot->p, b16.data(), b16.size() * 2, cudaMemcpyHostToDevice), "upload dY");
    }
    return *slot;
}

/// The dense training step a user writes today: forward as dense_ffn (keeping [g | u] and h),
/// then dH = dY Wd^T, the element-wise ReLU/product backward (with the L1 term), dX = dGU [Wg; Wu],
/// [dWg; dWu] = dGU^T X, dWd = H^T dY: nine GEMMs' worth of flops.
struct DenseTrain {
    DenseBuffers fwd;
    std::unique_ptr<DevMem> dh, dgu;
    TrainGrads grads;
    DenseTrain(int64_t m, Shape s)
        : fwd(m, s), dh(new DevMem(static_cast<size_t>(m * s.h) * 2)), dgu(new DevMem(static_cast<size_t>(m * 2 * s.h) * 2)),
          grads(m, s) {}
};

void dense_train(Problem &p, int inst, int64_t m, DenseTrain &b, const DevMem &dy) {
    const Shape s = p.shape;
    auto gemm = [&](GemmOperand a, GemmOperand bb, GemmOutput z) {
        env.gemm->run(env.stream, 1.0f, a, bb, z, env.lt_ws->p, GemmRunner::kWorkspaceBytes);
    };
    dense_ffn(p, inst, m, b.fwd);
    gemm({dy.p, m, s.d, s.d, TW_ORDER_ROW, TW_R_16BF}, {p.wd_rows->p, s.h, s.d, s.d, TW_ORDER_ROW, TW_R_16BF},
         {b.dh->p, s.h, TW_R_16BF});
    twbench::relu_mul_backward(env.stream, b.fwd.gu->p, b.dh->p, m, s.h, m > 0 ? kL1Coeff / static_cast<float>(m) : 0.0f,
                               b.dgu->p);
    // dX = dGU [Wg; Wu]: B = [Wg; Wu]^T (D x 2H) is the column-major view of the 2H x D weights
    gemm({b.dgu->p, m, 2 * s.h, 2 * s.h, TW_ORDER_ROW, TW_R_16BF}, {p.wgu[inst]->p, s.d, 2 * s.h, s.d, TW_ORDER_COL, TW_R_16BF},
         {b.grads.dx->p, s.d, TW_R_16BF});
    // [dWg; dWu] = dGU^T X and dWd = H^T dY (column-major views of the M-row matrices)
    gemm({b.dgu->p, 2 * s.h, m, 2 * s.h, TW_ORDER_COL, TW_R_16BF}, {p.x[inst]->p, s.d, m, s.d, TW_ORDER_COL, TW_R_16BF},
         {b.grads.dwgu->p, s.d, TW_R_16BF});
    gemm({b.fwd.hbuf->p, s.h, m, s.h, TW_ORDER_COL, TW_R_16BF}, {dy.p, s.d, m, s.d, TW_ORDER_COL, TW_R_16BF},
         {b.grads.dwd->p, s.d, TW_R_16BF});
}

/// twblas's training step on one instance: twSpGEMMFusedForwardTrain + twSpGEMMFusedBackward.
struct TwTrain {
    twDnMatDescr_t x[kInstances]{}, y = nullptr, dy = nullptr, dx = nullptr, dwg = nullptr, dwu = nullptr, dwd = nullptr;
    std::unique_ptr<DevMem> ybuf, saved, wsf, wsb;
    TrainGrads grads;
    size_t saved_bytes = 0;
    TwTrain(Problem &p, int64_t m, const DevMem &dyb) : grads(m, p.shape) {
        const Shape s = p.shape;
        ybuf = std::make_unique<DevMem>(static_cast<size_t>(m * s.d) * 2);
        for (int i = 0; i < kInstances; ++i)
            ck(twCreateDnMat(&x[i], m, s.d, s.d, p.x[i]->p, TW_R_16BF, TW_ORDER_ROW), nullptr, "X");
        ck(twCreateDnMat(&y, m, s.d, s.d, ybuf->p, TW_R_16BF, TW_ORDER_ROW), nullptr, "Y");
        ck(twCreateDnMat(&dy, m, s.d, s.d, dyb.p, TW_R_16BF, TW_ORDER_ROW), nullptr, "dY");
        ck(twCreateDnMat(&dx, m, s.d, s.d, grads.dx->p, TW_R_16BF, TW_ORDER_ROW), nullptr, "dX");
        ck(twCreateDnMat(&dwg, s.h, s.d, s.d, grads.dwgu->p, TW_R_16BF, TW_ORDER_ROW), nullptr, "dWg");
        ck(twCreateDnMat(&dwu, s.h, s.d, s.d, grads.dwgu->get<uint16_t>() + s.h * s.d, TW_R_16BF, TW_ORDER_ROW), nullptr,
           "dWu");
        ck(twCreateDnMat(&dwd, s.h, s.d, s.d, grads.dwd->p, TW_R_16BF, TW_ORDER_ROW), nullptr, "dWd");
        size_t fw = 0, bw = 0;
        ck(twSpGEMMFusedSaved_bufferSize(p.handle, p.ffn[0], m, &saved_bytes), p.handle, "saved size");
        ck(twSpGEMMFused_bufferSize(p.handle, p.ffn[0], x[0], y, &fw), p.handle, "forward size");
        ck(twSpGEMMFusedBackward_bufferSize(p.handle, p.ffn[0], m, &bw), p.handle, "backward size");
        saved = std::make_unique<DevMem>(saved_bytes);
        wsf = std::make_unique<DevMem>(fw);
        wsb = std::make_unique<DevMem>(bw);
    }
    ~TwTrain() {
        for (auto &d : x) twDestroyDnMat(d);
        for (twDnMatDescr_t d : {y, dy, dx, dwg, dwu, dwd}) twDestroyDnMat(d);
    }
    void step(Problem &p, int i) {
        ck(twSpGEMMFusedForwardTrain(p.handle, p.ffn[i], x[i], y, saved->p, wsf->p), p.handle, "ForwardTrain");
        ck(twSpGEMMFusedBackward(p.handle, p.ffn[i], x[i], saved->p, dy, kL1Coeff, dx, dwg, dwu, dwd, wsb->p), p.handle,
           "Backward");
    }
};

void bm_train_twblas(benchmark::State &state, Shape s, std::string profile, int64_t max_m, int64_t m) {
    auto p = problem(s, profile, max_m);
    const DevMem &dy = train_dy(*p);
    TwTrain tw(*p, m, dy);
    // the forward's path follows the statistics of an earlier forward: one step per instance
    for (int i = 0; i < kInstances; ++i) {
        tw.step(*p, i);
        twFfnStats_t si{};
        ck(twFfnGetStats(p->handle, p->ffn[i], &si), p->handle, "stats");
    }
    // verify before timing: every gradient against the dense training step on the same data
    tw.step(*p, 0);
    twFfnStats_t st{};
    ck(twFfnGetStats(p->handle, p->ffn[0], &st), p->handle, "stats");
    double worst = 0;
    {
        DenseTrain ref(m, s);
        dense_train(*p, 0, m, ref, dy);
        const size_t nx = static_cast<size_t>(m * s.d), nw = static_cast<size_t>(s.h * s.d);
        const double ex = rel_error(tw.grads.download(*tw.grads.dx, nx), ref.grads.download(*ref.grads.dx, nx));
        const double ew = rel_error(tw.grads.download(*tw.grads.dwgu, 2 * nw), ref.grads.download(*ref.grads.dwgu, 2 * nw));
        const double ed = rel_error(tw.grads.download(*tw.grads.dwd, nw), ref.grads.download(*ref.grads.dwd, nw));
        state.counters["rel_err_dx"] = ex;
        state.counters["rel_err_dwgu"] = ew;
        state.counters["rel_err_dwd"] = ed;
        worst = std::max({ex, ew, ed});
    }
    if (!(worst < 3e-2))
        state.SkipWithError(("twblas gradients differ from the dense step: rel. error " + std::to_string(worst)).c_str());
    auto execs = capture([&](int i) { tw.step(*p, i); });
    time_loop(state, 1, [&](int run) { ck(cudaGraphLaunch(execs[run % kInstances], env.stream), "launch"); });
    destroy(execs);
    add_problem_counters(state, *p, m);
    state.counters["mean_nnz"] = st.meanRowNnz;
    state.counters["overflow_rows"] = static_cast<double>(st.overflowRows);
    state.counters["saved_bytes"] = static_cast<double>(tw.saved_bytes);
    const double dense_h = static_cast<double>(m) * static_cast<double>(s.h) * 2.0;
    state.counters["dense_h_bytes"] = dense_h;
    state.counters["saved_over_dense_h"] = static_cast<double>(tw.saved_bytes) / dense_h;
}

void bm_train_dense(benchmark::State &state, Shape s, std::string profile, int64_t max_m, int64_t m) {
    auto p = problem(s, profile, max_m);
    const DevMem &dy = train_dy(*p);
    DenseTrain b(m, s);
    auto execs = capture([&](int i) { dense_train(*p, i, m, b, dy); });
    time_loop(state, 1, [&](int run) { ck(cudaGraphLaunch(execs[run % kInstances], env.stream), "launch"); });
    destroy(execs);
    add_problem_counters(state, *p, m);
    // what the dense step keeps for the backward: [g | u] and h
    state.counters["saved_bytes"] = static_cast<double>(m) * static_cast<double>(s.h) * 2.0 * 3.0;
}

// ---- registration

void add(const std::string &name, void (*fn)(benchmark::State &, Shape, std::string, int64_t, int64_t), Shape s,
         const std::string &profile, int64_t max_m, int64_t m) {
    auto *b = benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State &st) { fn(st, s, profile, max_m, m); });
    b->UseManualTime()->Unit(benchmark::kMicrosecond)->Repetitions(5)->ReportAggregatesOnly(true)->MinTime(0.05);
}

std::string bench_name(const char *variant, Shape s, const std::string &profile, int64_t m) {
    return std::string("ffn/") + variant + "/d" + std::to_string(s.d) + "_h" + std::to_string(s.h) + "/" + profile +
           "/m" + std::to_string(m);
}

/// Every variant of one (shape, profile) over a list of M, all from one generated problem.
void register_group(Shape s, const std::string &profile, const std::vector<int64_t> &ms, bool cusparse, bool cpu) {
    const int64_t max_m = *std::max_element(ms.begin(), ms.end());
    for (int64_t m : ms) {
        add(bench_name("twblas", s, profile, m), bm_twblas, s, profile, max_m, m);
        add(bench_name("dense", s, profile, m), bm_dense, s, profile, max_m, m);
        add(bench_name("gate", s, profile, m), bm_gate, s, profile, max_m, m);
        if (cusparse && m >= 512)
            add(bench_name("cusparse", s, profile, m), bm_cusparse, s, profile, max_m, m);
        if (cpu && m <= 64) {
            auto *b = benchmark::RegisterBenchmark(bench_name("cpu_twblas", s, profile, m).c_str(),
                                                   [=](benchmark::State &st) { bm_cpu(st, s, profile, max_m, m, true); });
            b->UseManualTime()->Unit(benchmark::kMicrosecond)->Repetitions(3)->ReportAggregatesOnly(true)->MinTime(0.05);
            b = benchmark::RegisterBenchmark(bench_name("cpu_dense", s, profile, m).c_str(),
                                             [=](benchmark::State &st) { bm_cpu(st, s, profile, max_m, m, false); });
            b->UseManualTime()->Unit(benchmark::kMicrosecond)->Repetitions(3)->ReportAggregatesOnly(true)->MinTime(0.05);
        }
    }
}

void register_train(Shape s, const std::string &profile, const std::vector<int64_t> &ms) {
    const int64_t max_m = *std::max_element(ms.begin(), ms.end());
    for (int64_t m : ms) {
        add(bench_name("train_twblas", s, profile, m), bm_train_twblas, s, profile, max_m, m);
        add(bench_name("train_dense", s, profile, m), bm_train_dense, s, profile, max_m, m);
    }
}

void register_suite(const std::string &suite) {
    const Shape paper{2048, 5632}, llama{4096, 14336};
    if (suite == "smoke") {
        register_group({256, 1000}, "uniform-12", {64, 512}, true, true);
        register_train({256, 1000}, "heavy-12", {1000});
        return;
    }
    if (suite == "full" || suite == "train") {
        register_train(paper, "uniform-29", {16384, 65536});
        for (const char *prof : {"uniform-24", "uniform-39", "heavy-29", "llm-29", "uniform-100", "uniform-911"})
            register_train(paper, prof, {16384});
    }
    if (suite == "full" || suite == "decode")
        register_group(paper, "uniform-29", {1, 8, 64, 512, 4096, 16384, 65536}, suite == "full", true);
    if (suite == "full" || suite == "profiles") {
        for (const char *prof : {"uniform-24", "uniform-39", "uniform-100", "uniform-300", "uniform-911", "heavy-29", "llm-29"})
            register_group(paper, prof, {16384}, std::string(prof) == "heavy-29", false);
        register_group(llama, "uniform-29", {1, 64, 16384}, false, false);
    }
}

}  // namespace

int main(int argc, char **argv) {
    std::string suite = "full";
    std::vector<char *> args;
    for (int i = 0; i < argc; ++i) {
        if (std::strncmp(argv[i], "--suite=", 8) == 0)
            suite = argv[i] + 8;
        else
            args.push_back(argv[i]);
    }
    int n = static_cast<int>(args.size());
    benchmark::Initialize(&n, args.data());
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
    ck(cudaStreamCreateWithFlags(&env.stream, cudaStreamNonBlocking), "stream");
    ck(cudaEventCreate(&env.e0), "event");
    ck(cudaEventCreate(&env.e1), "event");
    env.gemm = std::make_unique<GemmRunner>();
    env.lt_ws = std::make_unique<DevMem>(GemmRunner::kWorkspaceBytes);
    register_suite(suite);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    env.current.reset();
    env.gemm.reset();
    env.lt_ws.reset();
    return 0;
}
