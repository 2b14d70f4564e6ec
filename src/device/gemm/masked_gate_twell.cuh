// twGemmToSparse into a TwELL container in one kernel: the masked gate GEMM whose idle producer
// warp builds the TwELL blocks of each finished tile while the consumer warpgroups run the next
// tile's mainloop.
//
// Before, a writer pass read the GEMM's words and active values back (~45 us at 16384 x 5632 on an
// H100, 1.08x cuBLAS in all). Building the blocks in the consumers' epilogue cost the tensor cores
// more than the pass (bench/NOTES.md, 2026-11-26 and 2026-11-27): every instruction there is time
// the mainloop does not run. Here the consumers stage each tile's words in shared memory (the
// values go to the gate buffer as in the masked GEMM); the producer warpgroup's epilogue-load warp,
// idle in this kernel (no source operand), writes the blocks from them and the values, read back
// from L2. Two staging buffers: a tile is staged while the writer builds the one before.
#pragma once

#include <cutlass/arch/barrier.h>

#include "common/values.cuh"
#include "gemm/masked_gate_gemm.cuh"
#include "host/formats.hpp"

namespace twblas::cuda::masked_gate {

constexpr int kTwellRows = 128, kTwellCols = 256, kTwellWords = kTwellCols / 32;
constexpr int kStagedPitch = kTwellWords + 1;  // a row's words, padded: lanes read rows 36 bytes apart
/// Rows of the tile with at most this many active values are written a lane each, their values'
/// loads all in flight at once; a row with more, by the whole warp (a lane's 8 columns).
constexpr int kLaneRowValues = 4;
/// Timing only, never a result: -DTWBLAS_TWELL_PROBE=1 builds a writer that takes the tiles but
/// writes nothing, =2 no hand-off at all (the container keeps what it held).
#ifndef TWBLAS_TWELL_PROBE
#define TWBLAS_TWELL_PROBE 0
#endif

/// Two buffers of a tile's words and their barriers: `staged[b]` completes a phase when the 256
/// consumer threads have staged a tile's words into buffer b, `taken[b]` when the writer's lanes
/// are done with it (each thread arrives: its own release, which the race checker follows). A consumer warp waits only
/// for its buffer to be free (two tiles' slack), so the warpgroups never wait for each other or for the writer while it
/// keeps up. The values stay in the gate buffer (L2): staging them too, an atomic and a store at each of the 128
/// accumulator pairs of the consumers' unrolled epilogue, cost the GEMM ~7 %.
struct TwellShared {
    uint32_t words[2][kTwellRows][kStagedPitch];
    uint64_t staged[2], taken[2];
};

CUTLASS_DEVICE void wait_phase(uint64_t &bar, uint32_t parity) { cutlass::arch::ClusterBarrier::wait(&bar, parity); }

/// The consumers' side: MaskedEpilogue's values, and the tile's words staged for the writer.
template <class T>
class TwellStagingEpilogue : public MaskedEpilogue<T, kTwellCols> {
    using Base = MaskedEpilogue<T, kTwellCols>;

  public:
    using typename Base::Params;
    using SharedStorage = TwellShared;
    using TensorStorage = SharedStorage;

    CUTLASS_HOST_DEVICE explicit TwellStagingEpilogue(Params const &params, SharedStorage const & = SharedStorage())
        : Base(params) {}

    template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine, class FrgLayout,
              class TiledMma, class ResidueMNK>
    CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_mnk,
                                   BlockCoordMNKL blk_coord_mnkl, cute::Tensor<FrgEngine, FrgLayout> const &acc,
                                   TiledMma tiled_mma, ResidueMNK, int thread_idx, char *smem) {
        if constexpr (TWBLAS_TWELL_PROBE == 2) {
            this->store_tile(
                problem_shape_mnkl, blk_shape_mnk, blk_coord_mnkl, acc, tiled_mma, thread_idx,
                [](int64_t, int64_t, int, int, uint32_t) {}, [](int, int, uint32_t) {});
            return;
        }
        TwellShared &shared = *reinterpret_cast<TwellShared *>(smem);
        const int b = tiles_ & 1;
        wait_phase(shared.taken[b], ((tiles_ >> 1) & 1) ^ 1);
        ++tiles_;
        auto &words = shared.words[b];
        this->store_tile(
            problem_shape_mnkl, blk_shape_mnk, blk_coord_mnkl, acc, tiled_mma, thread_idx,
            [&](int64_t, int64_t, int lr, int w, uint32_t word) { words[lr][w] = word; }, [](int, int, uint32_t) {});
        cutlass::arch::ClusterBarrier::arrive(&shared.staged[b]);  // releases this thread's values and words
    }

