// Probe (not part of the build): gathers in the gate GEMM's idle warps. coresident_probe.cu found
// that the gate GEMM and the gathers cannot overlap as separate kernels on an H100: the
// warp-specialised GEMM claims every register of its SMs, and GEMMs small enough to leave room
// are L2-bound themselves. Inside the cooperative kernel, though, three of the producer
// warpgroup's four warps idle at 40 registers (one warp issues the TMA loads; the epilogue here
// needs no loads). This kernel is the library's gate GEMM mainloop (CUTLASS's sm90 collective,
// 128 x 256 x 64 tiles, persistent, no cluster) with the masked epilogue, whose warps 1-3 of the
// producer warpgroup run the up projection's gathers meanwhile: for each (token, unit) pair,
// u = g * (x_t . Wu_j), the rows brought into a shared-memory ring by bulk copies (cp.async.bulk,
// one instruction a 4 KB row, so a warp at 40 registers keeps ~16-20 KB in flight), the dot products
// read from shared memory. The work is independent of the GEMM's output (host lists), the best
// case for overlap; modes time the GEMM alone, the gathers alone (the same warps, no GEMM) and both.
// Build here (from the repository root, after configuring `build`), run on the GPU machine:
//   nvcc -arch=sm_90a -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -DTWBLAS_HAVE_SM90A -Isrc \
//     -Isrc/device -Iinclude -Ibuild/include -isystem .deps/cutlass/cutlass_library/source/include \
//     bench/probes/fused_gate_gather_probe.cu -o build/fused_gate_gather_probe
// Run: fused_gate_gather_probe [M]   (default 16384; H = 5632, D = 2048, 29 units a token; -DSTAGES=N
// builds another stage count, 3 by default: the rings take the fourth stage's shared memory)
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/pipeline.hpp>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <random>
#include <vector>

#include "gate_gather_problem.cuh"
#include "gemm/masked_gate_gemm.cuh"

using namespace cute;
using BF = cutlass::bfloat16_t;
using TileShape = Shape<_128, _256, _64>;
#ifndef STAGES
#define STAGES 3
#endif
using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, BF, cutlass::layout::RowMajor, 8, BF,
    cutlass::layout::ColumnMajor, 8, float, TileShape, Shape<_1, _1, _1>, cutlass::gemm::collective::StageCount<STAGES>,
    cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;
using Epilogue = twblas::cuda::masked_gate::MaskedEpilogue<BF, 256>;
using Pipeline = typename Mainloop::MainloopPipeline;
using PipeState = typename Mainloop::PipelineState;

constexpr int kD = 2048;              // the probe's model width (a row is 4 KB)
constexpr int kRowBytes = kD * 2;
constexpr int kRing = 4;              // row slots a gather warp (3 stages + the rings: 216 KB)
constexpr int kGatherWarpsPerCta = 3; // warps 1-3 of the producer warpgroup

struct GatherStorage {
    alignas(128) uint8_t x[kGatherWarpsPerCta][2][kRowBytes];      // x_t, double-buffered over tokens
    alignas(128) uint8_t rows[kGatherWarpsPerCta][kRing][kRowBytes];
    alignas(8) uint64_t x_bar[kGatherWarpsPerCta][2];
    alignas(8) uint64_t row_bar[kGatherWarpsPerCta][kRing];
};

struct SharedStorage {
    alignas(16) typename Mainloop::PipelineStorage pipeline;
    alignas(128) typename Mainloop::TensorStorage mainloop;
    GatherStorage gather;
};

struct Params {
    typename Mainloop::Params mainloop;
    typename Epilogue::Params epilogue;
    int m, n, k, m_tiles, n_tiles;
    // the gathers: the unit rows [Wu_j | Wd_j] `stride` apart, x, pairs by token
    const bf16 *pair;
    int64_t stride;
    const bf16 *x;
    const int *tstart, *pj;
    const float *g;
    float *u;
    int tokens;
    int mode;  // 1: GEMM, 2: gathers, 3: both
};

