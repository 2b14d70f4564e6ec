// Reference fused feed-forward: inference forward, training forward with saved state, backward.
//
// Numerics (twComputeMode_t): z = X W^T in fp32. DEFAULT rounds g = relu(z), u and h = g * u to
// the value type, as a dense bf16 PyTorch FFN does; HIGHEST_PRECISION keeps them in fp32. A unit
// is active for a token when its (rounded) g is non-zero and not negative (NaN stays active, as
// torch.relu passes NaN). Sums over units run in ascending unit order: results are deterministic.
// FP8_WEIGHTS rounds as DEFAULT and reads the up and down rows as FP8 (twblas.h gives the rule).
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstring>
#include <mutex>

#include "host/error.hpp"
#include "host/numeric.hpp"
#include "reference.hpp"
#include "saved_state.hpp"
#include "sparse_io.hpp"

namespace twblas::reference {

namespace {

struct RefFfnState final : FfnState {
    RowMatrix wg, wu, wd;  // H x D fp32 (wg empty for plain ReLU); wd row j = unit j's down row
    // TW_COMPUTE_FP8_WEIGHTS: the rows the sparse part reads (Wu of a gated FFN, Wd), quantized
    // and scaled back, made by the first forward in that mode after the weights changed
    mutable std::mutex fp8_lock;
    bool fp8_current = false;
    RowMatrix wu_fp8, wd_fp8;
    /// The reference keeps every weight as an fp32 copy (it is the oracle), and the FP8 rows once
    /// made: all of it counts.
    int64_t weight_copy_bytes() const override {
        std::lock_guard<std::mutex> lock(fp8_lock);
        const Eigen::Index values = wg.size() + wu.size() + wd.size() + wu_fp8.size() + wd_fp8.size();
        return static_cast<int64_t>(values) * static_cast<int64_t>(sizeof(float));
    }
    // Shared by every forward on this FFN, from any thread and handle: `published` guards the
    // statistics and the neuron counts. A forward accumulates its own privately and publishes
    // them in one critical section (StatsAccumulator::publish), so the counts add up exactly and
    // the statistics are always those of one whole forward: the last one to publish.
    mutable std::mutex published;
    twFfnStats_t stats{0, 0.0, 0, 0, 0.0};
    std::vector<int64_t> neuron_counts;
};

RefFfnState &state_of(const twFfnDescr &ffn) { return static_cast<RefFfnState &>(*ffn.state); }

/// Each row as FP8 E4M3 with one scale s = max|w| / 448 (1 for a row of zeros), scaled back.
RowMatrix fp8_rows(const RowMatrix &w) {
    RowMatrix q(w.rows(), w.cols());
    for (Eigen::Index j = 0; j < w.rows(); ++j) {
        float amax = 0.0f;
        for (Eigen::Index k = 0; k < w.cols(); ++k) amax = std::max(amax, std::fabs(w(j, k)));
        const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
        for (Eigen::Index k = 0; k < w.cols(); ++k) q(j, k) = round_to_e4m3(w(j, k) / scale) * scale;
    }
    return q;
}

/// The up and down rows the sparse part reads: the FFN's own, or (FP8_WEIGHTS) their FP8 form.
struct SparseRows {
    const RowMatrix &wu, &wd;
};
SparseRows sparse_rows(const twFfnDescr &ffn, RefFfnState &st) {
    if (ffn.compute_mode != TW_COMPUTE_FP8_WEIGHTS) return {st.wu, st.wd};
    std::lock_guard<std::mutex> lock(st.fp8_lock);
    if (!st.fp8_current) {
        if (ffn.gated()) st.wu_fp8 = fp8_rows(st.wu);  // a plain FFN's Wu is its gate: kept as it is
        st.wd_fp8 = fp8_rows(st.wd);
        st.fp8_current = true;
    }
    return {ffn.gated() ? st.wu_fp8 : st.wu, st.wd_fp8};
}

/// Active units of one token with their g, u and h (u unused for plain ReLU).
struct RowActivity {
    std::vector<int32_t> cols;
    std::vector<float> g, u, h;
    void clear() {
        cols.clear();
        g.clear();
        u.clear();
        h.clear();
    }
};

struct Numerics {
    twDataType_t type;
    bool highest;
    float round(float v) const { return highest ? v : round_to(type, v); }
};

Numerics numerics_of(const twFfnDescr &ffn) { return {ffn.type, ffn.compute_mode == TW_COMPUTE_HIGHEST_PRECISION}; }

/// Activity of one token from its pre-activation row z (H values) and its input row x (D).
void activity_from_preactivation(const twFfnDescr &ffn, const SparseRows &w, const Numerics &num, const float *z,
                                 const float *x, RowActivity &out) {
    out.clear();
    const int64_t d = ffn.model_dim;
    for (int64_t j = 0; j < ffn.hidden_dim; ++j) {
        const float g = num.round(z[j]);
        if (!relu_keeps(g) || g == 0.0f) continue;
        out.cols.push_back(static_cast<int32_t>(j));
        out.g.push_back(g);
        if (ffn.gated()) {
            const float *wu = w.wu.row(j).data();
            float u = 0.0f;
            for (int64_t k = 0; k < d; ++k) u += x[k] * wu[k];
            u = num.round(u);
            out.u.push_back(u);
            out.h.push_back(num.round(g * u));
        } else {
            out.u.push_back(0.0f);
            out.h.push_back(g);
        }
    }
}

/// y = sum_j h_j Wd[j, :] (D values) in fp32.
void down_projection(const SparseRows &w, const RowActivity &a, int64_t d, float *y) {
    std::fill(y, y + d, 0.0f);
    for (size_t i = 0; i < a.cols.size(); ++i) {
        const float h = a.h[i];
        const float *wd = w.wd.row(a.cols[i]).data();
        for (int64_t k = 0; k < d; ++k) y[k] += h * wd[k];
    }
}

/// Whether a token's active units overflow a TwELL tile of the FFN's path (the dense path).
bool overflows_tile(const twFfnDescr &ffn, const std::vector<int32_t> &cols) {
    const int64_t slots = ffn.tile_width / ffn.compression - 1;
    int64_t tile = -1, in_tile = 0;
    for (int32_t c : cols) {
        const int64_t t = c / ffn.tile_width;
        in_tile = t == tile ? in_tile + 1 : 1;
        tile = t;
        if (in_tile > slots) return true;
    }
    return false;
}

/// Runs the forward over all tokens in row blocks. For each block, `per_row(i, r, activity)` is
/// called sequentially in row order after the block's parallel part, for outputs that must be
/// written in order (hidden containers, saved state, statistics).
template <class PerRow>
void forward_rows(twFfnDescr &ffn, const twDnMatDescr &x, const twDnMatDescr &y, PerRow &&per_row) {
    RefFfnState &st = state_of(ffn);
    const Numerics num = numerics_of(ffn);
    const RowMatrix &w_sparse = ffn.gated() ? st.wg : st.wu;  // the matrix whose ReLU makes the sparsity
    const SparseRows rows_used = sparse_rows(ffn, st);
    std::vector<RowActivity> act(kRowBlock);
    const int64_t d = ffn.model_dim;
    for (int64_t r0 = 0; r0 < x.rows; r0 += kRowBlock) {
        const int64_t rows = std::min(kRowBlock, x.rows - r0);
        const RowMatrix xb = load_rows(x, r0, rows);
        RowMatrix z(rows, ffn.hidden_dim);
        z.noalias() = xb * w_sparse.transpose();
#pragma omp parallel
        {
            std::vector<float> yrow(static_cast<size_t>(d));
#pragma omp for schedule(dynamic, 4)
            for (int64_t i = 0; i < rows; ++i) {
                activity_from_preactivation(ffn, rows_used, num, z.row(i).data(), xb.row(i).data(), act[i]);
                down_projection(rows_used, act[i], d, yrow.data());
                store_row(y, r0 + i, yrow.data());
            }
        }
        for (int64_t i = 0; i < rows; ++i) per_row(r0 + i, act[i]);
    }
}

/// Accumulates the statistics and neuron counts of one forward privately, then publishes them on
/// the FFN whole, under its lock: concurrent forwards on one FFN each add their counts exactly,
/// and the statistics are those of the forward that published last.
struct StatsAccumulator {
    const twFfnDescr &ffn;
    RefFfnState &st;
    int64_t total = 0, max_row = 0, overflow = 0;
    double l1 = 0.0;
    std::vector<int64_t> counts{};  // this forward's per-unit counts (H values, allocated on first use)
    void add(const RowActivity &a) {
        const int64_t n = static_cast<int64_t>(a.cols.size());
        total += n;
        max_row = std::max(max_row, n);
        overflow += overflows_tile(ffn, a.cols);
        if (n > 0 && counts.empty()) counts.assign(static_cast<size_t>(ffn.hidden_dim), 0);
        for (size_t i = 0; i < a.cols.size(); ++i) {
            l1 += std::fabs(static_cast<double>(a.h[i]));
            ++counts[static_cast<size_t>(a.cols[i])];
        }
    }
    void publish(int64_t tokens) {
        twFfnStats_t s;
        s.tokens = tokens;
        s.meanRowNnz = tokens ? static_cast<double>(total) / static_cast<double>(tokens) : 0.0;
        s.maxRowNnz = max_row;
        s.overflowRows = overflow;
        s.l1 = tokens ? l1 / static_cast<double>(tokens) : 0.0;
        std::lock_guard<std::mutex> lock(st.published);
        st.stats = s;
        if (!counts.empty())
            for (size_t j = 0; j < counts.size(); ++j) st.neuron_counts[j] += counts[j];
    }
};

// ---- saved state of the training forward (layout: saved_state.hpp) -------------------------

/// Checks the whole saved state before the backward uses any of it: the header, then for every
/// token its unit count and, when the units are kept, their ids and g. Every count and id is an
/// index in the backward; none is trusted. Throws INVALID_VALUE naming `saved`, the token and
/// the value; nothing has been written then.
void validate_saved(const twFfnDescr &ffn, const uint8_t *base, int64_t m) {
    const int64_t hdim = ffn.hidden_dim;
    SavedHeader header;
    std::memcpy(&header, base, sizeof header);
    if (header.magic != kSavedMagic || header.tokens != m || header.model_dim != ffn.model_dim ||
        header.hidden_dim != hdim || header.kind != ffn.kind || header.type != ffn.type ||
        header.compute_mode != ffn.compute_mode)
        fail(TW_STATUS_INVALID_VALUE, "saved: not the state of twSpGEMMFusedForwardTrain with this ffn on %" PRId64
             " tokens (and the same compute mode)", m);
    if (header.ell_width != kSavedEllWidth)
        fail(TW_STATUS_INVALID_VALUE, "saved: header gives %d kept units per token, this backend keeps %" PRId64,
             header.ell_width, kSavedEllWidth);
    const SavedLayout layout(m);
    const auto *row_nnz = reinterpret_cast<const int32_t *>(base + layout.row_nnz);
    const auto *cols = reinterpret_cast<const uint16_t *>(base + layout.cols);
    const auto *g = reinterpret_cast<const float *>(base + layout.g);
    for (int64_t t = 0; t < m; ++t) {
        const int64_t n = row_nnz[t];
        if (n < 0 || n > hdim)
            fail(TW_STATUS_INVALID_VALUE, "saved: token %" PRId64 ": unit count %" PRId64 " outside [0, H = %" PRId64 "]",
                 t, n, hdim);
        if (n > kSavedEllWidth) continue;  // only the count is kept: the backward recomputes the token
        const size_t at = static_cast<size_t>(t * kSavedEllWidth);
        for (int64_t i = 0; i < n; ++i) {
            const int64_t j = cols[at + i];
            if (j >= hdim)
                fail(TW_STATUS_INVALID_VALUE, "saved: token %" PRId64 ", entry %" PRId64 ": unit id %" PRId64
                     " is not below H = %" PRId64, t, i, j, hdim);
            if (i > 0 && j <= cols[at + i - 1])
                fail(TW_STATUS_INVALID_VALUE, "saved: token %" PRId64 ", entry %" PRId64 ": unit id %" PRId64
                     " does not ascend (the entry before holds %d)", t, i, j, cols[at + i - 1]);
            const float gv = g[at + i];
            if (!relu_keeps(gv) || gv == 0.0f)
                fail(TW_STATUS_INVALID_VALUE, "saved: token %" PRId64 ", entry %" PRId64 " (unit %" PRId64
                     "): g = %g is not the value of an active unit (> 0 or NaN)", t, i, j, static_cast<double>(gv));
        }
    }
}

}  // namespace

// ---- setup ---------------------------------------------------------------------------------

std::unique_ptr<FfnState> ReferenceBackend::ffn_create(const twFfnDescr &ffn, const twDnMatDescr *wg,
                                                       const twDnMatDescr &wu, const twDnMatDescr &wd) {
    auto st = std::make_unique<RefFfnState>();
    st->neuron_counts.assign(static_cast<size_t>(ffn.hidden_dim), 0);
    if (wg) st->wg = load(*wg);
    st->wu = load(wu);
    st->wd = load(wd);
    return st;
}

void ReferenceBackend::ffn_update_weights(twFfnDescr &ffn, const twDnMatDescr *wg, const twDnMatDescr &wu,
                                          const twDnMatDescr &wd) {
    RefFfnState &st = state_of(ffn);
    RowMatrix g = wg ? load(*wg) : RowMatrix(), u = load(wu), d = load(wd);  // all loaded before any is replaced
    st.wg.swap(g);
    st.wu.swap(u);
    st.wd.swap(d);
    std::lock_guard<std::mutex> lock(st.fp8_lock);
    st.fp8_current = false;
}

// ---- inference -----------------------------------------------------------------------------

size_t ReferenceBackend::ffn_forward_workspace(const twFfnDescr &, int64_t) { return 0; }

void ReferenceBackend::ffn_forward(twFfnDescr &ffn, const twDnMatDescr &x, const twDnMatDescr &y,
                                   const twSpMatDescr *hidden, void *) {
    RefFfnState &st = state_of(ffn);
    StatsAccumulator stats{ffn, st};
    std::unique_ptr<SparseWriter> writer;
    if (hidden) writer = std::make_unique<SparseWriter>(*hidden);
    std::vector<int32_t> cols;
    std::vector<ValueBits> bits;
    forward_rows(ffn, x, y, [&](int64_t r, const RowActivity &a) {
        stats.add(a);
        if (!writer) return;
        // h values that round to +0 in the container's type are not stored (zero is implicit)
        cols.clear();
        bits.clear();
        for (size_t i = 0; i < a.cols.size(); ++i) {
            const ValueBits b = to_bits(hidden->type, a.h[i]);
            if (!is_stored_nonzero(b)) continue;
            cols.push_back(a.cols[i]);
            bits.push_back(b);
        }
        writer->write_row(r, cols.data(), bits.data(), static_cast<int64_t>(cols.size()));
    });
    stats.publish(x.rows);
}

twFfnStats_t ReferenceBackend::ffn_stats(const twFfnDescr &ffn) {
    const RefFfnState &st = state_of(ffn);
    std::lock_guard<std::mutex> lock(st.published);
    return st.stats;
}

void ReferenceBackend::ffn_neuron_counts(const twFfnDescr &ffn, int64_t *counts) {
    const RefFfnState &st = state_of(ffn);
    std::lock_guard<std::mutex> lock(st.published);
    std::copy(st.neuron_counts.begin(), st.neuron_counts.end(), counts);
}

void ReferenceBackend::ffn_reset_neuron_counts(twFfnDescr &ffn) {
    RefFfnState &st = state_of(ffn);
    std::lock_guard<std::mutex> lock(st.published);
    std::fill(st.neuron_counts.begin(), st.neuron_counts.end(), 0);
}

// ---- training ------------------------------------------------------------------------------

size_t ReferenceBackend::ffn_saved_bytes(const twFfnDescr &, int64_t tokens) { return SavedLayout(tokens).total; }

void ReferenceBackend::ffn_forward_train(twFfnDescr &ffn, const twDnMatDescr &x, const twDnMatDescr &y, void *saved,
                                         void *) {
    RefFfnState &st = state_of(ffn);
    StatsAccumulator stats{ffn, st};
    const SavedLayout layout(x.rows);
    auto *base = static_cast<uint8_t *>(saved);
    const SavedHeader header{kSavedMagic, x.rows, ffn.model_dim, ffn.hidden_dim, ffn.kind, ffn.type,
                             ffn.compute_mode, static_cast<int32_t>(kSavedEllWidth)};
    std::memcpy(base, &header, sizeof header);
    auto *row_nnz = reinterpret_cast<int32_t *>(base + layout.row_nnz);
    auto *cols = reinterpret_cast<uint16_t *>(base + layout.cols);
    auto *g = reinterpret_cast<float *>(base + layout.g);
    auto *u = reinterpret_cast<float *>(base + layout.u);
    forward_rows(ffn, x, y, [&](int64_t r, const RowActivity &a) {
        stats.add(a);
        const int64_t n = static_cast<int64_t>(a.cols.size());
        row_nnz[r] = static_cast<int32_t>(n);
        if (n > kSavedEllWidth) return;  // recomputed in the backward
        const size_t at = static_cast<size_t>(r * kSavedEllWidth);
        for (int64_t i = 0; i < n; ++i) {
            cols[at + i] = static_cast<uint16_t>(a.cols[i]);
            g[at + i] = a.g[i];
            u[at + i] = a.u[i];
        }
    });
    stats.publish(x.rows);
}

void ReferenceBackend::ffn_write_l1(const twFfnDescr &ffn, float *dst) {
    *dst = static_cast<float>(ffn_stats(ffn).l1);
}

size_t ReferenceBackend::ffn_backward_workspace(const twFfnDescr &, int64_t) { return 0; }

void ReferenceBackend::ffn_backward(twFfnDescr &ffn, const twDnMatDescr &x, const void *saved, const twDnMatDescr &dy,
                                    L1Coefficient l1, const twDnMatDescr &dx, const twDnMatDescr *dwg,
                                    const twDnMatDescr &dwu, const twDnMatDescr &dwd, void *) {
    const RefFfnState &st = state_of(ffn);
    const Numerics num = numerics_of(ffn);
    const int64_t m = x.rows, d = ffn.model_dim, hdim = ffn.hidden_dim;
    const auto *base = static_cast<const uint8_t *>(saved);
    validate_saved(ffn, base, m);  // every count and unit id below is checked: nothing is written before
    const SavedLayout layout(m);
    const auto *row_nnz = reinterpret_cast<const int32_t *>(base + layout.row_nnz);
    const auto *scols = reinterpret_cast<const uint16_t *>(base + layout.cols);
    const auto *sg = reinterpret_cast<const float *>(base + layout.g);
    const auto *su = reinterpret_cast<const float *>(base + layout.u);

    const RowMatrix xf = load(x), dyf = load(dy);
    const RowMatrix &w_sparse = ffn.gated() ? st.wg : st.wu;
    const float l1_coeff = l1.at ? *l1.at : l1.value;  // host memory: read during the call
    const float l1_scale = m > 0 ? l1_coeff / static_cast<float>(m) : 0.0f;

    // Per token: the active units' gradients wrt the unit's pre-activations (dz: the sparse
    // matrix's rows, du: the up projection's rows when gated) and h for dWd.
    std::vector<RowActivity> act(static_cast<size_t>(m));
    std::vector<std::vector<float>> dz(static_cast<size_t>(m)), du(static_cast<size_t>(m));
    RowMatrix dxf(m, d);
#pragma omp parallel
    {
        std::vector<float> z(static_cast<size_t>(hdim));
#pragma omp for schedule(dynamic, 8)
        for (int64_t t = 0; t < m; ++t) {
            RowActivity &a = act[t];
            const int64_t n = row_nnz[t];
            if (n > kSavedEllWidth) {  // recompute the dense row exactly as the forward did
                const float *xt = xf.row(t).data();
                for (int64_t j = 0; j < hdim; ++j) {
                    const float *w = w_sparse.row(j).data();
                    float acc = 0.0f;
                    for (int64_t k = 0; k < d; ++k) acc += xt[k] * w[k];
                    z[j] = acc;
                }
                activity_from_preactivation(ffn, SparseRows{st.wu, st.wd}, num, z.data(), xt, a);
            } else {
                a.clear();
                const size_t at = static_cast<size_t>(t * kSavedEllWidth);
                for (int64_t i = 0; i < n; ++i) {
                    a.cols.push_back(scols[at + i]);
                    a.g.push_back(sg[at + i]);
                    a.u.push_back(su[at + i]);
                    a.h.push_back(ffn.gated() ? num.round(sg[at + i] * su[at + i]) : sg[at + i]);
                }
            }
            const float *dyt = dyf.row(t).data();
            float *dxt = dxf.row(t).data();
            std::fill(dxt, dxt + d, 0.0f);
            dz[t].resize(a.cols.size());
            du[t].resize(a.cols.size());
            for (size_t i = 0; i < a.cols.size(); ++i) {
                const int64_t j = a.cols[i];
                const float *wd = st.wd.row(j).data();
                float dh = 0.0f;
                for (int64_t k = 0; k < d; ++k) dh += dyt[k] * wd[k];
                const float h = a.h[i];
                dh = num.round(num.round(dh) + l1_scale * static_cast<float>((h > 0.0f) - (h < 0.0f)));
                if (ffn.gated()) {
                    du[t][i] = num.round(dh * a.g[i]);
                    dz[t][i] = num.round(dh * a.u[i]);  // relu'(z) = 1 on active units
                    const float *wu = st.wu.row(j).data();
                    const float *wg = st.wg.row(j).data();
                    for (int64_t k = 0; k < d; ++k) dxt[k] += du[t][i] * wu[k] + dz[t][i] * wg[k];
                } else {
                    dz[t][i] = dh;
                    const float *wu = st.wu.row(j).data();
                    for (int64_t k = 0; k < d; ++k) dxt[k] += dz[t][i] * wu[k];
                }
            }
        }
    }

    // Weight gradients unit by unit: transpose the token -> unit lists into unit -> token lists.
    std::vector<int64_t> start(static_cast<size_t>(hdim) + 1, 0);
    for (int64_t t = 0; t < m; ++t)
        for (int32_t j : act[t].cols) ++start[j + 1];
    for (int64_t j = 0; j < hdim; ++j) start[j + 1] += start[j];
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    std::vector<int64_t> tok(static_cast<size_t>(start[hdim]));
    std::vector<float> c_dz(tok.size()), c_du(tok.size()), c_h(tok.size());
    for (int64_t t = 0; t < m; ++t)
        for (size_t i = 0; i < act[t].cols.size(); ++i) {
            const int64_t at = fill[act[t].cols[i]]++;
            tok[at] = t;
            c_dz[at] = dz[t][i];
            c_du[at] = du[t][i];
            c_h[at] = act[t].h[i];
        }

    store(dx, dxf);
    const twDnMatDescr *dw_sparse = ffn.gated() ? dwg : &dwu;  // gradient of the sparsity-making matrix
#pragma omp parallel
    {
        std::vector<float> g_sparse(static_cast<size_t>(d)), g_up(static_cast<size_t>(d)), g_down(static_cast<size_t>(d));
#pragma omp for schedule(dynamic, 16)
        for (int64_t j = 0; j < hdim; ++j) {
            std::fill(g_sparse.begin(), g_sparse.end(), 0.0f);
            std::fill(g_up.begin(), g_up.end(), 0.0f);
            std::fill(g_down.begin(), g_down.end(), 0.0f);
            for (int64_t at = start[j]; at < start[j + 1]; ++at) {
                const float *xt = xf.row(tok[at]).data();
                const float *dyt = dyf.row(tok[at]).data();
                for (int64_t k = 0; k < d; ++k) {
                    g_sparse[k] += c_dz[at] * xt[k];
                    g_up[k] += c_du[at] * xt[k];
                    g_down[k] += c_h[at] * dyt[k];
                }
            }
            store_row(*dw_sparse, j, g_sparse.data());
            if (ffn.gated()) store_row(dwu, j, g_up.data());
            store_row(dwd, j, g_down.data());
        }
    }
}

}  // namespace twblas::reference
