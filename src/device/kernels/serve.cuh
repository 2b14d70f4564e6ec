// The serving path (up to the plan's serve_max_tokens, 16-bit weights or their FP8 rows): two
// launches joined by
// programmatic dependent launch, so that the second one's start hides behind the first one's end.
// Up to the plan's serve_gate tokens (16, or 8 for large gates):
//   serve_gate    the gate on tensor cores, streaming Wg once (a block per 8 units, its warps
//                 splitting K); its epilogue writes g of the active units (0 elsewhere) and one
//                 byte per token of the active-unit words, then h = g (x_t . Wu_j) over g for the
//                 active pairs, each Wu row read once (serve_gate_rows: the same for the plan's
//                 gate_rows tokens, 2 by default, on CUDA cores with a
//                 warp a weight row);
//   serve_down    y by slices of 256 columns: a block per (slice, token) walks the token's mask
//                 words and adds h_tj Wd_j over its active units; its slice-0 blocks also count the
//                 rows and the last of them finishes the statistics.
// More tokens: cuBLAS's gate GEMM, then
//   serve_token   a block per (column split, token) lists the token's active units from its gate
//                 row, forms their h with a warp per unit and adds h_tj Wd_j over its columns;
//                 split 0 counts the row;
//   serve_stats   one warp reduces the rows' statistics and publishes them (no ticket, so no
//                 memset node before the gate GEMM).
// TW_COMPUTE_FP8_WEIGHTS: the same kernels' FP8 instances read Wu_j and Wd_j from the FP8 copy
// (ServeRows, DownChunk), with the two-pass FP8 kernels' scaling and rounding.
// Deterministic everywhere: fixed orders, no floating-point atomics. Every row goes through the
// gathers, however many units it has, so no row takes a dense path here (rows too dense for
// gathers to pay are what dense mode, chosen from the statistics, is for).
#pragma once

#include <cute/arch/mma_sm80.hpp>

#include "common/async_copy.cuh"
#include "common/dependent_launch.cuh"
#include "common/values.cuh"
#include "common/warp.cuh"
#include "kernels/finalize.cuh"
#include "kernels/fp8_rows.cuh"
#include "kernel_limits.hpp"

