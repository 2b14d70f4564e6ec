// Shared helpers of the Catch2 tests: RAII owners of C objects, bf16 data, the naive fp64
// feed-forward and its gradients that the library is checked against, and error measures that
// print the worst entries when they fail.
#pragma once

#include <twblas/twblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "host/numeric.hpp"

namespace twtest {

/// REQUIRE that a call succeeds, printing its status and the handle's message otherwise.
#define TW_REQUIRE_OK(handle, call)                                                              \
    do {                                                                                         \
        const twStatus_t tw_status_ = (call);                                                    \
        INFO(#call << " -> " << twGetStatusName(tw_status_) << ": " << twGetErrorMessage(handle)); \
        REQUIRE(tw_status_ == TW_STATUS_SUCCESS);                                                \
    } while (0)

struct Handle {
    twHandle_t h = nullptr;
    explicit Handle(twBackend_t backend = TW_BACKEND_CPU) {
        REQUIRE(twCreateWithBackend(&h, backend) == TW_STATUS_SUCCESS);
    }
    ~Handle() { twDestroy(h); }
    Handle(const Handle &) = delete;
    Handle &operator=(const Handle &) = delete;
    operator twHandle_t() const { return h; }
};

/// A dense matrix: storage + descriptor. Values are kept as the bit patterns of `type`.
struct Dense {
    int64_t rows, cols, ld;
    twDataType_t type;
    twOrder_t order;
    std::vector<uint32_t> storage;  // 4-byte units, big enough for fp32
    twDnMatDescr_t d = nullptr;

    Dense(int64_t r, int64_t c, twDataType_t t, twOrder_t o = TW_ORDER_ROW, int64_t pad = 0)
        : rows(r), cols(c), ld((o == TW_ORDER_ROW ? c : r) + pad), type(t), order(o),
          storage(static_cast<size_t>(std::max<int64_t>(1, (o == TW_ORDER_ROW ? r : c) * ld))) {
        REQUIRE(twCreateDnMat(&d, r, c, ld, storage.data(), t, o) == TW_STATUS_SUCCESS);
    }
    ~Dense() { twDestroyDnMat(d); }
    Dense(const Dense &) = delete;
    Dense &operator=(const Dense &) = delete;
    operator twDnMatDescr_t() const { return d; }

    size_t at(int64_t r, int64_t c) const { return static_cast<size_t>(order == TW_ORDER_ROW ? r * ld + c : c * ld + r); }
    float get(int64_t r, int64_t c) const { return twblas::load_value(storage.data(), at(r, c), type); }
    void set(int64_t r, int64_t c, float v) { twblas::store_value(storage.data(), at(r, c), type, v); }
    /// Stores a bit pattern of the type as it is (NaN payloads and signs included).
    void set_bits(int64_t r, int64_t c, uint32_t b) {
        if (type == TW_R_32F)
            storage[at(r, c)] = b;
        else
            reinterpret_cast<uint16_t *>(storage.data())[at(r, c)] = static_cast<uint16_t>(b);
    }
    uint32_t bits(int64_t r, int64_t c) const {
        return type == TW_R_32F ? storage[at(r, c)] : reinterpret_cast<const uint16_t *>(storage.data())[at(r, c)];
    }
    /// Fills from a row-major rows x cols float array (rounded to the type).
    void fill(const std::vector<float> &v) {
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < cols; ++c) set(r, c, v[static_cast<size_t>(r * cols + c)]);
    }
    /// Every storage unit set to a recognisable poison pattern (NaN in every type).
    void poison() { std::fill(storage.begin(), storage.end(), 0x7fc17fc1u); }
    std::vector<double> to_double() const {
        std::vector<double> out(static_cast<size_t>(rows * cols));
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < cols; ++c) out[static_cast<size_t>(r * cols + c)] = get(r, c);
        return out;
    }
};

/// A sparse container: a 256-byte aligned buffer + descriptor.
struct Sparse {
    std::vector<uint8_t> raw;
    uint8_t *buffer = nullptr;
    size_t bytes = 0;
    twSpMatDescr_t d = nullptr;

