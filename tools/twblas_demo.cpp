// twblas-demo: one sparse feed-forward layer, end to end.
//
// Generates a problem with the paper's shapes (D = 2048, H = 5632 by default; sparsity from the
// gate GEMM itself, tests/bench/demo share the generator), runs twSpGEMMFused on the chosen
// backend, checks the result against a dense fp32 FFN of the same inputs, and prints the
// activation statistics, both timings and the speedup measured in this run.
#include <twblas/twblas.h>

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "testing/problem.hpp"

#ifdef TWBLAS_DEMO_CUDA
#include <cuda_runtime.h>

#include <exception>

#include "testing/cuda/dense_ffn.hpp"
#include "testing/cuda/device_memory.hpp"
#endif

namespace tt = twblas::testing;
using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

namespace {

struct Options {
    int64_t tokens = -1;  // default depends on the backend
    int64_t d = 2048, h = 5632;
    double k = 29;
    tt::Profile profile = tt::Profile::Uniform;
    std::string backend = "default";
    bool gated = true;
    uint64_t seed = 1;
    int reps = 3;
    std::string json;  // also write the results as JSON to this file
    bool serving = false;  // --serving: decode loops at M = 1, 8 and 64, eager calls (CUDA)
};

[[noreturn]] void usage(const char *msg) {
    if (msg) std::fprintf(stderr, "twblas-demo: %s\n\n", msg);
    std::fprintf(stderr,
                 "usage: twblas-demo [--tokens M] [--d D] [--h H] [--k ACTIVE] [--profile uniform|heavy|llm[-K]]\n"
                 "                   [--backend default|cpu|cuda] [--plain] [--seed S] [--reps N] [--json FILE]\n"
                 "       twblas-demo --serving [--d D] [--h H] [--k ACTIVE] [--profile ...] [--plain]\n"
                 "                   (CUDA: decode loops at M = 1, 8 and 64, eager calls, against dense cuBLAS)\n"
                 "  Runs a sparse gated-ReLU FFN (bf16) with twSpGEMMFused and compares it with a dense FFN.\n"
                 "  Defaults: D = 2048, H = 5632, k = 29 active units per token, M = 256 on the CPU, 16384 on a GPU.\n");
    std::exit(msg ? 2 : 0);
}

Options parse(int argc, char **argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) usage(("missing value after " + a).c_str());
            return argv[++i];
        };
        auto number = [&](const std::string &v) {
            char *end = nullptr;
            const double x = std::strtod(v.c_str(), &end);
            if (v.empty() || *end) usage(("not a number: " + v).c_str());
            return x;
        };
        if (a == "--tokens") o.tokens = static_cast<int64_t>(number(next()));
        else if (a == "--d") o.d = static_cast<int64_t>(number(next()));
        else if (a == "--h") o.h = static_cast<int64_t>(number(next()));
        else if (a == "--k") o.k = number(next());
        else if (a == "--profile") {
            if (!tt::parse_profile(next(), &o.profile, &o.k)) usage("unknown profile");
        } else if (a == "--backend") o.backend = next();
        else if (a == "--plain") o.gated = false;
        else if (a == "--seed") o.seed = static_cast<uint64_t>(number(next()));
        else if (a == "--reps") o.reps = std::max(1, static_cast<int>(number(next())));
        else if (a == "--json") o.json = next();
        else if (a == "--serving") o.serving = true;
        else if (a == "--help" || a == "-h") usage(nullptr);
        else usage(("unknown option " + a).c_str());
    }
    if (o.backend != "default" && o.backend != "cpu" && o.backend != "cuda") usage("backend must be default, cpu or cuda");
    return o;
}

