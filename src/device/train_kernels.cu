// The training backward of the fused feed-forward, from the forward's saved state:
//   recompute  rows the forward sent through its dense path (a TwELL tile over capacity, or more
//              active units than the saved ELL holds) are recomputed from X with GEMMs whose row
//              count is read on the device: their dz, du, h, their dX rows and their
//              weight-gradient terms (exact for any number of such rows, no host sync);
//   tokens     for each saved (token, unit) slot dh = dY_t . Wd_j on the unit's row only, then
//              dz and du; then dX_t = sum du Wu_j + dz Wg_j over the token's units;
//   transpose  the (token, unit) slots are sorted by unit with a stable radix sort: each unit's
//              tokens come out in ascending order, so every sum below has a fixed order;
//   units      a block per unit sums dz X_t, du X_t and h dY_t over its tokens (plus the
//              recomputed rows' terms) and writes the unit's rows of dWg, dWu, dWd once.
// Nothing uses atomics on values: the results are bitwise reproducible.
#include <cub/device/device_radix_sort.cuh>
#include <mma.h>

#include <algorithm>
#include <type_traits>

#include "cuda_util.cuh"
#include "device_values.cuh"
#include "kernels.hpp"
#include "lt_gemm.hpp"

namespace twblas::cuda {

namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr uint64_t kSavedMagic = 0x7477637564617331ull;  // "twcudas1"

struct SavedHeader {
    uint64_t magic;
    int64_t tokens, model_dim, hidden_dim;
    int32_t gated, type, highest, ell;
};

bool gate_f32_of(const FfnProblem &p) { return p.type == TW_R_32F || p.highest; }
size_t gate_bytes(const FfnProblem &p) { return gate_f32_of(p) ? 4 : 2; }

__global__ void write_header(SavedHeader h, SavedHeader *out) { *out = h; }

/// One element of a matrix as fp32 (type T, or fp32 when f32).
template <class T> __device__ inline float elem(const void *p, int64_t i, bool f32) { return gate_value<T>(p, i, f32); }

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

/// The gradients of one active unit of one token, as the reference computes them: dh from its
/// dot product (with the L1 term), then du = dh g and dz = dh u (gated) or dz = dh (plain).
struct UnitGrad {
    float h, dz, du;
};
template <class T> __device__ inline UnitGrad unit_grad(float g, float u, float dot, bool gated, bool highest, float l1_scale) {
    auto r = [&](float v) { return highest ? v : round_to<T>(v); };
    UnitGrad out;
    out.h = gated ? r(g * u) : g;
    const float sign = static_cast<float>((out.h > 0.0f) - (out.h < 0.0f));
    const float dh = r(r(dot) + l1_scale * sign);
    out.du = gated ? r(dh * g) : 0.0f;
    out.dz = gated ? r(dh * u) : dh;
    return out;
}

// ---- token phase

template <class T> struct TokenArgs {
    const T *dy;
    int64_t dy_rs, dy_cs;
    bool dy_vec;
    T *dx;
    int64_t dx_rs, dx_cs;
    bool dx_vec;
    const T *pair;  // [Wu_j | Wd_j] (gated) or [Wd_j]
    int64_t pair_stride;
    const T *gate_w;  // Wg_j (gated) or Wu_j (plain), dp apart
    int64_t dp, d, m, h;
    bool gate_f32, gated, highest;
    float l1_scale;
    const uint16_t *idx;
    const void *sg, *su;
    const int32_t *count;
    int ell;
    void *dz, *du;  // per slot, gate type
};

// ---- token phase, in two kernels:
//   token_dh  one warp per (token, active unit): dh = dY_t . Wd_j over the whole row (dY_t in
//             shared memory), then dz and du for the slot;
//   token_dx  one block per (token, 512-column slice), slice by slice: dX_t = sum du Wu_j + dz Wg_j
//             over the token's units, four units' rows loaded at once.
// The fused kernel before them read three rows per unit through a cp.async ring and was bound
// by load latency (ncu: 1.13 ms at the paper's shape, 3.0 GB from HBM).

constexpr int kDhWarps = 8;

/// Row `r` of a matrix into shared memory as `nchunks` 16-byte chunks (zeros past d), by the block.
template <class T> __device__ inline void stage_row(uint4 *dst, const T *m, int64_t r, int64_t rs, int64_t cs, bool vec,
                                                    int64_t d, int nchunks) {
    constexpr int E = Chunk<T>::n;
    for (int c = threadIdx.x; c < nchunks; c += blockDim.x) {
        float v[E];
        load_chunk(m, r, rs, cs, vec, static_cast<int64_t>(c) * E, d, v);
        T tmp[E];
#pragma unroll
        for (int e = 0; e < E; ++e) tmp[e] = Value<T>::from_float(v[e]);
        dst[c] = *reinterpret_cast<const uint4 *>(tmp);
    }
}

/// One warp's dot product of a row held in shared memory (`nchunks` 16-byte chunks) with a
/// weight row in global memory; four chunks' loads per lane are issued before any is used (the
/// kernels that use it are bound by load latency). Every lane gets the sum.
template <class T> __device__ inline float warp_row_dot(const uint4 *row, const T *w, int nchunks) {
    constexpr int E = Chunk<T>::n;
    const int lane = threadIdx.x & 31;
    float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int c0 = lane; c0 < nchunks; c0 += 128) {
        uint4 wq[4];
#pragma unroll
        for (int q = 0; q < 4; ++q)
            if (c0 + 32 * q < nchunks) wq[q] = *reinterpret_cast<const uint4 *>(w + static_cast<int64_t>(c0 + 32 * q) * E);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            if (c0 + 32 * q >= nchunks) break;
            const uint4 r = row[c0 + 32 * q];
#pragma unroll
            for (int e = 0; e < E; ++e) part[q] = fmaf(Chunk<T>::get(r, e), Chunk<T>::get(wq[q], e), part[q]);
        }
    }
    float dot = (part[0] + part[1]) + (part[2] + part[3]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(kFull, dot, o);
    return dot;
}

template <class T> __global__ void __launch_bounds__(32 * kDhWarps) token_dh(TokenArgs<T> a) {
    constexpr int E = Chunk<T>::n;
    extern __shared__ uint4 sy[];  // dY_t as dp / E chunks
    const int64_t row = blockIdx.x;
    const int n = min(a.count[row], a.ell);
    if (n <= 0) return;
    const int nchunks = static_cast<int>(a.dp / E);
    stage_row(sy, a.dy, row, a.dy_rs, a.dy_cs, a.dy_vec, a.d, nchunks);
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    const int64_t base = row * a.ell;
    for (int k = warp; k < n; k += kDhWarps) {
        const int64_t col = min(static_cast<int64_t>(a.idx[base + k]), a.h - 1);
        const float dot = warp_row_dot(sy, a.pair + col * a.pair_stride + (a.gated ? a.dp : 0), nchunks);
        if (lane == 0) {
            const float g = elem<T>(a.sg, base + k, a.gate_f32), u = a.gated ? elem<T>(a.su, base + k, a.gate_f32) : 0.0f;
            const UnitGrad ug = unit_grad<T>(g, u, dot, a.gated, a.highest, a.l1_scale);
            gate_store<T>(a.dz, base + k, a.gate_f32, ug.dz);
            if (a.gated) gate_store<T>(a.du, base + k, a.gate_f32, ug.du);
        }
    }
}

constexpr int kDxThreads = 64;

