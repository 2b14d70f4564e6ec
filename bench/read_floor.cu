// The read floor: a plain kernel that reads a buffer once from DRAM, the rate against which the
// serving rows' bytes are set (bm_read_floor in bench_inference.cpp times it).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace twbench {

void ck(cudaError_t e, const char *what);  // common.hpp's, without its host-only headers

namespace {

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 4;
// 16-byte loads a thread issues before it uses any: 4 blocks of 256 threads keep 128 KB an SM in
// flight, more than DRAM's latency asks for at full rate. The blocks an SM in __launch_bounds__
// matter: without them ptxas issues the loads four at a time, each four waited for.
constexpr int kLoadsInFlight = 8;

__device__ inline void xor_into(uint4 &acc, const uint4 &v) {
    acc.x ^= v.x;
    acc.y ^= v.y;
    acc.z ^= v.z;
    acc.w ^= v.w;
}

/// Reads `chunks` 16-byte chunks, consecutive threads on consecutive chunks (a warp's load is 512
/// contiguous bytes); the loads of a step are predicated, not a serial tail. Each warp writes the
/// XOR of what it read, so that the compiler keeps every load.
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    read_once(const uint4 *__restrict__ src, size_t chunks, uint4 *out) {
    const size_t stride = static_cast<size_t>(gridDim.x) * kThreads;
    const size_t first = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x;
    uint4 acc = make_uint4(0, 0, 0, 0);
    for (size_t i = first; i < chunks; i += kLoadsInFlight * stride) {
        uint4 v[kLoadsInFlight];
#pragma unroll
        for (int u = 0; u < kLoadsInFlight; ++u) {
            const size_t j = i + u * stride;
            v[u] = j < chunks ? __ldg(src + j) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < kLoadsInFlight; ++u) xor_into(acc, v[u]);
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) {
        acc.x ^= __shfl_xor_sync(0xffffffffu, acc.x, o);
        acc.y ^= __shfl_xor_sync(0xffffffffu, acc.y, o);
        acc.z ^= __shfl_xor_sync(0xffffffffu, acc.z, o);
        acc.w ^= __shfl_xor_sync(0xffffffffu, acc.w, o);
    }
    if (threadIdx.x % 32 == 0) out[first / 32] = acc;
}

/// Asked once (read_floor_out_bytes, before any capture), so that a launch under capture calls
/// nothing but the kernel.
int blocks() {
    static const int n = [] {
        int device = 0, sms = 0;
        ck(cudaGetDevice(&device), "cudaGetDevice");
        ck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
        return sms * kBlocksPerSm;
    }();
    return n;
}

}  // namespace

size_t read_floor_out_bytes() { return static_cast<size_t>(blocks()) * (kThreads / 32) * sizeof(uint4); }

void launch_read_floor(cudaStream_t stream, const void *src, size_t bytes, void *out) {
    read_once<<<blocks(), kThreads, 0, stream>>>(static_cast<const uint4 *>(src), bytes / sizeof(uint4),
                                                 static_cast<uint4 *>(out));
    ck(cudaGetLastError(), "read_once");
}

}  // namespace twbench
