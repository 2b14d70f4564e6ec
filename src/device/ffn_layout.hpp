// The fused FFN's problem description, its weights in the kernels' layouts, and the layouts of
// the memory a call works in: the forward's scratch, the training forward's saved state and the
// backward's scratch. Each is carved in one function, which also measures it, so that sizing and
// use always agree.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include <vector_types.h>

#include "twblas/twblas.h"

namespace twblas::cuda {

struct FfnProblem {
    int64_t m, d, h, dp, hp;  // dp, hp: D and H rounded up to 8 (16-byte rows)
    twDataType_t type;        // X, Y and weights
    bool gated, highest, deterministic;
    bool fp8;             // TW_COMPUTE_FP8_WEIGHTS: the units' rows read from the FFN's FP8 copy
    bool save_dense;      // TW_FFN_ATTR_SAVE_DENSE where dense mode can run: the saved state has
                          // room for z and u of every row
    int32_t tile, slots;  // TwELL tile of the path: a row with more than `slots` active units in
                          // a tile goes through the exact dense path
    /// The gate (and h, u, dz, du) in fp32: fp32 data, or HIGHEST_PRECISION.
    bool gate_f32() const { return type == TW_R_32F || highest; }
    size_t gate_bytes() const { return gate_f32() ? 4 : 2; }
    /// Bytes of one weight element (the FFN's type).
    int64_t weight_bytes() const { return type == TW_R_32F ? 4 : 2; }
    /// Where cuBLAS may run the dense parts: 16-bit values in DEFAULT mode.
    bool cublas_ok() const { return !gate_f32(); }
    /// Where dense mode may run, and so a saved state keep z and u: where cuBLAS may, never in
    /// deterministic mode (it would switch paths between calls).
    bool dense_mode_possible() const { return cublas_ok() && !deterministic; }
};

/// TW_COMPUTE_FP8_WEIGHTS: the FP8 copy of the up and down rows (kernels/fp8_rows.cuh). Row j =
/// [q(Wu_j) | q(Wd_j)] (gated) or [q(Wd_j)] (plain), each half `half` bytes (D rounded up to 16,
/// zero-padded: every 16-byte load is aligned), and scale[j] = {s(Wu_j), s(Wd_j)}.
struct Fp8Rows {
    const uint8_t *q;
    const float2 *scale;
    int64_t stride;  // bytes: `half` times the halves
    int64_t half;
    /// The FP8 row layout of a problem whose rows have `dp` values (`gated`: two halves).
    static int64_t half_bytes(int64_t dp) { return (dp + 15) / 16 * 16; }
    static int64_t row_bytes(int64_t dp, bool gated) { return half_bytes(dp) * (gated ? 2 : 1); }
};

/// The FFN's weights as the kernels read them: three matrices of H rows, each row D values on 16
/// bytes (a multiple of 16 bytes apart), its pads [d, dp) zero. Either the caller's own memory,
/// read in place (D a multiple of 8, TW_ORDER_ROW, 16-byte rows: then dp = d and there are no
/// pads), or rows of the FFN's copy (ffn_weights.cu), which holds each copied matrix's row j side
/// by side: [Wg_j | Wu_j | Wd_j] when all three are copied. Fixed per FFN until
/// twFfnUpdateWeights (a captured call's key holds them).
struct FfnWeights {
    const void *gate;  // Wg (gated) or Wu (plain): the rows whose ReLU gives sparsity
    int64_t gate_ld;   // elements between rows
    const void *up;    // Wu (gated); NULL for a plain FFN
    int64_t up_ld;
    const void *down;  // Wd: row j = unit j's down row; the dense path reads it as Wd^T (D x H
    int64_t down_ld;   // column-major, leading dimension down_ld)
    Fp8Rows fp8;       // null unless the FFN has been set to TW_COMPUTE_FP8_WEIGHTS
};

/// Device-side statistics of the last forward (deterministic: reduced in a fixed order).
struct FfnDeviceStats {
    long long tokens, total_nnz, max_row, overflow_rows;  // overflow: a TwELL tile over capacity
    long long dense_rows;                                  // rows on the dense path (overflow + long)
    double l1_sum;
};

/// What steers the path choice, as the finishing kernel publishes it into mapped host memory for
/// the host to read without a copy or a wait: one 16-byte record written by one store, and only
/// when it differs from the last one published (a write to host memory delays the end of the
/// kernel by about a microsecond). `check` (feedback_check) tells a whole record from a torn
/// read; `published` is 0 until a first record.
struct alignas(16) FfnFeedback {
    uint32_t mode;      // feedback_mode: dense mode and the mean active units of the forward
    float dense_share;  // share of its rows on the dense path
    uint32_t published; // 1
    uint32_t check;
};
#if defined(__CUDACC__)
#define TWBLAS_HOST_DEVICE __host__ __device__
#else
#define TWBLAS_HOST_DEVICE
#endif
/// The mode word: bit 0 dense mode (FfnStatsBlock's limits); above it the mean active units per token
/// as a quarter-octave bucket, ceil(4 log2(mean + 1)). Coarse on purpose: the record is written to
/// host memory only when it changes (about a microsecond at the end of a kernel), and a decode
/// step's count changes with nearly every token, its bucket far less often (26 to 31 share one).
TWBLAS_HOST_DEVICE inline uint32_t feedback_mode(bool dense_mode, double mean_active) {
    const double b = mean_active > 0.0 ? ceil(4.0 * log2(mean_active + 1.0)) : 0.0;
    return (static_cast<uint32_t>(b < 1024.0 ? b : 1024.0) << 1) | (dense_mode ? 1u : 0u);
}
/// The mean a mode word stands for: the top of its bucket (at most ~19 % above the mean).
TWBLAS_HOST_DEVICE inline double feedback_mean(uint32_t mode) { return exp2(static_cast<double>(mode >> 1) / 4.0) - 1.0; }
TWBLAS_HOST_DEVICE inline uint32_t feedback_check(uint32_t mode, uint32_t share_bits) {
    return (mode * 0x85ebca6bu ^ ((share_bits << 13) | (share_bits >> 19))) + 0x9e3779b9u;
}

/// The device memory of an FFN's statistics: those of the last forward, a copy of the last
/// record published to the host, and the tuning's dense-mode limits the publishing kernels read.
struct FfnStatsBlock {
    FfnDeviceStats last;
    FfnFeedback published;
    double dense_mode_mean;   // dense mode after a forward with more active units a token
    float dense_mode_share;   // or a larger share of its rows on the dense path
};

/// Width of the per-token active-unit lists: the most units a row without tile overflow has.
int32_t ffn_list_width(const FfnProblem &p);

/// Pieces of a forward's workspace.
struct FfnScratch {
    void *lt_workspace;  // cuBLASLt
    size_t lt_bytes;
    void *gate;          // M x hp, gate type; later h
    int64_t ldg;
    void *up;            // M x hp: X Wu^T of every row (dense mode) or of the compacted dense-path
                         // rows, then their h (NULL where cuBLAS does not run)
    void *xc;            // M x dp: compacted X rows of the dense path, then their Y rows
    uint16_t *idx;       // M x cap active units in ascending order
    int32_t cap;
    int32_t *count;      // M: active units, -1 / -2 for rows on the dense path
    int32_t *row_nnz;    // M: active units of every row
    float *row_l1;       // M: sum |h| of each row
    uint32_t *header;    // [0] rows on the dense path, [1] the finishing kernel's ticket
    uint32_t *dense_count;  // = header
    int32_t *dense_rows;    // M
    int32_t *writer_flags;  // M + 64 (hidden output)
    int32_t row_limit;      // rows with more active units take the dense path
    void *save_g, *save_u;  // training forward: g and u per list slot (else NULL)
    int splits;             // teams per token in the fused kernel
    float *partial;         // splits x M x dp partial rows, then splits x M l1 (splits > 1)
    int32_t *dec_zero;      // decode: row_nnz [M], list counts [M], tile counts [M x NT], zeroed with
                            // the header, which decode places right before them
    int32_t *dec_list;      // decode: per token, the blocks that wrote a partial row
    float *dec_partial;     // decode: per block and token a partial y row, then per block l1
    uint32_t *unit_masks;  // M x unit_words active-unit words (bit b of word w: unit 32 w + b), written by
    int64_t unit_words;    // the serving gate or the masked gate GEMM (16-bit DEFAULT mode only)
    uint32_t *serve_ticket;  // serving: the last-block ticket of the statistics
    float *serve_parts;      // serve_down with groups: a partial row a block (kServeDownCols values),
    float *serve_part_l1;    // then per (token, group) l1, active units and an over-capacity flag
    int32_t *serve_part_nnz, *serve_part_over;
    uint32_t *serve_tickets;  // and the last-block ticket of each (slice, token)
};
FfnScratch carve_ffn_scratch(void *workspace, const FfnProblem &p, size_t *bytes);

/// What the unit lists are made from after the masked gate GEMM: its active-unit words, into the
/// lists, counts, dense list and per-unit counts of the scratch (kernels/pack.cuh).
struct MaskListArgs {
    const uint32_t *masks;
    int64_t words, m;
    int tile, slots, cap;
    uint16_t *idx;
    int32_t *count, *row_nnz, *dense_rows;
    uint32_t *dense_count;
    unsigned long long *neuron_counts;
    int row_limit;
    // the 16-bit gate the words came from, written at active units only: the other values of
    // a dense-path row are zeroed here (NULL: the gate is whole, inactive units +0)
    uint16_t *gate;
    int64_t ldg, h;
};


// ---- training

/// Width of the saved ELL part: rows with more active units are recomputed in the backward.
constexpr int32_t kSavedEll = 128;

/// The training forward's saved state, in the caller's buffer (offsets in bytes): a header
/// (shape, type, mode), the dense-list count (and the forward's finishing ticket), each row's
/// count (-1 or -2: a row on the dense path, recomputed from X in the backward), the dense list,
/// and an ELL part: each sparse row's active units in ascending order with their g and u (gate
/// type). At the paper's shape it is 1/14 of a dense bf16 h. With save_dense, then z and u of
/// every row (M x hp each, value type), which a dense-mode forward fills (CudaFfnState's
/// train_forwards says which saved states hold them).
struct SavedLayout {
    int32_t ell;
    size_t header, words, count, dense_rows, idx, g, u, dense_z, dense_u, total;
};
SavedLayout saved_layout(const FfnProblem &p);

struct SavedHeader {
    uint64_t magic;
    int64_t tokens, model_dim, hidden_dim;
    int32_t gated, type, highest, ell;
};
constexpr uint64_t kSavedMagic = 0x7477637564617331ull;  // "twcudas1"
SavedHeader saved_header(const FfnProblem &p);

/// Read-only pointers into a saved state.
struct SavedView {
    const uint32_t *dense_count;
    const int32_t *count, *dense_rows;
    const uint16_t *idx;
    const void *g, *u;
    const void *dense_z, *dense_u;  // M x hp (save_dense; dense_u for a gated FFN), else NULL
};
SavedView saved_view(const FfnProblem &p, const void *saved);
/// Points the forward's lists, counts and saved g / u into `saved` (the training forward writes
/// them there instead of into its workspace).
void point_scratch_into_saved(const FfnProblem &p, void *saved, FfnScratch &s);

/// The backward's workspace.
struct TrainScratch {
    uint32_t *keys, *keys_sorted;  // M x ell: unit id of each slot (H when empty)
    int32_t *slots, *slots_sorted;
    void *sort_temp;
    size_t sort_bytes;
    int32_t *rows_key, *rows_sorted;  // the dense list in ascending row order
    void *rows_temp;
    size_t rows_bytes;
    int32_t *unit_start;  // H + 1
    int32_t *hot_units;   // H: the units with more than unit_hot_tokens(M) tokens (ffn_backward.cu)
    uint32_t *hot_count;  // how many (zeroed by slot_keys, counted by unit_starts)
    void *dz, *du;        // M x ell, gate type
    void *rz, *ru, *rh;   // recomputed rows: M x hp, gate type (ru right after rz)
    float *dw_dense;      // 3 x H x dp: the recomputed rows' weight-gradient terms
    // the cuBLAS part of the recompute (16-bit DEFAULT only; NULL otherwise)
    void *lt_workspace;
    size_t lt_bytes;
    void *xc, *dyc;  // cap x dp compacted X and dY rows
    float *dxc;      // (2 x) cap x dp: dZ Wg and dU Wu (fp32)
};
TrainScratch carve_train_scratch(void *workspace, const FfnProblem &p, size_t *bytes);

/// Bits of a radix-sort key that holds values up to `max_value`.
int key_bits(int64_t max_value);

}  // namespace twblas::cuda

namespace twblas::cuda {
/// The decode kernel's block: one warp per unit, this many units (its partial rows are per block).
constexpr int kDecodeUnitsPerBlock = 8;
}  // namespace twblas::cuda