  private:
    int tiles_ = 0;
};

/// A tile's place in the problem, as the writer needs it.
struct TileSpan {
    int64_t m0, n0;
    int m_rem, n_rem;
};

/// A row with many active values, by the whole warp: a lane's 8 columns of the tile from one
/// 16-byte load of the gate buffer, ranked in their TwELL block by a scan over the block's lanes;
/// entries past `slots` dropped (the header says so).
template <class T>
CUTLASS_DEVICE void write_heavy_row(const MaskedEpilogueArgs<T> &p, const uint32_t (&words)[kStagedPitch],
                                    const TileSpan &s, int r, int lane) {
    const TwellTarget &t = p.twell;
    const int64_t row = s.m0 + r, c = s.n0 + lane * 8;
    const bool inside = lane * 8 < s.n_rem;
    const unsigned kept = inside ? (words[lane / 4] >> (lane % 4 * 8)) & 0xffu : 0u;
    uint4 q = make_uint4(0, 0, 0, 0);
    if (kept) q = __ldcg(reinterpret_cast<const uint4 *>(reinterpret_cast<const uint16_t *>(p.gate) + row * p.ldg + c));
    const int lanes_per_block = t.tile / 8, first = lane & ~(lanes_per_block - 1);
    const int n = __popc(kept);
    int incl = n;  // inclusive scan over the block's lanes
    for (int o = 1; o < lanes_per_block; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane - first >= o) incl += v;
    }
    uint32_t *block = t.base + row * t.ld + c / t.tile * t.words_per_block;
    int rank = incl - n;
    for (unsigned bits = kept; bits && rank < t.slots; bits &= bits - 1, ++rank) {
        const int j = __ffs(bits) - 1;
        block[1 + rank] = static_cast<uint32_t>((c + j) & 0xffff) | chunk_bits16(q, j) << 16;
    }
}

/// The writer: the tile's rows a lane each, every TwELL block of the row inside the tile from the
/// staged words (its header, then up to `slots` entries in column order, their values read back
/// from the gate buffer all at once), a row's overflow flag set where a block holds more than
/// `slots`; rows with more than kLaneRowValues values by the whole warp after. The same blocks as
/// write_twell_rows_masked writes under ReLU.
template <class T>
CUTLASS_DEVICE void write_twell_tile(const MaskedEpilogueArgs<T> &p, const uint32_t (&words)[kTwellRows][kStagedPitch],
                                     const TileSpan &s, int lane) {
    const TwellTarget &t = p.twell;
    const int words_per_block = t.tile / 32, blocks = kTwellCols / t.tile;
    const int words_in = (s.n_rem + 31) / 32;  // words past the problem's columns were not staged
    for (int r0 = 0; r0 < kTwellRows; r0 += 32) {
        const int r = r0 + lane;
        const bool row_in = r < s.m_rem;
        int total = 0;
        if (row_in) {
            const int64_t row = s.m0 + r;
            uint32_t *out = t.base + row * t.ld;
            bool over = false;
            for (int k = 0; k < blocks; ++k) {
                const int64_t c0 = s.n0 + static_cast<int64_t>(k) * t.tile;
                if (c0 >= t.cols) break;
                int count = 0;
                for (int j = 0; j < words_per_block && k * words_per_block + j < words_in; ++j)
                    count += __popc(words[r][k * words_per_block + j]);
                const bool block_over = count > t.slots;
                out[c0 / t.tile * t.words_per_block] =
                    static_cast<uint32_t>(min(count, t.slots)) | (block_over ? kTwellOverflowBit : 0u);
                over |= block_over;
                total += count;
            }
            if (over) t.flags[row] = 1;
            if (total <= kLaneRowValues) {
                // the columns in ascending order, 8 bits each in one register (an indexed array
                // would live in local memory), then every value's load before the first store
                uint32_t cols = 0;
                for (int w = 0, n = 0; w < words_in; ++w)
                    for (uint32_t bits = words[r][w]; bits; bits &= bits - 1, ++n)
                        cols |= static_cast<uint32_t>(w * 32 + __ffs(bits) - 1) << (8 * n);
                const uint16_t *values = reinterpret_cast<const uint16_t *>(p.gate) + row * p.ldg + s.n0;
                uint32_t v[kLaneRowValues];
#pragma unroll
                for (int i = 0; i < kLaneRowValues; ++i)
                    v[i] = i < total ? __ldcg(values + (cols >> (8 * i) & 0xffu)) : 0u;
                int rank = 0;
#pragma unroll
                for (int i = 0; i < kLaneRowValues; ++i) {
                    const int col = static_cast<int>(cols >> (8 * i) & 0xffu);
                    rank = i > 0 && col / t.tile == static_cast<int>(cols >> (8 * (i - 1)) & 0xffu) / t.tile ? rank + 1
                                                                                                             : 0;
                    if (i < total && rank < t.slots)  // columns ascend: the rank is the run within the block
                        out[(s.n0 + col) / t.tile * t.words_per_block + 1 + rank] =
                            static_cast<uint32_t>((s.n0 + col) & 0xffff) | v[i] << 16;
                }
            }
        }
        for (unsigned heavy = __ballot_sync(0xffffffffu, row_in && total > kLaneRowValues); heavy; heavy &= heavy - 1)
            write_heavy_row<T>(p, words[r0 + __ffs(heavy) - 1], s, r0 + __ffs(heavy) - 1, lane);
    }
}