namespace twblas::cuda {

template <class T> struct ServeArgs {
    const T *x;
    int64_t x_rs;  // row-major, 16-byte aligned rows (the path requires it)
    int m;
    int64_t d, dp, h;
    const T *wgate;  // H rows, wgate_ld apart, zero padded
    int64_t wgate_ld;
    const T *up;     // Wu rows (gated; NULL for a plain FFN), up_ld apart
    int64_t up_ld;
    const T *down;   // Wd rows, down_ld apart
    int64_t down_ld;
    Fp8Rows fp8;  // TW_COMPUTE_FP8_WEIGHTS: the same rows as FP8 (the serving kernels' FP8 instances)
    bool gated, write_h;
    T *gate;  // M x ldg: g of the active units, 0 elsewhere; h over g when write_h
    int64_t ldg;
    uint32_t *masks;  // M x words: bit b of word w of token t: unit 32 w + b is active
    int64_t words;
    uint32_t *ticket;  // the grid's last-block ticket (serve_finish_row), zeroed before the grid; null:
                       // serve_stats, launched after serve_token, reduces and publishes instead
    unsigned long long *neuron_counts;
    T *y;
    int64_t y_rs, y_cs;
    int tile, slots, row_limit;
    int32_t *count, *row_nnz;
    float *row_l1;
    FfnStatsBlock *stats;
    FfnFeedback *publish;
    int down_groups;  // serve_down's blocks a (slice, token) (the plan's serve.down_groups)
    float *parts, *part_l1;  // with groups: the blocks' partial rows, l1, units and flags
    int32_t *part_nnz, *part_over;
    uint32_t *down_tickets;  // a ticket a (slice, token), zeroed by serve_gate
};

// Fixed choices of the kernels' code (docs/performance-notes.md has their measurements; as
// run-time switches inside serve_gate's load loop they cost 0.5 us a call at 1 to 64 tokens):
// serve_gate's weight loads carry an L2 256-byte fetch hint, and the serving kernels prefetch to
// L2 the Wd rows they read next.
constexpr bool kServeGateFetch256 = true;
constexpr bool kServePrefetchDown = true;

template <class T> struct MmaOf;
template <> struct MmaOf<__nv_bfloat16> {
    using Op = cute::SM80_16x8x16_F32BF16BF16F32_TN;
};
template <> struct MmaOf<__half> {
    using Op = cute::SM80_16x8x16_F32F16F16F32_TN;
};

/// x[token][k0, k0 + 8) of a row-major x, zeros past d.
template <class T> __device__ inline uint4 serve_x_chunk(const T *row, int64_t k0, int64_t d) {
    if (k0 + 8 <= d) return *reinterpret_cast<const uint4 *>(row + k0);
    T tmp[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) tmp[e] = k0 + e < d ? row[k0 + e] : Value<T>::from_float(0.0f);
    return *reinterpret_cast<const uint4 *>(tmp);
}

__device__ inline uint32_t word_of(const uint4 &v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/// The active units among a gate row's 16-byte chunk of 8 values (units u0 to u0 + 7; those at or
/// past h are not units): bit e for unit u0 + e.
template <class T> __device__ inline uint32_t chunk_active_bits(const uint4 &v, int64_t u0, int64_t h) {
    uint32_t bits = 0;
#pragma unroll
    for (int e = 0; e < Chunk<T>::n; ++e) bits |= static_cast<uint32_t>(u0 + e < h && relu_active(Chunk<T>::get(v, e))) << e;
    return bits;
}

/// The chunk with the values of its inactive units (bits clear) set to +0, for a gate buffer that
/// becomes the hidden output: each 32-bit word's halves (values 2i, 2i + 1) kept by their own bit.
__device__ inline uint4 keep_active(const uint4 &v, uint32_t bits) {
    auto keep = [&](uint32_t word, int i) {
        return word & ((bits >> (2 * i) & 1u ? 0xffffu : 0u) | (bits >> (2 * i + 1) & 1u ? 0xffff0000u : 0u));
    };
    return make_uint4(keep(v.x, 0), keep(v.y, 1), keep(v.z, 2), keep(v.w, 3));
}

/// x_t . w over a row of dp values (zero padded past d), by a warp: U 16-byte chunks of each per
/// lane in flight at a time; the lanes' sums added by a butterfly (a fixed order).
template <class T, int U = 4>
__device__ inline float serve_row_dot(const T *w, const T *xrow, int64_t d, int64_t dp, int lane) {
    constexpr int E = Chunk<T>::n;
    float part = 0.0f;
    for (int64_t k00 = static_cast<int64_t>(lane) * E; k00 < dp; k00 += 32 * E * U) {
        uint4 wv[U], xv[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int64_t k0 = k00 + static_cast<int64_t>(u) * 32 * E;
            const bool ok = k0 < dp;  // dp is a multiple of 8: whole chunks
            wv[u] = ok ? __ldg(reinterpret_cast<const uint4 *>(w + k0)) : make_uint4(0, 0, 0, 0);
            xv[u] = ok ? serve_x_chunk(xrow, k0, d) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int e = 0; e < E; ++e) part = fmaf(Chunk<T>::get(xv[u], e), Chunk<T>::get(wv[u], e), part);
    }
    return warp_sum(part);
}

/// serve_row_dot over an FP8 row of `half` bytes (zero padded past d; kernels/fp8_rows.cuh),
/// unscaled: 16 values (one 16-byte load) a lane at a time, U loads in flight.
template <class T, int U = 2>
__device__ inline float serve_row_dot_fp8(const uint8_t *q, const T *xrow, int64_t d, int64_t half, int lane) {
    float part = 0.0f;
    for (int64_t k00 = static_cast<int64_t>(lane) * 16; k00 < half; k00 += 32 * 16 * U) {
        uint4 wv[U], xa[U], xb[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int64_t k0 = k00 + static_cast<int64_t>(u) * 32 * 16;
            const bool ok = k0 < half;  // half is a multiple of 16: whole loads
            wv[u] = ok ? __ldg(reinterpret_cast<const uint4 *>(q + k0)) : make_uint4(0, 0, 0, 0);
            xa[u] = ok ? serve_x_chunk(xrow, k0, d) : make_uint4(0, 0, 0, 0);
            xb[u] = ok ? serve_x_chunk(xrow, k0 + 8, d) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            float w[16];
            fp8x16_to_float(wv[u], w);
#pragma unroll
            for (int e = 0; e < 8; ++e) part = fmaf(Chunk<T>::get(xa[u], e), w[e], part);
#pragma unroll
            for (int e = 0; e < 8; ++e) part = fmaf(Chunk<T>::get(xb[u], e), w[8 + e], part);
        }
    }
    return warp_sum(part);
}

/// Where the serving kernels read a unit's rows: the 16-bit up and down rows, or (FP8) the FP8
/// copy, in bytes. Unit j's up row starts at up_row(j) (gated FFNs), its down row at down_row(j).
template <class T, bool FP8>
struct ServeRows {
    const uint8_t *up, *down;
    int64_t up_stride, down_stride;
    __device__ explicit ServeRows(const ServeArgs<T> &a)
        : up(FP8 ? a.fp8.q : reinterpret_cast<const uint8_t *>(a.up)),
          down(FP8 ? a.fp8.q + (a.gated ? a.fp8.half : 0) : reinterpret_cast<const uint8_t *>(a.down)),
          up_stride(FP8 ? a.fp8.stride : a.up_ld * static_cast<int64_t>(sizeof(T))),
          down_stride(FP8 ? a.fp8.stride : a.down_ld * static_cast<int64_t>(sizeof(T))) {}
    __device__ const uint8_t *up_row(int64_t j) const { return up + j * up_stride; }
    __device__ const uint8_t *down_row(int64_t j) const { return down + j * down_stride; }
    /// Bytes of the down half that hold `values` columns.
    static __device__ constexpr int64_t bytes(int64_t values) {
        return FP8 ? values : values * static_cast<int64_t>(sizeof(T));
    }
    /// x_t . Wu_j (FP8: times s_u): the up dot of serve_gate's epilogue.
    __device__ float up_dot(const ServeArgs<T> &a, int64_t j, const T *xrow, int lane) const {
        if constexpr (FP8)
            return a.fp8.scale[j].x * serve_row_dot_fp8<T>(up_row(j), xrow, a.d, a.fp8.half, lane);
        else
            return serve_row_dot(reinterpret_cast<const T *>(up_row(j)), xrow, a.d, a.dp, lane);
    }
    /// The down half of row j asked of L2, a 128-byte line a lane.
    __device__ void prefetch_down(int64_t j, int64_t from, int64_t to, int lane) const {
        for (int64_t k = bytes(from) + lane * 128; k < bytes(to); k += 32 * 128)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(down_row(j) + k));
    }
};

/// Eight columns of a unit's down row as fp32: 16 bytes of 16-bit values, or 8 of FP8.
template <class T, bool FP8>
struct DownChunk {
    using Raw = std::conditional_t<FP8, uint2, uint4>;
    /// Chunk c (columns 8 c to 8 c + 7) of the down half that starts at `row`.
    static __device__ inline Raw load(const uint8_t *row, int64_t c) {
        return __ldg(reinterpret_cast<const Raw *>(row + c * static_cast<int64_t>(sizeof(Raw))));
    }
    static __device__ inline void to_float(const Raw &w, float (&v)[8]) {
        if constexpr (FP8) {
            fp8x8_to_float(w, v);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) v[e] = Chunk<T>::get(w, e);
        }
    }
};

// ---- serve_gate's tile product: z[u][i] = x_i . w_u for one tile of 8 weight
// rows and up to 8 R token rows, on tensor cores. Tokens are the MMA's rows, the tile's units its
// 8 columns. The K order of a dot product does not change its value, so each lane loads 8
// consecutive k (16 bytes) of its unit's weight row and of its tokens' x and feeds them to the MMA
// in the fragment slots of k = 2q, 2q + 1, 2q + 8, 2q + 9: weights and x go straight from memory
// into registers. The W warps split K (a fixed choice: it sets the order of the sum).
constexpr int kServeGateUnits = 8, kServeGateWarps = 4;

template <int R> struct TileDots {
    static constexpr int MT = (R + 1) / 2, NTOK = 16 * MT;  // 16-token MMA tiles
    float red[kServeGateWarps][MT][4][32];
    float z[kServeGateUnits][NTOK + 1];
};

