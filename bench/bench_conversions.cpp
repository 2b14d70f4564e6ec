// The conversions suite (--suite=conversions): twblas's conversions against cuSPARSE's on the
// same matrix, the FFN hidden activation h = ReLU(X Wg^T) (M x H bf16, row-major) of the
// project's generated problem, computed on the GPU (cuBLASLt gate GEMM, ReLU kernel).
//
//   conv/twblas_dense_to_twell    twDenseToSparse_analysis + _convert into TwELL (T = 256; the
//                                 largest compression of 8, 4, 2 whose analysis says every row fits)
//   conv/twblas_dense_to_twell_convert  twDenseToSparse_convert alone into that TwELL (a user
//                                 refilling a container sized once: convert reports capacity itself)
//   conv/twblas_twell_to_dense    twSparseToDense of that TwELL
//   conv/twblas_twell_to_dense_queued, conv/cusparse_csr_to_dense_queued: the same calls, eight
//                                 queued before each synchronisation, per call (a caller that
//                                 queues work behind them)
//   conv/twblas_twell_validate    twSpMatValidate of it;  conv/twblas_twell_info: twSpMatGetInfo
//   conv/twblas_dense_to_hybrid   twDenseToSparse_analysis + _convert into a hybrid (ELL width 64,
//                                 a backup row for every row over it)
//   conv/twblas_hybrid_transpose  twSparseTranspose of that hybrid into an H x M hybrid
//   conv/cusparse_dense_to_csr    cusparseDenseToSparse_analysis + _convert (CSR, int32 indices,
//                                 bf16 values; arrays allocated beforehand at the analysis's size)
//   conv/cusparse_csr_to_dense    cusparseSparseToDense of that CSR
//   conv/twblas_gemm_to_twell     twGemmToSparse(1, X, Wg, that TwELL, RELU): the gate GEMM into it
//   conv/cublas_gate_gemm         its baseline: cuBLASLt's X Wg^T into a dense bf16 output
//
// Timing: the twblas calls are setup calls that may synchronise (their status depends on the
// data), so they cannot be captured in a graph; every entry, cuSPARSE's too, is timed the same
// way, as a user makes the calls: host wall time (steady_clock) from before the first call to
// after cudaStreamSynchronize(env.stream), after warm-up calls. The dense inputs rotate over
// kInstances copies, as X does in the FFN suite. Everything is verified before timing (once per
// matrix and check; a failed check skips the entry): dense -> sparse -> dense gives the matrix
// back bit for bit (twblas and cuSPARSE), the transpose gives its transpose, validate succeeds
// and info counts every non-zero.
//
// Counter bw: bytes read + written per second (kIs1000, as need_bw), from the meaningful bytes
// of each side (padding and unused slots left out):
//   dense   rows * cols * 2
//   TwELL   rows * tiles * 4 (block headers) + nnz * 4 (column | value words)
//           + 4 * (1 + overflow rows) (the overflow record; 0 rows: only fitting TwELLs are timed)
//   hybrid  rows * 4 (row_nnz) + ELL nnz * (2 + 2) (column, value; the non-zeros of the rows of
//           at most E) + backup rows * cols * 2 (dense backup rows) + rows * 4 (backup_map)
//   CSR     (rows + 1) * 4 (offsets) + nnz * (4 + 2) (column, value)
// dense -> X and X -> dense move dense + X; validate and info read the TwELL; the transpose reads
// the M x H hybrid and writes the H x M one.
#include <cusparse.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <utility>

#include "common.hpp"

