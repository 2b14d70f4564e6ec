// Kernels on the sparse containers of docs/formats.md: the dense -> TwELL / hybrid writer and
// SpMM. Value types are run-time arguments (one instantiation each) since these are building
// blocks, not the FFN's hot loop. Included by sparse_ops.cu only (kernels are defined here).
#pragma once

#include <cub/block/block_scan.cuh>

#include "kernels/container_args.cuh"

namespace twblas::cuda {

// ---- writer: TwELL, one warp per row, 256 columns (8 per lane) per step

/// One step of a TwELL row, 256 columns from c0 (at most 65536 columns: 32-bit arithmetic): the
/// lanes' kept columns (c0 + 8 lane + j for bit j of `kept`, value j of the chunk `q`) into their
/// tiles' slots in ascending column order, and the tiles' headers; whether any of this lane's
/// tiles is over its slots. A lane visits only its kept columns, and a step with nothing kept in
/// the warp (about a quarter of them at 29 active units in 5632) writes its headers only.
/// (The step this replaced divided a 64-bit column by the tile width and tested each of its eight
/// values in turn: 123 us at 16384 x 5632 bf16 on an H100, ncu, against 73 for the analysis
/// reading the same bytes.)
__device__ inline bool write_twell_step(const ContainerArgs &out, int tile_shift, uint32_t *words, int c0, int lane,
                                        unsigned kept, const uint4 &q) {
    const int lanes_per_tile = out.tile >> 3;
    const int first = lane & ~(lanes_per_tile - 1);
    uint32_t *block = words + ((c0 >> tile_shift) + (first >> (tile_shift - 3))) * out.words_per_block;
    const bool header = lane == first && c0 + first * 8 < out.cols;
    if (__ballot_sync(kFullMask, kept) == 0) {
        if (header) block[0] = 0;
        return false;
    }
    const int n = __popc(kept);
    const int incl = warp_scan_incl(n);
    const int tile_base = __shfl_sync(kFullMask, incl - n, first);
    const int tile_count = __shfl_sync(kFullMask, incl, first + lanes_per_tile - 1) - tile_base;
    int rank = incl - n - tile_base;
    for (unsigned b = kept; b; b &= b - 1, ++rank) {
        const int j = __ffs(b) - 1;
        if (rank < out.slots) block[1 + rank] = static_cast<uint32_t>(c0 + lane * 8 + j) | chunk_bits16(q, j) << 16;
    }
    const bool over = tile_count > out.slots;
    if (header) block[0] = static_cast<uint32_t>(min(tile_count, out.slots)) | (over ? kTwellOverflowBit : 0u);
    return over;
}

/// TwELL from any dense input (another value type, rows not on 16 bytes, an active mask): the
/// eight columns' values converted to the container's 16-bit type, packed as write_twell_step
/// takes them.
__global__ void write_twell_rows(MatrixArg in, ActiveMask mask, twConvertOp_t op, ContainerArgs out, bool vec,
                                 int32_t *flags) {
    const int64_t row = warp_row();
    if (row >= out.rows) return;
    const int lane = static_cast<int>(lane_id());
    const int tile_shift = __ffs(out.tile) - 1;
    uint32_t *words = reinterpret_cast<uint32_t *>(out.base) + row * out.ld;
    bool overflow = false;
    for (int c0 = 0; c0 < out.cols; c0 += 256) {
        uint32_t bits[8] = {};  // a chunk outside the mask is not read
        const unsigned kept = load8_active(in, mask, row, c0 + lane * 8, out.cols, out.type, vec, op, bits);
        const uint4 q = make_uint4(bits[0] | bits[1] << 16, bits[2] | bits[3] << 16, bits[4] | bits[5] << 16,
                                   bits[6] | bits[7] << 16);
        overflow |= write_twell_step(out, tile_shift, words, c0, lane, kept, q);
    }
    overflow = __any_sync(kFullMask, overflow);
    if (lane == 0) flags[row] = overflow ? 1 : 0;
}

/// write_twell_rows for rows of 16-bit values of the container's type on 16 bytes with no mask
/// (a user's twDenseToSparse_convert): the kept columns from kept8, two halves of a word at a
/// time, and the next step's chunk loaded before this step's stores.
__global__ void write_twell_rows16(MatrixArg in, twConvertOp_t op, ContainerArgs out, int32_t *flags) {
    const int64_t row = warp_row();
    if (row >= out.rows) return;
    const int lane = static_cast<int>(lane_id());
    const int cols = static_cast<int>(out.cols);
    const int tile_shift = __ffs(out.tile) - 1;
    const bool relu = op == TW_CONVERT_RELU;
    const uint32_t nan_bias = nan_bias16(out.type);
    uint32_t *words = reinterpret_cast<uint32_t *>(out.base) + row * out.ld;
    const uint16_t *src = static_cast<const uint16_t *>(in.ptr) + row * in.rs;
    bool overflow = false;
    uint4 next = load8_row16(src, lane * 8, cols);
    for (int c0 = 0; c0 < cols; c0 += 256) {
        const uint4 q = next;
        if (c0 + 256 < cols) next = load8_row16(src, c0 + 256 + lane * 8, cols);
        overflow |= write_twell_step(out, tile_shift, words, c0, lane, kept8(q, nan_bias, relu), q);
    }
    overflow = __any_sync(kFullMask, overflow);
    if (lane == 0) flags[row] = overflow ? 1 : 0;
}

/// write_twell_rows under an active mask, for 16-bit values of the container's type in rows on
/// 16 bytes (the masked gate GEMM's output, ~0.5 % active): a lane per 32-column mask word,
/// 1024 columns a step, and only the set bits' values read. The 8-columns-a-lane writer spent
/// ~245 instructions a step on every column (measured on an H100 at 16384 x 5632: 148 us, ncu:
/// issue-bound at 59 %). Each lane loads kMaskedWordsInFlight steps' mask words at once, then
/// for each word the 8 values around its first set bit (most words hold one), so a group of
/// steps costs two round trips, not two a step (48.8 us at 16384 x 5632 with one step at a time).
/// RELU keeps every masked entry (they are > 0 or NaN); PLAIN drops masked entries that are +0
/// (an FFN's h = g u may be).
constexpr int kMaskedWordsInFlight = 4;
__global__ void write_twell_rows_masked(MatrixArg in, ActiveMask mask, twConvertOp_t op, ContainerArgs out,
                                        int32_t *flags) {
    const int64_t row = warp_row();
    if (row >= out.rows) return;
    const int lane = static_cast<int>(lane_id());
    const int lanes_per_tile = out.tile / 32;  // 2, 4 or 8: a tile's words are adjacent lanes
    const int first = lane & ~(lanes_per_tile - 1);
    uint32_t *words = reinterpret_cast<uint32_t *>(out.base) + row * out.ld;
    const uint32_t *mrow = mask.words + row * mask.ld;
    const uint16_t *vrow = static_cast<const uint16_t *>(in.ptr) + row * in.rs;
    const int64_t nwords = (out.cols + 31) / 32;
    bool overflow = false;
    for (int64_t g0 = 0; g0 < nwords; g0 += 32 * kMaskedWordsInFlight) {
        uint32_t m[kMaskedWordsInFlight];
        uint4 v[kMaskedWordsInFlight];
        int64_t near[kMaskedWordsInFlight];  // the first of the 8 columns in v[k] (-1: none loaded)
#pragma unroll
        for (int k = 0; k < kMaskedWordsInFlight; ++k) {
            const int64_t w = g0 + 32 * k + lane;
            m[k] = w < nwords ? mrow[w] : 0u;
        }
#pragma unroll
        for (int k = 0; k < kMaskedWordsInFlight; ++k) {
            near[k] = -1;
            if (m[k]) {
                near[k] = ((g0 + 32 * k + lane) * 32 + __ffs(m[k]) - 1) & ~int64_t{7};
                v[k] = *reinterpret_cast<const uint4 *>(vrow + near[k]);
            }
        }
#pragma unroll
        for (int k = 0; k < kMaskedWordsInFlight; ++k) {
            if (g0 + 32 * k >= nwords) break;  // uniform across the warp
            const int64_t w = g0 + 32 * k + lane;
            auto value = [&](int64_t col) -> uint32_t {
                return (col & ~int64_t{7}) == near[k] ? chunk_bits16(v[k], static_cast<int>(col & 7)) : vrow[col];
            };
            uint32_t bits = m[k];
            if (op != TW_CONVERT_RELU)
                for (uint32_t b = bits; b; b &= b - 1)
                    if (value(w * 32 + __ffs(b) - 1) == 0) bits &= ~(1u << (__ffs(b) - 1));
            const int n = __popc(bits);
            int incl = n;  // inclusive scan over the tile's lanes
            for (int o = 1; o < lanes_per_tile; o <<= 1) {
                const int t = __shfl_up_sync(0xffffffffu, incl, o, lanes_per_tile);
                if ((lane & (lanes_per_tile - 1)) >= o) incl += t;
            }
            const int tile_count = __shfl_sync(0xffffffffu, incl, first + lanes_per_tile - 1);
            const int64_t tile = w * 32 / out.tile;
            uint32_t *block = words + tile * out.words_per_block;
            int rank = incl - n;
            for (uint32_t b = bits; b; b &= b - 1) {
                const int64_t col = w * 32 + __ffs(b) - 1;
                if (rank < out.slots) block[1 + rank] = static_cast<uint32_t>(col & 0xffff) | value(col) << 16;
                ++rank;
            }
            const bool over = tile_count > out.slots;
            if (lane == first && tile * out.tile < out.cols)
                block[0] = static_cast<uint32_t>(min(tile_count, out.slots)) | (over ? kTwellOverflowBit : 0u);
            overflow |= __any_sync(0xffffffffu, over);
        }
    }
    if (lane == 0) flags[row] = overflow ? 1 : 0;
}

// ---- writer: hybrid ELL part, one warp per row, 256 columns (8 per lane) per step (rows over
// E are flagged for a backup slot)

__global__ void write_hybrid_rows(MatrixArg in, ActiveMask mask, twConvertOp_t op, ContainerArgs out, bool vec,
                                  int32_t *flags) {
    const int64_t row = warp_row();
    if (row >= out.rows) return;
    const int lane = static_cast<int>(lane_id());
    uint16_t *ecols = at<uint16_t>(out, out.ell_cols) + row * out.ell_width;
    uint8_t *evals = out.base + out.ell_vals + static_cast<size_t>(row * out.ell_width) * out.value_bytes;
    int total = 0;
    for (int64_t c0 = 0; c0 < out.cols; c0 += 256) {
        uint32_t bits[8];
        const unsigned kept = load8_active(in, mask, row, c0 + lane * 8, out.cols, out.type, vec, op, bits);
        const int n = __popc(kept);
        const int incl = warp_scan_incl(n);
        int pos = total + incl - n;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            if (!(kept >> j & 1u)) continue;
            if (pos < out.ell_width) {
                ecols[pos] = static_cast<uint16_t>(c0 + lane * 8 + j);
                if (out.value_bytes == 4)
                    reinterpret_cast<uint32_t *>(evals)[pos] = bits[j];
                else
                    reinterpret_cast<uint16_t *>(evals)[pos] = static_cast<uint16_t>(bits[j]);
            }
            ++pos;
        }
        total += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane == 0) {
        at<int32_t>(out, out.row_nnz)[row] = total;
        at<int32_t>(out, out.backup_map)[row] = -1;
        flags[row] = total > out.ell_width ? 1 : 0;
    }
}

