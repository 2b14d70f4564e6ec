// The training benchmarks: twSpGEMMFusedForwardTrain + twSpGEMMFusedBackward against the dense
// cuBLAS training step, gradients verified against it before timing.
#include <algorithm>

#include "common.hpp"

namespace twbench {

namespace {

constexpr float kL1Coeff = 1e-3f;

size_t bf16_bytes(int64_t count) { return static_cast<size_t>(count) * 2; }

/// Gradient buffers (bf16, row-major): dX (M x D), [dWg; dWu] (2H x D), dWd (H x D).
struct TrainGrads {
    DeviceMemory dx, dwgu, dwd;
    TrainGrads(int64_t m, Shape s)
        : dx(bf16_bytes(m * s.d)), dwgu(bf16_bytes(2 * s.h * s.d)), dwd(bf16_bytes(s.h * s.d)) {}
    tt::DenseFfnGrads pointers() const { return {dx.get(), dwgu.get(), dwd.get()}; }
};

/// dL/dY of the training benchmarks (bf16, max_m x D, seeded), made once per problem.
const DeviceMemory &train_dy(Problem &p) {
    if (!p.train_dy) {
        std::vector<float> v(static_cast<size_t>(p.max_m * p.shape.d));
        uint64_t state = 0x9e3779b97f4a7c15ull;
        for (float &f : v) {  // uniform in [-1, 1): xorshift, reproducible everywhere
            state ^= state << 13, state ^= state >> 7, state ^= state << 17;
            f = static_cast<float>(static_cast<double>(state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
        }
        p.train_dy = std::make_unique<DeviceMemory>(tt::to_bf16(v));
    }
    return *p.train_dy;
}

/// The dense training step a user writes today (tt::DenseFfn::train_step: nine GEMMs' worth).
struct DenseTrain {
    tt::DenseFfn dense;
    DeviceMemory y;
    TrainGrads grads;
    DenseTrain(int64_t m, Shape s)
        : dense(tt::DenseFfnShape{s.d, s.h, m, /*gated=*/true, /*training=*/true}),
          y(bf16_bytes(m * s.d)),
          grads(m, s) {}
    void step(Problem &p, int i, int64_t m, const DeviceMemory &dy) {
        dense.train_step(env.stream, p.x[i]->get(), p.weights(i), dy.get(), m, kL1Coeff, y.get(), grads.pointers());
    }
};

/// twblas's training step on one instance: twSpGEMMFusedForwardTrain + twSpGEMMFusedBackward.
struct TwTrain {
    twDnMatDescr_t x[kInstances]{}, y = nullptr, dy = nullptr, dx = nullptr, dwg = nullptr, dwu = nullptr,
                                    dwd = nullptr;
    std::unique_ptr<DeviceMemory> ybuf, saved, wsf, wsb;
    TrainGrads grads;
    size_t saved_bytes = 0;
    TwTrain(Problem &p, int64_t m, const DeviceMemory &dyb) : grads(m, p.shape) {
        const Shape s = p.shape;
        ybuf = std::make_unique<DeviceMemory>(bf16_bytes(m * s.d));
        for (int i = 0; i < kInstances; ++i)
            ck(twCreateDnMat(&x[i], m, s.d, s.d, p.x[i]->get(), TW_R_16BF, TW_ORDER_ROW), nullptr, "X");
        ck(twCreateDnMat(&y, m, s.d, s.d, ybuf->get(), TW_R_16BF, TW_ORDER_ROW), nullptr, "Y");
        ck(twCreateDnMat(&dy, m, s.d, s.d, dyb.get(), TW_R_16BF, TW_ORDER_ROW), nullptr, "dY");
        ck(twCreateDnMat(&dx, m, s.d, s.d, grads.dx.get(), TW_R_16BF, TW_ORDER_ROW), nullptr, "dX");
        ck(twCreateDnMat(&dwg, s.h, s.d, s.d, grads.dwgu.get(), TW_R_16BF, TW_ORDER_ROW), nullptr, "dWg");
        ck(twCreateDnMat(&dwu, s.h, s.d, s.d, grads.dwgu.get<uint16_t>() + s.h * s.d, TW_R_16BF, TW_ORDER_ROW), nullptr,
           "dWu");
        ck(twCreateDnMat(&dwd, s.h, s.d, s.d, grads.dwd.get(), TW_R_16BF, TW_ORDER_ROW), nullptr, "dWd");
        size_t fw = 0, bw = 0;
        ck(twSpGEMMFusedSaved_bufferSize(p.handle, p.ffn[0], m, &saved_bytes), p.handle, "saved size");
        ck(twSpGEMMFused_bufferSize(p.handle, p.ffn[0], x[0], y, &fw), p.handle, "forward size");
        ck(twSpGEMMFusedBackward_bufferSize(p.handle, p.ffn[0], m, &bw), p.handle, "backward size");
        saved = std::make_unique<DeviceMemory>(saved_bytes);
        wsf = std::make_unique<DeviceMemory>(fw);
        wsb = std::make_unique<DeviceMemory>(bw);
    }
    ~TwTrain() {
        for (auto &d : x) twDestroyDnMat(d);
        for (twDnMatDescr_t d : {y, dy, dx, dwg, dwu, dwd}) twDestroyDnMat(d);
    }
    TwTrain(const TwTrain &) = delete;
    TwTrain &operator=(const TwTrain &) = delete;
    /// Sizes the saved state again, as a framework that allocates it per step does: with the
    /// default TW_SAVE_DENSE_AUTO the size follows the FFNs' statistics (room for z and u when
    /// the next step runs in dense mode). Each instance's FFN is asked: each remembers its answer.
    void resize_saved(Problem &p, int64_t m) {
        size_t bytes = 0;
        for (int i = 0; i < kInstances; ++i) {
            size_t b = 0;
            ck(twSpGEMMFusedSaved_bufferSize(p.handle, p.ffn[i], m, &b), p.handle, "saved size");
            bytes = std::max(bytes, b);
        }
        if (bytes != saved_bytes) {
            saved_bytes = bytes;
            saved = std::make_unique<DeviceMemory>(saved_bytes);
        }
    }
    void step(Problem &p, int i) {
        ck(twSpGEMMFusedForwardTrain(p.handle, p.ffn[i], x[i], y, saved->get(), wsf->get()), p.handle, "ForwardTrain");
        ck(twSpGEMMFusedBackward(p.handle, p.ffn[i], x[i], saved->get(), dy, kL1Coeff, dx, dwg, dwu, dwd, wsb->get()),
           p.handle, "Backward");
    }
};

/// Sets TW_FFN_ATTR_SAVE_DENSE on every instance's FFN for one benchmark's life (the problem is
/// shared with the other benchmarks, which get the default back).
struct SaveDense {
    Problem &p;
    SaveDense(Problem &problem, int32_t value) : p(problem) { set(value); }
    ~SaveDense() { set(TW_SAVE_DENSE_AUTO); }
    void set(int32_t v) {
        for (int i = 0; i < kInstances; ++i)
            ck(twFfnSetAttribute(p.ffn[i], TW_FFN_ATTR_SAVE_DENSE, &v, sizeof v), p.handle, "SAVE_DENSE");
    }
};

/// Settles the forward's path (it follows an earlier forward's statistics: one step per instance),
/// then checks every gradient against the dense training step on the same data; the counters
/// record the errors, a larger one fails the benchmark. Returns instance 0's statistics.
twFfnStats_t settle_and_verify(benchmark::State &state, Problem &p, TwTrain &tw, int64_t m, const DeviceMemory &dy) {
    const Shape s = p.shape;
    for (int i = 0; i < kInstances; ++i) {
        tw.step(p, i);
        twFfnStats_t si{};
        ck(twFfnGetStats(p.handle, p.ffn[i], &si), p.handle, "stats");
    }
    tw.resize_saved(p, m);
    tw.step(p, 0);
    twFfnStats_t st{};
    ck(twFfnGetStats(p.handle, p.ffn[0], &st), p.handle, "stats");
    DenseTrain ref(m, s);
    ref.step(p, 0, m, dy);
    const size_t nx = static_cast<size_t>(m * s.d), nw = static_cast<size_t>(s.h * s.d);
    const double ex = rel_error(download(tw.grads.dx.get(), nx), download(ref.grads.dx.get(), nx));
    const double ew = rel_error(download(tw.grads.dwgu.get(), 2 * nw), download(ref.grads.dwgu.get(), 2 * nw));
    const double ed = rel_error(download(tw.grads.dwd.get(), nw), download(ref.grads.dwd.get(), nw));
    state.counters["rel_err_dx"] = ex;
    state.counters["rel_err_dwgu"] = ew;
    state.counters["rel_err_dwd"] = ed;
    const double worst = std::max({ex, ew, ed});
    if (!(worst < 3e-2))
        state.SkipWithError(
            ("twblas gradients differ from the dense step: rel. error " + std::to_string(worst)).c_str());
    state.counters["mean_nnz"] = st.meanRowNnz;
    state.counters["overflow_rows"] = static_cast<double>(st.overflowRows);
    return st;
}

void bm_train_twblas(benchmark::State &state, Shape s, std::string profile, int64_t max_m, int64_t m, bool save_dense) {
    auto p = problem(s, profile, max_m);
    const DeviceMemory &dy = train_dy(*p);
    const SaveDense attribute(*p, save_dense ? TW_SAVE_DENSE_ALWAYS : TW_SAVE_DENSE_AUTO);
    TwTrain tw(*p, m, dy);
    settle_and_verify(state, *p, tw, m, dy);
    auto execs = capture([&](int i) { tw.step(*p, i); });
    time_graphs(state, 1, execs);
    add_problem_counters(state, *p, m);
    state.counters["saved_bytes"] = static_cast<double>(tw.saved_bytes);
    const double dense_h = static_cast<double>(m) * static_cast<double>(s.h) * 2.0;
    state.counters["dense_h_bytes"] = dense_h;
    state.counters["saved_over_dense_h"] = static_cast<double>(tw.saved_bytes) / dense_h;
}

/// The same step called as a training framework calls it: no graph, each call enqueued from the
/// host (time_eager: GPU time between events, host time per call as the host_us counter). Where
/// the tokens are few, as in a small model's layer, the host's part can set the step's pace.
void bm_train_twblas_eager(benchmark::State &state, Shape s, std::string profile, int64_t max_m, int64_t m) {
    auto p = problem(s, profile, max_m);
    const DeviceMemory &dy = train_dy(*p);
    TwTrain tw(*p, m, dy);
    settle_and_verify(state, *p, tw, m, dy);
    time_eager(state, 1, [&](int run) { tw.step(*p, run % kInstances); });
    add_problem_counters(state, *p, m);
}

void bm_train_twblas_default(benchmark::State &state, Shape s, std::string profile, int64_t max_m, int64_t m) {
    bm_train_twblas(state, s, std::move(profile), max_m, m, false);
}
void bm_train_twblas_save_dense(benchmark::State &state, Shape s, std::string profile, int64_t max_m, int64_t m) {
    bm_train_twblas(state, s, std::move(profile), max_m, m, true);
}

/// The dense training step called eagerly (host_us as for twblas).
void bm_train_dense_eager(benchmark::State &state, Shape s, std::string profile, int64_t max_m, int64_t m) {
    auto p = problem(s, profile, max_m);
    const DeviceMemory &dy = train_dy(*p);
    DenseTrain b(m, s);
    time_eager(state, 1, [&](int run) { b.step(*p, run % kInstances, m, dy); });
    add_problem_counters(state, *p, m);
}

void bm_train_dense(benchmark::State &state, Shape s, std::string profile, int64_t max_m, int64_t m) {
    auto p = problem(s, profile, max_m);
    const DeviceMemory &dy = train_dy(*p);
    DenseTrain b(m, s);
    auto execs = capture([&](int i) { b.step(*p, i, m, dy); });
    time_graphs(state, 1, execs);
    add_problem_counters(state, *p, m);
    // what the dense step keeps for the backward: [g | u] and h
    state.counters["saved_bytes"] = static_cast<double>(m) * static_cast<double>(s.h) * 2.0 * 3.0;
}

}  // namespace

void register_train(Shape s, const std::string &profile, const std::vector<int64_t> &ms, bool save_dense) {
    const int64_t max_m = *std::max_element(ms.begin(), ms.end());
    for (int64_t m : ms) {
        add(bench_name("train_twblas", s, profile, m), bm_train_twblas_default, s, profile, max_m, m, 1);
        // TW_FFN_ATTR_SAVE_DENSE: what the dense-mode step gains from keeping z and u
        if (save_dense)
            add(bench_name("train_twblas_save_dense", s, profile, m), bm_train_twblas_save_dense, s, profile, max_m, m, 1);
        add(bench_name("train_dense", s, profile, m), bm_train_dense, s, profile, max_m, m, 1);
    }
}

void register_train_eager(Shape s, const std::string &profile, const std::vector<int64_t> &ms) {
    const int64_t max_m = *std::max_element(ms.begin(), ms.end());
    for (int64_t m : ms) {
        add(bench_name("train_twblas", s, profile, m), bm_train_twblas_default, s, profile, max_m, m, 1);
        add(bench_name("train_twblas_eager", s, profile, m), bm_train_twblas_eager, s, profile, max_m, m, 1);
        add(bench_name("train_dense", s, profile, m), bm_train_dense, s, profile, max_m, m, 1);
        add(bench_name("train_dense_eager", s, profile, m), bm_train_dense_eager, s, profile, max_m, m, 1);
    }
}

}  // namespace twbench
