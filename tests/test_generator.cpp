// The seeded problem generator (src/testing/problem.hpp): determinism, the profiles' statistics,
// bf16 exactness, parsing, edge sizes.
#include <catch2/catch.hpp>

#include "testing/problem.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

using twblas::testing::ActivationStats;
using twblas::testing::describe;
using twblas::testing::FfnProblem;
using twblas::testing::make_ffn_problem;
using twblas::testing::make_units_hot;
using twblas::testing::measure_activations;
using twblas::testing::parse_profile;
using twblas::testing::ProblemSpec;
using twblas::testing::Profile;
using twblas::testing::profile_name;
using twblas::testing::to_bf16;

namespace {

ProblemSpec small_spec(Profile profile, int64_t tokens, int64_t d, int64_t h, uint64_t seed = 7) {
    ProblemSpec s;
    s.tokens = tokens;
    s.model_dim = d;
    s.hidden_dim = h;
    s.profile = profile;
    s.active_units = 29;
    s.seed = seed;
    return s;
}

// Active units of one token, computed directly (fp32 accumulation like measure_activations).
int64_t row_active(const FfnProblem &p, int64_t row) {
    const int64_t d = p.spec.model_dim, h = p.spec.hidden_dim;
    const std::vector<float> &s = p.spec.gated ? p.w_gate : p.w_up;
    const float *x = p.x.data() + row * d;
    int64_t n = 0;
    for (int64_t j = 0; j < h; ++j) {
        const float *w = s.data() + j * d;
        float acc = 0;
        for (int64_t c = 0; c < d; ++c) acc += x[c] * w[c];
        n += acc > 0.0f;
    }
    return n;
}

// The problem restricted to rows [r0, r1) (same weights).
FfnProblem row_slice(const FfnProblem &p, int64_t r0, int64_t r1) {
    FfnProblem q = p;
    const int64_t d = p.spec.model_dim;
    q.x.assign(p.x.begin() + r0 * d, p.x.begin() + r1 * d);
    q.spec.tokens = r1 - r0;
    q.heavy_rows.clear();
    return q;
}

bool bf16_exact(const std::vector<float> &v) {
    const std::vector<uint16_t> bits = to_bf16(v);
    for (size_t i = 0; i < v.size(); ++i) {
        const uint32_t b = static_cast<uint32_t>(bits[i]) << 16;
        float back;
        std::memcpy(&back, &b, sizeof back);
        if (back != v[i]) return false;
    }
    return true;
}

float from_bits(uint32_t b) {
    float f;
    std::memcpy(&f, &b, sizeof f);
    return f;
}

}  // namespace

TEST_CASE("generator: the same seed gives the same data, another seed other data", "[generator]") {
    for (Profile profile : {Profile::Uniform, Profile::Heavy, Profile::Llm}) {
        CAPTURE(profile_name(profile));
        const ProblemSpec spec = small_spec(profile, 200, 96, 640, 11);
        const FfnProblem a = make_ffn_problem(spec);
        const FfnProblem b = make_ffn_problem(spec);
        CHECK(a.x == b.x);
        CHECK(a.w_gate == b.w_gate);
        CHECK(a.w_up == b.w_up);
        CHECK(a.w_down == b.w_down);
        CHECK(a.heavy_rows == b.heavy_rows);

        ProblemSpec other = spec;
        other.seed = 12;
        const FfnProblem c = make_ffn_problem(other);
        CHECK(a.x != c.x);
        CHECK(a.w_gate != c.w_gate);
        CHECK(a.w_up != c.w_up);
        CHECK(a.w_down != c.w_down);
    }
}

TEST_CASE("generator: shapes and scales", "[generator]") {
    const ProblemSpec spec = small_spec(Profile::Uniform, 64, 128, 512);
    const FfnProblem p = make_ffn_problem(spec);
    REQUIRE(p.x.size() == 64u * 128u);
    REQUIRE(p.w_gate.size() == 512u * 128u);
    REQUIRE(p.w_up.size() == 512u * 128u);
    REQUIRE(p.w_down.size() == 512u * 128u);
    CHECK(p.heavy_rows.empty());
    auto rms = [](const std::vector<float> &v) {
        double s = 0;
        for (float f : v) s += static_cast<double>(f) * f;
        return std::sqrt(s / static_cast<double>(v.size()));
    };
    CHECK(rms(p.w_up) == Approx(1.0 / std::sqrt(128.0)).epsilon(0.03));
    CHECK(rms(p.w_down) == Approx(1.0 / std::sqrt(512.0)).epsilon(0.03));
    CHECK(rms(p.x) == Approx(1.0).epsilon(0.05));
}

