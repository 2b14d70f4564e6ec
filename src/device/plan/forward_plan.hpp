// The CUDA forward's plan: which path a call runs and how, decided on the host before anything is
// enqueued. A pure function of the problem, the call's arguments, the FFN's algorithm attribute and
// tuning, and what the last forward measured (the feedback), so that it is unit-tested without a
// GPU (tests/test_forward_plan.cpp). One launcher file per path carries the plan out
// (src/device/launch/).
#pragma once

#include <cstdint>

#include "kernel_limits.hpp"
#include "plan/ffn_tuning.hpp"
#include "twblas/twblas.h"

namespace twblas::cuda {

/// The forward's paths (TW_FFN_ALG_* names them for users).
enum class FfnPath : uint8_t {
    Serve,      // tensor-core gate with unit masks, then gathers of each active unit's rows
    Decode,     // one kernel: gate, unit choice and projections (a few tokens)
    DenseMode,  // projections as cuBLAS GEMMs over every row
    Fused,      // gate GEMM, packing, then one kernel per token over its active units
    TwoPass,    // gate GEMM (or the masked gate GEMM), then u per active unit, then y by slices
};
const char *path_name(FfnPath path);

/// Largest model dimension D the CUDA FFN takes for a value type (the fused kernel's team).
int64_t max_model_dim(twDataType_t type);
/// Teams of warps per token in the fused kernel: enough loads in flight at small M. Depends on M
/// alone (the workspace holds their partial rows), so results stay reproducible.
int fused_splits(int64_t tokens);
/// Whether the decode path's workspace is carved for a call of this shape.
bool decode_fits(int64_t m, int64_t dp, bool gate_f32);
/// Rows with more active units take the dense path: gathers (8 KB a unit at D = 2048) break even
/// with a GEMM row near H / 32 units; never below what the TwELL tiles hold on average.
int32_t dense_path_row_limit(int64_t hidden_dim);

/// What a call is: the problem and the facts about its arguments the paths depend on.
struct PlanInput {
    int64_t m = 0, d = 0, h = 0, dp = 0;
    twDataType_t type = TW_R_16BF;
    bool gated = true, highest = false, fp8 = false, deterministic = false;
    bool training = false;
    bool x_rows_16b = true;       // X row-major, rows on 16 bytes (serving's MMA fragments)
    bool x_row_major = true;
    bool y_row_major_ld8 = true;  // Y row-major, ld a multiple of 8 (dense mode's GEMM output)
    bool masked_gate_fits = false;  // the masked gate GEMM can run here (sm_90a, operands)
    bool writes_hidden = false;     // the call also writes the hidden activation
    int sm_count = 132;
    twFfnAlgorithm_t algorithm = TW_FFN_ALG_DEFAULT;
    bool gate_f32() const { return type == TW_R_32F || highest; }
    /// cuBLAS may run the dense parts (on the 16-bit weights): 16-bit DEFAULT or FP8 mode, not
    /// deterministic.
    bool cublas() const { return !gate_f32() && !deterministic; }
};

/// What the last forward whose statistics arrived measured.
struct PlanFeedback {
    bool dense_mode = false;          // its statistics asked for dense mode
    double mean_active = 0.0;         // active units per token (a bucket's top: up to ~19 % above)
    double dense_row_fraction = 0.0;  // share of its rows on the dense path
};

struct ServePlan {
    bool own_gate = false;      // serve_gate + serve_down (else cuBLAS's gate + serve_token)
    bool gate_rows = false;     // serve_gate's CUDA-core instance (serve_gate_rows), a warp a weight row
    bool stats_kernel = false;  // serve_stats publishes (else the last block behind a ticket)
    int token_warps = 16;       // serve_token's warps a block
    int token_splits = 1;       // serve_token's column splits a token
    int down_groups = 1;        // serve_down's blocks a (column slice, token), each over a share of the units
};

/// How dense mode forms the statistics: beside the down GEMM after h alone (form_hidden, then
/// dense_row_stats), or with h in one pass before it, counting each unit's activations by one
/// atomic an active value or in shared memory (H atomics a cluster of blocks).
enum class DenseStats { Beside, Atomics, SharedCounts };

struct ForwardPlan {
    FfnPath path = FfnPath::Fused;
    bool masked_gate = false;     // the gate by the masked gate GEMM, lists from its unit words
    int masked_gate_tile_n = 256; // its tile width, 256 or 192
    bool lists_in_fwd_u = false;  // fwd_u lists its own row from the words
    int64_t cublas_rows = 0;      // rows of the dense list through cuBLAS GEMMs (the rest gathered)
    DenseStats dense_stats = DenseStats::SharedCounts;  // dense mode's statistics
    int down_gemm_sms = 0;  // dense mode: the SMs its down GEMM is sized for (0: all)
    int64_t hidden_blocks = 1;  // dense mode's one pass: its blocks (each over a share of the rows)
    ServePlan serve;
};

/// Whether DEFAULT's plan would take dense mode for `tokens` tokens after this feedback, where
/// dense mode can run: after a forward that chose it, or one with rows on the dense path at few
/// tokens.
bool dense_mode_wanted(int64_t tokens, const PlanFeedback &fb, const FfnTuning &t);
/// Whether a training forward of `tokens` tokens planned now would run in dense mode as far as
/// the FFN alone tells (the call's Y layout may still rule it out): the room that
/// TW_SAVE_DENSE_AUTO gives the saved state.
bool training_dense_mode_likely(const PlanInput &in, const PlanFeedback &fb, const FfnTuning &t);

/// The plan of a call. A pinned algorithm (in.algorithm) that cannot run this call throws
/// TW_STATUS_NOT_SUPPORTED saying why; DEFAULT always has a plan.
ForwardPlan plan_forward(const PlanInput &in, const PlanFeedback &fb, const FfnTuning &t);

// ---- pieces of the plan that launchers also use

/// serve_token's warps a block for `tokens` tokens (16 when it writes the hidden output).
int serve_token_warps(const FfnTuning &t, int64_t tokens, bool writes_h);
/// serve_token's column splits per token: about serve_token_blocks blocks of 16 warps in all, at
/// most 4 (8 with 8-warp blocks), at least enough that a thread holds one 16-byte chunk; one
/// when the launch writes the hidden output. Depends on the shape alone (reproducible bits).
int serve_token_splits(const FfnTuning &t, int64_t tokens, int64_t dp, bool writes_h, int warps);
/// The masked gate GEMM's tile width: the one whose waves of persistent 128-row tiles (clusters
/// of two) cost less, a 192-wide wave counted at 3/4 of a 256-wide one plus 5 %.
int masked_gate_tile_n(int64_t m, int64_t n, int sm_count);
/// Rows of the dense path through cuBLAS GEMMs: 1.25x the last measured share plus 64, rounded
/// to 64 (0 when none was seen); the rest go through the gathered GEMM, exact either way.
int64_t dense_path_cublas_rows(double dense_row_fraction, int64_t tokens);

}  // namespace twblas::cuda
