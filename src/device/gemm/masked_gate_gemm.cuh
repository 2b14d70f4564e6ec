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

template <class T> struct Round;
template <> struct Round<cutlass::bfloat16_t> {
    using Native = __nv_bfloat16;
    __device__ static Native to(float v) { return __float2bfloat16_rn(v); }
    __device__ static float back(Native v) { return __bfloat162float(v); }
};
template <> struct Round<cutlass::half_t> {
    using Native = __half;
    __device__ static Native to(float v) { return __float2half_rn(v); }
    __device__ static float back(Native v) { return __half2float(v); }
};

/// The epilogue: each thread rounds its accumulators, zeroes the inactive ones, stores them in
/// pairs of adjacent columns, and ORs its active bits into the row's 32-column words; the four
/// lanes of a quad hold the same rows (wgmma's accumulator layout), so two shuffles complete a
/// word. Plugged into the kernel through CUTLASS's adapter for epilogues without shared memory.
template <class T, int kTileN> class MaskedEpilogue {
  public:
    using R = Round<T>;
    // what the kernel and the device adapter name (no source operand C)
    using ElementC = void;
    using ElementD = T;
    using StrideC = cute::Stride<int64_t, cute::_1, int64_t>;
    using StrideD = StrideC;
    using ThreadEpilogueOp = void;
    using GmemTiledCopyC = void;
    using GmemTiledCopyD = void;
    struct SharedStorage {};
    using TensorStorage = SharedStorage;
    struct Arguments {
        typename R::Native *gate;
        int64_t ldg;
        uint32_t *masks;
        int64_t words;
    };
    using Params = Arguments;

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
        // the coordinates of each accumulator, partitioned exactly as the accumulators are
        Tensor c_tile = local_tile(make_identity_tensor(make_shape(m_total, n_total)), take<0, 2>(blk_shape_mnk),
                                   make_coord(m_coord, n_coord));
        Tensor c_thr = tiled_mma.get_thread_slice(thread_idx).partition_C(c_tile);

        uint32_t bits[2][kWords] = {};
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(acc); i += 2) {  // i, i + 1: adjacent columns of one row
            const int v1 = (i / 2) % 2, word = (i / 4) / 4;
            const int64_t row = get<0>(c_thr(i)), col = get<1>(c_thr(i));
            typename R::Native out[2];
            CUTLASS_PRAGMA_UNROLL
            for (int e = 0; e < 2; ++e) {
                const float r = R::back(R::to(acc(i + e)));
                const bool active = (r > 0.0f || r != r) && col + e < n_total;
                out[e] = R::to(active ? r : 0.0f);
                bits[v1][word] |= static_cast<uint32_t>(active) << ((col + e) & 31);
            }
            if (row < m_total) {
                typename R::Native *p = params_.gate + row * params_.ldg + col;
                if (col + 1 < n_total) {  // one 32-bit store: col is even, and so are ldg and the base
                    static_assert(sizeof(out) == sizeof(uint32_t), "pairs of 16-bit values");
                    *reinterpret_cast<uint32_t *>(p) = *reinterpret_cast<const uint32_t *>(out);
                } else if (col < n_total) {
                    *p = out[0];
                }
            }
        }
        const int quad_lane = thread_idx & 3;
        CUTLASS_PRAGMA_UNROLL
        for (int v1 = 0; v1 < 2; ++v1) {
            const int64_t row = get<0>(c_thr(2 * v1));
            CUTLASS_PRAGMA_UNROLL
            for (int w = 0; w < kWords; ++w) {
                uint32_t word = bits[v1][w];
                word |= __shfl_xor_sync(0xffffffffu, word, 1);
                word |= __shfl_xor_sync(0xffffffffu, word, 2);
                const int64_t wi = (n_coord * kTileN) / 32 + w;
                if (w % 4 == quad_lane && row < m_total && wi * 32 < n_total)
                    params_.masks[row * params_.words + wi] = word;
            }
        }
    }

  private:
    Params params_;
};

constexpr int kTileM = 128, kTileN = 256, kTileK = 64;

template <class T> struct Kernel {
    using Epilogue = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<MaskedEpilogue<T, kTileN>>;
    using TileShape = Shape<Int<kTileM>, Int<kTileN>, Int<kTileK>>;
    using ClusterShape = Shape<_2, _1, _1>;
    using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, T, cutlass::layout::RowMajor, 8, T,
        cutlass::layout::ColumnMajor, 8, float, TileShape, ClusterShape,
        cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
        cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;
    using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue,
                                                            cutlass::gemm::PersistentScheduler>;
    using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
};

/// Builds the arguments and launches; the adapter's host work (TMA descriptors, the grid) is a
/// few microseconds, paid once per captured graph.
template <class T> void launch_typed(cudaStream_t stream, const MaskedGateGemm &g, int device, int sm_count) {
    using K = Kernel<T>;
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

// one explicit instantiation per 16-bit type, each in its own translation unit
extern template void launch_typed<cutlass::bfloat16_t>(cudaStream_t, const MaskedGateGemm &, int, int);
extern template void launch_typed<cutlass::half_t>(cudaStream_t, const MaskedGateGemm &, int, int);

}  // namespace twblas::cuda::masked_gate
