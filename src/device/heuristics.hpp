// Every tuning choice of the CUDA backend in one place: path crossovers, team sizes, capacities
// and modes. Each says the measurement it came from (docs/performance-notes.md has the rejected
// alternatives). Kernel
// capacities that are not choices (the decode kernel's token limit, the saved ELL width) live
// with their kernels and layouts.
#pragma once

#include <cstdint>

#include "twblas/twblas.h"

namespace twblas::cuda {

struct FfnProblem;

namespace heuristics {

// ---- which forward path

/// Decode (a few tokens, 16-bit, D <= 4096): one kernel does the gate, the unit choice and the
/// up/down projections. Measured on an H100 at D = 2048, H = 5632: 29 us at M = 1 and 53 us at
/// M = 8 (its gate dot products run on CUDA cores, ~3.4 us per token) against ~44 us flat for
/// the cuBLAS path: it wins up to about 4 tokens.
constexpr int64_t kDecodeMaxTokens = 4;
bool decode_applies(const FfnProblem &p);

/// Serving (1 to this many tokens, 16-bit, DEFAULT precision): the active units found on the
/// device, then gathers that read each active unit's Wu and Wd rows once per token
/// (kernels/serve.cuh). Past it the two-pass path (masked gate GEMM from kMaskedGateMinTokens).
/// Large gates end earlier (serve_max_tokens).
/// Measured on an H100, uniform-29, graph replay: with serve_token, M = 256 took 51.8 us against
/// 55.0 for the team kernel it replaced (Llama's shape 121.2 against 134.1), whose M = 512 had
/// taken 97.3 against 78.1 for the two-pass path; re-measured with serve_token's 8-warp blocks and
/// serve_stats: serve_token at M = 512 took 70.9 us against 58.8 for the two-pass path (Llama's
/// shape 227.9 against 177.8). Overridable with -DTWBLAS_SERVE_MAX_TOKENS=N (0 turns the path off)
/// to time it against the other paths at the same M.
#ifdef TWBLAS_SERVE_MAX_TOKENS
constexpr int64_t kServeMaxTokens = TWBLAS_SERVE_MAX_TOKENS;
#else
constexpr int64_t kServeMaxTokens = 256;
#endif
/// Up to this many tokens the serving path's gate is its own tensor-core kernel (serve_gate, which
/// also forms h of the active pairs) followed by serve_down; beyond it cuBLAS's gate GEMM and
/// serve_token. Measured on an H100, uniform-29, graph replay, with this at 32 against a build with
/// 8 (same run): paper's shape M = 16 / 32 22.4 /
/// 32.5 us against 30.9 / 32.9; Llama's shape 73.6 / 113.8 against 74.7 / 78.0 (the 8-unit gate
/// tile re-reads X per block, which two 16-token tiles feel at D = 4096).
#ifdef TWBLAS_SERVE_GATE_MAX_TOKENS
constexpr int64_t kServeGateMaxTokens = TWBLAS_SERVE_GATE_MAX_TOKENS;
#else
constexpr int64_t kServeGateMaxTokens = 16;
#endif
/// serve_gate's tokens for a gate of H x D weights: kServeGateMaxTokens, or at most 8 past
/// kServeGateLargeWeights. serve_gate's 16-token form (two 8-token x rows) grows with H x D
/// faster than cuBLAS's gate (which streams Wg at the copy rate) and serve_token: on an H100, same
/// call, 16 tokens took 22.7 us with it and
/// 26.1 without at the paper's shape (11.5 M weights), 71.0 and 63.0 at Llama-3-8B's (58.7 M).
/// Lines through those points cross at ~25.7 M weights. -DTWBLAS_SERVE_GATE_LARGE_WEIGHTS=N moves the
/// boundary (for timing).
#ifdef TWBLAS_SERVE_GATE_LARGE_WEIGHTS
constexpr int64_t kServeGateLargeWeights = TWBLAS_SERVE_GATE_LARGE_WEIGHTS;
#else
constexpr int64_t kServeGateLargeWeights = 25'000'000;
#endif
int64_t serve_gate_max_tokens(int64_t d, int64_t h);
/// The serving path's tokens for a gate of H x D weights: kServeMaxTokens, or at most
/// kServeMaxTokensLarge past kServeGateLargeWeights, the two-pass path (with the masked gate GEMM,
/// masked_gate_min_tokens) taking the rest. On an H100, same call, against the two-pass path at
/// 128 to 256 tokens: Llama-3-8B's shape
/// (58.7 M weights) 105.2 / 110.4 / 119.0 / 126.9 us at 160 / 192 / 224 / 256 tokens against
/// 101.8 / 107.7 / 110.7 / 113.8 (level at 128), the paper's (11.5 M) 40.7 to 45.6 against 52.9
/// to 54.2. Only the two shapes were measured: the boundary is serve_gate_max_tokens' guess.
constexpr int64_t kServeMaxTokensLarge = 128;
int64_t serve_max_tokens(int64_t d, int64_t h);
/// serve_token's warps per block: 16 (one 512-thread block an SM at 116 registers and 45 KB of
/// shared memory) up to this many tokens, 8 (two 256-thread blocks an SM, twice the splits) from
/// it on, unless the launch writes the hidden output (one split, whose wide rows need 16 warps).
/// Measured on an H200 with builds of each width, same call: paper's shape M = 32 / 64 / 128 / 256
/// 27.5 / 29.5 / 32.4 / 40.8 us with 8 warps against 24.8 / 27.7 / 31.7 / 48.4 with 16; Llama's
/// M = 64 62.2 against 57.6. At 256 tokens 16-warp blocks take two waves and 8-warp ones one.
/// -DTWBLAS_SERVE_TOKEN_NARROW_MIN_TOKENS=N moves the crossover to time it.
#ifdef TWBLAS_SERVE_TOKEN_NARROW_MIN_TOKENS
constexpr int64_t kServeTokenNarrowMinTokens = TWBLAS_SERVE_TOKEN_NARROW_MIN_TOKENS;
#else
constexpr int64_t kServeTokenNarrowMinTokens = 129;
#endif
int serve_token_warps(int64_t tokens, bool writes_h);

/// serve_token's column splits per token for blocks of `warps` warps: about 128 blocks of 16 warps
/// (256 of 8) in all, at most 4 (8), and enough that a block's share of the columns is at most
/// one 16-byte chunk a thread; one when the gate buffer becomes the hidden output (split 0 writes
/// h there, where the other splits read g). Depends on the shape alone, so results stay
/// reproducible.
int serve_token_splits(int64_t tokens, int64_t dp, bool writes_h, int warps);
/// The blocks of 16 warps serve_token_splits aims at. Measured on an H100 against 64 and 256,
/// same call: 128 is the fastest or level at 32, 64 and
/// 128 tokens for both shapes (M = 64: 30.8 us against 32.7 / 37.7; Llama's 71.3 against 75.1 /
/// 79.6). -DTWBLAS_SERVE_TOKEN_BLOCKS=N times others.
#ifdef TWBLAS_SERVE_TOKEN_BLOCKS
constexpr int64_t kServeTokenBlocks = TWBLAS_SERVE_TOKEN_BLOCKS;
#else
constexpr int64_t kServeTokenBlocks = 128;
#endif

/// Dense mode up to this many tokens: its statistics pass (dense_row_stats, a block per row;
/// pack_rows's dense mode when these were measured) also counts each
/// unit's activations (an atomic per active value: at most tokens x H of them) and publishes the
/// statistics from its last block, so that count_active_columns and finalize are not launched;
/// past it those two run (column sums beat per-value atomics at 16384 tokens x 911 units). Over
/// at most 256 rows the statistics' sums are the same as finalize's (one row a thread either way;
/// past 256 the pass's last block adds two rows a thread: the same bits from call to call, not
/// finalize's). Measured on an H200, llm-29 (dense mode at these sizes), same call against the
/// two kernels: M = 16 / 64 / 256 42.6 /
/// 43.7 / 50.8 us against 46.1 / 48.3 / 56.5. With the statistics on a branch beside the down
/// GEMM, 512 against 256 (H200, same call): M = 512 llm-29 / heavy-29 / uniform-100 / uniform-911 76.8 / 77.7 / 78.3 / 84.5 us against
/// 79.9 / 80.8 / 81.4 / 88.0.

#ifdef TWBLAS_DENSE_MODE_FOLD_MAX_TOKENS
constexpr int64_t kDenseModeFoldMaxTokens = TWBLAS_DENSE_MODE_FOLD_MAX_TOKENS;
#else
constexpr int64_t kDenseModeFoldMaxTokens = 512;
#endif

/// serve_gate's 16-byte chunks of the weight row in flight per lane, up to 8 tokens (one x row per
/// lane); 9 to 16 tokens hold two x rows and take 4. -DTWBLAS_SERVE_GATE_CHUNKS=N builds another
/// to time it.
#ifdef TWBLAS_SERVE_GATE_CHUNKS
constexpr int kServeGateChunks = TWBLAS_SERVE_GATE_CHUNKS;
#else
constexpr int kServeGateChunks = 6;
#endif
/// serve_gate's weight loads with an L2::256B fetch hint (load_stream_256) instead of plain
/// streaming loads: the gate reads whole 256-byte stretches of each row, so fetching them whole
/// saves L2 round trips. Timed in the library on one H100 (builds with and without, same
/// calls): Llama's shape M = 1 / 8 51.0 / 53.2 us against 52.7 / 54.9; the paper's M = 1 / 8 / 16
/// 17.3 / 19.6 / 22.4 against 17.7 / 19.8 / 22.7. -DTWBLAS_SERVE_GATE_FETCH_256=0 builds without.
#ifdef TWBLAS_SERVE_GATE_FETCH_256
constexpr bool kServeGateFetch256 = TWBLAS_SERVE_GATE_FETCH_256;
#else
constexpr bool kServeGateFetch256 = true;
#endif
/// Whether the serving kernels ask L2 for the Wd rows they read next (prefetch.global.L2, a line a
/// lane): serve_gate for serve_down's rows, serve_token for its split's columns before each unit's
/// dot. The same hint in fwd_u made the two-pass path 10-14 % slower; here, against a build
/// without, same call on an H100: level up to 16 tokens (within 0.8 %), without
/// it 3.9 % / 2.7 % slower at the paper's 64 / 256 tokens and 1.9 % at Llama's 64.
/// -DTWBLAS_SERVE_PREFETCH_DOWN=0 builds without.
#ifdef TWBLAS_SERVE_PREFETCH_DOWN
constexpr bool kServePrefetchDown = TWBLAS_SERVE_PREFETCH_DOWN;
#else
constexpr bool kServePrefetchDown = true;
#endif

/// Past serve_gate's tokens: the statistics reduced by a one-warp kernel after serve_token
/// (serve_stats) instead of serve_token's last block behind a ticket that a memset node zeroes
/// before the gate GEMM. Measured on an H100, graph replay, same call: paper's shape M = 32 / 64 / 128 / 256
/// 26.7 / 29.6 / 36.3 / 45.3 us against 27.8 / 30.8 / 37.0 / 46.5; Llama's 64.8 / 70.5 / 88.4 /
/// 127.0 against 65.7 / 71.4 / 89.1 / 128.1. -DTWBLAS_SERVE_STATS_KERNEL=0 builds the ticket.
#ifdef TWBLAS_SERVE_STATS_KERNEL
constexpr bool kServeStatsKernel = TWBLAS_SERVE_STATS_KERNEL;
#else
constexpr bool kServeStatsKernel = true;
#endif
/// From 2 tokens to serve_gate's last, the same kernel after serve_down instead of serve_down's
/// last counting block behind the ticket that serve_gate zeroes (no memset node to remove here,
/// only the ticket's atomics and fences). Against the ticket, same call on an H100: paper's shape M = 2 / 8 / 16 18.7 / 20.0 / 22.6 us
/// against 19.0 / 20.4 / 22.9, Llama's level (53.4 / 54.6 / 71.3 against 53.6 / 54.9 / 71.4).
/// -DTWBLAS_SERVE_STATS_KERNEL_FEW=0 builds the ticket.
#ifdef TWBLAS_SERVE_STATS_KERNEL_FEW
constexpr bool kServeStatsKernelFew = TWBLAS_SERVE_STATS_KERNEL_FEW;
#else
constexpr bool kServeStatsKernelFew = true;
#endif
/// TW_COMPUTE_FP8_WEIGHTS at the serving sizes: the serving kernels' FP8 instances (serve_gate and
/// serve_down, or cuBLAS's gate and serve_token, reading the FP8 rows). Before it the mode ran the
/// two-pass kernels at every token count, 2x slower than DEFAULT at 64 tokens (61.2 against
/// 30.2 us on an H100). -DTWBLAS_SERVE_FP8=0 builds the old route.
#ifdef TWBLAS_SERVE_FP8
constexpr bool kServeFp8 = TWBLAS_SERVE_FP8;
#else
constexpr bool kServeFp8 = true;
#endif
bool serve_applies(const FfnProblem &p);

/// Token groups of the backward's per-unit sums for the hot units (backward_hot_units): each hot
/// unit's tokens are summed by this many groups of 64 threads, then added in group order. More
/// groups shorten the serial sum of a unit active on most tokens (a trained model's busiest
/// units). History, on an H100: with every unit in 4 groups, a SparseMLP training step (8192
/// tokens, d_model 512, d_ff 2048) with 2 or 8 units active on every token went from 1.68 / 1.70
/// ms to 0.86 / 0.87; since only
/// the hot units take groups, 8 against 4 (same call, bench `uniform-6+hot-8`, the same
/// pattern, before the staging and cluster steps of kernels/bwd_units.cuh and kHotUnitCluster):
/// 717 against 923 us a step, every unit in 4 groups 812. -DTWBLAS_UNIT_TOKEN_GROUPS=N builds
/// another.
#ifdef TWBLAS_UNIT_TOKEN_GROUPS
constexpr int kUnitTokenGroups = TWBLAS_UNIT_TOKEN_GROUPS;
#else
constexpr int kUnitTokenGroups = 8;
#endif

/// Only the hot units take those groups (backward_hot_units, beside the others): with every unit
/// in 4 groups the training step at M = 16384 was 4-16 % slower than with one group on an H100
/// (uniform-29 2825 against 2535 us, llm-29 2661 against 2552; the train-eager suite's d_model
/// 512 and 1024 layers 3-16 %): the groups'
/// 256-thread blocks fit fewer an SM, and a unit with ~84 tokens gains nothing from a shorter
/// serial sum. A unit is hot when it has more slots than this: 256, or M / 32 past 8192 tokens
/// (uniform-29 has ~84 a unit at 16384 tokens, ~340 at 65536). A function of M alone, so the
/// bits are the same from call to call.
constexpr int64_t unit_hot_tokens(int64_t m) { return m / 32 > 256 ? m / 32 : 256; }
/// Hot units a launch at a time (a column slice's), striding over the list.
constexpr int64_t kHotUnitBlocks = 64;
/// Blocks a hot unit (a thread-block cluster, sm_90 and newer; rank 0 adds the blocks' sums in
/// rank order). On an H100, 8 units on every token (bench uniform-6+hot-8, d_model 512, 8192
/// tokens, same call): 359 us a step with 8, 396 with 4, 561 with one block a unit; evenly spread
/// units and the 16384-token steps level.
/// -DTWBLAS_HOT_UNIT_CLUSTER=N builds another (1: no cluster).
#ifdef TWBLAS_HOT_UNIT_CLUSTER
constexpr int kHotUnitCluster = TWBLAS_HOT_UNIT_CLUSTER;
#else
constexpr int kHotUnitCluster = 8;
#endif

/// After a forward that chose dense mode (below), a call of few tokens still gathers (serving or
/// decode path) while the unit rows it gathers, tokens x mean active units, are at most
/// kDenseModeGatherShare x H: then it reads fewer weight bytes than the cuBLAS projections, which
/// read all of Wu and Wd. (The llm-29 profile's first tokens have ~600 active units: at M = 1 to
/// 32 dense mode once took 67 to 96 us against 35 to 37 for the dense FFN, on an H100.)
bool gathers_pay_in_dense_mode(double mean_active, int64_t tokens, int64_t hidden_dim);
/// The share of H up to which those gathered rows pay. The bytes alone say 1, but the gathers are
/// chains of round trips and dense mode now runs near the dense FFN: measured on an H200 (bench
/// --suite=dense-crossover, same call, 0.34 against 1)
/// llm-29 M = 4 / 8 31.7 / 32.0 us against 35.1 / 39.2 (dense FFN 28.8 / 29.3), uniform-100 M = 32
/// 32.7 against 33.4, the other points (M = 2 to 32, llm-29, uniform-100 and -300) level.
#ifdef TWBLAS_DENSE_MODE_GATHER_SHARE
constexpr double kDenseModeGatherShare = TWBLAS_DENSE_MODE_GATHER_SHARE;
#else
constexpr double kDenseModeGatherShare = 0.34;
#endif

/// The masked gate GEMM's tile width, 256 or 192 columns (128 rows, clusters of two along M,
/// either way): the one whose waves of persistent tiles cost less, a 192-wide wave counted at 3/4
/// of a 256-wide one plus 5 % (its X tile is loaded once per 192 columns instead of 256). At the
/// paper's shape and M = 512, 44 clusters of 256-wide tiles leave 22 of an H100's 66 cluster slots
/// idle, where 60 clusters of 192-wide tiles do a quarter less work each in one wave: measured on
/// an H100 (ncu), the GEMM took 22.2 us against 27.0. At 4096 and 16384 tokens it keeps 256.
int masked_gate_tile_n(int64_t m, int64_t n, int sm_count);

/// From this many tokens (past the serving path) the gate is the masked gate GEMM on sm_90: its
/// epilogue writes the active-unit words, so the packing pass reads H / 8 bytes a token instead of
/// the gate row. Measured on an H100 at the paper's shape, uniform-29, graph replay, against the
/// cuBLAS gate and packing pass in the same device call: M = 512 / 4096 / 16384 / 65536 78.3 /
/// 342 / 1190 / 4575 us against 81.8 / 350 / 1245 / 4774 (bench/results, "masked gate GEMM";
/// 257 to 511 tokens were not timed apart: the first size past the serving path). Overridable with -DTWBLAS_MASKED_GATE_MIN_TOKENS=N (a huge N turns it off) to
/// time it against cuBLAS's gate and the packing pass at the same M.
#ifdef TWBLAS_MASKED_GATE_MIN_TOKENS
constexpr int64_t kMaskedGateMinTokens = TWBLAS_MASKED_GATE_MIN_TOKENS;
#else
constexpr int64_t kMaskedGateMinTokens = 257;
#endif
/// kMaskedGateMinTokens, or the first size past the serving path where it ends early
/// (serve_max_tokens).
int64_t masked_gate_min_tokens(int64_t d, int64_t h);

/// From this many tokens the sparse rows go through the two-pass kernels (a warp per active
/// unit for u and h, then y by 512-column slices); below it through the fused kernel, whose
/// units of a token are dealt to several teams (see fused_splits). Measured on an H100 at the
/// paper's shape, uniform-29, graph replay (bench suite crossover; builds with
/// -DTWBLAS_TWO_PASS_MIN_TOKENS=N time both paths at the same M): at M = 128 the two tie (61.2 us
/// fused, 61.7 two-pass), at 192 / 256 / 384 / 512 two-pass takes 68.0 / 69.2 / 72.2 / 77.6 us
/// against 74.0 / 76.5 / 93.2 / 100 fused.
#ifdef TWBLAS_TWO_PASS_MIN_TOKENS
constexpr int64_t kTwoPassMinTokens = TWBLAS_TWO_PASS_MIN_TOKENS;
#else
constexpr int64_t kTwoPassMinTokens = 129;
#endif
bool two_pass_applies(const FfnProblem &p);

/// Up to this many tokens fwd_u lists its row from the masked gate GEMM's words itself instead of
/// a lists_from_masks launch before it. Measured on an H200 (paper's shape, uniform-29, graph
/// replay, same call): M = 512 59.4 against
/// 64.5 us, M = 4096 level (297.3 both), M = 16384 1059.5 against 1049.3 (fwd_u's blocks, four an
/// SM, wait on the words before their dot products, which the separate launch overlapped).
#ifdef TWBLAS_FWD_U_LISTS_MAX_TOKENS
constexpr int64_t kFwdUListsMaxTokens = TWBLAS_FWD_U_LISTS_MAX_TOKENS;
#else
constexpr int64_t kFwdUListsMaxTokens = 4096;
#endif
/// The same for TW_COMPUTE_FP8_WEIGHTS (fwd_u_fp8 lists its row from the words); before it the mode
/// ran lists_from_masks first at every size. -DTWBLAS_FWD_U_LISTS_FP8=0 builds that.
#ifdef TWBLAS_FWD_U_LISTS_FP8
constexpr bool kFwdUListsFp8 = TWBLAS_FWD_U_LISTS_FP8;
#else
constexpr bool kFwdUListsFp8 = true;
#endif

/// Teams of warps per token in the fused kernel at small M: enough loads in flight for the GPU.
/// Depends on M alone, so results stay reproducible.
int fused_splits(int64_t tokens);

// ---- the fused kernel's team shape

/// A warp covers up to 4 chunks of 16 bytes per lane (1024 bf16 values); wider rows take a team
/// of up to 8 warps, which keeps registers near 100 and occupancy up (ncu at D = 2048 with one
/// warp of 177 registers: 7 warps per SM, stalls on dependent instructions).
constexpr int kFusedWarpChunks = 4, kFusedMaxTeamWarps = 8;
/// Largest model dimension D the fused kernel takes for a value type.
int64_t max_model_dim(twDataType_t type);

// ---- the dense path and dense mode

/// Rows with more active units than this take the dense path: the break-even of gathers (8 KB
/// per unit at D = 2048) against a GEMM row (4 D H flops) is about H / 32 units; never below
/// what the TwELL tiles hold on average.
int32_t dense_path_row_limit(int64_t hidden_dim);

/// Dense mode (the up and down projections as cuBLAS GEMMs over every row) after a forward with
/// more active units per token than gathers beat tensor-core GEMMs at (about H / 128: 8 KB of
/// gathered weights per unit at ~5 TB/s against 4 D H flops per token at ~700 TFLOP/s), or with
/// a quarter of its rows on the dense path.
/// (The finishing kernel evaluates it, so it is defined here for host and device.)
#if defined(__CUDACC__)
__host__ __device__
#endif
inline bool dense_mode_after(double mean_active, double dense_share, int64_t hidden_dim) {
    return mean_active > static_cast<double>(hidden_dim) / 128.0 || dense_share > 0.25;
}

/// Up to this many tokens, a forward after one with rows on the dense path runs in dense mode
/// (where the serving and decode paths do not apply: they gather any row). The dense path's cuBLAS
/// GEMMs read every row of Wu and Wd whatever their row count (at least 64, dense_path_cublas_rows),
/// and at these sizes reading the weights is what a GEMM costs: the sparse rows' gathers and the
/// dense path's copies come on top of what dense mode reads once for every row. Measured on an
/// H100 at the paper's shape (bench --suite=heavy-rows, same call, dense mode from here against
/// the sparse path): llm-29 M = 512 / 1024 / 2048 / 4096 85.0 / 137.5 / 257.5 / 504.0 us against
/// 119.6 / 139.4 / 190.5 / 317.1, heavy-29 85.2 / 137.9 / 258.5 / 505.7 against 92.6 / 128.3 /
/// 199.9 / 345.4: dense mode wins at 512 tokens only (past it the GEMMs' flops count).
#ifdef TWBLAS_DENSE_ROWS_DENSE_MODE_MAX_TOKENS
constexpr int64_t kDenseRowsDenseModeMaxTokens = TWBLAS_DENSE_ROWS_DENSE_MODE_MAX_TOKENS;
#else
constexpr int64_t kDenseRowsDenseModeMaxTokens = 512;
#endif
inline bool dense_rows_favour_dense_mode(double dense_row_fraction, int64_t tokens) {
    return dense_row_fraction > 0.0 && tokens <= kDenseRowsDenseModeMaxTokens;
}

/// Rows of the dense path that go through cuBLAS GEMMs: 1.25x the last measured share plus 64,
/// rounded to 64 (0 when none was seen). Rows past it go through the gathered GEMM, so nothing
/// depends on it being large enough.
int64_t dense_path_cublas_rows(double dense_row_fraction, int64_t tokens);

/// Row blocks of a gathered GEMM per column tile: enough blocks for 4 per SM.
int gathered_row_blocks(int64_t max_rows, int64_t column_tiles, int sm_count);

}  // namespace heuristics
}  // namespace twblas::cuda