namespace twbench {

namespace {

using twbench::ck;  // the overloads of common.hpp next to the cuSPARSE one
void ck(cusparseStatus_t s, const char *what) {
    if (s != CUSPARSE_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + ": " + cusparseGetErrorString(s));
}

const Shape kShape{2048, 5632};                  // the paper's D and H
constexpr int64_t kMaxM = 65536;                 // one problem per profile: each M takes the first M rows of X
constexpr int32_t kTile = 256;                   // TwELL tile width
constexpr int32_t kEllWidth = 64;                // hybrid ELL width of the M x H matrix
constexpr int32_t kMaxTransposedWidth = 1024;    // ELL width cap of the H x M transpose
constexpr twConvertOp_t kOp = TW_CONVERT_PLAIN;  // h is ReLU'd already: keep every non-+0 pattern

/// h = ReLU(X Wg^T) of one (profile, M): kInstances copies on the GPU, the bits on the host,
/// and the counts the containers are sized from. Kept while its group of entries runs.
struct Activation {
    std::string profile;
    int64_t m = 0;
    std::vector<std::unique_ptr<DeviceMemory>> dense;
    std::vector<uint16_t> host;
    std::vector<int64_t> row_nnz, col_nnz;
    int64_t nnz = 0;
    int32_t twell_compression = -1;               // chosen by the analysis; 0: none fits; -1: not tried
    std::map<std::string, std::string> verdicts;  // check -> "" (exact) or what went wrong
    twHandle_t handle = nullptr;                  // CUDA backend on env.stream
    std::shared_ptr<Problem> problem;             // X and Wg, for the GEMM entries
    ~Activation() { twDestroy(handle); }
};
std::unique_ptr<Activation> current;

size_t dense_count(int64_t m) { return static_cast<size_t>(m * kShape.h); }

Activation &activation(const std::string &profile, int64_t m) {
    if (current && current->profile == profile && current->m == m) return *current;
    current.reset();  // free the previous matrix first
    auto p = problem(kShape, profile, kMaxM);
    auto a = std::make_unique<Activation>();
    a->profile = profile;
    a->m = m;
    const int64_t d = kShape.d, h = kShape.h;
    {
        tt::LtGemm gemm;  // bf16 in, fp32 accumulation, bf16 out; X Wg^T: the first H rows of [Wg; Wu]
        DeviceMemory ws(tt::LtGemm::kWorkspaceBytes);
        a->dense.push_back(std::make_unique<DeviceMemory>(dense_count(m) * 2));
        void *h0 = a->dense[0]->get();
        gemm.run(env.stream, {p->x[0]->get(), m, d, d}, {p->wgu[0]->get(), h, d, d}, {h0, h}, ws.get(), ws.bytes());
        tt::relu_inplace(env.stream, h0, m * h);  // negatives, -0 and NaN become +0
        for (int i = 1; i < kInstances; ++i) {
            a->dense.push_back(std::make_unique<DeviceMemory>(dense_count(m) * 2));
            ck(cudaMemcpyAsync(a->dense[i]->get(), h0, dense_count(m) * 2, cudaMemcpyDeviceToDevice, env.stream),
               "cudaMemcpyAsync");
        }
        a->host = download(h0, dense_count(m));
    }
    a->row_nnz.assign(static_cast<size_t>(m), 0);
    a->col_nnz.assign(static_cast<size_t>(h), 0);
    for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < h; ++c)
            if (a->host[static_cast<size_t>(r * h + c)] != 0) ++a->row_nnz[r], ++a->col_nnz[c];
    for (int64_t n : a->row_nnz) a->nnz += n;
    if (a->nnz == 0) throw std::runtime_error("conversions: the activation is all zeros");  // never time zeros
    ck(twCreateWithBackend(&a->handle, TW_BACKEND_CUDA), nullptr, "twCreateWithBackend(CUDA)");
    ck(twSetStream(a->handle, env.stream), a->handle, "twSetStream");
    a->problem = p;
    current = std::move(a);
    return *current;
}

/// "" when the call succeeded, else its status and message (a verdict).
std::string failure(twStatus_t s, twHandle_t h, const char *what) {
    return s == TW_STATUS_SUCCESS ? std::string()
                                  : std::string(what) + ": " + twGetStatusName(s) + ": " + twGetErrorMessage(h);
}

/// Runs `check` once per matrix and name (the repetitions reuse its verdict); false, with the
/// entry skipped, when it found a difference.
template <class F>
bool verified(benchmark::State &state, Activation &a, const std::string &name, F &&check) {
    auto it = a.verdicts.find(name);
    if (it == a.verdicts.end()) it = a.verdicts.emplace(name, check()).first;
    if (it->second.empty()) return true;
    state.SkipWithError((name + ": " + it->second).c_str());
    return false;
}

/// "" when `got` is the activation (rows x cols, or its transpose cols x rows) bit for bit.
std::string differs(const std::vector<uint16_t> &got, const Activation &a, bool transposed) {
    const int64_t m = a.m, h = kShape.h;
    auto where = [](int64_t r, int64_t c) {
        return "differs from the matrix at (" + std::to_string(r) + ", " + std::to_string(c) + ")";
    };
    if (!transposed) {
        const auto at = std::mismatch(got.begin(), got.end(), a.host.begin()).first - got.begin();
        return at == static_cast<std::ptrdiff_t>(got.size()) ? std::string() : where(at / h, at % h);
    }
    for (int64_t r0 = 0; r0 < m; r0 += 64)  // blocks of rows: both sides stay in cache
        for (int64_t c = 0; c < h; ++c)
            for (int64_t r = r0; r < std::min(r0 + 64, m); ++r)
                if (got[static_cast<size_t>(c * m + r)] != a.host[static_cast<size_t>(r * h + c)]) return where(c, r);
    return {};
}

using Dn = std::unique_ptr<twDnMatDescr, twStatus_t (*)(twDnMatDescr_t)>;
Dn dense_descr(void *values, int64_t rows, int64_t cols) {
    twDnMatDescr_t d = nullptr;
    ck(twCreateDnMat(&d, rows, cols, cols, values, TW_R_16BF, TW_ORDER_ROW), nullptr, "twCreateDnMat");
    return Dn(d, twDestroyDnMat);
}

double dense_bytes(int64_t rows, int64_t cols) { return 2.0 * static_cast<double>(rows * cols); }

/// A TwELL or hybrid container on the GPU and its meaningful bytes (top of the file).
struct Sparse {
    std::unique_ptr<DeviceMemory> buffer;
    twSpMatDescr_t descr = nullptr;
    double bytes = 0;
    int32_t backup_rows = 0, ell_width = 0;  // hybrid
    ~Sparse() { twDestroySpMat(descr); }
};

std::unique_ptr<Sparse> twell(int64_t rows, int64_t cols, int32_t compression, int64_t nnz) {
    auto s = std::make_unique<Sparse>();
    size_t bytes = 0;
    ck(twTwellBufferSize(rows, cols, kTile, compression, &bytes), nullptr, "twTwellBufferSize");
    s->buffer = std::make_unique<DeviceMemory>(bytes);
    ck(twCreateTwell(&s->descr, rows, cols, kTile, compression, s->buffer->get(), TW_R_16BF), nullptr, "twCreateTwell");
    const int64_t tiles = (cols + kTile - 1) / kTile;
    s->bytes = 4.0 * static_cast<double>(rows * tiles + nnz + 1);
    return s;
}

/// A rows x cols hybrid of ELL width `ell_width` with a backup row for every row whose count
/// (`row_nnz`) is over it.
std::unique_ptr<Sparse> hybrid(int64_t cols, int32_t ell_width, const std::vector<int64_t> &row_nnz) {
    const auto rows = static_cast<int64_t>(row_nnz.size());
    int64_t backup = 0, ell_nnz = 0;
    for (int64_t n : row_nnz) {
        if (n > ell_width)
            ++backup;
        else
            ell_nnz += n;
    }
    auto s = std::make_unique<Sparse>();
    size_t bytes = 0;
    ck(twHybridBufferSize(rows, cols, ell_width, backup, TW_R_16BF, &bytes), nullptr, "twHybridBufferSize");
    s->buffer = std::make_unique<DeviceMemory>(bytes);
    ck(twCreateHybrid(&s->descr, rows, cols, ell_width, backup, s->buffer->get(), TW_R_16BF), nullptr,
       "twCreateHybrid");
    s->bytes = 8.0 * static_cast<double>(rows) + 4.0 * static_cast<double>(ell_nnz) + dense_bytes(backup, cols);
    s->backup_rows = static_cast<int32_t>(backup);
    s->ell_width = ell_width;
    return s;
}

/// twDenseToSparse from the activation's dense copies into `out`, with its workspace.
class ToSparse {
  public:
    ToSparse(Activation &a, std::unique_ptr<Sparse> out) : a_(a), out_(std::move(out)) {
        for (auto &d : a.dense) in_.push_back(dense_descr(d->get(), a.m, kShape.h));
        size_t bytes = 0;
        ck(twDenseToSparse_bufferSize(a.handle, in_[0].get(), out_->descr, kOp, &bytes), a.handle,
           "twDenseToSparse_bufferSize");
        ws_ = std::make_unique<DeviceMemory>(bytes);
    }
    twStatus_t analysis(int inst) {
        return twDenseToSparse_analysis(a_.handle, in_[inst].get(), out_->descr, kOp, ws_->get());
    }
    twStatus_t convert(int inst) {
        return twDenseToSparse_convert(a_.handle, in_[inst].get(), out_->descr, kOp, ws_->get());
    }
    /// The user's sequence, analysis then convert; the first status that is not SUCCESS.
    twStatus_t call(int inst) {
        const twStatus_t s = analysis(inst);
        const twStatus_t c = convert(inst);
        return s != TW_STATUS_SUCCESS ? s : c;
    }
    Sparse &out() { return *out_; }