/// write_hybrid_rows for rows of 16-bit values of the container's type on 16 bytes with no mask,
/// as write_twell_rows16 is to write_twell_rows: kept columns from kept8, only kept columns
/// visited, a step with nothing kept in the warp skipped, the next chunk in flight.
__global__ void write_hybrid_rows16(MatrixArg in, twConvertOp_t op, ContainerArgs out, int32_t *flags) {
    const int64_t row = warp_row();
    if (row >= out.rows) return;
    const int lane = static_cast<int>(lane_id());
    const int cols = static_cast<int>(out.cols);
    const bool relu = op == TW_CONVERT_RELU;
    const uint32_t nan_bias = nan_bias16(out.type);
    uint16_t *ecols = at<uint16_t>(out, out.ell_cols) + row * out.ell_width;
    uint16_t *evals = reinterpret_cast<uint16_t *>(out.base + out.ell_vals) + row * out.ell_width;
    const uint16_t *src = static_cast<const uint16_t *>(in.ptr) + row * in.rs;
    int total = 0;
    uint4 next = load8_row16(src, lane * 8, cols);
    for (int c0 = 0; c0 < cols; c0 += 256) {
        const uint4 q = next;
        if (c0 + 256 < cols) next = load8_row16(src, c0 + 256 + lane * 8, cols);
        const unsigned kept = kept8(q, nan_bias, relu);
        if (__ballot_sync(kFullMask, kept) == 0) continue;
        const int n = __popc(kept);
        const int incl = warp_scan_incl(n);
        int pos = total + incl - n;
        for (unsigned b = kept; b; b &= b - 1, ++pos) {
            const int j = __ffs(b) - 1;
            if (pos < out.ell_width) {
                ecols[pos] = static_cast<uint16_t>(c0 + lane * 8 + j);
                evals[pos] = static_cast<uint16_t>(chunk_bits16(q, j));
            }
        }
        total += __shfl_sync(kFullMask, incl, 31);
    }
    if (lane == 0) {
        at<int32_t>(out, out.row_nnz)[row] = total;
        at<int32_t>(out, out.backup_map)[row] = -1;
        flags[row] = total > out.ell_width ? 1 : 0;
    }
}