template <class T> __global__ void __launch_bounds__(kDxThreads) token_dx(TokenArgs<T> a) {
    constexpr int E = Chunk<T>::n;
    __shared__ int64_t s_col[kSavedEll];
    __shared__ float s_c1[kSavedEll], s_c2[kSavedEll];
    const int64_t row = blockIdx.x;
    const int n = min(a.count[row], a.ell);
    if (n < 0) return;  // a recomputed row: the dense path writes it
    for (int k = threadIdx.x; k < n; k += kDxThreads) {
        const int64_t at = row * a.ell + k;
        s_col[k] = min(static_cast<int64_t>(a.idx[at]), a.h - 1);
        const float dz = elem<T>(a.dz, at, a.gate_f32);
        s_c1[k] = a.gated ? elem<T>(a.du, at, a.gate_f32) : dz;  // times Wu_j
        s_c2[k] = dz;                                             // times Wg_j (gated)
    }
    __syncthreads();
    const int64_t k0 = (static_cast<int64_t>(blockIdx.y) * kDxThreads + threadIdx.x) * E;
    if (k0 >= a.dp) return;
    float acc[E];
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] = 0.0f;
    // Wu_j: the first half of the pair (gated) or the gate-weight row (plain, where gate_w = Wu)
    const T *up = a.gated ? a.pair : a.gate_w;
    const int64_t up_stride = a.gated ? a.pair_stride : a.dp;
    constexpr int kG = 4;
    int k = 0;
    for (; k + kG <= n; k += kG) {
        uint4 wu[kG], wg[kG];
#pragma unroll
        for (int g = 0; g < kG; ++g) {
            wu[g] = *reinterpret_cast<const uint4 *>(up + s_col[k + g] * up_stride + k0);
            if (a.gated) wg[g] = *reinterpret_cast<const uint4 *>(a.gate_w + s_col[k + g] * a.dp + k0);
        }
#pragma unroll
        for (int g = 0; g < kG; ++g) {
            const float c1 = s_c1[k + g], c2 = s_c2[k + g];
#pragma unroll
            for (int e = 0; e < E; ++e) {
                acc[e] = fmaf(c1, Chunk<T>::get(wu[g], e), acc[e]);
                if (a.gated) acc[e] = fmaf(c2, Chunk<T>::get(wg[g], e), acc[e]);
            }
        }
    }
    for (; k < n; ++k) {
        const uint4 wu = *reinterpret_cast<const uint4 *>(up + s_col[k] * up_stride + k0);
        const float c1 = s_c1[k], c2 = s_c2[k];
#pragma unroll
        for (int e = 0; e < E; ++e) acc[e] = fmaf(c1, Chunk<T>::get(wu, e), acc[e]);
        if (a.gated) {
            const uint4 wg = *reinterpret_cast<const uint4 *>(a.gate_w + s_col[k] * a.dp + k0);
#pragma unroll
            for (int e = 0; e < E; ++e) acc[e] = fmaf(c2, Chunk<T>::get(wg, e), acc[e]);
        }
    }
    if (k0 < a.d) store_chunk(a.dx, row, a.dx_rs, a.dx_cs, a.dx_vec, k0, a.d, acc);
}


// ---- the forward's sparse rows, in two kernels (as the token phase of the backward), used by
// the training forward and by the inference forward at M > 512 (one team per token):
//   fwd_u  one warp per (token, active unit): u = x_t . Wu_j (gated), h (saved as g and u in
//          training, written over the gate value otherwise), and each token's l1 (warp sums
//          added in warp order: deterministic);
//   fwd_y  one block per (token, 512-column slice), slice by slice: y_t = sum h Wd_j.

template <class T> struct FwdArgs {
    const T *x;
    int64_t x_rs, x_cs;
    bool x_vec;
    T *y;
    int64_t y_rs, y_cs;
    bool y_vec;
    const T *pair;
    int64_t pair_stride, dp, d, m, h;
    const void *gate;
    int64_t ldg;
    bool gate_f32, gated, highest;
    const uint16_t *idx;
    const int32_t *count;
    int ell;
    void *save_g, *save_u;  // training: g and u per slot; NULL: h goes over the gate value
    float *row_l1;
};

template <class T> __global__ void __launch_bounds__(32 * kDhWarps) fwd_u(FwdArgs<T> a) {
    constexpr int E = Chunk<T>::n;
    extern __shared__ uint4 sx[];  // x_t as dp / E chunks
    __shared__ float warp_l1[kDhWarps];
    const int64_t row = blockIdx.x;
    const int n = min(a.count[row], a.ell);
    if (n < 0) return;  // the dense path
    const int nchunks = static_cast<int>(a.dp / E);
    if (a.gated) {
        stage_row(sx, a.x, row, a.x_rs, a.x_cs, a.x_vec, a.d, nchunks);
        __syncthreads();
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    const int64_t base = row * a.ell;
    float l1 = 0.0f;
    for (int k = warp; k < n; k += kDhWarps) {
        const int64_t col = min(static_cast<int64_t>(a.idx[base + k]), a.h - 1);
        const float g = gate_value<T>(a.gate, row * a.ldg + col, a.gate_f32);
        float h = g, u = 0.0f;
        if (a.gated) {
            const float dot = warp_row_dot(sx, a.pair + col * a.pair_stride, nchunks);
            u = a.highest ? dot : round_to<T>(dot);
            h = a.highest ? g * u : round_to<T>(g * u);
        }
        if (lane == 0) {
            if (a.save_g) {
                gate_store<T>(a.save_g, base + k, a.gate_f32, g);
                if (a.gated) gate_store<T>(a.save_u, base + k, a.gate_f32, u);
            } else {
                gate_store<T>(const_cast<void *>(a.gate), row * a.ldg + col, a.gate_f32, h);
            }
            l1 += fabsf(h);
        }
    }
    if (lane == 0) warp_l1[warp] = l1;
    __syncthreads();
    if (threadIdx.x == 0) {
        float sum = 0.0f;
        for (int w = 0; w < kDhWarps; ++w) sum += warp_l1[w];
        a.row_l1[row] = sum;
    }
}

template <class T> __global__ void __launch_bounds__(kDxThreads) fwd_y(FwdArgs<T> a) {
    constexpr int E = Chunk<T>::n;
    extern __shared__ int64_t s_col[];  // the row's units, then their h (list width of each)
    float *s_h = reinterpret_cast<float *>(s_col + a.ell);
    const int64_t row = blockIdx.x;
    const int n = min(a.count[row], a.ell);
    if (n < 0) return;
    for (int k = threadIdx.x; k < n; k += kDxThreads) {
        const int64_t at = row * a.ell + k;
        s_col[k] = min(static_cast<int64_t>(a.idx[at]), a.h - 1);
        if (a.save_g) {
            const float g = elem<T>(a.save_g, at, a.gate_f32);
            s_h[k] = a.gated ? (a.highest ? g * elem<T>(a.save_u, at, a.gate_f32)
                                          : round_to<T>(g * elem<T>(a.save_u, at, a.gate_f32)))
                             : g;
        } else {
            s_h[k] = gate_value<T>(a.gate, row * a.ldg + s_col[k], a.gate_f32);
        }
    }
    __syncthreads();
    const int64_t k0 = (static_cast<int64_t>(blockIdx.y) * kDxThreads + threadIdx.x) * E;
    if (k0 >= a.dp) return;
    const T *down = a.pair + (a.gated ? a.dp : 0);
    float acc[E];
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] = 0.0f;
    constexpr int kG = 4;
    int k = 0;
    for (; k + kG <= n; k += kG) {
        uint4 w[kG];
#pragma unroll
        for (int g = 0; g < kG; ++g) w[g] = *reinterpret_cast<const uint4 *>(down + s_col[k + g] * a.pair_stride + k0);
#pragma unroll
        for (int g = 0; g < kG; ++g)
#pragma unroll
            for (int e = 0; e < E; ++e) acc[e] = fmaf(s_h[k + g], Chunk<T>::get(w[g], e), acc[e]);
    }
    for (; k < n; ++k) {
        const uint4 w = *reinterpret_cast<const uint4 *>(down + s_col[k] * a.pair_stride + k0);
#pragma unroll
        for (int e = 0; e < E; ++e) acc[e] = fmaf(s_h[k], Chunk<T>::get(w, e), acc[e]);
    }
    if (k0 < a.d) store_chunk(a.y, row, a.y_rs, a.y_cs, a.y_vec, k0, a.d, acc);
}

