// The training path (twSpGEMMFusedForwardTrain + twSpGEMMFusedBackward) as the shared cases
// (test_ffn_backward.cpp) and the CUDA-only ones (test_cuda_training.cpp) run it: a case, one
// step (or several) on a backend with every output read back, and the oracle that a step must
// match: the naive fp64 forward and gradients in the CPU programs, the CPU reference on the same
// data in the CUDA programs (the CPU programs check that reference against the naive math with
// these same cases).
#pragma once

#include <functional>
#include <limits>
#include <sstream>
#include <string>

#include "backend_support.hpp"
#include "testing/problem.hpp"

namespace twtest {

struct TrainCase {
    int64_t m = 130, d = 64, h = 600;
    bool gated = true;
    twDataType_t type = TW_R_16BF;
    twComputeMode_t mode = TW_COMPUTE_DEFAULT;
    twOrder_t wd_order = TW_ORDER_ROW, x_order = TW_ORDER_ROW, grad_order = TW_ORDER_ROW;
    WeightLayout wg_layout, wu_layout, wd_layout;  // default: packed rows, aligned
    twblas::testing::Profile profile = twblas::testing::Profile::Uniform;
    double k = 29;
    bool integers = false;  // small integers: every sum exact, results bit-identical
    int heavy_every = 0;    // integers: every n-th token fires most units (recomputed rows)
    int32_t deterministic = 0;
    int32_t save_dense = TW_SAVE_DENSE_AUTO;  // TW_FFN_ATTR_SAVE_DENSE (the default)
    float l1 = 0.5f;
    uint64_t seed = 11;
    bool stacked = false;  // gated: [Wg; Wu] one 2H x D matrix, and [dWg; dWu] (row-major) likewise
};

inline std::string describe(const TrainCase &c) {
    std::ostringstream os;
    os << "M " << c.m << " D " << c.d << " H " << c.h << (c.gated ? " gated" : " plain") << " type " << c.type
       << " mode " << c.mode << " profile " << twblas::testing::profile_name(c.profile)
       << (c.integers ? " integers" : "") << " Wd " << (c.wd_order == TW_ORDER_ROW ? "row" : "col")
       << (c.stacked ? " stacked [Wg; Wu]" : "");
    for (const WeightLayout *l : {&c.wg_layout, &c.wu_layout, &c.wd_layout})
        if (l->pad || l->offset) os << " weight pad " << l->pad << " offset " << l->offset;
    return os.str();
}

struct TrainData {
    std::vector<float> x, wg, wu, wd, dy;
};

/// Small-integer data whose gate fires for a few percent of the units: column 0 of X is 1 and
/// column 0 of the gate weights a negative integer bias; tokens with X[t][0] = -1 fire most units.
inline TrainData integer_data(const TrainCase &c) {
    TrainData data;
    std::mt19937_64 rng(c.seed);
    std::uniform_int_distribution<int> small(-1, 1), bias(6, 14);
    auto fill = [&](std::vector<float> &v, int64_t rows) {
        v.resize(static_cast<size_t>(rows * c.d));
        for (float &f : v) f = static_cast<float>(small(rng));
    };
    fill(data.x, c.m);
    fill(data.wg, c.h);
    fill(data.wu, c.h);
    fill(data.wd, c.h);
    fill(data.dy, c.m);
    std::vector<float> &ws = c.gated ? data.wg : data.wu;
    for (int64_t t = 0; t < c.m; ++t)
        data.x[static_cast<size_t>(t * c.d)] = c.heavy_every && t % c.heavy_every == c.heavy_every - 1 ? -1.0f : 1.0f;
    for (int64_t j = 0; j < c.h; ++j) ws[static_cast<size_t>(j * c.d)] = -static_cast<float>(bias(rng));
    if (!c.gated) data.wg.clear();
    return data;
}

inline twblas::testing::ProblemSpec problem_spec(const TrainCase &c) {
    twblas::testing::ProblemSpec spec;
    spec.tokens = c.m;
    spec.model_dim = c.d;
    spec.hidden_dim = c.h;
    spec.profile = c.profile;
    spec.active_units = c.k;
    spec.gated = c.gated;
    spec.seed = c.seed;
    spec.heavy_fraction = 0.03;
    return spec;
}

inline TrainData make_data(const TrainCase &c) {
    if (c.integers) return integer_data(c);
    const twblas::testing::FfnProblem p = twblas::testing::make_ffn_problem(problem_spec(c));
    return {p.x, p.w_gate, p.w_up, p.w_down, random_normal(static_cast<size_t>(c.m * c.d), c.seed + 99)};
}

struct TrainResult {
    std::vector<double> y, dx, dwg, dwu, dwd;
    std::vector<uint32_t> bits;  // y, dx, dwg, dwu, dwd
    twFfnStats_t stats{};
    float l1_output = 0.0f;  // TrainRun::l1_pointers: what the last forward wrote there
    int64_t weight_copy_bytes = -1;  // TW_FFN_ATTR_WEIGHT_COPY_BYTES after the run
    size_t saved_bytes_before = 0, saved_bytes = 0;  // the saved state's size before the warm step, and the steps'
};

inline void append_bits(std::vector<uint32_t> &bits, const Dense &m) {
    for (int64_t r = 0; r < m.rows; ++r)
        for (int64_t c = 0; c < m.cols; ++c) bits.push_back(m.bits(r, c));
}

/// How run_train runs: `repeats` steps (a forward with saved state and a backward), run some
/// other way by `replay` when given (the CUDA programs: captured into a CUDA graph and
/// replayed); before them a first step on `warm_x`, then its statistics (blocking), which steer
/// the paths of the steps on the case's X: the share of rows on the dense path sets how many of
/// them go through cuBLAS.
struct TrainRun {
    using Step = std::function<twStatus_t()>;
    int repeats = 1;
    const std::vector<float> *warm_x = nullptr;
    std::function<void(twHandle_t, int, const Step &)> replay;
    bool move_saved = false;  // the backward reads a copy of the saved state at another address
    // the l1 through TW_FFN_ATTR_L1_OUTPUT and l1Coeff through TW_FFN_ATTR_L1_COEFF_POINTER (the
    // backward's l1Coeff argument is then NaN: it must not be read)
    bool l1_pointers = false;
    // called between each step's forward and backward with the saved state and its size
    std::function<void(Buffers &, void *, size_t)> between;
    // between each step's forward and backward, a forward of X = 0 (no active unit) into a saved
    // state of its own, and its statistics read: the FFN is then told to leave dense mode before
    // the step's backward runs
    bool sparse_forward_between = false;
    // the steps' saved state sized again after the warm step, as a framework sizing it per step
    // does (TW_SAVE_DENSE_AUTO's room follows the statistics)
    bool size_after_warm = false;

