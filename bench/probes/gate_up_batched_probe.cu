// Probe: what dense mode's gate and up projections cost as one cuBLAS launch. Today they are two
// GEMMs, z = X Wg^T (Wg H x dp) and u = X Wu^T (Wu the first half of the [Wu_j | Wd_j] pair rows,
// 2 dp apart); the dense FFN stacks [Wg; Wu] into one N = 2H GEMM. With the rows of all three
// matrices interleaved ([Wg_j | Wu_j | Wd_j], 3 dp apart) both are one strided-batched GEMM
// (B: Wg, then Wu dp further; A shared, stride 0). Timed, bf16, weights rotated past L2:
//   apart     the two GEMMs as the library runs them (Wg dp apart, Wu 2 dp apart)
//   batched   one strided-batched GEMM over the interleaved rows (ld 3 dp)
//   stacked   one N = 2H GEMM over a stacked [Wg; Wu] (the dense FFN's)
//   gate3     the gate GEMM alone over the interleaved rows (ld 3 dp), against gate1 (ld dp)
// Build: nvcc -O3 -std=c++17 -arch=sm_90 gate_up_batched_probe.cu -lcublas
// Run:   ./a.out [D] [H]  (defaults 2048 5632); M = 16, 64, 256, 512
#include <cublas_v2.h>

#include <algorithm>
#include <vector>

#include "probe_common.cuh"

#define CHECK_BLAS(x)                                                          \
    do {                                                                       \
        cublasStatus_t s_ = (x);                                               \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                     \
            std::fprintf(stderr, "%s:%d cuBLAS %d\n", __FILE__, __LINE__, s_); \
            std::exit(1);                                                      \
        }                                                                      \
    } while (0)

namespace {

constexpr int kCopies = 4;  // 4 x 3 x 23 MB: past the L2

// Row-major Z[M x N] = X[M x K] W[N x K]^T with W's rows ldw apart: column-major Z^T = W X^T.
void gemm(cublasHandle_t h, const bf16 *x, int64_t ldx, const bf16 *w, int64_t ldw, bf16 *z, int64_t ldz, int m, int n,
          int k, int batch = 1, int64_t stride_w = 0, int64_t stride_z = 0) {
    const float one = 1.0f, zero = 0.0f;
    CHECK_BLAS(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, w, CUDA_R_16BF, ldw, stride_w, x,
                                          CUDA_R_16BF, ldx, 0, &zero, z, CUDA_R_16BF, ldz, stride_z, batch,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

template <class F> float time_us(F &&f) {
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    for (int i = 0; i < 20; ++i) f(i);
    std::vector<float> t;
    for (int r = 0; r < 7; ++r) {
        CHECK(cudaEventRecord(a));
        for (int i = 0; i < 40; ++i) f(i);
        CHECK(cudaEventRecord(b));
        CHECK(cudaEventSynchronize(b));
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms * 1000.0f / 40);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

}  // namespace

int main(int argc, char **argv) {
    const int d = argc > 1 ? std::atoi(argv[1]) : 2048, hd = argc > 2 ? std::atoi(argv[2]) : 5632;
    const int64_t dp = d;  // a multiple of 8 here
    cublasHandle_t h;
    CHECK_BLAS(cublasCreate(&h));
    bf16 *gate1[kCopies], *pair2[kCopies], *rows3[kCopies], *stacked[kCopies];
    for (int c = 0; c < kCopies; ++c) {
        CHECK(cudaMalloc(&gate1[c], hd * dp * 2));
        CHECK(cudaMalloc(&pair2[c], hd * 2 * dp * 2));
        CHECK(cudaMalloc(&rows3[c], hd * 3 * dp * 2));
        CHECK(cudaMalloc(&stacked[c], 2 * hd * dp * 2));
        CHECK(cudaMemset(gate1[c], 0, hd * dp * 2));
        CHECK(cudaMemset(pair2[c], 0, hd * 2 * dp * 2));
        CHECK(cudaMemset(rows3[c], 0, hd * 3 * dp * 2));
        CHECK(cudaMemset(stacked[c], 0, 2 * hd * dp * 2));
    }
    const int max_m = 512;
    bf16 *x, *z;
    CHECK(cudaMalloc(&x, max_m * dp * 2));
    CHECK(cudaMalloc(&z, 2 * max_m * int64_t(hd) * 2));
    CHECK(cudaMemset(x, 0, max_m * dp * 2));
    const int64_t zs = int64_t(max_m) * hd;  // u after z
    std::printf("D %d H %d, us (median of 7 x 40 launches)\n", d, hd);
    for (int m : {16, 64, 256, 512}) {
        const float apart = time_us([&](int i) {
            gemm(h, x, dp, gate1[i % kCopies], dp, z, hd, m, hd, d);
            gemm(h, x, dp, pair2[i % kCopies], 2 * dp, z + zs, hd, m, hd, d);
        });
        const float batched =
            time_us([&](int i) { gemm(h, x, dp, rows3[i % kCopies], 3 * dp, z, hd, m, hd, d, 2, dp, zs); });
        const float stack = time_us([&](int i) { gemm(h, x, dp, stacked[i % kCopies], dp, z, 2 * hd, m, 2 * hd, d); });
        const float g1 = time_us([&](int i) { gemm(h, x, dp, gate1[i % kCopies], dp, z, hd, m, hd, d); });
        const float g3 = time_us([&](int i) { gemm(h, x, dp, rows3[i % kCopies], 3 * dp, z, hd, m, hd, d); });
        std::printf("M %4d  apart %7.1f  batched %7.1f  stacked %7.1f  gate1 %7.1f  gate3 %7.1f\n", m, apart, batched,
                    stack, g1, g3);
    }
    return 0;
}
