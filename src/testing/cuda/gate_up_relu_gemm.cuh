// The fused gate+up GEMM's kernel type (see gate_up_relu_gemm.hpp), compiled for sm_90a alone,
// one translation unit per tile configuration so that they compile in parallel.
//
// Mainloop: CUTLASS's sm90 collective (TMA loads into a multi-stage shared-memory ring, wgmma,
// warp-specialised persistent tiles). Epilogue: ours, from the accumulator registers. wgmma gives
// each thread the same two columns of every 8-column block of its rows, so with the weights
// interleaved in blocks of 8 rows a thread holds z and u of the same units side by side (blocks
// 2b and 2b + 1): ReLU(z) * u needs no data exchange, and only h is written.
#pragma once

#include <cuda_bf16.h>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/detail.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/kernel_hardware_info.h>

#include <stdexcept>

#include "testing/cuda/gate_up_relu_gemm.hpp"

namespace twblas::testing::fused {

using namespace cute;

struct EpilogueArgs {
    __nv_bfloat16 *hidden;
    int64_t ldh;
};

/// What CUTLASS's adapter for epilogues without a TMA pipeline asks of an epilogue that stores
/// from the registers itself (no source operand C) and takes its arguments as its parameters.
struct RegisterEpilogueBase {
    using ElementC = void;
    using ElementD = cutlass::bfloat16_t;
    using StrideC = cute::Stride<int64_t, cute::_1, int64_t>;
    using StrideD = StrideC;
    using ThreadEpilogueOp = void;
    using GmemTiledCopyC = void;
    using GmemTiledCopyD = void;
    using Arguments = EpilogueArgs;
    using Params = EpilogueArgs;

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

/// h = relu(z) * u from the fp32 accumulators, rounded once to bf16 (as fused engines do; the
/// cuBLAS baseline rounds z and u first, a difference well inside bf16's tolerance). The four
/// lanes of a quad hold the same rows; a 4 x 4 transpose over the quad (four shuffles) gives each
/// lane 8 consecutive units of one row, stored as one 16-byte write, so that a warp's store
/// fills whole 32-byte sectors.
template <int kTileN>
class GateUpReluEpilogue : public RegisterEpilogueBase {
  public:
    struct SharedStorage {};  // no staging
    using TensorStorage = SharedStorage;

    CUTLASS_HOST_DEVICE explicit GateUpReluEpilogue(Params const &params, SharedStorage const & = SharedStorage())
        : params_(params) {}

    CUTLASS_DEVICE bool is_source_needed() { return false; }

    template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine, class FrgLayout,
              class TiledMma, class ResidueMNK>
    CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_mnk,
                                   BlockCoordMNKL blk_coord_mnkl, cute::Tensor<FrgEngine, FrgLayout> const &acc,
                                   TiledMma tiled_mma, ResidueMNK, int thread_idx, char *) {
        static_assert(size<1>(BlockShapeMNK{}) == kTileN, "the tile width the pairs are laid out for");
        static_assert(kTileN % 32 == 0, "pairs of 16-column (z, u) groups per tile");
        // per thread and 64-row wgmma atom: (2 columns, 2 rows 8 apart, kTileN / 8 column blocks)
        constexpr int kV = 4 * (kTileN / 8);
        static_assert(decltype(size<0>(acc))::value == kV, "accumulators as wgmma lays them out");
        constexpr int kAtoms = decltype(size(acc))::value / kV;
        constexpr int kTileM = decltype(size<0>(blk_shape_mnk))::value;
        const int64_t m_total = get<0>(problem_shape_mnkl), n_total = get<1>(problem_shape_mnkl);
        const int64_t m0 = static_cast<int64_t>(get<0>(blk_coord_mnkl)) * kTileM;
        const int64_t n0 = static_cast<int64_t>(get<1>(blk_coord_mnkl)) * kTileN;
        const int64_t m_rem = m_total - m0, n_rem = n_total - n0;
        // each accumulator's tile-local (row, column), partitioned exactly as the accumulators are
        Tensor c_thr = tiled_mma.get_thread_slice(thread_idx).partition_C(make_identity_tensor(take<0, 2>(blk_shape_mnk)));
        const int quad = thread_idx & 3;

        CUTLASS_PRAGMA_UNROLL
        for (int a = 0; a < kAtoms; ++a) {
            CUTLASS_PRAGMA_UNROLL
            for (int zp = 0; zp < kTileN / 32; ++zp) {
                // combo c: the z block 2 zp + (c & 1) (accumulator block 2 (2 zp + (c & 1)), its u
                // block next), rows (c >> 1) * 8 further down
                const int i0 = a * kV + 16 * zp;
                uint32_t w[4];
                CUTLASS_PRAGMA_UNROLL
                for (int c = 0; c < 4; ++c) {
                    const int i = i0 + 8 * (c & 1) + 2 * (c >> 1);
                    w[c] = pack2(gated(acc(i), acc(i + 4)), gated(acc(i + 1), acc(i + 5)));
                }
                transpose_quad(w, quad);
                // this lane now holds combo `quad`: the quad's four pairs in column order
                const int r_lo = get<0>(c_thr(i0)), r_hi = get<0>(c_thr(i0 + 2));
                const int c_lo = get<1>(c_thr(i0)), c_hi = get<1>(c_thr(i0 + 8));
                const int lr = (quad & 2) ? r_hi : r_lo;
                const int lc = ((quad & 1) ? c_hi : c_lo) & ~7;  // the z block's first column, a multiple of 16
                if (lr < m_rem && lc < n_rem) {
                    // 16 columns (8 z, 8 u) per 8 units: unit (n0 + lc) / 2
                    uint4 *dst = reinterpret_cast<uint4 *>(params_.hidden + (m0 + lr) * params_.ldh + (n0 + lc) / 2);
                    *dst = make_uint4(w[0], w[1], w[2], w[3]);
                }
            }
        }
    }

