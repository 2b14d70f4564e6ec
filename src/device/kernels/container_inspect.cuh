// Inspection of TwELL and hybrid containers on the device: twSpMatGetInfo's counts and
// twSpMatValidate's search for the first violation. The kernels only locate the first failing
// item (record entry, backup slot, row); the host then runs that item's check from
// src/host/container_checks.hpp on the bytes it reads back, so the message is the reference's.
// Each kernel mirrors one of those checks: keep them in step (the CUDA tests compare verdicts and
// messages with the reference on corrupted containers).
#pragma once

#include <cstdint>

#include "common/dependent_launch.cuh"
#include "kernels/container_args.cuh"

namespace twblas::cuda {

/// What one inspection leaves for the host (one read-back).
struct InspectResult {
    unsigned long long nnz;           // info: stored non-zeros
    long long max_row;                // info: largest row count
    long long header;                 // TwELL record count / hybrid backup count, as stored
    unsigned long long first_item;    // validate: first failing record entry / backup slot
    unsigned long long first_row;     // validate: (first failing row << 1) | whether the record lists it
    unsigned long long over;          // validate (hybrid): rows over the ELL width
    unsigned long long done;          // callers of publish_when_last so far
};
constexpr unsigned long long kNoItem = ~0ull;

/// Counts 0, "no failing item" all ones: the state every inspection starts from.
__host__ __device__ constexpr InspectResult clear_result() { return {0, 0, 0, kNoItem, kNoItem, 0, 0}; }
/// A validation verdict under which a container may be read whole: no failing record entry,
/// slot or row, and no rows recorded as not held (the TwELL record / hybrid backup count 0).
__host__ __device__ constexpr bool valid_and_complete(const InspectResult &r) {
    return r.first_item == kNoItem && r.first_row == kNoItem && r.header == 0;
}

/// Called once by each of `parties` threads of the grid (a block's or a warp's first) after their
/// writes to `r`: the last one copies *r to `published` (the host's mapped memory), so that the
/// host reads it after the stream's work without a copy queued behind the kernel.
__device__ inline void publish_when_last(InspectResult *r, InspectResult *published, unsigned long long parties) {
    __threadfence();
    if (atomicAdd(&r->done, 1ull) != parties - 1) return;
    __threadfence();
    const volatile InspectResult *v = r;  // the other warps' atomics, not a cached copy
    *published = {v->nnz, v->max_row, v->header, v->first_item, v->first_row, v->over, v->done};
}
/// The first thread of an inspection's first kernel clears the other result slot for the next
/// inspection (ContainerOps::Slots): nothing else of this call touches it.
__device__ inline void clear_other_slot(InspectResult *clear) {
    if (blockIdx.x == 0 && threadIdx.x == 0) *clear = clear_result();
}

/// The count at the head of the TwELL record / the hybrid backup count, as an int64.
__device__ inline long long container_header(const ContainerArgs &c, bool twell) {
    return twell ? static_cast<long long>(reinterpret_cast<const uint32_t *>(c.base)[c.record])
                 : static_cast<long long>(*at<const int32_t>(c, c.backup_count));
}

// ---- info: one warp per row; the block sums its rows before one global atomic (a global
// atomic per row serialises on one address)

/// Rows go to the grid's warps in turn: the grid is capped (ContainerOps::stride_blocks), so that
/// its blocks' atomics and publish_when_last's tickets stay few (a block per 4 rows, 16384 at
/// 65536 rows, made info slower there than the copy it saved, on an H100).
__global__ void container_info(ContainerArgs c, bool twell, InspectResult *out, InspectResult *clear,
                               InspectResult *published) {
    clear_other_slot(clear);
    __shared__ unsigned long long block_nnz;
    __shared__ long long block_max;
    const int lane = static_cast<int>(lane_id());
    if (threadIdx.x == 0) {
        block_nnz = 0;
        block_max = 0;
        if (blockIdx.x == 0) out->header = container_header(c, twell);
    }
    __syncthreads();
    const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
    for (int64_t row = warp_row(); row < c.rows; row += warps) {
        long long count = 0;  // this row's count (hybrid: row_nnz as stored), and whether it is stored
        bool stored = true;
        if (twell) {
            const uint32_t *words = reinterpret_cast<const uint32_t *>(c.base) + row * c.ld;
            const int64_t tiles = (c.cols + c.tile - 1) / c.tile;
            for (int64_t t = lane; t < tiles; t += 32)
                count += min(static_cast<int>(words[t * c.words_per_block] & kTwellCountMask), c.slots);
            count = warp_sum(count);
        } else {
            count = at<const int32_t>(c, c.row_nnz)[row];
            stored = count <= c.ell_width || at<const int32_t>(c, c.backup_map)[row] >= 0;
        }
        if (lane == 0) {
            if (stored) atomicAdd(&block_nnz, static_cast<unsigned long long>(count));
            atomicMax(&block_max, count);
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        atomicAdd(&out->nnz, block_nnz);
        atomicMax(&out->max_row, block_max);
        publish_when_last(out, published, gridDim.x);
    }
}

// ---- validation, TwELL

/// The record count, and entries 0 .. min(listed, rows) - 1: in range and ascending
/// (checks::twell_record_entry). Run by `blocks` blocks of the validation kernel, this one `block`.
__device__ inline void twell_check_record(const ContainerArgs &c, int64_t block, int64_t blocks, InspectResult *out) {
    if (block == 0 && threadIdx.x == 0) out->header = container_header(c, true);
    const uint32_t *record = reinterpret_cast<const uint32_t *>(c.base) + c.record;
    const int64_t listed = min(static_cast<int64_t>(record[0]), c.rows);
    for (int64_t i = block * blockDim.x + threadIdx.x; i < listed; i += blocks * blockDim.x) {
        const uint32_t id = record[1 + i];
        if (id >= c.rows || (i > 0 && id <= record[i])) atomicMin(&out->first_item, static_cast<unsigned long long>(i));
    }
}

/// Whether the (ascending) record lists `row`: a binary search, meaningful once the record checks pass.
__device__ inline bool twell_listed(const uint32_t *record, int64_t row, int64_t rows) {
    int64_t lo = 0, hi = min(static_cast<int64_t>(record[0]), rows);
    while (lo < hi) {
        const int64_t mid = (lo + hi) / 2;
        if (record[1 + mid] < row) lo = mid + 1;
        else hi = mid;
    }
    return lo < min(static_cast<int64_t>(record[0]), rows) && record[1 + lo] == row;
}

/// The first eight words of a TwELL block (its header and slots 1 .. 7; every block has at least
/// eight words): two 16-byte loads where the buffer is 16-byte aligned, so a tile of up to seven
/// entries costs the row's warp one round trip instead of one per entry.
__device__ inline void load_block_head(const uint32_t *block, bool vec, uint32_t (&w)[8]) {
    if (vec) {
        const uint4 a = reinterpret_cast<const uint4 *>(block)[0], b = reinterpret_cast<const uint4 *>(block)[1];
        w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
        return;
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) w[k] = block[k];
}

/// The entries past the seventh of a round of up to 32 tiles of a row, one tile a lane (`count`:
/// the lane's tile's entries when it has more than seven, else anything up to 7), spread over the
/// whole warp: flat index f over the tiles' tails in tile order, lane l taking f = l, l + 32, ...
/// and issuing the loads of `Batch` of them before using any; f(entry, tile t0 + owner lane).
/// Why: llm-29's first tokens hold 300 to 800 entries, up to 49 in a tile, and a lane walking its
/// own tile's tail (four words a load) made a round trip per four entries of the row's fullest
/// tile; the warps of those rows ended both kernels (ncu at 4096 x 5632 on an H100: the busiest
/// SM's active cycles 2.2x the mean in validation, 1.5x in TwELL -> dense; uniform-29 1.3x, 1.1x).
/// Every lane of the warp calls it (shuffles); words past `count` are never read.
template <int Batch = 8, class F>
__device__ inline void for_round_tails(const uint32_t *words, int64_t t0, int64_t words_per_block, int count, F &&f) {
    const int lane = static_cast<int>(lane_id());
    const int own = max(count - 7, 0);
    const int incl = warp_scan_incl(own);
    const int total = __shfl_sync(kFullMask, incl, 31);
    const int excl = incl - own;
    for (int base = 0; base < total; base += 32 * Batch) {  // total is the same in every lane
        uint32_t e[Batch];
        int owner[Batch];
#pragma unroll
        for (int k = 0; k < Batch; ++k) {
            const int fi = base + 32 * k + lane;
            int lo = 0;  // lanes whose tails end at or before fi: the owner of fi (incl ascends)
#pragma unroll
            for (int step = 16; step > 0; step >>= 1)
                if (__shfl_sync(kFullMask, incl, lo + step - 1) <= fi) lo += step;
            const int start = __shfl_sync(kFullMask, excl, lo);
            owner[k] = lo;
            e[k] = fi < total ? words[(t0 + lo) * words_per_block + 8 + (fi - start)] : 0u;
        }
#pragma unroll
        for (int k = 0; k < Batch; ++k)
            if (base + 32 * k + lane < total) f(e[k], t0 + owner[k]);
    }
}

/// Asks L2 for the lines holding words 8 .. count of a block, as soon as its header says it has a
/// tail: for_round_tails then finds them there. (llm-29's first tokens at 4096 x 5632 on an H100:
/// ~600 tail words a row, three of its round trips to DRAM, ~12 k cycles, past the ~9 k that a
/// sparse row's validation takes.)
__device__ inline void prefetch_block_tail(const uint32_t *block, int count) {
    constexpr uintptr_t kLine = 128;
    const uintptr_t end = reinterpret_cast<uintptr_t>(block + count);
    for (uintptr_t a = reinterpret_cast<uintptr_t>(block + 8) & ~(kLine - 1); a <= end; a += kLine)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
}

/// A warp's bitmaps of the columns of its round's tiles with more than seven entries, in shared
/// memory: tile t0 + l at words[8 l .. 8 l + 7] (tiles are at most 256 wide). Lanes set bits with
/// atomicOr, so two lanes holding the same column find each other whichever comes first.
struct TileBitmaps {
    uint32_t *words;
    /// A column of tile t0 + l in [lo, hi) not seen before in it (checks::twell_row's per-entry part).
    __device__ bool insert(int l, uint32_t entry, int64_t lo, int64_t hi) const {
        const int64_t col = entry & 0xffffu;
        if (col < lo || col >= hi) return false;
        const uint32_t bit = 1u << ((col - lo) & 31);
        return !(atomicOr(&words[8 * l + ((col - lo) >> 5)], bit) & bit);
    }
};

/// The first eight words of one block of a row (checks::twell_row's per-tile part): false on a
/// violation. Up to seven entries (nearly every tile of a sparse row) are checked in registers,
/// pair by pair; a fuller tile's first seven go into its bitmap (lane `l`'s of the round), and
/// `tail` says how many entries the caller must still check (for_round_tails), else 0.
__device__ inline bool twell_block_head_ok(const uint32_t *block, int64_t t, const ContainerArgs &c, bool vec,
                                           bool &overflow, const TileBitmaps &seen, int l, int &tail) {
    tail = 0;
    uint32_t head[8];
    load_block_head(block, vec, head);
    const uint32_t header = head[0];
    if (header & ~(kTwellCountMask | kTwellOverflowBit)) return false;
    const int count = static_cast<int>(header & kTwellCountMask);
    if (count > c.slots) return false;
    if ((header & kTwellOverflowBit) && count != c.slots) return false;
    overflow |= (header & kTwellOverflowBit) != 0;
    const int64_t lo = t * c.tile, hi = min(lo + c.tile, c.cols);
    bool ok = true;
    if (count <= 7) {
#pragma unroll
        for (int i = 0; i < 7; ++i) {
            if (i >= count) break;
            const int64_t col = head[1 + i] & 0xffffu;
            ok &= col >= lo && col < hi;
#pragma unroll
            for (int j = 0; j < i; ++j) ok &= (head[1 + j] & 0xffffu) != col;  // a duplicate column
        }
        return ok;
    }
    prefetch_block_tail(block, count);
    for (int k = 0; k < 8; ++k) seen.words[8 * l + k] = 0;
#pragma unroll
    for (int i = 0; i < 7; ++i) ok &= seen.insert(l, head[1 + i], lo, hi);
    tail = count;
    return ok;
}

/// TwELL validation in one launch: blocks below `row_blocks` check a row a warp (lanes over its
/// tiles) for the first failing row, the others the record (one launch fewer than a kernel each:
/// ~3.6 us of host time a launch on an H100). `vec`: the buffer
/// is 16-byte aligned (blocks then are too: a block is a multiple of eight words). A dependent
/// launch after it (twell_rows_to_dense) may start once all its blocks have.
constexpr int kCheckThreads = 128;
__global__ void __launch_bounds__(kCheckThreads) twell_check(ContainerArgs c, bool vec, int64_t row_blocks,
                                                             InspectResult *out, InspectResult *clear) {
    allow_dependent_launch();
    clear_other_slot(clear);
    if (blockIdx.x >= row_blocks) return twell_check_record(c, blockIdx.x - row_blocks, gridDim.x - row_blocks, out);
    __shared__ uint32_t seen[8 * kCheckThreads];  // a warp's 32 tiles x 8 words
    const int64_t row = warp_row();
    if (row >= c.rows) return;
    const int lane = static_cast<int>(lane_id());
    const uint32_t *words = reinterpret_cast<const uint32_t *>(c.base) + row * c.ld;
    const uint32_t *record = reinterpret_cast<const uint32_t *>(c.base) + c.record;
    const uint32_t listed_rows = lane == 0 ? record[0] : 0u;  // in flight with the blocks' loads
    const int64_t tiles = (c.cols + c.tile - 1) / c.tile;
    const TileBitmaps bitmaps{seen + 8 * (threadIdx.x & ~31u)};
    bool ok = true, overflow = false;
    for (int64_t t0 = 0; t0 < tiles; t0 += 32) {  // the warp's lanes over 32 tiles a round
        const int64_t t = t0 + lane;
        int tail = 0;
        if (t < tiles)
            ok &= twell_block_head_ok(words + t * c.words_per_block, t, c, vec, overflow, bitmaps, lane, tail);
        __syncwarp();  // the bitmaps cleared and holding the first seven entries
        for_round_tails(words, t0, c.words_per_block, tail, [&](uint32_t e, int64_t tile) {
            const int64_t lo = tile * c.tile;
            ok &= bitmaps.insert(static_cast<int>(tile - t0), e, lo, min(lo + c.tile, c.cols));
        });
        __syncwarp();  // before the next round clears them
    }
    ok = __all_sync(0xffffffffu, ok);
    overflow = __any_sync(0xffffffffu, overflow);
    if (lane == 0) {
        const bool listed = listed_rows != 0 && twell_listed(record, row, c.rows);
        if (!ok || overflow != listed)
            atomicMin(&out->first_row, (static_cast<unsigned long long>(row) << 1) | (listed ? 1u : 0u));
    }
}

// ---- validation, hybrid

/// The backup slots actually filled, bounded to the buffer whatever the stored count says.
__device__ inline int64_t hybrid_filled_slots(const ContainerArgs &c) {
    const long long stored = min(container_header(c, false), static_cast<long long>(c.backup_rows));
    return stored > 0 ? stored : 0;
}

/// The backup count, and the filled slots: their row id in range and mapped back to them
/// (checks::hybrid_slot). Run by `blocks` blocks of the validation kernel, this one `block`.
__device__ inline void hybrid_check_slots(const ContainerArgs &c, int64_t block, int64_t blocks, InspectResult *out) {
    if (block == 0 && threadIdx.x == 0) out->header = container_header(c, false);
    const int64_t stored = hybrid_filled_slots(c);
    const int32_t *ids = at<const int32_t>(c, c.backup_row_ids), *map = at<const int32_t>(c, c.backup_map);
    for (int64_t s = block * blockDim.x + threadIdx.x; s < stored; s += blocks * blockDim.x) {
        const int64_t r = ids[s];
        if (r < 0 || r >= c.rows || map[r] != s) atomicMin(&out->first_item, static_cast<unsigned long long>(s));
    }
}

/// Hybrid validation in one launch: blocks below `row_blocks` check a row a warp
/// (checks::hybrid_row) for the first failing row and count the rows over E, the others the
/// backup slots.
__global__ void hybrid_check(ContainerArgs c, int64_t row_blocks, InspectResult *out, InspectResult *clear) {
    clear_other_slot(clear);
    if (blockIdx.x >= row_blocks) return hybrid_check_slots(c, blockIdx.x - row_blocks, gridDim.x - row_blocks, out);
    const int64_t row = warp_row();
    if (row >= c.rows) return;
    const int lane = static_cast<int>(lane_id());
    const int64_t needed = container_header(c, false), stored = hybrid_filled_slots(c);
    const int64_t n = at<const int32_t>(c, c.row_nnz)[row];
    const int64_t slot = at<const int32_t>(c, c.backup_map)[row];
    bool ok = true;
    if (n < 0 || n > c.cols) {
        ok = false;
    } else if (n <= c.ell_width) {
        const uint16_t *rc = at<const uint16_t>(c, c.ell_cols) + row * c.ell_width;
        ok = slot == -1;
        for (int64_t i = lane; ok && i < n; i += 32) {
            const uint16_t col = rc[i];
            if (col >= c.cols) ok = false;
            for (int64_t j = 0; ok && j < i; ++j)
                if (rc[j] == col) ok = false;
        }
        ok = __all_sync(0xffffffffu, ok);
    } else {
        if (lane == 0) atomicAdd(&out->over, 1ull);
        if (slot == -1) {
            ok = needed > c.backup_rows;
        } else if (slot < 0 || slot >= stored || at<const int32_t>(c, c.backup_row_ids)[slot] != row) {
            ok = false;
        } else {
            const uint8_t *dense = c.base + c.backup_vals + static_cast<size_t>(slot * c.cols) * c.value_bytes;
            long long count = 0;
            for (int64_t k = lane; k < c.cols; k += 32) count += load_raw(dense, k, static_cast<int>(c.value_bytes)) != 0;
            ok = warp_sum(count) == n;
        }
    }
    if (lane == 0 && !ok) atomicMin(&out->first_row, static_cast<unsigned long long>(row) << 1);
}

}  // namespace twblas::cuda
