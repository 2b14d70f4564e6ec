// The inference benchmarks: twSpGEMMFused against the dense cuBLAS FFN, the gate GEMM alone, the
// cuSPARSE pipeline and the CPU (bench_ffn.cpp says what each variant is).
#include <cusparse.h>

#include <Eigen/Dense>
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "common.hpp"

namespace twbench {

namespace {

using twbench::ck;  // the overloads of common.hpp next to the cuSPARSE one
void ck(cusparseStatus_t s, const char *what) {
    if (s != CUSPARSE_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + ": " + cusparseGetErrorString(s));
}

size_t bf16_bytes(int64_t count) { return static_cast<size_t>(count) * 2; }

/// twSpGEMMFused on the problem's handle: X of each instance, one Y, the workspace.
class TwForward {
  public:
    TwForward(Problem &p, int64_t m) : p_(p), m_(m), ybuf_(bf16_bytes(m * p.shape.d)) {
        const int64_t d = p.shape.d;
        for (int i = 0; i < kInstances; ++i)
            ck(twCreateDnMat(&x_[i], m, d, d, p.x[i]->get(), TW_R_16BF, TW_ORDER_ROW), nullptr, "X");
        ck(twCreateDnMat(&y_, m, d, d, ybuf_.get(), TW_R_16BF, TW_ORDER_ROW), nullptr, "Y");
        size_t bytes = 0;
        ck(twSpGEMMFused_bufferSize(p.handle, p.ffn[0], x_[0], y_, &bytes), p.handle, "bufferSize");
        ws_ = std::make_unique<DeviceMemory>(bytes);
    }
    ~TwForward() {
        for (auto &d : x_) twDestroyDnMat(d);
        twDestroyDnMat(y_);
    }
    TwForward(const TwForward &) = delete;
    TwForward &operator=(const TwForward &) = delete;

    void call(int inst) {
        ck(twSpGEMMFused(p_.handle, p_.ffn[inst], x_[inst], y_, nullptr, ws_->get()), p_.handle, "twSpGEMMFused");
    }
    twFfnStats_t stats(int inst) const {
        twFfnStats_t st{};
        ck(twFfnGetStats(p_.handle, p_.ffn[inst], &st), p_.handle, "twFfnGetStats");
        return st;
    }

    /// The path (sparse, dense-path capacity, dense mode) follows the statistics of the previous
    /// forward: every instance gets `calls_per_instance` forwards and a twFfnGetStats first. Then
    /// instance 0 is checked against the dense cuBLAS FFN of the same data (the benchmark is
    /// skipped past a relative error of `tolerance`); the problem counters are set.
    void settle_and_verify(benchmark::State &state, int calls_per_instance, double tolerance = 2e-2) {
        for (int i = 0; i < kInstances; ++i) {
            for (int c = 0; c < calls_per_instance; ++c) call(i);
            stats(i);
        }
        ck(cudaMemsetAsync(ybuf_.get(), 0xff, bf16_bytes(m_ * p_.shape.d), env.stream), "poison");
        call(0);
        const double err =
            rel_error(download(ybuf_.get(), static_cast<size_t>(m_ * p_.shape.d)), dense_reference(p_, m_));
        const twFfnStats_t st = stats(0);
        if (!(err < tolerance))
            state.SkipWithError(("twblas differs from the dense FFN: rel. error " + std::to_string(err)).c_str());
        add_problem_counters(state, p_, m_);
        state.counters["rel_err_vs_dense"] = err;
        state.counters["mean_nnz"] = st.meanRowNnz;
        state.counters["max_nnz"] = static_cast<double>(st.maxRowNnz);
        state.counters["overflow_rows"] = static_cast<double>(st.overflowRows);
    }

