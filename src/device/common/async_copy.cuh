// Asynchronous copies (cp.async) into shared memory, with an L2 policy that keeps the weights;
// and a streaming load that fetches whole 256-byte blocks into L2.
// The fused kernel streams each unit's rows kStages - 1 units ahead of the one it computes,
// without holding registers; the weights (46 MB at the paper's shape) are re-read by every token
// that uses the unit, so they are kept in L2 (evict_last) while X and the gate stream past.
#pragma once

#include <cstdint>

namespace twblas::cuda {

__device__ inline uint64_t l2_keep_policy() {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
    return policy;
}
__device__ inline void cp_async16(void *dst, const void *src, uint64_t policy) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "l"(policy));
}
__device__ inline void cp_async4(void *dst, const void *src) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(src));
}
/// 16 bytes read once (not kept in L1), asking L2 to fetch the whole 256-byte block around them:
/// for weight streams whose warp instructions each take a short piece of many rows, so that the
/// rest of each row's block, which other warps read next, is not a DRAM request of its own
/// (measured on an H100, a gate-shaped stream of Llama-3-8B's 117 MB gate: 46.6 us against 49.6).
__device__ inline uint4 load_stream_256(const void *p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ inline void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

}  // namespace twblas::cuda
