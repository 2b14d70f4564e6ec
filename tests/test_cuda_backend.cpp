// The CUDA backend against the CPU reference: the fused FFN (all profiles, odd shapes, both Wd
// layouts, every value type and compute mode, hidden outputs, statistics, neuron counts,
// determinism, CUDA graph capture) and the building blocks. Without a usable GPU every case
// says so and passes (CI machines have none).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <map>

#include "cuda_test_support.hpp"
#include "test_support.hpp"
#include "testing/problem.hpp"

using namespace twtest;
namespace tt = twblas::testing;

namespace {

/// A sparse container in device memory.
struct DeviceSparse {
    DeviceCopy mem;
    twSpMatDescr_t d = nullptr;
    DeviceSparse(size_t bytes) : mem(bytes) {}
    static std::unique_ptr<DeviceSparse> twell(int64_t rows, int64_t cols, twDataType_t t, int32_t tile = 256, int32_t c = 8) {
        size_t bytes = 0;
        REQUIRE(twTwellBufferSize(rows, cols, tile, c, &bytes) == TW_STATUS_SUCCESS);
        auto s = std::make_unique<DeviceSparse>(bytes);
        REQUIRE(twCreateTwell(&s->d, rows, cols, tile, c, s->mem.ptr, t) == TW_STATUS_SUCCESS);
        return s;
    }
    static std::unique_ptr<DeviceSparse> hybrid(int64_t rows, int64_t cols, int32_t e, int64_t b, twDataType_t t) {
        size_t bytes = 0;
        REQUIRE(twHybridBufferSize(rows, cols, e, b, t, &bytes) == TW_STATUS_SUCCESS);
        auto s = std::make_unique<DeviceSparse>(bytes);
        REQUIRE(twCreateHybrid(&s->d, rows, cols, e, b, s->mem.ptr, t) == TW_STATUS_SUCCESS);
        return s;
    }
    ~DeviceSparse() { twDestroySpMat(d); }
    operator twSpMatDescr_t() const { return d; }
};

/// Dense bits of a sparse container (through twSparseToDense on its own backend).
std::vector<uint32_t> dense_bits(twHandle_t h, twSpMatDescr_t s, bool device, twDataType_t t) {
    int64_t rows = 0, cols = 0;
    REQUIRE(twSpMatGetSize(s, &rows, &cols) == TW_STATUS_SUCCESS);
    Dense out(rows, cols, t);
    if (!device) {
        TW_REQUIRE_OK(h, twSparseToDense(h, s, out));
    } else {
        DeviceDense dout(out);
        TW_REQUIRE_OK(h, twSparseToDense(h, s, dout));
        dout.fetch();
    }
    std::vector<uint32_t> bits;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) bits.push_back(out.bits(r, c));
    return bits;
}

struct FfnCase {
    int64_t m = 7, d = 64, h = 600;
    bool gated = true;
    twDataType_t type = TW_R_16BF;
    twComputeMode_t mode = TW_COMPUTE_DEFAULT;
    twOrder_t wd_order = TW_ORDER_ROW;
    twOrder_t x_order = TW_ORDER_ROW;
    int64_t x_pad = 0;
    tt::Profile profile = tt::Profile::Uniform;
    double k = 29;
    bool integers = false;      // small-integer data: every sum exact, results bit-identical
    int hidden = 0;             // 0 none, 1 TwELL, 2 hybrid
    int32_t deterministic = 0;
    uint64_t seed = 7;
};

struct FfnResult {
    std::vector<double> y;
    std::vector<uint32_t> y_bits;
    twFfnStats_t stats{};
    std::vector<int64_t> counts;
    std::vector<uint32_t> hidden_bits;
    twSpMatInfo_t hidden_info{};
};

struct FfnData {
    std::vector<float> x, wg, wu, wd;
};

FfnData make_data(const FfnCase &c) {
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
    tt::ProblemSpec spec;
    spec.tokens = c.m;
    spec.model_dim = c.d;
    spec.hidden_dim = c.h;
    spec.profile = c.profile;
    spec.active_units = c.k;
    spec.gated = c.gated;
    spec.seed = c.seed;
    const tt::FfnProblem p = tt::make_ffn_problem(spec);
    data.x = p.x;
    data.wg = p.w_gate;
    data.wu = p.w_up;
    data.wd = p.w_down;
    return data;
}