/// Lane l of every warp: weight row `wrow` of unit l / 4 (`wok` false: zeros, nothing loaded) and
/// x rows `xrow[r]` of tokens l / 4 + 8 r (`xok`). U chunks of 32 k in flight per lane, as a
/// rolling pipeline (each slot reloaded as soon as it is used: loading U, then using U, left the
/// memory idle while the warp waited). Ends with sh.z complete for the block.
template <class T, int R, int U>
__device__ inline void serve_tile_dots(const T *wrow, bool wok, const T *const (&xrow)[R], const bool (&xok)[R], int64_t d,
                                       int64_t dp, TileDots<R> &sh) {
    constexpr int W = kServeGateWarps, MT = TileDots<R>::MT;
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, q = lane & 3;
    float acc[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[mt][i] = 0.0f;
    const int64_t chunks = (dp + 31) / 32;
    using Mma = typename MmaOf<T>::Op;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    uint4 bv[U], av[U][R];
    auto load = [&](int u, int64_t c) {
        const int64_t k0 = c * 32 + q * 8;
        const bool kok = k0 < dp;  // dp is a multiple of 8: whole 16-byte chunks
        bv[u] = !(kok && wok)                  ? zero
                : kServeGateFetch256    ? load_stream_256(wrow + k0)
                                        : __ldcs(reinterpret_cast<const uint4 *>(wrow + k0));
#pragma unroll
        for (int r = 0; r < R; ++r) av[u][r] = kok && xok[r] ? serve_x_chunk(xrow[r], k0, d) : zero;
    };
#pragma unroll
    for (int u = 0; u < U; ++u) load(u, warp + u * W);
    for (int64_t c0 = warp; c0 < chunks; c0 += W * U) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
#pragma unroll
            for (int s = 0; s < 2; ++s)  // words 2s, 2s + 1 of each chunk: one k16 step
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    const uint4 &lo = av[u][2 * mt];                              // tokens 16 mt + g
                    const uint4 &hi = 2 * mt + 1 < R ? av[u][2 * mt + 1] : zero;  // tokens 16 mt + g + 8
                    Mma::fma(acc[mt][0], acc[mt][1], acc[mt][2], acc[mt][3], word_of(lo, 2 * s), word_of(hi, 2 * s),
                             word_of(lo, 2 * s + 1), word_of(hi, 2 * s + 1), word_of(bv[u], 2 * s),
                             word_of(bv[u], 2 * s + 1), acc[mt][0], acc[mt][1], acc[mt][2], acc[mt][3]);
                }
            load(u, c0 + (u + U) * W);
        }
    }
    // the warps' K parts summed in warp order
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < 4; ++i) sh.red[warp][mt][i][lane] = acc[mt][i];
    __syncthreads();
    for (int e = threadIdx.x; e < MT * 4 * 32; e += blockDim.x) {
        const int l = e & 31, i = (e >> 5) & 3, mt = e >> 7;
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < W; ++w) v += sh.red[w][mt][i][l];
        // accumulator i of lane l: token 16 mt + l / 4 (+ 8 for i >= 2), unit 2 (l % 4) + i % 2
        sh.z[2 * (l & 3) + (i & 1)][16 * mt + (l >> 2) + (i >> 1) * 8] = v;
    }
    __syncthreads();
}

// ---- serve_gate: Z = X Wg^T for up to 8 R tokens and one tile of 8 units per block, so that the
// H / 8 blocks share the SMs evenly (with 32-unit blocks, 176 at the paper's shape, a third of the
// SMs streamed two blocks and the rest one: 1.7 TB/s). The epilogue writes g of the active units
// (0 elsewhere), the tile's byte of each token's active-unit word, and then h = g (x_t . Wu_j)
// over g for the active pairs, each Wu row read once for the tokens that use it.

/// What every serve_gate instance does first: lets serve_down start its blocks once every block of
/// this grid has started (the rule of common/dependent_launch.cuh: serve_down waits for this
/// grid's end and its writes before it reads anything of it; measured on an H100 against the
/// trigger at the end: the same times within 1.5 %, M = 1 to 128, both shapes), zeroes the tickets
/// serve_down counts on, and clears the tile's sets (serve_gate's tokens of each unit,
/// serve_gate_rows's units of each token; visible after the mainloop's barrier).
template <class T> __device__ inline void serve_gate_start(const ServeArgs<T> &a, uint32_t *tile_sets) {
    allow_dependent_launch();
    if (a.ticket && blockIdx.x == 0 && threadIdx.x == 0) *a.ticket = 0;  // serve_down waits for this grid first
    if (a.down_groups > 1 && threadIdx.x == 0) {  // serve_down's (slice, token) tickets, likewise
        const int64_t tickets = (a.dp + kServeDownCols - 1) / kServeDownCols * a.m;
        for (int64_t i = blockIdx.x; i < tickets; i += gridDim.x) a.down_tickets[i] = 0;
    }
    if (threadIdx.x < kServeGateUnits) tile_sets[threadIdx.x] = 0;
}

/// serve_gate's epilogue, by W warps, once z[u][t] (unit unit0 + u, token t) is complete for the
/// block's tile: g of the active units (0 elsewhere), the tile's byte of each token's active-unit
/// word and the counts, then h = g (x_t . Wu_j) over g for the active pairs, a warp per unit.
template <class T, int W, bool FP8, class Z>
__device__ inline void serve_gate_finish(const ServeArgs<T> &a, const Z &z, uint32_t *unit_tokens) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int64_t unit0 = static_cast<int64_t>(blockIdx.x) * kServeGateUnits;
    // a warp per token, a lane per unit (lanes 0 to 7)
    const int64_t unit = unit0 + lane;
    const bool mine = lane < kServeGateUnits && unit < a.h;
    unsigned fired = 0;
    for (int t = warp; t < a.m; t += W) {
        const float gv = mine ? round_to<T>(z[lane][t]) : 0.0f;
        const bool on = mine && relu_active(gv);
        const unsigned mask = __ballot_sync(kFullMask, on);
        if (mine) a.gate[t * a.ldg + unit] = Value<T>::from_float(on ? gv : 0.0f);
        // the tile's byte of word blockIdx.x / 4 (words are little-endian: byte i holds units 8 i to 8 i + 7)
        if (lane == 0) reinterpret_cast<uint8_t *>(a.masks + t * a.words)[blockIdx.x] = static_cast<uint8_t>(mask);
        if (on) atomicOr(&unit_tokens[lane], 1u << t);
        fired += on;
    }
    if (a.neuron_counts && fired) atomicAdd(a.neuron_counts + unit, static_cast<unsigned long long>(fired));
    if (a.gated) {
        __syncthreads();
        const uint32_t tokens_of_lane = lane < kServeGateUnits ? unit_tokens[lane] : 0u;
        int rank = 0;
        for (unsigned units = __ballot_sync(kFullMask, tokens_of_lane != 0); units; units &= units - 1, ++rank) {
            if (rank % W != warp) continue;
            const int b = __ffs(units) - 1;
            const int64_t j = unit0 + b;
            const ServeRows<T, FP8> rows(a);
            // serve_down reads Wd_j next, from other SMs: start bringing it to L2 now
            if (kServePrefetchDown) rows.prefetch_down(j, 0, a.dp, lane);
            for (uint32_t toks = unit_tokens[b]; toks; toks &= toks - 1) {
                const int t = __ffs(toks) - 1;
                const float dot = rows.up_dot(a, j, a.x + t * a.x_rs, lane);
                const float h = round_to<T>(round_to<T>(z[b][t]) * round_to<T>(dot));
                if (lane == 0) a.gate[t * a.ldg + j] = Value<T>::from_float(h);
            }
        }
    }
}

