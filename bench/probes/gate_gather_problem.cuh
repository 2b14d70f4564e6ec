// The problem the gate-and-gather probes share (coresident_probe.cu, fused_gate_gather_probe.cu):
// a gate whose ReLU keeps ~0.5 % of its entries, unit rows [Wu_j | Wd_j], and 29 distinct random
// units a token for the gathers; plus the library's fail(), which the kernel headers they include
// call. Each probe is one translation unit, so the definition here is its only one.
#pragma once

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "probe_common.cuh"
#include "twblas/twblas.h"

namespace twblas {
[[noreturn]] void fail(twStatus_t s, const char *fmt, ...) {
    va_list a;
    va_start(a, fmt);
    std::vfprintf(stderr, fmt, a);
    va_end(a);
    std::fprintf(stderr, " (%d)\n", static_cast<int>(s));
    std::exit(1);
}
}  // namespace twblas

struct GateGatherProblem {
    int m, h, d;
    std::vector<bf16> x, w, pair;     // M x D, H x D, H x 2D
    std::vector<int> pt, pj, tstart;  // each pair's token and unit, by token; a token's first pair
    std::vector<float> g;             // each pair's gate value
    int pairs() const { return tstart[m]; }
};

/// Uniform values (w's within +-0.25: z's spread ~3.8 at D = 2048) and a bias column (x[:, 0] = 1,
/// w[:, 0] = -9.75) that leaves ~0.5 % of the gate active; k distinct units a token, ascending.
inline GateGatherProblem make_gate_gather_problem(int m, int h, int d, int k, unsigned seed = 7) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    GateGatherProblem p{m, h, d};
    p.x.resize(static_cast<size_t>(m) * d);
    p.w.resize(static_cast<size_t>(h) * d);
    p.pair.resize(static_cast<size_t>(h) * 2 * d);
    for (size_t i = 0; i < p.x.size(); ++i) p.x[i] = __float2bfloat16(i % d == 0 ? 1.0f : uni(rng));
    for (size_t i = 0; i < p.w.size(); ++i) p.w[i] = __float2bfloat16(i % d == 0 ? -9.75f : 0.25f * uni(rng));
    for (auto &v : p.pair) v = __float2bfloat16(0.05f * uni(rng));
    p.tstart.resize(m + 1);
    std::uniform_int_distribution<int> unit(0, h - 1);
    for (int t = 0; t < m; ++t) {
        p.tstart[t] = static_cast<int>(p.pj.size());
        std::vector<int> us;
        while (static_cast<int>(us.size()) < k) {
            const int u = unit(rng);
            if (std::find(us.begin(), us.end(), u) == us.end()) us.push_back(u);
        }
        std::sort(us.begin(), us.end());
        for (int u : us) p.pt.push_back(t), p.pj.push_back(u), p.g.push_back(uni(rng));
    }
    p.tstart[m] = static_cast<int>(p.pj.size());
    return p;
}
