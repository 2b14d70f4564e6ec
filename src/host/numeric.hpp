// Scalar conversions between the value types twblas stores (fp32, fp16, bf16) and fp32.
// bf16 and fp16 are handled as their 16-bit patterns; rounding is to nearest, ties to even,
// as in PyTorch and CUDA's __float2bfloat16_rn / __float2half_rn.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "twblas/twblas.h"

namespace twblas {

inline uint32_t float_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}
inline float bits_float(uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

inline float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

inline uint16_t float_to_bf16(float f) {
    uint32_t u = float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}

inline float fp16_to_float(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf / NaN
    if (exp != 0) return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
    if (mant == 0) return bits_float(sign);
    // subnormal: value = mant * 2^-24
    float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
}

inline uint16_t float_to_fp16(float f) {
    const uint32_t u = float_bits(f);
    const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
    const uint32_t au = u & 0x7fffffffu;
    if (au > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
    if (au >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow to inf
    if (au >= 0x38800000u) {                                              // normal half
        uint32_t r = au - 0x38000000u;                                    // rebias 127 -> 15
        r += 0xfffu + ((r >> 13) & 1u);
        return static_cast<uint16_t>(sign | (r >> 13));
    }
    // subnormal half (or zero): round |f| / 2^-24 to an integer, ties to even
    const float scaled = bits_float(au) * 16777216.0f;  // exact: power-of-two scaling
    uint32_t q = static_cast<uint32_t>(scaled);
    const float rem = scaled - static_cast<float>(q);
    if (rem > 0.5f || (rem == 0.5f && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
}

inline size_t value_size(twDataType_t t) { return t == TW_R_32F ? 4 : 2; }
inline bool is_16bit(twDataType_t t) { return t == TW_R_16F || t == TW_R_16BF; }

/// Reads element i of an array of type t as fp32 (exact for every type).
inline float load_value(const void *p, size_t i, twDataType_t t) {
    switch (t) {
        case TW_R_32F: return static_cast<const float *>(p)[i];
        case TW_R_16F: return fp16_to_float(static_cast<const uint16_t *>(p)[i]);
        default: return bf16_to_float(static_cast<const uint16_t *>(p)[i]);
    }
}

/// Writes fp32 v as type t (rounded to nearest even for the 16-bit types).
inline void store_value(void *p, size_t i, twDataType_t t, float v) {
    switch (t) {
        case TW_R_32F: static_cast<float *>(p)[i] = v; break;
        case TW_R_16F: static_cast<uint16_t *>(p)[i] = float_to_fp16(v); break;
        default: static_cast<uint16_t *>(p)[i] = float_to_bf16(v); break;
    }
}

/// fp32 rounded to what type t can hold (identity for fp32).
inline float round_to(twDataType_t t, float v) {
    switch (t) {
        case TW_R_32F: return v;
        case TW_R_16F: return fp16_to_float(float_to_fp16(v));
        default: return bf16_to_float(float_to_bf16(v));
    }
}

/// fp32 rounded to the nearest FP8 E4M3 value (ties to even), saturating at +-448, the largest
/// finite one (as CUDA's __NV_SATFINITE conversion); NaN stays NaN. Normal values carry 3
/// mantissa bits (relative spacing 2^-3, so a rounding error up to 2^-4 relative); below 2^-6 the
/// spacing is 2^-9 (subnormals).
inline float round_to_e4m3(float v) {
    if (std::isnan(v)) return v;
    const float a = std::fabs(v);
    if (a >= 448.0f) return std::copysign(448.0f, v);
    int e2 = 0;
    std::frexp(a, &e2);                               // a = m 2^e2, m in [0.5, 1)
    const int e = std::max(e2 - 1, -6);               // the binade's exponent; subnormals share -6's spacing
    const float step = std::ldexp(1.0f, e - 3);      // 3 mantissa bits
    const float q = std::nearbyint(a / step) * step;  // a / step and the product are exact
    return std::copysign(std::min(q, 448.0f), v);
}

/// 16-bit pattern of a value of 16-bit type t; the value must be representable (already rounded).
inline uint16_t bits16_of(twDataType_t t, float v) {
    return t == TW_R_16F ? float_to_fp16(v) : float_to_bf16(v);
}
inline float value_of_bits16(twDataType_t t, uint16_t b) {
    return t == TW_R_16F ? fp16_to_float(b) : bf16_to_float(b);
}

/// ReLU as torch.relu: NaN passes through, everything not > 0 becomes 0.
inline bool relu_keeps(float v) { return !(v <= 0.0f); }

}  // namespace twblas
