// Conversions between containers on the device. A sparse input is first read into sorted entry
// lists (rows of (column, bits), ascending columns: the order the reference's reader gives), and
// an output container is written from such lists, so that every sparse -> sparse operation
// (re-pack, transpose) is "read lists, maybe transpose them, write lists" and stores the
// reference's bits. Sparse -> dense scatters the entries straight into a zeroed matrix. Inputs
// are validated and complete before any of these run (container_ops.cu).
#pragma once

#include <cstdint>

#include "common/dependent_launch.cuh"
#include "kernels/container_args.cuh"
#include "kernels/container_inspect.cuh"

namespace twblas::cuda {

/// Rows of entries sorted by column: row r is [ptr[r], ptr[r + 1]).
struct EntryLists {
    const int64_t *ptr;
    int32_t *cols;
    uint32_t *bits;
};

__device__ inline const uint32_t *twell_row_words(const ContainerArgs &c, int64_t row) {
    return reinterpret_cast<const uint32_t *>(c.base) + row * c.ld;
}
__device__ inline int64_t twell_tiles(const ContainerArgs &c) { return (c.cols + c.tile - 1) / c.tile; }

/// Stored bits of ELL entry i of a hybrid row, and the row's backup values.
__device__ inline uint32_t ell_bits(const ContainerArgs &c, int64_t row, int64_t i) {
    return load_raw(c.base + c.ell_vals, row * c.ell_width + i, static_cast<int>(c.value_bytes));
}
__device__ inline const uint8_t *backup_row(const ContainerArgs &c, int64_t slot) {
    return c.base + c.backup_vals + static_cast<size_t>(slot * c.cols) * c.value_bytes;
}

__device__ inline void store_raw(const MatrixArg &m, int64_t r, int64_t c, uint32_t bits) {
    const int64_t i = r * m.rs + c * m.cs;
    if (m.type == TW_R_32F)
        static_cast<uint32_t *>(m.ptr)[i] = bits;
    else
        static_cast<uint16_t *>(m.ptr)[i] = static_cast<uint16_t>(bits);
}

// ---- sparse -> dense: the output is zeroed first; each warp writes one row's values

__global__ void scatter_to_dense(ContainerArgs in, bool twell, MatrixArg out) {
    const int64_t row = warp_row();
    if (row >= in.rows) return;
    const int lane = static_cast<int>(lane_id());
    if (twell) {
        const uint32_t *words = twell_row_words(in, row);
        for (int64_t t = lane; t < twell_tiles(in); t += 32) {
            const uint32_t *block = words + t * in.words_per_block;
            const int count = min(static_cast<int>(block[0] & kTwellCountMask), in.slots);
            for (int i = 0; i < count; ++i) {
                const uint32_t e = block[1 + i];
                if (e >> 16) store_raw(out, row, e & 0xffffu, e >> 16);
            }
        }
        return;
    }
    const int64_t n = at<const int32_t>(in, in.row_nnz)[row];
    if (n <= in.ell_width) {
        const uint16_t *cols = at<const uint16_t>(in, in.ell_cols) + row * in.ell_width;
        for (int64_t i = lane; i < n; i += 32) {
            const uint32_t b = ell_bits(in, row, i);
            if (b) store_raw(out, row, cols[i], b);
        }
        return;
    }
    const uint8_t *dense = backup_row(in, at<const int32_t>(in, in.backup_map)[row]);
    for (int64_t c = lane; c < in.cols; c += 32) {
        const uint32_t b = load_raw(dense, c, static_cast<int>(in.value_bytes));
        if (b) store_raw(out, row, c, b);
    }
}

/// TwELL -> dense in one pass when the output rows take 16-byte stores: each warp assembles its
/// row in shared memory, kSpanColumns at a time (zeros, then its tiles' entries, two bytes each),
/// and writes the span out with 16-byte stores, so that every global store is a whole chunk of
/// the row. (Zeros stored to global memory with the entries' 2-byte stores over them: 78 us at
/// 16384 x 5632 uniform-29 on an H100 against this one's 74, ncu; and llm-29's first tokens, 300
/// to 800 entries a row, put their thousands of scattered 2-byte stores on the few SMs that held
/// them, which ended the kernel: 86 us against this one's 79.) The first eight words of the lane's first
/// block are loaded before the verdict is awaited. Launched with kWarpsPerRowBlock warps per
/// block, on the stream right after the validation kernel: it writes nothing unless its verdict
/// is "valid and complete" (so the host reads one result back for both, and the output stays
/// untouched on a refusal). Launched dependent on the validation (PDL), it loads its first
/// blocks, then waits for the verdict, which its first thread publishes to the host (`published`,
/// mapped memory) and then posts (`posted`): the host returns from the call then, while the rows
/// are written. `vec`: the container's buffer is 16-byte aligned.
constexpr int kWarpsPerRowBlock = 4;
constexpr int kSpanColumns = 2048;  // a multiple of every tile width: a span holds whole tiles, at most 32
__global__ void __launch_bounds__(32 * kWarpsPerRowBlock) twell_rows_to_dense(ContainerArgs in, MatrixArg out, bool vec,
                                                                              const InspectResult *verdict,
                                                                              InspectResult *published,
                                                                              unsigned *posted) {
    __shared__ uint4 spans[kWarpsPerRowBlock][kSpanColumns / 8];
    const int64_t row = warp_row();
    const int lane = static_cast<int>(lane_id());
    const uint32_t *words = twell_row_words(in, row);
    const int64_t tiles = twell_tiles(in);
    uint32_t head[8] = {};
    if (row < in.rows && lane < tiles)
        load_block_head(words + lane * in.words_per_block, vec, head);  // the validation only reads them
    wait_for_prior_grid();
    const InspectResult v = *verdict;
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        *published = v;
        __threadfence_system();  // the verdict's bytes reach the host before the word that posts them
        *static_cast<volatile unsigned *>(posted) = 1;
    }
    if (row >= in.rows || !valid_and_complete(v)) return;
    uint4 *span = spans[threadIdx.x / 32];
    auto *span_values = reinterpret_cast<uint16_t *>(span);
    auto *dst = static_cast<uint16_t *>(out.ptr) + row * out.rs;
    // columns and tiles fit 32 bits (cols <= 65536): fewer registers than 64-bit indices
    const int cols = static_cast<int>(in.cols), tile = static_cast<int>(in.tile), ntiles = static_cast<int>(tiles);
    for (int t0 = 0; t0 < ntiles; t0 += 32) {  // the warp's lanes over 32 tiles a round
        const int t = t0 + lane;
        int count = 0;
        if (t < ntiles) {
            if (t0 != 0) load_block_head(words + static_cast<int64_t>(t) * in.words_per_block, vec, head);
            count = min(static_cast<int>(head[0] & kTwellCountMask), in.slots);
        }
        const int round_end = min((t0 + 32) * tile, cols);
        for (int s0 = t0 * tile; s0 < round_end; s0 += kSpanColumns) {
            const int s1 = min(s0 + kSpanColumns, round_end);
            for (int k = lane; k < kSpanColumns / 8; k += 32) span[k] = make_uint4(0, 0, 0, 0);
            __syncwarp();
            const bool mine = t < ntiles && t * tile >= s0 && t * tile < s1;
            if (mine) {
#pragma unroll
                for (int i = 0; i < 7; ++i)
                    if (i < count) span_values[(head[1 + i] & 0xffffu) - s0] = static_cast<uint16_t>(head[1 + i] >> 16);
            }
            for_round_tails<4>(words, t0, in.words_per_block, mine ? count : 0, [&](uint32_t e, int64_t) {
                span_values[(e & 0xffffu) - s0] = static_cast<uint16_t>(e >> 16);
            });
            __syncwarp();                      // the span's entries in place before any lane copies it out
            const int chunks = (s1 - s0) / 8;  // s0 is a multiple of 8: whole chunks, then the row's last values
            for (int k = lane; k < chunks; k += 32) reinterpret_cast<uint4 *>(dst + s0)[k] = span[k];
            for (int c = s0 + chunks * 8 + lane; c < s1; c += 32) dst[c] = span_values[c - s0];
            __syncwarp();  // copied out before the next span clears it
        }
    }
}

