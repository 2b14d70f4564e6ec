// Probe (not part of the build): can the masked gate GEMM write the TwELL blocks themselves, so
// that twGemmToSparse (today the masked GEMM, then write_twell_rows_masked: ~1.08x cuBLAS's GEMM,
// issue 12's target <= 1.05x) needs no writer pass? The 2026-11-26 trial (bench/NOTES.md, "The
// masked gate GEMM writing TwELL from its epilogue") ranked the entries in a second pass over all
// 128 accumulators a thread and lost ~80 us at 16384 rows to the added instructions. This epilogue
// keeps one pass:
//   1. the accumulators are tested as the masked epilogue tests them; an active value is staged
//      in shared memory (its tile column, which of the thread's two rows, its 16 bits), up to
//      kStage a thread; a thread with more (a dense row) walks its accumulators a second time;
//   2. the quad's lanes OR their bits into the rows' 32-column words (two shuffles, as now) and
//      keep them in shared memory (a row lies in one quad of one warp: no block barrier);
//   3. one lane a (row, TwELL block) writes the header from the words' population counts (count,
//      and the overflow bit past S entries, which also flags the row);
//   4. each staged entry's slot is its rank among the row's set bits of its block (so the entries
//      ascend, deterministic mode's order too) and goes out as one 32-bit store.
// Times, at the paper's gate (N = 5632, K = 2048) for M = 4096, 16384 and 65536: cublasGemmEx,
// the library's masked GEMM (128 x 256 cooperative, clusters of two) and the same mainloop with a
// pingpong 64 x 256 tile (whose epilogue runs beside the other warpgroup's mainloop), and the TwELL
// epilogue on both (with the flags' memset); at 16384 rows also the pingpong epilogue's steps.
// Checks the TwELL of both (T = 256 / C = 8, 128 / 4 and 64 / 8; the timed shape at 4096 rows and
// 1000 x 1000, uniform rows and dense ones) against relu(cuBLAS):
// counts, ascending columns, values, overflow flags. Build here (from the repository root,
// after configuring `build`), run on the GPU machine:
//   nvcc -arch=sm_90a -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -DTWBLAS_HAVE_SM90A -Isrc \
//     -Isrc/device -Iinclude -Ibuild/include -isystem .deps/cutlass/cutlass_library/source/include \
//     bench/probes/twell_epilogue_probe.cu -lcublas -o build/twell_epilogue_probe
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "gate_probe_host.hpp"
#include "gemm/masked_gate_gemm.cuh"

using namespace twblas::cuda;
using namespace cute;
using namespace gate_probe;
using BF = cutlass::bfloat16_t;
using MaskedPingpong =
    masked_gate::Kernel<BF, Shape<_64, _256, _64>, Shape<_2, _1, _1>, cutlass::gemm::KernelTmaWarpSpecializedPingpong>;

namespace {

/// The TwELL output: rows x ld words, a block of `block_words` words per `tile_w` columns (header,
/// then S = block_words - 1 entries: column | value << 16); flags[row] = 1 when a block of the row
/// held more than S (zeroed before the GEMM).
struct TwellOut {
    uint32_t *twell;
    int64_t ld;
    int tile_w, block_words;
    int32_t *flags;
};

// kSteps: which steps run (an ablation for timing: 1 staging, 2 headers, 4 entries; 7 is the epilogue;
// 8 leaves out the dense rows' second walk, dropping their entries past kStage: timing only)
template <class T, int kTileM, int kTileN, int kStage, int kSteps = 7>
class TwellEpilogue : public masked_gate::RegisterEpilogueBase<T, TwellOut> {
  public:
    using R = masked_gate::Round<T>;
    using Params = TwellOut;
    // a 64-row wgmma tile a warpgroup: 128 rows over 256 threads (cooperative), or 64 over 128
    // (pingpong, whose two warpgroups run their epilogues one after the other: one staging area)
    static constexpr int kRows = kTileM, kThreads = 2 * kTileM, kWords = kTileN / 32;
    struct SharedStorage {
        uint32_t row_words[kRows][kWords];   // a row's words: written and read by its own quad
        uint32_t staged[kStage][kThreads];   // a thread's entries: tile column | row bit << 8 | value << 16
    };
    using TensorStorage = SharedStorage;

