// Probe (not part of the build): can the masked gate GEMM (CUTLASS sm90: TMA, wgmma, the
// TwELL-word epilogue) with 64-row tiles stand in for cuBLAS's gate at the serving sizes (17 to
// 256 tokens), where serve_token follows it? A gate that writes the active-unit words itself would
// spare serve_token its scan of the gate row, and the launch a memset. The tenth session's
// serve_wide (bench/NOTES.md) showed that a hand-written mma.sync gate is instruction-bound there
// (54-114 us at M = 64 against ~12 us for cuBLAS), so the question is what TMA tiles and wgmma give.
//
// Times, for M = 16, 32, 64, 128, 256 at the paper's gate (N = 5632, K = 2048) and Llama-3-8B's
// (N = 14336, K = 4096), the weights rotated over enough copies to leave L2 each launch (as the
// serving benchmark does): cublasGemmEx, and the masked gate GEMM with 64-row pingpong tiles 64,
// 128 and 256 wide (clusters of one and two) and the library's 128 x 192 tile. Checks one variant's
// values and words against relu(cuBLAS) at each size. Build here (from the repository root, after
// configuring `build`), run on the GPU machine:
//   nvcc -arch=sm_90a -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -DTWBLAS_HAVE_SM90A -Isrc \
//     -Isrc/device -Iinclude -Ibuild/include -isystem .deps/cutlass/cutlass_library/source/include \
//     bench/probes/serving_gate_probe.cu -lcublas -o build/serving_gate_probe
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "gate_probe_host.hpp"
#include "gemm/masked_gate_gemm.cuh"

using namespace twblas::cuda;
using namespace cute;
using namespace gate_probe;
using BF = cutlass::bfloat16_t;
using Pingpong = cutlass::gemm::KernelTmaWarpSpecializedPingpong;