// ---- container -> entry lists

/// Number of entries of each row (stored +0 entries are no value, as in the reference's reader).
__global__ void count_row_entries(ContainerArgs in, bool twell, int64_t *counts) {
    const int64_t row = warp_row();
    if (row >= in.rows) return;
    const int lane = static_cast<int>(lane_id());
    long long n = 0;
    if (twell) {
        const uint32_t *words = twell_row_words(in, row);
        for (int64_t t = lane; t < twell_tiles(in); t += 32) {
            const uint32_t *block = words + t * in.words_per_block;
            const int count = min(static_cast<int>(block[0] & kTwellCountMask), in.slots);
            for (int i = 0; i < count; ++i) n += (block[1 + i] >> 16) != 0;
        }
    } else {
        const int64_t nnz = at<const int32_t>(in, in.row_nnz)[row];
        if (nnz <= in.ell_width) {
            for (int64_t i = lane; i < nnz; i += 32) n += ell_bits(in, row, i) != 0;
        } else {
            const uint8_t *dense = backup_row(in, at<const int32_t>(in, in.backup_map)[row]);
            for (int64_t c = lane; c < in.cols; c += 32) n += load_raw(dense, c, static_cast<int>(in.value_bytes)) != 0;
        }
    }
    n = warp_sum(n);
    if (lane == 0) counts[row] = n;
}

