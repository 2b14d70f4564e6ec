// The CUDA backend (sm_90a). Compute calls (GemmToSparse, SpMM, the fused FFN) run as kernels
// on the handle's stream with scratch from the caller's workspace: no allocation, no
// synchronisation, capturable in CUDA graphs. Calls whose contract returns a result to the host
// (info, validation, conversions that report CAPACITY_EXCEEDED, statistics) synchronise the
// handle's stream; the sparse-to-sparse conversions, SparseToDense and the validator run the
// reference code on a host copy ("host-staged"), which is exact and shares its messages.
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "host/backend.hpp"
#include "cuda_util.cuh"
#include "kernels.hpp"
#include "lt_gemm.hpp"

namespace twblas {

namespace {

/// Compute capability major of the current device, or -1 when no GPU answers.
int device_major() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        (void)cudaGetLastError();  // clear the error of a machine without a driver
        return -1;
    }
    int device = 0, major = -1;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess)
        return -1;
    return major;
}

using cuda::check;

int64_t round8(int64_t v) { return (v + 7) / 8 * 8; }

// ---- host staging of buffers for the calls that run the reference code

size_t dense_bytes(const twDnMatDescr &d) {
    if (d.empty()) return 0;
    const int64_t outer = d.order == TW_ORDER_ROW ? d.rows : d.cols, inner = d.order == TW_ORDER_ROW ? d.cols : d.rows;
    return static_cast<size_t>((outer - 1) * d.ld + inner) * cuda::elem_bytes(d.type);
}
size_t sparse_bytes(const twSpMatDescr &s) {
    return s.format == TW_FORMAT_TWELL ? s.twell.bytes() : s.hybrid.total;
}

