// The forward of the fused FFN, inference and training: the plan (plan/forward_plan.hpp) chooses
// the path from the problem, the FFN's attributes and tuning and the last forward's statistics;
// this file puts the path's launchers (launch/) in sequence. The sparse paths run:
//   gate       cuBLAS's gate GEMM and the packing pass (or the masked gate GEMM and the lists from
//              its unit words): each token's active units, the rows for the dense path;
//   dense path rows with too many active units, exact for any sparsity, on a branch of the FFN's
//              own beside the sparse rows;
//   sparse     the other rows through the fused kernel or the two-pass kernels;
//   finish     statistics reduced in a fixed order, published for the next plan, and the
//              optional hidden output.
// The serving and decode paths do gate, unit choice and projections in their own kernels; dense
// mode runs the projections as cuBLAS GEMMs. Nothing here allocates or synchronises.
#include "ffn_forward.hpp"

#include "common/check.hpp"
#include "common/dispatch.hpp"
#include "common/matrix_arg.hpp"
#include "common/pointer_check.hpp"
#include "gemm/masked_gate_gemm.hpp"
#include "kernels/saved_state.cuh"
#include "launch/launch.hpp"
#include "sparse_ops.hpp"

namespace twblas::cuda {

namespace {

/// The plan's view of a call.
PlanInput plan_input(const CudaFfnState &st, const twFfnDescr &ffn, const FfnProblem &p, const twDnMatDescr &x,
                     const twDnMatDescr &y, bool training, bool writes_hidden) {
    PlanInput in = problem_plan_input(ffn, p, training);
    in.writes_hidden = writes_hidden;
    in.x_rows_16b = rows_aligned16(matrix_arg(x));
    in.x_row_major = x.order == TW_ORDER_ROW;
    in.y_row_major_ld8 = y.order == TW_ORDER_ROW && y.ld % 8 == 0;
    // X and the weights decide; the workspace carver puts the gate on 16 bytes
    const FfnWeights w = st.weights(p);
    in.masked_gate_fits =
        st.masked_gate && in.x_row_major && !p.gate_f32() && p.m > 0 &&
        masked_gate_gemm_fits(p.type, {x.values, x.ld, w.gate, w.gate_ld, p.m, p.h, p.d, nullptr, p.hp, nullptr,
                                       (p.h + 31) / 32});
    in.sm_count = st.sm_count;
    return in;
}

// ---- the sequences

/// The gate, the unit lists, the sparse rows and the dense path's rows (inference and training
/// alike). The dense path needs the dense list, which exists after the lists' maker (or after
/// fwd_u, plan.lists_in_fwd_u); it writes only its own rows of h and Y, so it runs on the FFN's
/// branch beside the sparse kernels (its launches cost microseconds in line even when the list is
/// empty) and is joined before the statistics, which read its rows' h.
void enqueue_gate_and_rows(cudaStream_t stream, const FfnCall &c, bool write_hidden) {
    const ForwardPlan &plan = c.plan;
    run_gate_and_lists(stream, c, write_hidden);
    auto dense_path_beside = [&] { enqueue_dense_path(c.st.branch.fork(stream), c, write_hidden); };
    if (!plan.lists_in_fwd_u) dense_path_beside();
    if (plan.path == FfnPath::TwoPass) {
        const MaskListArgs lists = mask_list_args(c.p, c.s, c.st.neuron_counts());
        launch_two_pass(stream, c, plan.lists_in_fwd_u ? &lists : nullptr, [&] {
            if (plan.lists_in_fwd_u) dense_path_beside();
        });
    } else {
        launch_fused(stream, c, write_hidden);
    }
    c.st.branch.join(stream);
}

void enqueue_inference(cudaStream_t stream, const FfnCall &c, const twSpMatDescr *hidden) {
    const FfnProblem &p = c.p;
    const FfnScratch &s = c.s;
    switch (c.plan.path) {
    case FfnPath::Serve:
        launch_serve(stream, c, hidden != nullptr);
        if (hidden) {  // h over the gate buffer, 0 for inactive units (serve_gate wrote them)
            const MatrixArg h{s.gate, p.m, p.h, s.ldg, 1, p.type};
            write_sparse(stream, h, TW_CONVERT_PLAIN, *hidden, s.writer_flags);
        }
        return;
    case FfnPath::Decode:
        launch_decode(stream, c, hidden != nullptr);
        launch_finish(stream, c, false, 0, hidden);
        return;
    case FfnPath::DenseMode:  // h over u in the workspace
        run_dense_mode(stream, c, {s.gate, s.up, s.up});
        write_hidden_output(stream, p, s, hidden, {}, s.up);
        return;
    case FfnPath::Fused:
    case FfnPath::TwoPass:
        enqueue_gate_and_rows(stream, c, hidden != nullptr);
        launch_finish(stream, c, true, c.plan.cublas_rows, hidden,
                      c.plan.masked_gate ? ActiveMask{s.unit_masks, s.unit_words} : ActiveMask{});
        return;
    }
}

/// The training forward: the saved state holds the lists, counts and g / u of the sparse rows;
/// the rows of the dense path keep only their id (the backward recomputes them).
void enqueue_training(cudaStream_t stream, CudaFfnState &st, const FfnProblem &p, const ForwardPlan &plan,
                      const twDnMatDescr &x, const twDnMatDescr &y, void *saved, void *workspace) {
    FfnScratch s = carve_ffn_scratch(workspace, p, nullptr);
    point_scratch_into_saved(p, saved, s);
    const SavedLayout l = saved_layout(p);
    SavedHeader *const header = reinterpret_cast<SavedHeader *>(static_cast<char *>(saved) + l.header);
    const bool dense_mode = plan.path == FfnPath::DenseMode;
    if (!dense_mode || p.m == 0) {  // dense mode writes it beside its down GEMM
        write_header<<<1, 1, 0, stream>>>(saved_header(p), header);
        check_launch("write_header");
    }
    // what the backward of this saved state follows (recorded now: a failure below leaves no
    // state to differentiate anyway)
    st.train_forwards.remember(saved, p.m, {dense_mode, dense_mode && p.save_dense});
    if (p.m == 0) {  // the saved state of no tokens: a header and an empty dense list
        check(cudaMemsetAsync(s.header, 0, 2 * sizeof(uint32_t), stream), "cudaMemsetAsync");
        return;
    }
    const FfnCall c{st, p, plan, x, y, s, st.weights(p), matrix_arg(x), matrix_arg(y)};
    if (dense_mode) {
        // every row is saved as one the backward recomputes (through cuBLAS: see ffn_backward);
        // with save_dense z and u stay in the saved state too, and the backward reads them
        // instead when it knows this forward wrote them (st.train_forwards)
        char *const sb = static_cast<char *>(saved);
        const DenseModeBuffers b = p.save_dense ? DenseModeBuffers{sb + l.dense_z, p.gated ? sb + l.dense_u : nullptr, s.gate}
                                                : DenseModeBuffers{s.gate, s.up, s.up};
        run_dense_mode(stream, c, b, [&](cudaStream_t side) {
            write_dense_mode_state<<<std::max(1, std::min(1024, ceil_div(p.m, 256))), 256, 0, side>>>(
                saved_header(p), header, s.count, s.dense_rows, s.dense_count, p.m);
            check_launch("write_dense_mode_state");
        });
        return;
    }
    enqueue_gate_and_rows(stream, c, false);  // the two-pass kernels (the plan's path in training)
    launch_finish(stream, c, true, plan.cublas_rows, nullptr);
}

/// Everything the inference forward's enqueued work depends on.
CallKey inference_key(const FfnProblem &p, const ForwardPlan &plan, const FfnWeights &w, const twDnMatDescr &x,
                      const twDnMatDescr &y, const twSpMatDescr *hidden, const void *workspace) {
    CallKey k;
    k.add(p.m).add(p.highest).add(p.fp8).add(p.deterministic).add(p.tile).add(p.slots);
    // the whole plan: the tuning may change any of its values between calls
    k.add(static_cast<int>(plan.path)).add(plan.masked_gate).add(plan.masked_gate_tile_n).add(plan.lists_in_fwd_u);
    k.add(plan.cublas_rows).add(static_cast<int>(plan.dense_stats)).add(plan.down_gemm_sms).add(plan.hidden_blocks);
    const ServePlan &sp = plan.serve;
    k.add(sp.own_gate).add(sp.gate_rows).add(sp.stats_kernel).add(sp.token_warps).add(sp.token_splits).add(sp.down_groups);
    for (const twDnMatDescr *d : {&x, &y}) k.add(d->values).add(d->ld).add(d->order);
    k.add(workspace).add(hidden);
    // the weights' addresses (twFfnUpdateWeights may point the FFN elsewhere)
    k.add(w.gate).add(w.gate_ld).add(w.up).add(w.up_ld).add(w.down).add(w.down_ld);
    if (hidden) {
        k.add(hidden->buffer).add(hidden->format).add(hidden->type).add(hidden->rows).add(hidden->cols);
        k.add(hidden->twell.tile_width).add(hidden->twell.compression);
        k.add(hidden->hybrid.ell_width).add(hidden->hybrid.backup_rows);
    }
    return k;
}

}  // namespace

void ffn_forward(cudaStream_t stream, const twFfnDescr &ffn, const twDnMatDescr &x, const twDnMatDescr &y,
                 const twSpMatDescr *hidden, void *workspace) {
    CudaFfnState &st = state_of(ffn);
    const FfnProblem p = problem_of(ffn, x.rows);
    std::lock_guard<std::mutex> lock(st.mutex);
    absorb_feedback(st);
    if (p.fp8 && !st.fp8_q.get()) fail(TW_STATUS_INTERNAL_ERROR, "FP8 forward without the FP8 copy's memory");
    // first: a pinned algorithm that cannot run this call throws before anything is enqueued
    const ForwardPlan plan =
        plan_forward(plan_input(st, ffn, p, x, y, false, hidden != nullptr), st.feedback_seen, st.tuning);
    if (p.fp8 && st.fp8_stale) {
        // outside the captured call: a graph replays the forward, not the quantization (a
        // caller's own capture records it once, and its replays quantize again: still exact)
        quantize_fp8_weights(stream, st, p);
        st.fp8_stale = false;
    }
    const CallKey key = inference_key(p, plan, st.weights(p), x, y, hidden, workspace);
    if (!st.calls.seen(key)) {  // once per argument set: a replayed call's pointers were checked
        require_device_accessible(x.values, "X");
        require_device_accessible(y.values, "Y");
        require_apart_from_weights(st, byte_range(y), "Y");
        if (hidden) require_device_accessible(hidden->buffer, "hidden");
        if (hidden) require_apart_from_weights(st, byte_range(*hidden), "hidden");
        require_device_accessible(workspace, "workspace");
    }
    st.calls.run(stream, key, ffn.call_graphs != 0, [&](cudaStream_t s) {
        const FfnScratch scratch = carve_ffn_scratch(workspace, p, nullptr);
        enqueue_inference(s, {st, p, plan, x, y, scratch, st.weights(p), matrix_arg(x), matrix_arg(y)}, hidden);
    });
}

namespace {
/// The last forward's l1 as twFfnGetStats computes it, rounded to float.
__global__ void forward_l1_kernel(const FfnStatsBlock *block, float *dst) {
    const FfnDeviceStats &s = block->last;
    *dst = s.tokens ? static_cast<float>(s.l1_sum / static_cast<double>(s.tokens)) : 0.0f;
}
}  // namespace

void write_forward_l1(cudaStream_t stream, const twFfnDescr &ffn, float *dst) {
    // an ordinary launch: it starts after the forward's last kernel has finished, statistics included
    forward_l1_kernel<<<1, 1, 0, stream>>>(state_of(ffn).stats_block(), dst);
    check_launch("forward_l1_kernel");
}

void ffn_forward_train(cudaStream_t stream, const twFfnDescr &ffn, const twDnMatDescr &x, const twDnMatDescr &y,
                       void *saved, void *workspace) {
    CudaFfnState &st = state_of(ffn);
    std::lock_guard<std::mutex> lock(st.mutex);
    const FfnProblem p = training_forward_problem(ffn, st, x.rows);
    st.train_pointers.require(x.values, "X");
    st.train_pointers.require(y.values, "Y");
    st.train_pointers.require(saved, "saved");
    st.train_pointers.require(workspace, "workspace");
    require_apart_from_weights(st, byte_range(y), "Y");
    absorb_feedback(st);
    const ForwardPlan plan = plan_forward(plan_input(st, ffn, p, x, y, true, false), st.feedback_seen, st.tuning);
    enqueue_training(stream, st, p, plan, x, y, saved, workspace);
}

}  // namespace twblas::cuda
