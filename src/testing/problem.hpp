// One seeded problem generator for the tests, the benchmarks and the demo
// (docs: design/performance.md, "One problem generator for tests and benchmarks").
//
// The sparsity comes from the gate GEMM itself: X and the sparsity-making matrix S (w_gate for a
// gated FFN, w_up for a plain ReLU FFN) are built so that the pre-activation is
//     p_ij = X_i . S_j = Xr_i . Gr_j - a_i b_j,
// where Xr (M x D, N(0,1)) and Gr (H x D, N(0,1/D)) have their component along one random unit
// vector u removed, X_i = Xr_i + a_i u and S_j = Gr_j - b_j u.  Unit j therefore fires for
// token i with probability P(N(0,1) > a_i b_j).
//
// Everything is a pure function of the ProblemSpec: every matrix row draws from its own
// std::mt19937_64 stream (seeded from spec.seed, the matrix and the row), normals come from a
// hand-written Box-Muller, so the data do not depend on the thread count, the standard library
// or the platform (up to the last bit of libm's log/sin/cos, which the bf16 rounding hides).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace twblas {
namespace testing {

enum class Profile { Uniform, Heavy, Llm };

// "uniform", "heavy", "llm".
const char *profile_name(Profile p);

// Parses "uniform-29", "heavy-29", "llm-29" (profile and k, k a finite number > 0), or a bare
// profile name (then *active_units is left unchanged).  Returns false, and writes nothing, on
// anything else.  active_units may be null only when the text is a bare profile name.
bool parse_profile(const std::string &text, Profile *profile, double *active_units);

struct ProblemSpec {
    int64_t tokens = 256;       // M
    int64_t model_dim = 2048;   // D
    int64_t hidden_dim = 5632;  // H
    Profile profile = Profile::Uniform;
    double active_units = 29;   // k: target mean active hidden units per token
    bool gated = true;          // gated ReLU FFN (w_gate makes the sparsity) or plain ReLU (w_up does)
    uint64_t seed = 1;
    bool round_to_bf16 = true;  // every value exactly representable in bf16 (and hence fp32)
    double heavy_fraction = 0.01;  // Heavy: fraction of rows with a_i = heavy_scale
    double heavy_scale = 0.25;
};

struct FfnProblem {
    ProblemSpec spec;
    std::vector<float> x;       // tokens x D, row-major
    std::vector<float> w_gate;  // H x D row-major (empty when !gated)
    std::vector<float> w_up;    // H x D row-major
    std::vector<float> w_down;  // H x D row-major (the transpose of nn.Linear's down_proj.weight)
    std::vector<int64_t> heavy_rows;  // rows made dense on purpose (Heavy), ascending
};

// Profiles:
//  - Uniform: a_i = 1, b_j = z with P(N(0,1) > z) = k / H.
//  - Heavy:   as Uniform, but max(1, round(heavy_fraction * M)) seeded rows (none when
//             heavy_fraction <= 0 or M = 0) get a_i = heavy_scale.
//  - Llm:     a_i = 1 - 0.7 exp(-pos / 64), pos = i mod 2048 (denser first tokens of each
//             2048-token sequence); 30 % of the units (seeded choice) are dead (b_j = 40); the
//             firing rates P(N > b_j) of the others (at a = 1) are log-uniform over exactly two
//             decades, c * 10^(-2 t_j), t_j evenly spread over (0, 1) in a seeded order, with
//             the scale c calibrated by bisection so the EXPECTED mean active count per row is k.
// Also w_up ~ N(0, 1/D) when gated (for a plain FFN the construction goes into w_up and w_gate
// stays empty; X and the sparsity-making matrix are the same for both), w_down ~ N(0, 1/H).
// Throws std::invalid_argument for tokens < 0, model_dim < 1, hidden_dim < 1, k outside
// (0, H) (Uniform, Heavy) or above what the Llm profile can reach, heavy_scale <= 0.
FfnProblem make_ffn_problem(const ProblemSpec &spec);

// Makes `hot` units (j = i * (H / hot), spread over the TwELL tiles) fire on all but about k / H
// of the tokens instead of about k / H of them: their rows of the sparsity-making matrix (H x D,
// row-major: w_gate when gated, else w_up) negated. A trained model's busiest units. Throws
// std::invalid_argument for hot outside [0, H] or a matrix that is not H x D.
void make_units_hot(std::vector<float> &sparsity_rows, int64_t hidden_dim, int64_t model_dim, int64_t hot);

struct ActivationStats {
    int64_t tokens = 0;
    double mean_row_nnz = 0;    // mean active units per token
    int64_t p99_row_nnz = 0;    // nearest-rank 99th percentile
    int64_t max_row_nnz = 0;
    int64_t max_tile_nnz = 0;   // most active units of one token inside one tile of tile_width columns
    int64_t rows_over_tile_capacity = 0;  // tokens with some tile holding more than tile_capacity actives
    int64_t dead_units = 0;     // hidden units active for no token
};

// Active = pre-activation (x . w_j for the sparsity-making matrix: w_gate when gated, else w_up)
// > 0, computed with an fp32 (Eigen) GEMM from the stored float values.  Default tile capacity
// 31 is TwELL's with T = 256, C = 8.  Throws std::invalid_argument when the vectors do not match
// the spec's shapes or tile_width < 1.
ActivationStats measure_activations(const FfnProblem &p, int tile_width = 256, int tile_capacity = 31);

// One line: "mean 29.1, p99 41, max 44, max/tile 9, overflow rows 0, dead 0".
std::string describe(const ActivationStats &s);

// bf16 bit patterns (round to nearest even; NaN stays a quiet NaN) for feeding the C API.
std::vector<uint16_t> to_bf16(const std::vector<float> &v);

}  // namespace testing
}  // namespace twblas
