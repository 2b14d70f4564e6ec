// serve_wide: the serving path's gate and h for 17 to heuristics::kServeWideMaxTokens tokens in one
// kernel, so that serve_token, which follows it by programmatic dependent launch, only gathers the
// down rows. It replaces cuBLAS's gate GEMM there, after which serve_token had to find each
// token's units, read its Wu rows and form h in a chain of steps per block (bench/NOTES.md: the
// chain, not the bytes, set M = 64's time).
//
// A block per nu consecutive units (about one block an SM), all of the call's tokens:
//   1. the gate: Z = X Wg^T over its units on tensor cores, X and the Wg rows staged together in
//      a ring of cp.async stages (Wg streamed once from DRAM, X read from L2 by every block);
//   2. its epilogue: g rounded to T, each unit's tokens as a bit mask, g (plain FFN) or 0
//      (inactive units) into the gate buffer, the units' bytes of each token's mask words, the
//      neuron counts;
//   3. the units active for some token listed in order, their Wd rows asked of L2 for
//      serve_token, and U = X Wu^T over them alone through the same ring (each Wu row read once);
//   4. h = g u (T-rounded, as serve_gate) into the gate buffer for the active pairs.
// Warps split the (8 units, 16 tokens) MMA tiles, each summed over K in one fixed order:
// deterministic bits.
#pragma once

#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>

#include "kernels/serve.cuh"