/// One gather warp: its tokens t = first, first + step, ...; every pair's u = g (x_t . Wu_j).
/// Lane 0 issues the bulk copies (x_t into a double buffer, rows into a ring of kRing slots, each
/// slot with its own transaction barrier); all lanes read 8 of the 256 16-byte chunks each.
__device__ void gather_warp(const Params &p, GatherStorage &s, int w, int first, int step) {
    const int lane = threadIdx.x & 31;
    using Bar = cutlass::arch::ClusterTransactionBarrier;
    auto x_bar = [&](int b) { return reinterpret_cast<Bar *>(&s.x_bar[w][b]); };
    auto row_bar = [&](int b) { return reinterpret_cast<Bar *>(&s.row_bar[w][b]); };
    if (first >= p.tokens) return;
    // the row stream: every pair of this warp's tokens, in order; issue cursor (it, ip) runs ahead
    int it = first, ip = p.tstart[first], issued = 0;
    auto issue_row = [&]() {  // lane 0: the next row of the stream into its slot
        while (it < p.tokens && ip >= p.tstart[it + 1]) {
            it += step;
            if (it < p.tokens) ip = p.tstart[it];
        }
        if (it >= p.tokens) return;
        const int slot = issued % kRing;
        row_bar(slot)->arrive_and_expect_tx(kRowBytes);
        cute::SM90_BULK_COPY_G2S::copy(p.pair + static_cast<int64_t>(p.pj[ip]) * p.stride, &s.row_bar[w][slot],
                                       s.rows[w][slot], kRowBytes);
        ++ip;
        ++issued;
    };
    auto issue_x = [&](int t, int buf) {
        x_bar(buf)->arrive_and_expect_tx(kRowBytes);
        cute::SM90_BULK_COPY_G2S::copy(p.x + static_cast<int64_t>(t) * kD, &s.x_bar[w][buf], s.x[w][buf], kRowBytes);
    };
    if (lane == 0) {
        issue_x(first, 0);
        for (int r = 0; r < kRing; ++r) issue_row();
    }
    int consumed = 0;
    for (int t = first, k = 0; t < p.tokens; t += step, ++k) {
        if (lane == 0 && t + step < p.tokens) issue_x(t + step, (k + 1) & 1);  // token k - 1's buffer is free
        x_bar(k & 1)->wait((k >> 1) & 1);
        const uint4 *xs = reinterpret_cast<const uint4 *>(s.x[w][k & 1]);
        for (int q = p.tstart[t]; q < p.tstart[t + 1]; ++q, ++consumed) {
            const int slot = consumed % kRing;
            row_bar(slot)->wait((consumed / kRing) & 1);
            const uint4 *ws = reinterpret_cast<const uint4 *>(s.rows[w][slot]);
            float acc = 0.0f;
#pragma unroll 2
            for (int c = lane; c < kD / 8; c += 32) acc = dot8(ws[c], xs[c], acc);
            for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
            __syncwarp();  // every lane is done with the slot
            if (lane == 0) {
                p.u[q] = p.g[q] * acc;
                issue_row();
            }
        }
    }
}