// ---- transpose: (token, unit) slots sorted by unit

/// Key of each slot: its unit id, or H for an empty slot and the slots of recomputed rows.
__global__ void slot_keys(const uint16_t *idx, const int32_t *count, int64_t m, int ell, int64_t h, uint32_t *keys,
                          int32_t *slots) {
    const int64_t total = m * ell;
    for (int64_t s = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; s < total;
         s += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t row = s / ell, i = s % ell;
        const int n = count[row];
        uint32_t key = static_cast<uint32_t>(h);
        if (n >= 0 && i < n && idx[s] < h) key = idx[s];
        keys[s] = key;
        slots[s] = static_cast<int32_t>(s);
    }
}

/// Dense mode: every row on the dense list, in order (the statistics have been taken from count).
__global__ void all_rows_dense(int32_t *count, int32_t *rows, uint32_t *dense_count, int64_t m) {
    for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < m;
         r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        count[r] = count[r] < 0 ? count[r] : -2;
        rows[r] = static_cast<int32_t>(r);
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) *dense_count = static_cast<uint32_t>(m);
}

/// The dense list (filled by atomics in the forward, so in no fixed order) as sort keys: row
/// ids, and M past the count. Sorted, the weight-gradient sums run in ascending row order.
__global__ void dense_row_keys(const int32_t *rows, const uint32_t *count, int64_t m, int32_t *keys) {
    const int64_t n = min(static_cast<int64_t>(*count), m);
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < m;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        keys[i] = i < n ? min(max(rows[i], 0), static_cast<int32_t>(m - 1)) : static_cast<int32_t>(m);
}

/// start[u] = first sorted position whose key is >= u, for u in [0, H]: unit j's slots are
/// [start[j], start[j + 1]).
__global__ void unit_starts(const uint32_t *keys, int64_t total, int64_t h, int32_t *start) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    if (total == 0) {
        for (int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u <= h; u += stride) start[u] = 0;
        return;
    }
    for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < total; p += stride) {
        const int64_t k = keys[p], prev = p ? static_cast<int64_t>(keys[p - 1]) : -1;
        for (int64_t u = prev + 1; u <= k && u <= h; ++u) start[u] = static_cast<int32_t>(p);
        if (p == total - 1)
            for (int64_t u = k + 1; u <= h; ++u) start[u] = static_cast<int32_t>(total);
    }
}

// ---- unit phase: a block per (unit, column chunk); the unit's tokens staged in shared memory

template <class T> struct UnitArgs {
    const T *x;
    int64_t x_rs, x_cs;
    bool x_vec;
    const T *dy;
    int64_t dy_rs, dy_cs;
    bool dy_vec;
    const int32_t *start, *slots;
    int ell;
    const void *sg, *su, *dz, *du;
    bool gate_f32, gated, highest;
    const float *dw_dense;  // [3][H][dp]: the recomputed rows' terms, when *dense_count > 0
    const uint32_t *dense_count;
    int64_t dp, d, h;
    T *out_z;  // dz X: dWg (gated) or dWu (plain)
    int64_t z_rs, z_cs;
    bool z_vec;
    T *out_u;  // du X: dWu (gated only)
    int64_t u_rs, u_cs;
    bool u_vec;
    T *out_d;  // h dY: dWd
    int64_t d_rs, d_cs;
    bool d_vec;
};

// A block covers 512 columns (64 threads of 8 bf16) of one unit, and the grid runs column slice
// by column slice (blockIdx.x = unit is the fast index): while one slice is in flight, the X and
// dY columns it gathers (2 x 16 MB at M = 16384, D = 2048) stay in L2. With whole rows per block
// the gathers of X and dY rows (4 KB each, 3.9 GB at the paper's shape) came from HBM: ncu put
// this kernel at 1.11 ms, about HBM speed.
constexpr int kUnitThreads = 64, kUnitBatch = 64;

template <class T> __global__ void __launch_bounds__(kUnitThreads) backward_units(UnitArgs<T> a) {
    constexpr int E = Chunk<T>::n;
    __shared__ int64_t s_tok[kUnitBatch];
    __shared__ float s_z[kUnitBatch], s_u[kUnitBatch], s_h[kUnitBatch];
    const int64_t j = blockIdx.x;
    const int64_t k0 = (static_cast<int64_t>(blockIdx.y) * kUnitThreads + threadIdx.x) * E;
    float az[E], au[E], ad[E];
#pragma unroll
    for (int e = 0; e < E; ++e) az[e] = au[e] = ad[e] = 0.0f;
    const int32_t p0 = a.start[j], p1 = a.start[j + 1];
    for (int32_t b = p0; b < p1; b += kUnitBatch) {
        const int nb = min(kUnitBatch, p1 - b);
        __syncthreads();
        if (threadIdx.x < nb) {
            const int64_t slot = a.slots[b + threadIdx.x];
            s_tok[threadIdx.x] = slot / a.ell;
            const float g = elem<T>(a.sg, slot, a.gate_f32);
            s_z[threadIdx.x] = elem<T>(a.dz, slot, a.gate_f32);
            if (a.gated) {
                const float u = elem<T>(a.su, slot, a.gate_f32);
                s_u[threadIdx.x] = elem<T>(a.du, slot, a.gate_f32);
                s_h[threadIdx.x] = a.highest ? g * u : round_to<T>(g * u);
            } else {
                s_h[threadIdx.x] = g;
            }
        }
        __syncthreads();
        if (k0 >= a.dp) continue;
        int e = 0;
        if (a.x_vec && a.dy_vec && k0 + E <= a.d) {
            // four entries at a time: their eight 16-byte loads are issued before any is used
            // (the kernel is bound by load latency, not bandwidth)
            constexpr int kG = 4;
            for (; e + kG <= nb; e += kG) {
                uint4 xq[kG], yq[kG];
#pragma unroll
                for (int g = 0; g < kG; ++g) {
                    const int64_t tok = s_tok[e + g];
                    xq[g] = *reinterpret_cast<const uint4 *>(a.x + tok * a.x_rs + k0);
                    yq[g] = *reinterpret_cast<const uint4 *>(a.dy + tok * a.dy_rs + k0);
                }
#pragma unroll
                for (int g = 0; g < kG; ++g) {
                    const float cz = s_z[e + g], ch = s_h[e + g], cu = a.gated ? s_u[e + g] : 0.0f;
#pragma unroll
                    for (int q = 0; q < E; ++q) {
                        const float xv = Chunk<T>::get(xq[g], q);
                        az[q] = fmaf(cz, xv, az[q]);
                        au[q] = fmaf(cu, xv, au[q]);
                        ad[q] = fmaf(ch, Chunk<T>::get(yq[g], q), ad[q]);
                    }
                }
            }
        }
        for (; e < nb; ++e) {
            const int64_t tok = s_tok[e];
            float xv[E], yv[E];
            load_chunk(a.x, tok, a.x_rs, a.x_cs, a.x_vec, k0, a.d, xv);
            load_chunk(a.dy, tok, a.dy_rs, a.dy_cs, a.dy_vec, k0, a.d, yv);
            const float cz = s_z[e], ch = s_h[e];
#pragma unroll
            for (int q = 0; q < E; ++q) {
                az[q] = fmaf(cz, xv[q], az[q]);
                ad[q] = fmaf(ch, yv[q], ad[q]);
            }
            if (a.gated) {
                const float cu = s_u[e];
#pragma unroll
                for (int q = 0; q < E; ++q) au[q] = fmaf(cu, xv[q], au[q]);
            }
        }
    }
    if (k0 >= a.d) return;
    if (*a.dense_count > 0) {
        const int64_t plane = a.h * a.dp;
#pragma unroll
        for (int q = 0; q < E; ++q) {
            if (k0 + q >= a.dp) break;
            const int64_t at = j * a.dp + k0 + q;
            az[q] += a.dw_dense[at];
            au[q] += a.dw_dense[plane + at];
            ad[q] += a.dw_dense[2 * plane + at];
        }
    }
    store_chunk(a.out_z, j, a.z_rs, a.z_cs, a.z_vec, k0, a.d, az);
    if (a.gated) store_chunk(a.out_u, j, a.u_rs, a.u_cs, a.u_vec, k0, a.d, au);
    store_chunk(a.out_d, j, a.d_rs, a.d_cs, a.d_vec, k0, a.d, ad);
}