/// Runs one forward on `backend` and reads everything back.
/// `warm_x`: a first forward on these inputs (then its statistics, which steer the path of the
/// timed forwards on data.x).
FfnResult run_ffn(const FfnCase &c, const FfnData &data, twBackend_t backend, int repeats = 1,
                  bool capture = false, bool stats_between = false, const std::vector<float> *warm_x = nullptr) {
    const bool dev = backend == TW_BACKEND_CUDA;
    Handle h(backend);
    Dense x(c.m, c.d, c.type, c.x_order, c.x_pad), y(c.m, c.d, c.type);
    Dense wu(c.h, c.d, c.type), wd(c.h, c.d, c.type, c.wd_order);
    std::unique_ptr<Dense> wg;
    x.fill(data.x);
    wu.fill(data.wu);
    for (int64_t j = 0; j < c.h; ++j)
        for (int64_t k = 0; k < c.d; ++k) wd.set(j, k, data.wd[static_cast<size_t>(j * c.d + k)]);
    if (c.gated) {
        wg = std::make_unique<Dense>(c.h, c.d, c.type);
        wg->fill(data.wg);
    }
    y.poison();
    std::unique_ptr<DeviceDense> dx, dy, dwg, dwu, dwd;
    twDnMatDescr_t X = x, Y = y, WG = wg ? wg->d : nullptr, WU = wu, WD = wd;
    if (dev) {
        dx = std::make_unique<DeviceDense>(x);
        dy = std::make_unique<DeviceDense>(y);
        dwu = std::make_unique<DeviceDense>(wu);
        dwd = std::make_unique<DeviceDense>(wd);
        X = *dx, Y = *dy, WU = *dwu, WD = *dwd;
        if (wg) dwg = std::make_unique<DeviceDense>(*wg), WG = *dwg;
    }
    twFfnDescr_t ffn = nullptr;
    TW_REQUIRE_OK(h, twCreateFfn(h, &ffn, c.gated ? TW_FFN_GATED_RELU : TW_FFN_RELU, WG, WU, WD));
    const int32_t mode = c.mode;
    REQUIRE(twFfnSetAttribute(ffn, TW_FFN_ATTR_COMPUTE_MODE, &mode, sizeof mode) == TW_STATUS_SUCCESS);
    REQUIRE(twFfnSetAttribute(ffn, TW_FFN_ATTR_DETERMINISTIC, &c.deterministic, sizeof c.deterministic) ==
            TW_STATUS_SUCCESS);

    // hidden output: host or device container
    std::unique_ptr<Sparse> hs;
    std::unique_ptr<DeviceSparse> ds;
    twSpMatDescr_t hidden = nullptr;
    const twDataType_t htype = c.type == TW_R_32F && c.hidden == 1 ? TW_R_16BF : c.type;
    if (c.hidden) {
        if (dev)
            ds = c.hidden == 1 ? DeviceSparse::twell(c.m, c.h, htype) : DeviceSparse::hybrid(c.m, c.h, 32, std::min<int64_t>(3, c.m), htype);
        else
            hs = c.hidden == 1 ? Sparse::twell(c.m, c.h, htype) : Sparse::hybrid(c.m, c.h, 32, std::min<int64_t>(3, c.m), htype);
        hidden = dev ? ds->d : hs->d;
    }

    size_t ws_bytes = 0;
    TW_REQUIRE_OK(h, twSpGEMMFused_bufferSize(h, ffn, X, Y, &ws_bytes));
    std::unique_ptr<DeviceCopy> dws;
    std::vector<uint8_t> hws;
    void *ws = nullptr;
    if (dev) {
        dws = std::make_unique<DeviceCopy>(ws_bytes);
        ws = dws->ptr;
    } else {
        hws.resize(std::max<size_t>(ws_bytes, 1));
        ws = hws.data();
    }
    if (warm_x) {
        Dense xw(c.m, c.d, c.type, c.x_order, c.x_pad);
        xw.fill(*warm_x);
        std::unique_ptr<DeviceDense> dxw;
        twDnMatDescr_t XW = xw;
        if (dev) dxw = std::make_unique<DeviceDense>(xw), XW = *dxw;
        TW_REQUIRE_OK(h, twSpGEMMFused(h, ffn, XW, Y, hidden, ws));
        twFfnStats_t warm{};
        TW_REQUIRE_OK(h, twFfnGetStats(h, ffn, &warm));
    }
    if (capture) {
        replay_captured(h, repeats, [&] { return twSpGEMMFused(h, ffn, X, Y, hidden, ws); });
    } else {
        for (int i = 0; i < repeats; ++i) {
            TW_REQUIRE_OK(h, twSpGEMMFused(h, ffn, X, Y, hidden, ws));
            twFfnStats_t between{};
            if (stats_between) TW_REQUIRE_OK(h, twFfnGetStats(h, ffn, &between));  // blocks: feedback arrives
        }
    }
    FfnResult r;
    TW_REQUIRE_OK(h, twFfnGetStats(h, ffn, &r.stats));
    r.counts.resize(static_cast<size_t>(c.h));
    if (dev) {
        DeviceCopy counts(r.counts.size() * 8);
        TW_REQUIRE_OK(h, twFfnGetNeuronCounts(h, ffn, static_cast<int64_t *>(counts.ptr)));
        r.counts = counts.download<int64_t>(r.counts.size());
        cuda_ok(cudaDeviceSynchronize());
        dy->fetch();
    } else {
        TW_REQUIRE_OK(h, twFfnGetNeuronCounts(h, ffn, r.counts.data()));
    }
    r.y = y.to_double();
    for (int64_t i = 0; i < c.m; ++i)
        for (int64_t k = 0; k < c.d; ++k) r.y_bits.push_back(y.bits(i, k));
    if (hidden) {
        r.hidden_info = info_of(h, hidden);
        if (r.hidden_info.overflowRows == 0 || c.hidden == 2) {
            // a hybrid with rows past its backup capacity cannot be densified; compare counts only
            if (c.hidden == 1 || r.hidden_info.overflowRows <= 3) r.hidden_bits = dense_bits(h, hidden, dev, htype);
        }
    }
    twDestroyFfn(ffn);
    return r;
}