  private:
    Activation &a_;
    std::unique_ptr<Sparse> out_;
    std::vector<Dn> in_;
    std::unique_ptr<DeviceMemory> ws_;
};

/// dense -> TwELL at the largest compression (8, 4, 2) whose analysis says every row fits:
/// CAPACITY_EXCEEDED (a tile of a row over its slots, as llm's dense first tokens may have) is
/// a legitimate answer, not an error. nullptr when no compression fits.
std::unique_ptr<ToSparse> to_twell(Activation &a) {
    for (int32_t c : {8, 4, 2}) {
        if (a.twell_compression >= 0 && c != a.twell_compression) continue;  // chosen before (0: none)
        auto conv = std::make_unique<ToSparse>(a, twell(a.m, kShape.h, c, a.nnz));
        const twStatus_t st = conv->analysis(0);
        if (st == TW_STATUS_SUCCESS) {
            a.twell_compression = c;
            return conv;
        }
        if (st != TW_STATUS_CAPACITY_EXCEEDED) ck(st, a.handle, "twDenseToSparse_analysis (TwELL)");
    }
    a.twell_compression = 0;
    return nullptr;
}

/// The ELL width of the H x M transpose: its largest row (column of h) rounded up to 8, capped.
int32_t transposed_width(const std::vector<int64_t> &col_nnz) {
    const int64_t most = *std::max_element(col_nnz.begin(), col_nnz.end());
    return static_cast<int32_t>(std::clamp<int64_t>((most + 7) / 8 * 8, 8, kMaxTransposedWidth));
}

/// twSparseToDense of `s` (M x H, or H x M when `transposed`) into a buffer of NaN patterns,
/// checked against the activation.
std::string to_dense_differs(Activation &a, twSpMatDescr_t s, bool transposed) {
    DeviceMemory out(dense_count(a.m) * 2);
    ck(cudaMemsetAsync(out.get(), 0xff, dense_count(a.m) * 2, env.stream), "poison");
    const Dn d = transposed ? dense_descr(out.get(), kShape.h, a.m) : dense_descr(out.get(), a.m, kShape.h);
    const std::string f = failure(twSparseToDense(a.handle, s, d.get()), a.handle, "twSparseToDense");
    return f.empty() ? differs(download(out.get(), dense_count(a.m)), a, transposed) : f;
}

/// Host wall time of one call sequence up to the end of its work on env.stream, after warm-up
/// calls; `call(run)` rotates over the instances where it has several. With `queued` > 1, that
/// many calls go before the synchronisation and the time is divided by them: what a caller who
/// queues work behind each call sees (the _queued entries).
template <class F>
void time_host(benchmark::State &state, F &&call, int queued = 1) {
    int run = 0;
    for (int i = 0; i < 2; ++i) call(run++);  // warm-up
    ck(cudaStreamSynchronize(env.stream), "warm-up");
    for (auto _ : state) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int q = 0; q < queued; ++q) call(run++);
        ck(cudaStreamSynchronize(env.stream), "cudaStreamSynchronize");
        state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / queued);
    }
}
constexpr int kQueuedCalls = 8;