// ---- GEMMs of the recomputed rows, with a row or reduction count read on the device
//
// C(i, j) = sum_k A(i, k) B(k, j). A(i, k) is at a + ai * a_ri + k * a_ck (ai = a_rows[i] when
// gathering rows, else i); for k >= ksplit it comes from a2 at k - ksplit (B likewise, from b2
// with its own row stride): [dZ | dU] x [Wg ; Wu] in one pass. The device count bounds the
// rows (m_dev) or the reduction (k_dev) to list positions [first, count).

enum class DevEpi : int { StoreGate, BackwardGrad, ScatterRows, StoreF32, AccumF32 };

struct DevGemm {
    const void *a, *a2;
    bool a_f32;
    int64_t a_ri, a_ck;
    const int32_t *a_rows;
    const void *b, *b2;
    bool b_f32;
    int64_t b_rk, b2_rk, b_cj;
    const int32_t *b_rows;
    int64_t ksplit;
    int64_t m, n, k;  // m (m_dev) or k (k_dev) is the capacity: the device count caps it
    const uint32_t *dev_count;
    bool m_dev, k_dev;
    int64_t first;
    DevEpi epi;
    void *c;
    int64_t c_rs, c_cs;
    bool c_f32;
    const int32_t *c_rows;
    void *rz, *ru, *rh;  // BackwardGrad: z and u in, dz, du and h out, at [i * ldr + j]
    int64_t ldr;
    bool gated, highest;
    float l1_scale;
};

constexpr int kGm = 64, kGn = 128, kGk = 32;

template <class T> __device__ inline float dev_a(const DevGemm &g, int64_t ai, int64_t k) {
    const bool second = k >= g.ksplit;
    return elem<T>(second ? g.a2 : g.a, ai * g.a_ri + (second ? k - g.ksplit : k) * g.a_ck, g.a_f32);
}
template <class T> __device__ inline float dev_b(const DevGemm &g, int64_t bk, int64_t k, int64_t j) {
    const bool second = k >= g.ksplit;
    const int64_t kk = second ? k - g.ksplit : k;
    const int64_t r = g.b_rows ? bk : kk;
    return elem<T>(second ? g.b2 : g.b, r * (second ? g.b2_rk : g.b_rk) + j * g.b_cj, g.b_f32);
}

template <class T> __device__ inline void dev_epilogue(const DevGemm &g, int64_t i, int64_t j, float v) {
    if (j >= g.n) return;
    switch (g.epi) {
        case DevEpi::StoreGate: gate_store<T>(g.c, i * g.c_rs + j, g.c_f32, g.highest ? v : round_to<T>(v)); break;
        case DevEpi::BackwardGrad: {
            const int64_t at = i * g.ldr + j;
            const float z = gate_value<T>(g.rz, at, g.c_f32);
            UnitGrad ug{0.0f, 0.0f, 0.0f};
            if (relu_active(z)) {
                const float u = g.gated ? gate_value<T>(g.ru, at, g.c_f32) : 0.0f;
                ug = unit_grad<T>(z, u, v, g.gated, g.highest, g.l1_scale);
            }
            gate_store<T>(g.rz, at, g.c_f32, ug.dz);
            if (g.gated) gate_store<T>(g.ru, at, g.c_f32, ug.du);
            gate_store<T>(g.rh, at, g.c_f32, ug.h);
            break;
        }
        case DevEpi::ScatterRows: store_elem(static_cast<T *>(g.c), g.c_rows[i] * g.c_rs + j * g.c_cs, v); break;
        case DevEpi::StoreF32: static_cast<float *>(g.c)[i * g.c_rs + j] = v; break;
        case DevEpi::AccumF32: static_cast<float *>(g.c)[i * g.c_rs + j] += v; break;
    }
}

struct DevRange {
    int64_t m_beg, m_end, k_beg, k_end;
};
__device__ inline DevRange dev_range(const DevGemm &g) {
    const int64_t cnt = *g.dev_count;
    DevRange r{0, g.m, 0, g.k};
    if (g.m_dev) r.m_beg = g.first, r.m_end = min(cnt, g.m);
    if (g.k_dev) r.k_beg = g.first, r.k_end = min(cnt, g.k);
    return r;
}

/// Fills the A tile (kGm x kGk) and B tile (kGk x kGn) in shared memory through `put`, with
/// consecutive threads on the operand's contiguous dimension.
template <class T, class PutA, class PutB>
__device__ inline void dev_fill(const DevGemm &g, const DevRange &r, int64_t m0, int64_t n0, int64_t k0,
                                const int64_t *arow, const int64_t *brow, PutA &&put_a, PutB &&put_b) {
    const int tid = threadIdx.x;
    const bool a_k_fast = g.a_ck == 1;
    for (int e = tid; e < kGm * kGk; e += 256) {
        const int ri = a_k_fast ? e / kGk : e % kGm, kk = a_k_fast ? e % kGk : e / kGm;
        const int64_t k = k0 + kk;
        float v = 0.0f;
        if (arow[ri] >= 0 && k < r.k_end) v = dev_a<T>(g, arow[ri], k);
        put_a(ri, kk, v);
    }
    const bool b_k_fast = g.b_cj != 1;
    for (int e = tid; e < kGk * kGn; e += 256) {
        const int jj = b_k_fast ? e / kGk : e % kGn, kk = b_k_fast ? e % kGk : e / kGn;
        const int64_t k = k0 + kk, j = n0 + jj;
        float v = 0.0f;
        if (k < r.k_end && j < g.n && brow[kk] >= -1) v = dev_b<T>(g, brow[kk], k, j);
        put_b(kk, jj, v);
    }
    (void)m0;
}

