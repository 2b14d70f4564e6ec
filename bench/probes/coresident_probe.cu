// Probe (not part of the build): can the gate GEMM and the sparse half's gathers share the SMs?
// Issue 12's large-batch targets (1.9x the dense FFN at 16384 tokens) need the gate GEMM
// (tensor cores, ~500 us) and the gathers (L2 and load slots, ~500 us) to overlap. Launched on two
// streams they did not (cuBLAS's GEMM: 1.191 ms together against 1.156 apart, issue 12's text):
// a warp-specialised GEMM claims the whole register file of every SM it runs on, so no gather
// block can sit beside it. This times independent work on two streams, the best case for any
// overlap, with GEMMs of smaller footprints:
//   full  the library's masked gate GEMM (128 x 256 x 64, cooperative, clusters of 2, persistent);
//   ws    64 x 128 x 64 tiles, one producer and one consumer warpgroup (no register split);
//   tma   64 x 128 x 64 tiles, one warpgroup issuing its own TMA loads (no warp specialisation);
// the gathers are gather_kernels.cuh's up_pairs and down<8> over 29 random units a token. Each
// configuration reports the time alone, the gathers alone and both launched together (the GEMM
// first, then the gathers first); "hidden" is the share of the shorter one the overlap saved.
// Build here (from the repository root, after configuring `build`), run on the GPU machine:
//   nvcc -arch=sm_90a -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -DTWBLAS_HAVE_SM90A -Isrc \
//     -Isrc/device -Iinclude -Ibuild/include -isystem .deps/cutlass/cutlass_library/source/include \
//     bench/probes/coresident_probe.cu -lcublas -o build/coresident_probe
// Run: coresident_probe [M]   (default 16384; H = 5632, D = 2048, 29 units a token)
#include <cublas_v2.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <random>
#include <vector>

#include "gate_gather_problem.cuh"
#include "gather_kernels.cuh"
#include "gemm/masked_gate_gemm.cuh"

using namespace twblas::cuda;
using namespace cute;
using BF = cutlass::bfloat16_t;

/// The library's kernel, and the basic warp-specialised one on 64-row tiles with 4 stages (two
/// CTAs' worth of shared memory fit an SM, and registers are left for gather blocks).
using FullKernel = masked_gate::Kernel<BF>;
using WsKernel = masked_gate::Kernel<BF, Shape<_64, _128, _64>, Shape<_1, _1, _1>, cutlass::gemm::KernelTmaWarpSpecialized>;

/// One warpgroup that issues its own TMA loads and wgmmas: the smallest register footprint.
struct TmaEpilogue : masked_gate::MaskedEpilogue<BF, 128> {
    using ElementAccumulator = float;  // what the non-specialised kernel checks
    using masked_gate::MaskedEpilogue<BF, 128>::MaskedEpilogue;
};
struct TmaKernel {
    using TileShape = Shape<_64, _128, _64>;
    using Epilogue = TmaEpilogue;
    using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, BF, cutlass::layout::RowMajor, 8, BF,
        cutlass::layout::ColumnMajor, 8, float, TileShape, Shape<_1, _1, _1>, cutlass::gemm::collective::StageCount<4>,
        cutlass::gemm::KernelTma>::CollectiveOp;
    using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue,
                                                            cutlass::gemm::PersistentScheduler>;
    using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
};

constexpr int kReps = 10;

template <class K> void report_kernel(const char *name) {
    cudaFuncAttributes a{};
    CHECK(cudaFuncGetAttributes(&a, cutlass::device_kernel<typename K::Gemm::GemmKernel>));
    std::printf("%-5s GEMM kernel: %d threads, %d registers a thread, %zu B shared memory\n", name,
                K::Gemm::GemmKernel::MaxThreadsPerBlock, a.numRegs,
                static_cast<size_t>(K::Gemm::GemmKernel::SharedStorageSize));
}