double type_bound(const FfnCase &c) {
    // GPU and CPU sum in different orders; the intermediate roundings of DEFAULT can land one
    // ulp apart, each costing at most about one unit roundoff of the value type, and y itself
    // is rounded: a few u of the value type normwise.
    if (c.type == TW_R_32F) return 2e-5;
    return 8 * unit_roundoff(c.type);
}

void check_against_reference(const FfnCase &c) {
    const FfnData data = make_data(c);
    const FfnResult cpu = run_ffn(c, data, TW_BACKEND_CPU);
    const FfnResult gpu = run_ffn(c, data, TW_BACKEND_CUDA);
    const ErrorReport e = compare(gpu.y, cpu.y, c.d);
    INFO("M " << c.m << " D " << c.d << " H " << c.h << (c.gated ? " gated" : " plain") << " type " << c.type
              << " mode " << c.mode << " profile " << tt::profile_name(c.profile) << ": " << e.worst);
    for (double v : gpu.y) REQUIRE(std::isfinite(v));  // every element written (poisoned with NaN)
    REQUIRE(e.rel <= type_bound(c));
    CHECK(gpu.stats.tokens == cpu.stats.tokens);
    if (c.integers) {
        REQUIRE(gpu.y_bits == cpu.y_bits);
        CHECK(gpu.stats.meanRowNnz == cpu.stats.meanRowNnz);
        CHECK(gpu.stats.maxRowNnz == cpu.stats.maxRowNnz);
        CHECK(gpu.stats.overflowRows == cpu.stats.overflowRows);
        CHECK(gpu.stats.l1 == Approx(cpu.stats.l1).epsilon(1e-6));
        CHECK(gpu.counts == cpu.counts);
        if (c.hidden) {
            CHECK(gpu.hidden_info.nnz == cpu.hidden_info.nnz);
            CHECK(gpu.hidden_info.overflowRows == cpu.hidden_info.overflowRows);
            CHECK(gpu.hidden_bits == cpu.hidden_bits);
        }
    } else {
        // a unit whose pre-activation is within rounding of 0 may differ: counts agree closely
        CHECK(gpu.stats.overflowRows == cpu.stats.overflowRows);
        CHECK(gpu.stats.meanRowNnz == Approx(cpu.stats.meanRowNnz).epsilon(0.01));
        CHECK(gpu.stats.l1 == Approx(cpu.stats.l1).epsilon(0.01));
    }
}

}  // namespace