template <class T>
__device__ inline void dev_rows(const DevGemm &g, const DevRange &r, int64_t m0, int64_t k0, int64_t *arow, int64_t *brow,
                                bool a_part) {
    const int tid = threadIdx.x;
    if (a_part && tid < kGm) {
        const int64_t i = m0 + tid;
        arow[tid] = i < r.m_end ? (g.a_rows ? g.a_rows[i] : i) : -1;
    }
    if (!a_part && tid < kGk) {
        const int64_t k = k0 + tid;
        brow[tid] = k < r.k_end ? (g.b_rows ? g.b_rows[k] : k) : -2;
    }
}

/// Tensor-core version (16-bit data): wmma 16x16x16 with fp32 accumulation, 8 warps of 32 x 32.
template <class T> __global__ void __launch_bounds__(256) dev_gemm_tc(DevGemm g) {
    using namespace nvcuda;
    constexpr int kLd = kGk + 8;
    constexpr size_t kAB = (kGm + kGn) * kLd * sizeof(T), kC = kGm * (kGn + 4) * sizeof(float);
    __shared__ __align__(32) unsigned char raw[kAB > kC ? kAB : kC];
    __shared__ int64_t arow[kGm], brow[kGk];
    T(*sa)[kLd] = reinterpret_cast<T(*)[kLd]>(raw);
    T(*sb)[kLd] = reinterpret_cast<T(*)[kLd]>(raw + kGm * kLd * sizeof(T));  // [j][k]: B col-major
    float(*sc)[kGn + 4] = reinterpret_cast<float(*)[kGn + 4]>(raw);
    const DevRange r = dev_range(g);
    if (r.k_end <= r.k_beg && g.k_dev) return;
    const int tid = threadIdx.x, warp = tid / 32, wm = warp / 4, wn = warp % 4;
    const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kGn;
    for (int64_t m0 = r.m_beg + static_cast<int64_t>(blockIdx.y) * kGm; m0 < r.m_end;
         m0 += static_cast<int64_t>(gridDim.y) * kGm) {
        __syncthreads();
        dev_rows<T>(g, r, m0, 0, arow, brow, true);
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
        for (int i = 0; i < 2; ++i)
            for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
        for (int64_t k0 = r.k_beg; k0 < r.k_end; k0 += kGk) {
            __syncthreads();
            dev_rows<T>(g, r, m0, k0, arow, brow, false);
            __syncthreads();
            dev_fill<T>(
                g, r, m0, n0, k0, arow, brow, [&](int i, int k, float v) { sa[i][k] = Value<T>::from_float(v); },
                [&](int k, int j, float v) { sb[j][k] = Value<T>::from_float(v); });
            __syncthreads();
            for (int kk = 0; kk < kGk; kk += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa[2];
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb[2];
                for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], &sa[wm * 32 + i * 16][kk], kLd);
                for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(fb[j], &sb[wn * 32 + j * 16][kk], kLd);
                for (int i = 0; i < 2; ++i)
                    for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
            }
        }
        __syncthreads();
        for (int i = 0; i < 2; ++i)
            for (int j = 0; j < 2; ++j)
                wmma::store_matrix_sync(&sc[wm * 32 + i * 16][wn * 32 + j * 16], acc[i][j], kGn + 4, wmma::mem_row_major);
        __syncthreads();
        for (int e = tid; e < kGm * kGn; e += 256) {
            const int ri = e / kGn, c = e % kGn;
            if (m0 + ri < r.m_end) dev_epilogue<T>(g, m0 + ri, n0 + c, sc[ri][c]);
        }
    }
}

/// fp32 version (fp32 data or HIGHEST_PRECISION): 4 x 8 outputs per thread.
template <class T> __global__ void __launch_bounds__(256) dev_gemm_f32(DevGemm g) {
    __shared__ float sa[kGk][kGm + 1];
    __shared__ float sb[kGk][kGn + 1];
    __shared__ int64_t arow[kGm], brow[kGk];
    const DevRange r = dev_range(g);
    if (r.k_end <= r.k_beg && g.k_dev) return;
    const int tid = threadIdx.x, tr = tid / 16, tc = tid % 16;
    const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kGn;
    for (int64_t m0 = r.m_beg + static_cast<int64_t>(blockIdx.y) * kGm; m0 < r.m_end;
         m0 += static_cast<int64_t>(gridDim.y) * kGm) {
        __syncthreads();
        dev_rows<T>(g, r, m0, 0, arow, brow, true);
        float acc[4][8] = {};
        for (int64_t k0 = r.k_beg; k0 < r.k_end; k0 += kGk) {
            __syncthreads();
            dev_rows<T>(g, r, m0, k0, arow, brow, false);
            __syncthreads();
            dev_fill<T>(
                g, r, m0, n0, k0, arow, brow, [&](int i, int k, float v) { sa[k][i] = v; },
                [&](int k, int j, float v) { sb[k][j] = v; });
            __syncthreads();
            for (int kk = 0; kk < kGk; ++kk) {
                float av[4], bv[8];
                for (int i = 0; i < 4; ++i) av[i] = sa[kk][tr * 4 + i];
                for (int j = 0; j < 8; ++j) bv[j] = sb[kk][tc + 16 * j];
                for (int i = 0; i < 4; ++i)
                    for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
            }
        }
        for (int i = 0; i < 4; ++i) {
            const int64_t row = m0 + tr * 4 + i;
            if (row >= r.m_end) continue;
            for (int j = 0; j < 8; ++j) dev_epilogue<T>(g, row, n0 + tc + 16 * j, acc[i][j]);
        }
    }
}

// ---- the cuBLAS part of the recompute: the first `cap` rows of the sorted dense list

/// X and dY rows of list positions [0, cap) compacted (zero rows past the count: their z = 0
/// makes every unit inactive, so they add nothing to the cuBLAS weight-gradient GEMMs).
template <class T> __global__ void gather_pair(MatrixArg x, MatrixArg dy, const int32_t *rows, const uint32_t *count,
                                               int64_t cap, int64_t d, int64_t dp, T *xc, T *dyc) {
    const int64_t n = min(static_cast<int64_t>(*count), cap);
    const T *xs = static_cast<const T *>(x.ptr), *ys = static_cast<const T *>(dy.ptr);
    for (int64_t i = blockIdx.x; i < cap; i += gridDim.x) {
        const int64_t r = i < n ? rows[i] : -1;
        for (int64_t k = threadIdx.x; k < dp; k += blockDim.x) {
            const bool in = r >= 0 && k < d;
            xc[i * dp + k] = in ? xs[r * x.rs + k * x.cs] : Value<T>::from_float(0.0f);
            dyc[i * dp + k] = in ? ys[r * dy.rs + k * dy.cs] : Value<T>::from_float(0.0f);
        }
    }
}

/// z, u, dh (cuBLAS outputs, value type) -> dz, du, h in place, as the BackwardGrad epilogue.
template <class T> __global__ void dense_grads(T *rz, T *ru, T *rh, int64_t cap, int64_t h, int64_t hp, bool gated,
                                               float l1_scale) {
    for (int64_t i = blockIdx.x; i < cap; i += gridDim.x)
        for (int64_t j = threadIdx.x; j < hp; j += blockDim.x) {
            const int64_t at = i * hp + j;
            const float z = Value<T>::to_float(rz[at]);
            UnitGrad ug{0.0f, 0.0f, 0.0f};
            if (j < h && relu_active(z))
                ug = unit_grad<T>(z, gated ? Value<T>::to_float(ru[at]) : 0.0f, Value<T>::to_float(rh[at]), gated, false,
                                  l1_scale);
            rz[at] = Value<T>::from_float(ug.dz);
            if (gated) ru[at] = Value<T>::from_float(ug.du);
            rh[at] = Value<T>::from_float(ug.h);
        }
}