TEST_CASE("generator: uniform-29 gives about 29 active units per token", "[generator]") {
    const FfnProblem p = make_ffn_problem(small_spec(Profile::Uniform, 512, 512, 5632));
    const ActivationStats s = measure_activations(p);
    INFO(describe(s));
    CHECK(s.tokens == 512);
    CHECK(s.mean_row_nnz == Approx(29).epsilon(0.15));
    CHECK(s.p99_row_nnz >= s.mean_row_nnz);
    CHECK(s.max_row_nnz >= s.p99_row_nnz);
    CHECK(s.max_row_nnz < 100);
    CHECK(s.max_tile_nnz <= s.max_row_nnz);
    CHECK(s.max_tile_nnz > 0);
    CHECK(s.rows_over_tile_capacity == 0);
    CHECK(s.dead_units < 5632);

    // Larger k (bisection on erfc well away from the tail).
    ProblemSpec wide = small_spec(Profile::Uniform, 128, 256, 5632);
    wide.active_units = 911;
    const ActivationStats w = measure_activations(make_ffn_problem(wide));
    INFO(describe(w));
    CHECK(w.mean_row_nnz == Approx(911).epsilon(0.1));
    CHECK(w.rows_over_tile_capacity == 128);
}

TEST_CASE("generator: make_units_hot makes units fire on most tokens", "[generator]") {
    FfnProblem p = make_ffn_problem(small_spec(Profile::Uniform, 200, 64, 600));
    const double before = measure_activations(p).mean_row_nnz;
    make_units_hot(p.w_gate, 600, 64, 4);  // units 0, 150, 300, 450
    const std::vector<float> &w = p.w_gate;
    for (int64_t j : {0, 150, 300, 450}) {
        int64_t fired = 0;
        for (int64_t t = 0; t < 200; ++t) {
            float acc = 0;
            for (int64_t c = 0; c < 64; ++c) acc += p.x[t * 64 + c] * w[j * 64 + c];
            fired += acc > 0.0f;
        }
        INFO("unit " << j);
        CHECK(fired > 180);  // about 1 - k / H of them: 95 % here
    }
    CHECK(measure_activations(p).mean_row_nnz > before + 3.0);  // 4 x (0.95 - 0.05) expected
    CHECK_THROWS_AS(make_units_hot(p.w_gate, 600, 64, 601), std::invalid_argument);
    CHECK_THROWS_AS(make_units_hot(p.w_gate, 600, 63, 4), std::invalid_argument);
}

TEST_CASE("generator: heavy rows are dense and listed", "[generator]") {
    const FfnProblem p = make_ffn_problem(small_spec(Profile::Heavy, 512, 512, 5632));
    REQUIRE(p.heavy_rows.size() == 5u);  // round(1 % of 512)
    CHECK(std::is_sorted(p.heavy_rows.begin(), p.heavy_rows.end()));
    CHECK(std::adjacent_find(p.heavy_rows.begin(), p.heavy_rows.end()) == p.heavy_rows.end());
    for (int64_t r : p.heavy_rows) {
        CAPTURE(r);
        REQUIRE(r >= 0);
        REQUIRE(r < 512);
        CHECK(row_active(p, r) > 500);
    }
    const ActivationStats s = measure_activations(p);
    INFO(describe(s));
    CHECK(s.max_row_nnz > 500);
    CHECK(s.rows_over_tile_capacity >= 5);
    // A light row is light.
    int64_t light = 0;
    while (std::find(p.heavy_rows.begin(), p.heavy_rows.end(), light) != p.heavy_rows.end()) ++light;
    CHECK(row_active(p, light) < 120);

    // At least one heavy row however few tokens; none without the fraction.
    ProblemSpec one = small_spec(Profile::Heavy, 3, 64, 256);
    CHECK(make_ffn_problem(one).heavy_rows.size() == 1u);
    one.heavy_fraction = 0;
    CHECK(make_ffn_problem(one).heavy_rows.empty());
}

