// Host-side launchers of the CUDA kernels. Every launcher enqueues on the given stream, never
// allocates and never synchronises; scratch comes from a caller's workspace.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "host/objects.hpp"

namespace twblas::cuda {

/// A dense matrix as kernels see it: element (r, c) at ptr + (r * rs + c * cs) elements.
struct MatrixArg {
    void *ptr;
    int64_t rows, cols, rs, cs;
    twDataType_t type;
};
MatrixArg matrix_arg(const twDnMatDescr &d);

// ---- dense -> sparse writer (DenseToSparse, GemmToSparse, the FFN's hidden output)

/// Workspace of write_sparse: one flag per row.
size_t sparse_writer_workspace(const twSpMatDescr &out);
/// Writes `in` (op RELU keeps > 0 and NaN; PLAIN keeps every pattern but +0) into `out`,
/// rounding to its value type when the types differ, with the overflow record / backup slots
/// assigned in ascending row order (deterministic).
void write_sparse(cudaStream_t stream, const MatrixArg &in, twConvertOp_t op, const twSpMatDescr &out,
                  void *workspace);

// ---- SpMM: Y = alpha * S * W + beta * Y (rows of S that are incomplete come out as NaN)
void spmm(cudaStream_t stream, float alpha, const twSpMatDescr &s, const MatrixArg &w, float beta,
          const MatrixArg &y);

}  // namespace twblas::cuda