    CUTLASS_HOST_DEVICE explicit TwellEpilogue(Params const &params, SharedStorage const & = SharedStorage()) : p_(params) {}
    CUTLASS_DEVICE bool is_source_needed() { return false; }

    template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine, class FrgLayout,
              class TiledMma, class ResidueMNK>
    CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_mnk,
                                   BlockCoordMNKL blk_coord_mnkl, cute::Tensor<FrgEngine, FrgLayout> const &acc,
                                   TiledMma tiled_mma, ResidueMNK, int thread_idx, char *smem) {
        static_assert(size<0>(BlockShapeMNK{}) == kRows && size<1>(BlockShapeMNK{}) == kTileN, "tile shape");
        static_assert(decltype(size(acc))::value == 4 * (kTileN / 8), "accumulators as wgmma lays them out");
        SharedStorage &sh = *reinterpret_cast<SharedStorage *>(smem);
        const int64_t m_total = get<0>(problem_shape_mnkl), n_total = get<1>(problem_shape_mnkl);
        Tensor c_thr = tiled_mma.get_thread_slice(thread_idx).partition_C(make_identity_tensor(take<0, 2>(blk_shape_mnk)));
        const int64_t m0 = get<0>(blk_coord_mnkl) * kRows, n0 = get<1>(blk_coord_mnkl) * kTileN;
        const int m_rem = static_cast<int>(min<int64_t>(m_total - m0, int64_t{kRows}));
        const int n_rem = static_cast<int>(min<int64_t>(n_total - n0, int64_t{kTileN}));

        // 1. tests, bits, and the thread's first kStage active entries staged (staged counts them all)
        uint32_t bits[2][kWords] = {};
        const int staged = stage_entries(acc, c_thr, m_rem, n_rem, thread_idx, sh, bits);
        // 2. the rows' words, ORed over the quad, clipped to the problem's columns
        const int quad_lane = thread_idx & 3;
        const int lane_shift = static_cast<int>(get<1>(c_thr(0)) & 7);
        int row_of[2];
        CUTLASS_PRAGMA_UNROLL
        for (int v1 = 0; v1 < 2; ++v1) {
            row_of[v1] = get<0>(c_thr(2 * v1));
            CUTLASS_PRAGMA_UNROLL
            for (int w = 0; w < kWords; ++w) {
                uint32_t word = bits[v1][w] << lane_shift;
                word |= __shfl_xor_sync(0xffffffffu, word, 1);
                word |= __shfl_xor_sync(0xffffffffu, word, 2);
                const int valid = n_rem - w * 32;
                if (valid < 32) word &= valid > 0 ? (1u << valid) - 1u : 0u;
                if (w % 4 == quad_lane) sh.row_words[row_of[v1]][w] = word;
            }
        }
        __syncwarp();
        // 3. headers: quad lane q takes the blocks b = q, q + 4, ... of both its rows
        const int tw = p_.tile_w, bw = tw / 32, nblocks = kTileN / tw, slots = p_.block_words - 1;
        const int64_t block0 = n0 / tw;
        CUTLASS_PRAGMA_UNROLL
        for (int v1 = 0; v1 < 2; ++v1) {
            const int lr = row_of[v1];
            if (!(kSteps & 2) || lr >= m_rem) continue;
            for (int b = quad_lane; b < nblocks && b * tw < n_rem; b += 4) {
                int count = 0;
                for (int k = 0; k < bw; ++k) count += __popc(sh.row_words[lr][b * bw + k]);
                const uint32_t header = static_cast<uint32_t>(min(count, slots)) | (count > slots ? 1u << 31 : 0u);
                p_.twell[(m0 + lr) * p_.ld + (block0 + b) * p_.block_words] = header;
                if (count > slots) p_.flags[m0 + lr] = 1;
            }
        }
        // 4. entries at their ranks: the staged ones, or (a thread with more than kStage: a dense
        //    row) every active accumulator again (an unrolled walk: a walk in a run-time loop put
        //    the accumulators in local memory; an inlined call per accumulator tripled the code)
        if (kSteps & 4) {
            uint32_t *const out0 = p_.twell + (m0 + row_of[0]) * p_.ld + block0 * p_.block_words;
            uint32_t *const out1 = p_.twell + (m0 + row_of[1]) * p_.ld + block0 * p_.block_words;
            if (staged <= kStage) {
                for (int e = 0; e < staged; ++e) {
                    const uint32_t entry = sh.staged[e][thread_idx];
                    const int v1 = static_cast<int>(entry >> 8 & 1u), lc = static_cast<int>(entry & 0xffu);
                    const uint32_t *words = sh.row_words[v1 ? row_of[1] : row_of[0]];
                    const int b = lc / tw, w = lc / 32;
                    int rank = __popc(words[w] & ((1u << (lc % 32)) - 1u));
                    for (int k = b * bw; k < w; ++k) rank += __popc(words[k]);
                    if (rank < slots)
                        (v1 ? out1 : out0)[b * p_.block_words + 1 + rank] =
                            static_cast<uint32_t>(n0 + lc) | (entry & 0xffff0000u);
                }
            } else if constexpr (!(kSteps & 8)) {
                CUTLASS_PRAGMA_UNROLL
                for (int i = 0; i < kTileN / 2; i += 2) {
                    const int v1 = (i / 2) % 2, w = i / 16;  // 8 columns a block of 4 accumulators
                    const bool a0 = masked_gate::active_float<R>(acc(i)), a1 = masked_gate::active_float<R>(acc(i + 1));
                    const int lr = get<0>(c_thr(i)), lc = get<1>(c_thr(i));
                    if ((a0 | a1) && lr < m_rem) {
                        const uint32_t packed = R::pack2(acc(i), acc(i + 1));
                        uint32_t *out = (v1 ? out1 : out0) + (lc / tw) * p_.block_words + 1;
                        const uint32_t *words = sh.row_words[v1 ? row_of[1] : row_of[0]];
                        int rank0 = __popc(words[w] & ((1u << (lc % 32)) - 1u));
                        for (int k = w / bw * bw; k < w; ++k) rank0 += __popc(words[k]);
                        if (a0 && lc < n_rem && rank0 < slots)
                            out[rank0] = static_cast<uint32_t>(n0 + lc) | packed << 16;
                        if (a1 && lc + 1 < n_rem && rank0 + a0 < slots)
                            out[rank0 + a0] = static_cast<uint32_t>(n0 + lc + 1) | (packed & 0xffff0000u);
                    }
                }
            }
        }
        __syncwarp();  // the next tile's words overwrite these
    }