/// dX rows of the first `cap` list positions: dZ Wg (+ dU Wu), fp32 from cuBLAS, rounded once.
template <class T> __global__ void scatter_sum(const float *a, const float *b, int64_t ld, const int32_t *rows,
                                               const uint32_t *count, int64_t cap, int64_t d, T *dx, int64_t rs, int64_t cs) {
    const int64_t n = min(static_cast<int64_t>(*count), cap);
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const int64_t r = rows[i];
        for (int64_t k = threadIdx.x; k < d; k += blockDim.x)
            dx[r * rs + k * cs] = Value<T>::from_float(a[i * ld + k] + (b ? b[i * ld + k] : 0.0f));
    }
}


template <class T> void launch_dev_gemm(cudaStream_t stream, const DevGemm &g, bool tensor_cores) {
    if (g.n == 0 || g.m == 0) return;
    const int tiles_n = ceil_div(g.n, kGn);
    const int row_blocks = ceil_div(g.m, kGm);
    const int grid_y = std::max(1, std::min(row_blocks, std::max(1, 4 * sm_count() / tiles_n)));
    const dim3 grid(static_cast<unsigned>(tiles_n), static_cast<unsigned>(grid_y));
    if constexpr (!std::is_same_v<T, float>) {
        if (tensor_cores) {
            dev_gemm_tc<T><<<grid, 256, 0, stream>>>(g);
            check_launch("dev_gemm_tc");
            return;
        }
    }
    dev_gemm_f32<T><<<grid, 256, 0, stream>>>(g);
    check_launch("dev_gemm_f32");
}

struct SavedView {
    const uint32_t *dense_count;
    const int32_t *count, *dense_rows;
    const uint16_t *idx;
    const void *g, *u;
};
SavedView saved_view(const FfnProblem &p, const void *saved) {
    const SavedLayout l = saved_layout(p);
    const auto *b = static_cast<const char *>(saved);
    return {reinterpret_cast<const uint32_t *>(b + l.words), reinterpret_cast<const int32_t *>(b + l.count),
            reinterpret_cast<const int32_t *>(b + l.dense_rows), reinterpret_cast<const uint16_t *>(b + l.idx),
            b + l.g, b + l.u};
}

bool vec_ok(const MatrixArg &mat, int64_t d) {
    return mat.cs == 1 && (mat.rs * static_cast<int64_t>(elem_bytes(mat.type))) % 16 == 0 &&
           reinterpret_cast<uintptr_t>(mat.ptr) % 16 == 0 && d % 8 == 0;
}

/// The recomputed rows (the forward's dense list): z, u and dh by GEMMs over their gathered X
/// and dY rows, dz, du, h in the dh GEMM's epilogue, then their dX rows and weight-gradient terms.
template <class T>
void recompute_rows(cudaStream_t stream, const FfnProblem &p, const FfnWeights &w, const SavedView &sv,
                    const BackwardArgs &b, const TrainScratch &s, int64_t first) {
    const bool f32 = gate_f32_of(p), tc = !f32;
    const int64_t ps = w.pair_stride;
    const T *wg = static_cast<const T *>(w.gate);  // Wg (gated) or Wu (plain), dp apart
    const T *pair = static_cast<const T *>(w.pair);
    const T *wd = pair + (p.gated ? p.dp : 0);
    DevGemm base{};
    base.dev_count = sv.dense_count;
    base.m_dev = true;
    base.first = first;  // list positions before it went through cuBLAS
    base.m = p.m;
    base.gated = p.gated;
    base.highest = p.highest;
    base.l1_scale = b.l1_scale;
    base.c_f32 = f32;
    base.ldr = p.hp;
    // z = X_r Wg^T, u = X_r Wu^T (rows gathered from X), stored in the gate type
    DevGemm z = base;
    z.a = z.a2 = b.x.ptr, z.a_f32 = b.x.type == TW_R_32F, z.a_ri = b.x.rs, z.a_ck = b.x.cs, z.a_rows = sv.dense_rows;
    z.b = z.b2 = wg, z.b_f32 = p.type == TW_R_32F, z.b_rk = z.b2_rk = 1, z.b_cj = p.dp;
    z.ksplit = p.d, z.n = p.h, z.k = p.d;
    z.epi = DevEpi::StoreGate, z.c = s.rz, z.c_rs = p.hp;
    launch_dev_gemm<T>(stream, z, tc);
    if (p.gated) {
        DevGemm u = z;
        u.b = u.b2 = pair, u.b_cj = ps, u.c = s.ru;
        launch_dev_gemm<T>(stream, u, tc);
    }
    // dh = dY_r Wd^T; the epilogue turns (z, u, dh) into dz, du, h
    DevGemm dh = z;
    dh.a = dh.a2 = b.dy.ptr, dh.a_ri = b.dy.rs, dh.a_ck = b.dy.cs;
    dh.b = dh.b2 = wd, dh.b_cj = ps;
    dh.epi = DevEpi::BackwardGrad, dh.rz = s.rz, dh.ru = s.ru, dh.rh = s.rh;
    launch_dev_gemm<T>(stream, dh, tc);
    // dX rows = [dZ | dU] [Wg ; Wu] (gated) or dZ Wu (plain), scattered to the rows' places
    DevGemm dx = base;
    dx.a = s.rz, dx.a2 = s.ru, dx.a_f32 = f32, dx.a_ri = p.hp, dx.a_ck = 1, dx.a_rows = nullptr;
    dx.b = wg, dx.b2 = pair, dx.b_f32 = p.type == TW_R_32F, dx.b_rk = p.dp, dx.b2_rk = ps, dx.b_cj = 1;
    dx.ksplit = p.h, dx.n = p.d, dx.k = p.gated ? 2 * p.h : p.h;
    dx.epi = DevEpi::ScatterRows, dx.c = b.dx.ptr, dx.c_rs = b.dx.rs, dx.c_cs = b.dx.cs, dx.c_rows = sv.dense_rows;
    launch_dev_gemm<T>(stream, dx, tc);
    // weight-gradient terms: dZ^T X_r, dU^T X_r, H^T dY_r (reduction over the device count)
    DevGemm dw = base;
    dw.m_dev = false, dw.k_dev = true;
    dw.m = p.h, dw.n = p.d, dw.k = p.m;
    dw.a_f32 = f32, dw.a_ri = 1, dw.a_ck = p.hp, dw.a_rows = nullptr;
    dw.b_f32 = b.x.type == TW_R_32F, dw.b_cj = b.x.cs, dw.b_rk = dw.b2_rk = b.x.rs, dw.b_rows = sv.dense_rows;
    dw.ksplit = p.m;
    dw.epi = first > 0 ? DevEpi::AccumF32 : DevEpi::StoreF32, dw.c_rs = p.dp;
    const int64_t plane = p.h * p.dp;
    dw.a = dw.a2 = s.rz, dw.b = dw.b2 = b.x.ptr, dw.c = s.dw_dense;
    launch_dev_gemm<T>(stream, dw, tc);
    if (p.gated) {
        dw.a = dw.a2 = s.ru, dw.c = s.dw_dense + plane;
        launch_dev_gemm<T>(stream, dw, tc);
    }
    dw.a = dw.a2 = s.rh, dw.c = s.dw_dense + 2 * plane;
    dw.b = dw.b2 = b.dy.ptr, dw.b_cj = b.dy.cs, dw.b_rk = dw.b2_rk = b.dy.rs;
    launch_dev_gemm<T>(stream, dw, tc);
}

