// The seeded problem generator (see problem.hpp and design/performance.md).
#include "testing/problem.hpp"

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>

namespace twblas {
namespace testing {

namespace {

// ---- random streams ---------------------------------------------------------------------------

// Every matrix row (and every other random choice) draws from its own stream, so the data do not
// depend on the order or the number of threads that produce them.
enum Stream : uint64_t {
    kStreamX = 1,       // Xr rows
    kStreamS = 2,       // Gr rows of the sparsity-making matrix
    kStreamUp = 3,      // w_up rows when gated
    kStreamDown = 4,    // w_down rows
    kStreamU = 5,       // the unit vector u
    kStreamHeavy = 6,   // choice of heavy rows
    kStreamUnits = 7,   // Llm: dead units and the order of the firing rates
};

uint64_t splitmix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

std::mt19937_64 make_stream(uint64_t seed, uint64_t stream, uint64_t row) {
    uint64_t s = splitmix64(seed);
    s = splitmix64(s ^ (stream * 0xD1B54A32D192ED03ull));
    s = splitmix64(s ^ row);
    return std::mt19937_64(s);
}

// Uniform in [0, n) without std::uniform_int_distribution (implementation-defined).
uint64_t bounded(std::mt19937_64 &g, uint64_t n) {
    const uint64_t limit = std::numeric_limits<uint64_t>::max() - std::numeric_limits<uint64_t>::max() % n;
    uint64_t r;
    do {
        r = g();
    } while (r >= limit);
    return r % n;
}

// n standard normals (Box-Muller, both values of each pair used), scaled by `scale`.
template <typename T>
void fill_normal(std::mt19937_64 &g, T *out, int64_t n, double scale) {
    constexpr double kInv53 = 1.0 / 9007199254740992.0;  // 2^-53
    constexpr double kTwoPi = 6.283185307179586476925286766559;
    for (int64_t i = 0; i < n; i += 2) {
        const double u1 = static_cast<double>((g() >> 11) + 1) * kInv53;  // (0, 1]
        const double u2 = static_cast<double>(g() >> 11) * kInv53;        // [0, 1)
        const double r = std::sqrt(-2.0 * std::log(u1)) * scale;
        const double t = kTwoPi * u2;
        out[i] = static_cast<T>(r * std::cos(t));
        if (i + 1 < n) out[i + 1] = static_cast<T>(r * std::sin(t));
    }
}

// ---- bf16 ---------------------------------------------------------------------------------------

uint32_t float_bits(float f) {
    uint32_t b;
    std::memcpy(&b, &f, sizeof b);
    return b;
}

uint16_t bf16_bits(float f) {
    const uint32_t b = float_bits(f);
    if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((b >> 16) | 0x0040u);  // quiet NaN
    const uint32_t rounded = b + 0x7fffu + ((b >> 16) & 1u);
    return static_cast<uint16_t>(rounded >> 16);
}

float round_bf16(float f) {
    const uint32_t b = static_cast<uint32_t>(bf16_bits(f)) << 16;
    float r;
    std::memcpy(&r, &b, sizeof r);
    return r;
}

// ---- the normal tail ----------------------------------------------------------------------------

// Q(z) = P(N(0,1) > z).
double upper_tail(double z) { return 0.5 * std::erfc(z / std::sqrt(2.0)); }

// z with Q(z) = q (q in (0, 1)): bisection down to a bracket of 1e-3, then Newton on log Q.
double upper_tail_inverse(double q) {
    double lo = -40.0, hi = 40.0;  // Q(lo) = 1 > q > Q(hi) = 0
    while (hi - lo > 1e-3) {
        const double mid = 0.5 * (lo + hi);
        if (upper_tail(mid) > q)
            lo = mid;
        else
            hi = mid;
    }
    const double log_q = std::log(q);
    double z = 0.5 * (lo + hi);
    for (int it = 0; it < 4; ++it) {
        const double tail = upper_tail(z);
        const double density = std::exp(-0.5 * z * z) / std::sqrt(2.0 * 3.141592653589793238462643383279503);
        if (!(tail > 0) || !(density > 0)) break;
        const double next = z + (std::log(tail) - log_q) * tail / density;
        if (!std::isfinite(next)) break;
        z = std::min(hi, std::max(lo, next));
    }
    return z;
}

// ---- profiles -----------------------------------------------------------------------------------

constexpr int64_t kLlmSequence = 2048;
constexpr double kLlmDeadFraction = 0.30;
constexpr double kLlmDeadB = 40.0;       // P(N > 0.3 * 40) ~ 2e-33: never fires
constexpr double kLlmDecades = 2.0;      // firing rates of live units span 10^2
constexpr double kLlmMaxRate = 1.0 - 1e-6;

double llm_a(int64_t row) {
    const double pos = static_cast<double>(row % kLlmSequence);
    return 1.0 - 0.7 * std::exp(-pos / 64.0);
}

double llm_rate(double c, double t) {
    return std::min(c * std::pow(10.0, -kLlmDecades * t), kLlmMaxRate);
}

// b_j of the live units of the Llm profile, by rank r (t = (r + 0.5) / n_live): the scale c of
// the firing rates is calibrated (bisection on log c) so the expected mean active count per row
// equals k.  Rows are binned by position in the sequence, units by t (128 bins, midpoint rule), so
// the calibration costs ~ 1e6 erfc calls at any size.
std::vector<double> llm_live_b(int64_t tokens, int64_t n_live, double k) {
    std::vector<double> b(static_cast<size_t>(n_live));
    if (n_live == 0) {
        throw std::invalid_argument("make_ffn_problem: llm profile needs live hidden units");
    }
    // Row bins: positions grouped where a varies slowly (bins of 1, 2, 8 positions below 128,
    // 256, 768; a is within 5e-6 of 1 beyond), each with its weighted mean a.  The calibrated
    // mean is within ~1e-4 (relative) of the exact expectation.
    const int64_t rows = tokens > 0 ? tokens : kLlmSequence;  // no rows: one full sequence
    const int64_t full = rows / kLlmSequence, rest = rows % kLlmSequence;
    std::vector<double> row_a, row_w;
    double bin_weight = 0, bin_a = 0;
    int64_t bin_end = 0;
    for (int64_t pos = 0; pos < std::min(rows, kLlmSequence); ++pos) {
        if (pos == bin_end) {
            if (bin_weight > 0) {
                row_a.push_back(bin_a / bin_weight);
                row_w.push_back(bin_weight / static_cast<double>(rows));
            }
            bin_weight = bin_a = 0;
            bin_end = pos < 128 ? pos + 1 : pos < 256 ? pos + 2 : pos < 768 ? pos + 8 : kLlmSequence;
        }
        const double count = static_cast<double>(full + (pos < rest ? 1 : 0));
        bin_weight += count;
        bin_a += count * llm_a(pos);
    }
    if (bin_weight > 0) {
        row_a.push_back(bin_a / bin_weight);
        row_w.push_back(bin_weight / static_cast<double>(rows));
    }
    constexpr int kUnitBins = 128;
    auto expected_mean = [&](double log_c) {
        const double c = std::exp(log_c);
        double sum = 0;
        for (int ub = 0; ub < kUnitBins; ++ub) {
            const double bj = upper_tail_inverse(llm_rate(c, (ub + 0.5) / kUnitBins));
            double per_unit = 0;
            for (size_t r = 0; r < row_a.size(); ++r) per_unit += row_w[r] * upper_tail(row_a[r] * bj);
            sum += per_unit;
        }
        return static_cast<double>(n_live) * sum / kUnitBins;
    };
    double lo = std::log(1e-30), hi = std::log(kLlmMaxRate * std::pow(10.0, kLlmDecades));
    if (expected_mean(hi) < k) {
        char msg[160];
        std::snprintf(msg, sizeof msg,
                      "make_ffn_problem: llm profile cannot reach k = %g (at most %.1f with %lld live units)",
                      k, expected_mean(hi), static_cast<long long>(n_live));
        throw std::invalid_argument(msg);
    }
    for (int it = 0; it < 60; ++it) {
        const double mid = 0.5 * (lo + hi);
        if (expected_mean(mid) < k)
            lo = mid;
        else
            hi = mid;
    }
    const double c = std::exp(0.5 * (lo + hi));
    for (int64_t r = 0; r < n_live; ++r) {
        b[static_cast<size_t>(r)] =
            upper_tail_inverse(llm_rate(c, (static_cast<double>(r) + 0.5) / static_cast<double>(n_live)));
    }
    return b;
}

// Seeded Fisher-Yates permutation of 0..n-1 (own bounded draw: portable).
std::vector<int64_t> permutation(std::mt19937_64 &g, int64_t n) {
    std::vector<int64_t> p(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) p[static_cast<size_t>(i)] = i;
    for (int64_t i = n - 1; i > 0; --i) {
        const int64_t j = static_cast<int64_t>(bounded(g, static_cast<uint64_t>(i + 1)));
        std::swap(p[static_cast<size_t>(i)], p[static_cast<size_t>(j)]);
    }
    return p;
}

void check_spec(const ProblemSpec &s) {
    if (s.tokens < 0) throw std::invalid_argument("make_ffn_problem: tokens < 0");
    if (s.model_dim < 1) throw std::invalid_argument("make_ffn_problem: model_dim < 1");
    if (s.hidden_dim < 1) throw std::invalid_argument("make_ffn_problem: hidden_dim < 1");
    if (!(s.active_units > 0) || !std::isfinite(s.active_units)) {
        throw std::invalid_argument("make_ffn_problem: active_units must be finite and > 0");
    }
    if (s.profile != Profile::Llm && !(s.active_units < static_cast<double>(s.hidden_dim))) {
        throw std::invalid_argument("make_ffn_problem: active_units must be < hidden_dim");
    }
    if (s.profile == Profile::Heavy && !(s.heavy_scale > 0)) {
        throw std::invalid_argument("make_ffn_problem: heavy_scale must be > 0");
    }
    if (s.profile != Profile::Uniform && s.profile != Profile::Heavy && s.profile != Profile::Llm) {
        throw std::invalid_argument("make_ffn_problem: unknown profile");
    }
}

inline size_t sz(int64_t v) { return static_cast<size_t>(v); }

// Rows of `out` (rows x d): normals * scale from stream `stream`, each row from its own stream.
void fill_gaussian_rows(std::vector<float> &out, int64_t rows, int64_t d, double scale, uint64_t seed,
                        uint64_t stream, bool bf16) {
    out.resize(sz(rows) * sz(d));
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t r = 0; r < rows; ++r) {
        std::mt19937_64 g = make_stream(seed, stream, static_cast<uint64_t>(r));
        float *row = out.data() + sz(r) * sz(d);
        fill_normal(g, row, d, scale);
        if (bf16) {
            for (int64_t c = 0; c < d; ++c) row[c] = round_bf16(row[c]);
        }
    }
}

// Rows of `out` (rows x d): (normals * scale projected off u) + coef[r] * u.
void fill_constructed_rows(std::vector<float> &out, int64_t rows, int64_t d, double scale,
                           const std::vector<double> &u, const std::vector<double> &coef, uint64_t seed,
                           uint64_t stream, bool bf16) {
    out.resize(sz(rows) * sz(d));
#pragma omp parallel
    {
        std::vector<double> buf(sz(d));
#pragma omp for schedule(dynamic, 16)
        for (int64_t r = 0; r < rows; ++r) {
            std::mt19937_64 g = make_stream(seed, stream, static_cast<uint64_t>(r));
            fill_normal(g, buf.data(), d, scale);
            double along = 0;
            for (int64_t c = 0; c < d; ++c) along += buf[sz(c)] * u[sz(c)];
            const double shift = coef[sz(r)] - along;
            float *row = out.data() + sz(r) * sz(d);
            for (int64_t c = 0; c < d; ++c) {
                const float v = static_cast<float>(buf[sz(c)] + shift * u[sz(c)]);
                row[c] = bf16 ? round_bf16(v) : v;
            }
        }
    }
}

}  // namespace

// ---- public -------------------------------------------------------------------------------------

const char *profile_name(Profile p) {
    switch (p) {
    case Profile::Uniform: return "uniform";
    case Profile::Heavy: return "heavy";
    case Profile::Llm: return "llm";
    }
    return "unknown";
}

bool parse_profile(const std::string &text, Profile *profile, double *active_units) {
    if (profile == nullptr) return false;
    const Profile all[] = {Profile::Uniform, Profile::Heavy, Profile::Llm};
    for (Profile p : all) {
        const std::string name = profile_name(p);
        if (text == name) {
            *profile = p;
            return true;
        }
        if (text.size() > name.size() + 1 && text.compare(0, name.size(), name) == 0 && text[name.size()] == '-') {
            const std::string number = text.substr(name.size() + 1);
            const char first = number[0];
            if (!((first >= '0' && first <= '9') || first == '.')) return false;
            char *end = nullptr;
            const double k = std::strtod(number.c_str(), &end);
            if (end == nullptr || *end != '\0' || !std::isfinite(k) || !(k > 0)) return false;
            if (active_units == nullptr) return false;
            *profile = p;
            *active_units = k;
            return true;
        }
    }
    return false;
}

FfnProblem make_ffn_problem(const ProblemSpec &spec) {
    check_spec(spec);
    const int64_t M = spec.tokens, D = spec.model_dim, H = spec.hidden_dim;
    const double k = spec.active_units;
    const bool bf16 = spec.round_to_bf16;
    const uint64_t seed = spec.seed;

    FfnProblem p;
    p.spec = spec;

    // Row factors a_i.
    std::vector<double> a(sz(M), 1.0);
    if (spec.profile == Profile::Heavy && M > 0 && spec.heavy_fraction > 0) {
        int64_t n_heavy = std::llround(spec.heavy_fraction * static_cast<double>(M));
        n_heavy = std::min(M, std::max<int64_t>(1, n_heavy));
        std::mt19937_64 g = make_stream(seed, kStreamHeavy, 0);
        // Partial Fisher-Yates: the first n_heavy entries of a seeded permutation.
        std::vector<int64_t> idx(sz(M));
        for (int64_t i = 0; i < M; ++i) idx[sz(i)] = i;
        for (int64_t i = 0; i < n_heavy; ++i) {
            const int64_t j = i + static_cast<int64_t>(bounded(g, static_cast<uint64_t>(M - i)));
            std::swap(idx[sz(i)], idx[sz(j)]);
        }
        p.heavy_rows.assign(idx.begin(), idx.begin() + n_heavy);
        std::sort(p.heavy_rows.begin(), p.heavy_rows.end());
        for (int64_t r : p.heavy_rows) a[sz(r)] = spec.heavy_scale;
    } else if (spec.profile == Profile::Llm) {
        for (int64_t i = 0; i < M; ++i) a[sz(i)] = llm_a(i);
    }

    // Unit thresholds b_j.
    std::vector<double> minus_b(sz(H));
    if (spec.profile == Profile::Llm) {
        const int64_t n_dead = std::llround(kLlmDeadFraction * static_cast<double>(H));
        const int64_t n_live = H - n_dead;
        const std::vector<double> live_b = llm_live_b(M, n_live, k);
        std::mt19937_64 g = make_stream(seed, kStreamUnits, 0);
        const std::vector<int64_t> order = permutation(g, H);
        for (int64_t r = 0; r < H; ++r) {
            const int64_t j = order[sz(r)];
            minus_b[sz(j)] = r < n_dead ? -kLlmDeadB : -live_b[sz(r - n_dead)];
        }
    } else {
        const double z = upper_tail_inverse(k / static_cast<double>(H));
        std::fill(minus_b.begin(), minus_b.end(), -z);
    }

    // The unit vector u.
    std::vector<double> u(sz(D));
    {
        std::mt19937_64 g = make_stream(seed, kStreamU, 0);
        double norm2 = 0;
        do {
            fill_normal(g, u.data(), D, 1.0);
            norm2 = 0;
            for (double v : u) norm2 += v * v;
        } while (!(norm2 > 0));
        const double inv = 1.0 / std::sqrt(norm2);
        for (double &v : u) v *= inv;
    }

    const double w_scale = 1.0 / std::sqrt(static_cast<double>(D));
    fill_constructed_rows(p.x, M, D, 1.0, u, a, seed, kStreamX, bf16);
    fill_constructed_rows(spec.gated ? p.w_gate : p.w_up, H, D, w_scale, u, minus_b, seed, kStreamS, bf16);
    if (spec.gated) fill_gaussian_rows(p.w_up, H, D, w_scale, seed, kStreamUp, bf16);
    fill_gaussian_rows(p.w_down, H, D, 1.0 / std::sqrt(static_cast<double>(H)), seed, kStreamDown, bf16);
    return p;
}

void make_units_hot(std::vector<float> &sparsity_rows, int64_t hidden_dim, int64_t model_dim, int64_t hot) {
    if (hot < 0 || hot > hidden_dim || model_dim < 1 || sparsity_rows.size() != sz(hidden_dim) * sz(model_dim))
        throw std::invalid_argument("make_units_hot: hot outside [0, H] or rows not H x D");
    for (int64_t i = 0; i < hot; ++i)
        for (int64_t c = 0; c < model_dim; ++c) sparsity_rows[sz((i * (hidden_dim / hot)) * model_dim + c)] *= -1.0f;
}

ActivationStats measure_activations(const FfnProblem &p, int tile_width, int tile_capacity) {
    const int64_t M = p.spec.tokens, D = p.spec.model_dim, H = p.spec.hidden_dim;
    const std::vector<float> &s = p.spec.gated ? p.w_gate : p.w_up;
    if (M < 0 || D < 1 || H < 1 || p.x.size() != sz(M) * sz(D) || s.size() != sz(H) * sz(D)) {
        throw std::invalid_argument("measure_activations: data do not match the spec's shapes");
    }
    if (tile_width < 1) throw std::invalid_argument("measure_activations: tile_width < 1");

    using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    const Eigen::Map<const RowMajor> S(s.data(), H, D);
    const int64_t kBlock = 128;
    const int64_t n_blocks = (M + kBlock - 1) / kBlock;
    const int64_t n_tiles = (H + tile_width - 1) / tile_width;

    std::vector<int64_t> row_nnz(sz(M), 0);
    std::vector<unsigned char> unit_alive(sz(H), 0);
    int64_t max_tile = 0, over = 0;

#pragma omp parallel
    {
        RowMajor P;
        std::vector<unsigned char> alive(sz(H), 0);
        int64_t my_max_tile = 0, my_over = 0;
#pragma omp for schedule(dynamic, 1)
        for (int64_t blk = 0; blk < n_blocks; ++blk) {
            const int64_t r0 = blk * kBlock, rows = std::min(kBlock, M - r0);
            const Eigen::Map<const RowMajor> X(p.x.data() + sz(r0) * sz(D), rows, D);
            P.resize(rows, H);
            P.noalias() = X * S.transpose();
            for (int64_t r = 0; r < rows; ++r) {
                const float *pr = P.data() + sz(r) * sz(H);
                int64_t total = 0;
                bool overflow = false;
                for (int64_t t = 0; t < n_tiles; ++t) {
                    const int64_t c0 = t * tile_width, c1 = std::min(H, c0 + tile_width);
                    int64_t in_tile = 0;
                    for (int64_t c = c0; c < c1; ++c) {
                        const bool on = pr[c] > 0.0f;
                        in_tile += on;
                        alive[sz(c)] |= static_cast<unsigned char>(on);
                    }
                    total += in_tile;
                    my_max_tile = std::max(my_max_tile, in_tile);
                    overflow = overflow || in_tile > tile_capacity;
                }
                row_nnz[sz(r0 + r)] = total;
                my_over += overflow;
            }
        }
#pragma omp critical
        {
            max_tile = std::max(max_tile, my_max_tile);
            over += my_over;
            for (int64_t j = 0; j < H; ++j) unit_alive[sz(j)] |= alive[sz(j)];
        }
    }

    ActivationStats st;
    st.tokens = M;
    st.max_tile_nnz = max_tile;
    st.rows_over_tile_capacity = over;
    st.dead_units = H - static_cast<int64_t>(std::count(unit_alive.begin(), unit_alive.end(), 1));
    if (M > 0) {
        double sum = 0;
        for (int64_t v : row_nnz) sum += static_cast<double>(v);
        st.mean_row_nnz = sum / static_cast<double>(M);
        st.max_row_nnz = *std::max_element(row_nnz.begin(), row_nnz.end());
        // Nearest rank: the smallest value with at least 99 % of the rows at or below it.
        const int64_t rank = std::max<int64_t>(1, (99 * M + 99) / 100);
        std::nth_element(row_nnz.begin(), row_nnz.begin() + (rank - 1), row_nnz.end());
        st.p99_row_nnz = row_nnz[sz(rank - 1)];
    }
    return st;
}

std::string describe(const ActivationStats &s) {
    char buf[200];
    std::snprintf(buf, sizeof buf, "mean %.1f, p99 %lld, max %lld, max/tile %lld, overflow rows %lld, dead %lld",
                  s.mean_row_nnz, static_cast<long long>(s.p99_row_nnz), static_cast<long long>(s.max_row_nnz),
                  static_cast<long long>(s.max_tile_nnz), static_cast<long long>(s.rows_over_tile_capacity),
                  static_cast<long long>(s.dead_units));
    return buf;
}

std::vector<uint16_t> to_bf16(const std::vector<float> &v) {
    std::vector<uint16_t> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_bits(v[i]);
    return out;
}

}  // namespace testing
}  // namespace twblas