  private:
    Problem &p_;
    int64_t m_;
    twDnMatDescr_t x_[kInstances]{}, y_ = nullptr;
    DeviceMemory ybuf_;
    std::unique_ptr<DeviceMemory> ws_;
};

/// The units active for some token of the batch (their union), from instance 0's gate computed by
/// cuBLAS: g > 0 or NaN, as the library decides. Counted once per problem and M.
int64_t active_union(Problem &p, int64_t m) {
    auto it = p.union_units.find(m);
    if (it != p.union_units.end()) return it->second;
    const Shape s = p.shape;
    tt::LtGemm gemm;
    DeviceMemory ws(tt::LtGemm::kWorkspaceBytes), g(bf16_bytes(m * s.h));
    gemm.run(env.stream, {p.x[0]->get(), m, s.d, s.d}, {p.wgu[0]->get(), s.h, s.d, s.d}, {g.get(), s.h}, ws.get(),
             ws.bytes());
    const std::vector<uint16_t> gate = download(g.get(), static_cast<size_t>(m * s.h));
    std::vector<char> used(static_cast<size_t>(s.h), 0);
    for (size_t i = 0; i < gate.size(); ++i) {
        const uint32_t bits = static_cast<uint32_t>(gate[i]) << 16;
        float v;
        std::memcpy(&v, &bits, sizeof v);
        if (v > 0.0f || v != v) used[i % static_cast<size_t>(s.h)] = 1;
    }
    return p.union_units[m] = std::count(used.begin(), used.end(), 1);
}

/// The bytes a forward of M tokens cannot avoid reading: X, Wg once, and the union's rows of Wu
/// and Wd (a plain FFN's gate is Wu, read whole: then only the union's Wd rows).
double read_bytes(Problem &p, int64_t m) {
    const Shape s = p.shape;
    const double rows = (p.host.spec.gated ? 2.0 : 1.0) * static_cast<double>(active_union(p, m));
    return 2.0 * (static_cast<double>(m * s.d) + static_cast<double>(s.h * s.d) + rows * static_cast<double>(s.d));
}

/// Counter need_bw: the bytes a forward must move (read_bytes and Y) per second.
void add_bandwidth_counter(benchmark::State &state, Problem &p, int64_t m) {
    const double bytes = read_bytes(p, m) + static_cast<double>(bf16_bytes(m * p.shape.d));
    state.counters["need_bw"] =
        benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

/// Counters bytes_needed (read_bytes), union_units and read_rate (bytes_needed per second of the
/// row's time), which bench-report sets against the read floor of the same run (bm_read_floor).
void add_read_counters(benchmark::State &state, Problem &p, int64_t m) {
    const double bytes = read_bytes(p, m);
    state.counters["bytes_needed"] = bytes;
    state.counters["union_units"] = static_cast<double>(active_union(p, m));
    state.counters["read_rate"] =
        benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

void bm_twblas(benchmark::State &state, Shape s, std::string profile, int64_t max_m, int64_t m) {
    auto p = problem(s, profile, max_m);
    TwForward tw(*p, m);
    tw.settle_and_verify(state, 1);
    add_bandwidth_counter(state, *p, m);
    add_read_counters(state, *p, m);
    auto execs = capture([&](int i) { tw.call(i); });
    time_graphs(state, batch_for(m), execs);
}

/// twblas with TW_COMPUTE_FP8_WEIGHTS on every instance (back to DEFAULT after): the FP8 copies
/// are made by the settling forwards, outside the timed graphs. Checked against the dense FFN
/// within 8e-2 (FP8's own distance from the 16-bit result is a few per cent: docs/api-guide.md).
void bm_twblas_fp8(benchmark::State &state, Shape s, std::string profile, int64_t max_m, int64_t m) {
    auto p = problem(s, profile, max_m);
    auto set_mode = [&](int32_t mode) {
        for (int i = 0; i < kInstances; ++i)
            ck(twFfnSetAttribute(p->ffn[i], TW_FFN_ATTR_COMPUTE_MODE, &mode, sizeof mode), p->handle, "compute mode");
    };
    set_mode(TW_COMPUTE_FP8_WEIGHTS);
    {
        TwForward tw(*p, m);
        tw.settle_and_verify(state, 1, 8e-2);
        add_bandwidth_counter(state, *p, m);
        auto execs = capture([&](int i) { tw.call(i); });
        time_graphs(state, batch_for(m), execs);
    }
    set_mode(TW_COMPUTE_DEFAULT);
}

/// A device-to-device copy of 256 MiB (graph replay): the bandwidth the need_bw counters are
/// measured against, in the same run (counter copy_bw: bytes read + written per second).
void bm_copy(benchmark::State &state) {
    const size_t bytes = size_t{256} << 20;
    DeviceMemory a(bytes), b(bytes);
    ck(cudaMemsetAsync(a.get(), 1, bytes, env.stream), "cudaMemsetAsync");
    auto execs = capture([&](int i) {
        ck(cudaMemcpyAsync(i % 2 ? a.get() : b.get(), i % 2 ? b.get() : a.get(), bytes, cudaMemcpyDeviceToDevice, env.stream),
           "cudaMemcpyAsync");
    });
    time_graphs(state, 4, execs);
    state.counters["copy_bw"] = benchmark::Counter(2.0 * static_cast<double>(bytes), benchmark::Counter::kIsIterationInvariantRate,
                                                   benchmark::Counter::kIs1000);
}

/// A plain read of the shape's gate weights (H x D bf16), replayed from graphs as the serving rows
/// are (the launch included): the floor of their read_rate, in the same run (counter read_bw).
/// Each replay reads the next of several copies, at least 256 MiB in all, so that the copy read
/// is no longer in L2.
void bm_read_floor(benchmark::State &state, Shape s) {
    const size_t bytes = bf16_bytes(s.h * s.d), stride = (bytes + 255) / 256 * 256;
    const int copies = static_cast<int>(std::max<size_t>(2, ((size_t{256} << 20) + bytes - 1) / bytes));
    DeviceMemory src(stride * static_cast<size_t>(copies)), out(read_floor_out_bytes());
    auto execs =
        capture([&](int i) { launch_read_floor(env.stream, src.get<char>() + i * stride, bytes, out.get()); }, copies);
    time_graphs(state, batch_for(1), execs);
    state.counters["read_bw"] = benchmark::Counter(
        static_cast<double>(bytes), benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
    state.counters["bytes"] = static_cast<double>(bytes);
    state.counters["copies"] = static_cast<double>(copies);
}

/// twSpGEMMFused called as a C program calls it: no graph, the problem's one handle on the
/// benchmark's non-blocking stream. Several forwards per instance settle the path first.
void bm_twblas_eager(benchmark::State &state, Shape s, std::string profile, int64_t max_m, int64_t m) {
    auto p = problem(s, profile, max_m);
    TwForward tw(*p, m);
    tw.settle_and_verify(state, 3);
    add_bandwidth_counter(state, *p, m);
    add_read_counters(state, *p, m);
    time_eager(state, batch_for(m), [&](int run) { tw.call(run % kInstances); });
}

void bm_dense(benchmark::State &state, Shape s, std::string profile, int64_t max_m, int64_t m) {
    auto p = problem(s, profile, max_m);
    tt::DenseFfn dense({s.d, s.h, m});
    DeviceMemory y(bf16_bytes(m * s.d));
    dense_reference(*p, m);
    auto execs = capture([&](int i) { dense.forward(env.stream, p->x[i]->get(), p->weights(i), m, y.get()); });
    time_graphs(state, batch_for(m), execs);
    add_problem_counters(state, *p, m);
}

/// dense_fused's tile, forced by TWBLAS_BENCH_DENSE_FUSED_TILE=wide|narrow (to place
/// DenseFusedFfn::kWideMinTokens); by M otherwise.
tt::FusedTile fused_tile() {
    const char *v = std::getenv("TWBLAS_BENCH_DENSE_FUSED_TILE");
    if (v && std::strcmp(v, "wide") == 0) return tt::FusedTile::Wide;
    if (v && std::strcmp(v, "narrow") == 0) return tt::FusedTile::Narrow;
    return tt::FusedTile::Auto;
}

/// The dense FFN as tuned engines run it (src/testing/cuda/dense_fused_ffn.hpp): gate+up as one
/// CUTLASS sm_90a GEMM with ReLU * product in its epilogue, then the cuBLASLt down GEMM. Checked
/// against the dense cuBLAS FFN first (within 1e-2: the two round z and u differently, bf16's
/// half-ulp is 2e-3), with h and Y poisoned so that an unwritten value fails the check. Skipped,
/// with the reason, where the GPU or the shape does not take the sm_90a kernel.
void bm_dense_fused(benchmark::State &state, Shape s, std::string profile, int64_t max_m, int64_t m) {
    const std::string why = tt::dense_fused_unsupported(s.d, s.h);
    if (!why.empty()) {
        state.SkipWithError(("skipped: dense_fused " + why).c_str());
        return;
    }
    auto p = problem(s, profile, max_m);
    tt::DenseFusedFfn fused({s.d, s.h, m}, fused_tile());
    DeviceMemory y(bf16_bytes(m * s.d));
    ck(cudaMemsetAsync(fused.hidden(), 0xff, bf16_bytes(m * s.h), env.stream), "poison h");
    ck(cudaMemsetAsync(y.get(), 0xff, bf16_bytes(m * s.d), env.stream), "poison Y");
    fused.forward(env.stream, p->x[0]->get(), p->fused_weights(0), m, y.get());
    const double err = rel_error(download(y.get(), static_cast<size_t>(m * s.d)), dense_reference(*p, m));
    add_problem_counters(state, *p, m);
    state.counters["rel_err_vs_dense"] = err;
    state.counters["wide_tiles"] = fused.wide_tiles(m) ? 1.0 : 0.0;
    if (!(err < 1e-2)) {
        state.SkipWithError(("dense_fused differs from the dense FFN: rel. error " + std::to_string(err)).c_str());
        return;
    }
    auto execs = capture([&](int i) { fused.forward(env.stream, p->x[i]->get(), p->fused_weights(i), m, y.get()); });
    time_graphs(state, batch_for(m), execs);
}

/// The dense cuBLAS FFN called the same way as twblas_eager.
void bm_dense_eager(benchmark::State &state, Shape s, std::string profile, int64_t max_m, int64_t m) {
    auto p = problem(s, profile, max_m);
    tt::DenseFfn dense({s.d, s.h, m});
    DeviceMemory y(bf16_bytes(m * s.d));
    time_eager(state, batch_for(m), [&](int run) {
        const int i = run % kInstances;
        dense.forward(env.stream, p->x[i]->get(), p->weights(i), m, y.get());
    });
    add_problem_counters(state, *p, m);
}

void bm_gate(benchmark::State &state, Shape s, std::string profile, int64_t max_m, int64_t m) {
    auto p = problem(s, profile, max_m);
    tt::LtGemm gemm;
    DeviceMemory ws(tt::LtGemm::kWorkspaceBytes), g(bf16_bytes(m * s.h));
    auto execs = capture([&](int i) {  // X Wg^T: the first H rows of [Wg; Wu]
        gemm.run(env.stream, {p->x[i]->get(), m, s.d, s.d}, {p->wgu[i]->get(), s.h, s.d, s.d}, {g.get(), s.h}, ws.get(),
                 ws.bytes());
    });
    time_graphs(state, batch_for(m), execs);
    add_problem_counters(state, *p, m);
}

/// cuSPARSE pipeline; dense -> CSR needs the nnz on the host, so it is not capturable: each
/// phase is timed with its own events and the sum is the benchmark's time.
void bm_cusparse(benchmark::State &state, Shape s, std::string profile, int64_t max_m, int64_t m) {
    auto p = problem(s, profile, max_m);
    tt::DenseFfn dense({s.d, s.h, m});  // its gate+up GEMM and relu_mul make h
    DeviceMemory y(bf16_bytes(m * s.d));
    cusparseHandle_t sp;
    ck(cusparseCreate(&sp), "cusparseCreate");
    ck(cusparseSetStream(sp, env.stream), "cusparseSetStream");
    const int64_t cap = m * s.h / 4;  // CSR capacity: 25 % density
    DeviceMemory offsets(static_cast<size_t>(m + 1) * 4), cols(static_cast<size_t>(cap) * 4), vals(bf16_bytes(cap));
    cusparseDnMatDescr_t hd, wd, yd;
    cusparseSpMatDescr_t hs;
    ck(cusparseCreateDnMat(&hd, m, s.h, s.h, dense.hidden(), CUDA_R_16BF, CUSPARSE_ORDER_ROW), "dn H");
    ck(cusparseCreateDnMat(&wd, s.h, s.d, s.d, p->wd_rows->get(), CUDA_R_16BF, CUSPARSE_ORDER_ROW), "dn Wd");
    ck(cusparseCreateDnMat(&yd, m, s.d, s.d, y.get(), CUDA_R_16BF, CUSPARSE_ORDER_ROW), "dn Y");
    ck(cusparseCreateCsr(&hs, m, s.h, 0, offsets.get(), nullptr, nullptr, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                         CUSPARSE_INDEX_BASE_ZERO, CUDA_R_16BF),
       "csr");
    size_t conv_bytes = 0, mm_bytes = 0;
    ck(cusparseDenseToSparse_bufferSize(sp, hd, hs, CUSPARSE_DENSETOSPARSE_ALG_DEFAULT, &conv_bytes), "d2s size");
    DeviceMemory conv_ws(conv_bytes);
    const float one = 1.0f, zero = 0.0f;
    // SpMM workspace is sized with the real pattern, after a first conversion
    auto convert = [&]() {
        ck(cusparseDenseToSparse_analysis(sp, hd, hs, CUSPARSE_DENSETOSPARSE_ALG_DEFAULT, conv_ws.get()),
           "d2s analysis");
        int64_t r, c, nnz;
        ck(cusparseSpMatGetSize(hs, &r, &c, &nnz), "get size");  // synchronises
        if (nnz > cap) throw std::runtime_error("cuSPARSE pipeline: CSR capacity too small");
        ck(cusparseCsrSetPointers(hs, offsets.get(), cols.get(), vals.get()), "set pointers");
        ck(cusparseDenseToSparse_convert(sp, hd, hs, CUSPARSE_DENSETOSPARSE_ALG_DEFAULT, conv_ws.get()), "d2s convert");
    };
    auto front = [&](int i) { dense.compute_hidden(env.stream, p->x[i]->get(), p->weights(i), m); };
    front(0);
    convert();
    ck(cusparseSpMM_bufferSize(sp, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, hs, wd,
                               &zero, yd, CUDA_R_32F, CUSPARSE_SPMM_ALG_DEFAULT, &mm_bytes),
       "spmm size");
    DeviceMemory mm_ws(mm_bytes);
    auto spmm = [&]() {
        ck(cusparseSpMM(sp, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, hs, wd, &zero, yd,
                        CUDA_R_32F, CUSPARSE_SPMM_ALG_DEFAULT, mm_ws.get()),
           "spmm");
    };
    spmm();
    const double err = rel_error(download(y.get(), static_cast<size_t>(m * s.d)), dense_reference(*p, m));

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

}  // namespace

void register_group(Shape s, const std::string &profile, const std::vector<int64_t> &ms, bool cusparse, bool cpu,
                    int64_t fp8_from) {
    const int64_t max_m = *std::max_element(ms.begin(), ms.end());
    for (int64_t m : ms) {
        add(bench_name("twblas", s, profile, m), bm_twblas, s, profile, max_m, m, batch_for(m));
        if (m >= fp8_from)
            add(bench_name("twblas_fp8", s, profile, m), bm_twblas_fp8, s, profile, max_m, m, batch_for(m));
        add(bench_name("dense", s, profile, m), bm_dense, s, profile, max_m, m, batch_for(m));
        add(bench_name("dense_fused", s, profile, m), bm_dense_fused, s, profile, max_m, m, batch_for(m));
        add(bench_name("gate", s, profile, m), bm_gate, s, profile, max_m, m, batch_for(m));
        if (cusparse && m >= 512)  // one pipeline an iteration
            add(bench_name("cusparse", s, profile, m), bm_cusparse, s, profile, max_m, m, 1);
        if (cpu && m <= 64) {
            auto *b =
                benchmark::RegisterBenchmark(bench_name("cpu_twblas", s, profile, m).c_str(),
                                             [=](benchmark::State &st) { bm_cpu(st, s, profile, max_m, m, true); });
            b->UseManualTime()
                ->Unit(benchmark::kMicrosecond)
                ->Repetitions(3)
                ->ReportAggregatesOnly(true)
                ->MinTime(0.05);
            b = benchmark::RegisterBenchmark(bench_name("cpu_dense", s, profile, m).c_str(),
                                             [=](benchmark::State &st) { bm_cpu(st, s, profile, max_m, m, false); });
            b->UseManualTime()
                ->Unit(benchmark::kMicrosecond)
                ->Repetitions(3)
                ->ReportAggregatesOnly(true)
                ->MinTime(0.05);
        }
    }
}

void register_copy() {
    benchmark::RegisterBenchmark("copy/d2d/256MiB", bm_copy)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond)
        ->Repetitions(5)
        ->ReportAggregatesOnly(true)
        ->MinTime(kMinTimedSeconds / 4);  // bm_copy's 4 copies an iteration
}

void register_read_floor(Shape s) {
    const std::string name = "floor/read/d" + std::to_string(s.d) + "_h" + std::to_string(s.h) + "/wg";
    benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State &st) { bm_read_floor(st, s); })
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond)
        ->Repetitions(5)
        ->ReportAggregatesOnly(true)
        ->MinTime(kMinTimedSeconds / batch_for(1));  // bm_read_floor's calls an iteration
}

void register_eager(Shape s, const std::string &profile, const std::vector<int64_t> &ms, int64_t max_m,
                    bool with_graph_replay) {
    for (int64_t m : ms) {
        if (with_graph_replay) {
            add(bench_name("twblas", s, profile, m), bm_twblas, s, profile, max_m, m, batch_for(m));
            add(bench_name("dense", s, profile, m), bm_dense, s, profile, max_m, m, batch_for(m));
        }
        add(bench_name("twblas_eager", s, profile, m), bm_twblas_eager, s, profile, max_m, m, batch_for(m));
        add(bench_name("dense_eager", s, profile, m), bm_dense_eager, s, profile, max_m, m, batch_for(m));
    }
}

}  // namespace twbench