namespace twblas::cuda {

// ---- the fused feed-forward (ffn_kernels.cu)

/// The FFN's weights in the kernels' layouts, made once by twCreateFfn (dp = D rounded up to 8,
/// hp = H rounded up to 8; pads are zero).
struct FfnWeights {
    const void *gate;     // H x dp: Wg (gated) or Wu (plain), the GEMM whose ReLU gives sparsity
    const void *pair;     // H rows of `pair_stride`: [Wu_j | Wd_j] (gated) or [Wd_j] (plain)
    int64_t pair_stride;  // elements
    const void *down_t;   // D x hp: Wd^T, for the dense path of overflowing rows
};

/// Device-side statistics of the last forward (deterministic: reduced in a fixed order).
struct FfnDeviceStats {
    long long tokens, total_nnz, max_row, overflow_rows;  // overflow: a TwELL tile over capacity
    long long dense_rows;                                  // rows on the dense path (overflow + long)
    double l1_sum;
};

struct FfnProblem {
    int64_t m, d, h, dp, hp;
    twDataType_t type;   // X, Y and weights
    bool gated, highest, deterministic;
    int32_t tile, slots;  // TwELL tile of the path: a row with more than `slots` active units in
                          // a tile goes through the exact dense path
};

/// Pieces of a forward's workspace, carved in one place so that sizing and use agree.
struct FfnScratch {
    void *lt_workspace;  // cuBLASLt
    size_t lt_bytes;
    void *gate;          // M x hp, gate type (value type; fp32 in HIGHEST_PRECISION); later h
    int64_t ldg;
    void *up;            // M x hp: X Wu^T of every row (dense mode) or of the compacted dense-path
                         // rows, then their h (NULL for fp32 gates: no cuBLAS form)
    void *xc;            // M x dp: compacted X rows of the dense path, then their Y rows
    uint16_t *idx;       // M x cap active units in ascending order
    int32_t cap;
    int32_t *count;      // M: active units, -1 for rows on the dense path
    int32_t *row_nnz;    // M: active units of every row
    float *row_l1;       // M: sum |h| of each row
    uint32_t *header;    // [0] rows on the dense path, [1] finalize's ticket (zeroed by ffn_pack)
    uint32_t *dense_count;  // = header
    int32_t *dense_rows;    // M
    int32_t *writer_flags;  // M (hidden output)
    int32_t row_limit;      // rows with more active units take the dense path
    void *save_g, *save_u;  // training forward: g and u per list slot (else NULL)
    int splits;             // teams per token (small M), see ffn_splits
    float *partial;         // splits x M x dp partial rows, then splits x M l1 (splits > 1)
    int32_t *dec_zero;      // decode: row_nnz [M], list counts [M], tile counts [M x NT] (zeroed)
    int32_t *dec_list;      // decode: per token, the warps that wrote a partial row
    float *dec_partial;     // decode: per warp and token a partial y row, then per warp l1
};
FfnScratch carve_ffn_scratch(void *workspace, const FfnProblem &p, size_t *bytes);
int ffn_splits(int64_t m);
/// Width of the per-token active-unit lists (the most units a row without tile overflow has).
int32_t ffn_list_width(const FfnProblem &p);
/// Largest model dimension D the fused kernel takes for a value type (a team of warps per token).
int64_t ffn_max_model_dim(twDataType_t type);
/// Decode (M <= 4 tokens, 16-bit types, D <= 4096): one kernel computes the gate, the unit
/// choice and the up/down projections (no cuBLAS, no packing pass), a second sums per token.
bool ffn_decode_applies(const FfnProblem &p);
void ffn_decode(cudaStream_t stream, const FfnProblem &p, const FfnWeights &w, const MatrixArg &x, const MatrixArg &y,
                const FfnScratch &s, unsigned long long *neuron_counts, bool write_h);

/// Copies user weights (device, any order) into the FfnWeights layout.
void repack_weights(cudaStream_t stream, const FfnProblem &p, const MatrixArg *wg, const MatrixArg &wu,
                    const MatrixArg &wd, void *gate, void *pair, void *down_t);

// A forward is: the gate GEMM into scratch.gate (cuBLASLt, by the backend), ffn_pack, then
// either ffn_sparse (active units only; overflowing rows through the exact dense path) or, in
// dense mode, the up GEMM into scratch.up before ffn_pack and the down GEMM after it, then ffn_finish.

/// Active-unit lists, the dense path's rows (a TwELL tile over capacity, or more active units
/// than gathers pay for), row counts, neuron counts; zeroes the inactive gate values when
/// `zero_inactive` (the hidden output needs h = 0 there). In dense mode (scratch.up holds
/// X Wu^T of every row) it writes h over the gate values and each row's l1 instead of lists.
void ffn_pack(cudaStream_t stream, const FfnProblem &p, const FfnScratch &s, unsigned long long *neuron_counts,
              bool zero_inactive, bool dense_mode);
/// Dense mode: the per-unit activation counts, by columns of the gate (before ffn_pack, which
/// then gets no counters).
void ffn_count_dense(cudaStream_t stream, const FfnProblem &p, const FfnScratch &s, unsigned long long *neuron_counts);
/// Y for every row: sparse rows through the fused up/down kernel (h written over the gate
/// buffer when `write_h`), rows on the dense path through gathered tensor-core GEMMs.
/// Rows [0, first) of the dense list were done through cuBLAS (ffn_dense_*).
void ffn_sparse(cudaStream_t stream, const FfnProblem &p, const FfnWeights &w, const MatrixArg &x, const MatrixArg &y,
                const FfnScratch &s, bool write_h, int64_t first, bool sparse_rows = true);
/// The cuBLAS dense path over the first `cap` rows of the dense list: gather X rows into
/// scratch.xc, (up GEMM into scratch.up by the backend), h over scratch.up, (down GEMM into
/// scratch.xc), scatter into Y.
void ffn_dense_gather(cudaStream_t stream, const FfnProblem &p, const MatrixArg &x, const FfnScratch &s, int64_t cap);
void ffn_dense_rows_hidden(cudaStream_t stream, const FfnProblem &p, const FfnScratch &s, int64_t cap, bool write_back);
void ffn_dense_scatter(cudaStream_t stream, const FfnProblem &p, const MatrixArg &y, const FfnScratch &s, int64_t cap);
/// Statistics (and the l1 of dense-path rows), then the optional hidden output from h.
void ffn_finish(cudaStream_t stream, const FfnProblem &p, const FfnScratch &s, bool dense_mode, int64_t first,
                FfnDeviceStats *stats, const twSpMatDescr *hidden);

}  // namespace twblas::cuda