  private:
    /// The walk over the thread's accumulators: its bits of the rows' words, and its first kStage
    /// active values staged as tile column | row bit << 8 | value << 16. Returns the active count.
    template <class Acc, class Coord>
    CUTLASS_DEVICE int stage_entries(Acc const &acc, Coord const &c_thr, int m_rem, int n_rem, int thread_idx,
                                     SharedStorage &sh, uint32_t (&bits)[2][kWords]) {
        int count = 0;
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < kTileN / 2; i += 2) {
            const int v1 = (i / 2) % 2, block = i / 4;
            const bool a0 = masked_gate::active_float<R>(acc(i)), a1 = masked_gate::active_float<R>(acc(i + 1));
            bits[v1][block / 4] |= (static_cast<uint32_t>(a0) | static_cast<uint32_t>(a1) << 1) << (8 * (block % 4));
            if ((kSteps & 1) && (a0 | a1)) {
                const int lr = get<0>(c_thr(i)), lc = get<1>(c_thr(i));
                const uint32_t packed = R::pack2(acc(i), acc(i + 1));
                if (lr < m_rem) {
                    if (a0 && lc < n_rem) {
                        if (count < kStage) sh.staged[count][thread_idx] = lc | v1 << 8 | packed << 16;
                        ++count;
                    }
                    if (a1 && lc + 1 < n_rem) {
                        if (count < kStage) sh.staged[count][thread_idx] = (lc + 1) | v1 << 8 | (packed & 0xffff0000u);
                        ++count;
                    }
                }
            }
        }
        return count;
    }

    Params p_;
};