template <class T, int R, int U, bool FP8 = false>
__global__ void __launch_bounds__(32 * kServeGateWarps, 6) serve_gate(ServeArgs<T> a) {
    // R x rows per lane (tokens g + 8 r); at least six blocks per SM (<= 85 registers) so that
    // the H / 8 blocks run in one wave
    __shared__ TileDots<R> sh;
    __shared__ uint32_t unit_tokens[kServeGateUnits];  // bit t: token t uses the unit (M <= 32 here)
    serve_gate_start(a, unit_tokens);
    const int g = (threadIdx.x & 31) >> 2;
    const int64_t unit0 = static_cast<int64_t>(blockIdx.x) * kServeGateUnits;
    const bool wok = unit0 + g < a.h;
    const T *wrow = a.wgate + (wok ? unit0 + g : 0) * a.wgate_ld;
    const T *xrow[R];
    bool xok[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int token = g + 8 * r;
        xok[r] = token < a.m;
        xrow[r] = a.x + (xok[r] ? token : 0) * a.x_rs;
    }
    serve_tile_dots<T, R, U>(wrow, wok, xrow, xok, a.d, a.dp, sh);
    serve_gate_finish<T, kServeGateWarps, FP8>(a, sh.z, unit_tokens);
}

// ---- serve_gate_rows: serve_gate for up to kServeGateRowsMaxTokens tokens on CUDA cores, the same
// grid and outputs: a warp per unit of the tile streams the unit's whole weight row, each load
// 512 contiguous bytes of it (serve_gate's fragment loads take 64 bytes of each of 8 rows), M
// products a value, x from shared memory (staged once a block, its requests issued before the
// weight loads: x read through L1 chunk by chunk left each product waiting on its load, and the
// kernel slower than serve_gate). Each warp then finishes its own unit, up dot included, without
// waiting for the rest of the block. Faster than serve_gate at one and two tokens
// (docs/performance-notes.md, serve_gate_rows_max_tokens).
/// 16-byte chunks of an x row the serving kernels stage in shared memory: dp <= 8192 (max_model_dim).
constexpr int kServeMaxChunks = 1024;

template <class T, int M, bool FP8 = false>
__global__ void __launch_bounds__(32 * kServeGateUnits, 4) serve_gate_rows(ServeArgs<T> a) {
    constexpr int E = Chunk<T>::n, L = 8;    // values a chunk; chunks in flight a lane
    __shared__ uint4 xs[M][kServeMaxChunks];  // the tokens' x rows, read once a block for its 8 warps
    static_assert(M <= kServeGateUnits, "serve_gate_start clears a word of tile_bits a token");
    __shared__ uint32_t tile_bits[kServeGateUnits];  // bit w of word t: the tile's unit w is active on token t
    serve_gate_start(a, tile_bits);
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int64_t unit = static_cast<int64_t>(blockIdx.x) * kServeGateUnits + warp;
    const bool wok = unit < a.h;
    const T *wrow = a.wgate + (wok ? unit : 0) * a.wgate_ld;
    const int64_t chunks = a.dp / E;  // dp is a multiple of 8: whole chunks
    uint4 wv[L];
    auto load = [&](int64_t c00) {
#pragma unroll
        for (int i = 0; i < L; ++i) {
            const int64_t c = c00 + i * 32;
            wv[i] = wok && c < chunks ? __ldcs(reinterpret_cast<const uint4 *>(wrow) + c) : make_uint4(0, 0, 0, 0);
        }
    };
    // x staged by cp.async requests issued before the weight loads, so that they do not queue behind
    // the weight stream (whole chunks; the partial last one and those past d or M by the threads);
    // FP8 up rows are `half` values long, zeros past d
    const uint64_t keep = l2_keep_policy();
    const int64_t staged = FP8 && a.gated ? max(chunks, a.fp8.half / E) : chunks;
    for (int64_t c = threadIdx.x; c < staged; c += blockDim.x)
#pragma unroll
        for (int t = 0; t < M; ++t) {
            if (t < a.m && (c + 1) * E <= a.d)
                cp_async16(&xs[t][c], a.x + t * a.x_rs + c * E, keep);
            else
                xs[t][c] = t < a.m ? serve_x_chunk(a.x + t * a.x_rs, c * E, a.d) : make_uint4(0, 0, 0, 0);
        }
    cp_async_commit();
    int64_t c00 = lane;
    load(c00);
    cp_async_wait<0>();
    __syncthreads();
    float acc[M];
#pragma unroll
    for (int t = 0; t < M; ++t) acc[t] = 0.0f;
    for (;;) {
#pragma unroll
        for (int i = 0; i < L; ++i) {
            const int64_t c = c00 + i * 32;
            if (c >= chunks) break;
#pragma unroll
            for (int t = 0; t < M; ++t) {
                const uint4 xv = xs[t][c];
#pragma unroll
                for (int e = 0; e < E; ++e) acc[t] = fmaf(Chunk<T>::get(xv, e), Chunk<T>::get(wv[i], e), acc[t]);
            }
        }
        c00 += 32 * L;
        if (c00 >= chunks) break;
        load(c00);
    }
    // the epilogue of serve_gate_finish, by the warp that formed its unit's z and at once: g of an
    // active unit (0 elsewhere), the counts, and for a gated FFN h = g (x_t . Wu_j) with x from shared
    // memory, the up row's loads issued with no barrier before them; the tile's mask bytes after the
    // one barrier at the end
    float g[M];
    bool on[M];
    unsigned fired = 0;
#pragma unroll
    for (int t = 0; t < M; ++t) {
        g[t] = round_to<T>(warp_sum(acc[t]));  // every lane has the sum
        on[t] = wok && t < a.m && relu_active(g[t]);
        // an active unit of a gated FFN stores its h below instead
        if (lane == 0 && wok && t < a.m && !(a.gated && on[t]))
            a.gate[t * a.ldg + unit] = Value<T>::from_float(on[t] ? g[t] : 0.0f);
        if (lane == 0 && on[t]) atomicOr(&tile_bits[t], 1u << warp);
        fired += on[t];
    }
    if (lane == 0 && a.neuron_counts && fired) atomicAdd(a.neuron_counts + unit, static_cast<unsigned long long>(fired));
    if (a.gated && fired) {
        const ServeRows<T, FP8> rows(a);
        // serve_down reads Wd_j next, from other SMs: start bringing it to L2 now
        if (kServePrefetchDown) rows.prefetch_down(unit, 0, a.dp, lane);
#pragma unroll
        for (int t = 0; t < M; ++t) {
            if (!on[t]) continue;
            float dot;
            if constexpr (FP8)
                dot = a.fp8.scale[unit].x * warp_row_dot_fp8<T>(xs[t], rows.up_row(unit), static_cast<int>(a.fp8.half / E));
            else
                dot = warp_row_dot<T>(xs[t], reinterpret_cast<const T *>(rows.up_row(unit)), static_cast<int>(chunks));
            const float h = round_to<T>(g[t] * round_to<T>(dot));
            if (lane == 0) a.gate[t * a.ldg + unit] = Value<T>::from_float(h);
        }
    }
    __syncthreads();
    if (threadIdx.x < M && threadIdx.x < a.m)
        reinterpret_cast<uint8_t *>(a.masks + threadIdx.x * a.words)[blockIdx.x] = static_cast<uint8_t>(tile_bits[threadIdx.x]);
}