namespace {

struct Weights {
    std::vector<void *> copies;  // rotated: each launch reads a copy that left L2
    int64_t n, k;
};

template <class K>
float time_masked(const char *name, MaskedGateGemm g, const Weights &w, cudaStream_t st, int sms) {
    const float us = time_us(
        st,
        [&](int i) {
            g.w = w.copies[static_cast<size_t>(i) % w.copies.size()];
            masked_gate::launch_typed<BF, K>(st, g, 0, sms);
        },
        40);
    printf("  %-34s %8.1f us  (%s)\n", name, us, cudaGetErrorString(cudaGetLastError()));
    return us;
}

float time_cublas(cublasHandle_t hb, const MaskedGateGemm &g, const Weights &w, cudaStream_t st) {
    const float alpha = 1, beta = 0;
    const float us = time_us(
        st,
        [&](int i) {
            cublasGemmEx(hb, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(g.n), static_cast<int>(g.m),
                         static_cast<int>(g.k), &alpha, w.copies[static_cast<size_t>(i) % w.copies.size()], CUDA_R_16BF,
                         static_cast<int>(g.k), g.x, CUDA_R_16BF, static_cast<int>(g.k), &beta, g.gate, CUDA_R_16BF,
                         static_cast<int>(g.ldg), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        },
        40);
    printf("  %-34s %8.1f us\n", "cublasGemmEx", us);
    return us;
}

// one variant's values and words against relu(cuBLAS) on copy 0 of the weights
template <class K>
void check(cublasHandle_t hb, MaskedGateGemm g, const Weights &w, cudaStream_t st, int sms) {
    const size_t cells = static_cast<size_t>(g.m * g.n);
    g.w = w.copies[0];
    cudaMemsetAsync(g.gate, 0, cells * 2, st);  // the values it does not write read as +0
    masked_gate::launch_typed<BF, K>(st, g, 0, sms);
    std::vector<uint16_t> got(cells), ref(cells);
    std::vector<uint32_t> words(static_cast<size_t>(g.m * g.words));
    cudaStreamSynchronize(st);
    cudaMemcpy(got.data(), g.gate, cells * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(words.data(), g.masks, words.size() * 4, cudaMemcpyDeviceToHost);
    const float alpha = 1, beta = 0;
    cublasGemmEx(hb, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(g.n), static_cast<int>(g.m), static_cast<int>(g.k), &alpha,
                 w.copies[0], CUDA_R_16BF, static_cast<int>(g.k), g.x, CUDA_R_16BF, static_cast<int>(g.k), &beta, g.gate,
                 CUDA_R_16BF, static_cast<int>(g.ldg), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    cudaStreamSynchronize(st);
    cudaMemcpy(ref.data(), g.gate, cells * 2, cudaMemcpyDeviceToHost);
    size_t bad_values = 0, bad_bits = 0, active = 0;
    for (int64_t r = 0; r < g.m; ++r)
        for (int64_t c = 0; c < g.n; ++c) {
            const size_t i = static_cast<size_t>(r * g.n + c);
            float want = bf16_to_float(ref[i]);
            want = want > 0 ? want : 0;
            const float have = bf16_to_float(got[i]);
            if (std::fabs(want - have) > 0.02f * std::fabs(want) + 1e-3f) ++bad_values;
            const bool bit = words[static_cast<size_t>(r * g.words + c / 32)] >> (c % 32) & 1u;
            active += bit;
            // a value near zero may round either way between the two GEMMs' sums
            if (bit != (want > 0) && std::fabs(bf16_to_float(ref[i])) > 1e-2f) ++bad_bits;
        }
    printf("  check: %zu values and %zu words' bits differ from relu(cuBLAS); %.2f active units a token\n", bad_values,
           bad_bits, static_cast<double>(active) / static_cast<double>(g.m));
}

}  // namespace

int main() {
    const ProbeDevice dev = open_probe_device();
    const int sms = dev.sms;
    cudaStream_t st = dev.stream;
    cublasHandle_t hb = dev.cublas;
    struct Shape2 {
        const char *name;
        int64_t n, k;
    };
    for (const Shape2 s : {Shape2{"paper d2048 h5632", 5632, 2048}, Shape2{"llama d4096 h14336", 14336, 4096}}) {
        const int64_t max_m = 256;
        Weights w{{}, s.n, s.k};
        const size_t w_bytes = static_cast<size_t>(s.n * s.k * 2);
        const size_t copies = std::max<size_t>(3, (200u << 20) / w_bytes + 1);  // past the 50 MB L2 each launch
        const float bias = -9.75f * std::sqrt(static_cast<float>(s.k) / 2048.0f);
        const auto wh = random_bf16(s.n, s.k, 7, bf16_of(bias));
        for (size_t c = 0; c < copies; ++c) {
            void *p = nullptr;
            cudaMalloc(&p, w_bytes);
            cudaMemcpy(p, wh.data(), w_bytes, cudaMemcpyHostToDevice);
            w.copies.push_back(p);
        }
        const auto xh = random_bf16(max_m, s.k, 1, bf16_of(1.0f));
        void *x = nullptr, *gate = nullptr;
        uint32_t *masks = nullptr;
        cudaMalloc(&x, static_cast<size_t>(max_m * s.k * 2));
        cudaMemcpy(x, xh.data(), static_cast<size_t>(max_m * s.k * 2), cudaMemcpyHostToDevice);
        cudaMalloc(&gate, static_cast<size_t>(max_m * s.n * 2));
        cudaMalloc(&masks, static_cast<size_t>(max_m * s.n / 8));
        printf("%s: %zu weight copies of %.1f MB\n", s.name, copies, w_bytes / 1e6);
        for (int64_t m : {16, 32, 64, 128, 256}) {
            printf(" M = %ld\n", static_cast<long>(m));
            const MaskedGateGemm g{x, s.k, w.copies[0], s.k, m, s.n, s.k, gate, s.n, masks, s.n / 32};
            time_cublas(hb, g, w, st);
            time_masked<masked_gate::NarrowKernel<BF>>("coop 128x192 c2x1 (library, narrow)", g, w, st, sms);
            time_masked<masked_gate::Kernel<BF, Shape<_64, _64, _128>, Shape<_1, _1, _1>, Pingpong>>("pingpong 64x64x128 c1x1", g,
                                                                                                   w, st, sms);
            time_masked<masked_gate::Kernel<BF, Shape<_64, _128, _64>, Shape<_1, _1, _1>, Pingpong>>("pingpong 64x128x64 c1x1", g,
                                                                                                   w, st, sms);
            time_masked<masked_gate::Kernel<BF, Shape<_64, _128, _64>, Shape<_1, _2, _1>, Pingpong>>("pingpong 64x128x64 c1x2", g,
                                                                                                   w, st, sms);
            time_masked<masked_gate::Kernel<BF, Shape<_64, _256, _64>, Shape<_1, _1, _1>, Pingpong>>("pingpong 64x256x64 c1x1", g,
                                                                                                   w, st, sms);
            check<masked_gate::Kernel<BF, Shape<_64, _64, _128>, Shape<_1, _1, _1>, Pingpong>>(hb, g, w, st, sms);
        }
        for (void *p : w.copies) cudaFree(p);
        cudaFree(x);
        cudaFree(gate);
        cudaFree(masks);
    }
    return 0;
}