__global__ void __launch_bounds__(384, 1) fused(const __grid_constant__ Params p) {
    extern __shared__ __align__(128) char smem[];
    SharedStorage &shared = *reinterpret_cast<SharedStorage *>(smem);
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int warp_group = threadIdx.x / 128, warp_in_group = warp % 4;

    if (warp == 0 && cute::elect_one_sync()) Mainloop::prefetch_tma_descriptors(p.mainloop);
    if (warp_group == 0 && warp_in_group > 0 && lane == 0) {
        const int w = warp_in_group - 1;
        for (int b = 0; b < 2; ++b) cutlass::arch::ClusterTransactionBarrier::init(&shared.gather.x_bar[w][b], 1);
        for (int b = 0; b < kRing; ++b) cutlass::arch::ClusterTransactionBarrier::init(&shared.gather.row_bar[w][b], 1);
        cutlass::arch::fence_barrier_init();
    }
    typename Pipeline::Params pp;
    pp.role = warp_group == 0 ? (warp_in_group == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::NonParticipant)
                              : Pipeline::ThreadCategory::Consumer;
    pp.is_leader = (threadIdx.x % 128) == 0;
    pp.num_consumers = 256;
    pp.transaction_bytes = p.mainloop.tma_transaction_bytes;
    Pipeline pipeline(shared.pipeline, pp, Shape<_1, _1, _1>{});
    __syncthreads();

    const auto problem = make_shape(p.m, p.n, p.k, 1);
    Mainloop mainloop;
    auto load_inputs = mainloop.load_init(problem, p.mainloop);
    const int tiles = p.m_tiles * p.n_tiles;
    const int k_tiles = static_cast<int>(size<3>(get<0>(load_inputs)));
    const bool gemm = p.mode & 1;

    if (warp_group == 0) {
        cutlass::arch::warpgroup_reg_dealloc<40>();
        if (warp_in_group == 0) {
            if (!gemm) return;
            PipeState write = cutlass::make_producer_start_state<Pipeline>();
            for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
                const auto blk = make_coord(t / p.n_tiles, t % p.n_tiles, _, 0);
                auto k_iter = cute::make_coord_iterator(shape<3>(get<0>(load_inputs)));
                mainloop.load(p.mainloop, pipeline, write, load_inputs, blk, k_iter, k_tiles, lane, 0, shared.mainloop);
                write.advance(k_tiles);
            }
            mainloop.load_tail(pipeline, write);
        } else if (p.mode & 2) {
            gather_warp(p, shared.gather, warp_in_group - 1, blockIdx.x * kGatherWarpsPerCta + warp_in_group - 1,
                        gridDim.x * kGatherWarpsPerCta);
        }
        return;
    }
    cutlass::arch::warpgroup_reg_alloc<232>();
    if (!gemm) return;
    typename Mainloop::TiledMma tiled_mma;
    Epilogue epilogue(p.epilogue);
    PipeState read;
    const int mma_thread = threadIdx.x - 128;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        const auto blk = make_coord(t / p.n_tiles, t % p.n_tiles, _, 0);
        auto acc = partition_fragment_C(tiled_mma, take<0, 2>(TileShape{}));
        mainloop.mma(pipeline, read, acc, k_tiles, mma_thread, shared.mainloop, p.mainloop);
        mainloop.mma_tail(pipeline, read, k_tiles);
        read.advance(k_tiles);
        epilogue(problem, TileShape{}, blk, acc, tiled_mma, make_shape(0, 0, 0), mma_thread, nullptr);
    }
}