void add_counters(benchmark::State &state, const Activation &a, double bytes) {
    state.counters["bw"] =
        benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
    state.counters["nnz"] = static_cast<double>(a.nnz);
    state.counters["mean_row_nnz"] = static_cast<double>(a.nnz) / static_cast<double>(a.m);
    state.counters["tokens"] = static_cast<double>(a.m);
    state.counters["h"] = static_cast<double>(kShape.h);
    state.SetLabel(a.profile);
}

/// `conv`'s container filled from instance 0, or nullptr with the entry skipped when that fails.
std::unique_ptr<ToSparse> filled(benchmark::State &state, Activation &a, std::unique_ptr<ToSparse> conv,
                                 const char *what) {
    const std::string f = failure(conv->call(0), a.handle, what);
    if (f.empty()) return conv;
    state.SkipWithError(f.c_str());
    return nullptr;
}

/// The filled TwELL, or nullptr with the entry skipped when no compression fits.
std::unique_ptr<ToSparse> filled_twell(benchmark::State &state, Activation &a) {
    auto conv = to_twell(a);
    if (!conv) {
        state.SkipWithError("no TwELL compression (8, 4, 2) holds every row (CAPACITY_EXCEEDED)");
        return nullptr;
    }
    state.counters["compression"] = a.twell_compression;
    return filled(state, a, std::move(conv), "dense -> TwELL");
}