TEST_CASE("CUDA FFN: small-integer data give bit-identical results", "[cuda][ffn]") {
    for (bool gated : {true, false})
        for (int64_t m : {1, 7, 130})
            for (int hidden : {0, 1, 2}) {
                FfnCase c;
                c.integers = true;
                c.gated = gated;
                c.m = m;
                c.d = 40;
                c.h = 300;
                c.hidden = hidden;
                c.seed = static_cast<uint64_t>(m * 10 + hidden);
                check_against_reference(c);
            }
}

TEST_CASE("CUDA FFN: profiles, types and modes against the reference", "[cuda][ffn]") {
    for (tt::Profile p : {tt::Profile::Uniform, tt::Profile::Heavy, tt::Profile::Llm})
        for (twDataType_t t : {TW_R_16BF, TW_R_16F, TW_R_32F})
            for (twComputeMode_t mode : {TW_COMPUTE_DEFAULT, TW_COMPUTE_HIGHEST_PRECISION})
                for (bool gated : {true, false}) {
                    if (t == TW_R_32F && mode == TW_COMPUTE_HIGHEST_PRECISION) continue;  // same as DEFAULT
                    FfnCase c;
                    c.profile = p;
                    c.type = t;
                    c.mode = mode;
                    c.gated = gated;
                    c.m = 333;
                    c.d = 128;
                    c.h = 600;
                    c.seed = 11;
                    check_against_reference(c);
                }
}

TEST_CASE("CUDA FFN: dense mode (chosen after a dense forward) matches the reference", "[cuda][ffn]") {
    // 150 active units of 600 is far above the gather break-even (H / 128): the second forward
    // runs the up and down projections as cuBLAS GEMMs over every row
    for (bool gated : {true, false})
        for (int hidden : {0, 1, 2}) {
            FfnCase c;
            c.m = 333;
            c.d = 128;
            c.h = 600;
            c.k = 150;
            c.gated = gated;
            c.hidden = hidden;
            c.type = hidden == 0 ? TW_R_16F : TW_R_16BF;
            const FfnData data = make_data(c);
            const FfnResult cpu = run_ffn(c, data, TW_BACKEND_CPU);
            const FfnResult gpu = run_ffn(c, data, TW_BACKEND_CUDA, 2, false, /*stats_between=*/true);
            const ErrorReport e = compare(gpu.y, cpu.y, c.d);
            INFO((gated ? "gated" : "plain") << " hidden " << hidden << ": " << e.worst);
            REQUIRE(e.rel <= type_bound(c));
            CHECK(gpu.stats.overflowRows == cpu.stats.overflowRows);
            CHECK(gpu.stats.meanRowNnz == Approx(cpu.stats.meanRowNnz).epsilon(0.01));
            CHECK(gpu.stats.l1 == Approx(cpu.stats.l1).epsilon(0.01));
            if (hidden) CHECK(gpu.hidden_info.nnz == Approx(cpu.hidden_info.nnz).epsilon(0.01));
        }
    // and the same with small-integer data: bit-identical in dense mode too
    FfnCase c;
    c.integers = true;
    c.m = 100;
    c.d = 40;
    c.h = 300;
    c.hidden = 1;
    const FfnData data = make_data(c);
    const FfnResult cpu = run_ffn(c, data, TW_BACKEND_CPU);
    const FfnResult gpu = run_ffn(c, data, TW_BACKEND_CUDA, 2, false, true);
    REQUIRE(cpu.stats.meanRowNnz > 300.0 / 128);
    REQUIRE(gpu.y_bits == cpu.y_bits);
    // two forwards (sparse, then dense mode) on the GPU, one on the CPU
    for (size_t j = 0; j < cpu.counts.size(); ++j) CHECK(gpu.counts[j] == 2 * cpu.counts[j]);
    CHECK(gpu.hidden_bits == cpu.hidden_bits);
    CHECK(gpu.stats.l1 == Approx(cpu.stats.l1).epsilon(1e-6));
}