/// Mask word w of token t from a cuBLAS gate row (past serve_gate's tokens): bit b set
/// when unit 32 w + b is active. With `record` it counts each active unit, and zeroes the inactive
/// ones when the gate buffer becomes the hidden output (serve_gate's epilogue does both on its path).
template <class T>
__device__ inline uint32_t serve_mask_from_gate(const ServeArgs<T> &a, int64_t t, int64_t w, bool record = true) {
    constexpr int E = Chunk<T>::n;  // 8: four chunks per word
    T *row = a.gate + t * a.ldg;
    uint4 v[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {  // ldg is a multiple of 8: whole chunks up to it
        const int64_t u0 = w * 32 + c * E;
        v[c] = u0 < a.ldg ? __ldcg(reinterpret_cast<const uint4 *>(row + u0)) : make_uint4(0, 0, 0, 0);
    }
    uint32_t bits = 0;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        const int64_t u0 = w * 32 + c * E;
        const uint32_t chunk_bits = chunk_active_bits<T>(v[c], u0, a.h);
        bits |= chunk_bits << (c * E);
        if (record && a.write_h && u0 < a.ldg && chunk_bits != 0xffu)
            *reinterpret_cast<uint4 *>(row + u0) = keep_active(v[c], chunk_bits);
    }
    if (record && a.neuron_counts)
        for (uint32_t b = bits; b; b &= b - 1) atomicAdd(a.neuron_counts + w * 32 + __ffs(b) - 1, 1ull);
    return bits;
}

/// The end of serve_down and serve_token, by a token's counting block: thread 0 stores the
/// row's l1, units and count entry (row_count_code); the grid's last such block (a ticket:
/// release, then acquire) reduces and publishes the statistics with one warp, or, for one
/// token, thread 0 publishes them from its registers (a read-back round trip fewer at M = 1).
/// Every thread calls it; the row's values matter in thread 0 only.
template <bool kPast32Rows, class T>
__device__ inline void serve_finish_row(const ServeArgs<T> &a, int64_t t, int32_t nnz, bool over, float row_l1,
                                        const PublishInputs &early) {
    __shared__ bool last;
    if (threadIdx.x == 0) {
        const int32_t code = row_count_code(nnz, over, a.row_limit);
        a.row_l1[t] = row_l1;
        a.row_nnz[t] = nnz;
        a.count[t] = code;
        last = false;
        if (!a.ticket) {        // serve_stats publishes
        } else if (a.m == 1) {  // decode's one row: its statistics from registers, nothing read back
            publish_statistics(FfnDeviceStats{1, nnz, nnz, code == -1, code < 0, row_l1}, a.stats, a.publish, early);
        } else {  // the other tokens' blocks write theirs
            __threadfence();
            last = atomicAdd(a.ticket, 1u) == static_cast<unsigned>(a.m - 1);
            if (last) __threadfence();
        }
    }
    if (!a.ticket || a.m == 1) return;  // no ticket taken: no block-wide verdict to wait for
    __syncthreads();
    if (last && threadIdx.x < 32)
        reduce_and_publish_statistics_warp<kPast32Rows>(a.m, a.row_nnz, a.count, a.row_l1, a.stats, a.publish, early);
}

/// The start of serve_down and serve_token: a counting block's thread 0 loads what publishing the
/// statistics reads of their block into `early` before the wait (its latency hidden;
/// serve_finish_row takes it), then every thread waits for the previous grid's h, masks and zeroed
/// ticket. Without a ticket (serve_stats publishes) none of it is needed or loaded. `early` is a
/// register copy or a shared one, whichever the kernel's registers afford.
template <class T> __device__ inline void serve_down_start(const ServeArgs<T> &a, bool counts_row, PublishInputs &early) {
    if (counts_row && a.ticket != nullptr && threadIdx.x == 0) early = load_publish_inputs(a.stats);
    wait_for_prior_grid();
}