void bm_dense_to_twell(benchmark::State &state, Shape, std::string profile, int64_t, int64_t m) {
    Activation &a = activation(profile, m);
    auto conv = filled_twell(state, a);
    if (!conv || !verified(state, a, "twell round trip", [&] { return to_dense_differs(a, conv->out().descr, false); }))
        return;
    time_host(state, [&](int run) { ck(conv->call(run % kInstances), a.handle, "dense -> TwELL"); });
    add_counters(state, a, dense_bytes(m, kShape.h) + conv->out().bytes);
}

void bm_dense_to_twell_convert(benchmark::State &state, Shape, std::string profile, int64_t, int64_t m) {
    Activation &a = activation(profile, m);
    auto conv = filled_twell(state, a);
    if (!conv || !verified(state, a, "twell round trip", [&] { return to_dense_differs(a, conv->out().descr, false); }))
        return;
    time_host(state, [&](int run) { ck(conv->convert(run % kInstances), a.handle, "twDenseToSparse_convert"); });
    add_counters(state, a, dense_bytes(m, kShape.h) + conv->out().bytes);
}

void twell_to_dense(benchmark::State &state, const std::string &profile, int64_t m, int queued) {
    Activation &a = activation(profile, m);
    auto conv = filled_twell(state, a);
    if (!conv || !verified(state, a, "twell round trip", [&] { return to_dense_differs(a, conv->out().descr, false); }))
        return;
    DeviceMemory out(dense_count(m) * 2);
    const Dn d = dense_descr(out.get(), m, kShape.h);
    time_host(
        state, [&](int) { ck(twSparseToDense(a.handle, conv->out().descr, d.get()), a.handle, "twSparseToDense"); },
        queued);
    add_counters(state, a, dense_bytes(m, kShape.h) + conv->out().bytes);
}
void bm_twell_to_dense(benchmark::State &state, Shape, std::string profile, int64_t, int64_t m) {
    twell_to_dense(state, profile, m, 1);
}
void bm_twell_to_dense_queued(benchmark::State &state, Shape, std::string profile, int64_t, int64_t m) {
    twell_to_dense(state, profile, m, kQueuedCalls);
}

void bm_twell_validate(benchmark::State &state, Shape, std::string profile, int64_t, int64_t m) {
    Activation &a = activation(profile, m);
    auto conv = filled_twell(state, a);
    const twSpMatDescr_t s = conv ? conv->out().descr : nullptr;
    if (!conv || !verified(state, a, "twell validate",
                           [&] { return failure(twSpMatValidate(a.handle, s), a.handle, "twSpMatValidate"); }))
        return;
    time_host(state, [&](int) { ck(twSpMatValidate(a.handle, s), a.handle, "twSpMatValidate"); });
    add_counters(state, a, conv->out().bytes);
}

void bm_twell_info(benchmark::State &state, Shape, std::string profile, int64_t, int64_t m) {
    Activation &a = activation(profile, m);
    auto conv = filled_twell(state, a);
    const twSpMatDescr_t s = conv ? conv->out().descr : nullptr;
    twSpMatInfo_t info{};
    auto check = [&] {
        const std::string f = failure(twSpMatGetInfo(a.handle, s, &info), a.handle, "twSpMatGetInfo");
        if (!f.empty()) return f;
        if (info.nnz != a.nnz || info.overflowRows != 0)
            return "info: nnz " + std::to_string(info.nnz) + " (matrix: " + std::to_string(a.nnz) +
                   "), overflow rows " + std::to_string(info.overflowRows);
        return std::string();
    };
    if (!conv || !verified(state, a, "twell info", check)) return;
    time_host(state, [&](int) { ck(twSpMatGetInfo(a.handle, s, &info), a.handle, "twSpMatGetInfo"); });
    add_counters(state, a, conv->out().bytes);
}