/// The cooperative 128 x 256 tile (the library's masked GEMM) or the pingpong 64 x 256 one, whose
/// epilogue runs beside the other warpgroup's mainloop.
template <class T, bool kPingpong, int kStage = 4, int kSteps = 7>
struct TwellKernel {
    static constexpr int kTileM = kPingpong ? 64 : 128;
    using TileShape = Shape<Int<kTileM>, _256, _64>;
    using ClusterShape = Shape<_2, _1, _1>;
    using Schedule = std::conditional_t<kPingpong, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                                        cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
    using Epilogue = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<
        TwellEpilogue<T, kTileM, 256, kStage, kSteps>>;
    using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, T, cutlass::layout::RowMajor, 8, T,
        cutlass::layout::ColumnMajor, 8, float, TileShape, ClusterShape,
        cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
        Schedule>::CollectiveOp;
    using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue,
                                                            cutlass::gemm::PersistentScheduler>;
    using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
};

template <bool kPingpong = false, int kSteps = 7>
void launch_twell(cudaStream_t st, const void *x, const void *w, int64_t m, int64_t n, int64_t k, const TwellOut &out,
                  int sms) {
    using Gemm = typename TwellKernel<BF, kPingpong, 4, kSteps>::Gemm;
    typename Gemm::GemmKernel::StrideA sa{};
    get<0>(sa) = k;
    typename Gemm::GemmKernel::StrideB sb{};
    get<0>(sb) = k;
    cudaMemsetAsync(out.flags, 0, static_cast<size_t>(m) * 4, st);
    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                  {static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1},
                                  {static_cast<const BF *>(x), sa, static_cast<const BF *>(w), sb},
                                  out,
                                  cutlass::KernelHardwareInfo{0, sms}};
    Gemm gemm;
    if (gemm.can_implement(args) != cutlass::Status::kSuccess || gemm.initialize(args, nullptr, st) != cutlass::Status::kSuccess ||
        gemm.run(st) != cutlass::Status::kSuccess) {
        fprintf(stderr, "TwELL epilogue GEMM: launch failed\n");
        std::exit(1);
    }
}