    static std::unique_ptr<Sparse> twell(int64_t rows, int64_t cols, twDataType_t t = TW_R_16BF, int32_t tile = 256,
                                         int32_t compression = 8) {
        auto s = std::make_unique<Sparse>();
        REQUIRE(twTwellBufferSize(rows, cols, tile, compression, &s->bytes) == TW_STATUS_SUCCESS);
        s->allocate();
        REQUIRE(twCreateTwell(&s->d, rows, cols, tile, compression, s->buffer, t) == TW_STATUS_SUCCESS);
        return s;
    }
    static std::unique_ptr<Sparse> hybrid(int64_t rows, int64_t cols, int32_t ell_width, int64_t backup,
                                          twDataType_t t = TW_R_16BF) {
        auto s = std::make_unique<Sparse>();
        REQUIRE(twHybridBufferSize(rows, cols, ell_width, backup, t, &s->bytes) == TW_STATUS_SUCCESS);
        s->allocate();
        REQUIRE(twCreateHybrid(&s->d, rows, cols, ell_width, backup, s->buffer, t) == TW_STATUS_SUCCESS);
        return s;
    }
    void allocate() {
        raw.assign(bytes + 256, 0xA5);  // garbage, not zeros: writers must not rely on a cleared buffer
        const uintptr_t p = reinterpret_cast<uintptr_t>(raw.data());
        buffer = raw.data() + ((256 - p % 256) % 256);
    }
    uint32_t *words() { return reinterpret_cast<uint32_t *>(buffer); }
    ~Sparse() { twDestroySpMat(d); }
    operator twSpMatDescr_t() const { return d; }
};

inline twSpMatInfo_t info_of(twHandle_t h, twSpMatDescr_t s) {
    twSpMatInfo_t info{-1, -1, -1, -1};
    TW_REQUIRE_OK(h, twSpMatGetInfo(h, s, &info));
    return info;
}

inline std::vector<float> random_normal(size_t n, uint64_t seed, float scale = 1.0f) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> v(n);
    for (float &x : v) x = dist(rng);
    return v;
}

inline std::vector<float> rounded(std::vector<float> v, twDataType_t t) {
    for (float &x : v) x = twblas::round_to(t, x);
    return v;
}

/// Normwise relative error ||got - want|| / ||want|| (0 when both are 0), with a report of the
/// worst entries for failure messages.
struct ErrorReport {
    double rel = 0.0;
    std::string worst;
};
inline ErrorReport compare(const std::vector<double> &got, const std::vector<double> &want, int64_t cols) {
    double num = 0.0, den = 0.0;
    std::vector<size_t> idx(got.size());
    for (size_t i = 0; i < got.size(); ++i) {
        const double diff = got[i] - want[i];
        num += diff * diff;
        den += want[i] * want[i];
        idx[i] = i;
    }
    ErrorReport r;
    r.rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    if (std::isnan(num)) r.rel = INFINITY;
    const size_t k = std::min<size_t>(5, idx.size());
    std::partial_sort(idx.begin(), idx.begin() + static_cast<long>(k), idx.end(), [&](size_t a, size_t b) {
        const double da = std::fabs(got[a] - want[a]), db = std::fabs(got[b] - want[b]);
        return (std::isnan(da) ? INFINITY : da) > (std::isnan(db) ? INFINITY : db);
    });
    std::ostringstream os;
    os << "normwise relative error " << r.rel << "; worst entries:";
    for (size_t i = 0; i < k; ++i)
        os << " (" << idx[i] / static_cast<size_t>(std::max<int64_t>(cols, 1)) << ","
           << idx[i] % static_cast<size_t>(std::max<int64_t>(cols, 1)) << ") got " << got[idx[i]] << " want "
           << want[idx[i]] << ";";
    r.worst = os.str();
    return r;
}

/// Unit roundoff of a value type (half an ulp of 1).
inline double unit_roundoff(twDataType_t t) {
    return t == TW_R_32F ? std::ldexp(1.0, -24) : t == TW_R_16F ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
}

