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

/// Entries 7 .. count - 1 of a TwELL block (words 8 .. count) to f(entry), four words a load
/// where `vec` (word 8 of a block is 32-byte aligned, and count <= W - 1 keeps the last load
/// inside the block, W being a multiple of 8).
template <class F> __device__ inline void for_block_tail(const uint32_t *block, int count, bool vec, F &&f) {
#pragma unroll 2
    for (int i = 8; i <= count; i += 4) {
        uint32_t q[4];
        if (vec) {
            const uint4 v = *reinterpret_cast<const uint4 *>(block + i);
            q[0] = v.x, q[1] = v.y, q[2] = v.z, q[3] = v.w;
        } else {
#pragma unroll
            for (int k = 0; k < 4; ++k) q[k] = i + k <= count ? block[i + k] : 0u;
        }
#pragma unroll
        for (int k = 0; k < 4; ++k)
            if (i + k <= count) f(q[k]);
    }
}

/// A thread's bitmap of a tile's columns in shared memory, word k at words[k * stride]: the
/// block's threads interleaved, so that a warp's lanes reach 32 different banks whichever words
/// they touch (eight consecutive words a thread put 8 lanes on each bank).
struct SeenColumns {
    uint32_t *words;
    int stride;
    __device__ uint32_t &operator[](int64_t k) const { return words[k * stride]; }
};

/// One entry of a tile (checks::twell_row's per-entry part): its column inside the tile, and
/// not seen before in it. `seen` is the calling thread's bitmap of the tile's columns.
__device__ inline bool twell_entry_ok(uint32_t entry, int64_t lo, int64_t hi, const SeenColumns &seen) {
    const int64_t col = entry & 0xffffu;
    if (col < lo || col >= hi) return false;
    const uint32_t bit = 1u << ((col - lo) & 31);
    uint32_t &word = seen[(col - lo) >> 5];
    if (word & bit) return false;  // a duplicate column
    word |= bit;
    return true;
}

/// One block of a row (checks::twell_row's per-tile part): false on a violation. Up to seven
/// entries (nearly every tile of a sparse row) are checked in registers, pair by pair; more
/// through `seen`, the calling thread's bitmap of the tile's columns (8 words: tiles are at most
/// 256 wide).
__device__ inline bool twell_block_ok(const uint32_t *block, int64_t t, const ContainerArgs &c, bool vec, bool &overflow,
                                      const SeenColumns &seen) {
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
    for (int k = 0; k < 8; ++k) seen[k] = 0;
#pragma unroll
    for (int i = 0; i < 7; ++i) ok &= twell_entry_ok(head[1 + i], lo, hi, seen);
    for_block_tail(block, count, vec, [&](uint32_t e) { ok &= twell_entry_ok(e, lo, hi, seen); });
    return ok;
}

/// TwELL validation in one launch: blocks below `row_blocks` check a row a warp (lanes over its
/// tiles) for the first failing row, the others the record (one launch fewer than a kernel each:
/// ~3.6 us of host time a launch on an H100, bench/probes/readback_probe.cu). `vec`: the buffer
/// is 16-byte aligned (blocks then are too: a block is a multiple of eight words). A dependent
/// launch after it (twell_rows_to_dense) may start once all its blocks have.
constexpr int kCheckThreads = 128;
__global__ void __launch_bounds__(kCheckThreads) twell_check(ContainerArgs c, bool vec, int64_t row_blocks,
                                                             InspectResult *out, InspectResult *clear) {
    allow_dependent_launch();
    clear_other_slot(clear);
    if (blockIdx.x >= row_blocks) return twell_check_record(c, blockIdx.x - row_blocks, gridDim.x - row_blocks, out);
    __shared__ uint32_t seen[8 * kCheckThreads];
    const int64_t row = warp_row();
    if (row >= c.rows) return;
    const int lane = static_cast<int>(lane_id());
    const uint32_t *words = reinterpret_cast<const uint32_t *>(c.base) + row * c.ld;
    const uint32_t *record = reinterpret_cast<const uint32_t *>(c.base) + c.record;
    const uint32_t listed_rows = lane == 0 ? record[0] : 0u;  // in flight with the blocks' loads
    const int64_t tiles = (c.cols + c.tile - 1) / c.tile;
    bool ok = true, overflow = false;
    for (int64_t t = lane; t < tiles; t += 32)
        ok &= twell_block_ok(words + t * c.words_per_block, t, c, vec, overflow, {seen + threadIdx.x, kCheckThreads});
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
