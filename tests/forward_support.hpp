// The fused forward as the shared cases (test_ffn_forward.cpp) and the CUDA-only ones
// (test_cuda_backend.cpp) run it: a case (shape, type, mode, layouts, data), one run of
// twSpGEMMFused on a backend with everything read back, and the oracle that a run must match:
// the naive fp64 FFN in the CPU programs, the CPU reference on the same data in the CUDA
// programs (the CPU programs check that reference against the naive FFN with these same cases).
#pragma once

#include <functional>
#include <utility>
#include <vector>
#include <sstream>
#include <string>

#include "backend_support.hpp"
#include "testing/problem.hpp"

namespace twtest {

struct FfnCase {
    int64_t m = 7, d = 64, h = 600;
    bool gated = true;
    twDataType_t type = TW_R_16BF;
    twComputeMode_t mode = TW_COMPUTE_DEFAULT;
    twOrder_t wd_order = TW_ORDER_ROW;
    WeightLayout wg_layout, wu_layout, wd_layout;  // default: packed rows, aligned
    twOrder_t x_order = TW_ORDER_ROW;
    int64_t x_pad = 0;
    twblas::testing::Profile profile = twblas::testing::Profile::Uniform;
    double k = 29;
    double heavy_fraction = 0.01;  // Heavy: share of the rows made dense on purpose
    double heavy_scale = 0.25;     // Heavy: their factor (smaller: denser rows)
    bool integers = false;         // small-integer data: every sum exact, results bit-identical
    int hidden = 0;                // hidden output: 0 none, 1 TwELL, 2 hybrid
    int32_t twell_compression = 8;
    int32_t ell_width = 32;        // hybrid: ELL width and backup rows (at most M)
    int64_t backup_rows = 3;
    int32_t deterministic = 0;
    twFfnAlgorithm_t algorithm = TW_FFN_ALG_DEFAULT;  // TW_FFN_ATTR_ALGORITHM
    uint64_t seed = 7;
};

inline std::string describe(const FfnCase &c) {
    std::ostringstream os;
    os << "M " << c.m << " D " << c.d << " H " << c.h << (c.gated ? " gated" : " plain") << " type " << c.type
       << " mode " << c.mode << " profile " << twblas::testing::profile_name(c.profile) << " Wd "
       << (c.wd_order == TW_ORDER_ROW ? "row" : "col") << " X " << (c.x_order == TW_ORDER_ROW ? "row" : "col")
       << " hidden " << c.hidden << (c.integers ? " integers" : "") << " algorithm " << c.algorithm;
    for (const WeightLayout *l : {&c.wg_layout, &c.wu_layout, &c.wd_layout})
        if (l->pad || l->offset) os << " weight pad " << l->pad << " offset " << l->offset;
    return os.str();
}

/// The value type of the hidden output (TwELL holds 16-bit values: bf16 for an fp32 FFN).
inline twDataType_t hidden_type(const FfnCase &c) { return c.type == TW_R_32F && c.hidden == 1 ? TW_R_16BF : c.type; }

struct FfnData {
    std::vector<float> x, wg, wu, wd;  // row-major, every weight H x D (wg empty when plain)
};

inline twblas::testing::ProblemSpec problem_spec(const FfnCase &c) {
    twblas::testing::ProblemSpec spec;
    spec.tokens = c.m;
    spec.model_dim = c.d;
    spec.hidden_dim = c.h;
    spec.profile = c.profile;
    spec.active_units = c.k;
    spec.gated = c.gated;
    spec.seed = c.seed;
    spec.heavy_fraction = c.heavy_fraction;
    spec.heavy_scale = c.heavy_scale;
    return spec;
}

/// Integers in [-1, 1] (c.integers) or the generated problem of the case.
inline FfnData make_data(const FfnCase &c) {
    FfnData data;
    if (c.integers) {
        std::mt19937_64 rng(c.seed);
        std::uniform_int_distribution<int> small(-1, 1);
        auto fill = [&](std::vector<float> &v, size_t n) {
            v.resize(n);
            for (float &f : v) f = static_cast<float>(small(rng));
        };
        fill(data.x, static_cast<size_t>(c.m * c.d));
        if (c.gated) fill(data.wg, static_cast<size_t>(c.h * c.d));
        fill(data.wu, static_cast<size_t>(c.h * c.d));
        fill(data.wd, static_cast<size_t>(c.h * c.d));
        return data;
    }
    const twblas::testing::FfnProblem p = twblas::testing::make_ffn_problem(problem_spec(c));
    data.x = p.x;
    data.wg = p.w_gate;
    data.wu = p.w_up;
    data.wd = p.w_down;
    return data;
}

struct FfnResult {
    std::vector<double> y;
    std::vector<uint32_t> y_bits;
    twFfnStats_t stats{};
    std::vector<int64_t> counts, counts_after_reset;
    int64_t weight_copy_bytes = -1;  // TW_FFN_ATTR_WEIGHT_COPY_BYTES after the run
    // the hidden output: its info, twSpMatValidate's verdict, its raw words, and its values
    // (row-major bits) when the container holds every row
    twSpMatInfo_t hidden_info{};
    twStatus_t hidden_valid = TW_STATUS_SUCCESS;
    std::string hidden_message;
    std::vector<uint32_t> hidden_words, hidden_bits;
};

/// How run_ffn runs: `repeats` forwards on one FFN, each followed by (blocking) statistics when
/// `stats_between`; a first forward on `warm_x` whose statistics steer the paths of the others;
/// the neuron counts also read after twFfnResetNeuronCounts; and `replay`, which runs the
/// forwards some other way (the CUDA programs: captured into a CUDA graph and replayed); tuning
/// knobs set on a CUDA FFN (twFfnSetTuning).
struct FfnRun {
    using Step = std::function<twStatus_t()>;
    int repeats = 1;
    bool stats_between = false, reset_counts = false;
    const std::vector<float> *warm_x = nullptr;
    std::function<void(twHandle_t, int, const Step &)> replay;
    std::vector<std::pair<const char *, double>> knobs;