namespace twblas::cuda {

constexpr int kWideStages = 4;
/// Threads a block: every one issues the stages' copies (bk / 8 of them a row) and takes a share of
/// the MMAs.
constexpr int kWideThreads = 256;
/// MMA items (8 units x 16 tokens) a warp: 16 n-tiles x 4 token tiles over 8 warps.
constexpr int kWideItemsMax = 8;
/// Elements added to every staged row (k per stage + this): rows 64 bytes apart modulo 128, so the
/// 16-byte reads of a quarter warp (two rows, four k chunks) fall on distinct banks.
constexpr int kWidePad = 32;

/// Dynamic shared memory of a launch: the ring, then z (units x tokens fp32), the units' token
/// masks and the list of active units.
inline size_t serve_wide_smem(int token_tiles, int units, int bk) {
    const size_t mp = 16 * static_cast<size_t>(token_tiles), nu = static_cast<size_t>(units);
    return kWideStages * (mp + nu) * (bk + kWidePad) * 2 + nu * (mp + 1) * 4 + nu * 8 + nu * 4;
}

/// MT 16-token tiles (M <= 16 MT <= 64: a unit's tokens fit one 64-bit mask); `nu` units a block, a
/// multiple of 16 up to 128; `bk` k a stage, 64 or 128. Launched with kWideThreads threads and
/// serve_wide_smem bytes.
template <class T, int MT> __global__ void __launch_bounds__(kWideThreads) serve_wide(ServeArgs<T> a, int nu, int bk) {
    static_assert(MT >= 1 && MT <= 4, "a unit's tokens in one 64-bit mask");
    static_assert(kWideThreads >= 64 + 128, "a thread a staged row");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    return;  // bulk copies: launch_serve_wide launches it on sm_90 and later only
#else
    constexpr int MP = 16 * MT;
    extern __shared__ __align__(16) unsigned char smem[];
    const int warp = static_cast<int>(threadIdx.x / 32), lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int rs = bk + kWidePad;  // elements a staged row
    const int stage_elems = (MP + nu) * rs;
    T *ring = reinterpret_cast<T *>(smem);
    float *z = reinterpret_cast<float *>(ring + kWideStages * stage_elems);  // [unit][token], MP + 1 apart
    uint64_t *tokens_of = reinterpret_cast<uint64_t *>(z + nu * (MP + 1));
    int *list = reinterpret_cast<int *>(tokens_of + nu);
    __shared__ int list_count;

    // serve_token may start its blocks now; it waits for this grid's end before reading its output
    allow_dependent_launch();
    const int64_t unit0 = static_cast<int64_t>(blockIdx.x) * nu;
    if (blockIdx.x == 0 && threadIdx.x == 0) *a.ticket = 0;
    __shared__ alignas(8) uint64_t full[kWideStages];  // a slot's bulk copies have landed
    if (threadIdx.x == 0) {
        for (int s = 0; s < kWideStages; ++s) cutlass::arch::ClusterTransactionBarrier::init(&full[s], 1);
        cutlass::arch::fence_barrier_init();
    }
    // x rows past m are zeros in every slot (no copy writes them)
    for (int s = 0; s < kWideStages; ++s)
        for (int e = (a.m + static_cast<int>(threadIdx.x / (bk / 8))) * rs + threadIdx.x % (bk / 8) * 8; e < MP * rs;
             e += kWideThreads / (bk / 8) * rs)
            *reinterpret_cast<uint4 *>(ring + s * stage_elems + e) = make_uint4(0, 0, 0, 0);
    __syncthreads();

    // The stages' copies (sm_90 bulk copies, each completing on its slot's barrier): thread r copies
    // staged row r of every stage, the MP x rows (rows past m stay zero, set once below) and then
    // `wrows` weight rows (row_of(i); null: zeros). Bulk copies move whole 16-byte chunks, so the
    // thread writes what they cannot itself: x's partial chunk at d, and the zeros past d (x) or dp
    // (weights) in the last stages. Those plain stores are read a barrier later at the earliest.
    const T *src_row = nullptr;  // this thread's row of the pass, null for zeros or no row
    bool x_row = false, has_row = false;
    int copied_rows = 0;  // rows with a source: the stage's expected bytes
    auto bind = [&](auto row_of, int wrows) {
        const int r = static_cast<int>(threadIdx.x);
        x_row = r < MP;
        has_row = r < MP + wrows;
        src_row = nullptr;
        if (x_row && r < a.m) src_row = a.x + r * a.x_rs;
        if (!x_row && has_row) src_row = row_of(r - MP);
        copied_rows = __syncthreads_count(!x_row && src_row != nullptr);
    };
    const int64_t d_whole = a.d / 8 * 8;  // x's whole chunks
    auto load_stage = [&](int slot, int64_t k0) {
        const int64_t x_end = min(k0 + bk, d_whole), w_end = min(k0 + bk, a.dp);
        const int xb = static_cast<int>(max(int64_t{0}, x_end - k0) * 2), wb = static_cast<int>((w_end - k0) * 2);
        if (threadIdx.x == 0)
            cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&full[slot], static_cast<uint32_t>(
                                                                           min(a.m, MP) * xb + copied_rows * wb));
        if (!has_row || (x_row && static_cast<int>(threadIdx.x) >= a.m)) return;
        T *dst = ring + slot * stage_elems + threadIdx.x * rs;
        const int bytes = x_row ? xb : (src_row ? wb : 0);
        if (bytes) cute::SM90_BULK_COPY_G2S::copy(src_row + k0, &full[slot], dst, bytes);
        int e = bytes / 2;  // first element not copied
        if (x_row && k0 + e < a.d && e < bk) {  // x's partial chunk at d: its values, zeros after
            uint4 v = serve_x_chunk(src_row, k0 + e, a.d);
            *reinterpret_cast<uint4 *>(dst + e) = v;
            e += 8;
            if (e >= bk) {
                cutlass::arch::fence_view_async_shared();
                return;
            }
        }
        if (e == bk) return;
        for (; e < bk; e += 8) *reinterpret_cast<uint4 *>(dst + e) = make_uint4(0, 0, 0, 0);
        cutlass::arch::fence_view_async_shared();  // before a later bulk copy into these bytes
    };
    int issued = 0;  // stages issued by earlier passes
    using Mma = typename MmaOf<T>::Op;
    // The MMA work of a pass: items (n-tile of 8 staged weight rows, m-tile of 16 tokens), item i
    // for warp i % 8, so that every warp takes a share (the gate's 6 x 4 items at the paper's shape,
    // three a warp; the up pass's few n-tiles x 4 token tiles).
    constexpr int J = kWideItemsMax;
    float acc[J][4];
    // acc = X W^T over every k for this warp's items. Each lane reads 8 consecutive k of a row and
    // feeds them to the MMA as k 2q, 2q + 1, 2q + 8, 2q + 9 of two k16 steps (serve_tile_dots's
    // arrangement; a dot product's k order is free).
    auto run_pass = [&](auto row_of, int wrows, int ntiles) {
#pragma unroll
        for (int j = 0; j < J; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;
        bind(row_of, wrows);
        const int ks = static_cast<int>((a.dp + bk - 1) / bk);
        const int items = ntiles * MT;
        // stages are numbered across the passes (`issued`), so each slot's barrier phase follows.
        // Each block starts at its own k stage and wraps around (a fixed order per unit, so the bits
        // stay deterministic): blocks in step would all ask L2 for the same x lines at once.
        const int rot = static_cast<int>(blockIdx.x % ks);
        auto k_of = [&](int stage) { return static_cast<int64_t>((stage + rot) % ks) * bk; };
        for (int s = 0; s < kWideStages - 1 && s < ks; ++s) load_stage((issued + s) % kWideStages, k_of(s));
        for (int kb = 0; kb < ks; ++kb) {
            __syncthreads();  // every warp is done with the slot refilled next; its plain stores are seen
            const int next = kb + kWideStages - 1;
            if (next < ks) load_stage((issued + next) % kWideStages, k_of(next));
            const int n = issued + kb;
            cutlass::arch::ClusterBarrier::wait(&full[n % kWideStages], (n / kWideStages) & 1);
            const T *st = ring + (n % kWideStages) * stage_elems;
            for (int c = 0; c < bk / 32; ++c) {
                const int kc = c * 32 + q * 8;
#pragma unroll
                for (int j = 0; j < J; ++j) {
                    const int item = warp + j * (kWideThreads / 32);
                    if (item >= items) break;  // the same for the whole warp
                    const int nt = item / MT, mt = item - nt * MT;
                    const uint4 bv = *reinterpret_cast<const uint4 *>(st + (MP + nt * 8 + g) * rs + kc);
                    const uint4 lo = *reinterpret_cast<const uint4 *>(st + (16 * mt + g) * rs + kc);
                    const uint4 hi = *reinterpret_cast<const uint4 *>(st + (16 * mt + g + 8) * rs + kc);
#pragma unroll
                    for (int s = 0; s < 2; ++s)
                        Mma::fma(acc[j][0], acc[j][1], acc[j][2], acc[j][3], word_of(lo, 2 * s), word_of(hi, 2 * s),
                                 word_of(lo, 2 * s + 1), word_of(hi, 2 * s + 1), word_of(bv, 2 * s),
                                 word_of(bv, 2 * s + 1), acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
                }
            }
        }
        issued += ks;
        __syncthreads();  // the ring is free
    };
    // the pass's sums into `dst` ([row][token], MP + 1 apart): accumulator i of lane l is token
    // 16 mt + l / 4 (+ 8 for i >= 2) and row 8 nt + 2 (l % 4) + i % 2
    auto store = [&](float *dst, int ntiles) {
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const int item = warp + j * (kWideThreads / 32);
            if (item >= ntiles * MT) break;
            const int nt = item / MT, mt = item - nt * MT;
#pragma unroll
            for (int i = 0; i < 4; ++i)
                dst[(8 * nt + 2 * q + (i & 1)) * (MP + 1) + 16 * mt + g + 8 * (i >> 1)] = acc[j][i];
        }
        __syncthreads();
    };

    // 1. the gate over the block's units (rows past h are zeros)
    run_pass([&](int i) -> const T * { return unit0 + i < a.h ? a.wgate + (unit0 + i) * a.wgate_ld : nullptr; }, nu,
             nu / 8);
    store(z, nu / 8);

    // 2. a thread per unit: g rounded, the unit's tokens, g or 0 into the gate buffer, its count
    if (static_cast<int>(threadIdx.x) < nu) {
        const int u = threadIdx.x;
        const int64_t unit = unit0 + u;
        const bool ok = unit < a.h;
        uint64_t bits = 0;
        for (int t = 0; t < a.m; ++t) {
            const float gv = round_to<T>(z[u * (MP + 1) + t]);
            const bool on = ok && relu_active(gv);
            bits |= static_cast<uint64_t>(on) << t;
            z[u * (MP + 1) + t] = gv;
            // gated: the active pairs get h in step 4
            if (ok && !(on && a.gated)) a.gate[t * a.ldg + unit] = Value<T>::from_float(on ? gv : 0.0f);
        }
        tokens_of[u] = bits;
        if (a.neuron_counts && bits) atomicAdd(a.neuron_counts + unit, static_cast<unsigned long long>(__popcll(bits)));
    }
    __syncthreads();
    // the block's bytes of each token's mask words (byte b: units 8 b to 8 b + 7; words little-endian)
    {
        const int nb = nu / 8;
        const int64_t byte0 = unit0 / 8, bytes_per_token = a.words * 4;
        for (int e = threadIdx.x; e < a.m * nb; e += blockDim.x) {
            const int t = e / nb, b = e - t * nb;
            if (byte0 + b >= bytes_per_token) continue;
            uint32_t byte = 0;
#pragma unroll
            for (int i = 0; i < 8; ++i) byte |= static_cast<uint32_t>(tokens_of[8 * b + i] >> t & 1u) << i;
            reinterpret_cast<uint8_t *>(a.masks + t * a.words)[byte0 + b] = static_cast<uint8_t>(byte);
        }
    }
    if (!a.gated) return;  // plain FFN: h = g, written above

    // 3. the active units in order; their Wd rows asked of L2 for serve_token; U over them alone
    if (warp == 0) {
        int n = 0;
        for (int base = 0; base < nu; base += 32) {
            const bool on = base + lane < nu && tokens_of[base + lane] != 0;
            const unsigned ballot = __ballot_sync(kFullMask, on);
            if (on) list[n + __popc(ballot & ((1u << lane) - 1u))] = base + lane;
            n += __popc(ballot);
        }
        if (lane == 0) list_count = n;
    }
    __syncthreads();
    const int count = list_count;
    if (count == 0) return;
    for (int i = warp; i < count; i += kWideThreads / 32) {
        const T *wd = a.pair + (unit0 + list[i]) * a.pair_stride + a.dp;
        for (int64_t k = lane * 64; k < a.dp; k += 32 * 64) asm volatile("prefetch.global.L2 [%0];" ::"l"(wd + k));
    }
    const int utiles = (count + 7) / 8;
    run_pass([&](int i) -> const T * { return i < count ? a.pair + (unit0 + list[i]) * a.pair_stride : nullptr; },
             8 * utiles, utiles);
    float *zu = reinterpret_cast<float *>(ring);  // the ring is free after the pass
    store(zu, utiles);

    // 4. h of the active pairs over the gate buffer
    for (int e = threadIdx.x; e < count * a.m; e += blockDim.x) {
        const int i = e / a.m, t = e - i * a.m;
        const int u = list[i];
        if (!(tokens_of[u] >> t & 1u)) continue;
        const float h = round_to<T>(z[u * (MP + 1) + t] * round_to<T>(zu[i * (MP + 1) + t]));
        a.gate[t * a.ldg + unit0 + u] = Value<T>::from_float(h);
    }
#endif
}

}  // namespace twblas::cuda