/// A host mirror of one device buffer, copied in on creation and out on demand.
class Staged {
  public:
    Staged(cudaStream_t stream, void *device, size_t bytes) : stream_(stream), device_(device), host_(bytes) {
        if (bytes)
            check(cudaMemcpyAsync(host_.data(), device, bytes, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
        check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    }
    void *host() { return host_.data(); }
    void write_back() {
        if (!host_.empty())
            check(cudaMemcpyAsync(device_, host_.data(), host_.size(), cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
        check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    }

  private:
    cudaStream_t stream_;
    void *device_;
    std::vector<uint8_t> host_;
};

struct StagedDense {
    Staged buf;
    twDnMatDescr d;
    StagedDense(cudaStream_t s, const twDnMatDescr &dev) : buf(s, dev.values, dense_bytes(dev)), d(dev) { d.values = buf.host(); }
};
struct StagedSparse {
    Staged buf;
    twSpMatDescr d;
    StagedSparse(cudaStream_t s, const twSpMatDescr &dev) : buf(s, dev.buffer, sparse_bytes(dev)), d(dev) { d.buffer = buf.host(); }
};

// ---- FFN state

/// Pinned host memory for the statistics that steer the path choice.
struct PinnedStats {
    cuda::FfnDeviceStats *p = nullptr;
    PinnedStats() {
        if (cudaMallocHost(&p, sizeof *p) != cudaSuccess) {
            (void)cudaGetLastError();
            fail(TW_STATUS_ALLOC_FAILED, "cudaMallocHost of the FFN statistics failed");
        }
        *p = {};
    }
    ~PinnedStats() { cudaFreeHost(p); }
    PinnedStats(const PinnedStats &) = delete;
    PinnedStats &operator=(const PinnedStats &) = delete;
};

struct CudaFfnState final : FfnState {
    cuda::DeviceBuffer gate, pair, down_t, stats, counts;
    // Path choice from the measured sparsity: each forward copies its statistics to pinned
    // memory behind an event; a later forward reads them only once the event has completed
    // (cudaEventQuery never blocks). Dense mode runs the up and down projections as cuBLAS
    // GEMMs over every row when the active units are too many for gathers to pay off.
    PinnedStats feedback;
    cudaEvent_t feedback_ready = nullptr;
    bool feedback_pending = false;
    bool dense_mode = false;
    double dense_row_fraction = 0.0;  // of the last forward whose statistics arrived
    CudaFfnState() { check(cudaEventCreateWithFlags(&feedback_ready, cudaEventDisableTiming), "cudaEventCreate"); }
    ~CudaFfnState() override { cudaEventDestroy(feedback_ready); }
};

CudaFfnState &state_of(const twFfnDescr &ffn) { return static_cast<CudaFfnState &>(*ffn.state); }

cuda::FfnProblem problem_of(const twFfnDescr &ffn, int64_t tokens) {
    cuda::FfnProblem p{};
    p.m = tokens;
    p.d = ffn.model_dim;
    p.h = ffn.hidden_dim;
    p.dp = round8(p.d);
    p.hp = round8(p.h);
    p.type = ffn.type;
    p.gated = ffn.gated();
    p.highest = ffn.compute_mode == TW_COMPUTE_HIGHEST_PRECISION;
    p.deterministic = ffn.deterministic != 0;
    p.tile = ffn.tile_width;
    p.slots = ffn.tile_width / ffn.compression - 1;
    return p;
}

class CudaBackend final : public Backend {
  public:
    explicit CudaBackend(void *const *stream_slot) : stream_slot_(stream_slot), ref_(make_reference_backend()) {}
    twBackend_t kind() const override { return TW_BACKEND_CUDA; }

    // ---- inspection and conversions (host results: these synchronise)
    twSpMatInfo_t sparse_info(const twSpMatDescr &s) override {
        StagedSparse h(stream(), s);
        return ref_->sparse_info(h.d);
    }
    void sparse_validate(const twSpMatDescr &s) override {
        StagedSparse h(stream(), s);
        ref_->sparse_validate(h.d);
    }
    size_t dense_to_sparse_workspace(const twDnMatDescr &, const twSpMatDescr &out) override {
        return cuda::sparse_writer_workspace(out);
    }
    twStatus_t dense_to_sparse_analysis(const twDnMatDescr &in, const twSpMatDescr &out, twConvertOp_t op,
                                        void *) override {
        // the capacity check of the reference, on a host copy of `in`
        StagedDense h(stream(), in);
        std::vector<uint8_t> stamp(ref_->dense_to_sparse_workspace(h.d, out));
        return ref_->dense_to_sparse_analysis(h.d, out, op, stamp.data());
    }
    twStatus_t dense_to_sparse_convert(const twDnMatDescr &in, const twSpMatDescr &out, twConvertOp_t op,
                                       void *workspace) override {
        cuda::write_sparse(stream(), cuda::matrix_arg(in), op, out, workspace);
        return capacity_status(out);
    }
    twStatus_t sparse_to_dense(const twSpMatDescr &in, const twDnMatDescr &out) override {
        StagedSparse hi(stream(), in);
        StagedDense ho(stream(), out);
        const twStatus_t st = ref_->sparse_to_dense(hi.d, ho.d);
        if (st == TW_STATUS_SUCCESS) ho.buf.write_back();
        return st;
    }
    twStatus_t sparse_convert(const twSpMatDescr &in, const twSpMatDescr &out) override {
        StagedSparse hi(stream(), in), ho(stream(), out);
        const twStatus_t st = ref_->sparse_convert(hi.d, ho.d);
        ho.buf.write_back();
        return st;
    }
    twStatus_t sparse_transpose(const twSpMatDescr &in, const twSpMatDescr &out) override {
        StagedSparse hi(stream(), in), ho(stream(), out);
        const twStatus_t st = ref_->sparse_transpose(hi.d, ho.d);
        ho.buf.write_back();
        return st;
    }

    // ---- building blocks (compute calls)
    size_t gemm_to_sparse_workspace(const twDnMatDescr &a, const twDnMatDescr &b, const twSpMatDescr &c) override {
        return gemm_scratch(a, b, c, nullptr).total;
    }
    void gemm_to_sparse(float alpha, const twDnMatDescr &a, const twDnMatDescr &b, const twSpMatDescr &c,
                        twConvertOp_t act, void *workspace) override {
        const GemmScratch s = gemm_scratch(a, b, c, workspace);
        const int64_t ldz = std::max<int64_t>(1, round8(b.rows));
        gemm_.run(stream(), alpha, operand(a), operand(b), {s.z, ldz, TW_R_32F}, s.lt, cuda::GemmRunner::kWorkspaceBytes);
        const cuda::MatrixArg z{s.z, a.rows, b.rows, ldz, 1, TW_R_32F};
        cuda::write_sparse(stream(), z, act, c, s.flags);
    }
    size_t spmm_workspace(const twSpMatDescr &, const twDnMatDescr &, const twDnMatDescr &) override { return 0; }
    twStatus_t spmm(float alpha, const twSpMatDescr &s, const twDnMatDescr &w, float beta, const twDnMatDescr &y,
                    void *) override {
        // rows of S that a producer could not hold completely come out as NaN; their count is
        // in twSpMatGetInfo(S).overflowRows (a compute call cannot return it without a sync)
        cuda::spmm(stream(), alpha, s, cuda::matrix_arg(w), beta, cuda::matrix_arg(y));
        return TW_STATUS_SUCCESS;
    }

    // ---- fused feed-forward
    std::unique_ptr<FfnState> ffn_create(const twFfnDescr &ffn, const twDnMatDescr *wg, const twDnMatDescr &wu,
                                         const twDnMatDescr &wd) override {
        auto st = std::make_unique<CudaFfnState>();
        const cuda::FfnProblem p = problem_of(ffn, 0);
        if (p.dp > cuda::ffn_max_model_dim(p.type))
            fail(TW_STATUS_NOT_SUPPORTED, "the CUDA FFN supports a model dimension up to %lld for this type; D = %lld",
                 static_cast<long long>(cuda::ffn_max_model_dim(p.type)), static_cast<long long>(p.d));
        if (p.h > kMaxSparseCols)
            fail(TW_STATUS_NOT_SUPPORTED, "the CUDA FFN keeps unit ids in 16 bits: H up to %lld; H = %lld",
                 static_cast<long long>(kMaxSparseCols), static_cast<long long>(p.h));
        const size_t eb = cuda::elem_bytes(p.type);
        st->gate.reset(static_cast<size_t>(p.h * p.dp) * eb);
        st->pair.reset(static_cast<size_t>(p.h * p.dp * (p.gated ? 2 : 1)) * eb);
        st->down_t.reset(static_cast<size_t>(p.d * p.hp) * eb);
        st->stats.reset(sizeof(cuda::FfnDeviceStats));
        st->counts.reset(static_cast<size_t>(p.h) * 8);
        check(cudaMemsetAsync(st->stats.get(), 0, sizeof(cuda::FfnDeviceStats), stream()), "cudaMemsetAsync");
        check(cudaMemsetAsync(st->counts.get(), 0, st->counts.bytes(), stream()), "cudaMemsetAsync");
        repack(p, *st, wg, wu, wd);
        return st;
    }
    void ffn_update_weights(twFfnDescr &ffn, const twDnMatDescr *wg, const twDnMatDescr &wu,
                            const twDnMatDescr &wd) override {
        repack(problem_of(ffn, 0), state_of(ffn), wg, wu, wd);
    }
    size_t ffn_forward_workspace(const twFfnDescr &ffn, int64_t tokens) override {
        size_t bytes = 0;
        cuda::carve_ffn_scratch(nullptr, problem_of(ffn, tokens), &bytes);
        return bytes;
    }
    void ffn_forward(twFfnDescr &ffn, const twDnMatDescr &x, const twDnMatDescr &y, const twSpMatDescr *hidden,
                     void *workspace) override {
        CudaFfnState &st = state_of(ffn);
        const cuda::FfnProblem p = problem_of(ffn, x.rows);
        const cuda::FfnScratch s = cuda::carve_ffn_scratch(workspace, p, nullptr);
        const twDataType_t gate_type = p.highest ? TW_R_32F : p.type;
        const cuda::FfnWeights w{st.gate.get(), st.pair.get(), p.gated ? 2 * p.dp : p.dp, st.down_t.get()};
        if (cuda::ffn_decode_applies(p)) {
            // a few tokens: the whole forward in one kernel that streams the gate weights once
            cuda::ffn_decode(stream(), p, w, cuda::matrix_arg(x), cuda::matrix_arg(y), s,
                             st.counts.get<unsigned long long>(), hidden != nullptr);
            cuda::ffn_finish(stream(), p, s, true, 0, st.stats.get<cuda::FfnDeviceStats>(), hidden);
            post_feedback(st);
            return;
        }
        const bool dense = choose_dense_mode(st, p, y, s);
        int64_t first_dense = 0;
        // the gate GEMM (cuBLASLt, tensor cores): z = X Wg^T, rounded to the gate type
        gemm_.run(stream(), 1.0f, operand(x), {st.gate.get(), p.h, p.d, p.dp, TW_ORDER_ROW, p.type},
                  {s.gate, s.ldg, gate_type}, s.lt_workspace, s.lt_bytes);
        if (dense) {
            run_dense_mode(st, p, s, x, y);
        } else {
            // rows on the dense path: the first `cap` of them through cuBLAS GEMMs of cap rows
            // (cap from the last measured share of such rows, with room to spare), any beyond
            // through the gathered kernels, whose row count is read on the device
            cuda::ffn_pack(stream(), p, s, st.counts.get<unsigned long long>(), hidden != nullptr, false);
            const int64_t cap = dense_path_capacity(st, p, s.up != nullptr);
            run_dense_path(st, p, s, x, y, cap, hidden != nullptr);
            // many tokens: the two-pass kernels (0.75 -> 0.53 ms at the paper's shape, measured in
            // training); up to 512 tokens the fused kernel, whose units of a token are dealt to
            // several teams
            const bool split = s.splits == 1;
            if (split) cuda::ffn_rows_split(stream(), p, w, cuda::matrix_arg(x), cuda::matrix_arg(y), s);
            cuda::ffn_sparse(stream(), p, w, cuda::matrix_arg(x), cuda::matrix_arg(y), s, hidden != nullptr, cap, !split);
            first_dense = cap;
        }
        cuda::ffn_finish(stream(), p, s, dense, first_dense, st.stats.get<cuda::FfnDeviceStats>(), hidden);
        post_feedback(st);
    }
    twFfnStats_t ffn_stats(const twFfnDescr &ffn) override {  // blocking by contract
        cuda::FfnDeviceStats d{};
        check(cudaMemcpyAsync(&d, state_of(ffn).stats.get(), sizeof d, cudaMemcpyDeviceToHost, stream()),
              "cudaMemcpyAsync");
        check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
        absorb_feedback(state_of(ffn), ffn.hidden_dim);  // complete now: steer the next forward
        twFfnStats_t out{};
        out.tokens = d.tokens;
        out.meanRowNnz = d.tokens ? static_cast<double>(d.total_nnz) / static_cast<double>(d.tokens) : 0.0;
        out.maxRowNnz = d.max_row;
        out.overflowRows = d.overflow_rows;
        out.l1 = d.tokens ? d.l1_sum / static_cast<double>(d.tokens) : 0.0;
        return out;
    }
    void ffn_neuron_counts(const twFfnDescr &ffn, int64_t *counts) override {
        const CudaFfnState &st = state_of(ffn);
        check(cudaMemcpyAsync(counts, st.counts.get(), st.counts.bytes(), cudaMemcpyDeviceToDevice, stream()),
              "cudaMemcpyAsync");
    }
    void ffn_reset_neuron_counts(twFfnDescr &ffn) override {
        CudaFfnState &st = state_of(ffn);
        check(cudaMemsetAsync(st.counts.get(), 0, st.counts.bytes(), stream()), "cudaMemsetAsync");
    }

    // ---- training: the forward saves each sparse row's active units with g and u (the rows
    // on the dense path keep only their id and are recomputed exactly in the backward)
    size_t ffn_saved_bytes(const twFfnDescr &ffn, int64_t tokens) override {
        return cuda::saved_layout(training_problem(ffn, tokens)).total;
    }
    void ffn_forward_train(twFfnDescr &ffn, const twDnMatDescr &x, const twDnMatDescr &y, void *saved,
                           void *workspace) override {
        CudaFfnState &st = state_of(ffn);
        const cuda::FfnProblem p = training_problem(ffn, x.rows);
        cuda::FfnScratch s = cuda::carve_ffn_scratch(workspace, p, nullptr);
        cuda::prepare_saved(stream(), p, saved, s);
        if (p.m == 0) {  // the saved state of no tokens: a header and an empty dense list
            check(cudaMemsetAsync(s.header, 0, 2 * sizeof(uint32_t), stream()), "cudaMemsetAsync");
            return;
        }
        const twDataType_t gate_type = p.highest ? TW_R_32F : p.type;
        const cuda::FfnWeights w{st.gate.get(), st.pair.get(), p.gated ? 2 * p.dp : p.dp, st.down_t.get()};
        const bool dense = choose_dense_mode(st, p, y, s);
        gemm_.run(stream(), 1.0f, operand(x), {st.gate.get(), p.h, p.d, p.dp, TW_ORDER_ROW, p.type},
                  {s.gate, s.ldg, gate_type}, s.lt_workspace, s.lt_bytes);
        if (dense) {
            // dense mode (many active units per token, as measured by an earlier forward): the
            // inference's dense mode, and every row is saved as one the backward recomputes
            // (through cuBLAS: see ffn_backward)
            run_dense_mode(st, p, s, x, y);
            cuda::ffn_finish(stream(), p, s, true, 0, st.stats.get<cuda::FfnDeviceStats>(), nullptr);
            cuda::saved_all_rows_dense(stream(), p, saved);
        } else {
            cuda::ffn_pack(stream(), p, s, st.counts.get<unsigned long long>(), false, false);
            const int64_t cap = dense_path_capacity(st, p, s.up != nullptr);
            run_dense_path(st, p, s, x, y, cap, false);
            // sparse rows through the training kernels (they also write the saved g and u), the
            // dense path's rows past `cap` through ffn_sparse's gathered GEMMs
            cuda::ffn_rows_split(stream(), p, w, cuda::matrix_arg(x), cuda::matrix_arg(y), s);
            cuda::ffn_sparse(stream(), p, w, cuda::matrix_arg(x), cuda::matrix_arg(y), s, false, cap, false);
            cuda::ffn_finish(stream(), p, s, false, cap, st.stats.get<cuda::FfnDeviceStats>(), nullptr);
        }
        post_feedback(st);
    }
    size_t ffn_backward_workspace(const twFfnDescr &ffn, int64_t tokens) override {
        size_t bytes = 0;
        cuda::carve_train_scratch(nullptr, training_problem(ffn, tokens), &bytes);
        return bytes;
    }
    void ffn_backward(twFfnDescr &ffn, const twDnMatDescr &x, const void *saved, const twDnMatDescr &dy, float l1_coeff,
                      const twDnMatDescr &dx, const twDnMatDescr *dwg, const twDnMatDescr &dwu, const twDnMatDescr &dwd,
                      void *workspace) override {
        CudaFfnState &st = state_of(ffn);
        const cuda::FfnProblem p = training_problem(ffn, x.rows);
        const cuda::TrainScratch s = cuda::carve_train_scratch(workspace, p, nullptr);
        const cuda::FfnWeights w{st.gate.get(), st.pair.get(), p.gated ? 2 * p.dp : p.dp, st.down_t.get()};
        cuda::BackwardArgs b{};
        b.x = cuda::matrix_arg(x);
        b.dy = cuda::matrix_arg(dy);
        b.dx = cuda::matrix_arg(dx);
        if (dwg) b.dwg = cuda::matrix_arg(*dwg);
        b.dwu = cuda::matrix_arg(dwu);
        b.dwd = cuda::matrix_arg(dwd);
        b.l1_scale = p.m > 0 ? l1_coeff / static_cast<float>(p.m) : 0.0f;
        cuda::backward_sort_dense(stream(), p, saved, s);
        // the forward's dense-path rows are recomputed: the first `cap` of them through cuBLAS
        // (cap from the measured share, as in the forward), any beyond through device-count GEMMs
        if (!capturing()) absorb_feedback(st, p.h);
        // in dense mode every row is recomputed: all of them through cuBLAS
        const int64_t cap = st.dense_mode && !p.deterministic && s.xc ? p.m : dense_path_capacity(st, p, s.xc != nullptr);
        if (cap > 0) recompute_with_cublas(st, p, saved, b, s, cap);
        cuda::ffn_backward(stream(), p, w, saved, b, s, cap);
    }

  private:
    /// Dense mode: the up projection of every row, h and the statistics in one pass over the
    /// gate (ffn_pack), then the down projection (the gate GEMM ran before).
    void run_dense_mode(CudaFfnState &st, const cuda::FfnProblem &p, const cuda::FfnScratch &s, const twDnMatDescr &x,
                        const twDnMatDescr &y) {
        if (p.gated)
            gemm_.run(stream(), 1.0f, operand(x), {st.pair.get(), p.h, p.d, 2 * p.dp, TW_ORDER_ROW, p.type},
                      {s.up, s.ldg, p.type}, s.lt_workspace, s.lt_bytes);
        cuda::ffn_count_dense(stream(), p, s, st.counts.get<unsigned long long>());
        cuda::ffn_pack(stream(), p, s, nullptr, false, true);
        gemm_.run(stream(), 1.0f, {s.gate, p.m, p.h, s.ldg, TW_ORDER_ROW, p.type},
                  {st.down_t.get(), p.d, p.h, p.hp, TW_ORDER_ROW, p.type}, {y.values, y.ld, p.type}, s.lt_workspace,
                  s.lt_bytes);
    }

    /// The backward's recompute of the first `cap` rows of the (sorted) dense list with cuBLAS:
    /// z, u, dh; dz, du, h; dX rows; the weight-gradient terms (fp32, summed with the sparse
    /// terms before the one rounding of dW).
    void recompute_with_cublas(const CudaFfnState &st, const cuda::FfnProblem &p, const void *saved,
                               const cuda::BackwardArgs &b, const cuda::TrainScratch &s, int64_t cap) {
        const twDataType_t t = p.type;
        const int64_t ps = p.gated ? 2 * p.dp : p.dp;
        const void *down = static_cast<const char *>(st.pair.get()) + (p.gated ? p.dp * 2 : 0);
        auto gemm = [&](cuda::GemmOperand a, cuda::GemmOperand bb, cuda::GemmOutput z) {
            gemm_.run(stream(), 1.0f, a, bb, z, s.lt_workspace, s.lt_bytes);
        };
        cuda::backward_dense_gather(stream(), p, saved, b, s, cap);
        gemm({s.xc, cap, p.d, p.dp, TW_ORDER_ROW, t}, {st.gate.get(), p.h, p.d, p.dp, TW_ORDER_ROW, t}, {s.rz, p.hp, t});
        if (p.gated)
            gemm({s.xc, cap, p.d, p.dp, TW_ORDER_ROW, t}, {st.pair.get(), p.h, p.d, ps, TW_ORDER_ROW, t}, {s.ru, p.hp, t});
        gemm({s.dyc, cap, p.d, p.dp, TW_ORDER_ROW, t}, {down, p.h, p.d, ps, TW_ORDER_ROW, t}, {s.rh, p.hp, t});
        cuda::backward_dense_grads(stream(), p, s, cap, b.l1_scale);
        // dX = dZ Wg (+ dU Wu): the weights as column-major D x H views
        gemm({s.rz, cap, p.h, p.hp, TW_ORDER_ROW, t}, {st.gate.get(), p.d, p.h, p.dp, TW_ORDER_COL, t},
             {s.dxc, p.dp, TW_R_32F});
        if (p.gated)
            gemm({s.ru, cap, p.h, p.hp, TW_ORDER_ROW, t}, {st.pair.get(), p.d, p.h, ps, TW_ORDER_COL, t},
                 {s.dxc + cap * p.dp, p.dp, TW_R_32F});
        cuda::backward_dense_scatter(stream(), p, saved, b, s, cap);
        // weight-gradient terms: dZ^T Xc, dU^T Xc, H^T dYc (column-major views of the cap-row buffers)
        const int64_t plane = p.h * p.dp;
        gemm({s.rz, p.h, cap, p.hp, TW_ORDER_COL, t}, {s.xc, p.d, cap, p.dp, TW_ORDER_COL, t}, {s.dw_dense, p.dp, TW_R_32F});
        if (p.gated)
            gemm({s.ru, p.h, cap, p.hp, TW_ORDER_COL, t}, {s.xc, p.d, cap, p.dp, TW_ORDER_COL, t},
                 {s.dw_dense + plane, p.dp, TW_R_32F});
        gemm({s.rh, p.h, cap, p.hp, TW_ORDER_COL, t}, {s.dyc, p.d, cap, p.dp, TW_ORDER_COL, t},
             {s.dw_dense + 2 * plane, p.dp, TW_R_32F});
    }

    /// The cuBLAS part of the dense path: the first `cap` rows of the dense list (the rest go
    /// through the gathered kernels of ffn_sparse).
    void run_dense_path(const CudaFfnState &st, const cuda::FfnProblem &p, const cuda::FfnScratch &s,
                        const twDnMatDescr &x, const twDnMatDescr &y, int64_t cap, bool write_hidden) {
        if (cap <= 0) return;
        const cuda::MatrixArg xa = cuda::matrix_arg(x), ya = cuda::matrix_arg(y);
        if (p.gated) {
            cuda::ffn_dense_gather(stream(), p, xa, s, cap);
            gemm_.run(stream(), 1.0f, {s.xc, cap, p.d, p.dp, TW_ORDER_ROW, p.type},
                      {st.pair.get(), p.h, p.d, 2 * p.dp, TW_ORDER_ROW, p.type}, {s.up, s.ldg, p.type}, s.lt_workspace,
                      s.lt_bytes);
        }
        cuda::ffn_dense_rows_hidden(stream(), p, s, cap, write_hidden);
        gemm_.run(stream(), 1.0f, {s.up, cap, p.h, s.ldg, TW_ORDER_ROW, p.type},
                  {st.down_t.get(), p.d, p.h, p.hp, TW_ORDER_ROW, p.type}, {s.xc, p.dp, p.type}, s.lt_workspace,
                  s.lt_bytes);
        cuda::ffn_dense_scatter(stream(), p, ya, s, cap);
    }

    /// The training problem: token ids in the backward's sort are 32-bit slot numbers.
    static cuda::FfnProblem training_problem(const twFfnDescr &ffn, int64_t tokens) {
        const cuda::FfnProblem p = problem_of(ffn, tokens);
        if (tokens * int64_t{cuda::kSavedEll} >= (int64_t{1} << 31))
            fail(TW_STATUS_NOT_SUPPORTED, "CUDA training: up to %lld tokens per call; got %lld",
                 static_cast<long long>(((int64_t{1} << 31) - 1) / cuda::kSavedEll), static_cast<long long>(tokens));
        return p;
    }

    cudaStream_t stream() const { return static_cast<cudaStream_t>(*stream_slot_); }

    bool capturing() const {
        cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
        check(cudaStreamIsCapturing(stream(), &status), "cudaStreamIsCapturing");
        return status != cudaStreamCaptureStatusNone;
    }

    /// Dense mode when the last forward whose statistics have arrived had more active units per
    /// token than gathers beat tensor-core GEMMs at (about H / 128: 8 KB of gathered weights
    /// per unit at ~5 TB/s against 4 D H flops per token at ~700 TFLOP/s), or a quarter of its
    /// rows on the dense path. Deterministic mode never switches (bits would depend on history);
    /// fp32 intermediates have no cuBLAS form here, so they stay sparse too.
    bool choose_dense_mode(CudaFfnState &st, const cuda::FfnProblem &p, const twDnMatDescr &y,
                           const cuda::FfnScratch &s) {
        if (!capturing()) absorb_feedback(st, p.h);
        return st.dense_mode && !p.deterministic && s.up != nullptr && y.order == TW_ORDER_ROW &&
               y.ld % 8 == 0 && p.m > 0;
    }

    /// Rows of the dense path that go through cuBLAS: 1.25x the last measured share plus 64,
    /// rounded to 64 (0 when none overflowed, in deterministic mode, and for fp32 gates).
    static int64_t dense_path_capacity(const CudaFfnState &st, const cuda::FfnProblem &p, bool cublas_ok) {
        if (st.dense_row_fraction <= 0.0 || p.deterministic || !cublas_ok) return 0;
        const double want = 1.25 * st.dense_row_fraction * static_cast<double>(p.m) + 64.0;
        return std::min<int64_t>(p.m, (static_cast<int64_t>(want) + 63) / 64 * 64);
    }

    /// Takes the statistics of an earlier forward once they have arrived (never waits).
    static void absorb_feedback(CudaFfnState &st, int64_t hidden_dim) {
        if (!st.feedback_pending) return;
        const cudaError_t q = cudaEventQuery(st.feedback_ready);
        if (q == cudaErrorNotReady) return;
        check(q, "cudaEventQuery");
        const cuda::FfnDeviceStats f = *st.feedback.p;
        st.feedback_pending = false;
        const double mean = f.tokens ? static_cast<double>(f.total_nnz) / static_cast<double>(f.tokens) : 0.0;
        st.dense_mode =
            f.tokens > 0 && (mean > static_cast<double>(hidden_dim) / 128.0 || 4 * f.dense_rows > f.tokens);
        st.dense_row_fraction = f.tokens ? static_cast<double>(f.dense_rows) / static_cast<double>(f.tokens) : 0.0;
    }

    void post_feedback(CudaFfnState &st) {
        if (st.feedback_pending || capturing()) return;
        check(cudaMemcpyAsync(st.feedback.p, st.stats.get(), sizeof(cuda::FfnDeviceStats), cudaMemcpyDeviceToHost,
                              stream()),
              "cudaMemcpyAsync");
        check(cudaEventRecord(st.feedback_ready, stream()), "cudaEventRecord");
        st.feedback_pending = true;
    }

    static cuda::GemmOperand operand(const twDnMatDescr &d) { return {d.values, d.rows, d.cols, d.ld, d.order, d.type}; }

    struct GemmScratch {
        void *lt, *z;
        int32_t *flags;
        size_t total;
    };
    static GemmScratch gemm_scratch(const twDnMatDescr &a, const twDnMatDescr &b, const twSpMatDescr &c, void *ws) {
        cuda::WorkspaceCarver carve(ws);
        GemmScratch s{};
        s.lt = carve.take<char>(cuda::GemmRunner::kWorkspaceBytes);
        s.z = carve.take<float>(static_cast<size_t>(a.rows * std::max<int64_t>(1, round8(b.rows))));
        s.flags = carve.take<int32_t>(cuda::sparse_writer_workspace(c) / 4 + 1);
        s.total = carve.used();
        return s;
    }

    /// After a conversion: reads the record / backup count (this synchronises).
    twStatus_t capacity_status(const twSpMatDescr &out) {
        uint32_t needed = 0;
        const size_t at = out.format == TW_FORMAT_TWELL ? out.twell.overflow_offset_words() * 4 : out.hybrid.backup_count;
        check(cudaMemcpyAsync(&needed, static_cast<uint8_t *>(out.buffer) + at, 4, cudaMemcpyDeviceToHost, stream()),
              "cudaMemcpyAsync");
        check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
        const int64_t lost = out.format == TW_FORMAT_TWELL
                                 ? static_cast<int64_t>(needed)
                                 : std::max<int64_t>(0, static_cast<int32_t>(needed) - out.hybrid.backup_rows);
        if (lost > 0)
            fail(TW_STATUS_CAPACITY_EXCEEDED, "out: %lld rows do not fit the container (recorded in it; see twSpMatGetInfo)",
                 static_cast<long long>(lost));
        return TW_STATUS_SUCCESS;
    }

    void repack(const cuda::FfnProblem &p, CudaFfnState &st, const twDnMatDescr *wg, const twDnMatDescr &wu,
                const twDnMatDescr &wd) {
        const cuda::MatrixArg g = wg ? cuda::matrix_arg(*wg) : cuda::MatrixArg{};
        cuda::repack_weights(stream(), p, wg ? &g : nullptr, cuda::matrix_arg(wu), cuda::matrix_arg(wd), st.gate.get(),
                             st.pair.get(), st.down_t.get());
        check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");  // setup call: blocks
    }

    void *const *stream_slot_;
    std::unique_ptr<Backend> ref_;
    cuda::GemmRunner gemm_;
};

}  // namespace

bool cuda_backend_usable() { return device_major() >= 9; }

std::unique_ptr<Backend> make_cuda_backend(void *const *stream_slot) {
    const int major = device_major();
    if (major < 0) fail(TW_STATUS_NOT_SUPPORTED, "backend: no usable GPU found by the CUDA runtime");
    if (major < 9)
        fail(TW_STATUS_ARCH_MISMATCH, "backend: the CUDA backend is built for sm_90a (Hopper); this GPU is sm_%d", major * 10);
    return std::make_unique<CudaBackend>(stream_slot);
}

}  // namespace twblas