    FfnRun &times(int n) {
        repeats = n;
        return *this;
    }
    FfnRun &with_stats_between() {
        stats_between = true;
        return *this;
    }
    FfnRun &with_reset_counts() {
        reset_counts = true;
        return *this;
    }
    FfnRun &warmed_with(const std::vector<float> *x) {
        warm_x = x;
        return *this;
    }
    FfnRun &tuned(const char *knob, double value) {
        knobs.emplace_back(knob, value);
        return *this;
    }
    FfnRun &replayed(std::function<void(twHandle_t, int, const Step &)> r) {
        replay = std::move(r);
        return *this;
    }
};

/// The neuron counts of `ffn`, read through backend memory.
inline std::vector<int64_t> neuron_counts(twHandle_t h, twFfnDescr_t ffn, Buffers &buf, int64_t units) {
    void *counts = buf.memory(static_cast<size_t>(units) * 8);
    TW_REQUIRE_OK(h, twFfnGetNeuronCounts(h, ffn, static_cast<int64_t *>(counts)));
    return buf.read<int64_t>(counts, static_cast<size_t>(units));
}

/// The case's X, Wg, Wu and Wd as host matrices of its type (row-major, unpadded; Wg filled when
/// the FFN is gated).
struct FfnOperands {
    Dense x, wg, wu, wd;
    FfnOperands(const FfnCase &c, const FfnData &data)
        : x(c.m, c.d, c.type), wg(c.h, c.d, c.type), wu(c.h, c.d, c.type), wd(c.h, c.d, c.type) {
        x.fill(data.x);
        if (c.gated) wg.fill(data.wg);
        wu.fill(data.wu);
        wd.fill(data.wd);
    }
};

/// Runs the case's forward on `backend` and reads everything back.
inline FfnResult run_ffn(const FfnCase &c, const FfnData &data, twBackend_t backend, const FfnRun &run = FfnRun()) {
    Handle h(backend);
    Buffers buf(backend);
    Dense x(c.m, c.d, c.type, c.x_order, c.x_pad), y(c.m, c.d, c.type);
    const std::unique_ptr<Dense> wu = weight_matrix(c.h, c.d, c.type, TW_ORDER_ROW, c.wu_layout, data.wu),
                                 wd = weight_matrix(c.h, c.d, c.type, c.wd_order, c.wd_layout, data.wd);
    std::unique_ptr<Dense> wg, xw;
    x.fill(data.x);
    if (c.gated) wg = weight_matrix(c.h, c.d, c.type, TW_ORDER_ROW, c.wg_layout, data.wg);
    y.poison();
    const twDnMatDescr_t X = buf.input(x), Y = buf.output(y), WU = buf.input_at(*wu, c.wu_layout.offset),
                         WD = buf.input_at(*wd, c.wd_layout.offset),
                         WG = wg ? buf.input_at(*wg, c.wg_layout.offset) : nullptr;
    twFfnDescr_t ffn = nullptr;
    TW_REQUIRE_OK(h, twCreateFfn(h, &ffn, c.gated ? TW_FFN_GATED_RELU : TW_FFN_RELU, WG, WU, WD));
    const int32_t mode = c.mode;
    REQUIRE(twFfnSetAttribute(ffn, TW_FFN_ATTR_COMPUTE_MODE, &mode, sizeof mode) == TW_STATUS_SUCCESS);
    REQUIRE(twFfnSetAttribute(ffn, TW_FFN_ATTR_DETERMINISTIC, &c.deterministic, sizeof c.deterministic) ==
            TW_STATUS_SUCCESS);
    const int32_t algorithm = c.algorithm;
    REQUIRE(twFfnSetAttribute(ffn, TW_FFN_ATTR_ALGORITHM, &algorithm, sizeof algorithm) == TW_STATUS_SUCCESS);
    if (backend == TW_BACKEND_CUDA)
        for (const auto &[knob, value] : run.knobs) REQUIRE(twFfnSetTuning(ffn, knob, value) == TW_STATUS_SUCCESS);

    const twDataType_t htype = hidden_type(c);
    const int64_t backup = std::min(c.backup_rows, c.m);
    twSpMatDescr_t hidden = nullptr;
    if (c.hidden == 1) hidden = buf.twell(c.m, c.h, htype, 256, c.twell_compression);
    if (c.hidden == 2) hidden = buf.hybrid(c.m, c.h, c.ell_width, backup, htype);

    size_t ws_bytes = 0;
    TW_REQUIRE_OK(h, twSpGEMMFused_bufferSize(h, ffn, X, Y, &ws_bytes));
    void *ws = buf.memory(ws_bytes);
    if (run.warm_x) {
        xw = std::make_unique<Dense>(c.m, c.d, c.type, c.x_order, c.x_pad);
        xw->fill(*run.warm_x);
        TW_REQUIRE_OK(h, twSpGEMMFused(h, ffn, buf.input(*xw), Y, hidden, ws));
        twFfnStats_t warm{};
        TW_REQUIRE_OK(h, twFfnGetStats(h, ffn, &warm));
    }
    const FfnRun::Step forward = [&] { return twSpGEMMFused(h, ffn, X, Y, hidden, ws); };
    if (run.replay) {
        run.replay(h, run.repeats, forward);
    } else {
        for (int i = 0; i < run.repeats; ++i) {
            TW_REQUIRE_OK(h, forward());
            twFfnStats_t between{};
            if (run.stats_between) TW_REQUIRE_OK(h, twFfnGetStats(h, ffn, &between));  // blocks: feedback arrives
        }
    }
    FfnResult r;
    TW_REQUIRE_OK(h, twFfnGetStats(h, ffn, &r.stats));
    REQUIRE(twFfnGetAttribute(ffn, TW_FFN_ATTR_WEIGHT_COPY_BYTES, &r.weight_copy_bytes, sizeof r.weight_copy_bytes) ==
            TW_STATUS_SUCCESS);
    r.counts = neuron_counts(h, ffn, buf, c.h);
    if (run.reset_counts) {
        TW_REQUIRE_OK(h, twFfnResetNeuronCounts(h, ffn));
        r.counts_after_reset = neuron_counts(h, ffn, buf, c.h);
    }
    buf.fetch();
    r.y = y.to_double();
    for (int64_t i = 0; i < c.m; ++i)
        for (int64_t k = 0; k < c.d; ++k) r.y_bits.push_back(y.bits(i, k));
    if (hidden) {
        r.hidden_info = info_of(h, hidden);
        r.hidden_valid = twSpMatValidate(h, hidden);
        if (r.hidden_valid != TW_STATUS_SUCCESS) r.hidden_message = twGetErrorMessage(h);
        r.hidden_words = buf.words(hidden);
        // a container with rows past its capacity (TwELL: any; hybrid: more than its backup
        // rows) cannot be densified: compare its counts only
        if (c.hidden == 1 ? r.hidden_info.overflowRows == 0 : r.hidden_info.overflowRows <= backup) {
            const std::unique_ptr<Dense> dense = buf.to_dense(h, hidden, htype);
            for (int64_t i = 0; i < c.m; ++i)
                for (int64_t j = 0; j < c.h; ++j) r.hidden_bits.push_back(dense->bits(i, j));
        }
    }
    twDestroyFfn(ffn);
    return r;
}

/// CUDA against the CPU reference: both sum in their own orders; the intermediate roundings of
/// DEFAULT can land one ulp apart, each costing at most about one unit roundoff of the value
/// type, and y itself is rounded: a few u of the value type normwise.
inline double type_bound(const FfnCase &c) {
    if (c.type == TW_R_32F) return 2e-5;
    return 8 * unit_roundoff(c.type);
}

/// The CPU reference against the naive FFN on the rounded data (emulating DEFAULT's roundings
/// of g, u and h): fp32 only accumulates in fp32 (D + k terms, random signs), 1e-5 normwise is
/// a wide margin; in 16 bits, the final rounding of y (about u / 2 normwise) plus rare 1-ulp
/// flips of intermediates: 4 u.
inline double naive_bound(const FfnCase &c) {
    if (c.type == TW_R_32F) return 1e-5;
    return 4 * unit_roundoff(c.type);
}

/// The FFN's TwELL tiles on its dense path (the TILE_WIDTH and COMPRESSION defaults): a token
/// with more than 256 / 8 - 1 active units in one 256-column tile overflows.
constexpr int64_t kFfnTile = 256, kFfnTileSlots = 31;

/// What one forward must match.
struct FfnExpected {
    FfnResult r;
    double bound = 0;           // normwise relative bound of y against r.y
    bool exact = false;         // y bits, statistics, counts and hidden values exactly
    bool from_backend = false;  // r is a run of the CPU backend (its hidden container info is known)
};

/// The naive fp64 FFN on the case's data rounded to its type, with DEFAULT's roundings.
inline FfnExpected naive_expected(const FfnCase &c, const FfnData &data) {
    const twDataType_t t = c.type;
    const bool rounds = c.mode == TW_COMPUTE_DEFAULT;
    const NaiveFfn n = naive_ffn(c.m, c.d, c.h, rounded(data.x, t), data.wg.empty() ? data.wg : rounded(data.wg, t),
                                 rounded(data.wu, t), rounded(data.wd, t), rounds ? &t : nullptr);
    FfnExpected e;
    e.bound = naive_bound(c);
    e.exact = c.integers;
    FfnResult &r = e.r;
    r.y = n.y;
    for (double v : n.y) r.y_bits.push_back(value_bits(t, static_cast<float>(v)));
    r.counts.assign(static_cast<size_t>(c.h), 0);
    int64_t total = 0, max_row = 0, overflow = 0;
    double l1 = 0;
    for (int64_t i = 0; i < c.m; ++i) {
        int64_t row = 0;
        bool over = false;
        for (int64_t j0 = 0; j0 < c.h; j0 += kFfnTile) {
            int64_t in_tile = 0;
            for (int64_t j = j0; j < std::min(c.h, j0 + kFfnTile); ++j) {
                const double z = n.z[static_cast<size_t>(i * c.h + j)];
                const double g = rounds ? static_cast<double>(twblas::round_to(t, static_cast<float>(z))) : z;
                if (!(g > 0.0)) continue;  // the unit is active when its (rounded) g is positive
                ++in_tile;
                ++r.counts[static_cast<size_t>(j)];
                l1 += std::fabs(n.hidden[static_cast<size_t>(i * c.h + j)]);
            }
            row += in_tile;
            over = over || in_tile > kFfnTileSlots;
        }
        total += row;
        max_row = std::max(max_row, row);
        overflow += over;
    }
    r.stats.tokens = c.m;
    r.stats.meanRowNnz = c.m ? static_cast<double>(total) / static_cast<double>(c.m) : 0.0;
    r.stats.maxRowNnz = max_row;
    r.stats.overflowRows = overflow;
    r.stats.l1 = c.m ? l1 / static_cast<double>(c.m) : 0.0;
    if (c.hidden)
        for (double v : n.hidden) r.hidden_bits.push_back(value_bits(hidden_type(c), static_cast<float>(v)));
    return e;
}

/// The oracle of the backend under test: the naive FFN on the CPU, the CPU reference on CUDA.
inline FfnExpected expected_forward(const FfnCase &c, const FfnData &data) {
    if (!kOnCuda) return naive_expected(c, data);
    FfnExpected e;
    e.r = run_ffn(c, data, TW_BACKEND_CPU);
    e.bound = type_bound(c);
    e.exact = c.integers;
    e.from_backend = true;
    return e;
}

/// A run against its oracle. Small-integer data: bit-identical y, statistics, counts and hidden
/// values. Otherwise y within the oracle's bound and statistics that agree closely (a unit whose
/// pre-activation is within rounding of 0 may fire on one side only).
inline void check_forward(const FfnCase &c, const FfnResult &got, const FfnExpected &want) {
    const ErrorReport e = compare(got.y, want.r.y, c.d);
    INFO(describe(c) << ": " << e.worst);
    for (double v : got.y) REQUIRE(std::isfinite(v));  // every element written (poisoned with NaN)
    REQUIRE(e.rel <= want.bound);
    CHECK(got.stats.tokens == want.r.stats.tokens);
    if (want.exact) {
        REQUIRE(got.y_bits == want.r.y_bits);
        CHECK(got.stats.meanRowNnz == want.r.stats.meanRowNnz);
        CHECK(got.stats.maxRowNnz == want.r.stats.maxRowNnz);
        CHECK(got.stats.overflowRows == want.r.stats.overflowRows);
        CHECK(got.stats.l1 == Approx(want.r.stats.l1).epsilon(1e-6));
        CHECK(got.counts == want.r.counts);
        if (c.hidden && want.from_backend) {
            CHECK(got.hidden_info.nnz == want.r.hidden_info.nnz);
            CHECK(got.hidden_info.overflowRows == want.r.hidden_info.overflowRows);
            CHECK(got.hidden_bits == want.r.hidden_bits);
        } else if (c.hidden && !got.hidden_bits.empty()) {
            CHECK(got.hidden_bits == want.r.hidden_bits);
        }
    } else {
        CHECK(got.stats.overflowRows == want.r.stats.overflowRows);
        CHECK(got.stats.meanRowNnz == Approx(want.r.stats.meanRowNnz).epsilon(0.01));
        CHECK(got.stats.l1 == Approx(want.r.stats.l1).epsilon(0.01));
    }
}

/// The case's forward on the backend under test, against its oracle.
inline void check_forward_case(const FfnCase &c) {
    const FfnData data = make_data(c);
    check_forward(c, run_ffn(c, data, kBackend), expected_forward(c, data));
}

}  // namespace twtest
