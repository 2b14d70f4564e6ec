// Probe: how fast can one token's gate (x . Wg_j for every unit, Wg H x D bf16, row-major) stream
// Wg on this GPU, by access pattern? serve_gate reads 23 MB at ~1.7 TB/s (57 % of the copy rate,
// bench/NOTES.md); this separates the pattern from the rest of the kernel.
//   tile   serve_gate's pattern: a block per 8 units, lane (g, q) loads 16 bytes at k = 32 c + 8 q
//          of unit g (a warp instruction touches 64 bytes of each of 8 rows), U loads in flight;
//   rows   the same grid, but a warp instruction reads 512 contiguous bytes of one row;
//   bulk   persistent blocks, each streaming its contiguous share of Wg through a ring of
//          shared-memory stages filled by bulk copies (cp.async.bulk, one producer thread).
// Each sums x . w (fp32) so the loads are used. Weights rotate over copies past L2.
// Build: nvcc -O3 -std=c++17 -arch=sm_90a -I<cutlass include> gate_stream_probe.cu
// Run:   ./a.out [H] [D]  (defaults 5632 2048)
#include <cuda_bf16.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>

#include "probe_common.cuh"


// a 16-byte streaming load that asks L2 to fetch the whole 256-byte block around it (the tile
// pattern reads 64 bytes of a row per instruction, the rest of each line by other warps later)
__device__ inline uint4 load_l2_256(const void *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

template <int U, bool kHint = false> __global__ void __launch_bounds__(256) tile_pattern(const bf16 *w, const bf16 *x, int d, float *out) {
    // blockDim.x / 128 tiles a block, four warps a tile
    const int warp = (threadIdx.x / 32) & 3, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int64_t tile = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 128) + threadIdx.x / 128;
    const bf16 *row = w + (tile * 8 + g) * d;
    const int chunks = d / 32;
    float acc = 0.0f;
    uint4 wv[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int c = warp + 4 * u;
        wv[u] = c < chunks ? (kHint ? load_l2_256(row + c * 32 + q * 8) : __ldcs(reinterpret_cast<const uint4 *>(row + c * 32 + q * 8))) : make_uint4(0, 0, 0, 0);
    }
    for (int c0 = warp; c0 < chunks; c0 += 4 * U) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = c0 + 4 * u;
            if (c < chunks) acc = dot8(wv[u], *reinterpret_cast<const uint4 *>(x + c * 32 + q * 8), acc);
            const int n = c + 4 * U;
            wv[u] = n < chunks ? (kHint ? load_l2_256(row + n * 32 + q * 8) : __ldcs(reinterpret_cast<const uint4 *>(row + n * 32 + q * 8))) : make_uint4(0, 0, 0, 0);
        }
    }
    atomicAdd(out + tile * 8 + g, acc);
}

template <int U> __global__ void __launch_bounds__(128) rows_pattern(const bf16 *w, const bf16 *x, int d, float *out) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    for (int r = 0; r < 2; ++r) {
        const int64_t unit = static_cast<int64_t>(blockIdx.x) * 8 + warp * 2 + r;
        const bf16 *row = w + unit * d;
        float acc = 0.0f;
        for (int k00 = lane * 8; k00 < d; k00 += 256 * U) {
            uint4 wv[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int k0 = k00 + 256 * u;
                wv[u] = k0 < d ? __ldcs(reinterpret_cast<const uint4 *>(row + k0)) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int k0 = k00 + 256 * u;
                if (k0 < d) acc = dot8(wv[u], *reinterpret_cast<const uint4 *>(x + k0), acc);
            }
        }
        atomicAdd(out + unit, acc);
    }
}