// ---- the naive fp64 feed-forward -----------------------------------------------------------

/// Row-major fp64 forward of a gated (wg non-empty) or plain ReLU FFN; every weight H x D.
/// When `round_type` is given, g, u and h are rounded to it as TW_COMPUTE_DEFAULT specifies.
struct NaiveFfn {
    int64_t m, d, h;
    std::vector<double> y, hidden, z;  // M x D, M x H, M x H (pre-activation of the ReLU)
};
inline NaiveFfn naive_ffn(int64_t m, int64_t d, int64_t h, const std::vector<float> &x, const std::vector<float> &wg,
                          const std::vector<float> &wu, const std::vector<float> &wd, const twDataType_t *round_type) {
    NaiveFfn out{m, d, h, std::vector<double>(static_cast<size_t>(m * d), 0.0),
                 std::vector<double>(static_cast<size_t>(m * h), 0.0), std::vector<double>(static_cast<size_t>(m * h), 0.0)};
    auto rnd = [&](double v) { return round_type ? static_cast<double>(twblas::round_to(*round_type, static_cast<float>(v))) : v; };
    const bool gated = !wg.empty();
    const std::vector<float> &ws = gated ? wg : wu;
    for (int64_t t = 0; t < m; ++t) {
        for (int64_t j = 0; j < h; ++j) {
            double zs = 0.0;
            for (int64_t k = 0; k < d; ++k) zs += double(x[t * d + k]) * ws[j * d + k];
            out.z[t * h + j] = zs;
            const double g = rnd(zs);
            if (!(g > 0.0)) continue;
            double hv = g;
            if (gated) {
                double u = 0.0;
                for (int64_t k = 0; k < d; ++k) u += double(x[t * d + k]) * wu[j * d + k];
                hv = rnd(g * rnd(u));
            }
            out.hidden[t * h + j] = hv;
            for (int64_t k = 0; k < d; ++k) out.y[t * d + k] += hv * wd[j * d + k];
        }
    }
    return out;
}

struct NaiveGrads {
    std::vector<double> dx, dwg, dwu, dwd;
};

/// fp64 gradients of L = sum(dY * y) + l1 * mean_t sum_j |h_tj|.
inline NaiveGrads naive_backward(int64_t m, int64_t d, int64_t hd, const std::vector<float> &x,
                                 const std::vector<float> &wg, const std::vector<float> &wu, const std::vector<float> &wd,
                                 const std::vector<float> &dy, double l1) {
    const bool gated = !wg.empty();
    const std::vector<float> &ws = gated ? wg : wu;
    NaiveGrads g{std::vector<double>(m * d, 0.0), std::vector<double>(gated ? hd * d : 0, 0.0),
                 std::vector<double>(hd * d, 0.0), std::vector<double>(hd * d, 0.0)};
    for (int64_t t = 0; t < m; ++t)
        for (int64_t j = 0; j < hd; ++j) {
            double z = 0, u = 0;
            for (int64_t k = 0; k < d; ++k) {
                z += double(x[t * d + k]) * ws[j * d + k];
                if (gated) u += double(x[t * d + k]) * wu[j * d + k];
            }
            if (!(z > 0)) continue;
            const double h = gated ? z * u : z;
            double dh = 0;
            for (int64_t k = 0; k < d; ++k) dh += double(dy[t * d + k]) * wd[j * d + k];
            dh += l1 / m * ((h > 0) - (h < 0));
            const double dz = gated ? dh * u : dh, du = gated ? dh * z : 0.0;
            for (int64_t k = 0; k < d; ++k) {
                g.dwd[j * d + k] += h * dy[t * d + k];
                if (gated) {
                    g.dwg[j * d + k] += dz * x[t * d + k];
                    g.dwu[j * d + k] += du * x[t * d + k];
                    g.dx[t * d + k] += dz * wg[j * d + k] + du * wu[j * d + k];
                } else {
                    g.dwu[j * d + k] += dz * x[t * d + k];
                    g.dx[t * d + k] += dz * wu[j * d + k];
                }
            }
        }
    return g;
}

}  // namespace twtest
