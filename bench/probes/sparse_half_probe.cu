// Probe: how fast can the sparse half of a serving step go, once each token's active units are
// known? At M = 64 (paper's shape, uniform-29) serve_up took 12.1 us and serve_down_list 11.3
// (ncu, bench/NOTES.md "fourth pass") for ~1.9 k active pairs whose union is ~28 % of the units:
// 6.5 MB of Wu rows and 6.5 MB of Wd rows, ~4.4 us at the copy rate. This times bare gather
// kernels over lists made on the host, so that the floor of the two phases is known before the
// library's kernels are rebuilt around it:
//   up_pairs   a warp per (token, unit) pair, the whole Wu row and x_t row in flight (8 + 8
//              16-byte loads a lane at D = 2048), every pair in one wave;
//   up_units   a warp per unit of the union: its Wu row loaded once, then each of its tokens' x_t;
//   down<B>    a warp per (token, 256 columns): the token's units' Wd slices, B in flight.
// Weights rotate over copies past L2; lists and x stay (as after the gate). Results are checked
// against a host computation from the same bf16 data.
// Build: nvcc -O3 -std=c++17 -arch=sm_90a sparse_half_probe.cu -o sparse_half_probe
// Run:   ./sparse_half_probe [M] [H] [D] [k]   (defaults 64 5632 2048 29; D <= 2048, a multiple of 256)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "gather_kernels.cuh"

constexpr int kWarps = kGatherWarps;
// weight copies the timing loops rotate over: a launch touches only the union's rows (~6.5 MB of
// each half at M = 64), so 12 copies keep the rows a launch reads out of the 50 MB L2
constexpr int kCopies = 12;
constexpr int kReps = 200;

__global__ void up_units(const bf16 *pair, int64_t stride, const bf16 *x, int d, const int *unit, const int *ustart,
                         const int *utok, const int *upair, const float *g, int nunits, float *h) {
    const int lane = threadIdx.x & 31, u = blockIdx.x * kWarps + threadIdx.x / 32;
    if (u >= nunits) return;
    const bf16 *w = pair + static_cast<int64_t>(unit[u]) * stride;
    const int chunks = d / 8;
    uint4 wq[8];
#pragma unroll
    for (int q = 0; q < 8; ++q)
        if (lane + 32 * q < chunks) wq[q] = *reinterpret_cast<const uint4 *>(w + 8 * (lane + 32 * q));
    for (int k = ustart[u]; k < ustart[u + 1]; ++k) {
        const bf16 *xr = x + static_cast<int64_t>(utok[k]) * d;
        float acc = 0.0f;
#pragma unroll
        for (int q = 0; q < 8; ++q)
            if (lane + 32 * q < chunks) acc = dot8(wq[q], *reinterpret_cast<const uint4 *>(xr + 8 * (lane + 32 * q)), acc);
        acc = warp_sum(acc);
        if (lane == 0) h[upair[k]] = g[upair[k]] * acc;
    }
}

template <class F> float time_us(F &&launch) {
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    for (int r = 0; r < 2 * kCopies; ++r) launch(r % kCopies);
    CHECK(cudaEventRecord(a));
    for (int r = 0; r < kReps; ++r) launch(r % kCopies);
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    CHECK(cudaGetLastError());
    return ms * 1e3f / kReps;
}

