// The masked gate GEMM's kernel type, instantiated once per 16-bit type (masked_gate_gemm_*.cu,
// one translation unit each so that the two compile in parallel).
//
// Mainloop: CUTLASS's sm90 collective (TMA loads into a multi-stage shared-memory ring, wgmma,
// a producer warp and two consumer warpgroups, persistent tiles of 128 x 256 x 64, clusters of
// two along M sharing the weight tile). Epilogue: ours, straight from the accumulator registers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/detail.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/kernel_hardware_info.h>

#include "common/check.hpp"
#include "gemm/masked_gate_gemm.hpp"

namespace twblas::cuda::masked_gate {

using namespace cute;

/// Two accumulators rounded to the 16-bit type in one instruction (the low half holds the first),
/// and the largest float that rounds to +0 in that type (half the smallest subnormal: a tie to even).
template <class T> struct Round;
template <> struct Round<cutlass::bfloat16_t> {
    using Native = __nv_bfloat16;
    static constexpr float kZeroMax = 0x1p-134f;
    __device__ static uint32_t pack2(float lo, float hi) {
        const __nv_bfloat162 v = __float22bfloat162_rn(make_float2(lo, hi));
        uint32_t u;
        memcpy(&u, &v, sizeof(u));
        return u;
    }
};
template <> struct Round<cutlass::half_t> {
    using Native = __half;
    static constexpr float kZeroMax = 0x1p-25f;
    __device__ static uint32_t pack2(float lo, float hi) {
        const __half2 v = __floats2half2_rn(lo, hi);
        uint32_t u;
        memcpy(&u, &v, sizeof(u));
        return u;
    }
};
/// ReLU's activity of the rounded value (> 0 or NaN, as torch.relu passes NaN) tested on the
/// accumulator before rounding, in one comparison: the rounded value is > 0 exactly when the float
/// is above kZeroMax, and NaN fails every comparison (no flush to zero: the library is built
/// without -ftz, so subnormal accumulators compare as they are).
template <class R> __device__ inline bool active_float(float v) { return !(v <= R::kZeroMax); }

/// What CUTLASS's adapter for epilogues without a TMA pipeline asks of an epilogue that stores T
/// itself from the registers (no source operand C), whose arguments are its parameters as they
/// are (no workspace, any problem): MaskedEpilogue's, and any alternative epilogue timed against it.
template <class T, class Args>
struct RegisterEpilogueBase {
    using ElementC = void;
    using ElementD = T;
    using StrideC = cute::Stride<int64_t, cute::_1, int64_t>;
    using StrideD = StrideC;
    using ThreadEpilogueOp = void;
    using GmemTiledCopyC = void;
    using GmemTiledCopyD = void;
    using Arguments = Args;
    using Params = Args;

    template <class ProblemShape>
    static constexpr Params to_underlying_arguments(ProblemShape const &, Arguments const &args, void *) {
        return args;
    }
    template <class ProblemShape> static size_t get_workspace_size(ProblemShape const &, Arguments const &) { return 0; }
    template <class ProblemShape>
    static cutlass::Status initialize_workspace(ProblemShape const &, Arguments const &, void *, cudaStream_t,
                                                cutlass::CudaHostAdapter * = nullptr) {
        return cutlass::Status::kSuccess;
    }
    template <class ProblemShape> static bool can_implement(ProblemShape const &, Arguments const &) { return true; }
};

/// MaskedEpilogue's arguments: the gate (the active values) and the words.
template <class T>
struct MaskedEpilogueArgs {
    typename Round<T>::Native *gate;
    int64_t ldg;
    uint32_t *masks;
    int64_t words;
};

/// The epilogue: each thread tests its accumulators, stores the active ones (rounded) on their
/// own straight from the registers, and ORs its active bits into the row's 32-column words; the
/// four lanes of a quad hold the same rows (wgmma's accumulator layout), so two shuffles complete
/// a word. Measured on an H100 at M = 16384, ~0.5 % active (a standalone timing of this kernel,
/// against cuBLAS's 482-489 us and an epilogue storing nothing, 470-479 us, in the same run):
/// every value from the registers (pairs 8 rows apart: 8 partial lines per instruction) 615 us;
/// every value staged per warp in shared memory and written as 16-byte chunks 545-558 us (~3 us a
/// tile: rounding, tests and staging of 128 values a thread, with 2 warps a scheduler to hide
/// latency); each staged row as a TMA bulk copy 568 us; active values only, tested on the float
/// before rounding, 492 us (M = 65536: 1941 us against 2200 for cuBLAS). Plugged into the kernel
/// through CUTLASS's adapter for epilogues without a TMA pipeline.
template <class T, int kTileN>
class MaskedEpilogue : public RegisterEpilogueBase<T, MaskedEpilogueArgs<T>> {
  public:
    using R = Round<T>;
    using typename RegisterEpilogueBase<T, MaskedEpilogueArgs<T>>::Params;
    struct SharedStorage {};  // no staging: the values go out from the registers
    using TensorStorage = SharedStorage;