/// One block: flagged rows get consecutive record entries / backup slots in ascending row order.
/// The rows go by in chunks of kScanThreads x kScanRowsPerThread, each thread reading its 16
/// consecutive flags with four 16-byte loads, then one block scan a chunk: a chunk costs one
/// round trip. (A thread walking rows / 1024 flags one load at a time, twice, took 11.8 us at
/// 16384 rows on an H100, ncu.) `published` (or null): host memory the count also goes to, for a
/// setup call's status.
constexpr int kScanThreads = 1024, kScanRowsPerThread = 16;
__global__ void __launch_bounds__(kScanThreads) assign_flagged_rows(int32_t *flags, int64_t rows, ContainerArgs out,
                                                                    bool twell, int32_t *published) {
    using Scan = cub::BlockScan<int, kScanThreads>;
    __shared__ typename Scan::TempStorage temp;
    const bool vec = reinterpret_cast<uintptr_t>(flags) % 16 == 0;
    uint32_t *record = reinterpret_cast<uint32_t *>(out.base) + out.record;
    int before = 0;  // flagged rows of the chunks already done
    for (int64_t chunk = 0; chunk < rows; chunk += int64_t{kScanThreads} * kScanRowsPerThread) {
        const int64_t lo = chunk + static_cast<int64_t>(threadIdx.x) * kScanRowsPerThread;
        int f[kScanRowsPerThread];
        if (vec && lo + kScanRowsPerThread <= rows) {
#pragma unroll
            for (int q = 0; q < kScanRowsPerThread / 4; ++q) {
                const int4 v = reinterpret_cast<const int4 *>(flags + lo)[q];
                f[4 * q] = v.x, f[4 * q + 1] = v.y, f[4 * q + 2] = v.z, f[4 * q + 3] = v.w;
            }
        } else {
#pragma unroll
            for (int k = 0; k < kScanRowsPerThread; ++k) f[k] = lo + k < rows ? flags[lo + k] : 0;
        }
        int mine = 0;
#pragma unroll
        for (int k = 0; k < kScanRowsPerThread; ++k) mine += f[k];
        int offset = 0, total = 0;
        Scan(temp).ExclusiveSum(mine, offset, total);
        offset += before;
        if (mine) {
#pragma unroll
            for (int k = 0; k < kScanRowsPerThread; ++k) {
                if (!f[k]) continue;
                const int64_t r = lo + k;
                if (twell) {
                    record[1 + offset] = static_cast<uint32_t>(r);
                } else if (offset < out.backup_rows) {
                    at<int32_t>(out, out.backup_map)[r] = offset;
                    at<int32_t>(out, out.backup_row_ids)[offset] = static_cast<int32_t>(r);
                    flags[r] = 2 + offset;  // the backup kernel's slot, shifted past the 0/1 flags
                }
                ++offset;
            }
        }
        before += total;
        __syncthreads();  // the next chunk's scan reuses temp
    }
    if (threadIdx.x == 0) {
        if (twell)
            record[0] = static_cast<uint32_t>(before);
        else
            at<int32_t>(out, out.backup_count)[0] = before;
        if (published) *published = before;
    }
}