/// The TwELL against relu(ref) (M x N bf16 from cuBLAS): every block's count equals its active
/// values (a value near zero may differ between the two GEMMs' sums), columns inside the tile and
/// ascending, values within rounding; rows past S flagged.
void check(const std::vector<uint32_t> &tw, const std::vector<int32_t> &flags, const std::vector<uint16_t> &ref, int64_t m,
           int64_t n, const TwellOut &o) {
    const int64_t nt = (n + o.tile_w - 1) / o.tile_w;
    const int slots = o.block_words - 1;
    size_t bad_count = 0, bad_order = 0, bad_value = 0, overflow_blocks = 0, bad_flags = 0, entries = 0;
    for (int64_t r = 0; r < m; ++r) {
        bool row_over = false;
        for (int64_t t = 0; t < nt; ++t) {
            const uint32_t *blk = &tw[static_cast<size_t>(r * o.ld + t * o.block_words)];
            const int count = static_cast<int>(blk[0] & 0xffffu);
            const bool over = blk[0] >> 31;
            int want = 0, near = 0;
            for (int64_t c = t * o.tile_w; c < std::min(n, (t + 1) * o.tile_w); ++c) {
                const float v = bf16_to_float(ref[static_cast<size_t>(r * n + c)]);
                want += v > 0;
                near += std::fabs(v) <= 1e-2f;
            }
            if (over) ++overflow_blocks;
            row_over |= over;
            if (std::abs(std::min(want, slots) - count) > near || (over && want + near <= slots)) ++bad_count;
            int last = -1;
            for (int s = 0; s < count; ++s) {
                const uint32_t e = blk[1 + s];
                const int col = static_cast<int>(e & 0xffffu);
                ++entries;
                if (col <= last || col < t * o.tile_w || col >= std::min(n, (t + 1) * o.tile_w)) ++bad_order;
                last = col;
                const float want_v = bf16_to_float(ref[static_cast<size_t>(r * n + col)]);
                const float have = bf16_to_float(static_cast<uint16_t>(e >> 16));
                if (std::fabs(want_v - have) > 0.02f * std::fabs(want_v) + 1e-3f) ++bad_value;
            }
        }
        if (row_over != (flags[static_cast<size_t>(r)] == 1)) ++bad_flags;
    }
    printf("  check T = %d, C = %d: %zu entries (%.2f a row); bad counts %zu, order %zu, values %zu, flags %zu; overflow blocks %zu\n",
           o.tile_w, o.tile_w / o.block_words, entries, static_cast<double>(entries) / static_cast<double>(m), bad_count,
           bad_order, bad_value, bad_flags, overflow_blocks);
}

}  // namespace

