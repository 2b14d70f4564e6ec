// Does cuBLASLt have a faster algorithm for the serving gate GEMM than its first heuristic, the one
// twblas's GemmRunner takes? z = X Wg^T (bf16 in and out, fp32 accumulation) at 16 to 256 tokens,
// the paper's and Llama-3-8B's shapes: every candidate cublasLtMatmulAlgoGetHeuristic returns
// (up to 16), timed over launches with Wg rotated over four copies (past L2), against the first.
// --sweep: every M from 17 to 64 and every 8th to 128, M's first candidate against the 64-token
// bucket's first candidate run at M and M's fastest. Build (as the other probes):
//   nvcc -arch=sm_90a -std=c++17 -O3 -Iinclude bench/probes/gate_algos_probe.cu -lcublasLt -o gate_algos_probe
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include <cublasLt.h>
#include <cuda_runtime.h>

namespace {

#define CHECK_CUDA(x)                                            \
    do {                                                         \
        cudaError_t e_ = (x);                                    \
        if (e_ != cudaSuccess) {                                 \
            std::printf("%s: %s\n", #x, cudaGetErrorString(e_)); \
            std::exit(1);                                        \
        }                                                        \
    } while (0)
#define CHECK_LT(x)                                                   \
    do {                                                              \
        cublasStatus_t s_ = (x);                                      \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                            \
            std::printf("%s: status %d\n", #x, static_cast<int>(s_)); \
            std::exit(1);                                             \
        }                                                             \
    } while (0)

constexpr int kCopies = 4, kLaunches = 40, kMaxAlgos = 16;

/// Microseconds a launch of `algo`, Wg rotated over the copies (one warm-up round first).
float time_algo(cublasLtHandle_t lt, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                cublasLtMatrixLayout_t lz, const cublasLtMatmulAlgo_t &algo, void *const *wg, const void *x, void *z,
                void *ws, size_t ws_bytes, cudaStream_t st) {
    const float alpha = 1.0f, beta = 0.0f;
    auto launch = [&](int i) {
        return cublasLtMatmul(lt, op, &alpha, wg[i % kCopies], la, x, lb, &beta, z, lz, z, lz, &algo, ws, ws_bytes, st);
    };
    for (int i = 0; i < kCopies; ++i)
        if (launch(i) != CUBLAS_STATUS_SUCCESS) return -1.0f;
    cudaEvent_t a, b;
    CHECK_CUDA(cudaEventCreate(&a));
    CHECK_CUDA(cudaEventCreate(&b));
    CHECK_CUDA(cudaEventRecord(a, st));
    for (int i = 0; i < kLaunches; ++i) CHECK_LT(launch(i));
    CHECK_CUDA(cudaEventRecord(b, st));
    CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return ms * 1000.0f / kLaunches;
}

/// A short description of a candidate: its tile, stages, split-K and reduction scheme.
void describe(const cublasLtMatmulAlgo_t &algo, char *out, size_t n) {
    int tile = 0, stages = 0, splitk = 0, red = 0, swizzle = 0;
    size_t got = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &got);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &got);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &got);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof red, &got);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle, sizeof swizzle, &got);
    std::snprintf(out, n, "tile %d stages %d splitk %d reduction %d swizzle %d", tile, stages, splitk, red, swizzle);
}

/// An M-token gate GEMM's descriptors and cuBLASLt's candidates for it, best first. Column-major
/// z^T (H x M) = Wg (stored D x H, transposed) . x^T (stored D x M): the row-major z = X Wg^T, as
/// GemmRunner asks for it.
struct Plan {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lz;
    cublasLtMatmulHeuristicResult_t res[kMaxAlgos];
    int count = 0;
};
Plan make_plan(cublasLtHandle_t lt, int64_t d, int64_t h, int64_t m, size_t ws_bytes) {
    Plan p;
    CHECK_LT(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
    CHECK_LT(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
    CHECK_LT(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n));
    CHECK_LT(cublasLtMatrixLayoutCreate(&p.la, CUDA_R_16BF, d, h, d));
    CHECK_LT(cublasLtMatrixLayoutCreate(&p.lb, CUDA_R_16BF, d, m, d));
    CHECK_LT(cublasLtMatrixLayoutCreate(&p.lz, CUDA_R_16BF, h, m, h));
    cublasLtMatmulPreference_t pref;
    CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
    CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                  sizeof ws_bytes));
    CHECK_LT(cublasLtMatmulAlgoGetHeuristic(lt, p.op, p.la, p.lb, p.lz, p.lz, pref, kMaxAlgos, p.res, &p.count));
    cublasLtMatmulPreferenceDestroy(pref);
    return p;
}
void destroy_plan(const Plan &p) {
    cublasLtMatrixLayoutDestroy(p.la);
    cublasLtMatrixLayoutDestroy(p.lb);
    cublasLtMatrixLayoutDestroy(p.lz);
    cublasLtMatmulDescDestroy(p.op);
}