TEST_CASE("generator: llm profile has 30 % dead units, denser first tokens, mean near k", "[generator]") {
    const int64_t h = 2048;
    const FfnProblem p = make_ffn_problem(small_spec(Profile::Llm, 2048, 256, h));
    CHECK(p.heavy_rows.empty());
    const ActivationStats s = measure_activations(p);
    INFO(describe(s));
    CHECK(s.mean_row_nnz == Approx(29).epsilon(0.15));
    // 30 % dead by construction, plus the few coldest live units that happen not to fire.
    CHECK(s.dead_units >= static_cast<int64_t>(0.29 * h));
    CHECK(s.dead_units <= static_cast<int64_t>(0.36 * h));

    const ActivationStats first = measure_activations(row_slice(p, 0, 16));
    const ActivationStats late = measure_activations(row_slice(p, 1024, 1280));
    INFO("first tokens: " << describe(first));
    INFO("late tokens: " << describe(late));
    CHECK(first.mean_row_nnz > 2 * late.mean_row_nnz);

    // Hot and cold units: the per-unit counts over all tokens differ widely.
    std::vector<int64_t> unit_count(static_cast<size_t>(h), 0);
    {
        const int64_t d = 256;
        std::vector<float> wt(static_cast<size_t>(h * d));  // w_gate transposed: d x h
        for (int64_t j = 0; j < h; ++j)
            for (int64_t c = 0; c < d; ++c) wt[static_cast<size_t>(c * h + j)] = p.w_gate[static_cast<size_t>(j * d + c)];
        std::vector<float> acc(static_cast<size_t>(h));
        for (int64_t i = 0; i < 2048; i += 8) {  // every 8th token is enough
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (int64_t c = 0; c < d; ++c) {
                const float xc = p.x[static_cast<size_t>(i * d + c)];
                const float *w = wt.data() + c * h;
                for (int64_t j = 0; j < h; ++j) acc[static_cast<size_t>(j)] += xc * w[j];
            }
            for (int64_t j = 0; j < h; ++j) unit_count[static_cast<size_t>(j)] += acc[static_cast<size_t>(j)] > 0.0f;
        }
    }
    std::vector<int64_t> live;
    for (int64_t c : unit_count)
        if (c > 0) live.push_back(c);
    std::sort(live.begin(), live.end());
    REQUIRE(live.size() > 100u);
    const double hot = static_cast<double>(live[live.size() * 95 / 100]);
    const double median = static_cast<double>(live[live.size() / 2]);
    CHECK(hot > 3 * median);
}

TEST_CASE("generator: plain ReLU puts the sparsity in w_up", "[generator]") {
    ProblemSpec spec = small_spec(Profile::Uniform, 256, 256, 2048);
    const FfnProblem gated = make_ffn_problem(spec);
    spec.gated = false;
    const FfnProblem plain = make_ffn_problem(spec);
    CHECK(plain.w_gate.empty());
    REQUIRE(plain.w_up.size() == 2048u * 256u);
    CHECK(plain.x == gated.x);
    CHECK(plain.w_up == gated.w_gate);  // the same construction, in the other matrix
    CHECK(plain.w_down == gated.w_down);
    const ActivationStats s = measure_activations(plain);
    INFO(describe(s));
    CHECK(s.mean_row_nnz == Approx(29).epsilon(0.15));
}

TEST_CASE("generator: round_to_bf16 values survive a bf16 round trip", "[generator]") {
    ProblemSpec spec = small_spec(Profile::Heavy, 40, 200, 300);
    const FfnProblem p = make_ffn_problem(spec);
    CHECK(bf16_exact(p.x));
    CHECK(bf16_exact(p.w_gate));
    CHECK(bf16_exact(p.w_up));
    CHECK(bf16_exact(p.w_down));

    spec.round_to_bf16 = false;
    const FfnProblem f = make_ffn_problem(spec);
    CHECK_FALSE(bf16_exact(f.x));
    CHECK_FALSE(bf16_exact(f.w_up));

    // Rounding to nearest even, NaN kept.
    const std::vector<float> v = {1.0f, from_bits(0x3f808000u) /* 1 + 2^-8: tie, to even 1.0 */,
                                  from_bits(0x3f818000u) /* 1 + 3 * 2^-8: tie, to 1 + 2^-6 */,
                                  from_bits(0x3f808001u) /* just above the tie: up */, -2.0f,
                                  std::numeric_limits<float>::infinity(),
                                  std::numeric_limits<float>::quiet_NaN()};
    const std::vector<uint16_t> b = to_bf16(v);
    CHECK(b[0] == 0x3f80);
    CHECK(b[1] == 0x3f80);
    CHECK(b[2] == 0x3f82);
    CHECK(b[3] == 0x3f81);
    CHECK(b[4] == 0xc000);
    CHECK(b[5] == 0x7f80);
    CHECK((b[6] & 0x7f80) == 0x7f80);
    CHECK((b[6] & 0x007f) != 0);
}