TEST_CASE("CUDA FFN: odd shapes and layouts", "[cuda][ffn]") {
    struct Shape {
        int64_t m, d, h;
    };
    for (Shape s : {Shape{1, 64, 256}, Shape{5, 100, 333}, Shape{66, 8, 64}, Shape{257, 264, 1000}, Shape{3, 2100, 700}})
        for (twOrder_t wd : {TW_ORDER_ROW, TW_ORDER_COL})
            for (twOrder_t xo : {TW_ORDER_ROW, TW_ORDER_COL}) {
                FfnCase c;
                c.m = s.m;
                c.d = s.d;
                c.h = s.h;
                c.k = std::min(29.0, s.h / 4.0);
                c.wd_order = wd;
                c.x_order = xo;
                c.x_pad = 3;
                c.profile = tt::Profile::Heavy;
                check_against_reference(c);
            }
}

TEST_CASE("CUDA FFN: heavy rows go through the exact dense path", "[cuda][ffn]") {
    FfnCase c;
    c.m = 400;
    c.d = 256;
    c.h = 1024;
    c.profile = tt::Profile::Heavy;
    c.k = 29;
    const FfnData data = make_data(c);
    const FfnResult cpu = run_ffn(c, data, TW_BACKEND_CPU);
    const FfnResult gpu = run_ffn(c, data, TW_BACKEND_CUDA);
    REQUIRE(cpu.stats.overflowRows >= 4);
    CHECK(gpu.stats.overflowRows == cpu.stats.overflowRows);
    const ErrorReport e = compare(gpu.y, cpu.y, c.d);
    INFO(e.worst);
    REQUIRE(e.rel <= type_bound(c));
    // every unit fires for some heavy rows: the counts agree within near-zero flips
    int64_t diff = 0, total = 0;
    for (size_t j = 0; j < cpu.counts.size(); ++j) diff += std::llabs(cpu.counts[j] - gpu.counts[j]), total += cpu.counts[j];
    CHECK(diff <= total / 100);
}

TEST_CASE("CUDA FFN: heavy rows through cuBLAS, and past the capacity the statistics suggested", "[cuda][ffn]") {
    for (bool gated : {true, false})
        for (int hidden : {0, 1}) {
            FfnCase c;
            c.m = 400;
            c.d = 256;
            c.h = 1024;
            c.profile = tt::Profile::Heavy;
            c.gated = gated;
            c.hidden = hidden;
            tt::ProblemSpec spec;
            spec.tokens = c.m, spec.model_dim = c.d, spec.hidden_dim = c.h, spec.profile = c.profile;
            spec.active_units = c.k, spec.gated = gated, spec.seed = c.seed;
            const tt::FfnProblem prob = tt::make_ffn_problem(spec);
            REQUIRE(!prob.heavy_rows.empty());
            FfnData data{prob.x, prob.w_gate, prob.w_up, prob.w_down};
            // the warm-up forward sees 4 heavy rows of 400 (capacity 128); the measured one 300
            FfnData many = data;
            for (int64_t r = 0; r < 300; ++r) {
                const int64_t src = prob.heavy_rows[static_cast<size_t>(r) % prob.heavy_rows.size()];
                std::copy_n(prob.x.begin() + src * c.d, c.d, many.x.begin() + r * c.d);
            }
            for (const FfnData *d : {&data, &many}) {
                const FfnResult cpu = run_ffn(c, *d, TW_BACKEND_CPU);
                const FfnResult gpu = run_ffn(c, *d, TW_BACKEND_CUDA, 1, false, false, &data.x);
                const ErrorReport e = compare(gpu.y, cpu.y, c.d);
                INFO((gated ? "gated" : "plain") << " hidden " << hidden << " rows " << cpu.stats.overflowRows << ": "
                                                 << e.worst);
                REQUIRE(cpu.stats.overflowRows >= (d == &data ? 4 : 300));
                for (double v : gpu.y) REQUIRE(std::isfinite(v));
                REQUIRE(e.rel <= type_bound(c));
                CHECK(gpu.stats.overflowRows == cpu.stats.overflowRows);
                CHECK(gpu.stats.l1 == Approx(cpu.stats.l1).epsilon(0.01));
                if (hidden) CHECK(gpu.hidden_info.overflowRows == cpu.hidden_info.overflowRows);
            }
        }
}

