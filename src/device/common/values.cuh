// Value types in kernels: conversion to and from fp32, the DEFAULT mode's rounding, ReLU's test,
// 16-byte chunks of 8 (16-bit) or 4 (fp32) values, and element access in the value type or in
// fp32 (HIGHEST_PRECISION's gate and intermediates).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace twblas::cuda {

template <class T> struct Value;
template <> struct Value<float> {
    __device__ static float to_float(float v) { return v; }
    __device__ static float from_float(float v) { return v; }
};
template <> struct Value<__nv_bfloat16> {
    __device__ static float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
    __device__ static __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }
};
template <> struct Value<__half> {
    __device__ static float to_float(__half v) { return __half2float(v); }
    __device__ static __half from_float(float v) { return __float2half_rn(v); }
};

/// Rounds an fp32 value to the value type and back (the DEFAULT mode's rounding of g, u, h).
template <class T> __device__ inline float round_to(float v) { return Value<T>::to_float(Value<T>::from_float(v)); }

/// torch.relu keeps values > 0 and NaN; +0 and -0 are inactive.
__device__ inline bool relu_active(float v) { return v > 0.0f || v != v; }

// ---- 16-byte chunks

/// The raw 16 bits of value j (0 .. 7) of a chunk of eight 16-bit values, by selects rather than
/// an indexed read, so a run-time j keeps the chunk in registers.
__device__ inline uint32_t chunk_bits16(const uint4 &c, int j) {
    const uint32_t w = j < 4 ? (j < 2 ? c.x : c.y) : (j < 6 ? c.z : c.w);
    return j % 2 ? w >> 16 : w & 0xffffu;
}

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

/// h of one 16-byte chunk as dense mode and the dense path form it: relu(z) * u rounded to T
/// (gated) or relu(z), +0 from value `valid` on (past the row's last column); each |h| is added
/// to `l1` in order.
template <class T>
__device__ inline void hidden_chunk(const uint4 &zq, const uint4 &uq, bool gated, int64_t valid, T (&out)[Chunk<T>::n],
                                    float &l1) {
#pragma unroll
    for (int e = 0; e < Chunk<T>::n; ++e) {
        const float g = Chunk<T>::get(zq, e);
        float hv = 0.0f;
        if (e < valid && relu_active(g)) hv = gated ? round_to<T>(g * Chunk<T>::get(uq, e)) : g;
        out[e] = Value<T>::from_float(hv);
        l1 += fabsf(hv);
    }
}

// ---- elements

template <class T> __device__ inline float load_elem(const T *p, int64_t i) { return Value<T>::to_float(p[i]); }
template <> __device__ inline float load_elem<float>(const float *p, int64_t i) { return p[i]; }
template <class T> __device__ inline void store_elem(T *p, int64_t i, float v) { p[i] = Value<T>::from_float(v); }

/// An element of type T, or fp32 when `f32` (the gate in HIGHEST_PRECISION), as fp32.
template <class T> __device__ inline float gate_value(const void *g, int64_t i, bool f32) {
    return f32 ? static_cast<const float *>(g)[i] : load_elem(static_cast<const T *>(g), i);
}
template <class T> __device__ inline void gate_store(void *g, int64_t i, bool f32, float v) {
    if (f32)
        static_cast<float *>(g)[i] = v;
    else
        store_elem(static_cast<T *>(g), i, v);
}

/// 16 bytes of row r of a matrix (columns k0..k0+E-1) as fp32; zeros past d.
template <class T> __device__ inline void load_chunk(const T *m, int64_t r, int64_t rs, int64_t cs, bool vec, int64_t k0,
                                                     int64_t d, float (&v)[Chunk<T>::n]) {
    constexpr int E = Chunk<T>::n;
    if (vec && k0 + E <= d) {
        const uint4 q = *reinterpret_cast<const uint4 *>(m + r * rs + k0);
#pragma unroll
        for (int e = 0; e < E; ++e) v[e] = Chunk<T>::get(q, e);
    } else {
#pragma unroll
        for (int e = 0; e < E; ++e) v[e] = k0 + e < d ? Value<T>::to_float(m[r * rs + (k0 + e) * cs]) : 0.0f;
    }
}
template <class T> __device__ inline void store_chunk(T *m, int64_t r, int64_t rs, int64_t cs, bool vec, int64_t k0,
                                                      int64_t d, const float (&v)[Chunk<T>::n]) {
    constexpr int E = Chunk<T>::n;
    if (vec && k0 + E <= d) {
        T out[E];
#pragma unroll
        for (int e = 0; e < E; ++e) out[e] = Value<T>::from_float(v[e]);
        *reinterpret_cast<uint4 *>(m + r * rs + k0) = *reinterpret_cast<const uint4 *>(out);
    } else {
        for (int e = 0; e < E; ++e)
            if (k0 + e < d) m[r * rs + (k0 + e) * cs] = Value<T>::from_float(v[e]);
    }
}

}  // namespace twblas::cuda
