// A TwELL or hybrid container as kernels see it (ContainerArgs), and element access with the
// value type as a run-time argument: what every kernel on containers shares (the writer and SpMM
// in sparse_containers.cuh, inspection and conversions in container_*.cuh).
#pragma once

#include "common/matrix_arg.hpp"
#include "common/values.cuh"
#include "common/warp.cuh"
#include "host/formats.hpp"

namespace twblas::cuda {

// ---- run-time typed element access

__device__ inline uint32_t load_raw(const void *p, int64_t i, int bytes) {
    return bytes == 4 ? static_cast<const uint32_t *>(p)[i] : static_cast<const uint16_t *>(p)[i];
}
__device__ inline float decode(uint32_t raw, twDataType_t t) {
    if (t == TW_R_32F) return __uint_as_float(raw);
    if (t == TW_R_16BF) return __uint_as_float(raw << 16);
    return __half2float(__ushort_as_half(static_cast<unsigned short>(raw)));
}
__device__ inline uint32_t encode(float v, twDataType_t t) {
    if (t == TW_R_32F) return __float_as_uint(v);
    if (t == TW_R_16BF) return __bfloat16_as_ushort(__float2bfloat16_rn(v));
    return __half_as_ushort(__float2half_rn(v));
}
__device__ inline int type_bytes(twDataType_t t) { return t == TW_R_32F ? 4 : 2; }
__device__ inline float load_f(const MatrixArg &m, int64_t r, int64_t c) {
    return decode(load_raw(m.ptr, r * m.rs + c * m.cs, type_bytes(m.type)), m.type);
}
__device__ inline void store_f(const MatrixArg &m, int64_t r, int64_t c, float v) {
    const int64_t i = r * m.rs + c * m.cs;
    if (m.type == TW_R_32F)
        static_cast<float *>(m.ptr)[i] = v;
    else
        static_cast<uint16_t *>(m.ptr)[i] = static_cast<uint16_t>(encode(v, m.type));
}

/// Bits of in(r, c) in the container's type: copied when the types match (exact, NaN payloads
/// included), rounded to nearest even otherwise.
__device__ inline uint32_t container_bits(const MatrixArg &in, int64_t r, int64_t c, twDataType_t out) {
    const uint32_t raw = load_raw(in.ptr, r * in.rs + c * in.cs, type_bytes(in.type));
    return in.type == out ? raw : encode(decode(raw, in.type), out);
}
/// Bits of in(r, c0 .. c0 + 7) in the container's type `out` (0 past `cols`). `vec`: the rows
/// are 16-byte aligned and hold 16-bit values of type `out`, so eight columns are one load.
__device__ inline void load8_bits(const MatrixArg &in, int64_t r, int64_t c0, int64_t cols, twDataType_t out, bool vec,
                                  uint32_t (&bits)[8]) {
    if (vec && c0 + 8 <= cols) {
        const uint4 q = *reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(in.ptr) + r * in.rs + c0);
#pragma unroll
        for (int j = 0; j < 8; ++j) bits[j] = chunk_bits16(q, j);
        return;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) bits[j] = c0 + j < cols ? container_bits(in, r, c0 + j, out) : 0u;
}
__device__ inline bool keeps(uint32_t bits, twDataType_t t, twConvertOp_t op) {
    return op == TW_CONVERT_RELU ? relu_active(decode(bits, t)) : bits != 0;
}

// ---- rows of 16-bit values on 16 bytes, eight columns at a time in integer arithmetic

/// Which halves of a word of two 16-bit values (bf16 or f16) the conversion keeps: bit 15 for
/// the low half, bit 31 for the high one. Two halves at a time in integer arithmetic, no carry
/// crossing between them: magnitude + 0x7fff sets bit 15 when the magnitude is not 0, magnitude +
/// `nan_bias` when it is past the type's infinity (a NaN, which RELU keeps as torch.relu does).
__device__ inline uint32_t kept_halves(uint32_t w, uint32_t nan_bias, bool relu) {
    const uint32_t magnitude = w & 0x7fff7fffu;
    const uint32_t nonzero = magnitude + 0x7fff7fffu;
    if (!relu) return (nonzero | w) & 0x80008000u;  // PLAIN keeps every value whose bits are not 0
    return ((nonzero & ~w) | (magnitude + nan_bias)) & 0x80008000u;
}
/// kept_halves's `nan_bias` for a 16-bit type: 0x8000 less the smallest NaN magnitude.
__device__ inline uint32_t nan_bias16(twDataType_t t) { return t == TW_R_16BF ? 0x007f007fu : 0x03ff03ffu; }
/// The kept columns of a chunk of eight 16-bit values, bit j for value j.
__device__ inline unsigned kept8(const uint4 &q, uint32_t nan_bias, bool relu) {
    const uint32_t a = kept_halves(q.x, nan_bias, relu), b = kept_halves(q.y, nan_bias, relu);
    const uint32_t c = kept_halves(q.z, nan_bias, relu), d = kept_halves(q.w, nan_bias, relu);
    return (a >> 15 & 1u) | (a >> 30 & 2u) | (b >> 13 & 4u) | (b >> 28 & 8u) | (c >> 11 & 16u) | (c >> 26 & 32u) |
           (d >> 9 & 64u) | (d >> 24 & 128u);
}
/// Columns c .. c + 7 of a row of 16-bit values on 16 bytes (zeros past `cols`).
__device__ inline uint4 load8_row16(const uint16_t *row, int c, int cols) {
    if (c + 8 <= cols) return *reinterpret_cast<const uint4 *>(row + c);
    uint32_t h[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) h[j] = c + j < cols ? row[c + j] : 0u;
    return make_uint4(h[0] | h[1] << 16, h[2] | h[3] << 16, h[4] | h[5] << 16, h[6] | h[7] << 16);
}