// ---- serve_down: y_t = sum over the active units j of h_tj Wd_j, by column slices: a block per
// (slice of 256 columns, token, group), its warps dealt ranges of the group's mask words; a unit's
// Wd slice is one 16-byte chunk per lane. The warps' sums are added in warp order. With one group
// (the plan's down_groups) the block writes y and no partial rows or split sums are needed; with
// more (rows of hundreds of units: each group's warps chain fewer batches of loads) the groups
// take whole TwELL tiles of words each, write partial rows, and the last of a (slice, token)'s
// blocks (a ticket) adds them in group order (deterministic). The blocks of slice 0 also count the
// token's row from the words and h they read anyway (no pass of their own), and the grid's last
// of them finishes the statistics. Its instance for one group (kGroups false) has none of the
// groups' code (~0.4 us at one token in the grouped instance, H200).
constexpr int64_t kServeMaxWords = 2048;  // H <= 65536 (kMaxSparseCols, checked when the FFN is made)

/// Group g of G's first mask word (G: the end): whole TwELL tiles, so that its tiles' counts are complete.
template <class T> __device__ inline int64_t serve_group_first_word(const ServeArgs<T> &a, int g, int G) {
    const int64_t per_tile = a.tile / 32, tiles = (a.words + per_tile - 1) / per_tile;
    return min(a.words, tiles * g / G * per_tile);
}

template <class T, bool FP8 = false, bool kGroups = false>
__global__ void __launch_bounds__(32 * kServeDownWarps) serve_down(ServeArgs<T> a) {
    constexpr int E = Chunk<T>::n, W = kServeDownWarps, B = kServeDownBatch;
    static_assert(kServeDownCols == 32 * E, "a lane holds one chunk of the slice");
    __shared__ float red[W][kServeDownCols];
    __shared__ float warp_l1[W];
    __shared__ uint8_t word_nnz[kServeMaxWords];  // slice 0: active units per mask word
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    const int64_t t = blockIdx.y, col0 = static_cast<int64_t>(blockIdx.x) * kServeDownCols + lane * E;
    const bool counts_row = blockIdx.x == 0;
    // the group's words (all of them with one group)
    const int G = kGroups ? static_cast<int>(gridDim.z) : 1, g = kGroups ? static_cast<int>(blockIdx.z) : 0;
    const int64_t gw0 = kGroups ? serve_group_first_word(a, g, G) : 0;
    const int64_t gw1 = kGroups ? serve_group_first_word(a, g + 1, G) : a.words;
    // FP8's instance keeps the statistics' early loads in shared memory (in registers they make it
    // spill); the 16-bit instance is faster with them in registers
    __shared__ PublishInputs early_s;
    PublishInputs early_r{};
    PublishInputs &early = FP8 ? early_s : early_r;
    serve_down_start(a, counts_row, early);
    const uint32_t *mw = a.masks + t * a.words;
    const T *hrow = a.gate + t * a.ldg;
    const ServeRows<T, FP8> rows(a);
    using Down = DownChunk<T, FP8>;
    const bool col_ok = col0 < a.dp;
    float acc[E];
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] = 0.0f;
    float l1 = 0.0f;
    const int64_t w0 = gw0 + (gw1 - gw0) * warp / W, w1 = gw0 + (gw1 - gw0) * (warp + 1) / W;
    for (int64_t base = w0; base < w1; base += 32) {
        uint32_t mine = base + lane < w1 ? __ldcg(mw + base + lane) : 0u;
        if (counts_row && base + lane < w1) word_nnz[base + lane] = static_cast<uint8_t>(__popc(mine));
        for (unsigned pending = __ballot_sync(kFullMask, mine != 0); pending;) {
            // up to B units in ascending order, then all their loads at once
            int64_t j[B];
            int count = 0;
#pragma unroll
            for (int i = 0; i < B; ++i) {
                j[i] = -1;
                if (pending == 0) continue;
                const int src = __ffs(pending) - 1;
                const uint32_t word = __shfl_sync(kFullMask, mine, src);
                j[i] = (base + src) * 32 + __ffs(word) - 1;
                if (lane == src) mine &= mine - 1;
                pending = __ballot_sync(kFullMask, mine != 0);
                count = i + 1;
            }
            float h[B], scale[B];  // scale: FP8's s_d of the row, taken out of the sum as fwd_y does
            typename Down::Raw wd[B];
#pragma unroll
            for (int i = 0; i < B; ++i) {
                const bool ok = i < count;
                h[i] = ok ? Value<T>::to_float(__ldcg(hrow + j[i])) : 0.0f;
                scale[i] = FP8 && ok ? a.fp8.scale[j[i]].y : 1.0f;
                wd[i] = ok && col_ok ? Down::load(rows.down_row(j[i]), col0 / E) : typename Down::Raw{};
            }
#pragma unroll
            for (int i = 0; i < B; ++i) {
                l1 += fabsf(h[i]);
                float w[E];
                Down::to_float(wd[i], w);
                const float hd = FP8 ? h[i] * scale[i] : h[i];
#pragma unroll
                for (int e = 0; e < E; ++e) acc[e] = fmaf(hd, w[e], acc[e]);
            }
        }
    }
