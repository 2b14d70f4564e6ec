// Fuzzer (c): the fused forward (twSpGEMMFused, with a TwELL or hybrid hidden output or none),
// the training forward and the backward on tiny shapes decoded from the input (ffn_support.hpp;
// values include NaN, +-Inf and -0 when the input asks), against an fp64 oracle.
//
// The semantics checked (src/host/reference/ffn.cpp, twblas.h):
//  - z = X Ws^T (Ws: Wgate when gated, else Wup); g = z rounded to the value type (DEFAULT) or
//    not (HIGHEST_PRECISION). Unit j is active for token t when g > 0 or g is NaN (ReLU passes
//    NaN, as torch.relu does); -0, +0, negative and -Inf are inactive.
//  - an inactive unit contributes an exact zero everywhere, even when its u, Wup or Wdown row
//    holds Inf or NaN; an output with no contribution is exactly 0.
//  - h = round(g * round(x . Wup_j)) (gated) or g; y_t = sum over active j of h_j Wdown_j.
//  - backward: dh = round(round(dY_t . Wdown_j) + l1/M sign(h)); gated: du = round(dh g),
//    dz = round(dh u); plain: dz = dh; dX_t = sum du Wup_j + dz Wgate_j (plain: dz Wup_j);
//    dWs_j = sum_t dz X_t, dWup_j = sum_t du X_t (gated), dWdown_j = sum_t h dY_t.
// With the data of ffn_support.hpp every dot product over D is exact in fp32, so g, u, h, dh,
// du and dz are known exactly (each a correctly rounded fp32 product, then rounded as the mode
// says). What is checked against a bound is the fp32 accumulation of the n products of one
// output and its final rounding to the value type:
//     |got - ref| <= 2 ((n + 3) 2^-24 sum |terms| + u_type (|ref| + (n + 3) 2^-24 sum |terms|))
//                    + the type's smallest subnormal,
// u_type = 2^-8 (bf16), 2^-11 (fp16), 0 (fp32). A NaN reference must give NaN, an infinite
// one the same infinity (the classification of a sum of IEEE terms does not depend on the
// order); a reference within the bound of the type's largest finite may also give that
// infinity. Counts, statistics (l1 within 4 2^-24 relative) and the hidden container's bits are
// checked exactly. Every output is checked fully written: two runs over different poisons agree.
#include "ffn_support.hpp"

namespace {

using namespace twfuzz;

double unit_roundoff(twDataType_t t) {
    return t == TW_R_32F ? 0.0 : t == TW_R_16F ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
}
double max_finite(twDataType_t t) {
    return t == TW_R_32F ? 3.4028234663852886e38 : t == TW_R_16F ? 65504.0 : 3.3895313892515355e38;
}
double denorm_min(twDataType_t t) {
    return t == TW_R_32F ? std::ldexp(1.0, -149) : t == TW_R_16F ? std::ldexp(1.0, -24) : std::ldexp(1.0, -133);
}

/// One output's reference: the sum of its terms in fp64, the sum of their magnitudes, and how
/// many there are.
struct Ref {
    double sum = 0.0, mag = 0.0;
    int64_t n = 0;
    void add(double term) {
        sum += term;
        mag += std::fabs(term);
        ++n;
    }
};

void check_value(const char *what, int64_t r, int64_t c, double got, const Ref &ref, twDataType_t type) {
    const long long rr = r, cc = c;
    if (ref.n == 0) {
        TWFUZZ_CHECK(got == 0.0, "%s (%lld, %lld): %g, but no active unit contributes: expected 0", what, rr, cc, got);
        return;
    }
    if (std::isnan(ref.sum)) {
        TWFUZZ_CHECK(std::isnan(got), "%s (%lld, %lld): %g, expected NaN", what, rr, cc, got);
        return;
    }
    if (std::isinf(ref.sum)) {
        TWFUZZ_CHECK(got == ref.sum, "%s (%lld, %lld): %g, expected %g", what, rr, cc, got, ref.sum);
        return;
    }
    const double acc = static_cast<double>(ref.n + 3) * std::ldexp(1.0, -24) * ref.mag;
    const double bound = 2 * (acc + unit_roundoff(type) * (std::fabs(ref.sum) + acc)) + denorm_min(type);
    if (std::isinf(got) && std::fabs(ref.sum) + bound >= max_finite(type) && std::signbit(got) == std::signbit(ref.sum))
        return;  // rounded past the type's largest finite
    TWFUZZ_CHECK(std::isfinite(got) && std::fabs(got - ref.sum) <= bound,
                 "%s (%lld, %lld): %.9g, expected %.9g within %g (%lld terms, sum of magnitudes %g)", what, rr, cc, got,
                 ref.sum, bound, static_cast<long long>(ref.n), ref.mag);
}

/// The forward as the semantics say, with the exact g, u and h of every active unit.
struct Oracle {
    const FfnCase &c;
    std::vector<std::vector<int32_t>> active;  // per token, ascending
    std::vector<std::vector<float>> g, u, h;
    std::vector<Ref> y;
    std::vector<int64_t> counts;
    twFfnStats_t stats{0, 0.0, 0, 0, 0.0};
    bool l1_nan = false, l1_inf = false;