/// Each row's entries at out.ptr[row], sorted by column. Inside a TwELL block or an ELL row the
/// order is free, so each entry's place is its rank among the valued entries there.
__global__ void fill_row_entries(ContainerArgs in, bool twell, EntryLists out) {
    const int64_t row = warp_row();
    if (row >= in.rows) return;
    const int lane = static_cast<int>(lane_id());
    int64_t at_pos = out.ptr[row];
    if (twell) {
        const uint32_t *words = twell_row_words(in, row);
        const int64_t tiles = twell_tiles(in);
        for (int64_t t0 = 0; t0 < tiles; t0 += 32) {  // 32 tiles per round, one per lane
            const int64_t t = t0 + lane;
            const uint32_t *block = words + t * in.words_per_block;
            const int count = t < tiles ? min(static_cast<int>(block[0] & kTwellCountMask), in.slots) : 0;
            int valued = 0;
            for (int i = 0; i < count; ++i) valued += (block[1 + i] >> 16) != 0;
            const int incl = warp_scan_incl(valued);
            for (int i = 0; i < count; ++i) {
                const uint32_t e = block[1 + i];
                if (!(e >> 16)) continue;
                int rank = 0;
                for (int j = 0; j < count; ++j) rank += (block[1 + j] >> 16) != 0 && (block[1 + j] & 0xffffu) < (e & 0xffffu);
                out.cols[at_pos + incl - valued + rank] = static_cast<int32_t>(e & 0xffffu);
                out.bits[at_pos + incl - valued + rank] = e >> 16;
            }
            at_pos += __shfl_sync(kFullMask, incl, 31);
        }
        return;
    }
    const int64_t nnz = at<const int32_t>(in, in.row_nnz)[row];
    if (nnz <= in.ell_width) {
        const uint16_t *cols = at<const uint16_t>(in, in.ell_cols) + row * in.ell_width;
        for (int64_t i = lane; i < nnz; i += 32) {
            const uint32_t b = ell_bits(in, row, i);
            if (!b) continue;
            int64_t rank = 0;
            for (int64_t j = 0; j < nnz; ++j) rank += cols[j] < cols[i] && ell_bits(in, row, j) != 0;
            out.cols[at_pos + rank] = cols[i];
            out.bits[at_pos + rank] = b;
        }
        return;
    }
    const uint8_t *dense = backup_row(in, at<const int32_t>(in, in.backup_map)[row]);
    for (int64_t c0 = 0; c0 < in.cols; c0 += 32) {
        const int64_t c = c0 + lane;
        const uint32_t b = c < in.cols ? load_raw(dense, c, static_cast<int>(in.value_bytes)) : 0u;
        const uint32_t ballot = __ballot_sync(kFullMask, b != 0);
        if (b) {
            const int64_t pos = at_pos + __popc(ballot & ((1u << lane) - 1u));
            out.cols[pos] = static_cast<int32_t>(c);
            out.bits[pos] = b;
        }
        at_pos += __popc(ballot);
    }
}

// ---- transpose of entry lists: keys (columns) and payloads (row << 32 | bits) in row-major
// order; a stable radix sort by key then gives the columns' entries in ascending row order

__global__ void entries_to_pairs(EntryLists in, int64_t rows, uint16_t *keys, uint64_t *pairs) {
    const int64_t row = warp_row();
    if (row >= rows) return;
    for (int64_t i = in.ptr[row] + lane_id(); i < in.ptr[row + 1]; i += 32) {
        keys[i] = static_cast<uint16_t>(in.cols[i]);
        pairs[i] = (static_cast<uint64_t>(row) << 32) | in.bits[i];
    }
}