template <class T> void launch_tokens(cudaStream_t stream, const TokenArgs<T> &a) {
    if (a.m == 0) return;
    constexpr int E = Chunk<T>::n;
    const size_t smem = static_cast<size_t>(a.dp) * sizeof(T);  // dY_t
    if (smem > 48 * 1024)
        check(cudaFuncSetAttribute(token_dh<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
              "cudaFuncSetAttribute");
    token_dh<T><<<static_cast<unsigned>(a.m), 32 * kDhWarps, smem, stream>>>(a);
    check_launch("token_dh");
    // blockIdx.x = token is the fast index: the grid runs slice by slice, so the slice of the
    // weight rows in use (2 x 5.8 MB at the paper's shape) stays in L2
    const dim3 grid(static_cast<unsigned>(a.m), static_cast<unsigned>(ceil_div(a.dp, int64_t{kDxThreads} * E)));
    token_dx<T><<<grid, kDxThreads, 0, stream>>>(a);
    check_launch("token_dx");
}

int key_bits(int64_t h) {
    int bits = 1;
    while ((int64_t{1} << bits) <= h) ++bits;
    return bits;
}

size_t row_sort_bytes(int64_t m, int bits) {
    size_t bytes = 0;
    check(cub::DeviceRadixSort::SortKeys(nullptr, bytes, static_cast<const int32_t *>(nullptr), static_cast<int32_t *>(nullptr),
                                         static_cast<int>(m), 0, bits),
          "cub::DeviceRadixSort (size)");
    return std::max<size_t>(bytes, 1);
}

size_t sort_temp_bytes(int64_t n, int bits) {
    size_t bytes = 0;
    check(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const uint32_t *>(nullptr), static_cast<uint32_t *>(nullptr),
                                          static_cast<const int32_t *>(nullptr), static_cast<int32_t *>(nullptr),
                                          static_cast<int>(n), 0, bits),
          "cub::DeviceRadixSort (size)");
    return std::max<size_t>(bytes, 1);
}

template <class T>
void backward(cudaStream_t stream, const FfnProblem &p, const FfnWeights &w, const void *saved, const BackwardArgs &b,
              const TrainScratch &s, int64_t first) {
    const SavedView sv = saved_view(p, saved);
    const SavedLayout l = saved_layout(p);
    const bool f32 = gate_f32_of(p);
    if (p.m > 0) {
        SavedView sorted = sv;
        sorted.dense_rows = s.rows_sorted;
        recompute_rows<T>(stream, p, w, sorted, b, s, first);
    }

    TokenArgs<T> ta{static_cast<const T *>(b.dy.ptr), b.dy.rs, b.dy.cs, vec_ok(b.dy, p.d), static_cast<T *>(b.dx.ptr),
                    b.dx.rs, b.dx.cs, vec_ok(b.dx, p.d), static_cast<const T *>(w.pair), w.pair_stride,
                    static_cast<const T *>(w.gate), p.dp, p.d, p.m, p.h, f32, p.gated, p.highest, b.l1_scale,
                    sv.idx, sv.g, sv.u, sv.count, l.ell, s.dz, s.du};
    launch_tokens<T>(stream, ta);

    const int64_t total = p.m * l.ell;
    const int bits = key_bits(p.h);
    if (total > 0) {
        slot_keys<<<std::max(1, std::min(4096, ceil_div(total, 256))), 256, 0, stream>>>(sv.idx, sv.count, p.m, l.ell, p.h,
                                                                                          s.keys, s.slots);
        check_launch("slot_keys");
        size_t temp = s.sort_bytes;
        check(cub::DeviceRadixSort::SortPairs(s.sort_temp, temp, s.keys, s.keys_sorted, s.slots, s.slots_sorted,
                                              static_cast<int>(total), 0, bits, stream),
              "cub::DeviceRadixSort");
    }
    unit_starts<<<std::max(1, std::min(4096, ceil_div(std::max<int64_t>(total, p.h + 1), 256))), 256, 0, stream>>>(
        s.keys_sorted, total, p.h, s.unit_start);
    check_launch("unit_starts");

    const MatrixArg &oz = p.gated ? b.dwg : b.dwu;
    UnitArgs<T> ua{static_cast<const T *>(b.x.ptr), b.x.rs, b.x.cs, vec_ok(b.x, p.d),
                   static_cast<const T *>(b.dy.ptr), b.dy.rs, b.dy.cs, vec_ok(b.dy, p.d),
                   s.unit_start, s.slots_sorted, l.ell, sv.g, sv.u, s.dz, s.du, f32, p.gated, p.highest,
                   s.dw_dense, sv.dense_count, p.dp, p.d, p.h,
                   static_cast<T *>(oz.ptr), oz.rs, oz.cs, vec_ok(oz, p.d),
                   static_cast<T *>(b.dwu.ptr), b.dwu.rs, b.dwu.cs, vec_ok(b.dwu, p.d),
                   static_cast<T *>(b.dwd.ptr), b.dwd.rs, b.dwd.cs, vec_ok(b.dwd, p.d)};
    if (p.h > 0 && p.d > 0) {
        const dim3 grid(static_cast<unsigned>(p.h), static_cast<unsigned>(ceil_div(p.dp, kUnitThreads * Chunk<T>::n)));
        backward_units<T><<<grid, kUnitThreads, 0, stream>>>(ua);
        check_launch("backward_units");
    }
}

template <class F> void by_type(twDataType_t t, F &&f) {
    switch (t) {
        case TW_R_16BF: f(__nv_bfloat16{}); break;
        case TW_R_16F: f(__half{}); break;
        default: f(float{}); break;
    }
}

}  // namespace

SavedLayout saved_layout(const FfnProblem &p) {
    WorkspaceCarver c(nullptr);
    SavedLayout l{};
    l.ell = std::min<int32_t>(kSavedEll, ffn_list_width(p));
    const size_t m = static_cast<size_t>(p.m), e = static_cast<size_t>(l.ell);
    auto at = [&](size_t bytes) {
        const size_t before = c.used();
        c.take<char>(bytes);
        return before;
    };
    l.header = at(sizeof(SavedHeader));
    l.words = at(2 * sizeof(uint32_t));
    l.count = at(m * 4);
    l.dense_rows = at(m * 4);
    l.idx = at(m * e * 2);
    l.g = at(m * e * gate_bytes(p));
    l.u = at(p.gated ? m * e * gate_bytes(p) : 0);
    l.total = c.used();
    return l;
}

void prepare_saved(cudaStream_t stream, const FfnProblem &p, void *saved, FfnScratch &s) {
    const SavedLayout l = saved_layout(p);
    char *b = static_cast<char *>(saved);
    const SavedHeader h{kSavedMagic, p.m, p.d, p.h, p.gated, static_cast<int32_t>(p.type), p.highest, l.ell};
    write_header<<<1, 1, 0, stream>>>(h, reinterpret_cast<SavedHeader *>(b + l.header));
    check_launch("write_header");
    s.header = reinterpret_cast<uint32_t *>(b + l.words);
    s.dense_count = s.header;
    s.count = reinterpret_cast<int32_t *>(b + l.count);
    s.dense_rows = reinterpret_cast<int32_t *>(b + l.dense_rows);
    s.idx = reinterpret_cast<uint16_t *>(b + l.idx);
    s.cap = l.ell;
    s.row_limit = l.ell;
    s.save_g = b + l.g;
    s.save_u = p.gated ? b + l.u : nullptr;
}