    float rnd(float v) const { return c.highest ? v : twblas::round_to(c.type, v); }

    explicit Oracle(const FfnCase &cs)
        : c(cs), active(static_cast<size_t>(cs.m)), g(active.size()), u(active.size()), h(active.size()),
          y(static_cast<size_t>(cs.m * cs.d)), counts(static_cast<size_t>(cs.h), 0) {
        const std::vector<float> &ws = c.gated ? c.wg : c.wu;
        int64_t total = 0;
        double l1 = 0.0;
        const int64_t slots = c.tile / c.compression - 1;
        for (int64_t t = 0; t < c.m; ++t) {
            const float *x = c.x.data() + t * c.d;
            int64_t tile = -1, in_tile = 0;
            bool overflow = false;
            for (int64_t j = 0; j < c.h; ++j) {
                double zs = 0.0;
                for (int64_t k = 0; k < c.d; ++k) zs += static_cast<double>(x[k]) * ws[static_cast<size_t>(j * c.d + k)];
                const float gj = rnd(static_cast<float>(zs));
                if (!(gj > 0.0f) && !std::isnan(gj)) continue;
                float uj = 0.0f, hj = gj;
                if (c.gated) {
                    double us = 0.0;
                    for (int64_t k = 0; k < c.d; ++k) us += static_cast<double>(x[k]) * c.wu[static_cast<size_t>(j * c.d + k)];
                    uj = rnd(static_cast<float>(us));
                    hj = rnd(static_cast<float>(static_cast<double>(gj) * uj));  // fp32 product, correctly rounded
                }
                active[t].push_back(static_cast<int32_t>(j));
                g[t].push_back(gj);
                u[t].push_back(uj);
                h[t].push_back(hj);
                ++counts[static_cast<size_t>(j)];
                l1 += std::fabs(static_cast<double>(hj));
                const int64_t tj = j / c.tile;
                in_tile = tj == tile ? in_tile + 1 : 1;
                tile = tj;
                overflow |= in_tile > slots;
                for (int64_t k = 0; k < c.d; ++k)
                    y[static_cast<size_t>(t * c.d + k)].add(static_cast<double>(hj) * c.wd[static_cast<size_t>(j * c.d + k)]);
            }
            const int64_t n = static_cast<int64_t>(active[t].size());
            total += n;
            stats.maxRowNnz = std::max(stats.maxRowNnz, n);
            stats.overflowRows += overflow;
        }
        stats.tokens = c.m;
        stats.meanRowNnz = c.m ? static_cast<double>(total) / static_cast<double>(c.m) : 0.0;
        stats.l1 = c.m ? l1 / static_cast<double>(c.m) : 0.0;
    }

    void check_y(const Dense &got, const char *what) const {
        for (int64_t t = 0; t < c.m; ++t)
            for (int64_t k = 0; k < c.d; ++k)
                check_value(what, t, k, got.get(static_cast<size_t>(t * c.d + k)), y[static_cast<size_t>(t * c.d + k)], c.type);
    }

    void check_stats(const twFfnStats_t &s, const char *what) const {
        TWFUZZ_CHECK(s.tokens == stats.tokens && s.maxRowNnz == stats.maxRowNnz && s.overflowRows == stats.overflowRows &&
                         s.meanRowNnz == stats.meanRowNnz,
                     "%s statistics: tokens %lld mean %g max %lld overflow %lld, expected %lld %g %lld %lld", what,
                     static_cast<long long>(s.tokens), s.meanRowNnz, static_cast<long long>(s.maxRowNnz),
                     static_cast<long long>(s.overflowRows), static_cast<long long>(stats.tokens), stats.meanRowNnz,
                     static_cast<long long>(stats.maxRowNnz), static_cast<long long>(stats.overflowRows));
        if (std::isnan(stats.l1) || std::isinf(stats.l1)) {
            TWFUZZ_CHECK(std::isnan(stats.l1) ? std::isnan(s.l1) : s.l1 == stats.l1, "%s statistics: l1 %g, expected %g",
                         what, s.l1, stats.l1);
        } else {
            TWFUZZ_CHECK(std::fabs(s.l1 - stats.l1) <= 4 * std::ldexp(1.0, -24) * stats.l1,
                         "%s statistics: l1 %.17g, expected %.17g", what, s.l1, stats.l1);
        }
    }