namespace twblas::cuda {

// ---- training (train_kernels.cu)

/// Width of the saved ELL part: rows with more active units are recomputed in the backward.
constexpr int32_t kSavedEll = 128;

/// The training forward's saved state, in the caller's buffer (offsets in bytes): a header
/// (shape, type, mode), the dense-list count (and the forward's finishing ticket), each row's
/// count (-1 or -2: a row on the dense path, recomputed from X in the backward), the dense list,
/// and an ELL part: each sparse row's active units in ascending order with their g and u (gate
/// type). At the paper's shape it is 1/14 of a dense bf16 h.
struct SavedLayout {
    int32_t ell;
    size_t header, words, count, dense_rows, idx, g, u, total;
};
SavedLayout saved_layout(const FfnProblem &p);
/// Writes the header and points the forward's lists, counts and saved g/u into `saved`.
void prepare_saved(cudaStream_t stream, const FfnProblem &p, void *saved, FfnScratch &s);

/// The forward's sparse rows in two passes (a warp per active unit for u and h, then y by column
/// slices): u, h (saved as g and u when s.save_g, else written over the gate buffer) and each
/// row's l1, then y. The rows of the dense path are left to ffn_sparse's dense part.
void ffn_rows_split(cudaStream_t stream, const FfnProblem &p, const FfnWeights &w, const MatrixArg &x,
                    const MatrixArg &y, const FfnScratch &s);
/// After a dense-mode forward: every row saved as one the backward recomputes (count < 0, the
/// dense list = all rows in order).
void saved_all_rows_dense(cudaStream_t stream, const FfnProblem &p, void *saved);

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
    void *dz, *du;        // M x ell, gate type
    void *rz, *ru, *rh;   // recomputed rows: M x hp, gate type
    float *dw_dense;      // 3 x H x dp: the recomputed rows' weight-gradient terms
    // the cuBLAS part of the recompute (16-bit DEFAULT only; NULL otherwise)
    void *lt_workspace;
    size_t lt_bytes;
    void *xc, *dyc;  // cap x dp compacted X and dY rows
    float *dxc;      // (2 x) cap x dp: dZ Wg and dU Wu (fp32)
};
TrainScratch carve_train_scratch(void *workspace, const FfnProblem &p, size_t *bytes);

struct BackwardArgs {
    MatrixArg x, dy, dx, dwg, dwu, dwd;  // dwg.ptr NULL for a plain FFN
    float l1_scale;                      // l1Coeff / M
};
// A backward is: backward_sort_dense (the dense list in ascending row order); when the forward's
// statistics suggest a capacity `cap` (16-bit DEFAULT, not deterministic), the cuBLAS part for
// list positions [0, cap): backward_dense_gather, z / u / dh GEMMs into rz / ru / rh (by the
// backend), backward_dense_grads, dX GEMMs into dxc, backward_dense_scatter, weight-gradient
// GEMMs into dw_dense; then ffn_backward (positions [cap, count) through the device-count GEMMs,
// the token phase, the unit sort and the unit phase).
void backward_sort_dense(cudaStream_t stream, const FfnProblem &p, const void *saved, const TrainScratch &s);
void backward_dense_gather(cudaStream_t stream, const FfnProblem &p, const void *saved, const BackwardArgs &b,
                           const TrainScratch &s, int64_t cap);
void backward_dense_grads(cudaStream_t stream, const FfnProblem &p, const TrainScratch &s, int64_t cap, float l1_scale);
void backward_dense_scatter(cudaStream_t stream, const FfnProblem &p, const void *saved, const BackwardArgs &b,
                            const TrainScratch &s, int64_t cap);
/// dX, dWg, dWu, dWd from the saved state; deterministic for a given `first` (no atomics on values).
void ffn_backward(cudaStream_t stream, const FfnProblem &p, const FfnWeights &w, const void *saved,
                  const BackwardArgs &b, const TrainScratch &s, int64_t first);

}  // namespace twblas::cuda
