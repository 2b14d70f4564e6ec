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

}  // namespace

/// The first heuristic candidate for an M-token gate GEMM (and its layouts' descriptors).
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

/// Every M from 17 to 128: M's first candidate, the 64-token bucket's first candidate run at M
/// (where cublasLtMatmulAlgoCheck accepts it), and the fastest of M's own candidates.
void sweep(cublasLtHandle_t lt, cudaStream_t st, void *ws, size_t ws_bytes) {
    struct Shape {
        int64_t d, h;
    };
    for (const Shape s : {Shape{2048, 5632}, Shape{4096, 14336}}) {
        void *wg[kCopies];
        for (auto &p : wg) {
            CHECK_CUDA(cudaMalloc(&p, static_cast<size_t>(s.h * s.d) * 2));
            CHECK_CUDA(cudaMemset(p, 0x3c, static_cast<size_t>(s.h * s.d) * 2));
        }
        void *x, *z;
        CHECK_CUDA(cudaMalloc(&x, static_cast<size_t>(256 * s.d) * 2));
        CHECK_CUDA(cudaMemset(x, 0x3c, static_cast<size_t>(256 * s.d) * 2));
        CHECK_CUDA(cudaMalloc(&z, static_cast<size_t>(256 * s.h) * 2));
        std::printf("sweep d%lld_h%lld: M  first(tile us)  bucket64(tile us)  best(us)\n", static_cast<long long>(s.d),
                    static_cast<long long>(s.h));
        const Plan b64 = make_plan(lt, s.d, s.h, 64, ws_bytes);
        for (int64_t m = 17; m <= 128; m += (m < 64 ? 1 : 8)) {
            const Plan p = make_plan(lt, s.d, s.h, m, ws_bytes);
            auto tile = [](const cublasLtMatmulAlgo_t &a) {
                int t = 0;
                size_t got = 0;
                cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &t, sizeof t, &got);
                return t;
            };
            const float first = time_algo(lt, p.op, p.la, p.lb, p.lz, p.res[0].algo, wg, x, z, ws, ws_bytes, st);
            float best = first;
            for (int i = 1; i < p.count; ++i) {
                const float us = time_algo(lt, p.op, p.la, p.lb, p.lz, p.res[i].algo, wg, x, z, ws, ws_bytes, st);
                if (us > 0 && us < best) best = us;
            }
            cublasLtMatmulHeuristicResult_t chk{};
            float bucket = -1.0f;
            if (cublasLtMatmulAlgoCheck(lt, p.op, p.la, p.lb, p.lz, p.lz, &b64.res[0].algo, &chk) ==
                CUBLAS_STATUS_SUCCESS)
                bucket = time_algo(lt, p.op, p.la, p.lb, p.lz, b64.res[0].algo, wg, x, z, ws, ws_bytes, st);
            std::printf("  %3lld  %4d %6.2f   %4d %6.2f   %6.2f\n", static_cast<long long>(m), tile(p.res[0].algo),
                        first, tile(b64.res[0].algo), bucket, best);
        }
        for (auto &p : wg) cudaFree(p);
        cudaFree(x);
        cudaFree(z);
    }
}

int main(int argc, char **argv) {
    cublasLtHandle_t lt;
    CHECK_LT(cublasLtCreate(&lt));
    cudaStream_t st;
    CHECK_CUDA(cudaStreamCreate(&st));
    const size_t ws_bytes = 32u << 20;
    void *ws;
    CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
    if (argc > 1 && std::string(argv[1]) == "--sweep") {
        sweep(lt, st, ws, ws_bytes);
        return 0;
    }
    struct Shape {
        int64_t d, h;
    };
    for (const Shape s : {Shape{2048, 5632}, Shape{4096, 14336}}) {
        void *wg[kCopies];
        for (auto &p : wg) {
            CHECK_CUDA(cudaMalloc(&p, static_cast<size_t>(s.h * s.d) * 2));
            CHECK_CUDA(cudaMemset(p, 0x3c, static_cast<size_t>(s.h * s.d) * 2));  // bf16 0.0115, not zeros
        }
        void *x, *z;
        CHECK_CUDA(cudaMalloc(&x, static_cast<size_t>(256 * s.d) * 2));
        CHECK_CUDA(cudaMemset(x, 0x3c, static_cast<size_t>(256 * s.d) * 2));
        CHECK_CUDA(cudaMalloc(&z, static_cast<size_t>(256 * s.h) * 2));
        for (int64_t m : {16, 32, 64, 128, 256}) {
            // column-major z^T (H x M) = Wg (stored D x H, transposed) . x^T (stored D x M): the
            // row-major z = X Wg^T, as GemmRunner asks for it
            cublasLtMatmulDesc_t op;
            CHECK_LT(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
            const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
            CHECK_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
            CHECK_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n));
            cublasLtMatrixLayout_t la, lb, lz;
            CHECK_LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, s.d, s.h, s.d));
            CHECK_LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, s.d, m, s.d));
            CHECK_LT(cublasLtMatrixLayoutCreate(&lz, CUDA_R_16BF, s.h, m, s.h));
            cublasLtMatmulPreference_t pref;
            CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
            CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                          sizeof ws_bytes));
            cublasLtMatmulHeuristicResult_t res[kMaxAlgos];
            int count = 0;
            CHECK_LT(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lz, lz, pref, kMaxAlgos, res, &count));
            float first = 0.0f, best = 1e9f;
            int best_i = 0;
            std::printf("d%lld_h%lld m%lld: %d candidates\n", static_cast<long long>(s.d), static_cast<long long>(s.h),
                        static_cast<long long>(m), count);
            for (int i = 0; i < count; ++i) {
                const float us = time_algo(lt, op, la, lb, lz, res[i].algo, wg, x, z, ws, ws_bytes, st);
                char what[160];
                describe(res[i].algo, what, sizeof what);
                std::printf("  #%2d %8.2f us  workspace %8zu  %s\n", i, us, res[i].workspaceSize, what);
                if (i == 0) first = us;
                if (us > 0 && us < best) best = us, best_i = i;
            }
            std::printf("  first %.2f us, best #%d %.2f us (%.3f)\n", first, best_i, best, best / first);
            cublasLtMatmulPreferenceDestroy(pref);
            cublasLtMatrixLayoutDestroy(la);
            cublasLtMatrixLayoutDestroy(lb);
            cublasLtMatrixLayoutDestroy(lz);
            cublasLtMatmulDescDestroy(op);
        }
        for (auto &p : wg) cudaFree(p);
        cudaFree(x);
        cudaFree(z);
    }
    return 0;
}