TEST_CASE("CUDA FFN: deterministic mode and graph capture give identical bits", "[cuda][ffn]") {
    FfnCase c;
    c.m = 300;
    c.d = 128;
    c.h = 700;
    c.profile = tt::Profile::Heavy;
    c.deterministic = 1;
    c.hidden = 2;
    const FfnData data = make_data(c);
    const FfnResult a = run_ffn(c, data, TW_BACKEND_CUDA);
    const FfnResult b = run_ffn(c, data, TW_BACKEND_CUDA, 3);
    const FfnResult g = run_ffn(c, data, TW_BACKEND_CUDA, 2, /*capture=*/true);
    REQUIRE(a.y_bits == b.y_bits);
    REQUIRE(a.y_bits == g.y_bits);
    REQUIRE(a.hidden_bits == g.hidden_bits);
    CHECK(a.stats.l1 == b.stats.l1);
    CHECK(a.stats.overflowRows == g.stats.overflowRows);
    // neuron counts accumulate over the forwards since the last reset
    for (size_t j = 0; j < a.counts.size(); ++j) {
        CHECK(b.counts[j] == 3 * a.counts[j]);
        CHECK(g.counts[j] == 2 * a.counts[j]);
    }
}

TEST_CASE("CUDA FFN: M = 0", "[cuda][ffn]") {
    FfnCase c;
    c.m = 0;
    const FfnData data = make_data(c);
    const FfnResult r = run_ffn(c, data, TW_BACKEND_CUDA);
    CHECK(r.y.empty());
    CHECK(r.stats.tokens == 0);
}