/// Dense backup rows of a hybrid: one block per row that got a slot.
__global__ void write_hybrid_backup(MatrixArg in, ActiveMask mask, twConvertOp_t op, ContainerArgs out,
                                    const int32_t *flags) {
    const int64_t row = blockIdx.x;
    const int slot = flags[row] - 2;
    if (slot < 0) return;
    uint8_t *dense = out.base + out.backup_vals + static_cast<size_t>(slot * out.cols) * out.value_bytes;
    for (int64_t c = threadIdx.x; c < out.cols; c += blockDim.x) {
        const bool live = !mask.words || (mask.words[row * mask.ld + c / 32] >> (c % 32) & 1u);
        uint32_t bits = live ? container_bits(in, row, c, out.type) : 0u;
        if (!keeps(bits, out.type, op)) bits = 0;
        if (out.value_bytes == 4)
            reinterpret_cast<uint32_t *>(dense)[c] = bits;
        else
            reinterpret_cast<uint16_t *>(dense)[c] = static_cast<uint16_t>(bits);
    }
}

// ---- SpMM: one block per row of S, each thread owning columns tid, tid + 128, ...

constexpr int kSpmmThreads = 128;
constexpr int kSpmmCols = 8;  // columns per thread per pass

__device__ inline void spmm_finish(float alpha, float beta, const MatrixArg &y, int64_t row, int64_t n0,
                                   const float *acc, bool poison) {
    for (int i = 0; i < kSpmmCols; ++i) {
        const int64_t n = n0 + static_cast<int64_t>(i) * kSpmmThreads;
        if (n >= y.cols) break;
        float v = poison ? __uint_as_float(0x7fc00000u) : alpha * acc[i];
        if (!poison && beta != 0.0f) v += beta * load_f(y, row, n);
        store_f(y, row, n, v);
    }
}