    TrainRun &sized_after_warm() {
        size_after_warm = true;
        return *this;
    }
    TrainRun &saved_moved() {
        move_saved = true;
        return *this;
    }

    TrainRun &with_l1_pointers() {
        l1_pointers = true;
        return *this;
    }
    TrainRun &times(int n) {
        repeats = n;
        return *this;
    }
    TrainRun &warmed_with(const std::vector<float> *x) {
        warm_x = x;
        return *this;
    }
    TrainRun &replayed(std::function<void(twHandle_t, int, const Step &)> r) {
        replay = std::move(r);
        return *this;
    }
};

/// Training steps of the case on `backend`, every output read back.
inline TrainResult run_train(const TrainCase &c, const TrainData &data, twBackend_t backend,
                             const TrainRun &run = TrainRun()) {
    Handle h(backend);
    Buffers buf(backend);
    Dense x(c.m, c.d, c.type, c.x_order), y(c.m, c.d, c.type), dy(c.m, c.d, c.type), dx(c.m, c.d, c.type);
    const std::unique_ptr<Dense> wu = weight_matrix(c.h, c.d, c.type, TW_ORDER_ROW, c.wu_layout, data.wu),
                                 wd = weight_matrix(c.h, c.d, c.type, c.wd_order, c.wd_layout, data.wd);
    Dense dwu(c.h, c.d, c.type, c.grad_order), dwd(c.h, c.d, c.type, c.grad_order);
    std::unique_ptr<Dense> wg, dwg, xw;
    x.fill(data.x);
    dy.fill(data.dy);
    if (c.gated) {
        wg = weight_matrix(c.h, c.d, c.type, TW_ORDER_ROW, c.wg_layout, data.wg);
        dwg = std::make_unique<Dense>(c.h, c.d, c.type, c.grad_order);
        dwg->poison();
    }
    for (Dense *o : {&y, &dx, &dwu, &dwd}) o->poison();
    const twDnMatDescr_t X = buf.input(x), DY = buf.input(dy), WD = buf.input_at(*wd, c.wd_layout.offset);
    twDnMatDescr_t WU = buf.input_at(*wu, c.wu_layout.offset), WG = wg ? buf.input_at(*wg, c.wg_layout.offset) : nullptr;
    twDnMatDescr_t Y = buf.output(y), DX = buf.output(dx), DWU = buf.output(dwu), DWD = buf.output(dwd),
                   DWG = dwg ? buf.output(*dwg) : nullptr;
    // stacked: the FFN's Wg and Wu (and the gradients dWg, dWu) are the halves of one matrix
    std::unique_ptr<Dense> wgu, dwgu;
    if (c.gated && c.stacked) {
        REQUIRE(c.grad_order == TW_ORDER_ROW);
        wgu = std::make_unique<Dense>(2 * c.h, c.d, c.type, TW_ORDER_ROW);
        std::vector<float> both = data.wg;
        both.insert(both.end(), data.wu.begin(), data.wu.end());
        wgu->fill(both);
        dwgu = std::make_unique<Dense>(2 * c.h, c.d, c.type, TW_ORDER_ROW);
        dwgu->poison();
        const twDnMatDescr_t WGU = buf.input(*wgu), DWGU = buf.output(*dwgu);
        WG = buf.rows_of(WGU, 0, c.h), WU = buf.rows_of(WGU, c.h, c.h);
        DWG = buf.rows_of(DWGU, 0, c.h), DWU = buf.rows_of(DWGU, c.h, c.h);
    }
    twFfnDescr_t ffn = nullptr;
    TW_REQUIRE_OK(h, twCreateFfn(h, &ffn, c.gated ? TW_FFN_GATED_RELU : TW_FFN_RELU, WG, WU, WD));
    const int32_t mode = c.mode;
    TW_REQUIRE_OK(h, twFfnSetAttribute(ffn, TW_FFN_ATTR_COMPUTE_MODE, &mode, sizeof mode));
    TW_REQUIRE_OK(h, twFfnSetAttribute(ffn, TW_FFN_ATTR_DETERMINISTIC, &c.deterministic, sizeof c.deterministic));
    TW_REQUIRE_OK(h, twFfnSetAttribute(ffn, TW_FFN_ATTR_SAVE_DENSE, &c.save_dense, sizeof c.save_dense));

    size_t saved_bytes = 0, fw = 0, bw = 0;
    TW_REQUIRE_OK(h, twSpGEMMFusedSaved_bufferSize(h, ffn, c.m, &saved_bytes));
    TW_REQUIRE_OK(h, twSpGEMMFused_bufferSize(h, ffn, X, Y, &fw));
    TW_REQUIRE_OK(h, twSpGEMMFusedBackward_bufferSize(h, ffn, c.m, &bw));
    void *saved = buf.memory(saved_bytes);
    void *const wsf = buf.memory(fw), *const wsb = buf.memory(bw);
    const size_t saved_bytes_before = saved_bytes;
    float l1_coeff = c.l1;
    void *l1_output = nullptr;
    if (run.l1_pointers) {
        l1_output = buf.memory(sizeof(float));
        void *coeff = buf.memory(sizeof(float));
        buf.write(coeff, std::vector<float>{c.l1});
        TW_REQUIRE_OK(h, twFfnSetAttribute(ffn, TW_FFN_ATTR_L1_OUTPUT, &l1_output, sizeof l1_output));
        TW_REQUIRE_OK(h, twFfnSetAttribute(ffn, TW_FFN_ATTR_L1_COEFF_POINTER, &coeff, sizeof coeff));
        l1_coeff = std::numeric_limits<float>::quiet_NaN();
    }
    if (run.warm_x) {
        xw = std::make_unique<Dense>(c.m, c.d, c.type, c.x_order);
        xw->fill(*run.warm_x);
        const twDnMatDescr_t XW = buf.input(*xw);
        TW_REQUIRE_OK(h, twSpGEMMFusedForwardTrain(h, ffn, XW, Y, saved, wsf));
        TW_REQUIRE_OK(h, twSpGEMMFusedBackward(h, ffn, XW, saved, DY, l1_coeff, DX, DWG, DWU, DWD, wsb));
        twFfnStats_t warm{};
        TW_REQUIRE_OK(h, twFfnGetStats(h, ffn, &warm));
    }
    if (run.size_after_warm) {
        TW_REQUIRE_OK(h, twSpGEMMFusedSaved_bufferSize(h, ffn, c.m, &saved_bytes));
        saved = buf.memory(saved_bytes);
    }
    void *const moved = run.move_saved ? buf.memory(saved_bytes) : nullptr;
    std::unique_ptr<Dense> x0, y0;
    void *saved0 = nullptr;
    if (run.sparse_forward_between) {
        x0 = std::make_unique<Dense>(c.m, c.d, c.type, c.x_order);
        x0->fill(std::vector<float>(static_cast<size_t>(c.m * c.d), 0.0f));
        y0 = std::make_unique<Dense>(c.m, c.d, c.type);
        saved0 = buf.memory(saved_bytes);
    }
    const twDnMatDescr_t X0 = x0 ? buf.input(*x0) : nullptr, Y0 = y0 ? buf.output(*y0) : nullptr;
    twFfnStats_t step_stats{};  // with X0: the step's own forward's, read before X0's forward
    const TrainRun::Step step = [&]() -> twStatus_t {
        twStatus_t st = twSpGEMMFusedForwardTrain(h, ffn, X, Y, saved, wsf);
        if (st != TW_STATUS_SUCCESS) return st;
        if (run.between) run.between(buf, saved, saved_bytes);
        if (X0) {
            twFfnStats_t none{};
            if ((st = twFfnGetStats(h, ffn, &step_stats)) != TW_STATUS_SUCCESS ||
                (st = twSpGEMMFusedForwardTrain(h, ffn, X0, Y0, saved0, wsf)) != TW_STATUS_SUCCESS ||
                (st = twFfnGetStats(h, ffn, &none)) != TW_STATUS_SUCCESS)
                return st;
        }
        if (moved) buf.copy(moved, saved, saved_bytes);
        return twSpGEMMFusedBackward(h, ffn, X, moved ? moved : saved, DY, l1_coeff, DX, DWG, DWU, DWD, wsb);
    };
    if (run.replay) {
        run.replay(h, run.repeats, step);
    } else {
        for (int i = 0; i < run.repeats; ++i) TW_REQUIRE_OK(h, step());
    }
    TrainResult r;
    TW_REQUIRE_OK(h, twFfnGetStats(h, ffn, &r.stats));
    REQUIRE(twFfnGetAttribute(ffn, TW_FFN_ATTR_WEIGHT_COPY_BYTES, &r.weight_copy_bytes, sizeof r.weight_copy_bytes) ==
            TW_STATUS_SUCCESS);
    if (X0) r.stats = step_stats;
    r.saved_bytes_before = saved_bytes_before;
    r.saved_bytes = saved_bytes;
    if (l1_output) r.l1_output = buf.read<float>(l1_output, 1)[0];
    buf.fetch();
    twDestroyFfn(ffn);
    r.y = y.to_double();
    r.dx = dx.to_double();
    if (dwgu) {  // its rows: dWg's, then dWu's (the bits in the order of separate matrices)
        const std::vector<double> both = dwgu->to_double();
        r.dwg.assign(both.begin(), both.begin() + static_cast<std::ptrdiff_t>(both.size() / 2));
        r.dwu.assign(both.begin() + static_cast<std::ptrdiff_t>(both.size() / 2), both.end());
    } else {
        if (dwg) r.dwg = dwg->to_double();
        r.dwu = dwu.to_double();
    }
    r.dwd = dwd.to_double();
    const Dense *const wgrads = dwgu ? dwgu.get() : dwg.get();
    const Dense *const up_grad = dwgu ? nullptr : &dwu;
    for (const Dense *m : {static_cast<const Dense *>(&y), static_cast<const Dense *>(&dx), wgrads, up_grad,
                           static_cast<const Dense *>(&dwd)})
        if (m) append_bits(r.bits, *m);
    return r;
}

/// CUDA against the CPU reference, normwise. y as in the inference tests (8 u). The gradients
/// round dh, dz and du to the value type in DEFAULT mode; GPU and CPU sum in different orders,
/// so a rounding can land one ulp apart (u relative on that term): 16 u normwise. fp32:
/// summation order only.
inline double bound(const TrainCase &c, bool gradient) {
    if (c.type == TW_R_32F || (c.mode == TW_COMPUTE_HIGHEST_PRECISION && !gradient))
        return c.type == TW_R_32F ? 1e-4 : 8 * unit_roundoff(c.type);
    return (gradient ? 16 : 8) * unit_roundoff(c.type);
}

/// The CPU reference against the naive math on the rounded data, normwise. y against the naive
/// forward with DEFAULT's roundings, as in the inference tests: 1e-5 in fp32, 4 u otherwise. The
/// gradients against naive fp64 gradients without any rounding: fp32 accumulates in fp32 only
/// (sums of up to M terms of mixed sign), 1e-4; 16-bit DEFAULT rounds dh, du, dz and every
/// output, 8 u.
inline double naive_bound(const TrainCase &c, bool gradient) {
    if (c.type == TW_R_32F) return gradient ? 1e-4 : 1e-5;
    return (gradient ? 8 : 4) * unit_roundoff(c.type);
}

/// Tokens and units with a pre-activation within rounding of zero (|z| < 1e-5 |x| |w|, in fp64
/// on the rounded data): GPU and CPU sum z in different orders, so such a unit may fire on one
/// side only. Its h is then about 0 (Y and dWdown do not notice) but dz = dh u is not, so the
/// token's dX row and the unit's dWgate (dWup when plain) row may differ: those rows are left
/// out of the comparison, and there must be few of them.
struct Kinks {
    std::vector<char> token, unit;
    int64_t pairs = 0;
};
inline Kinks near_kinks(const TrainCase &c, const TrainData &data) {
    const std::vector<float> x = rounded(data.x, c.type), w = rounded(c.gated ? data.wg : data.wu, c.type);
    Kinks k{std::vector<char>(static_cast<size_t>(c.m), 0), std::vector<char>(static_cast<size_t>(c.h), 0), 0};
    std::vector<double> wn(static_cast<size_t>(c.h), 0.0);
    for (int64_t j = 0; j < c.h; ++j)
        for (int64_t q = 0; q < c.d; ++q) wn[j] += double(w[j * c.d + q]) * w[j * c.d + q];
    for (int64_t t = 0; t < c.m; ++t) {
        double xn = 0;
        for (int64_t q = 0; q < c.d; ++q) xn += double(x[t * c.d + q]) * x[t * c.d + q];
        for (int64_t j = 0; j < c.h; ++j) {
            double z = 0;
            for (int64_t q = 0; q < c.d; ++q) z += double(x[t * c.d + q]) * w[j * c.d + q];
            if (std::fabs(z) < 1e-5 * std::sqrt(xn * wn[j])) k.token[t] = k.unit[j] = 1, ++k.pairs;
        }
    }
    return k;
}

/// `v` (rows x cols, row-major) with the flagged rows set to zero.
inline std::vector<double> without_rows(std::vector<double> v, const std::vector<char> &rows, int64_t cols) {
    for (size_t r = 0; r < rows.size(); ++r)
        if (rows[r]) std::fill(v.begin() + static_cast<long>(r * cols), v.begin() + static_cast<long>((r + 1) * cols), 0.0);
    return v;
}

/// What a training step must match.
struct TrainExpected {
    TrainResult r;
    bool exact = false;          // every output bit for bit
    bool pattern_exact = false;  // the active units exactly (meanRowNnz)
    double y_bound = 0, grad_bound = 0;
    bool kinks_found = false;    // rows near a ReLU kink are left out (the CPU reference as oracle)
    Kinks kinks;
};

/// The naive fp64 forward (with DEFAULT's roundings) and gradients on the case's data rounded to
/// its type. Exact in fp32 on small-integer data.
inline TrainExpected naive_expected(const TrainCase &c, const TrainData &data) {
    const twDataType_t t = c.type;
    const bool rounds = c.mode == TW_COMPUTE_DEFAULT;
    const std::vector<float> x = rounded(data.x, t), wg = data.wg.empty() ? data.wg : rounded(data.wg, t),
                             wu = rounded(data.wu, t), wd = rounded(data.wd, t), dy = rounded(data.dy, t);
    const NaiveFfn f = naive_ffn(c.m, c.d, c.h, x, wg, wu, wd, rounds ? &t : nullptr);
    const NaiveGrads g = naive_backward(c.m, c.d, c.h, x, wg, wu, wd, dy, c.l1);
    TrainExpected e;
    e.r.y = f.y;
    e.r.dx = g.dx;
    e.r.dwg = g.dwg;
    e.r.dwu = g.dwu;
    e.r.dwd = g.dwd;
    for (const std::vector<double> *v : {&f.y, &g.dx, &g.dwg, &g.dwu, &g.dwd})
        for (double value : *v) e.r.bits.push_back(value_bits(t, static_cast<float>(value)));
    int64_t total = 0, overflow = 0;
    for (int64_t i = 0; i < c.m; ++i) {
        bool over = false;
        for (int64_t j0 = 0; j0 < c.h; j0 += 256) {
            int64_t in_tile = 0;
            for (int64_t j = j0; j < std::min(c.h, j0 + 256); ++j) {
                const double z = f.z[static_cast<size_t>(i * c.h + j)];
                in_tile += (rounds ? static_cast<double>(twblas::round_to(t, static_cast<float>(z))) : z) > 0.0;
            }
            total += in_tile;
            over = over || in_tile > 31;  // the 31 slots of a 256-column TwELL tile
        }
        overflow += over;
    }
    e.r.stats.tokens = c.m;
    e.r.stats.meanRowNnz = c.m ? static_cast<double>(total) / static_cast<double>(c.m) : 0.0;
    e.r.stats.overflowRows = overflow;
    e.exact = c.integers && t == TW_R_32F;
    e.pattern_exact = c.integers;
    e.y_bound = naive_bound(c, false);
    e.grad_bound = naive_bound(c, true);
    return e;
}

/// The oracle of the backend under test: the naive math on the CPU, the CPU reference on CUDA.
inline TrainExpected expected_train(const TrainCase &c, const TrainData &data) {
    if (!kOnCuda) return naive_expected(c, data);
    TrainExpected e;
    e.r = run_train(c, data, TW_BACKEND_CPU);
    e.exact = e.pattern_exact = c.integers;
    e.y_bound = bound(c, false);
    e.grad_bound = bound(c, true);
    if (!c.integers) e.kinks = near_kinks(c, data), e.kinks_found = true;
    return e;
}

/// A step against its oracle.
inline void check_train(const TrainCase &c, const TrainResult &got, const TrainExpected &want) {
    INFO(describe(c));
    CHECK(got.stats.tokens == want.r.stats.tokens);
    CHECK(got.stats.overflowRows == want.r.stats.overflowRows);
    if (want.pattern_exact) CHECK(got.stats.meanRowNnz == want.r.stats.meanRowNnz);
    if (want.exact) {
        REQUIRE(got.bits == want.r.bits);
        return;
    }
    const Kinks &kinks = want.kinks;
    if (want.kinks_found) {
        INFO(kinks.pairs << " (token, unit) pairs within rounding of the ReLU kink");
        const auto flagged = [](const std::vector<char> &v) { return std::count(v.begin(), v.end(), 1); };
        CHECK(flagged(kinks.token) <= std::max<int64_t>(3, c.m / 4));  // most rows are compared
        CHECK(flagged(kinks.unit) <= std::max<int64_t>(3, c.h / 10));
    }
    const std::vector<char> none;
    auto check = [&](const char *name, const std::vector<double> &g, const std::vector<double> &w, bool gradient,
                     const std::vector<char> &skip) {
        for (double v : g) REQUIRE(std::isfinite(v));  // every element written (outputs poisoned with NaN)
        const ErrorReport e = skip.empty() ? compare(g, w, c.d) : compare(without_rows(g, skip, c.d), without_rows(w, skip, c.d), c.d);
        INFO(name << ": relative error " << e.rel << ", worst " << e.worst);
        CHECK(e.rel <= (gradient ? want.grad_bound : want.y_bound));
    };
    check("Y", got.y, want.r.y, false, none);
    check("dX", got.dx, want.r.dx, true, kinks.token);
    if (c.gated) check("dWgate", got.dwg, want.r.dwg, true, kinks.unit);
    check("dWup", got.dwu, want.r.dwu, true, c.gated ? none : kinks.unit);
    check("dWdown", got.dwd, want.r.dwd, true, none);
}

/// The case's step on the backend under test (after a warm-up step on `warm_x`, if any),
/// against its oracle.
inline void check_train_case(const TrainCase &c, const std::vector<float> *warm_x = nullptr) {
    const TrainData data = make_data(c);
    const TrainExpected want = expected_train(c, data);
    check_train(c, run_train(c, data, kBackend, TrainRun().warmed_with(warm_x)), want);
}

}  // namespace twtest