/// twGemmToSparse(1, X, Wg, TwELL, RELU): the gate GEMM straight into the TwELL of the dense
/// entries (same compression), X rotated over the instances. Checked against the activation
/// (cuBLASLt's GEMM, ReLU): the two GEMMs sum in different orders, so values may differ in their
/// last bits; the check wants every value within 2 % (or 1e-3) and activity on the same units
/// but where the value is within 1e-3 of 0.
void bm_gemm_to_twell(benchmark::State &state, Shape, std::string profile, int64_t, int64_t m) {
    Activation &a = activation(profile, m);
    auto conv = filled_twell(state, a);
    if (!conv) return;
    Sparse &out = conv->out();
    const Problem &p = *a.problem;
    std::vector<Dn> x;
    for (auto &xi : p.x) x.push_back(dense_descr(xi->get(), m, kShape.d));
    const Dn wg = dense_descr(p.wgu[0]->get(), kShape.h, kShape.d);
    size_t bytes = 0;
    ck(twGemmToSparse_bufferSize(a.handle, x[0].get(), wg.get(), out.descr, TW_CONVERT_RELU, &bytes), a.handle,
       "twGemmToSparse_bufferSize");
    DeviceMemory ws(bytes);
    auto call = [&](int inst) {
        ck(twGemmToSparse(a.handle, 1.0f, x[static_cast<size_t>(inst)].get(), wg.get(), out.descr, TW_CONVERT_RELU,
                          ws.get()),
           a.handle, "twGemmToSparse");
    };
    auto check = [&] {
        call(0);
        DeviceMemory back(dense_count(m) * 2);
        const Dn d = dense_descr(back.get(), m, kShape.h);
        const std::string f = failure(twSparseToDense(a.handle, out.descr, d.get()), a.handle, "twSparseToDense");
        if (!f.empty()) return f;
        const std::vector<uint16_t> got = download(back.get(), dense_count(m));
        auto value = [](uint16_t b) {
            const uint32_t u = static_cast<uint32_t>(b) << 16;
            float v;
            std::memcpy(&v, &u, sizeof v);
            return v;
        };
        for (size_t i = 0; i < got.size(); ++i) {
            const float g = value(got[i]), w = value(a.host[i]);
            if (std::fabs(g - w) > std::max(0.02f * std::fabs(w), 1e-3f))
                return "value " + std::to_string(g) + " against cuBLAS's " + std::to_string(w) + " at (" +
                       std::to_string(i / kShape.h) + ", " + std::to_string(i % kShape.h) + ")";
        }
        return std::string();
    };
    if (!verified(state, a, "gemm to twell", check)) return;
    time_host(state, [&](int run) { call(run % kInstances); });
    add_counters(state, a, dense_bytes(m, kShape.d) + dense_bytes(kShape.h, kShape.d) + out.bytes);
}

/// The baseline of bm_gemm_to_twell: cuBLASLt's X Wg^T into a dense bf16 output, nothing else.
void bm_cublas_gate_gemm(benchmark::State &state, Shape, std::string profile, int64_t, int64_t m) {
    Activation &a = activation(profile, m);
    const Problem &p = *a.problem;
    tt::LtGemm gemm;
    DeviceMemory ws(tt::LtGemm::kWorkspaceBytes), out(dense_count(m) * 2);
    time_host(state, [&](int run) {
        gemm.run(env.stream, {p.x[static_cast<size_t>(run % kInstances)]->get(), m, kShape.d, kShape.d},
                 {p.wgu[0]->get(), kShape.h, kShape.d, kShape.d}, {out.get(), kShape.h}, ws.get(), ws.bytes());
    });
    add_counters(state, a, dense_bytes(m, kShape.d) + dense_bytes(kShape.h, kShape.d) + dense_bytes(m, kShape.h));
}

/// The filled hybrid; its backup rows come from the host counts, so every row fits.
std::unique_ptr<ToSparse> filled_hybrid(benchmark::State &state, Activation &a) {
    auto conv =
        filled(state, a, std::make_unique<ToSparse>(a, hybrid(kShape.h, kEllWidth, a.row_nnz)), "dense -> hybrid");
    if (conv) state.counters["backup_rows"] = conv->out().backup_rows;
    return conv;
}

void bm_dense_to_hybrid(benchmark::State &state, Shape, std::string profile, int64_t, int64_t m) {
    Activation &a = activation(profile, m);
    auto conv = filled_hybrid(state, a);
    if (!conv ||
        !verified(state, a, "hybrid round trip", [&] { return to_dense_differs(a, conv->out().descr, false); }))
        return;
    time_host(state, [&](int run) { ck(conv->call(run % kInstances), a.handle, "dense -> hybrid"); });
    add_counters(state, a, dense_bytes(m, kShape.h) + conv->out().bytes);
}