/// CUTLASS's adapter for register epilogues, with the epilogue-load warp as the writer: the
/// cooperative kernel calls load() once per tile, in the consumers' order, when
/// is_producer_load_needed() says so.
template <class T>
class TwellEpilogue
    : public cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<TwellStagingEpilogue<T>> {
    using Base = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<TwellStagingEpilogue<T>>;

  public:
    using typename Base::LoadPipeline;
    using typename Base::LoadPipelineState;
    using typename Base::TensorStorage;

    /// Every thread constructs the epilogue once at the kernel's start, before the block-wide
    /// barrier that follows the pipelines' set-up (the consumer warpgroups and the writer again
    /// in their branches, after it): thread 0, which does not construct it again, sets up the
    /// hand-off's barriers.
    CUTLASS_DEVICE TwellEpilogue(typename Base::Params const &params, TensorStorage &shared) : Base(params, shared) {
        if (TWBLAS_TWELL_PROBE != 2 && threadIdx.x == 0) {
            for (int b = 0; b < 2; ++b) {
                cutlass::arch::ClusterBarrier::init(&shared.staged[b], 256);  // every consumer thread
                cutlass::arch::ClusterBarrier::init(&shared.taken[b], 32);    // every lane of the writer
            }
            cutlass::arch::fence_barrier_init();
        }
    }

    CUTLASS_DEVICE bool is_producer_load_needed() const { return true; }

    template <class ProblemShapeMNKL, class CtaTileMNK, class CtaCoordMNKL, class TiledMma>
    CUTLASS_DEVICE auto load(LoadPipeline, LoadPipelineState state, ProblemShapeMNKL problem_shape_mnkl, CtaTileMNK,
                             CtaCoordMNKL cta_coord_mnkl, TiledMma, int thread_idx, TensorStorage &shared, int = -1) {
        if constexpr (TWBLAS_TWELL_PROBE == 2) return state;
        const int lane = thread_idx & 31, b = tiles_ & 1;
        const int64_t m0 = static_cast<int64_t>(get<0>(cta_coord_mnkl)) * kTwellRows;
        const int64_t n0 = static_cast<int64_t>(get<1>(cta_coord_mnkl)) * kTwellCols;
        const TileSpan span{
            m0, n0, static_cast<int>(min(static_cast<int64_t>(get<0>(problem_shape_mnkl)) - m0, int64_t{kTwellRows})),
            static_cast<int>(min(static_cast<int64_t>(get<1>(problem_shape_mnkl)) - n0, int64_t{kTwellCols}))};
        wait_phase(shared.staged[b], (tiles_ >> 1) & 1);
        ++tiles_;
        if (TWBLAS_TWELL_PROBE == 0) write_twell_tile<T>(this->params_, shared.words[b], span, lane);
        cutlass::arch::ClusterBarrier::arrive(&shared.taken[b]);
        return state;
    }

  private:
    int tiles_ = 0;
};

template <class T>
struct TwellKernel {
    using TileShape = Shape<_128, _256, _64>;
    using ClusterShape = Shape<_2, _1, _1>;
    using Epilogue = TwellEpilogue<T>;
    using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, T, cutlass::layout::RowMajor, 8, T,
        cutlass::layout::ColumnMajor, 8, float, TileShape, ClusterShape,
        cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
        cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;
    using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue,
                                                            cutlass::gemm::PersistentScheduler>;
    using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
};

void launch_bf16_twell(cudaStream_t stream, const MaskedGateGemm &g, const TwellTarget &t, int device, int sm_count);
void launch_f16_twell(cudaStream_t stream, const MaskedGateGemm &g, const TwellTarget &t, int device, int sm_count);

}  // namespace twblas::cuda::masked_gate