void ffn_rows_split(cudaStream_t stream, const FfnProblem &p, const FfnWeights &w, const MatrixArg &x,
                    const MatrixArg &y, const FfnScratch &s) {
    if (p.m == 0) return;
    by_type(p.type, [&](auto tag) {
        using T = decltype(tag);
        constexpr int E = Chunk<T>::n;
        FwdArgs<T> a{static_cast<const T *>(x.ptr), x.rs, x.cs, vec_ok(x, p.d), static_cast<T *>(y.ptr), y.rs, y.cs,
                     vec_ok(y, p.d), static_cast<const T *>(w.pair), w.pair_stride, p.dp, p.d, p.m, p.h, s.gate, s.ldg,
                     gate_f32_of(p), p.gated, p.highest, s.idx, s.count, s.cap, s.save_g, s.save_u, s.row_l1};
        const size_t smem = p.gated ? static_cast<size_t>(p.dp) * sizeof(T) : 0;
        if (smem > 48 * 1024)
            check(cudaFuncSetAttribute(fwd_u<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
                  "cudaFuncSetAttribute");
        fwd_u<T><<<static_cast<unsigned>(p.m), 32 * kDhWarps, smem, stream>>>(a);
        check_launch("fwd_u");
        const dim3 grid(static_cast<unsigned>(p.m), static_cast<unsigned>(ceil_div(p.dp, int64_t{kDxThreads} * E)));
        const size_t list_smem = static_cast<size_t>(s.cap) * (sizeof(int64_t) + sizeof(float));
        if (list_smem > 48 * 1024)
            check(cudaFuncSetAttribute(fwd_y<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(list_smem)),
                  "cudaFuncSetAttribute");
        fwd_y<T><<<grid, kDxThreads, list_smem, stream>>>(a);
        check_launch("fwd_y");
    });
}

void saved_all_rows_dense(cudaStream_t stream, const FfnProblem &p, void *saved) {
    const SavedLayout l = saved_layout(p);
    char *b = static_cast<char *>(saved);
    all_rows_dense<<<std::max(1, std::min(1024, ceil_div(p.m, 256))), 256, 0, stream>>>(
        reinterpret_cast<int32_t *>(b + l.count), reinterpret_cast<int32_t *>(b + l.dense_rows),
        reinterpret_cast<uint32_t *>(b + l.words), p.m);
    check_launch("all_rows_dense");
}

TrainScratch carve_train_scratch(void *workspace, const FfnProblem &p, size_t *bytes) {
    WorkspaceCarver c(workspace);
    TrainScratch s{};
    const int32_t ell = saved_layout(p).ell;
    const size_t n = static_cast<size_t>(p.m) * static_cast<size_t>(ell), gb = gate_bytes(p);
    s.keys = c.take<uint32_t>(n);
    s.keys_sorted = c.take<uint32_t>(n);
    s.slots = c.take<int32_t>(n);
    s.slots_sorted = c.take<int32_t>(n);
    s.sort_bytes = n > 0 ? sort_temp_bytes(static_cast<int64_t>(n), key_bits(p.h)) : 1;
    s.sort_temp = c.take<char>(s.sort_bytes);
    s.rows_key = c.take<int32_t>(static_cast<size_t>(p.m));
    s.rows_sorted = c.take<int32_t>(static_cast<size_t>(p.m));
    s.rows_bytes = p.m > 0 ? row_sort_bytes(p.m, key_bits(p.m)) : 1;
    s.rows_temp = c.take<char>(s.rows_bytes);
    s.unit_start = c.take<int32_t>(static_cast<size_t>(p.h) + 1);
    s.dz = c.take<char>(n * gb);
    s.du = c.take<char>(p.gated ? n * gb : 0);
    const size_t rows = static_cast<size_t>(p.m * p.hp) * gb;
    s.rz = c.take<char>(rows);
    s.ru = c.take<char>(p.gated ? rows : 0);
    s.rh = c.take<char>(rows);
    s.dw_dense = c.take<float>(static_cast<size_t>(3 * p.h * p.dp));
    if (!gate_f32_of(p)) {  // the cuBLAS part (16-bit DEFAULT only, as in the forward)
        s.lt_bytes = GemmRunner::kWorkspaceBytes;
        s.lt_workspace = c.take<char>(s.lt_bytes);
        s.xc = c.take<char>(static_cast<size_t>(p.m * p.dp) * 2);
        s.dyc = c.take<char>(static_cast<size_t>(p.m * p.dp) * 2);
        s.dxc = c.take<float>(static_cast<size_t>((p.gated ? 2 : 1) * p.m * p.dp));
    }
    if (bytes) *bytes = c.used();
    return s;
}

void backward_sort_dense(cudaStream_t stream, const FfnProblem &p, const void *saved, const TrainScratch &s) {
    if (p.m == 0) return;
    const SavedView sv = saved_view(p, saved);
    dense_row_keys<<<std::max(1, std::min(1024, ceil_div(p.m, 256))), 256, 0, stream>>>(sv.dense_rows, sv.dense_count, p.m,
                                                                                      s.rows_key);
    check_launch("dense_row_keys");
    size_t temp = s.rows_bytes;
    check(cub::DeviceRadixSort::SortKeys(s.rows_temp, temp, s.rows_key, s.rows_sorted, static_cast<int>(p.m), 0,
                                         key_bits(p.m), stream),
          "cub::DeviceRadixSort");
}

void backward_dense_gather(cudaStream_t stream, const FfnProblem &p, const void *saved, const BackwardArgs &b,
                           const TrainScratch &s, int64_t cap) {
    const SavedView sv = saved_view(p, saved);
    by_type(p.type, [&](auto t) {
        using T = decltype(t);
        gather_pair<T><<<static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(cap, 1024))), 256, 0, stream>>>(
            b.x, b.dy, s.rows_sorted, sv.dense_count, cap, p.d, p.dp, static_cast<T *>(s.xc), static_cast<T *>(s.dyc));
        check_launch("gather_pair");
    });
}

void backward_dense_grads(cudaStream_t stream, const FfnProblem &p, const TrainScratch &s, int64_t cap, float l1_scale) {
    by_type(p.type, [&](auto t) {
        using T = decltype(t);
        if constexpr (!std::is_same_v<T, float>) {
            dense_grads<T><<<static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(cap, 2048))), 256, 0, stream>>>(
                static_cast<T *>(s.rz), static_cast<T *>(s.ru), static_cast<T *>(s.rh), cap, p.h, p.hp, p.gated, l1_scale);
            check_launch("dense_grads");
        }
    });
}

void backward_dense_scatter(cudaStream_t stream, const FfnProblem &p, const void *saved, const BackwardArgs &b,
                            const TrainScratch &s, int64_t cap) {
    const SavedView sv = saved_view(p, saved);
    by_type(p.type, [&](auto t) {
        using T = decltype(t);
        scatter_sum<T><<<static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(cap, 1024))), 256, 0, stream>>>(
            s.dxc, p.gated ? s.dxc + cap * p.dp : nullptr, p.dp, s.rows_sorted, sv.dense_count, cap, p.d,
            static_cast<T *>(b.dx.ptr), b.dx.rs, b.dx.cs);
        check_launch("scatter_sum");
    });
}

void ffn_backward(cudaStream_t stream, const FfnProblem &p, const FfnWeights &w, const void *saved,
                  const BackwardArgs &b, const TrainScratch &s, int64_t first) {
    by_type(p.type, [&](auto t) { backward<decltype(t)>(stream, p, w, saved, b, s, first); });
}

}  // namespace twblas::cuda