    /// The hidden output's matrix: h rounded to the container's type where its bits are not +0.
    void check_hidden(FfnSetup &s, const Sparse &hidden) const {
        TWFUZZ_CHECK(twSpMatValidate(s.h, hidden) == TW_STATUS_SUCCESS, "the forward wrote an invalid hidden container: %s",
                     twGetErrorMessage(s.h));
        twSpMatInfo_t info{};
        TWFUZZ_CHECK(twSpMatGetInfo(s.h, hidden, &info) == TW_STATUS_SUCCESS, "twSpMatGetInfo(hidden)");
        std::vector<uint32_t> want(static_cast<size_t>(c.m * c.h), 0);
        int64_t overflow = 0;
        for (int64_t t = 0; t < c.m; ++t) {
            int64_t tile = -1, in_tile = 0, stored = 0;
            bool over = false;
            for (size_t i = 0; i < active[t].size(); ++i) {
                const int32_t j = active[t][i];
                const float hv = h[t][i];
                const uint32_t b = hidden.type == TW_R_32F ? twblas::float_bits(hv) : twblas::bits16_of(hidden.type, hv);
                if (b == 0) continue;  // rounds to +0: not stored
                want[static_cast<size_t>(t * c.h + j)] = b;
                ++stored;
                const int64_t tj = hidden.format == TW_FORMAT_TWELL ? j / hidden.tile : 0;
                in_tile = tj == tile ? in_tile + 1 : 1;
                tile = tj;
                over |= hidden.format == TW_FORMAT_TWELL && in_tile > hidden.tile / hidden.compression - 1;
            }
            overflow += hidden.format == TW_FORMAT_TWELL ? over : stored > hidden.ell_width;
        }
        TWFUZZ_CHECK(info.overflowRows == overflow, "hidden: overflowRows %lld, expected %lld",
                     static_cast<long long>(info.overflowRows), static_cast<long long>(overflow));
        if (hidden.incomplete(info)) return;
        std::vector<uint32_t> got;
        TWFUZZ_CHECK(to_dense(s.h, hidden, got) == TW_STATUS_SUCCESS, "twSparseToDense(hidden): %s", twGetErrorMessage(s.h));
        for (size_t i = 0; i < want.size(); ++i) {
            const float gv = hidden.type == TW_R_32F ? twblas::bits_float(got[i])
                                                     : twblas::value_of_bits16(hidden.type, static_cast<uint16_t>(got[i]));
            const float wv = hidden.type == TW_R_32F ? twblas::bits_float(want[i])
                                                     : twblas::value_of_bits16(hidden.type, static_cast<uint16_t>(want[i]));
            const bool same = std::isnan(wv) ? std::isnan(gv) : got[i] == want[i];
            TWFUZZ_CHECK(same, "hidden (%lld, %lld): bits 0x%x, expected 0x%x", static_cast<long long>(i / c.h),
                         static_cast<long long>(i % c.h), got[i], want[i]);
        }
    }