    CUTLASS_HOST_DEVICE explicit MaskedEpilogue(Params const &params, SharedStorage const & = SharedStorage())
        : params_(params) {}

    CUTLASS_DEVICE bool is_source_needed() { return false; }

    template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine, class FrgLayout,
              class TiledMma, class ResidueMNK>
    CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_mnk,
                                   BlockCoordMNKL blk_coord_mnkl, cute::Tensor<FrgEngine, FrgLayout> const &acc,
                                   TiledMma tiled_mma, ResidueMNK, int thread_idx, char *) {
        static_assert(size<1>(BlockShapeMNK{}) == kTileN, "the tile width the words are laid out for");
        constexpr int kWords = kTileN / 32;
        // per thread: (2 columns, 2 rows, kTileN / 8 column blocks) of one 64-row wgmma tile
        static_assert(decltype(size(acc))::value == 4 * (kTileN / 8), "accumulators as wgmma lays them out");
        const int64_t m_total = get<0>(problem_shape_mnkl), n_total = get<1>(problem_shape_mnkl);
        const auto m_coord = get<0>(blk_coord_mnkl), n_coord = get<1>(blk_coord_mnkl);
        // the tile-local coordinates of each accumulator (a static shape: offsets known at compile
        // time but for the thread's own), partitioned exactly as the accumulators are
        Tensor c_thr = tiled_mma.get_thread_slice(thread_idx).partition_C(make_identity_tensor(take<0, 2>(blk_shape_mnk)));

        const int64_t m0 = m_coord * size<0>(BlockShapeMNK{}), n0 = n_coord * kTileN;
        // rows and columns of this tile inside the problem (the last tiles are partial)
        const int m_rem = static_cast<int>(min<int64_t>(m_total - m0, size<0>(BlockShapeMNK{})));
        const int n_rem = static_cast<int>(min<int64_t>(n_total - n0, kTileN));
        uint32_t bits[2][kWords] = {};
        store_active(acc, c_thr, m0, n0, m_rem, n_rem, bits);
        store_words(c_thr, m0, n0, m_rem, n_rem, thread_idx, bits);
    }

  private:
    /// Only the active values, each stored on its own from the registers (~0.5 % of them in a
    /// trained FFN): no staging, a comparison and the word bits per value. A reader of whole
    /// rows must zero the inactive values first (lists_from_masks, for the dense path's rows).
    template <class Acc, class Coord>
    CUTLASS_DEVICE void store_active(Acc const &acc, Coord const &c_thr, int64_t m0, int64_t n0, int m_rem, int n_rem,
                                     uint32_t (&bits)[2][kTileN / 32]) {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < kTileN / 2; i += 2) {
            const int v1 = (i / 2) % 2, block = i / 4;
            const bool a0 = active_float<R>(acc(i)), a1 = active_float<R>(acc(i + 1));
            // out-of-range accumulators are zero unless an input holds inf or NaN: the words
            // are clipped to the tile's columns below, and the stores here
            bits[v1][block / 4] |= (static_cast<uint32_t>(a0) | static_cast<uint32_t>(a1) << 1) << (8 * (block % 4));
            if (a0 | a1) {
                const int lr = get<0>(c_thr(i)), lc = get<1>(c_thr(i));
                const uint32_t packed = R::pack2(acc(i), acc(i + 1));
                uint16_t *p = reinterpret_cast<uint16_t *>(params_.gate + (m0 + lr) * params_.ldg + n0 + lc);
                if (lr < m_rem && a0 && lc < n_rem) p[0] = static_cast<uint16_t>(packed);
                if (lr < m_rem && a1 && lc + 1 < n_rem) p[1] = static_cast<uint16_t>(packed >> 16);
            }
        }
    }

    /// The words: the lane's bits moved to its columns, ORed over the quad (two shuffles), clipped
    /// to the tile's columns, one store per (row, 32 columns).
    template <class Coord>
    CUTLASS_DEVICE void store_words(Coord const &c_thr, int64_t m0, int64_t n0, int m_rem, int n_rem, int thread_idx,
                                    uint32_t (&bits)[2][kTileN / 32]) {
        constexpr int kWords = kTileN / 32;
        const int quad_lane = thread_idx & 3;
        const int lane_shift = static_cast<int>(get<1>(c_thr(0)) & 7);  // this lane's columns in each block
        CUTLASS_PRAGMA_UNROLL
        for (int v1 = 0; v1 < 2; ++v1) {
            const int lr = get<0>(c_thr(2 * v1));
            CUTLASS_PRAGMA_UNROLL
            for (int w = 0; w < kWords; ++w) {
                uint32_t word = bits[v1][w] << lane_shift;
                word |= __shfl_xor_sync(0xffffffffu, word, 1);
                word |= __shfl_xor_sync(0xffffffffu, word, 2);
                const int valid = n_rem - w * 32;  // columns of this word inside the problem
                if (valid < 32) word &= valid > 0 ? (1u << valid) - 1u : 0u;
                if (w % 4 == quad_lane && lr < m_rem && w * 32 < n_rem)
                    params_.masks[(m0 + lr) * params_.words + n0 / 32 + w] = word;
            }
        }
    }

    Params params_;
};