/// The M x H hybrid (M <= 65536: the transpose's columns are 16-bit) into an H x M hybrid whose
/// ELL width comes from the column counts, with a backup row for every column over it.
void bm_hybrid_transpose(benchmark::State &state, Shape, std::string profile, int64_t, int64_t m) {
    Activation &a = activation(profile, m);
    auto conv = filled_hybrid(state, a);
    if (!conv) return;
    auto t = hybrid(m, transposed_width(a.col_nnz), a.col_nnz);
    auto transpose = [&] { return twSparseTranspose(a.handle, conv->out().descr, t->descr); };
    auto check = [&] {
        const std::string f = failure(transpose(), a.handle, "twSparseTranspose");
        return f.empty() ? to_dense_differs(a, t->descr, true) : f;
    };
    if (!verified(state, a, "hybrid transpose", check)) return;
    time_host(state, [&](int) { ck(transpose(), a.handle, "twSparseTranspose"); });
    add_counters(state, a, conv->out().bytes + t->bytes);
    state.counters["t_ell_width"] = t->ell_width;
    state.counters["t_backup_rows"] = t->backup_rows;
}

/// cuSPARSE's dense <-> CSR on env.stream: CSR with int32 indices and bf16 values, its arrays
/// allocated once at the size the analysis gives; the dense side of csr -> dense is `out`.
class Csr {
  public:
    Csr(Activation &a, DeviceMemory &out) : a_(a), offsets_(static_cast<size_t>(a.m + 1) * 4) {
        const int64_t m = a.m, h = kShape.h;
        ck(cusparseCreate(&sp_), "cusparseCreate");
        ck(cusparseSetStream(sp_, env.stream), "cusparseSetStream");
        for (auto &d : a.dense) in_.push_back(dn(d->get()));
        out_ = dn(out.get());
        ck(cusparseCreateCsr(&csr_, m, h, 0, offsets_.get(), nullptr, nullptr, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                             CUSPARSE_INDEX_BASE_ZERO, CUDA_R_16BF),
           "cusparseCreateCsr");
        size_t bytes = 0;
        ck(cusparseDenseToSparse_bufferSize(sp_, in_[0], csr_, kToCsr, &bytes), "cusparseDenseToSparse_bufferSize");
        to_csr_ws_ = std::make_unique<DeviceMemory>(bytes);
        ck(cusparseDenseToSparse_analysis(sp_, in_[0], csr_, kToCsr, to_csr_ws_->get()),
           "cusparseDenseToSparse_analysis");
        int64_t rows = 0, cols = 0;
        ck(cusparseSpMatGetSize(csr_, &rows, &cols, &nnz_), "cusparseSpMatGetSize");
        cols_ = std::make_unique<DeviceMemory>(static_cast<size_t>(nnz_) * 4);
        vals_ = std::make_unique<DeviceMemory>(static_cast<size_t>(nnz_) * 2);
        ck(cusparseCsrSetPointers(csr_, offsets_.get(), cols_->get(), vals_->get()), "cusparseCsrSetPointers");
        ck(cusparseSparseToDense_bufferSize(sp_, csr_, out_, kToDense, &bytes), "cusparseSparseToDense_bufferSize");
        to_dense_ws_ = std::make_unique<DeviceMemory>(bytes);
    }
    ~Csr() {
        for (auto d : in_) cusparseDestroyDnMat(d);
        cusparseDestroyDnMat(out_);
        cusparseDestroySpMat(csr_);
        cusparseDestroy(sp_);
    }
    Csr(const Csr &) = delete;
    Csr &operator=(const Csr &) = delete;

    void to_csr(int inst) {
        ck(cusparseDenseToSparse_analysis(sp_, in_[inst], csr_, kToCsr, to_csr_ws_->get()),
           "cusparseDenseToSparse_analysis");
        ck(cusparseDenseToSparse_convert(sp_, in_[inst], csr_, kToCsr, to_csr_ws_->get()),
           "cusparseDenseToSparse_convert");
    }
    void to_dense() {
        ck(cusparseSparseToDense(sp_, csr_, out_, kToDense, to_dense_ws_->get()), "cusparseSparseToDense");
    }
    /// dense -> CSR -> dense into `out` (poisoned first) gives the matrix back bit for bit.
    std::string round_trip_differs(DeviceMemory &out) {
        if (nnz_ != a_.nnz)
            return "cuSPARSE counts " + std::to_string(nnz_) + " non-zeros, the matrix has " + std::to_string(a_.nnz);
        to_csr(0);
        ck(cudaMemsetAsync(out.get(), 0xff, dense_count(a_.m) * 2, env.stream), "poison");
        to_dense();
        return differs(download(out.get(), dense_count(a_.m)), a_, false);
    }
    double bytes() const { return 4.0 * static_cast<double>(a_.m + 1) + 6.0 * static_cast<double>(nnz_); }