__global__ void count_keys(const uint16_t *keys, int64_t n, int64_t *counts) {
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
        atomicAdd(reinterpret_cast<unsigned long long *>(counts + keys[i]), 1ull);
}

__global__ void pairs_to_entries(const uint64_t *pairs, int64_t n, EntryLists out) {
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        out.cols[i] = static_cast<int32_t>(pairs[i] >> 32);
        out.bits[i] = static_cast<uint32_t>(pairs[i]);
    }
}

// ---- entry lists -> container (then assign_flagged_rows, and the hybrid's backup rows)

/// First index in [lo, hi) whose column is >= c.
__device__ inline int64_t lower_bound(const int32_t *cols, int64_t lo, int64_t hi, int64_t c) {
    while (lo < hi) {
        const int64_t mid = (lo + hi) / 2;
        if (cols[mid] < c) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/// TwELL, one warp per row, one lane per tile: the first S entries of each tile, the count, the
/// overflow bit; flags[row] = 1 when a tile overflows (the record is assigned afterwards).
__global__ void twell_from_entries(EntryLists in, ContainerArgs out, int32_t *flags) {
    const int64_t row = warp_row();
    if (row >= out.rows) return;
    const int lane = static_cast<int>(lane_id());
    uint32_t *words = reinterpret_cast<uint32_t *>(out.base) + row * out.ld;
    const int64_t p0 = in.ptr[row], p1 = in.ptr[row + 1];
    bool overflow = false;
    for (int64_t t = lane; t < twell_tiles(out); t += 32) {
        const int64_t lo = lower_bound(in.cols, p0, p1, t * out.tile), hi = lower_bound(in.cols, lo, p1, (t + 1) * out.tile);
        const int64_t count = hi - lo;
        uint32_t *block = words + t * out.words_per_block;
        const int64_t kept = min(count, static_cast<int64_t>(out.slots));
        for (int64_t i = 0; i < kept; ++i)
            block[1 + i] = static_cast<uint32_t>(in.cols[lo + i] & 0xffff) | (in.bits[lo + i] << 16);
        block[0] = static_cast<uint32_t>(kept) | (count > out.slots ? kTwellOverflowBit : 0u);
        overflow |= count > out.slots;
    }
    overflow = __any_sync(kFullMask, overflow);
    if (lane == 0) flags[row] = overflow ? 1 : 0;
}

/// Hybrid ELL part, one warp per row; flags[row] = 1 for a row over the ELL width.
__global__ void hybrid_from_entries(EntryLists in, ContainerArgs out, int32_t *flags) {
    const int64_t row = warp_row();
    if (row >= out.rows) return;
    const int lane = static_cast<int>(lane_id());
    const int64_t p0 = in.ptr[row], n = in.ptr[row + 1] - p0;
    if (n <= out.ell_width) {
        uint16_t *ecols = at<uint16_t>(out, out.ell_cols) + row * out.ell_width;
        uint8_t *evals = out.base + out.ell_vals + static_cast<size_t>(row * out.ell_width) * out.value_bytes;
        for (int64_t i = lane; i < n; i += 32) {
            ecols[i] = static_cast<uint16_t>(in.cols[p0 + i]);
            if (out.value_bytes == 4)
                reinterpret_cast<uint32_t *>(evals)[i] = in.bits[p0 + i];
            else
                reinterpret_cast<uint16_t *>(evals)[i] = static_cast<uint16_t>(in.bits[p0 + i]);
        }
    }
    if (lane == 0) {
        at<int32_t>(out, out.row_nnz)[row] = static_cast<int32_t>(n);
        at<int32_t>(out, out.backup_map)[row] = -1;
        flags[row] = n > out.ell_width ? 1 : 0;
    }
}

/// A hybrid's backup rows (flags[row] = 2 + slot after assign_flagged_rows), one block per row:
/// zeroed, then the row's entries.
__global__ void hybrid_backup_from_entries(EntryLists in, ContainerArgs out, const int32_t *flags) {
    const int64_t row = blockIdx.x;
    const int slot = flags[row] - 2;
    if (slot < 0) return;
    uint8_t *dense = out.base + out.backup_vals + static_cast<size_t>(slot * out.cols) * out.value_bytes;
    for (int64_t c = threadIdx.x; c < out.cols; c += blockDim.x) {
        if (out.value_bytes == 4)
            reinterpret_cast<uint32_t *>(dense)[c] = 0;
        else
            reinterpret_cast<uint16_t *>(dense)[c] = 0;
    }
    __syncthreads();
    for (int64_t i = in.ptr[row] + threadIdx.x; i < in.ptr[row + 1]; i += blockDim.x) {
        if (out.value_bytes == 4)
            reinterpret_cast<uint32_t *>(dense)[in.cols[i]] = in.bits[i];
        else
            reinterpret_cast<uint16_t *>(dense)[in.cols[i]] = static_cast<uint16_t>(in.bits[i]);
    }
}

// ---- dense -> sparse analysis: rows the compact part cannot hold

/// Whether a row does not fit the compact part, by its warp: a TwELL tile over S kept values, or
/// a hybrid row over E; 256 columns per step (8 per lane). A step's tiles are counted one by one
/// only when the whole step keeps more than S values, which sparse rows never do. `Vec16`: rows
/// of 16-bit values of the container's type on 16 bytes, read as write_twell_rows16 reads them
/// (the next step's chunk in flight while this one is counted). An instantiation each, so that
/// the general reader's registers (it converts types) do not cost the common one its occupancy
/// (one kernel for both took 71 registers against 32).
template <bool Vec16>
__device__ inline bool count_row_misses(const MatrixArg &in, twConvertOp_t op, const ContainerArgs &out, bool twell,
                                        int64_t row, int lane) {
    const int cols = static_cast<int>(out.cols);
    const int lanes_per_tile = twell ? out.tile / 8 : 32;
    const int first = lane & ~(lanes_per_tile - 1);
    bool miss = false;
    int64_t total = 0;
    auto count = [&](int n) {  // a step in which this lane keeps n values
        const int step = static_cast<int>(__reduce_add_sync(kFullMask, static_cast<unsigned>(n)));
        if (!twell) {
            total += step;
        } else if (step > out.slots) {
            const int incl = warp_scan_incl(n);
            const int tile_count = __shfl_sync(kFullMask, incl, first + lanes_per_tile - 1) -
                                   (__shfl_sync(kFullMask, incl, first) - __shfl_sync(kFullMask, n, first));
            miss |= tile_count > out.slots;
        }
    };
    if constexpr (Vec16) {
        const uint16_t *src = static_cast<const uint16_t *>(in.ptr) + row * in.rs;
        const uint32_t nan_bias = nan_bias16(out.type);
        const bool relu = op == TW_CONVERT_RELU;
        uint4 next = load8_row16(src, lane * 8, cols);
        for (int c0 = 0; c0 < cols; c0 += 256) {
            const uint4 q = next;
            if (c0 + 256 < cols) next = load8_row16(src, c0 + 256 + lane * 8, cols);
            count(__popc(kept8(q, nan_bias, relu)));
        }
    } else {
        for (int64_t c0 = 0; c0 < out.cols; c0 += 256) {
            uint32_t bits[8];
            count(__popc(load8_kept(in, row, c0 + lane * 8, out.cols, out.type, false, op, bits)));
        }
    }
    return twell ? __any_sync(kFullMask, miss) : total > out.ell_width;
}

/// A warp per row, the rows in turn over a capped grid (as container_info's): the rows that do not
/// fit go to result->nnz, which the last warp publishes. The 16-bit reader is held to 32
/// registers, so that the 16 blocks an SM of that grid are all resident at once.
template <bool Vec16>
__global__ void __launch_bounds__(128, Vec16 ? 16 : 8) count_compact_misses(MatrixArg in, twConvertOp_t op, ContainerArgs out, bool twell,
                                     InspectResult *result, InspectResult *clear, InspectResult *published) {
    clear_other_slot(clear);
    const int lane = static_cast<int>(lane_id());
    const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
    unsigned long long misses = 0;
    for (int64_t row = warp_row(); row < out.rows; row += warps)
        misses += count_row_misses<Vec16>(in, op, out, twell, row, lane) ? 1 : 0;
    if (lane == 0) {
        if (misses) atomicAdd(&result->nnz, misses);
        publish_when_last(result, published, static_cast<unsigned long long>(warps));
    }
}

}  // namespace twblas::cuda