/// The kernel: tile shape, cluster shape and schedule are parameters so that alternatives can be
/// instantiated and timed (docs/performance-notes.md); the library instantiates the defaults only.
template <class T, class TileShape_ = Shape<_128, _256, _64>, class ClusterShape_ = Shape<_2, _1, _1>,
          class Schedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative>
struct Kernel {
    using TileShape = TileShape_;
    using ClusterShape = ClusterShape_;
    using Epilogue = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<
        MaskedEpilogue<T, decltype(size<1>(TileShape{}))::value>>;
    using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, T, cutlass::layout::RowMajor, 8, T,
        cutlass::layout::ColumnMajor, 8, float, TileShape, ClusterShape,
        cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
        Schedule>::CollectiveOp;
    using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue,
                                                            cutlass::gemm::PersistentScheduler>;
    using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
};

/// Builds the arguments and launches; the adapter's host work (TMA descriptors, the grid) is a
/// few microseconds, paid once per captured graph.
template <class T, class K = Kernel<T>>
void launch_typed(cudaStream_t stream, const MaskedGateGemm &g, int device, int sm_count) {
    using Gemm = typename K::Gemm;
    using StrideA = typename Gemm::GemmKernel::StrideA;
    using StrideB = typename Gemm::GemmKernel::StrideB;
    StrideA sa{};
    get<0>(sa) = g.ldx;
    StrideB sb{};
    get<0>(sb) = g.ldw;
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {static_cast<int>(g.m), static_cast<int>(g.n), static_cast<int>(g.k), 1},
        {static_cast<const T *>(g.x), sa, static_cast<const T *>(g.w), sb},
        {static_cast<typename Round<T>::Native *>(g.gate), g.ldg, g.masks, g.words},
        cutlass::KernelHardwareInfo{device, sm_count}};
    Gemm gemm;
    if (gemm.can_implement(args) != cutlass::Status::kSuccess)
        fail(TW_STATUS_INTERNAL_ERROR, "masked gate GEMM: CUTLASS cannot run these operands");
    if (Gemm::get_workspace_size(args) != 0)
        fail(TW_STATUS_INTERNAL_ERROR, "masked gate GEMM: the tile scheduler asks for a workspace");
    if (gemm.initialize(args, nullptr, stream) != cutlass::Status::kSuccess)
        fail(TW_STATUS_INTERNAL_ERROR, "masked gate GEMM: initialisation failed");
    if (gemm.run(stream) != cutlass::Status::kSuccess)
        fail(TW_STATUS_EXECUTION_FAILED, "masked gate GEMM: launch failed");
}

/// The narrow tile: 128 x 192, for problems whose 256-wide tiles leave SMs idle in their last wave
/// (the plan's masked_gate_tile_n).
template <class T> using NarrowKernel = Kernel<T, Shape<_128, _192, _64>>;

// two tile widths per 16-bit type, in their own translation units (launch_bf16, launch_f16: 256
// wide; masked_gate_gemm_narrow.cu: 192 wide), compiled for sm_90a alone (src/CMakeLists.txt:
// twblas_hopper_objects)
void launch_bf16(cudaStream_t stream, const MaskedGateGemm &g, int device, int sm_count);
void launch_f16(cudaStream_t stream, const MaskedGateGemm &g, int device, int sm_count);
void launch_bf16_narrow(cudaStream_t stream, const MaskedGateGemm &g, int device, int sm_count);
void launch_f16_narrow(cudaStream_t stream, const MaskedGateGemm &g, int device, int sm_count);

}  // namespace twblas::cuda::masked_gate
