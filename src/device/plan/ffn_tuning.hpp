// The CUDA FFN's tuning: every crossover and switch the forward plan reads, one value per FFN,
// with the defaults measured on Hopper (docs/performance-notes.md, "Tuning", has the numbers).
// Users and the benchmark (twblas-bench --tuning) change them at run time by name
// (twFfnSetTuning), so that two variants are compared in one process without a rebuild. Host-only: kernels get the plan's values as
// arguments.
#pragma once

#include <cstdint>

namespace twblas::cuda {

struct FfnTuning {
    // ---- serving path (1 to a few hundred tokens): gate, unit choice and gathers on the device
    int64_t serve_max_tokens = 256;        // past it the two-pass path
    int64_t serve_max_tokens_large = 128;  // the same for gates past serve_gate_large_weights
    int64_t serve_gate_max_tokens = 16;    // serve_gate (own tensor-core gate) up to here, <= 16
    int64_t serve_gate_rows_max_tokens = 2;  // its gate on CUDA cores, a warp a weight row, up to here, <= 2
    int64_t serve_gate_rows_max_tokens_large = 2;  // the same for gates past serve_gate_large_weights
    int64_t serve_gate_large_weights = 25'000'000;  // H x D past which the limits above shrink
    int64_t serve_token_narrow_min_tokens = 129;    // serve_token's 8-warp blocks from here (else 16)
    int64_t serve_token_blocks = 128;               // serve_token's target blocks of 16 warps
    bool serve_stats_kernel = true;       // past serve_gate: statistics by serve_stats (no ticket)
    bool serve_stats_kernel_few = true;   // 2 tokens to serve_gate's last: the same
    bool serve_fp8 = true;                // FP8 weights take the serving kernels' FP8 instances

    // ---- dense mode (projections as cuBLAS GEMMs over every row)
    double dense_mode_units_per_hidden = 1.0 / 128.0;  // after a forward with more units / token than H x this
    double dense_mode_dense_share = 0.25;              // or more of its rows on the dense path than this
    int64_t dense_rows_dense_mode_max_tokens = 512;    // after rows on the dense path, up to this many tokens
    double dense_mode_gather_share = 0.34;  // few tokens still gather while tokens x units <= H x this
    int64_t dense_stats_beside_max_tokens = 128;      // h alone, the statistics beside the down GEMM, up to here
    int64_t dense_stats_atomics_max_values = 262144;  // past it, an atomic an active value while tokens x units <= this
    int64_t dense_stats_spare_sms = 16;  // beside it, the down GEMM sized for all SMs but min(this, tokens / 2)
    int64_t dense_hidden_blocks_per_sm = 4;  // the one pass's blocks an SM at most, each over 16 rows or more

    // ---- the sparse paths past serving
    int64_t masked_gate_min_tokens = 257;    // the masked gate GEMM (sm_90a) from here
    int64_t two_pass_min_tokens = 129;       // the two-pass kernels from here (else the fused kernel)
    int64_t fwd_u_lists_max_tokens = 4096;   // fwd_u lists its row from the mask words up to here
    bool fwd_u_lists_fp8 = true;             // the same for FP8 weights
};

/// Sets the knob called `name` (the member's name); false when there is no such knob or the
/// value is out of its range (integers: whole and >= 0; switches: 0 or 1; shares: in [0, 1]).
bool set_tuning_knob(FfnTuning &t, const char *name, double value);
/// Reads the knob called `name`; false when there is none.
bool get_tuning_knob(const FfnTuning &t, const char *name, double *value);
/// The knobs' names, for messages and the API guide: a NULL-terminated list.
const char *const *tuning_knob_names();

}  // namespace twblas::cuda