#pragma unroll
    for (int e = 0; e < E; ++e) red[warp][lane * E + e] = acc[e];
    if (lane == 0) warp_l1[warp] = l1;
    __syncthreads();
    // with groups: this block's partial row, (slice, token, group) in order
    const int64_t pair = t * gridDim.x + blockIdx.x;
    float *const part = kGroups ? a.parts + (pair * G + g) * kServeDownCols : nullptr;
    // the token's counts (row_count_code) and l1 over the group's tiles, by warp 0 (thread 0's
    // values are the ones used): no barrier past the sums'
    int nnz = 0, over = 0;
    float row_l1 = 0.0f;
    if (counts_row && warp == 0) {
        const int64_t per_tile = a.tile / 32;  // formed here: live across the loop above it cost a spill
        for (int64_t tile = gw0 / per_tile + lane; tile * per_tile < gw1; tile += 32) {
            int n = 0;
            for (int64_t w = tile * per_tile; w < min(gw1, (tile + 1) * per_tile); ++w) n += word_nnz[w];
            nnz += n;
            over |= n > a.slots;
        }
        nnz = static_cast<int>(__reduce_add_sync(kFullMask, static_cast<unsigned>(nnz)));
        over = __any_sync(kFullMask, over);
#pragma unroll
        for (int w = 0; w < W; ++w) row_l1 += warp_l1[w];
    }
    // the slice's columns by the last warps, while warp 0 of a counting block counts the row: the
    // two side by side at the end of the step's critical path
    static_assert(32 * W - kServeDownCols >= 32, "y's threads leave warp 0 to the counts");
    const int yc = static_cast<int>(threadIdx.x) - (32 * W - kServeDownCols);
    if (yc >= 0) {
        const int64_t col = static_cast<int64_t>(blockIdx.x) * kServeDownCols + yc;
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < W; ++w) v += red[w][yc];
        if (part)
            part[yc] = v;
        else if (col < a.d)
            a.y[t * a.y_rs + col * a.y_cs] = Value<T>::from_float(v);
    }
    if constexpr (kGroups) {
        // the last of the (slice, token)'s blocks adds the partial rows and the counts in group order;
        // every thread releases its columns of the partial row before thread 0 takes the ticket (a
        // fence orders only its own thread's writes: without it the last block could add stale columns)
        __shared__ bool last;
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) {
            if (counts_row) {
                const int64_t k = t * G + g;
                a.part_l1[k] = row_l1, a.part_nnz[k] = nnz, a.part_over[k] = over;
            }
            __threadfence();
            last = atomicAdd(a.down_tickets + pair, 1u) == static_cast<unsigned>(G - 1);
            if (last) __threadfence();
        }
        __syncthreads();
        if (!last) return;
        __threadfence();  // acquire: the other groups' partial rows, read by every thread
        for (int c = threadIdx.x; c < kServeDownCols; c += blockDim.x) {
            const int64_t col = static_cast<int64_t>(blockIdx.x) * kServeDownCols + c;
            float v = 0.0f;
            for (int q = 0; q < G; ++q) v += __ldcg(a.parts + (pair * G + q) * kServeDownCols + c);
            if (col < a.d) a.y[t * a.y_rs + col * a.y_cs] = Value<T>::from_float(v);
        }
        if (!counts_row) return;
        nnz = 0, over = 0, row_l1 = 0.0f;
        for (int q = 0; q < G; ++q) {  // thread 0's values are the ones used
            nnz += __ldcg(a.part_nnz + t * G + q);
            over |= __ldcg(a.part_over + t * G + q);
            row_l1 += __ldcg(a.part_l1 + t * G + q);
        }
    }
    if (!counts_row) return;
    // then the grid's last token the statistics
    serve_finish_row<false>(a, t, nnz, over != 0, row_l1, early);
}

// ---- serve_token: past serve_gate's tokens, one kernel after cuBLAS's gate. It replaced two
// kernels (masks and h by 8-unit tiles, then y from per-token lists; 17 to 128 tokens) whose
// grids were each a chain of dependent round trips with the SMs active half the time (ncu at
// M = 64), and a team-per-(token, split) kernel with split sums (129 to 256 tokens): 8 to 15 %
// faster than either on an H100 (docs/performance-notes.md). A block per (column split, token):
//   1. x_t into shared memory (before the wait: x is not the gate's);
//   2. the token's mask words from its gate row, a thread per run of words, and the list of its
//      active units with g by a block scan (ranks in unit order, so the list ascends);
//   3. h_tj = g_tj (x_t . Wu_j) with a warp per unit, the whole row's loads in flight, Wd_j's
//      columns of the split asked of L2 first so that they arrive while the dots run;
//   4. y_t over the split's columns: thread groups (parts) take consecutive stretches of the list,
//      B rows in flight each, and the parts are added in part order.
// Every split of a token recomputes its h (the splits read Wu_j at about the same time, so DRAM
// serves it once); split 0 alone writes the masks, the neuron counts, h over the gate (the hidden
// output; the launch then uses one split, as split 0 would write h where the others read g) and
// the token's statistics (serve_stats, after the grid, the step's). Rows longer than the list
// go in windows. A fixed order everywhere, so the bits are deterministic.
// W warps a block (the plan's serve.token_warps), V of the split's 8-column chunks a thread.
// FP8 (TW_COMPUTE_FP8_WEIGHTS): Wu_j and Wd_j read from the FP8 copy, half the bytes of each row,
// with the sums of the two-pass FP8 kernels: h = g round(s_u (x_t . q(Wu_j))), y over (h s_d) q(Wd_j).
constexpr int kServeTokenCap = 512, kServeTokenBatch = 8;