TEST_CASE("generator: parse_profile", "[generator]") {
    Profile p = Profile::Uniform;
    double k = 5;
    CHECK(parse_profile("heavy-29", &p, &k));
    CHECK(p == Profile::Heavy);
    CHECK(k == 29);
    CHECK(parse_profile("llm-911", &p, &k));
    CHECK(p == Profile::Llm);
    CHECK(k == 911);
    CHECK(parse_profile("uniform-12.5", &p, &k));
    CHECK(p == Profile::Uniform);
    CHECK(k == 12.5);
    CHECK(parse_profile("heavy", &p, &k));  // bare name: k unchanged
    CHECK(p == Profile::Heavy);
    CHECK(k == 12.5);

    for (const char *bad : {"", "uniform-", "uniform-abc", "uniform-29x", "uniform-0", "uniform--3",
                            "uniform- 29", "uniform-nan", "uniform-inf", "sparse-29", "uniform29", "Uniform-29",
                            "heavyy", "-29"}) {
        CAPTURE(bad);
        Profile q = Profile::Llm;
        double kk = 3;
        CHECK_FALSE(parse_profile(bad, &q, &kk));
        CHECK(q == Profile::Llm);  // nothing written
        CHECK(kk == 3);
    }
    for (Profile q : {Profile::Uniform, Profile::Heavy, Profile::Llm}) {
        Profile r = Profile::Llm;
        double kk = 0;
        CHECK(parse_profile(std::string(profile_name(q)) + "-7", &r, &kk));
        CHECK(r == q);
        CHECK(kk == 7);
    }
    CHECK(std::string(profile_name(Profile::Uniform)) == "uniform");
    CHECK(std::string(profile_name(Profile::Heavy)) == "heavy");
    CHECK(std::string(profile_name(Profile::Llm)) == "llm");
}

TEST_CASE("generator: zero and one token", "[generator]") {
    for (Profile profile : {Profile::Uniform, Profile::Heavy, Profile::Llm}) {
        CAPTURE(profile_name(profile));
        const FfnProblem none = make_ffn_problem(small_spec(profile, 0, 64, 256));
        CHECK(none.x.empty());
        CHECK(none.w_gate.size() == 64u * 256u);
        CHECK(none.heavy_rows.empty());
        const ActivationStats s0 = measure_activations(none);
        CHECK(s0.tokens == 0);
        CHECK(s0.mean_row_nnz == 0);
        CHECK(s0.max_row_nnz == 0);
        CHECK(s0.dead_units == 256);
        CHECK_FALSE(describe(s0).empty());

        const FfnProblem one = make_ffn_problem(small_spec(profile, 1, 64, 256));
        CHECK(one.x.size() == 64u);
        if (profile == Profile::Heavy) {
            CHECK(one.heavy_rows == std::vector<int64_t>{0});
        }
        const ActivationStats s1 = measure_activations(one);
        CHECK(s1.tokens == 1);
        CHECK(s1.p99_row_nnz == s1.max_row_nnz);
        CHECK(s1.mean_row_nnz == static_cast<double>(s1.max_row_nnz));
    }
}

TEST_CASE("generator: bad specs are rejected", "[generator]") {
    ProblemSpec s = small_spec(Profile::Uniform, 4, 8, 16);
    s.tokens = -1;
    CHECK_THROWS_AS(make_ffn_problem(s), std::invalid_argument);
    s = small_spec(Profile::Uniform, 4, 8, 16);
    s.active_units = 16;
    CHECK_THROWS_AS(make_ffn_problem(s), std::invalid_argument);
    s.active_units = 0;
    CHECK_THROWS_AS(make_ffn_problem(s), std::invalid_argument);
    s = small_spec(Profile::Llm, 4, 8, 16);
    s.active_units = 15;  // more than the live units can give
    CHECK_THROWS_AS(make_ffn_problem(s), std::invalid_argument);
    s = small_spec(Profile::Uniform, 4, 8, 16);
    s.model_dim = 0;
    CHECK_THROWS_AS(make_ffn_problem(s), std::invalid_argument);

    s = small_spec(Profile::Uniform, 4, 8, 16);
    s.active_units = 3;
    FfnProblem p = make_ffn_problem(s);
    p.x.pop_back();
    CHECK_THROWS_AS(measure_activations(p), std::invalid_argument);
    CHECK(describe(ActivationStats{}) == "mean 0.0, p99 0, max 0, max/tile 0, overflow rows 0, dead 0");
}