/// A shape's operands: Wg in kCopies copies (past L2), x and z for up to 256 tokens, all bf16
/// 0.0115 (not zeros).
struct Operands {
    int64_t d, h;
    void *wg[kCopies];
    void *x, *z;
};
Operands make_operands(int64_t d, int64_t h) {
    Operands o{d, h, {}, nullptr, nullptr};
    for (auto &p : o.wg) {
        CHECK_CUDA(cudaMalloc(&p, static_cast<size_t>(h * d) * 2));
        CHECK_CUDA(cudaMemset(p, 0x3c, static_cast<size_t>(h * d) * 2));
    }
    CHECK_CUDA(cudaMalloc(&o.x, static_cast<size_t>(256 * d) * 2));
    CHECK_CUDA(cudaMemset(o.x, 0x3c, static_cast<size_t>(256 * d) * 2));
    CHECK_CUDA(cudaMalloc(&o.z, static_cast<size_t>(256 * h) * 2));
    return o;
}
void free_operands(const Operands &o) {
    for (void *p : o.wg) cudaFree(p);
    cudaFree(o.x);
    cudaFree(o.z);
}

struct Probe {
    cublasLtHandle_t lt;
    cudaStream_t st;
    void *ws;
    size_t ws_bytes;
    /// Microseconds a launch of candidate `algo` of plan `p` on operands `o`.
    float time(const Plan &p, const cublasLtMatmulAlgo_t &algo, const Operands &o) const {
        return time_algo(lt, p.op, p.la, p.lb, p.lz, algo, o.wg, o.x, o.z, ws, ws_bytes, st);
    }
};

int tile_of(const cublasLtMatmulAlgo_t &a) {
    int t = 0;
    size_t got = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &t, sizeof t, &got);
    return t;
}

/// Every candidate at 16 to 256 tokens, against the first.
void candidates(const Probe &pr, const Operands &o) {
    for (int64_t m : {16, 32, 64, 128, 256}) {
        const Plan p = make_plan(pr.lt, o.d, o.h, m, pr.ws_bytes);
        float first = 0.0f, best = 1e9f;
        int best_i = 0;
        std::printf("d%lld_h%lld m%lld: %d candidates\n", static_cast<long long>(o.d), static_cast<long long>(o.h),
                    static_cast<long long>(m), p.count);
        for (int i = 0; i < p.count; ++i) {
            const float us = pr.time(p, p.res[i].algo, o);
            char what[160];
            describe(p.res[i].algo, what, sizeof what);
            std::printf("  #%2d %8.2f us  workspace %8zu  %s\n", i, us, p.res[i].workspaceSize, what);
            if (i == 0) first = us;
            if (us > 0 && us < best) best = us, best_i = i;
        }
        std::printf("  first %.2f us, best #%d %.2f us (%.3f)\n", first, best_i, best, best / first);
        destroy_plan(p);
    }
}

/// Every M from 17 to 64 and every 8th to 128: M's first candidate, the 64-token plan's first
/// candidate run at M (where cublasLtMatmulAlgoCheck accepts it), and the fastest of M's own.
void sweep(const Probe &pr, const Operands &o) {
    std::printf("sweep d%lld_h%lld: M  first(tile us)  bucket64(tile us)  best(us)\n", static_cast<long long>(o.d),
                static_cast<long long>(o.h));
    const Plan b64 = make_plan(pr.lt, o.d, o.h, 64, pr.ws_bytes);
    for (int64_t m = 17; m <= 128; m += (m < 64 ? 1 : 8)) {
        const Plan p = make_plan(pr.lt, o.d, o.h, m, pr.ws_bytes);
        const float first = pr.time(p, p.res[0].algo, o);
        float best = first;
        for (int i = 1; i < p.count; ++i) {
            const float us = pr.time(p, p.res[i].algo, o);
            if (us > 0 && us < best) best = us;
        }
        cublasLtMatmulHeuristicResult_t chk{};
        float bucket = -1.0f;
        if (cublasLtMatmulAlgoCheck(pr.lt, p.op, p.la, p.lb, p.lz, p.lz, &b64.res[0].algo, &chk) ==
            CUBLAS_STATUS_SUCCESS)
            bucket = pr.time(p, b64.res[0].algo, o);
        std::printf("  %3lld  %4d %6.2f   %4d %6.2f   %6.2f\n", static_cast<long long>(m), tile_of(p.res[0].algo),
                    first, tile_of(b64.res[0].algo), bucket, best);
        destroy_plan(p);
    }
    destroy_plan(b64);
}

}  // namespace

int main(int argc, char **argv) {
    Probe pr{};
    CHECK_LT(cublasLtCreate(&pr.lt));
    CHECK_CUDA(cudaStreamCreate(&pr.st));
    pr.ws_bytes = 32u << 20;  // GemmRunner::kWorkspaceBytes
    CHECK_CUDA(cudaMalloc(&pr.ws, pr.ws_bytes));
    const bool sweeping = argc > 1 && std::string(argv[1]) == "--sweep";
    for (const auto &[d, h] : {std::pair<int64_t, int64_t>{2048, 5632}, {4096, 14336}}) {
        const Operands o = make_operands(d, h);
        sweeping ? sweep(pr, o) : candidates(pr, o);
        free_operands(o);
    }
    return 0;
}