  private:
    CUTLASS_DEVICE static float gated(float z, float u) { return z > 0.0f ? z * u : 0.0f; }  // NaN z: 0, as relu_mul
    CUTLASS_DEVICE static uint32_t pack2(float lo, float hi) {
        const __nv_bfloat162 v = __float22bfloat162_rn(make_float2(lo, hi));
        uint32_t u;
        memcpy(&u, &v, sizeof(u));
        return u;
    }
    /// w[c] of quad lane q becomes w[q] of quad lane c: swap the off-diagonal 2 x 2 blocks (lanes
    /// 2 apart), then the off-diagonal elements inside each block (lanes 1 apart).
    CUTLASS_DEVICE static void transpose_quad(uint32_t (&w)[4], int quad) {
        const bool hi = quad & 2, odd = quad & 1;
        CUTLASS_PRAGMA_UNROLL
        for (int k = 0; k < 2; ++k) {
            const uint32_t got = __shfl_xor_sync(0xffffffffu, hi ? w[k] : w[k + 2], 2);
            if (hi)
                w[k] = got;
            else
                w[k + 2] = got;
        }
        CUTLASS_PRAGMA_UNROLL
        for (int k = 0; k < 2; ++k) {
            const uint32_t got = __shfl_xor_sync(0xffffffffu, odd ? w[2 * k] : w[2 * k + 1], 1);
            if (odd)
                w[2 * k] = got;
            else
                w[2 * k + 1] = got;
        }
    }

    Params params_;
};

template <class TileShape_, class ClusterShape_, class Schedule>
struct Kernel {
    using TileShape = TileShape_;
    using Epilogue = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<
        GateUpReluEpilogue<decltype(size<1>(TileShape{}))::value>>;
    using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::bfloat16_t, cutlass::layout::RowMajor, 8,
        cutlass::bfloat16_t, cutlass::layout::ColumnMajor, 8, float, TileShape, ClusterShape_,
        cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
        Schedule>::CollectiveOp;
    using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue,
                                                            cutlass::gemm::PersistentScheduler>;
    using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
};

/// Builds the arguments and launches (the adapter's host work, TMA descriptors and the grid, is
/// paid once per captured graph).
template <class K>
void launch(cudaStream_t stream, const GateUpRelu &g, int device, int sm_count) {
    using Gemm = typename K::Gemm;
    typename Gemm::GemmKernel::StrideA sa{};
    get<0>(sa) = g.ldx;
    typename Gemm::GemmKernel::StrideB sb{};
    get<0>(sb) = g.ldw;
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {static_cast<int>(g.m), static_cast<int>(2 * g.h), static_cast<int>(g.d), 1},
        {static_cast<const cutlass::bfloat16_t *>(g.x), sa, static_cast<const cutlass::bfloat16_t *>(g.w), sb},
        {static_cast<__nv_bfloat16 *>(g.hidden), g.ldh},
        cutlass::KernelHardwareInfo{device, sm_count}};
    Gemm gemm;
    if (gemm.can_implement(args) != cutlass::Status::kSuccess)
        throw std::runtime_error("fused gate+up GEMM: CUTLASS cannot run these operands");
    if (Gemm::get_workspace_size(args) != 0)
        throw std::runtime_error("fused gate+up GEMM: the tile scheduler asks for a workspace");
    if (gemm.initialize(args, nullptr, stream) != cutlass::Status::kSuccess)
        throw std::runtime_error("fused gate+up GEMM: initialisation failed");
    if (gemm.run(stream) != cutlass::Status::kSuccess) throw std::runtime_error("fused gate+up GEMM: launch failed");
}

}  // namespace twblas::testing::fused