    void check_backward(const Grads &got) const {
        const float l1s = c.m > 0 ? c.l1 / static_cast<float>(c.m) : 0.0f;
        std::vector<Ref> dx(static_cast<size_t>(c.m * c.d)), dws(static_cast<size_t>(c.h * c.d)),
            dwu(static_cast<size_t>(c.h * c.d)), dwd(static_cast<size_t>(c.h * c.d));
        const std::vector<float> &ws = c.gated ? c.wg : c.wu;
        for (int64_t t = 0; t < c.m; ++t)
            for (size_t i = 0; i < active[t].size(); ++i) {
                const int64_t j = active[t][i];
                const float hv = h[t][i];
                double dot = 0.0;
                for (int64_t k = 0; k < c.d; ++k)
                    dot += static_cast<double>(c.dy[static_cast<size_t>(t * c.d + k)]) * c.wd[static_cast<size_t>(j * c.d + k)];
                // l1 / M is a multiple of 1/64 and the rounded dot product one of 2^-12 below 2^7:
                // their fp32 sum is exact, as is the one in fp64
                const float sgn = static_cast<float>((hv > 0.0f) - (hv < 0.0f));
                const float dh = rnd(rnd(static_cast<float>(dot)) + l1s * sgn);
                float du = 0.0f, dz = dh;
                if (c.gated) {
                    du = rnd(static_cast<float>(static_cast<double>(dh) * g[t][i]));
                    dz = rnd(static_cast<float>(static_cast<double>(dh) * u[t][i]));
                }
                for (int64_t k = 0; k < c.d; ++k) {
                    const size_t tk = static_cast<size_t>(t * c.d + k), jk = static_cast<size_t>(j * c.d + k);
                    const double xk = c.x[tk];
                    if (c.gated) {
                        dx[tk].add(static_cast<double>(du) * c.wu[jk]);
                        dx[tk].add(static_cast<double>(dz) * c.wg[jk]);
                        dwu[jk].add(du * xk);
                    } else {
                        dx[tk].add(static_cast<double>(dz) * c.wu[jk]);
                    }
                    dws[jk].add(dz * xk);
                    dwd[jk].add(static_cast<double>(hv) * c.dy[tk]);
                }
            }
        for (int64_t t = 0; t < c.m; ++t)
            for (int64_t k = 0; k < c.d; ++k)
                check_value("dX", t, k, got.dx.get(static_cast<size_t>(t * c.d + k)), dx[static_cast<size_t>(t * c.d + k)], c.type);
        const Dense &dws_got = c.gated ? *got.dwg : got.dwu;
        for (int64_t j = 0; j < c.h; ++j)
            for (int64_t k = 0; k < c.d; ++k) {
                const size_t jk = static_cast<size_t>(j * c.d + k);
                check_value(c.gated ? "dWgate" : "dWup", j, k, dws_got.get(jk), dws[jk], c.type);
                if (c.gated) check_value("dWup", j, k, got.dwu.get(jk), dwu[jk], c.type);
                check_value("dWdown", j, k, got.dwd.get(jk), dwd[jk], c.type);
            }
        (void)ws;
    }
};

bool same_stats(const twFfnStats_t &a, const twFfnStats_t &b) {
    return a.tokens == b.tokens && a.maxRowNnz == b.maxRowNnz && a.overflowRows == b.overflowRows &&
           a.meanRowNnz == b.meanRowNnz && (a.l1 == b.l1 || (std::isnan(a.l1) && std::isnan(b.l1)));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Input in(data, size);
    const FfnCase c = FfnCase::decode(in, true);
    const Oracle oracle(c);
    if (verbose()) {
        int64_t total = 0, dense_rows = 0;
        for (const auto &a : oracle.active) {
            total += static_cast<int64_t>(a.size());
            dense_rows += a.size() > 128;
        }
        std::fprintf(stderr, "twfuzz: %s type %d %s M %lld D %lld H %lld%s: %lld active, %lld rows over 128\n",
                     c.gated ? "gated" : "plain", static_cast<int>(c.type), c.highest ? "highest" : "default",
                     static_cast<long long>(c.m), static_cast<long long>(c.d), static_cast<long long>(c.h),
                     c.specials ? " specials" : "", static_cast<long long>(total), static_cast<long long>(dense_rows));
    }
    FfnSetup s(c);
    const twHandle_t h = s.h;

    // the hidden output: none, TwELL (16-bit values) or a hybrid that holds every row
    std::unique_ptr<Sparse> hidden;
    const int hidden_kind = c.flags % 3;
    const twDataType_t htype = c.type == TW_R_32F && hidden_kind == 1 ? TW_R_16BF : c.type;
    if (hidden_kind == 1) hidden = std::make_unique<Sparse>(c.m, c.h, htype, c.tile, c.compression);
    if (hidden_kind == 2) hidden = std::make_unique<Sparse>(c.m, c.h, htype, 8, c.m, true);

    // inference forward, twice over different poisons of Y
    Bytes ws(s.forward_workspace());
    void *wsp = ws.size() ? ws.data() : nullptr;
    s.y.poison(0x7f);
    twStatus_t st = twSpGEMMFused(h, s.ffn, s.x, s.y, hidden ? hidden->d : nullptr, wsp);
    TWFUZZ_CHECK(st == TW_STATUS_SUCCESS, "twSpGEMMFused: %s: %s", status_name(st), twGetErrorMessage(h));
    const std::vector<uint32_t> y1 = s.y.all_bits();
    s.y.poison(0x3c);
    st = twSpGEMMFused(h, s.ffn, s.x, s.y, hidden ? hidden->d : nullptr, wsp);
    TWFUZZ_CHECK(st == TW_STATUS_SUCCESS, "twSpGEMMFused: %s: %s", status_name(st), twGetErrorMessage(h));
    TWFUZZ_CHECK(s.y.all_bits() == y1, "twSpGEMMFused left elements of Y unwritten (or is not deterministic)");
    oracle.check_y(s.y, "Y");
    twFfnStats_t stats{};
    TWFUZZ_CHECK(twFfnGetStats(h, s.ffn, &stats) == TW_STATUS_SUCCESS, "twFfnGetStats");
    if (c.m > 0) oracle.check_stats(stats, "forward");
    std::vector<int64_t> counts(static_cast<size_t>(c.h), -1);
    TWFUZZ_CHECK(twFfnGetNeuronCounts(h, s.ffn, counts.data()) == TW_STATUS_SUCCESS, "twFfnGetNeuronCounts");
    for (int64_t j = 0; j < c.h; ++j)
        TWFUZZ_CHECK(counts[static_cast<size_t>(j)] == 2 * oracle.counts[static_cast<size_t>(j)],
                     "neuron count of unit %lld: %lld after two forwards, expected %lld", static_cast<long long>(j),
                     static_cast<long long>(counts[static_cast<size_t>(j)]),
                     static_cast<long long>(2 * oracle.counts[static_cast<size_t>(j)]));
    // M = 0: twSpGEMMFused returns before touching `hidden` (bindings/c/api_ffn.cpp), whose
    // buffer then keeps whatever it held; only containers of a real forward are checked
    if (hidden && c.m > 0) oracle.check_hidden(s, *hidden);

    // training forward (same Y, statistics and counts) and the backward, twice each
    TWFUZZ_CHECK(twFfnResetNeuronCounts(h, s.ffn) == TW_STATUS_SUCCESS, "twFfnResetNeuronCounts");
    Bytes saved(s.saved_bytes());
    s.y.poison(0x7f);
    st = twSpGEMMFusedForwardTrain(h, s.ffn, s.x, s.y, saved.data(), wsp);
    TWFUZZ_CHECK(st == TW_STATUS_SUCCESS, "twSpGEMMFusedForwardTrain: %s: %s", status_name(st), twGetErrorMessage(h));
    TWFUZZ_CHECK(s.y.all_bits() == y1, "twSpGEMMFusedForwardTrain: Y differs from twSpGEMMFused's");
    twFfnStats_t train_stats{};
    TWFUZZ_CHECK(twFfnGetStats(h, s.ffn, &train_stats) == TW_STATUS_SUCCESS, "twFfnGetStats");
    if (c.m > 0) TWFUZZ_CHECK(same_stats(train_stats, stats), "twSpGEMMFusedForwardTrain: other statistics");
    TWFUZZ_CHECK(twFfnGetNeuronCounts(h, s.ffn, counts.data()) == TW_STATUS_SUCCESS, "twFfnGetNeuronCounts");
    TWFUZZ_CHECK(counts == oracle.counts, "twSpGEMMFusedForwardTrain: neuron counts differ");

    Bytes wsb(s.backward_workspace());
    void *wsbp = wsb.size() ? wsb.data() : nullptr;
    const std::vector<uint8_t> saved_before = saved.copy();
    Grads a(c), b(c);
    a.poison(0x7f);
    b.poison(0x3c);
    st = a.run(s, saved.data(), wsbp);
    TWFUZZ_CHECK(st == TW_STATUS_SUCCESS, "twSpGEMMFusedBackward: %s: %s", status_name(st), twGetErrorMessage(h));
    st = b.run(s, saved.data(), wsbp);
    TWFUZZ_CHECK(st == TW_STATUS_SUCCESS, "twSpGEMMFusedBackward: %s: %s", status_name(st), twGetErrorMessage(h));
    TWFUZZ_CHECK(a.bytes() == b.bytes(), "twSpGEMMFusedBackward left outputs unwritten (or is not deterministic)");
    TWFUZZ_CHECK(saved.equals(saved_before), "twSpGEMMFusedBackward wrote into the saved state");
    oracle.check_backward(a);
    return 0;
}