/// Mean time of `reps` rounds of `launch` on `s0` (which may fork onto other streams and join).
template <class F> float time_us(cudaStream_t s0, F &&launch) {
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    launch();
    CHECK(cudaEventRecord(a, s0));
    for (int r = 0; r < kReps; ++r) launch();
    CHECK(cudaEventRecord(b, s0));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    CHECK(cudaGetLastError());
    return ms * 1e3f / kReps;
}

int main(int argc, char **argv) {
    const int m = argc > 1 ? std::atoi(argv[1]) : 16384;
    const int h = 5632, d = 2048, k = 29;
    int device = 0, sms = 0;
    CHECK(cudaGetDevice(&device));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    const GateGatherProblem prob = make_gate_gather_problem(m, h, d, k);
    const std::vector<bf16> &hx = prob.x, &hw = prob.w, &hpair = prob.pair;
    const std::vector<int> &pt = prob.pt, &pj = prob.pj, &tstart = prob.tstart;
    const std::vector<float> &g = prob.g;
    const int npairs = prob.pairs();

    bf16 *x = upload(hx), *w = upload(hw), *pair = upload(hpair);
    int *dpt = upload(pt), *dpj = upload(pj), *dts = upload(tstart);
    float *dg = upload(g), *dh = nullptr;
    bf16 *gate = nullptr, *y = nullptr, *ref = nullptr;
    uint32_t *masks = nullptr;
    const int words = (h + 31) / 32;
    CHECK(cudaMalloc(&dh, sizeof(float) * npairs));
    CHECK(cudaMalloc(&gate, sizeof(bf16) * static_cast<size_t>(m) * h));
    CHECK(cudaMalloc(&ref, sizeof(bf16) * static_cast<size_t>(m) * h));
    CHECK(cudaMalloc(&y, sizeof(bf16) * static_cast<size_t>(m) * d));
    CHECK(cudaMalloc(&masks, sizeof(uint32_t) * static_cast<size_t>(m) * words));

    cudaStream_t s0, s1;
    CHECK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    cudaEvent_t fork, join;
    CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    cublasHandle_t cublas;
    cublasCreate(&cublas);

    const MaskedGateGemm op{x, d, w, d, m, h, d, gate, h, masks, words};
    auto gathers = [&](cudaStream_t s) {
        up_pairs<<<(npairs + kGatherWarps - 1) / kGatherWarps, 32 * kGatherWarps, 0, s>>>(pair, 2 * d, x, d, dpt, dpj, dg,
                                                                                          npairs, dh);
        const int slices = d / 256;
        down<8><<<(m * slices + kGatherWarps - 1) / kGatherWarps, 32 * kGatherWarps, 0, s>>>(pair, 2 * d, d, dts, dpj, dh,
                                                                                            m, slices, y);
    };
    auto cublas_gemm = [&](cudaStream_t s) {
        const float one = 1.0f, zero = 0.0f;
        cublasSetStream(cublas, s);
        // gate^T (h x m, column-major) = W (d x h column-major, transposed) x^T
        cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, h, m, d, &one, w, CUDA_R_16BF, d, x, CUDA_R_16BF, d, &zero, ref,
                     CUDA_R_16BF, h, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    };
    // both on two streams, `first` launched first; s0 forks s1 and joins it
    auto together = [&](auto &&first, auto &&second) {
        CHECK(cudaEventRecord(fork, s0));
        CHECK(cudaStreamWaitEvent(s1, fork));
        first(s0);
        second(s1);
        CHECK(cudaEventRecord(join, s1));
        CHECK(cudaStreamWaitEvent(s0, join));
    };

    std::printf("M = %d, H = %d, D = %d, %d units a token (%d pairs), %d SMs\n", m, h, d, k, npairs, sms);
    report_kernel<FullKernel>("full");
    report_kernel<WsKernel>("ws");
    report_kernel<TmaKernel>("tma");
    for (auto f : {reinterpret_cast<const void *>(up_pairs), reinterpret_cast<const void *>(down<8>)}) {
        cudaFuncAttributes a{};
        CHECK(cudaFuncGetAttributes(&a, f));
        int blocks = 0;
        CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, f, 32 * kGatherWarps, 0));
        std::printf("gather kernel: %d registers a thread, %d blocks of %d threads an SM alone\n", a.numRegs, blocks,
                    32 * kGatherWarps);
    }

    const float t_gather = time_us(s0, [&] { gathers(s0); });
    const float t_cublas = time_us(s0, [&] { cublas_gemm(s0); });
    const float t_cublas_both = time_us(s0, [&] { together(cublas_gemm, gathers); });
    std::printf("gathers alone %.1f us\n", t_gather);
    auto row = [&](const char *name, float alone, float both_gemm_first, float both_gathers_first) {
        const float apart = alone + t_gather, best = std::min(both_gemm_first, both_gathers_first);
        std::printf("%-6s alone %7.1f us | together: GEMM first %7.1f, gathers first %7.1f | apart %7.1f | hidden %5.1f %%\n",
                    name, alone, both_gemm_first, both_gathers_first, apart,
                    100.0f * (apart - best) / std::min(alone, t_gather));
    };
    row("cublas", t_cublas, t_cublas_both, time_us(s0, [&] { together(gathers, cublas_gemm); }));
    auto cutlass_row = [&](const char *name, auto kernel_tag) {
        using K = decltype(kernel_tag);
        auto gemm = [&](cudaStream_t s) { masked_gate::launch_typed<BF, K>(s, op, device, sms); };
        row(name, time_us(s0, [&] { gemm(s0); }), time_us(s0, [&] { together(gemm, gathers); }),
            time_us(s0, [&] { together(gathers, gemm); }));
        // the words against the library kernel's (a value at the threshold may round either way)
        std::vector<uint32_t> mine(static_cast<size_t>(m) * words), lib(mine.size());
        CHECK(cudaMemcpy(mine.data(), masks, mine.size() * 4, cudaMemcpyDeviceToHost));
        masked_gate::launch_typed<BF, FullKernel>(s0, op, device, sms);
        CHECK(cudaStreamSynchronize(s0));
        CHECK(cudaMemcpy(lib.data(), masks, lib.size() * 4, cudaMemcpyDeviceToHost));
        size_t diff = 0, bits = 0;
        for (size_t i = 0; i < lib.size(); ++i) {
            diff += __builtin_popcount(mine[i] ^ lib[i]);
            bits += __builtin_popcount(lib[i]);
        }
        std::printf("       words: %zu of %zu active bits differ from the library kernel's\n", diff, bits);
    };
    cutlass_row("full", FullKernel{});
    cutlass_row("ws", WsKernel{});
    cutlass_row("tma", TmaKernel{});

    // the gathers' result for a few tokens against the host
    std::vector<bf16> hy(static_cast<size_t>(m) * d);
    CHECK(cudaMemcpy(hy.data(), y, hy.size() * 2, cudaMemcpyDeviceToHost));
    double worst = 0;
    for (int t = 0; t < m; t += m / 7 + 1)
        for (int c = 0; c < d; c += 97) {
            double acc = 0;
            for (int p = tstart[t]; p < tstart[t + 1]; ++p) {
                double dot = 0;
                for (int i = 0; i < d; ++i)
                    dot += static_cast<double>(__bfloat162float(hpair[static_cast<size_t>(pj[p]) * 2 * d + i])) *
                           __bfloat162float(hx[static_cast<size_t>(t) * d + i]);
                acc += static_cast<float>(g[p] * static_cast<float>(dot)) *
                       static_cast<double>(__bfloat162float(hpair[static_cast<size_t>(pj[p]) * 2 * d + d + c]));
            }
            worst = std::max(worst, std::abs(acc - __bfloat162float(hy[static_cast<size_t>(t) * d + c])) / (std::abs(acc) + 1e-2));
        }
    std::printf("gathers against the host: worst relative error %.2e\n", worst);
    return 0;
}