int main() {
    const ProbeDevice dev = open_probe_device();
    const int sms = dev.sms;
    cudaStream_t st = dev.stream;
    cublasHandle_t hb = dev.cublas;
    const int64_t n = 5632, k = 2048, max_m = 65536;
    const auto wh = random_bf16(n, k, 7, bf16_of(-9.75f));
    const auto xh = random_bf16(max_m, k, 1, bf16_of(1.0f));
    // a few heavy rows (every unit's weight row biased up for them): dense rows that overflow
    std::vector<uint16_t> xh_heavy = xh;
    for (int64_t r = 0; r < max_m; r += 997) xh_heavy[static_cast<size_t>(r * k)] = bf16_of(-1.0f);
    void *x = nullptr, *xheavy = nullptr, *w = nullptr, *gate = nullptr;
    uint32_t *masks = nullptr, *twell = nullptr;
    int32_t *flags = nullptr;
    cudaMalloc(&x, xh.size() * 2);
    cudaMalloc(&xheavy, xh.size() * 2);
    cudaMalloc(&w, wh.size() * 2);
    cudaMemcpy(x, xh.data(), xh.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(xheavy, xh_heavy.data(), xh.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(w, wh.data(), wh.size() * 2, cudaMemcpyHostToDevice);
    cudaMalloc(&gate, static_cast<size_t>(max_m * n * 2));
    cudaMalloc(&masks, static_cast<size_t>(max_m * n / 8));
    const int64_t ld = n / 128 * 32;  // T = 128 / C = 4: 44 blocks of 32 words (T = 256 / C = 8 uses half)
    cudaMalloc(&twell, static_cast<size_t>(max_m * ld * 4));
    cudaMalloc(&flags, static_cast<size_t>(max_m * 4));
    const float alpha = 1, beta = 0;
    auto cublas = [&](const void *xs, int64_t m) {
        cublasGemmEx(hb, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, w,
                     CUDA_R_16BF, static_cast<int>(k), xs, CUDA_R_16BF, static_cast<int>(k), &beta, gate, CUDA_R_16BF,
                     static_cast<int>(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    };
    for (int64_t m : {4096, 16384, 65536}) {
        printf("M = %ld (N = %ld, K = %ld)\n", static_cast<long>(m), static_cast<long>(n), static_cast<long>(k));
        const MaskedGateGemm g{x, k, w, k, m, n, k, gate, n, masks, n / 32};
        const TwellOut o256{twell, ld, 256, 32, flags};
        const float t_cublas = time_us(st, [&](int) { cublas(x, m); });
        const float t_masked = time_us(st, [&](int) { masked_gate::launch_typed<BF>(st, g, 0, sms); });
        const float t_masked_pp =
            time_us(st, [&](int) { masked_gate::launch_typed<BF, MaskedPingpong>(st, g, 0, sms); });
        const float t_twell = time_us(st, [&](int) { launch_twell(st, x, w, m, n, k, o256, sms); });
        const float t_twell_pp = time_us(st, [&](int) { launch_twell<true>(st, x, w, m, n, k, o256, sms); });
        printf(
            "  cublasGemmEx %.1f us; cooperative 128 x 256: masked GEMM %.1f (%.3fx), TwELL epilogue %.1f (%.3fx); "
            "pingpong 64 x 256: masked GEMM %.1f (%.3fx), TwELL epilogue %.1f (%.3fx); %s\n",
            t_cublas, t_masked, t_masked / t_cublas, t_twell, t_twell / t_cublas, t_masked_pp, t_masked_pp / t_cublas,
            t_twell_pp, t_twell_pp / t_cublas, cudaGetErrorString(cudaGetLastError()));
        if (m == 16384) {  // the pingpong epilogue's steps: words only, everything but the dense rows' walk
            const float t0 = time_us(st, [&](int) { launch_twell<true, 0>(st, x, w, m, n, k, o256, sms); });
            const float t15 = time_us(st, [&](int) { launch_twell<true, 15>(st, x, w, m, n, k, o256, sms); });
            printf("  pingpong steps: words only %.1f us; everything but the dense rows' second walk %.1f\n", t0, t15);
        }
    }
    // checks: the timed shape, and one with partial row and column tiles (1000 x 1000: the last
    // GEMM tile 232 columns wide, the last 64-wide TwELL block 40), every tile width
    struct Case {
        int64_t m, n;
    };
    for (const Case c : {Case{4096, n}, Case{1000, 1000}})
        for (const void *xs : {x, xheavy}) {
            printf(" check %ld x %ld, %s\n", static_cast<long>(c.m), static_cast<long>(c.n),
                   xs == x ? "uniform rows" : "with a dense row every 997");
            const float alpha1 = 1, beta0 = 0;
            cublasGemmEx(hb, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(c.n), static_cast<int>(c.m),
                         static_cast<int>(k), &alpha1, w, CUDA_R_16BF, static_cast<int>(k), xs, CUDA_R_16BF,
                         static_cast<int>(k), &beta0, gate, CUDA_R_16BF, static_cast<int>(c.n), CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT);
            std::vector<uint16_t> ref(static_cast<size_t>(c.m * c.n));
            cudaStreamSynchronize(st);
            cudaMemcpy(ref.data(), gate, ref.size() * 2, cudaMemcpyDeviceToHost);
            for (const TwellOut &o : {TwellOut{twell, ld, 256, 32, flags}, TwellOut{twell, ld, 128, 32, flags},
                                      TwellOut{twell, ld, 64, 8, flags}}) {
                for (const bool pingpong : {false, true}) {
                    cudaMemset(twell, 0xff, static_cast<size_t>(c.m * ld * 4));  // stale words must not pass
                    if (pingpong)
                        launch_twell<true>(st, xs, w, c.m, c.n, k, o, sms);
                    else
                        launch_twell(st, xs, w, c.m, c.n, k, o, sms);
                    std::vector<uint32_t> tw(static_cast<size_t>(c.m * ld));
                    std::vector<int32_t> fl(static_cast<size_t>(c.m));
                    cudaStreamSynchronize(st);
                    cudaMemcpy(tw.data(), twell, tw.size() * 4, cudaMemcpyDeviceToHost);
                    cudaMemcpy(fl.data(), flags, fl.size() * 4, cudaMemcpyDeviceToHost);
                    printf("  %s:", pingpong ? "pingpong" : "cooperative");
                    check(tw, fl, ref, c.m, c.n, o);
                }
            }
        }
    printf("%s\n", cudaGetErrorString(cudaDeviceSynchronize()));
    return 0;
}