  private:
    static constexpr cusparseDenseToSparseAlg_t kToCsr = CUSPARSE_DENSETOSPARSE_ALG_DEFAULT;
    static constexpr cusparseSparseToDenseAlg_t kToDense = CUSPARSE_SPARSETODENSE_ALG_DEFAULT;
    cusparseDnMatDescr_t dn(void *values) const {
        cusparseDnMatDescr_t d = nullptr;
        ck(cusparseCreateDnMat(&d, a_.m, kShape.h, kShape.h, values, CUDA_R_16BF, CUSPARSE_ORDER_ROW),
           "cusparseCreateDnMat");
        return d;
    }
    Activation &a_;
    cusparseHandle_t sp_ = nullptr;
    std::vector<cusparseDnMatDescr_t> in_;
    cusparseDnMatDescr_t out_ = nullptr;
    cusparseSpMatDescr_t csr_ = nullptr;
    DeviceMemory offsets_;
    std::unique_ptr<DeviceMemory> cols_, vals_, to_csr_ws_, to_dense_ws_;
    int64_t nnz_ = 0;
};

void bm_cusparse_dense_to_csr(benchmark::State &state, Shape, std::string profile, int64_t, int64_t m) {
    Activation &a = activation(profile, m);
    DeviceMemory out(dense_count(m) * 2);
    Csr csr(a, out);
    if (!verified(state, a, "csr round trip", [&] { return csr.round_trip_differs(out); })) return;
    time_host(state, [&](int run) { csr.to_csr(run % kInstances); });
    add_counters(state, a, dense_bytes(m, kShape.h) + csr.bytes());
}

void csr_to_dense(benchmark::State &state, const std::string &profile, int64_t m, int queued) {
    Activation &a = activation(profile, m);
    DeviceMemory out(dense_count(m) * 2);
    Csr csr(a, out);
    if (!verified(state, a, "csr round trip", [&] { return csr.round_trip_differs(out); })) return;
    csr.to_csr(0);
    time_host(state, [&](int) { csr.to_dense(); }, queued);
    add_counters(state, a, dense_bytes(m, kShape.h) + csr.bytes());
}
void bm_cusparse_csr_to_dense(benchmark::State &state, Shape, std::string profile, int64_t, int64_t m) {
    csr_to_dense(state, profile, m, 1);
}
void bm_cusparse_csr_to_dense_queued(benchmark::State &state, Shape, std::string profile, int64_t, int64_t m) {
    csr_to_dense(state, profile, m, kQueuedCalls);
}

std::string conv_name(const char *variant, const std::string &profile, int64_t m) {
    return std::string("conv/") + variant + "/d" + std::to_string(kShape.h) + "/" + profile + "/m" + std::to_string(m);
}

}  // namespace

void register_conversions() {
    struct Entry {
        const char *variant;
        BenchFn fn;
        int calls_per_iteration = 1;  // what its timer divides an iteration's time by
    };
    const Entry entries[] = {
        {"twblas_dense_to_twell", bm_dense_to_twell},        {"twblas_dense_to_twell_convert", bm_dense_to_twell_convert},
        {"twblas_twell_to_dense", bm_twell_to_dense},
        {"twblas_twell_validate", bm_twell_validate},        {"twblas_twell_info", bm_twell_info},
        {"twblas_dense_to_hybrid", bm_dense_to_hybrid},      {"twblas_hybrid_transpose", bm_hybrid_transpose},
        {"cusparse_dense_to_csr", bm_cusparse_dense_to_csr}, {"cusparse_csr_to_dense", bm_cusparse_csr_to_dense},
        {"twblas_gemm_to_twell", bm_gemm_to_twell},          {"cublas_gate_gemm", bm_cublas_gate_gemm},
        {"twblas_twell_to_dense_queued", bm_twell_to_dense_queued, kQueuedCalls},
        {"cusparse_csr_to_dense_queued", bm_cusparse_csr_to_dense_queued, kQueuedCalls},
    };
    for (const char *profile : {"uniform-29", "llm-29"})
        for (int64_t m : {4096, 16384, 65536})  // each (profile, M) group runs on one generated matrix
            for (const Entry &e : entries)
                add(conv_name(e.variant, profile, m), e.fn, kShape, profile, kMaxM, m, e.calls_per_iteration);
}

void release_conversions() { current.reset(); }

}  // namespace twbench