/// The eight columns c0 .. c0 + 7 of row r as load8_bits reads them, and which of them the
/// conversion stores (bit j for column c0 + j; none past `cols`).
__device__ inline unsigned load8_kept(const MatrixArg &in, int64_t r, int64_t c0, int64_t cols, twDataType_t out, bool vec,
                                      twConvertOp_t op, uint32_t (&bits)[8]) {
    load8_bits(in, r, c0, cols, out, vec, bits);
    unsigned kept = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j)
        if (c0 + j < cols && keeps(bits[j], out, op)) kept |= 1u << j;
    return kept;
}

/// load8_kept under an active mask: the eight columns' mask bits (all when there is no mask); a
/// chunk without an active entry is not read at all.
__device__ inline unsigned mask_bits8(const ActiveMask &mask, int64_t r, int64_t c0) {
    return mask.words ? (mask.words[r * mask.ld + c0 / 32] >> (c0 % 32)) & 0xffu : 0xffu;
}
__device__ inline unsigned load8_active(const MatrixArg &in, const ActiveMask &mask, int64_t r, int64_t c0, int64_t cols,
                                        twDataType_t out, bool vec, twConvertOp_t op, uint32_t (&bits)[8]) {
    const unsigned live = c0 < cols ? mask_bits8(mask, r, c0) : 0u;
    return live ? load8_kept(in, r, c0, cols, out, vec, op, bits) & live : 0u;
}

__device__ inline uint32_t lane_id() { return threadIdx.x & 31u; }
/// The row of a kernel that gives each row one warp.
__device__ inline int64_t warp_row() { return static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; }

struct ContainerArgs {
    uint8_t *base;
    twDataType_t type;
    int64_t rows, cols;
    // TwELL
    int32_t tile, slots, words_per_block;
    int64_t ld, record;  // words
    // hybrid
    int32_t ell_width;
    int64_t backup_rows;
    size_t row_nnz, ell_cols, ell_vals, backup_count, backup_row_ids, backup_map, backup_vals, value_bytes;
};


/// Whether the dense -> container kernels may read `in` eight 16-bit columns at a time.
inline bool dense_rows_vectorizable(const MatrixArg &in, twDataType_t container_type) {
    return rows_aligned16(in) && in.type == container_type && elem_bytes(in.type) == 2;
}

/// A container descriptor as kernels see it.
inline ContainerArgs container_args(const twSpMatDescr &s) {
    ContainerArgs a{};
    a.base = static_cast<uint8_t *>(s.buffer);
    a.type = s.type;
    a.rows = s.rows;
    a.cols = s.cols;
    if (s.format == TW_FORMAT_TWELL) {
        a.tile = s.twell.tile_width;
        a.slots = static_cast<int32_t>(s.twell.slots);
        a.words_per_block = static_cast<int32_t>(s.twell.words_per_block);
        a.ld = s.twell.ld;
        a.record = static_cast<int64_t>(s.twell.overflow_offset_words());
    } else {
        const HybridLayout &l = s.hybrid;
        a.ell_width = l.ell_width;
        a.backup_rows = l.backup_rows;
        a.row_nnz = l.row_nnz;
        a.ell_cols = l.ell_cols;
        a.ell_vals = l.ell_vals;
        a.backup_count = l.backup_count;
        a.backup_row_ids = l.backup_row_ids;
        a.backup_map = l.backup_map;
        a.backup_vals = l.backup_vals;
        a.value_bytes = l.value_bytes;
    }
    return a;
}

template <class T> __device__ inline T *at(const ContainerArgs &a, size_t offset) {
    return reinterpret_cast<T *>(a.base + offset);
}

}  // namespace twblas::cuda