__global__ void __launch_bounds__(kSpmmThreads) spmm_rows(float alpha, ContainerArgs s, bool twell, MatrixArg w,
                                                          float beta, MatrixArg y) {
    const int64_t row = blockIdx.x;
    const twDataType_t st = s.type;
    for (int64_t n0 = threadIdx.x; n0 < y.cols; n0 += static_cast<int64_t>(kSpmmThreads) * kSpmmCols) {
        float acc[kSpmmCols] = {};
        bool incomplete = false;
        auto add = [&](int64_t k, float v) {
            for (int i = 0; i < kSpmmCols; ++i) {
                const int64_t n = n0 + static_cast<int64_t>(i) * kSpmmThreads;
                if (n < y.cols) acc[i] += v * load_f(w, k, n);
            }
        };
        if (twell) {
            const uint32_t *words = reinterpret_cast<const uint32_t *>(s.base) + row * s.ld;
            const int64_t tiles = (s.cols + s.tile - 1) / s.tile;
            for (int64_t t = 0; t < tiles; ++t) {
                const uint32_t *block = words + t * s.words_per_block;
                const uint32_t head = block[0];
                incomplete |= (head & kTwellOverflowBit) != 0;
                const int count = min(static_cast<int>(head & kTwellCountMask), s.slots);
                for (int i = 0; i < count; ++i) {
                    const uint32_t e = block[1 + i];
                    add(e & 0xffffu, decode(e >> 16, st));
                }
            }
        } else {
            const int nnz = at<const int32_t>(s, s.row_nnz)[row];
            if (nnz <= s.ell_width) {
                const uint16_t *ecols = at<const uint16_t>(s, s.ell_cols) + row * s.ell_width;
                const uint8_t *evals = s.base + s.ell_vals + static_cast<size_t>(row * s.ell_width) * s.value_bytes;
                for (int i = 0; i < nnz; ++i)
                    add(ecols[i], decode(load_raw(evals, i, static_cast<int>(s.value_bytes)), st));
            } else {
                const int slot = at<const int32_t>(s, s.backup_map)[row];
                if (slot < 0) {
                    incomplete = true;
                } else {
                    const uint8_t *dense = s.base + s.backup_vals + static_cast<size_t>(slot * s.cols) * s.value_bytes;
                    for (int64_t k = 0; k < s.cols; ++k) {
                        const uint32_t raw = load_raw(dense, k, static_cast<int>(s.value_bytes));
                        if (raw != 0) add(k, decode(raw, st));
                    }
                }
            }
        }
        spmm_finish(alpha, beta, y, row, n0, acc, incomplete);
    }
}


}  // namespace twblas::cuda