template <class T, int W, int V, bool FP8 = false>
__global__ void __launch_bounds__(32 * W) serve_token(ServeArgs<T> a) {
    constexpr int E = Chunk<T>::n, B = kServeTokenBatch / V, NT = 32 * W;
    __shared__ uint4 xs[kServeMaxChunks];
    __shared__ uint32_t words[kServeMaxWords];
    __shared__ int32_t units[kServeTokenCap];
    __shared__ float hs[kServeTokenCap];  // g, then h
    __shared__ float red[NT * E];         // the parts' sums
    __shared__ alignas(16) int warp_total[W];
    __shared__ float l1_scratch[32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid / 32;
    const int64_t t = blockIdx.y;
    const int split = blockIdx.x, splits = gridDim.x;
    const bool counts_row = split == 0;
    static_assert(E == 8, "8 columns a chunk (16-bit types)");
    const int nchunks = static_cast<int>(a.dp / E);
    // x_t over what the up dot reads: dp values, or the FP8 half (zeros past D)
    const int dot_chunks = FP8 ? static_cast<int>(a.fp8.half / E) : nchunks;
    const T *xrow = a.x + t * a.x_rs;
    for (int c = tid; c < dot_chunks; c += NT) xs[c] = serve_x_chunk(xrow, static_cast<int64_t>(c) * E, a.d);
    PublishInputs early{};
    serve_down_start(a, counts_row, early);  // waits for cuBLAS's gate
    allow_dependent_launch();

    // 2. this thread's run of words (runs in thread order, so ranks follow unit order)
    const int64_t per = (a.words + NT - 1) / NT;
    const int64_t wb = min(a.words, tid * per), we = min(a.words, wb + per);
    int mine = 0;
    for (int64_t w = wb; w < we; ++w) {
        const uint32_t bits = serve_mask_from_gate(a, t, w, counts_row);
        words[w] = bits;
        if (counts_row) a.masks[t * a.words + w] = bits;
        mine += __popc(bits);
    }
    const int incl = warp_scan_incl(mine);
    if (lane == 31) warp_total[warp] = incl;
    __syncthreads();
    int total = 0, before = 0;
#pragma unroll
    for (int w = 0; w < W; ++w) {
        before += w < warp ? warp_total[w] : 0;
        total += warp_total[w];
    }
    const int first = before + incl - mine;  // this thread's first rank

    // the split's columns: `span` chunks, V a thread; P parts of the list
    const int per_split = (nchunks + splits - 1) / splits;
    const int c0 = split * per_split, c1 = min(nchunks, c0 + per_split);
    const int span = (per_split + V - 1) / V, parts = NT / span;
    const int part = tid / span, local = tid % span;
    const ServeRows<T, FP8> rows(a);
    using Down = DownChunk<T, FP8>;
    const T *hrow = a.gate + t * a.ldg;
    float acc[V][E];
#pragma unroll
    for (int v = 0; v < V; ++v)
#pragma unroll
        for (int e = 0; e < E; ++e) acc[v][e] = 0.0f;
    float l1 = 0.0f;  // lane 0 of each warp, over its units (counts_row)
    for (int win = 0; win < total; win += kServeTokenCap) {
        if (first < win + kServeTokenCap && first + mine > win) {
            int r = first;
            for (int64_t w = wb; w < we && r < win + kServeTokenCap; ++w)
                for (uint32_t bits = words[w]; bits; bits &= bits - 1, ++r) {
                    if (r < win || r >= win + kServeTokenCap) continue;
                    const int64_t j = w * 32 + __ffs(bits) - 1;
                    units[r - win] = static_cast<int32_t>(j);
                    hs[r - win] = Value<T>::to_float(__ldcg(hrow + j));
                }
        }
        __syncthreads();
        const int n = min(kServeTokenCap, total - win);
        // 3. h over the window, a warp per unit
        for (int i = warp; i < n; i += W) {
            const int64_t j = units[i];
            const uint8_t *row = rows.up_row(j);  // read for a gated FFN only
            if (kServePrefetchDown)
                rows.prefetch_down(j, static_cast<int64_t>(c0) * E, static_cast<int64_t>(c1) * E, lane);
            float h = hs[i], scale_down = 1.0f;
            if constexpr (FP8) {
                const float2 sc = a.fp8.scale[j];
                scale_down = sc.y;
                if (a.gated) h = round_to<T>(h * round_to<T>(sc.x * warp_row_dot_fp8<T>(xs, row, dot_chunks)));
            } else {
                if (a.gated)
                    h = round_to<T>(h * round_to<T>(warp_row_dot<T>(xs, reinterpret_cast<const T *>(row), nchunks)));
            }
            __syncwarp();  // every lane has read g before lane 0 overwrites it
            if (lane == 0) {
                hs[i] = h * scale_down;  // FP8: the row's scale taken out of the sum, as fwd_y does
                l1 += fabsf(h);
                if (counts_row && a.write_h) a.gate[t * a.ldg + j] = Value<T>::from_float(h);
            }
        }
        __syncthreads();
        // 4. this part's stretch of the window, B rows in flight
        if (part < parts) {
            const int i1 = n * (part + 1) / parts;
            for (int i0 = n * part / parts; i0 < i1; i0 += B) {
                float h[B];
                typename Down::Raw wd[B][V];
#pragma unroll
                for (int i = 0; i < B; ++i) {
                    const bool ok = i0 + i < i1;
                    h[i] = ok ? hs[i0 + i] : 0.0f;
                    const uint8_t *row = rows.down_row(ok ? units[i0 + i] : 0);
#pragma unroll
                    for (int v = 0; v < V; ++v) {
                        const int c = c0 + local + v * span;
                        wd[i][v] = ok && c < c1 ? Down::load(row, c) : typename Down::Raw{};
                    }
                }
#pragma unroll
                for (int i = 0; i < B; ++i)
#pragma unroll
                    for (int v = 0; v < V; ++v) {
                        float w[E];
                        Down::to_float(wd[i][v], w);
#pragma unroll
                        for (int e = 0; e < E; ++e) acc[v][e] = fmaf(h[i], w[e], acc[v][e]);
                    }
            }
        }
        __syncthreads();  // the next window overwrites the list
    }
    if (parts == 1) {  // one part holds the sums
        if (part == 0)
#pragma unroll
            for (int v = 0; v < V; ++v) {
                const int64_t col0 = static_cast<int64_t>(c0 + local + v * span) * E;
                if (col0 < static_cast<int64_t>(c1) * E)
#pragma unroll
                    for (int e = 0; e < E; ++e)
                        if (col0 + e < a.d) a.y[t * a.y_rs + (col0 + e) * a.y_cs] = Value<T>::from_float(acc[v][e]);
            }
    } else {  // the parts' sums in part order (more than one part: span <= NT / 2, so V = 1)
        if (part < parts)
#pragma unroll
            for (int e = 0; e < E; ++e) red[(part * span + local) * E + e] = acc[0][e];
        __syncthreads();
        for (int q = tid; q < span * E; q += NT) {
            const int64_t col = static_cast<int64_t>(c0) * E + q;
            float sum = 0.0f;
            for (int p = 0; p < parts; ++p) sum += red[p * span * E + q];
            if (col < static_cast<int64_t>(c1) * E && col < a.d) a.y[t * a.y_rs + col * a.y_cs] = Value<T>::from_float(sum);
        }
    }
    if (!counts_row) return;
    // the token's counts (row_count_code) and l1; the step's statistics by serve_stats (or, with a
    // ticket, by the grid's last token)
    const int per_tile = a.tile / 32;
    int over = 0;
    for (int64_t tile = tid; tile * per_tile < a.words; tile += NT) {
        int cnt = 0;
        for (int64_t w = tile * per_tile; w < min(a.words, (tile + 1) * per_tile); ++w) cnt += __popc(words[w]);
        over |= cnt > a.slots;
    }
    over = __syncthreads_or(over);
    const float row_l1 = block_reduce(l1, [](float x, float y) { return x + y; }, l1_scratch);
    serve_finish_row<true>(a, t, total, over, row_l1, early);
}

/// After serve_token (or serve_down) without a ticket: one warp
/// reduces the rows' statistics in a fixed order and publishes them, so that no memset node zeroes
/// a ticket before the gate GEMM and no token block waits on one.
template <class T>
__global__ void __launch_bounds__(32) serve_stats(ServeArgs<T> a) {
    PublishInputs early{};  // read by lane 0
    if (threadIdx.x == 0) early = load_publish_inputs(a.stats);
    wait_for_prior_grid();
    reduce_and_publish_statistics_warp<true>(a.m, a.row_nnz, a.count, a.row_l1, a.stats, a.publish, early);
}

}  // namespace twblas::cuda
