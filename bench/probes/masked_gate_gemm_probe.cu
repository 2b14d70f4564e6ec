// Probe (not part of the build): the masked gate GEMM's tile / cluster / schedule variants and an
// epilogue that stores nothing, against cublasGemmEx, at the paper's gate shape (N = 5632,
// K = 2048) for M = 512, 4096, 16384, 65536; and the library variant's values against
// relu(cuBLAS). Inputs: uniform values with a bias column (x[:, 0] = 1, w[:, 0] = -9.75) that
// leaves ~0.5 % of the gate active, as in a trained sparse FFN (the epilogue writes only the
// chunks holding an active unit, so its cost depends on the sparsity). The measurements in bench/NOTES.md ("masked gate GEMM") came from it. Build here
// (from the repository root, after configuring `build`), run on the GPU machine:
//   nvcc -arch=sm_90a -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -DTWBLAS_HAVE_SM90A -Isrc \
//     -Isrc/device -Iinclude -Ibuild/include -isystem .deps/cutlass/cutlass_library/source/include \
//     bench/probes/masked_gate_gemm_probe.cu -lcublas -o build/masked_gate_gemm_probe
#include "gemm/masked_gate_gemm.cuh"
#include <cublas_v2.h>
#include <cstdio>
#include <cstdarg>
#include <vector>
#include <cstdlib>
#include <cmath>
#include <cstring>
namespace twblas { [[noreturn]] void fail(twStatus_t s, const char *fmt, ...) { va_list a; va_start(a, fmt); vfprintf(stderr, fmt, a); va_end(a); fprintf(stderr, " (%d)\n", (int)s); std::exit(1);} }
using namespace twblas::cuda;
using namespace cute;
using BF = cutlass::bfloat16_t;
template void twblas::cuda::masked_gate::launch_typed<BF>(cudaStream_t, const MaskedGateGemm &, int, int);
// an epilogue that stores almost nothing: the mainloop's own time
template <class T> struct NullEpi : masked_gate::MaskedEpilogue<T, 256> {
    using Base = masked_gate::MaskedEpilogue<T, 256>;
    using Base::Base;
    template <class P, class B, class C, class FE, class FL, class TM, class RM>
    CUTLASS_DEVICE void operator()(P, B, C, cute::Tensor<FE, FL> const &acc, TM, RM, int, char *) {
        float s = 0; for (int i = 0; i < size(acc); ++i) s += acc(i);
        if (s == 12345.678f) printf("x");
    }
};
template <class T> struct NullKernel {
    using Epilogue = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<NullEpi<T>>;
    using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, T, cutlass::layout::RowMajor, 8, T,
        cutlass::layout::ColumnMajor, 8, float, Shape<_128, _256, _64>, Shape<_2, _1, _1>,
        cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
        cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;
    using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue,
                                                            cutlass::gemm::PersistentScheduler>;
    using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
};
template <class K> float time_variant(const char *name, const MaskedGateGemm &g, cudaStream_t st, int sms, std::vector<uint16_t> *out) {
    if (out) cudaMemset(g.gate, 0, g.m * g.ldg * 2);  // the chunks it does not write read as +0
    masked_gate::launch_typed<BF, K>(st, g, 0, sms);
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    cudaStreamSynchronize(st);
    cudaEventRecord(a, st);
    const int n = 20;
    for (int i = 0; i < n; ++i) masked_gate::launch_typed<BF, K>(st, g, 0, sms);
    cudaEventRecord(b, st); cudaEventSynchronize(b);
    float ms; cudaEventElapsedTime(&ms, a, b);
    if (out) { out->resize(g.m * g.ldg); cudaMemcpy(out->data(), g.gate, out->size() * 2, cudaMemcpyDeviceToHost); }
    printf("%-40s M %6ld: %8.1f us  (%s)\n", name, (long)g.m, ms * 1000 / n, cudaGetErrorString(cudaGetLastError()));
    return ms * 1000 / n;
}
int main() {
    int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    const int64_t N = 5632, K = 2048, Mmax = 65536;
    void *x, *w, *gate; uint32_t *masks;
    cudaMalloc(&x, Mmax * K * 2); cudaMalloc(&w, N * K * 2); cudaMalloc(&gate, Mmax * N * 2); cudaMalloc(&masks, Mmax * N / 8);
    { std::vector<uint16_t> h(Mmax * K); uint32_t s = 1; for (auto &v : h) { s = s * 1664525u + 1013904223u; float f = ((s >> 8) / 16777216.0f - 0.5f); uint32_t b; memcpy(&b, &f, 4); v = b >> 16; }
      for (int64_t r = 0; r < Mmax; ++r) h[r * K] = 0x3f80;  // 1.0: the bias column of x
      cudaMemcpy(x, h.data(), Mmax * K * 2, cudaMemcpyHostToDevice);
      for (int64_t r = 0; r < N; ++r) h[r * K] = 0xc11c;  // -9.75: the bias of each unit
      cudaMemcpy(w, h.data(), N * K * 2, cudaMemcpyHostToDevice); }
    cudaStream_t st; cudaStreamCreate(&st);
    cublasHandle_t hb; cublasCreate(&hb); cublasSetStream(hb, st);
    for (int64_t M : {int64_t(512), int64_t(4096), int64_t(16384), Mmax}) {
        MaskedGateGemm g{x, K, w, K, M, N, K, gate, N, masks, N / 32};
        std::vector<uint16_t> ref, got;
        time_variant<masked_gate::Kernel<BF>>("coop 128x256 c2x1 (library)", g, st, sms, &ref);
        {
            std::vector<uint32_t> mk(M * N / 32);
            cudaMemcpy(mk.data(), masks, mk.size() * 4, cudaMemcpyDeviceToHost);
            size_t on = 0; for (uint32_t v : mk) on += __builtin_popcount(v);
            printf("  active: %.3f %% of the gate (%.1f units per token)\n", 100.0 * on / (M * N), double(on) / M);
        }

        time_variant<NullKernel<BF>>("coop 128x256 c2x1 NULL epilogue", g, st, sms, nullptr);
        time_variant<masked_gate::Kernel<BF, Shape<_128, _256, _64>, Shape<_1, _2, _1>>>("coop 128x256 c1x2", g, st, sms, &got);
        time_variant<masked_gate::Kernel<BF, Shape<_128, _256, _64>, Shape<_1, _1, _1>>>("coop 128x256 c1x1", g, st, sms, nullptr);
        time_variant<masked_gate::Kernel<BF, Shape<_64, _256, _64>, Shape<_2, _1, _1>, cutlass::gemm::KernelTmaWarpSpecializedPingpong>>("pingpong 64x256 c2x1", g, st, sms, &got);
        size_t diff = 0; for (size_t i = 0; i < ref.size(); ++i) diff += ref[i] != got[i];
        printf("  pingpong vs library: %zu values differ\n", diff);  // both write the active values over zeros
        time_variant<masked_gate::Kernel<BF, Shape<_64, _256, _64>, Shape<_1, _2, _1>, cutlass::gemm::KernelTmaWarpSpecializedPingpong>>("pingpong 64x256 c1x2", g, st, sms, nullptr);
        // cuBLAS: C^T (N x M, col-major) = W^T^T ... i.e. gate row-major M x N = X W^T
        float alpha = 1, beta = 0;
        cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
        for (int rep = 0; rep < 2; ++rep) {
            cudaEventRecord(a, st);
            for (int i = 0; i < 20; ++i)
                cublasGemmEx(hb, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, w, CUDA_R_16BF, K, x, CUDA_R_16BF, K, &beta, gate, CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            cudaEventRecord(b, st); cudaEventSynchronize(b);
            float ms; cudaEventElapsedTime(&ms, a, b);
            if (rep) printf("%-40s M %6ld: %8.1f us\n", "cublasGemmEx", (long)M, ms * 1000 / 20);
        }
        std::vector<uint16_t> cb(M * N);
        cudaMemcpy(cb.data(), gate, cb.size() * 2, cudaMemcpyDeviceToHost);
        auto f = [](uint16_t b) { uint32_t u = uint32_t(b) << 16; float v; memcpy(&v, &u, 4); return v; };
        size_t bad = 0;
        for (size_t i = 0; i < cb.size(); ++i) {
            float c = f(cb[i]); c = c > 0 ? c : 0; float o = f(ref[i]);
            if (fabsf(c - o) > 0.02f * fabsf(c) + 1e-3f) ++bad;
        }
        printf("  library vs relu(cuBLAS): %zu of %zu values differ by more than 2%%\n", bad, cb.size());
    }
}
