// Device-side helpers shared by the kernel files: 16-byte chunks of values, element access in
// the value type (or fp32 gates), and cp.async copies with an L2 hint. Header-only, internal.
#pragma once

#include "cuda_util.cuh"

namespace twblas::cuda {

// ---- 16-byte chunks of 8 (16-bit) or 4 (fp32) values

template <class T> struct Chunk;
template <> struct Chunk<__nv_bfloat16> {
    static constexpr int n = 8;
    __device__ static float get(const uint4 &c, int i) {
        const uint32_t w = (&c.x)[i / 2];
        return __uint_as_float(i % 2 ? (w & 0xffff0000u) : (w << 16));
    }
};
template <> struct Chunk<__half> {
    static constexpr int n = 8;
    __device__ static float get(const uint4 &c, int i) {
        const uint32_t w = (&c.x)[i / 2];
        return __half2float(__ushort_as_half(static_cast<unsigned short>(i % 2 ? w >> 16 : w & 0xffffu)));
    }
};
template <> struct Chunk<float> {
    static constexpr int n = 4;
    __device__ static float get(const uint4 &c, int i) { return __uint_as_float((&c.x)[i]); }
};

template <class T> __device__ inline float load_elem(const T *p, int64_t i) { return Value<T>::to_float(p[i]); }
template <> __device__ inline float load_elem<float>(const float *p, int64_t i) { return p[i]; }
template <class T> __device__ inline void store_elem(T *p, int64_t i, float v) { p[i] = Value<T>::from_float(v); }

/// Gate value (type T, or fp32 in HIGHEST_PRECISION) as fp32.
template <class T> __device__ inline float gate_value(const void *g, int64_t i, bool f32) {
    return f32 ? static_cast<const float *>(g)[i] : load_elem(static_cast<const T *>(g), i);
}
template <class T> __device__ inline void gate_store(void *g, int64_t i, bool f32, float v) {
    if (f32)
        static_cast<float *>(g)[i] = v;
    else
        store_elem(static_cast<T *>(g), i, v);
}

// Asynchronous copies (cp.async): a unit's rows stream into shared memory kStages - 1 units
// ahead of the one being computed, without holding registers. Each thread copies exactly the 16-byte
// chunks it later reads (and its own copy of the unit's gate word), so no barrier is needed.
// The weights (Wu_j, Wd_j pairs: 46 MB at the paper's shape) are re-read by every token that
// uses the unit: they are kept in L2 (evict_last), while X and the gate stream past
// (evict_first), so the 184 MB gate buffer does not flush them.
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
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ inline void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

}  // namespace twblas::cuda