// persistent: block b streams bytes [b * total / G, (b + 1) * total / G) (16-byte units) in
// stages of SB bytes, NS stages in the ring; warp 4 lane 0 produces, warps 0-3 consume
template <int SB, int NS, bool kUse = true> __global__ void __launch_bounds__(160, 1) bulk_ring(const bf16 *w, const bf16 *x, int d, int64_t chunks16, float *out) {
    extern __shared__ __align__(128) uint8_t smem[];
    uint4 *ring = reinterpret_cast<uint4 *>(smem);
    __shared__ uint64_t full[NS], empty[NS];
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int64_t c0 = chunks16 * blockIdx.x / gridDim.x, c1 = chunks16 * (blockIdx.x + 1) / gridDim.x;
    constexpr int SC = SB / 16;  // chunks per stage
    const int stages = static_cast<int>((c1 - c0 + SC - 1) / SC);
    if (threadIdx.x == 0) {
        for (int s = 0; s < NS; ++s) {
            cutlass::arch::ClusterTransactionBarrier::init(&full[s], 1);
            cutlass::arch::ClusterBarrier::init(&empty[s], 4);
        }
        cutlass::arch::fence_barrier_init();
    }
    __syncthreads();
    if (warp == 4) {
        if (lane == 0)
            for (int i = 0; i < stages; ++i) {
                const int s = i % NS;
                if (i >= NS) cutlass::arch::ClusterBarrier::wait(&empty[s], ((i / NS) - 1) & 1);
                const int64_t first = c0 + static_cast<int64_t>(i) * SC;
                const int n = static_cast<int>(c1 - first < SC ? c1 - first : SC);
                cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&full[s], n * 16);
                cute::SM90_BULK_COPY_G2S::copy(reinterpret_cast<const uint4 *>(w) + first, &full[s], ring + s * SC, n * 16);
            }
        return;
    }
    const int dc = d / 8;  // chunks per row
    float acc = 0.0f;
    for (int i = 0; i < stages; ++i) {
        const int s = i % NS;
        cutlass::arch::ClusterBarrier::wait(&full[s], (i / NS) & 1);
        const int64_t first = c0 + static_cast<int64_t>(i) * SC;
        const int n = static_cast<int>(c1 - first < SC ? c1 - first : SC);
        if (kUse) {  // four independent sums per thread; dc a power of two here (probe shapes)
            float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int c = threadIdx.x; c < n; c += 512)
#pragma unroll
                for (int u = 0; u < 4; ++u)
                    if (c + 128 * u < n) {
                        const int64_t g = first + c + 128 * u;
                        part[u] = dot8(ring[s * SC + c + 128 * u], *reinterpret_cast<const uint4 *>(x + (g & (dc - 1)) * 8), part[u]);
                    }
            acc += (part[0] + part[1]) + (part[2] + part[3]);
        }
        __syncwarp();
        if (lane == 0) cutlass::arch::ClusterBarrier::arrive(&empty[s]);
    }
    atomicAdd(out + blockIdx.x, acc);
}

template <class F> float time_us(F launch, int reps) {
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    for (int i = 0; i < 10; ++i) launch(i);
    CHECK(cudaEventRecord(a));
    for (int i = 0; i < reps; ++i) launch(i);
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    CHECK(cudaGetLastError());
    float ms = 0.0f;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    return 1000.0f * ms / reps;
}