TEST_CASE("CUDA building blocks match the reference", "[cuda][blocks]") {
    std::mt19937_64 rng(5);
    std::uniform_int_distribution<int> small(-2, 2);
    const int64_t m = 37, k = 24, n = 300;
    Dense a(m, k, TW_R_16BF), b(n, k, TW_R_16BF, TW_ORDER_COL);
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < k; ++j) a.set(i, j, static_cast<float>(small(rng)));
    for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < k; ++j) b.set(i, j, static_cast<float>(small(rng)));
    Handle cpu(TW_BACKEND_CPU), gpu(TW_BACKEND_CUDA);
    DeviceDense da(a), db(b);

    SECTION("GemmToSparse into TwELL and hybrid (exact: integer sums)") {
        for (int fmt : {1, 2})
            for (twConvertOp_t op : {TW_CONVERT_RELU, TW_CONVERT_PLAIN}) {
                auto hc = fmt == 1 ? Sparse::twell(m, n, TW_R_16BF, 64, 4) : Sparse::hybrid(m, n, 16, m, TW_R_16BF);
                auto dc = fmt == 1 ? DeviceSparse::twell(m, n, TW_R_16BF, 64, 4) : DeviceSparse::hybrid(m, n, 16, m, TW_R_16BF);
                size_t hb = 0, db_bytes = 0;
                TW_REQUIRE_OK(cpu, twGemmToSparse_bufferSize(cpu, a, b, *hc, op, &hb));
                TW_REQUIRE_OK(gpu, twGemmToSparse_bufferSize(gpu, da, db, *dc, op, &db_bytes));
                std::vector<uint8_t> hws(std::max<size_t>(hb, 1));
                DeviceCopy dws(db_bytes);
                TW_REQUIRE_OK(cpu, twGemmToSparse(cpu, 0.5f, a, b, *hc, op, hws.data()));
                TW_REQUIRE_OK(gpu, twGemmToSparse(gpu, 0.5f, da, db, *dc, op, dws.ptr));
                const twSpMatInfo_t ic = info_of(cpu, *hc), ig = info_of(gpu, *dc);
                CHECK(ic.nnz == ig.nnz);
                CHECK(ic.overflowRows == ig.overflowRows);
                CHECK(ic.maxRowNnz == ig.maxRowNnz);
                TW_REQUIRE_OK(gpu, twSpMatValidate(gpu, *dc));
                if (ic.overflowRows == 0 || fmt == 2) {
                    REQUIRE(dense_bits(cpu, *hc, false, TW_R_16BF) == dense_bits(gpu, *dc, true, TW_R_16BF));
                }
            }
    }
    SECTION("DenseToSparse and SpMM") {
        Dense s(m, n, TW_R_16BF), w(n, 50, TW_R_16BF), y(m, 50, TW_R_16BF);
        std::bernoulli_distribution keep(0.05);
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) s.set(i, j, keep(rng) ? static_cast<float>(small(rng)) : 0.0f);
        for (int64_t i = 0; i < n; ++i)
            for (int64_t j = 0; j < 50; ++j) w.set(i, j, static_cast<float>(small(rng)));
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < 50; ++j) y.set(i, j, static_cast<float>(small(rng)));
        DeviceDense ds(s), dw(w), dy(y);
        for (int fmt : {1, 2}) {
            auto hc = fmt == 1 ? Sparse::twell(m, n, TW_R_16BF) : Sparse::hybrid(m, n, 8, m, TW_R_16BF);
            auto dc = fmt == 1 ? DeviceSparse::twell(m, n, TW_R_16BF) : DeviceSparse::hybrid(m, n, 8, m, TW_R_16BF);
            size_t hb = 0, gb = 0;
            TW_REQUIRE_OK(cpu, twDenseToSparse_bufferSize(cpu, s, *hc, TW_CONVERT_PLAIN, &hb));
            TW_REQUIRE_OK(gpu, twDenseToSparse_bufferSize(gpu, ds, *dc, TW_CONVERT_PLAIN, &gb));
            std::vector<uint8_t> hws(std::max<size_t>(hb, 1));
            DeviceCopy gws(gb);
            TW_REQUIRE_OK(cpu, twDenseToSparse_analysis(cpu, s, *hc, TW_CONVERT_PLAIN, hws.data()));
            TW_REQUIRE_OK(cpu, twDenseToSparse_convert(cpu, s, *hc, TW_CONVERT_PLAIN, hws.data()));
            TW_REQUIRE_OK(gpu, twDenseToSparse_analysis(gpu, ds, *dc, TW_CONVERT_PLAIN, gws.ptr));
            TW_REQUIRE_OK(gpu, twDenseToSparse_convert(gpu, ds, *dc, TW_CONVERT_PLAIN, gws.ptr));
            REQUIRE(dense_bits(cpu, *hc, false, TW_R_16BF) == dense_bits(gpu, *dc, true, TW_R_16BF));

            Dense yc(m, 50, TW_R_16BF), yg(m, 50, TW_R_16BF);
            for (int64_t i = 0; i < m; ++i)
                for (int64_t j = 0; j < 50; ++j) yc.set(i, j, y.get(i, j)), yg.set(i, j, y.get(i, j));
            DeviceDense dyg(yg);
            TW_REQUIRE_OK(cpu, twSpMM(cpu, 2.0f, *hc, w, -1.0f, yc, nullptr));
            DeviceCopy sws(64);
            TW_REQUIRE_OK(gpu, twSpMM(gpu, 2.0f, *dc, dw, -1.0f, dyg, sws.ptr));
            dyg.fetch();
            REQUIRE(yc.to_double() == yg.to_double());  // integer data: exact
        }
    }
}