int main(int argc, char **argv) {
    const int m = argc > 1 ? std::atoi(argv[1]) : 16384;
    const int h = 5632, d = kD, k = 29;
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const GateGatherProblem prob = make_gate_gather_problem(m, h, d, k);  // as coresident_probe.cu's
    const std::vector<bf16> &hx = prob.x, &hw = prob.w, &hpair = prob.pair;
    const std::vector<int> &pj = prob.pj, &tstart = prob.tstart;
    const std::vector<float> &g = prob.g;
    const int npairs = prob.pairs();

    bf16 *x = upload(hx), *w = upload(hw), *pair = upload(hpair);
    int *dpj = upload(pj), *dts = upload(tstart);
    float *dg = upload(g), *du = nullptr;
    bf16 *gate = nullptr;
    uint32_t *masks = nullptr;
    const int words = (h + 31) / 32;
    CHECK(cudaMalloc(&du, sizeof(float) * npairs));
    CHECK(cudaMalloc(&gate, sizeof(bf16) * static_cast<size_t>(m) * h));
    CHECK(cudaMalloc(&masks, sizeof(uint32_t) * static_cast<size_t>(m) * words));

    Params p{};
    typename Mainloop::StrideA sa{};
    get<0>(sa) = d;
    typename Mainloop::StrideB sb{};
    get<0>(sb) = d;
    p.mainloop = Mainloop::to_underlying_arguments(make_shape(m, h, d, 1),
                                                   typename Mainloop::Arguments{reinterpret_cast<const BF *>(x), sa,
                                                                                reinterpret_cast<const BF *>(w), sb},
                                                   nullptr);
    p.epilogue = {gate, h, masks, words};
    p.m = m, p.n = h, p.k = d;
    p.m_tiles = (m + 127) / 128, p.n_tiles = (h + 255) / 256;
    p.pair = pair, p.stride = 2 * d, p.x = x, p.tstart = dts, p.pj = dpj, p.g = dg, p.u = du, p.tokens = m;
    const int smem = static_cast<int>(sizeof(SharedStorage));
    CHECK(cudaFuncSetAttribute(fused, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    cudaFuncAttributes fa{};
    CHECK(cudaFuncGetAttributes(&fa, fused));
    std::printf("M = %d, H = %d, D = %d, %d pairs; %d stages, %d B shared memory, %d registers a thread, %d CTAs\n", m, h,
                d, npairs, STAGES, smem, fa.numRegs, sms);

    auto run = [&](int mode) {
        p.mode = mode;
        fused<<<sms, 384, smem>>>(p);
    };
    auto time_us = [&](int mode) {
        run(mode);
        cudaEvent_t a, b;
        CHECK(cudaEventCreate(&a));
        CHECK(cudaEventCreate(&b));
        CHECK(cudaEventRecord(a));
        for (int r = 0; r < 10; ++r) run(mode);
        CHECK(cudaEventRecord(b));
        CHECK(cudaEventSynchronize(b));
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, a, b));
        CHECK(cudaGetLastError());
        return ms * 100.0f;
    };
    const float t1 = time_us(1), t2 = time_us(2), t3 = time_us(3);
    const twblas::cuda::MaskedGateGemm lib_op{x, d, w, d, m, h, d, gate, h, masks, words};
    auto lib_run = [&] { twblas::cuda::masked_gate::launch_typed<BF>(nullptr, lib_op, 0, sms); };
    lib_run();
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    CHECK(cudaEventRecord(a));
    for (int r = 0; r < 10; ++r) lib_run();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float lib_ms = 0;
    CHECK(cudaEventElapsedTime(&lib_ms, a, b));
    std::printf("the library's masked gate GEMM (4 stages, clusters of 2): %.1f us\n", lib_ms * 100.0f);
    run(3);  // the words and u below come from the fused kernel
    CHECK(cudaDeviceSynchronize());
    std::printf("GEMM alone %.1f us, gathers alone (3 warps an SM) %.1f us, both %.1f us: %.1f %% of the gathers hidden\n", t1,
                t2, t3, 100.0f * (t1 + t2 - t3) / t2);

    // the words against the library kernel, and u against the host
    std::vector<uint32_t> mine(static_cast<size_t>(m) * words), lib(mine.size());
    CHECK(cudaMemcpy(mine.data(), masks, mine.size() * 4, cudaMemcpyDeviceToHost));
    lib_run();
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(lib.data(), masks, lib.size() * 4, cudaMemcpyDeviceToHost));
    size_t diff = 0, bits = 0;
    for (size_t i = 0; i < lib.size(); ++i) diff += __builtin_popcount(mine[i] ^ lib[i]), bits += __builtin_popcount(lib[i]);
    std::printf("words: %zu of %zu active bits differ from the library kernel's\n", diff, bits);
    std::vector<float> hu(npairs);
    CHECK(cudaMemcpy(hu.data(), du, sizeof(float) * npairs, cudaMemcpyDeviceToHost));
    double worst = 0;
    for (int q = 0; q < npairs; q += 997) {
        const int t = static_cast<int>(std::upper_bound(tstart.begin(), tstart.end(), q) - tstart.begin()) - 1;
        double dot = 0;
        for (int i = 0; i < d; ++i)
            dot += static_cast<double>(__bfloat162float(hpair[static_cast<size_t>(pj[q]) * 2 * d + i])) *
                   __bfloat162float(hx[static_cast<size_t>(t) * d + i]);
        worst = std::max(worst, std::abs(g[q] * dot - hu[q]) / (std::abs(g[q] * dot) + 1e-3));
    }
    std::printf("u against the host: worst relative error %.2e over %d pairs\n", worst, (npairs + 996) / 997);
    return 0;
}
