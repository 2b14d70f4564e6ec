// Shared parts of the libFuzzer fuzzers (tests/fuzz/README.md): reading the fuzz input, exactly
// sized buffers (so that AddressSanitizer sees any access past their end), and the checks every
// consumer of a sparse container must pass whatever the container's bytes hold.
//
// A failed check prints why and aborts: libFuzzer reports it as a crash and saves the input.
#pragma once

#include <twblas/twblas.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#include <sanitizer/asan_interface.h>
#define TWFUZZ_ASAN 1
#endif
#endif

#include "host/numeric.hpp"

namespace twfuzz {

[[noreturn]] inline void vfail(const char *where, const char *fmt, std::va_list args) {
    std::fprintf(stderr, "twfuzz: check failed: %s", where);
    std::vfprintf(stderr, fmt, args);
    std::fprintf(stderr, "\n");
    std::abort();
}
[[noreturn]] inline void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
inline void fail(const char *fmt, ...) {
    std::va_list args;
    va_start(args, fmt);
    vfail("", fmt, args);
}
[[noreturn]] inline void check_failed(const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
inline void check_failed(const char *file, int line, const char *cond, const char *fmt, ...) {
    char where[512];
    std::snprintf(where, sizeof where, "%s:%d: %s: ", file, line, cond);
    std::va_list args;
    va_start(args, fmt);
    vfail(where, fmt, args);
}

/// Aborts with the condition, its place and a printf-style explanation when `cond` is false.
#define TWFUZZ_CHECK(cond, ...)                                                                 \
    do {                                                                                        \
        if (!(cond)) twfuzz::check_failed(__FILE__, __LINE__, #cond, __VA_ARGS__);              \
    } while (0)

/// The fuzz input as a stream of bytes; past its end, a fixed pseudo-random sequence seeded by
/// the input's length (so every input still decides every value, deterministically).
class Input {
  public:
    Input(const uint8_t *data, size_t size) : data_(data), size_(size), lcg_(0x9e3779b97f4a7c15ull ^ size) {}
    uint8_t byte() {
        if (pos_ < size_) return data_[pos_++];
        lcg_ = lcg_ * 6364136223846793005ull + 1442695040888963407ull;
        return static_cast<uint8_t>(lcg_ >> 56);
    }
    uint16_t u16() { return static_cast<uint16_t>(byte() | (byte() << 8)); }
    uint32_t u32() { return static_cast<uint32_t>(u16()) | (static_cast<uint32_t>(u16()) << 16); }
    /// An integer in [lo, hi].
    int64_t range(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(u16() % static_cast<uint64_t>(hi - lo + 1)); }
    size_t left() const { return size_ - std::min(pos_, size_); }
    const uint8_t *rest() const { return data_ + std::min(pos_, size_); }
    void skip(size_t n) { pos_ += n; }

  private:
    const uint8_t *data_;
    size_t size_, pos_ = 0;
    uint64_t lcg_;
};

inline size_t value_bytes(twDataType_t t) { return t == TW_R_32F ? 4 : 2; }

/// Bytes on the heap of exactly the size asked for (at least 1), 16-byte aligned.
class Bytes {
  public:
    explicit Bytes(size_t n) : n_(n) {
        p_ = static_cast<uint8_t *>(std::aligned_alloc(16, std::max<size_t>(16, (n + 15) / 16 * 16)));
        if (!p_) std::abort();
        // ASan: poison the tail that rounding added, so the block is exactly n bytes to it
        tail_ = std::max<size_t>(16, (n + 15) / 16 * 16) - n;
#if defined(TWFUZZ_ASAN)
        if (tail_) __asan_poison_memory_region(p_ + n, tail_);
#endif
    }
    ~Bytes() {
#if defined(TWFUZZ_ASAN)
        if (tail_) __asan_unpoison_memory_region(p_ + n_, tail_);
#endif
        std::free(p_);
    }
    Bytes(const Bytes &) = delete;
    Bytes &operator=(const Bytes &) = delete;
    uint8_t *data() const { return p_; }
    size_t size() const { return n_; }
    void fill(uint8_t v) { std::memset(p_, v, n_); }
    std::vector<uint8_t> copy() const { return std::vector<uint8_t>(p_, p_ + n_); }
    bool equals(const std::vector<uint8_t> &v) const { return v.size() == n_ && (n_ == 0 || std::memcmp(p_, v.data(), n_) == 0); }

  private:
    uint8_t *p_ = nullptr;
    size_t n_ = 0, tail_ = 0;
};

struct Handle {
    twHandle_t h = nullptr;
    Handle() {
        if (twCreateWithBackend(&h, TW_BACKEND_CPU) != TW_STATUS_SUCCESS) fail("twCreateWithBackend(CPU) failed");
    }
    ~Handle() { twDestroy(h); }
    operator twHandle_t() const { return h; }
};

/// A row-major dense matrix over exactly sized memory.
struct Dense {
    int64_t rows, cols;
    twDataType_t type;
    Bytes mem;
    twDnMatDescr_t d = nullptr;
    Dense(int64_t r, int64_t c, twDataType_t t)
        : rows(r), cols(c), type(t), mem(static_cast<size_t>(r * c) * value_bytes(t)) {
        if (twCreateDnMat(&d, r, c, c, mem.data(), t, TW_ORDER_ROW) != TW_STATUS_SUCCESS)
            fail("twCreateDnMat %lld x %lld: %s", static_cast<long long>(r), static_cast<long long>(c),
                 twGetErrorMessage(nullptr));
    }
    ~Dense() { twDestroyDnMat(d); }
    operator twDnMatDescr_t() const { return d; }
    size_t count() const { return static_cast<size_t>(rows * cols); }
    uint32_t bits(size_t i) const {
        if (type == TW_R_32F) {
            uint32_t v;
            std::memcpy(&v, mem.data() + 4 * i, 4);
            return v;
        }
        uint16_t v;
        std::memcpy(&v, mem.data() + 2 * i, 2);
        return v;
    }
    void set_bits(size_t i, uint32_t b) {
        if (type == TW_R_32F) {
            std::memcpy(mem.data() + 4 * i, &b, 4);
        } else {
            const uint16_t v = static_cast<uint16_t>(b);
            std::memcpy(mem.data() + 2 * i, &v, 2);
        }
    }
    float get(size_t i) const { return twblas::load_value(mem.data(), i, type); }
    void set(size_t i, float v) { twblas::store_value(mem.data(), i, type, v); }
    std::vector<uint32_t> all_bits() const {
        std::vector<uint32_t> out(count());
        for (size_t i = 0; i < out.size(); ++i) out[i] = bits(i);
        return out;
    }
    /// Every byte set to `v` (0x7f: NaN in every type; 0x3c: a finite value in every type).
    void poison(uint8_t v) { mem.fill(v); }
};

/// A TwELL or hybrid container over an exactly sized buffer.
struct Sparse {
    twFormat_t format;
    int64_t rows, cols;
    twDataType_t type;
    int32_t tile = 0, compression = 0, ell_width = 0;
    int64_t backup_rows = 0;
    Bytes mem;
    twSpMatDescr_t d = nullptr;

    static size_t twell_bytes(int64_t rows, int64_t cols, int32_t tile, int32_t compression) {
        size_t n = 0;
        if (twTwellBufferSize(rows, cols, tile, compression, &n) != TW_STATUS_SUCCESS) fail("twTwellBufferSize");
        return n;
    }
    static size_t hybrid_bytes(int64_t rows, int64_t cols, int32_t e, int64_t b, twDataType_t t) {
        size_t n = 0;
        if (twHybridBufferSize(rows, cols, e, b, t, &n) != TW_STATUS_SUCCESS) fail("twHybridBufferSize");
        return n;
    }
    Sparse(int64_t r, int64_t c, twDataType_t t, int32_t tile_width, int32_t comp)
        : format(TW_FORMAT_TWELL), rows(r), cols(c), type(t), tile(tile_width), compression(comp),
          mem(twell_bytes(r, c, tile_width, comp)) {
        mem.fill(0xA5);
        if (twCreateTwell(&d, r, c, tile_width, comp, mem.data(), t) != TW_STATUS_SUCCESS)
            fail("twCreateTwell: %s", twGetErrorMessage(nullptr));
    }
    Sparse(int64_t r, int64_t c, twDataType_t t, int32_t e, int64_t b, bool /*hybrid tag*/)
        : format(TW_FORMAT_HYBRID), rows(r), cols(c), type(t), ell_width(e), backup_rows(b),
          mem(hybrid_bytes(r, c, e, b, t)) {
        mem.fill(0xA5);
        if (twCreateHybrid(&d, r, c, e, b, mem.data(), t) != TW_STATUS_SUCCESS)
            fail("twCreateHybrid: %s", twGetErrorMessage(nullptr));
    }
    ~Sparse() { twDestroySpMat(d); }
    operator twSpMatDescr_t() const { return d; }
    /// Whether a valid container with these counts lacks rows (docs/formats.md, section 4).
    bool incomplete(const twSpMatInfo_t &info) const {
        return format == TW_FORMAT_TWELL ? info.overflowRows > 0 : info.overflowRows > backup_rows;
    }
};

inline const char *status_name(twStatus_t s) { return twGetStatusName(s); }

/// TWFUZZ_VERBOSE=1 in the environment: the fuzzers say what each input decoded to.
inline bool verbose() {
    static const bool on = [] {
        const char *v = std::getenv("TWFUZZ_VERBOSE");
        return v && *v && *v != '0';
    }();
    return on;
}

/// A status for a sparse input that validates but lacks rows: a refusal (CAPACITY_EXCEEDED
/// today; whatever the library names it, never SUCCESS and never a crash).
inline bool is_refusal_of_incomplete(twStatus_t s) {
    return s != TW_STATUS_SUCCESS && s != TW_STATUS_INTERNAL_ERROR && s != TW_STATUS_INVALID_VALUE &&
           s != TW_STATUS_NOT_INITIALIZED;
}

/// Row-major bits of the container's matrix through twSparseToDense, checked to be fully written
/// (two runs over different poisons agree). Returns false when the call refused the input.
inline twStatus_t to_dense(twHandle_t h, const Sparse &s, std::vector<uint32_t> &out) {
    Dense a(s.rows, s.cols, s.type), b(s.rows, s.cols, s.type);
    a.poison(0x7f);
    b.poison(0x3c);
    const std::vector<uint8_t> a0 = a.mem.copy(), b0 = b.mem.copy();
    const twStatus_t sa = twSparseToDense(h, s, a);
    const twStatus_t sb = twSparseToDense(h, s, b);
    TWFUZZ_CHECK(sa == sb, "twSparseToDense answered %s then %s", status_name(sa), status_name(sb));
    if (sa != TW_STATUS_SUCCESS) {
        TWFUZZ_CHECK(a.mem.equals(a0) && b.mem.equals(b0), "twSparseToDense returned %s but wrote its output",
                     status_name(sa));
        return sa;
    }
    out = a.all_bits();
    TWFUZZ_CHECK(out == b.all_bits(), "twSparseToDense left elements of its output unwritten");
    return sa;
}

/// Every consumer of a sparse container on `s`, whatever its bytes: twSpMatGetInfo,
/// twSpMatValidate, twSparseToDense, twSparseConvert, twSparseTranspose and twSpMM. A consumer
/// that validates its input must answer INVALID_VALUE exactly when twSpMatValidate does, with
/// its output untouched; an incomplete input is refused with the output untouched; a valid,
/// complete input gives exact results.
inline void check_consumers(const Sparse &s, Input &in) {
    Handle h;
    twSpMatInfo_t info{-1, -1, -1, -1};
    const twStatus_t si = twSpMatGetInfo(h, s, &info);
    TWFUZZ_CHECK(si == TW_STATUS_SUCCESS, "twSpMatGetInfo: %s: %s", status_name(si), twGetErrorMessage(h));
    const twStatus_t sv = twSpMatValidate(h, s);
    TWFUZZ_CHECK(sv == TW_STATUS_SUCCESS || sv == TW_STATUS_INVALID_VALUE, "twSpMatValidate: %s", status_name(sv));
    const bool valid = sv == TW_STATUS_SUCCESS;
    const bool incomplete = valid && s.incomplete(info);
    if (verbose())
        std::fprintf(stderr, "twfuzz: %s %s %lld x %lld: %s%s%s\n", s.format == TW_FORMAT_TWELL ? "TwELL" : "hybrid",
                     s.type == TW_R_32F ? "fp32" : s.type == TW_R_16F ? "fp16" : "bf16", static_cast<long long>(s.rows),
                     static_cast<long long>(s.cols), valid ? "valid" : twGetErrorMessage(h),
                     incomplete ? ", incomplete" : "", valid && !incomplete ? ", complete" : "");
    if (valid) {
        TWFUZZ_CHECK(info.nnz >= 0 && info.maxRowNnz >= 0 && info.maxRowNnz <= s.cols && info.overflowRows >= 0 &&
                         info.overflowRows <= s.rows && info.droppedValues == 0,
                     "twSpMatGetInfo of a valid container: nnz %lld max %lld overflow %lld", static_cast<long long>(info.nnz),
                     static_cast<long long>(info.maxRowNnz), static_cast<long long>(info.overflowRows));
    }
    // the status expected of a consumer reading `s` (other than for its output's capacity)
    auto expect_refusal = [&](twStatus_t st, const char *what, bool untouched) {
        if (!valid)
            TWFUZZ_CHECK(st == TW_STATUS_INVALID_VALUE, "%s on an invalid input: %s, not INVALID_VALUE", what, status_name(st));
        else
            TWFUZZ_CHECK(is_refusal_of_incomplete(st), "%s on an incomplete input: %s", what, status_name(st));
        TWFUZZ_CHECK(untouched, "%s refused its input (%s) but wrote its output", what, status_name(st));
    };

    // twSparseToDense
    std::vector<uint32_t> dense;
    const twStatus_t sd = to_dense(h, s, dense);
    if (!valid || incomplete) {
        expect_refusal(sd, "twSparseToDense", true);
    } else {
        TWFUZZ_CHECK(sd == TW_STATUS_SUCCESS, "twSparseToDense on a valid, complete input: %s: %s", status_name(sd),
                     twGetErrorMessage(h));
        int64_t nonzero = 0;
        for (uint32_t b : dense) nonzero += b != 0;
        TWFUZZ_CHECK(nonzero <= info.nnz, "twSparseToDense gave %lld non-zeros, twSpMatGetInfo counts %lld stored",
                     static_cast<long long>(nonzero), static_cast<long long>(info.nnz));
    }
    const bool exact = valid && !incomplete;

    // twSparseConvert into the other format (TwELL <-> hybrid; fp32 hybrid -> another hybrid)
    {
        const uint8_t pick = in.byte();
        std::unique_ptr<Sparse> out;
        if (s.format == TW_FORMAT_HYBRID && s.type != TW_R_32F)
            out = std::make_unique<Sparse>(s.rows, s.cols, s.type, 64 << (pick % 3), 2 << (pick / 3 % 3));
        else
            out = std::make_unique<Sparse>(s.rows, s.cols, s.type, 8 * (1 + pick % 4), (pick >> 4) % (s.rows + 1), true);
        const std::vector<uint8_t> before = out->mem.copy();
        const twStatus_t sc = twSparseConvert(h, s, *out);
        if (!exact) {
            expect_refusal(sc, "twSparseConvert", out->mem.equals(before));
        } else {
            TWFUZZ_CHECK(sc == TW_STATUS_SUCCESS || sc == TW_STATUS_CAPACITY_EXCEEDED, "twSparseConvert: %s: %s",
                         status_name(sc), twGetErrorMessage(h));
            const twStatus_t ov = twSpMatValidate(h, *out);
            TWFUZZ_CHECK(ov == TW_STATUS_SUCCESS, "twSparseConvert wrote an invalid container: %s", twGetErrorMessage(h));
            twSpMatInfo_t oinfo{};
            TWFUZZ_CHECK(twSpMatGetInfo(h, *out, &oinfo) == TW_STATUS_SUCCESS, "twSpMatGetInfo(out)");
            TWFUZZ_CHECK((sc == TW_STATUS_CAPACITY_EXCEEDED) == out->incomplete(oinfo),
                         "twSparseConvert returned %s but the output %s rows", status_name(sc),
                         out->incomplete(oinfo) ? "records lost" : "holds all");
            if (sc == TW_STATUS_SUCCESS) {
                std::vector<uint32_t> back;
                TWFUZZ_CHECK(to_dense(h, *out, back) == TW_STATUS_SUCCESS, "twSparseToDense of the converted container");
                TWFUZZ_CHECK(back == dense, "twSparseConvert changed the matrix");
            }
        }
    }

    // twSparseTranspose into a hybrid that can hold any row (B = rows of the output)
    {
        Sparse out(s.cols, s.rows, s.type, 8, s.cols, true);
        const std::vector<uint8_t> before = out.mem.copy();
        const twStatus_t st = twSparseTranspose(h, s, out);
        if (!exact) {
            expect_refusal(st, "twSparseTranspose", out.mem.equals(before));
        } else {
            TWFUZZ_CHECK(st == TW_STATUS_SUCCESS, "twSparseTranspose: %s: %s", status_name(st), twGetErrorMessage(h));
            TWFUZZ_CHECK(twSpMatValidate(h, out) == TW_STATUS_SUCCESS, "twSparseTranspose wrote an invalid container: %s",
                         twGetErrorMessage(h));
            std::vector<uint32_t> back;
            TWFUZZ_CHECK(to_dense(h, out, back) == TW_STATUS_SUCCESS, "twSparseToDense of the transpose");
            for (int64_t r = 0; r < s.rows; ++r)
                for (int64_t c = 0; c < s.cols; ++c)
                    TWFUZZ_CHECK(back[static_cast<size_t>(c * s.rows + r)] == dense[static_cast<size_t>(r * s.cols + c)],
                                 "twSparseTranspose: element (%lld, %lld) differs", static_cast<long long>(r),
                                 static_cast<long long>(c));
        }
    }

    // twSpMM: Y = S W (beta 0: Y is not read), W small integers, over two poisons of Y
    {
        const int64_t n = 1 + in.byte() % 3;
        Dense w(s.cols, n, TW_R_32F), ya(s.rows, n, TW_R_32F), yb(s.rows, n, TW_R_32F);
        for (size_t i = 0; i < w.count(); ++i) w.set(i, static_cast<float>(static_cast<int>(in.byte() % 5) - 2));
        ya.poison(0x7f);
        yb.poison(0x3c);
        const std::vector<uint8_t> a0 = ya.mem.copy(), b0 = yb.mem.copy();
        size_t ws = 0;
        TWFUZZ_CHECK(twSpMM_bufferSize(h, s, w, ya, &ws) == TW_STATUS_SUCCESS, "twSpMM_bufferSize: %s", twGetErrorMessage(h));
        Bytes workspace(ws);
        const twStatus_t sa = twSpMM(h, 1.0f, s, w, 0.0f, ya, ws ? workspace.data() : nullptr);
        const twStatus_t sb = twSpMM(h, 1.0f, s, w, 0.0f, yb, ws ? workspace.data() : nullptr);
        TWFUZZ_CHECK(sa == sb, "twSpMM answered %s then %s", status_name(sa), status_name(sb));
        if (!exact) {
            expect_refusal(sa, "twSpMM", ya.mem.equals(a0) && yb.mem.equals(b0));
        } else {
            TWFUZZ_CHECK(sa == TW_STATUS_SUCCESS, "twSpMM: %s: %s", status_name(sa), twGetErrorMessage(h));
            TWFUZZ_CHECK(ya.all_bits() == yb.all_bits(), "twSpMM left elements of Y unwritten (or read Y with beta 0)");
            // fp64 oracle from the dense matrix: fp32 accumulation of K products, each rounded
            for (int64_t r = 0; r < s.rows; ++r)
                for (int64_t c = 0; c < n; ++c) {
                    double ref = 0.0, mag = 0.0;
                    for (int64_t k = 0; k < s.cols; ++k) {
                        const uint32_t b = dense[static_cast<size_t>(r * s.cols + k)];
                        if (b == 0) continue;  // +0 is not stored: contributes nothing, even times Inf
                        const double v = s.type == TW_R_32F ? twblas::bits_float(b)
                                                            : twblas::value_of_bits16(s.type, static_cast<uint16_t>(b));
                        const double t = v * w.get(static_cast<size_t>(k * n + c));
                        ref += t;
                        mag += std::fabs(t);
                    }
                    const double got = ya.get(static_cast<size_t>(r * n + c));
                    if (std::isnan(ref)) {
                        TWFUZZ_CHECK(std::isnan(got), "twSpMM (%lld, %lld): %g, expected NaN", static_cast<long long>(r),
                                     static_cast<long long>(c), got);
                    } else if (std::isinf(ref) || mag > 1e37) {
                        // fp32 may overflow where fp64 does not: only the sign of an infinity is sure
                        if (std::isinf(ref))
                            TWFUZZ_CHECK(got == ref || std::isnan(got), "twSpMM (%lld, %lld): %g, expected %g",
                                         static_cast<long long>(r), static_cast<long long>(c), got, ref);
                    } else {
                        const double bound = (static_cast<double>(s.cols) + 2) * (std::ldexp(1.0, -23) * mag + std::ldexp(1.0, -149));
                        TWFUZZ_CHECK(std::fabs(got - ref) <= bound, "twSpMM (%lld, %lld): %.9g, expected %.9g within %g",
                                     static_cast<long long>(r), static_cast<long long>(c), got, ref, bound);
                    }
                }
        }
    }
}

}  // namespace twfuzz