int main(int argc, char **argv) {
    const int h = argc > 1 ? std::atoi(argv[1]) : 5632, d = argc > 2 ? std::atoi(argv[2]) : 2048;
    const int copies = 6, reps = 300;
    const size_t bytes = static_cast<size_t>(h) * d * sizeof(bf16);
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    std::vector<bf16 *> w(copies);
    for (auto &p : w) {
        CHECK(cudaMalloc(&p, bytes));
        CHECK(cudaMemset(p, 0x3c, bytes));
    }
    bf16 *x, *dst;
    float *out;
    CHECK(cudaMalloc(&x, d * sizeof(bf16)));
    CHECK(cudaMemset(x, 0x3c, d * sizeof(bf16)));
    CHECK(cudaMalloc(&out, h * sizeof(float)));
    CHECK(cudaMalloc(&dst, bytes));
    auto report = [&](const char *name, float us) {
        std::printf("%-28s %8.2f us  %6.3f TB/s (bytes of Wg read)\n", name, us, bytes / us * 1e-6);
    };
    std::printf("H = %d, D = %d, %.1f MB, %d SMs\n", h, d, bytes / 1e6, sms);
    report("memcpy d2d (read only)", time_us([&](int i) { CHECK(cudaMemcpyAsync(dst, w[i % copies], bytes, cudaMemcpyDeviceToDevice)); }, reps));
    report("tile U=4", time_us([&](int i) { tile_pattern<4><<<h / 8, 128>>>(w[i % copies], x, d, out); }, reps));
    report("tile U=6", time_us([&](int i) { tile_pattern<6><<<h / 8, 128>>>(w[i % copies], x, d, out); }, reps));
    report("tile U=8", time_us([&](int i) { tile_pattern<8><<<h / 8, 128>>>(w[i % copies], x, d, out); }, reps));
    report("tile U=4, L2::256B", time_us([&](int i) { tile_pattern<4, true><<<h / 8, 128>>>(w[i % copies], x, d, out); }, reps));
    report("tile U=6, L2::256B", time_us([&](int i) { tile_pattern<6, true><<<h / 8, 128>>>(w[i % copies], x, d, out); }, reps));
    {
        // cuBLAS's own matrix-vector product of the same bytes: z = Wg x (Wg row-major H x D is
        // column-major D x H, transposed), bf16 in and out, fp32 compute
        cublasHandle_t cb;
        if (cublasCreate(&cb) != CUBLAS_STATUS_SUCCESS) std::exit(1);
        bf16 *z;
        CHECK(cudaMalloc(&z, 8 * h * sizeof(bf16)));
        const float one = 1.0f, zero = 0.0f;
        report("cublasGemmEx M = 1", time_us([&](int i) {
                   cublasGemmEx(cb, CUBLAS_OP_T, CUBLAS_OP_N, h, 1, d, &one, w[i % copies], CUDA_R_16BF, d, x, CUDA_R_16BF, d,
                                &zero, z, CUDA_R_16BF, h, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
               }, reps));
        report("cublasGemmEx M = 8 (x 8)", time_us([&](int i) {
                   cublasGemmEx(cb, CUBLAS_OP_T, CUBLAS_OP_N, h, 8, d, &one, w[i % copies], CUDA_R_16BF, d, dst, CUDA_R_16BF, d,
                                &zero, z, CUDA_R_16BF, h, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
               }, reps));
        cublasDestroy(cb);
    }
    report("tile U=8, 2 tiles a block", time_us([&](int i) { tile_pattern<8><<<h / 16, 256>>>(w[i % copies], x, d, out); }, reps));
    report("rows U=4", time_us([&](int i) { rows_pattern<4><<<h / 8, 128>>>(w[i % copies], x, d, out); }, reps));
    report("rows U=8", time_us([&](int i) { rows_pattern<8><<<h / 8, 128>>>(w[i % copies], x, d, out); }, reps));
    const int64_t chunks16 = static_cast<int64_t>(bytes / 16);
    auto ring = [&](auto kernel, int sb, int ns, int blocks_per_sm, const char *name) {
        const int smem = sb * ns;
        CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        report(name, time_us([&](int i) { kernel<<<sms * blocks_per_sm, 160, smem>>>(w[i % copies], x, d, chunks16, out); }, reps));
    };
    ring(bulk_ring<8192, 8, false>, 8192, 8, 1, "bulk 8 KB x 8, 1/SM, no use");
    ring(bulk_ring<16384, 8, false>, 16384, 8, 1, "bulk 16 KB x 8, 1/SM, no use");
    ring(bulk_ring<8192, 12, false>, 8192, 12, 2, "bulk 8 KB x 12, 2/SM, no use");
    ring(bulk_ring<8192, 8>, 8192, 8, 1, "bulk 8 KB x 8, 1/SM");
    ring(bulk_ring<8192, 16>, 8192, 16, 1, "bulk 8 KB x 16, 1/SM");
    ring(bulk_ring<16384, 8>, 16384, 8, 1, "bulk 16 KB x 8, 1/SM");
    ring(bulk_ring<4096, 12>, 4096, 12, 2, "bulk 4 KB x 12, 2/SM");
    ring(bulk_ring<8192, 12>, 8192, 12, 2, "bulk 8 KB x 12, 2/SM");
    ring(bulk_ring<4096, 8>, 4096, 8, 4, "bulk 4 KB x 8, 4/SM");
    return 0;
}