int main(int argc, char **argv) {
    const int m = argc > 1 ? std::atoi(argv[1]) : 64, hdim = argc > 2 ? std::atoi(argv[2]) : 5632;
    const int d = argc > 3 ? std::atoi(argv[3]) : 2048, k = argc > 4 ? std::atoi(argv[4]) : 29;
    if (d % 256 != 0 || d > 2048 || k > hdim) {
        std::fprintf(stderr, "D must be a multiple of 256 up to 2048, k <= H\n");
        return 1;
    }
    const int64_t stride = 2 * static_cast<int64_t>(d);  // [Wu_j | Wd_j], as the library packs them
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    // weights: one random copy, replicated kCopies times on the device (same values, other addresses)
    std::vector<bf16> w(static_cast<size_t>(hdim) * stride);
    for (auto &v : w) v = __float2bfloat16(uni(rng) * 0.05f);
    std::vector<bf16> x(static_cast<size_t>(m) * d);
    for (auto &v : x) v = __float2bfloat16(uni(rng));
    // each token's k units (distinct, ascending) and their gate values
    std::vector<int> pt, pj, tstart{0};
    std::vector<float> g;
    std::vector<int> all(hdim);
    for (int j = 0; j < hdim; ++j) all[j] = j;
    for (int t = 0; t < m; ++t) {
        std::shuffle(all.begin(), all.end(), rng);
        std::vector<int> units(all.begin(), all.begin() + k);
        std::sort(units.begin(), units.end());
        for (int j : units) pt.push_back(t), pj.push_back(j), g.push_back(0.5f + 0.5f * std::fabs(uni(rng)));
        tstart.push_back(static_cast<int>(pt.size()));
    }
    const int npairs = static_cast<int>(pt.size());
    // the same pairs by unit (the union, ascending), each unit's tokens ascending
    std::vector<int> order(npairs);
    for (int p = 0; p < npairs; ++p) order[p] = p;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return pj[a] < pj[b]; });
    std::vector<int> unit, ustart, utok, upair;
    for (int i = 0; i < npairs; ++i) {
        const int p = order[i];
        if (unit.empty() || unit.back() != pj[p]) unit.push_back(pj[p]), ustart.push_back(i);
        utok.push_back(pt[p]), upair.push_back(p);
    }
    ustart.push_back(npairs);
    const int nunits = static_cast<int>(unit.size());

    bf16 *wdev[kCopies];
    for (auto &p : wdev) p = upload(w);
    bf16 *xd = upload(x), *yd = nullptr;
    CHECK(cudaMalloc(&yd, static_cast<size_t>(m) * d * sizeof(bf16)));
    int *ptd = upload(pt), *pjd = upload(pj), *tsd = upload(tstart), *ud = upload(unit), *usd = upload(ustart),
        *utd = upload(utok), *upd = upload(upair);
    float *gd = upload(g), *hd = nullptr;
    CHECK(cudaMalloc(&hd, npairs * sizeof(float)));
    const int slices = d / 256;
    const unsigned pair_blocks = (npairs + kWarps - 1) / kWarps, unit_blocks = (nunits + kWarps - 1) / kWarps,
                   down_blocks = (m * slices + kWarps - 1) / kWarps;
    auto run_up_pairs = [&](int c) { up_pairs<<<pair_blocks, 32 * kWarps>>>(wdev[c], stride, xd, d, ptd, pjd, gd, npairs, hd); };
    auto run_up_units = [&](int c) {
        up_units<<<unit_blocks, 32 * kWarps>>>(wdev[c], stride, xd, d, ud, usd, utd, upd, gd, nunits, hd);
    };
    auto run_down8 = [&](int c) { down<8><<<down_blocks, 32 * kWarps>>>(wdev[c], stride, d, tsd, pjd, hd, m, slices, yd); };
    auto run_down32 = [&](int c) { down<32><<<down_blocks, 32 * kWarps>>>(wdev[c], stride, d, tsd, pjd, hd, m, slices, yd); };

    // check: h and y of the pair kernels (and up_units' h) against the host
    std::vector<float> href(npairs), yref(static_cast<size_t>(m) * d, 0.0f);
    for (int p = 0; p < npairs; ++p) {
        double s = 0;
        for (int c = 0; c < d; ++c)
            s += static_cast<double>(__bfloat162float(w[static_cast<size_t>(pj[p]) * stride + c])) *
                 __bfloat162float(x[static_cast<size_t>(pt[p]) * d + c]);
        href[p] = g[p] * static_cast<float>(s);
        for (int c = 0; c < d; ++c)
            yref[static_cast<size_t>(pt[p]) * d + c] += href[p] * __bfloat162float(w[static_cast<size_t>(pj[p]) * stride + d + c]);
    }
    auto check = [&](const char *what, bool y_too) {
        std::vector<float> h(npairs);
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaMemcpy(h.data(), hd, npairs * sizeof(float), cudaMemcpyDeviceToHost));
        double worst = 0;
        for (int p = 0; p < npairs; ++p) worst = std::max(worst, std::fabs(static_cast<double>(h[p]) - href[p]) / (1e-3 + std::fabs(href[p])));
        if (y_too) {
            std::vector<bf16> y(static_cast<size_t>(m) * d);
            CHECK(cudaMemcpy(y.data(), yd, y.size() * sizeof(bf16), cudaMemcpyDeviceToHost));
            for (size_t i = 0; i < y.size(); ++i)
                worst = std::max(worst, std::fabs(static_cast<double>(__bfloat162float(y[i])) - yref[i]) / (1e-2 + std::fabs(yref[i])));
        }
        std::printf("check %-10s worst relative error %.2e %s\n", what, worst, worst < 2e-2 ? "ok" : "FAILED");
        return worst < 2e-2;
    };
    bool ok = true;
    run_up_units(0);
    ok &= check("up_units", false);
    run_up_pairs(0);
    run_down8(0);
    ok &= check("pairs+down", true);

    const double row_bytes = 2.0 * d, union_bytes = nunits * row_bytes;
    std::printf("M %d, H %d, D %d, k %d: %d pairs, union %d units (%.1f %% of H): %.2f MB of Wu rows, the same of Wd\n", m,
                hdim, d, k, npairs, nunits, 100.0 * nunits / hdim, union_bytes / 1e6);
    const float t_pairs = time_us(run_up_pairs), t_units = time_us(run_up_units), t_d8 = time_us(run_down8),
                t_d32 = time_us(run_down32);
    const float t_step = time_us([&](int c) { run_up_pairs(c), run_down8(c); });
    auto line = [&](const char *name, float us, double bytes) {
        std::printf("%-22s %8.2f us  %6.2f TB/s of union rows\n", name, us, bytes / (us * 1e-6) / 1e12);
    };
    line("up_pairs", t_pairs, union_bytes);
    line("up_units", t_units, union_bytes);
    line("down<8>", t_d8, union_bytes);
    line("down<32>", t_d32, union_bytes);
    line("up_pairs + down<8>", t_step, 2 * union_bytes);
    return ok ? 0 : 1;
}