#define DEMO_CHECK(handle, call)                                                                              \
    do {                                                                                                      \
        const twStatus_t s_ = (call);                                                                         \
        if (s_ != TW_STATUS_SUCCESS) {                                                                        \
            std::fprintf(stderr, "twblas-demo: %s failed: %s: %s\n", #call, twGetStatusName(s_), twGetErrorMessage(handle)); \
            std::exit(1);                                                                                     \
        }                                                                                                     \
    } while (0)

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Median wall time of `reps` runs of f (after one warm-up run).
template <class F>
double median_time(int reps, F &&f) {
    f();
    std::vector<double> t;
    for (int r = 0; r < reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        f();
        t.push_back(seconds_since(t0));
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

RowMatrix as_matrix(const std::vector<float> &v, int64_t rows, int64_t cols) {
    return Eigen::Map<const RowMatrix>(v.data(), rows, cols);
}

#ifdef TWBLAS_DEMO_CUDA
#define CUDA_DEMO_CHECK(call)                                                                       \
    do {                                                                                           \
        const cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess) {                                                                   \
            std::fprintf(stderr, "twblas-demo: %s failed: %s\n", #call, cudaGetErrorString(e_));   \
            std::exit(1);                                                                          \
        }                                                                                          \
    } while (0)

/// Median of `reps` CUDA-event timings of f() on `stream`, after one untimed run.
template <class F> double median_gpu_ms(int reps, cudaStream_t stream, F &&f) {
    cudaEvent_t a, b;
    CUDA_DEMO_CHECK(cudaEventCreate(&a));
    CUDA_DEMO_CHECK(cudaEventCreate(&b));
    f();
    std::vector<double> t;
    for (int i = 0; i < std::max(reps, 1); ++i) {
        CUDA_DEMO_CHECK(cudaEventRecord(a, stream));
        f();
        CUDA_DEMO_CHECK(cudaEventRecord(b, stream));
        CUDA_DEMO_CHECK(cudaEventSynchronize(b));
        float ms = 0;
        CUDA_DEMO_CHECK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

/// The weights in bf16 as both GPU demos upload them: [Wg; Wu] (2H x D, or Wu alone for a plain
/// FFN) and Wd as nn.Linear's down_proj.weight (D x H).
struct Bf16Weights {
    std::vector<uint16_t> gate_up, down_linear;
};
Bf16Weights bf16_weights(const tt::FfnProblem &p, bool gated, int64_t d, int64_t hd) {
    Bf16Weights w;
    w.gate_up = gated ? tt::to_bf16(p.w_gate) : std::vector<uint16_t>();
    const std::vector<uint16_t> u16 = tt::to_bf16(p.w_up), wd_rows = tt::to_bf16(p.w_down);
    w.gate_up.insert(w.gate_up.end(), u16.begin(), u16.end());
    w.down_linear.resize(wd_rows.size());
    for (int64_t j = 0; j < hd; ++j)
        for (int64_t c = 0; c < d; ++c) w.down_linear[c * hd + j] = wd_rows[j * d + c];
    return w;
}

/// The dense cuBLAS FFN of up to m tokens over the uploaded weights.
tt::DenseFfnShape dense_shape(int64_t d, int64_t hd, int64_t m, bool gated) {
    tt::DenseFfnShape shape;
    shape.model_dim = d;
    shape.hidden_dim = hd;
    shape.max_tokens = m;
    shape.gated = gated;
    return shape;
}
tt::DenseFfnWeights dense_weights(const tt::DeviceMemory &gate_up, const tt::DeviceMemory &down) {
    tt::DenseFfnWeights weights;
    weights.gate_up = gate_up.get();
    weights.down = down.get();
    return weights;
}

/// The FFN over the uploaded bf16 weights (Bf16Weights in device memory) and the weight
/// descriptors it was made from; destroy_gpu_ffn frees them.
struct GpuFfn {
    twFfnDescr_t ffn = nullptr;
    twDnMatDescr_t wg = nullptr, wu = nullptr, wd = nullptr;
};
GpuFfn make_gpu_ffn(twHandle_t h, bool gated, int64_t d, int64_t hd, const tt::DeviceMemory &gate_up,
                    const tt::DeviceMemory &down) {
    GpuFfn f;
    if (gated) DEMO_CHECK(h, twCreateDnMat(&f.wg, hd, d, d, gate_up.get(), TW_R_16BF, TW_ORDER_ROW));
    DEMO_CHECK(h, twCreateDnMat(&f.wu, hd, d, d, gate_up.get<uint16_t>() + (gated ? hd * d : 0), TW_R_16BF, TW_ORDER_ROW));
    DEMO_CHECK(h, twCreateDnMat(&f.wd, hd, d, hd, down.get(), TW_R_16BF, TW_ORDER_COL));
    DEMO_CHECK(h, twCreateFfn(h, &f.ffn, gated ? TW_FFN_GATED_RELU : TW_FFN_RELU, f.wg, f.wu, f.wd));
    return f;
}
void destroy_gpu_ffn(const GpuFfn &f) {
    twDestroyFfn(f.ffn);
    for (twDnMatDescr_t dd : {f.wg, f.wu, f.wd}) twDestroyDnMat(dd);
}

/// The GPU demo: twSpGEMMFused against the dense cuBLAS FFN a user has today (one GEMM over
/// [Wg; Wu], ReLU * product, the down GEMM; src/testing/cuda/dense_ffn), both on the same device
/// data, and the result checked against a dense fp32 FFN on the CPU over the first rows.
int gpu_demo(const Options &o, twHandle_t h, const tt::FfnProblem &p, const tt::ActivationStats &stats) {
    using tt::DeviceMemory;
    const int64_t m = o.tokens, d = o.d, hd = o.h;
    cudaStream_t stream;
    CUDA_DEMO_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    DEMO_CHECK(h, twSetStream(h, stream));
    const std::vector<uint16_t> x16 = tt::to_bf16(p.x);
    const Bf16Weights w16 = bf16_weights(p, o.gated, d, hd);
    const DeviceMemory dx(x16), dgu(w16.gate_up), dwd(w16.down_linear), dy(static_cast<size_t>(m * d) * 2);
    twDnMatDescr_t X, Y;
    DEMO_CHECK(h, twCreateDnMat(&X, m, d, d, dx.get(), TW_R_16BF, TW_ORDER_ROW));
    DEMO_CHECK(h, twCreateDnMat(&Y, m, d, d, dy.get(), TW_R_16BF, TW_ORDER_ROW));
    const GpuFfn gf = make_gpu_ffn(h, o.gated, d, hd, dgu, dwd);
    const twFfnDescr_t ffn = gf.ffn;
    size_t bytes = 0;
    DEMO_CHECK(h, twSpGEMMFused_bufferSize(h, ffn, X, Y, &bytes));
    const DeviceMemory ws(bytes);
    twFfnStats_t st;
    // the first forward's statistics steer the path of the next ones (sparse or dense mode)
    DEMO_CHECK(h, twSpGEMMFused(h, ffn, X, Y, nullptr, ws.get()));
    DEMO_CHECK(h, twFfnGetStats(h, ffn, &st));
    const double t_sparse = median_gpu_ms(o.reps, stream, [&] { DEMO_CHECK(h, twSpGEMMFused(h, ffn, X, Y, nullptr, ws.get())); });
    DEMO_CHECK(h, twFfnGetStats(h, ffn, &st));
    std::vector<uint16_t> y16(static_cast<size_t>(m * d));
    CUDA_DEMO_CHECK(cudaMemcpyAsync(y16.data(), dy.get(), y16.size() * 2, cudaMemcpyDeviceToHost, stream));
    CUDA_DEMO_CHECK(cudaStreamSynchronize(stream));

    // dense cuBLAS FFN on the same device data
    tt::DenseFfn dense(dense_shape(d, hd, m, o.gated));
    const tt::DenseFfnWeights weights = dense_weights(dgu, dwd);
    const DeviceMemory y_dense(static_cast<size_t>(m * d) * 2);
    const double t_dense = median_gpu_ms(o.reps, stream, [&] { dense.forward(stream, dx.get(), weights, m, y_dense.get()); });

    // accuracy: the first rows against a dense fp32 FFN on the CPU
    const int64_t rows = std::min<int64_t>(m, 512);
    const RowMatrix xf = Eigen::Map<const RowMatrix>(p.x.data(), rows, d), wuf = as_matrix(p.w_up, hd, d),
                    wdf = as_matrix(p.w_down, hd, d);
    RowMatrix g = xf * (o.gated ? as_matrix(p.w_gate, hd, d) : wuf).transpose();
    if (o.gated) {
        const RowMatrix u = xf * wuf.transpose();
        g = g.cwiseMax(0.0f).cwiseProduct(u);
    } else {
        g = g.cwiseMax(0.0f);
    }
    const RowMatrix yref = g * wdf;
    double num = 0, den = 0;
    for (int64_t i = 0; i < rows * d; ++i) {
        const uint32_t b = static_cast<uint32_t>(y16[static_cast<size_t>(i)]) << 16;
        float v;
        std::memcpy(&v, &b, 4);
        const double want = yref(i / d, i % d);
        num += (v - want) * (v - want);
        den += want * want;
    }
    const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    const bool ok = rel < 2e-2;

    cudaDeviceProp prop{};
    int dev = 0;
    CUDA_DEMO_CHECK(cudaGetDevice(&dev));
    CUDA_DEMO_CHECK(cudaGetDeviceProperties(&prop, dev));
    std::printf("\n  activation statistics (measured on the generated problem)\n");
    std::printf("    %s\n", tt::describe(stats).c_str());
    std::printf("    twFfnGetStats: mean %.2f, max %lld, overflow rows (exact dense path) %lld, L1 %.4f\n", st.meanRowNnz,
                (long long)st.maxRowNnz, (long long)st.overflowRows, st.l1);
    std::printf("\n  on %s: %-34s %12s\n", prop.name, "path", "median ms");
    std::printf("  %-42s %12.3f\n", "twSpGEMMFused (CUDA)", t_sparse);
    std::printf("  %-42s %12.3f\n", "dense cuBLAS FFN, same GPU", t_dense);
    std::printf("  speedup over the dense path: %.2fx (%d timed runs each, CUDA events)\n", t_dense / t_sparse, o.reps);
    std::printf("  check of the first %lld rows against a dense fp32 FFN: normwise relative error %.2e (bound 2e-2) %s\n",
                (long long)rows, rel, ok ? "OK" : "FAILED");
    if (!o.json.empty()) {
        FILE *f = std::fopen(o.json.c_str(), "w");
        if (f) {
            std::fprintf(f,
                         "{\n  \"tool\": \"twblas-demo\",\n  \"backend\": \"cuda\",\n  \"gpu\": \"%s\",\n  \"kind\": \"%s\",\n"
                         "  \"tokens\": %lld, \"d\": %lld, \"h\": %lld, \"profile\": \"%s\", \"k\": %g, \"seed\": %llu,\n"
                         "  \"mean_row_nnz\": %.4f, \"max_row_nnz\": %lld, \"overflow_rows\": %lld,\n"
                         "  \"sparse_ms\": %.4f, \"dense_cublas_ms\": %.4f, \"speedup_vs_dense\": %.4f, \"reps\": %d,\n"
                         "  \"rel_error_vs_fp32_first_rows\": %.3e, \"ok\": %s\n}\n",
                         prop.name, o.gated ? "gated" : "plain", (long long)m, (long long)d, (long long)hd,
                         tt::profile_name(o.profile), o.k, (unsigned long long)o.seed, st.meanRowNnz,
                         (long long)st.maxRowNnz, (long long)st.overflowRows, t_sparse, t_dense, t_dense / t_sparse,
                         o.reps, rel, ok ? "true" : "false");
            std::fclose(f);
        }
    }
    destroy_gpu_ffn(gf);
    for (twDnMatDescr_t dd : {X, Y}) twDestroyDnMat(dd);
    DEMO_CHECK(h, twSetStream(h, nullptr));
    cudaStreamDestroy(stream);
    twDestroy(h);
    return ok ? 0 : 1;
}

/// --serving: the decode loop of an inference engine written in C: per step one eager
/// twSpGEMMFused on the handle's stream (no graph of the caller's own), inputs rotating over
/// four token blocks; the latency per step is the wall time of the loop (host and GPU) over its
/// steps, against the dense cuBLAS FFN called the same way on the same data.
int serving_demo(const Options &o, twHandle_t h) {
    using tt::DeviceMemory;
    const int64_t d = o.d, hd = o.h, steps = 400;
    cudaStream_t stream;
    CUDA_DEMO_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    DEMO_CHECK(h, twSetStream(h, stream));
    cudaDeviceProp prop{};
    int dev = 0;
    CUDA_DEMO_CHECK(cudaGetDevice(&dev));
    CUDA_DEMO_CHECK(cudaGetDeviceProperties(&prop, dev));
    std::printf("twblas-demo --serving: %s ReLU FFN, bf16, D = %lld, H = %lld, profile %s-%g, on %s\n",
                o.gated ? "gated" : "plain", (long long)d, (long long)hd, tt::profile_name(o.profile), o.k, prop.name);
    std::printf("  %6s %22s %22s %9s\n", "tokens", "twblas us/step", "dense cuBLAS us/step", "speedup");
    bool ok = true;
    for (const int64_t m : {1, 8, 64}) {
        tt::ProblemSpec spec;
        spec.tokens = 4 * m;  // four blocks of m tokens, one per step in turn
        spec.model_dim = d;
        spec.hidden_dim = hd;
        spec.profile = o.profile;
        spec.active_units = o.k;
        spec.gated = o.gated;
        spec.seed = o.seed;
        const tt::FfnProblem p = tt::make_ffn_problem(spec);
        const Bf16Weights w16 = bf16_weights(p, o.gated, d, hd);
        const DeviceMemory dx(tt::to_bf16(p.x)), dgu(w16.gate_up), dwd(w16.down_linear), dy(static_cast<size_t>(m * d) * 2);
        twDnMatDescr_t X[4], Y;
        for (int b = 0; b < 4; ++b)
            DEMO_CHECK(h, twCreateDnMat(&X[b], m, d, d, dx.get<uint16_t>() + b * m * d, TW_R_16BF, TW_ORDER_ROW));
        DEMO_CHECK(h, twCreateDnMat(&Y, m, d, d, dy.get(), TW_R_16BF, TW_ORDER_ROW));
        const GpuFfn gf = make_gpu_ffn(h, o.gated, d, hd, dgu, dwd);
        const twFfnDescr_t ffn = gf.ffn;
        size_t bytes = 0;
        DEMO_CHECK(h, twSpGEMMFused_bufferSize(h, ffn, X[0], Y, &bytes));
        const DeviceMemory ws(bytes);
        tt::DenseFfn dense(dense_shape(d, hd, m, o.gated));
        const tt::DenseFfnWeights weights = dense_weights(dgu, dwd);
        const DeviceMemory y_dense(static_cast<size_t>(m * d) * 2);
        auto loop_us = [&](auto &&step) {
            for (int64_t s = 0; s < 20; ++s) step(s);  // warm-up (the path settles, calls are captured)
            CUDA_DEMO_CHECK(cudaStreamSynchronize(stream));
            const auto t0 = std::chrono::steady_clock::now();
            for (int64_t s = 0; s < steps; ++s) step(s);
            CUDA_DEMO_CHECK(cudaStreamSynchronize(stream));
            return seconds_since(t0) * 1e6 / static_cast<double>(steps);
        };
        const double t_tw = loop_us([&](int64_t s) { DEMO_CHECK(h, twSpGEMMFused(h, ffn, X[s % 4], Y, nullptr, ws.get())); });
        const double t_dense = loop_us([&](int64_t s) {
            dense.forward(stream, dx.get<uint16_t>() + (s % 4) * m * d, weights, m, y_dense.get());
        });
        // the last step's output (block 3) against the dense cuBLAS FFN's on the same block
        std::vector<uint16_t> a(static_cast<size_t>(m * d)), b(a.size());
        CUDA_DEMO_CHECK(cudaMemcpyAsync(a.data(), dy.get(), a.size() * 2, cudaMemcpyDeviceToHost, stream));
        CUDA_DEMO_CHECK(cudaMemcpyAsync(b.data(), y_dense.get(), b.size() * 2, cudaMemcpyDeviceToHost, stream));
        CUDA_DEMO_CHECK(cudaStreamSynchronize(stream));
        double num = 0, den = 0;
        for (size_t i = 0; i < a.size(); ++i) {
            float va, vb;
            const uint32_t ba = static_cast<uint32_t>(a[i]) << 16, bb = static_cast<uint32_t>(b[i]) << 16;
            std::memcpy(&va, &ba, 4);
            std::memcpy(&vb, &bb, 4);
            num += (double(va) - vb) * (double(va) - vb);
            den += double(vb) * vb;
        }
        const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
        ok = ok && rel < 2e-2;
        std::printf("  %6lld %22.1f %22.1f %8.2fx   (rel. difference %.1e)\n", (long long)m, t_tw, t_dense,
                    t_dense / t_tw, rel);
        destroy_gpu_ffn(gf);
        for (twDnMatDescr_t dd : {X[0], X[1], X[2], X[3], Y}) twDestroyDnMat(dd);
    }
    std::printf("  (%lld eager calls per loop after 20 warm-up calls; wall time, host and GPU)\n", (long long)steps);
    DEMO_CHECK(h, twSetStream(h, nullptr));
    cudaStreamDestroy(stream);
    twDestroy(h);
    return ok ? 0 : 1;
}
#endif

}  // namespace

int main(int argc, char **argv) {
    Options o = parse(argc, argv);

    twBackend_t want = o.backend == "cpu" ? TW_BACKEND_CPU : o.backend == "cuda" ? TW_BACKEND_CUDA : TW_BACKEND_DEFAULT;
    twHandle_t h = nullptr;
    DEMO_CHECK(nullptr, twCreateWithBackend(&h, want));
    twBackend_t backend;
    DEMO_CHECK(h, twGetBackend(h, &backend));
    if (o.tokens < 0) o.tokens = backend == TW_BACKEND_CUDA ? 16384 : 256;
    if (o.serving) {
#ifdef TWBLAS_DEMO_CUDA
        if (backend == TW_BACKEND_CUDA) {
            try {
                return serving_demo(o, h);
            } catch (const std::exception &e) {
                std::fprintf(stderr, "twblas-demo: %s\n", e.what());
                return 1;
            }
        }
#endif
        std::fprintf(stderr, "twblas-demo: --serving needs the CUDA backend and a GPU\n");
        twDestroy(h);
        return 2;
    }

    tt::ProblemSpec spec;
    spec.tokens = o.tokens;
    spec.model_dim = o.d;
    spec.hidden_dim = o.h;
    spec.profile = o.profile;
    spec.active_units = o.k;
    spec.gated = o.gated;
    spec.seed = o.seed;
    auto t0 = std::chrono::steady_clock::now();
    const tt::FfnProblem p = tt::make_ffn_problem(spec);
    const tt::ActivationStats stats = tt::measure_activations(p);
    std::printf("twblas-demo: %s ReLU FFN, bf16, M = %lld tokens, D = %lld, H = %lld, profile %s-%g, seed %llu\n",
                o.gated ? "gated" : "plain", (long long)o.tokens, (long long)o.d, (long long)o.h,
                tt::profile_name(o.profile), o.k, (unsigned long long)o.seed);
    std::printf("  problem generated in %.2f s\n", seconds_since(t0));
#ifdef TWBLAS_DEMO_CUDA
    if (backend == TW_BACKEND_CUDA) {
        try {
            return gpu_demo(o, h, p, stats);
        } catch (const std::exception &e) {  // from the device memory and the dense baseline
            std::fprintf(stderr, "twblas-demo: %s\n", e.what());
            return 1;
        }
    }
#endif

    // bf16 operands; Wd as nn.Linear's down_proj.weight (TW_ORDER_COL of the logical H x D)
    const std::vector<uint16_t> x16 = tt::to_bf16(p.x), wg16 = tt::to_bf16(p.w_gate), wu16 = tt::to_bf16(p.w_up);
    std::vector<uint16_t> wd16(static_cast<size_t>(o.h * o.d));
    for (int64_t j = 0; j < o.h; ++j)
        for (int64_t c = 0; c < o.d; ++c) wd16[c * o.h + j] = tt::to_bf16({p.w_down[j * o.d + c]})[0];
    std::vector<uint16_t> y16(static_cast<size_t>(o.tokens * o.d));

    twDnMatDescr_t X, Y, WG = nullptr, WU, WD;
    DEMO_CHECK(h, twCreateDnMat(&X, o.tokens, o.d, o.d, const_cast<uint16_t *>(x16.data()), TW_R_16BF, TW_ORDER_ROW));
    DEMO_CHECK(h, twCreateDnMat(&Y, o.tokens, o.d, o.d, y16.data(), TW_R_16BF, TW_ORDER_ROW));
    if (o.gated) DEMO_CHECK(h, twCreateDnMat(&WG, o.h, o.d, o.d, const_cast<uint16_t *>(wg16.data()), TW_R_16BF, TW_ORDER_ROW));
    DEMO_CHECK(h, twCreateDnMat(&WU, o.h, o.d, o.d, const_cast<uint16_t *>(wu16.data()), TW_R_16BF, TW_ORDER_ROW));
    DEMO_CHECK(h, twCreateDnMat(&WD, o.h, o.d, o.h, wd16.data(), TW_R_16BF, TW_ORDER_COL));
    twFfnDescr_t ffn = nullptr;
    const twStatus_t created = twCreateFfn(h, &ffn, o.gated ? TW_FFN_GATED_RELU : TW_FFN_RELU, WG, WU, WD);
    DEMO_CHECK(h, created);
    size_t bytes = 0;
    DEMO_CHECK(h, twSpGEMMFused_bufferSize(h, ffn, X, Y, &bytes));
    std::vector<uint8_t> workspace(bytes);
    const double t_sparse = median_time(o.reps, [&] { DEMO_CHECK(h, twSpGEMMFused(h, ffn, X, Y, nullptr, workspace.data())); });
    twFfnStats_t st;
    DEMO_CHECK(h, twFfnGetStats(h, ffn, &st));

    // The dense path a user has today on this machine: three fp32 GEMMs (Eigen) + ReLU, product.
    const RowMatrix xf = as_matrix(p.x, o.tokens, o.d), wuf = as_matrix(p.w_up, o.h, o.d),
                    wdf = as_matrix(p.w_down, o.h, o.d);
    const RowMatrix wgf = o.gated ? as_matrix(p.w_gate, o.h, o.d) : RowMatrix();
    RowMatrix yd(o.tokens, o.d), g(o.tokens, o.h), u(o.tokens, o.h);
    const double t_dense = median_time(o.reps, [&] {
        if (o.gated) {
            g.noalias() = xf * wgf.transpose();
            u.noalias() = xf * wuf.transpose();
            g = g.cwiseMax(0.0f).cwiseProduct(u);
        } else {
            g.noalias() = xf * wuf.transpose();
            g = g.cwiseMax(0.0f);
        }
        yd.noalias() = g * wdf;
    });

    double num = 0, den = 0;
    for (int64_t i = 0; i < o.tokens * o.d; ++i) {
        const uint32_t bits = static_cast<uint32_t>(y16[i]) << 16;
        float v;
        std::memcpy(&v, &bits, sizeof v);
        const double diff = double(v) - yd(i / o.d, i % o.d);
        num += diff * diff;
        den += double(yd(i / o.d, i % o.d)) * yd(i / o.d, i % o.d);
    }
    const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    const bool ok = rel < 2e-2;  // bf16 intermediates and output against an fp32 dense FFN

    std::printf("\n  activation statistics (measured on the generated problem)\n");
    std::printf("    %s\n", tt::describe(stats).c_str());
    std::printf("    twFfnGetStats: mean %.2f, max %lld, overflow rows (exact dense path) %lld, L1 %.4f\n",
                st.meanRowNnz, (long long)st.maxRowNnz, (long long)st.overflowRows, st.l1);
    std::printf("\n  %-42s %12s\n", "path", "median ms");
    std::printf("  %-42s %12.3f\n", backend == TW_BACKEND_CUDA ? "twSpGEMMFused (CUDA)" : "twSpGEMMFused (CPU reference)",
                t_sparse * 1e3);
    std::printf("  %-42s %12.3f\n", "dense FFN, Eigen fp32, same machine", t_dense * 1e3);
    std::printf("  speedup over the dense path: %.2fx (%d timed runs each)\n", t_dense / t_sparse, o.reps);
    std::printf("  check against the dense FFN: normwise relative error %.2e (bound 2e-2) %s\n", rel, ok ? "OK" : "FAILED");

    if (!o.json.empty()) {
        FILE *f = std::fopen(o.json.c_str(), "w");
        if (!f) {
            std::fprintf(stderr, "twblas-demo: cannot write %s\n", o.json.c_str());
            return 1;
        }
        std::fprintf(f,
                     "{\n  \"tool\": \"twblas-demo\",\n  \"backend\": \"%s\",\n  \"kind\": \"%s\",\n"
                     "  \"tokens\": %lld, \"d\": %lld, \"h\": %lld, \"profile\": \"%s\", \"k\": %g, \"seed\": %llu,\n"
                     "  \"mean_row_nnz\": %.4f, \"p99_row_nnz\": %lld, \"max_row_nnz\": %lld, \"max_tile_nnz\": %lld,\n"
                     "  \"overflow_rows\": %lld, \"dead_units\": %lld,\n"
                     "  \"sparse_ms\": %.4f, \"dense_eigen_fp32_ms\": %.4f, \"speedup_vs_dense\": %.4f, \"reps\": %d,\n"
                     "  \"rel_error_vs_dense\": %.3e, \"ok\": %s\n}\n",
                     backend == TW_BACKEND_CUDA ? "cuda" : "cpu", o.gated ? "gated" : "plain", (long long)o.tokens,
                     (long long)o.d, (long long)o.h, tt::profile_name(o.profile), o.k, (unsigned long long)o.seed,
                     stats.mean_row_nnz, (long long)stats.p99_row_nnz, (long long)stats.max_row_nnz,
                     (long long)stats.max_tile_nnz, (long long)st.overflowRows, (long long)stats.dead_units,
                     t_sparse * 1e3, t_dense * 1e3, t_dense / t_sparse, o.reps, rel, ok ? "true" : "false");
        std::fclose(f);
    }

    twDestroyFfn(ffn);
    for (twDnMatDescr_t d : {X, Y, WG, WU, WD}) twDestroyDnMat(d);
    twDestroy(h);
    return ok ? 0 : 1;
}
