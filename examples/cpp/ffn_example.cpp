// ffn_example.cpp: a sparse gated feed-forward layer through the C++ layer (twblas.hpp).
//
//   Y = (ReLU(X Wg^T) * (X Wu^T)) Wd        X, Y: M x D tokens, Wg, Wu, Wd: H x D
//
// fp32 data in std::vector on the CPU backend; the activations h are kept in a hybrid sparse
// matrix, read back densely and checked, like Y, against a naive double computation.
// Every twblas object is owned by a C++ object; failures throw twblas::Exception.
// Returns 0 on success, 1 on an exception or a wrong result.
// Build, against the Debian packages or a prefix install (for the latter, first
// export PKG_CONFIG_PATH=<prefix>/lib/pkgconfig; the rpath finds libtwblas.so.0 there at run time):
//   c++ -std=c++17 ffn_example.cpp $(pkg-config --cflags --libs twblas) -Wl,-rpath,$(pkg-config --variable=libdir twblas) -o ffn_example_cpp
// or with CMake: find_package(twblas) and twblas::twblas. scripts/package.sh builds it with this line.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include <twblas/twblas.hpp>

namespace {

constexpr std::int64_t M = 8, D = 32, H = 128;

// Deterministic uniform numbers in [-1, 1) (a 32-bit LCG), so every run is the same.
struct Lcg {
    std::uint32_t state = 2024u;
    float operator()() {
        state = state * 1664525u + 1013904223u;
        return static_cast<float>(state >> 8) / 8388608.0f - 1.0f;
    }
};

// max |a - ref| / max |ref|
double rel_error(const std::vector<float> &a, const std::vector<double> &ref) {
    double err = 0.0, scale = 0.0;
    for (std::size_t i = 0; i < ref.size(); ++i) {
        err = std::max(err, std::fabs(static_cast<double>(a[i]) - ref[i]));
        scale = std::max(scale, std::fabs(ref[i]));
    }
    return scale > 0.0 ? err / scale : err;
}

int run() {
    // ---- data: PyTorch layouts (row-major X [M, D], gate/up_proj.weight [H, D],
    // down_proj.weight [D, H]). Feature 0 is a constant 1 and column 0 of Wg a negative
    // bias, so roughly one hidden unit in ten fires.
    Lcg rnd;
    std::vector<float> x(M * D), y(M * D, 0.0f), wg(H * D), wu(H * D), wd(D * H);
    for (std::int64_t m = 0; m < M; ++m)
        for (std::int64_t d = 0; d < D; ++d) x[m * D + d] = d == 0 ? 1.0f : rnd();
    for (std::int64_t j = 0; j < H; ++j)
        for (std::int64_t d = 0; d < D; ++d) {
            wg[j * D + d] = d == 0 ? -0.45f : 0.18f * rnd();
            wu[j * D + d] = 0.18f * rnd();
        }
    for (auto &w : wd) w = 0.1f * rnd();

    // ---- the layer -------------------------------------------------------------------------
    twblas::Handle handle(TW_BACKEND_CPU);  // host memory: std::vector data is usable as is
    auto Wg = twblas::DenseMatrix::row_major(wg, H, D);
    auto Wu = twblas::DenseMatrix::row_major(wu, H, D);
    auto Wd = twblas::DenseMatrix::col_major(wd, H, D);  // [D, H] row-major = H x D col-major
    auto ffn = twblas::Ffn::gated(handle, Wg, Wu, Wd);
    ffn.set_attribute(TW_FFN_ATTR_DETERMINISTIC, 1);
    std::printf("FFN D = %lld, H = %lld, tile width %d, compression %d, deterministic %d\n",
                static_cast<long long>(ffn.model_dim()), static_cast<long long>(ffn.hidden_dim()),
                ffn.attribute(TW_FFN_ATTR_TILE_WIDTH), ffn.attribute(TW_FFN_ATTR_COMPRESSION),
                ffn.attribute(TW_FFN_ATTR_DETERMINISTIC));

    // A mis-shaped weight is rejected with an explanation (here Wd described as D x H).
    try {
        auto bad = twblas::DenseMatrix::row_major(wd, D, H);
        auto unused = twblas::Ffn::gated(handle, Wg, Wu, bad);
        std::printf("FAIL: a D x H down projection was accepted\n");
        return 1;
    } catch (const twblas::Exception &e) {
        std::printf("expected error: %s\n", e.what());
        if (e.status() != TW_STATUS_INVALID_VALUE) return 1;
    }

    // ---- forward, keeping h in a hybrid matrix: ELL width 8 (entries a row) and backup
    // rows = M, so the tokens with more than 8 active units are held exactly as dense rows --
    auto X = twblas::DenseMatrix::row_major(x, M, D);
    auto Y = twblas::DenseMatrix::row_major(y, M, D);
    auto hidden = twblas::SparseMatrix::hybrid_host(M, H, 8, M, TW_R_32F);
    ffn.forward(X, Y, &hidden);  // workspace: allocated and kept by ffn (CPU backend)

    const twFfnStats_t stats = ffn.stats();
    const twSpMatInfo_t info = hidden.info(handle);
    std::printf("stats:  tokens %lld, mean active %.2f of %lld, max %lld, l1 %.4f\n",
                static_cast<long long>(stats.tokens), stats.meanRowNnz,
                static_cast<long long>(H), static_cast<long long>(stats.maxRowNnz), stats.l1);
    std::printf("hidden: nnz %lld, max row nnz %lld, rows past the ELL width %lld\n",
                static_cast<long long>(info.nnz), static_cast<long long>(info.maxRowNnz),
                static_cast<long long>(info.overflowRows));
    hidden.validate(handle);

    std::vector<float> hDense(M * H, -1.0f);
    hidden.to_dense(handle, twblas::DenseMatrix::row_major(hDense, M, H));

    // ---- naive reference in double -------------------------------------------------------------
    std::vector<double> yRef(M * D, 0.0), hRef(M * H, 0.0);
    std::int64_t refNnz = 0;
    for (std::int64_t m = 0; m < M; ++m)
        for (std::int64_t j = 0; j < H; ++j) {
            double g = 0.0, u = 0.0;
            for (std::int64_t d = 0; d < D; ++d) {
                g += static_cast<double>(x[m * D + d]) * wg[j * D + d];
                u += static_cast<double>(x[m * D + d]) * wu[j * D + d];
            }
            const double h = std::max(g, 0.0) * u;
            hRef[m * H + j] = h;
            refNnz += h != 0.0;
            for (std::int64_t d = 0; d < D; ++d) yRef[m * D + d] += h * wd[d * H + j];
        }

    const double errY = rel_error(y, yRef), errH = rel_error(hDense, hRef);
    std::printf("max relative error: Y %.3g, h %.3g; nnz %lld (reference %lld)\n", errY, errH,
                static_cast<long long>(info.nnz), static_cast<long long>(refNnz));
    if (!(errY < 1e-5) || !(errH < 1e-5) || info.nnz != refNnz || stats.tokens != M ||
        info.droppedValues != 0) {
        std::printf("FAIL\n");
        return 1;
    }
    std::printf("PASS\n");
    return 0;
}

}  // namespace

int main() {
    try {
        return run();
    } catch (const twblas::Exception &e) {
        std::fprintf(stderr, "twblas error: %s\n", e.what());
        return 1;
    }
}
