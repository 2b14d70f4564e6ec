// Automated bad-argument tests for every function of twblas.h, on a CPU handle.
//
// The contract (include/twblas/twblas.h, design/api.md):
//  - a NULL, destroyed or foreign handle/descriptor gives TW_STATUS_NOT_INITIALIZED, never a crash;
//  - a bad pointer, size, layout or enum gives TW_STATUS_INVALID_VALUE; a valid request the
//    library does not do (value type, cols > 65536) gives TW_STATUS_NOT_SUPPORTED;
//  - twGetErrorMessage() names the offending argument as the header spells it;
//  - a failing call leaves every output untouched.
//
// Each function gets a Suite: its valid arguments (which must succeed), then cases that each
// spoil one argument. Before every case the suite snapshots every output region the fixture
// owns (poisoned dense outputs, sparse buffers, saved state, output variables) and afterwards
// checks that a failing call wrote none of them.
#include <catch2/catch.hpp>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "twblas/twblas.h"

namespace {

constexpr int64_t kM = 3;   // tokens
constexpr int64_t kD = 16;  // model dimension
constexpr int64_t kH = 40;  // hidden dimension
constexpr unsigned char kPoison = 0xA5;
constexpr size_t kPoisonBytes = 12345;

template <class T>
T poison_ptr() {
    return reinterpret_cast<T>(static_cast<uintptr_t>(0x5A5A5A5A5A5A5A50ull));
}

std::string status_name(twStatus_t s) {
    const char *n = twGetStatusName(s);
    return n ? n : "(null)";
}
std::string error_message(twHandle_t h) {
    const char *m = twGetErrorMessage(h);
    return m ? m : "(null)";
}

bool is_word_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

/// `word` occurs in `text` as a whole word ("X" matches "X: expected", not "MAX").
bool has_word(const std::string &text, const std::string &word) {
    for (size_t p = text.find(word); p != std::string::npos; p = text.find(word, p + 1)) {
        const size_t e = p + word.size();
        if ((p == 0 || !is_word_char(text[p - 1])) && (e >= text.size() || !is_word_char(text[e])))
            return true;
    }
    return false;
}
/// `needle` is "a" or "a|b|...": any alternative counts.
bool mentions(const std::string &text, const std::string &needle) {
    size_t start = 0;
    while (true) {
        const size_t bar = needle.find('|', start);
        if (has_word(text, needle.substr(start, bar - start))) return true;
        if (bar == std::string::npos) return false;
        start = bar + 1;
    }
}

uint16_t to_bf16(float f) {  // round to nearest even; the test values are exact anyway
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}

/// Bytes at a fixed, 256-byte aligned address for the buffer's lifetime.
class Buffer {
  public:
    Buffer(size_t n, unsigned char fill) : raw_(n + 256, fill), n_(n) {
        const uintptr_t a = reinterpret_cast<uintptr_t>(raw_.data());
        p_ = raw_.data() + ((256 - a % 256) % 256);
    }
    Buffer(const Buffer &) = delete;
    Buffer &operator=(const Buffer &) = delete;
    unsigned char *data() const { return p_; }
    size_t size() const { return n_; }

  private:
    std::vector<unsigned char> raw_;
    unsigned char *p_ = nullptr;
    size_t n_ = 0;
};

/// How a dense matrix is filled: poisoned (an output), small exact values, a sparse pattern
/// (about one element in 11 non-zero: no TwELL tile of 64 overflows), every element non-zero.
enum class Fill { Poison, Data, Sparse, Full, Zero };

struct Dn {
    twDnMatDescr_t d = nullptr;
    Buffer *mem = nullptr;  // NULL for an empty matrix
};
struct Sp {
    twSpMatDescr_t d = nullptr;
    Buffer *mem = nullptr;
};

/// What a NULL descriptor argument means for a function.
enum class Null { NotInitialized, Allowed, Invalid };

/// A CPU handle, objects over host memory, poisoned output variables, and invalid objects of
/// every kind (destroyed, foreign, another kind).
class Fixture {
  public:
    twHandle_t h = nullptr;
    int foreign = 0x600d;  // a plain int posing as an object

    // Output variables, poisoned; every one is watched.
    twHandle_t out_h = poison_ptr<twHandle_t>();
    twDnMatDescr_t out_dn = poison_ptr<twDnMatDescr_t>();
    twSpMatDescr_t out_sp = poison_ptr<twSpMatDescr_t>();
    twFfnDescr_t out_ffn = poison_ptr<twFfnDescr_t>();
    size_t bytes = kPoisonBytes;
    twBackend_t out_backend = static_cast<twBackend_t>(77);
    void *out_ptr = poison_ptr<void *>();
    int out_int = -12345;
    int64_t out_i64[3] = {-7, -7, -7};
    twDataType_t out_type = static_cast<twDataType_t>(77);
    twOrder_t out_order = static_cast<twOrder_t>(77);
    twFormat_t out_format = static_cast<twFormat_t>(77);
    twSpMatInfo_t out_info;
    twFfnStats_t out_stats;
    int64_t out_attr = -7;  // 8 bytes, so a write of the wrong size shows too
    Buffer *counts = nullptr;

    // FFN weights (fp32, logical H x D) and two FFNs on them.
    Dn wg, wu, wd;
    twFfnDescr_t ffn = nullptr;       // gated
    twFfnDescr_t ffn_relu = nullptr;  // plain ReLU

    Fixture() {
        REQUIRE(twCreateWithBackend(&h, TW_BACKEND_CPU) == TW_STATUS_SUCCESS);
        std::memset(&out_info, kPoison, sizeof out_info);
        std::memset(&out_stats, kPoison, sizeof out_stats);
        watch("*handle", &out_h, sizeof out_h);
        watch("*descr (dense)", &out_dn, sizeof out_dn);
        watch("*descr (sparse)", &out_sp, sizeof out_sp);
        watch("*ffn", &out_ffn, sizeof out_ffn);
        watch("*bytes", &bytes, sizeof bytes);
        watch("*backend", &out_backend, sizeof out_backend);
        watch("pointer output", &out_ptr, sizeof out_ptr);
        watch("*version", &out_int, sizeof out_int);
        watch("int64 outputs", out_i64, sizeof out_i64);
        watch("*valueType", &out_type, sizeof out_type);
        watch("*order", &out_order, sizeof out_order);
        watch("*format", &out_format, sizeof out_format);
        watch("*info", &out_info, sizeof out_info);
        watch("*stats", &out_stats, sizeof out_stats);
        watch("attribute value", &out_attr, sizeof out_attr);
        counts = &buffer("counts", kH * sizeof(int64_t), kPoison, true);

        wg = dense("wGate", kH, kD, TW_R_32F, Fill::Data);
        wu = dense("wUp", kH, kD, TW_R_32F, Fill::Data);
        wd = dense("wDown", kH, kD, TW_R_32F, Fill::Data);
        REQUIRE(twCreateFfn(h, &ffn, TW_FFN_GATED_RELU, wg.d, wu.d, wd.d) == TW_STATUS_SUCCESS);
        REQUIRE(twCreateFfn(h, &ffn_relu, TW_FFN_RELU, nullptr, wu.d, wd.d) == TW_STATUS_SUCCESS);
        other_sp_ = hybrid("other-kind object", 4, 16, 8, 4, TW_R_32F).d;
    }
    ~Fixture() {
        for (twFfnDescr_t f : {ffn, ffn_relu}) twDestroyFfn(f);
        for (twSpMatDescr_t s : sps_) twDestroySpMat(s);
        for (twDnMatDescr_t d : dns_) twDestroyDnMat(d);
        twDestroy(h);
    }
    Fixture(const Fixture &) = delete;
    Fixture &operator=(const Fixture &) = delete;

    void watch(std::string name, void *p, size_t n) {
        regions_.push_back({std::move(name), static_cast<unsigned char *>(p), n});
    }
    Buffer &buffer(const std::string &name, size_t n, unsigned char fill, bool output) {
        buffers_.push_back(std::make_unique<Buffer>(n, fill));
        if (output) watch(name, buffers_.back()->data(), n);
        return *buffers_.back();
    }

    /// A dense matrix over its own memory; outputs (Fill::Poison) are watched.
    Dn dense(const std::string &name, int64_t rows, int64_t cols, twDataType_t type, Fill fill,
             twOrder_t order = TW_ORDER_ROW) {
        const int64_t ld = order == TW_ORDER_ROW ? cols : rows;
        const size_t n = static_cast<size_t>((order == TW_ORDER_ROW ? rows : cols) * ld);
        const size_t esize = type == TW_R_32F ? 4 : 2;
        Dn m;
        if (n > 0) {
            m.mem = &buffer(name, n * esize, kPoison, fill == Fill::Poison);
            for (size_t i = 0; i < n && fill != Fill::Poison; ++i) {
                float v = 0;
                if (fill == Fill::Data) v = static_cast<float>(static_cast<int>((i * 7 + 3) % 9) - 4) * 0.25f;
                if (fill == Fill::Sparse) v = i % 11 == 0 ? 1.0f + static_cast<float>(i % 4) : 0.0f;
                if (fill == Fill::Full) v = 1.0f + static_cast<float>(i % 4);
                if (type == TW_R_32F) {
                    std::memcpy(m.mem->data() + 4 * i, &v, 4);
                } else {
                    const uint16_t b = to_bf16(v);
                    std::memcpy(m.mem->data() + 2 * i, &b, 2);
                }
            }
        }
        REQUIRE(twCreateDnMat(&m.d, rows, cols, ld, m.mem ? m.mem->data() : nullptr, type, order) ==
                TW_STATUS_SUCCESS);
        dns_.push_back(m.d);
        return m;
    }
    /// A TwELL matrix over a poisoned, watched buffer.
    Sp twell(const std::string &name, int64_t rows, int64_t cols, int32_t tile, int32_t comp,
             twDataType_t type = TW_R_16BF) {
        size_t n = 0;
        REQUIRE(twTwellBufferSize(rows, cols, tile, comp, &n) == TW_STATUS_SUCCESS);
        Sp s;
        s.mem = &buffer(name, n, kPoison, true);
        REQUIRE(twCreateTwell(&s.d, rows, cols, tile, comp, s.mem->data(), type) == TW_STATUS_SUCCESS);
        sps_.push_back(s.d);
        return s;
    }
    /// A hybrid matrix over a poisoned, watched buffer.
    Sp hybrid(const std::string &name, int64_t rows, int64_t cols, int32_t ell, int64_t backup,
              twDataType_t type) {
        size_t n = 0;
        REQUIRE(twHybridBufferSize(rows, cols, ell, backup, type, &n) == TW_STATUS_SUCCESS);
        Sp s;
        s.mem = &buffer(name, n, kPoison, true);
        REQUIRE(twCreateHybrid(&s.d, rows, cols, ell, backup, s.mem->data(), type) == TW_STATUS_SUCCESS);
        sps_.push_back(s.d);
        return s;
    }
    /// A workspace of `n` bytes (NULL for 0), not watched: scratch, not an output.
    void *workspace(size_t n) { return n ? buffer("workspace", n, 0, false).data() : nullptr; }

    // ---- snapshots of every watched region
    using Snapshot = std::vector<std::vector<unsigned char>>;
    Snapshot snapshot() const {
        Snapshot s;
        for (const Region &r : regions_) s.emplace_back(r.p, r.p + r.n);
        return s;
    }
    /// Names of the regions that differ from the snapshot ("" when none).
    std::string changed_since(const Snapshot &s) const {
        std::string names;
        if (s.size() != regions_.size()) return "(regions added during the call: test bug)";
        for (size_t i = 0; i < regions_.size(); ++i)
            if (std::memcmp(s[i].data(), regions_[i].p, regions_[i].n) != 0)
                names += (names.empty() ? "" : ", ") + regions_[i].name;
        return names;
    }

    // ---- invalid objects: made right before use, so nothing can reuse a destroyed address
    template <class T>
    T destroyed() {
        T t = nullptr;
        if constexpr (std::is_same_v<T, twHandle_t>) {
            REQUIRE(twCreateWithBackend(&t, TW_BACKEND_CPU) == TW_STATUS_SUCCESS);
            REQUIRE(twDestroy(t) == TW_STATUS_SUCCESS);
        } else if constexpr (std::is_same_v<T, twDnMatDescr_t>) {
            static float storage[4];
            REQUIRE(twCreateDnMat(&t, 2, 2, 2, storage, TW_R_32F, TW_ORDER_ROW) == TW_STATUS_SUCCESS);
            REQUIRE(twDestroyDnMat(t) == TW_STATUS_SUCCESS);
        } else if constexpr (std::is_same_v<T, twSpMatDescr_t>) {
            alignas(256) static unsigned char storage[1 << 16];
            REQUIRE(twCreateHybrid(&t, 4, 16, 8, 4, storage, TW_R_32F) == TW_STATUS_SUCCESS);
            REQUIRE(twDestroySpMat(t) == TW_STATUS_SUCCESS);
        } else {
            REQUIRE(twCreateFfn(h, &t, TW_FFN_RELU, nullptr, wu.d, wd.d) == TW_STATUS_SUCCESS);
            REQUIRE(twDestroyFfn(t) == TW_STATUS_SUCCESS);
        }
        return t;
    }
    /// A live object of another kind, cast (a dense descriptor, or a sparse one for dense).
    template <class T>
    T other_kind() {
        if constexpr (std::is_same_v<T, twDnMatDescr_t>) {
            return reinterpret_cast<T>(other_sp_);
        } else {
            return reinterpret_cast<T>(wu.d);
        }
    }
    template <class T>
    struct Invalid {
        std::string what;
        bool is_null;
        std::function<T()> make;
    };
    template <class T>
    std::vector<Invalid<T>> invalid_objects() {
        return {{"NULL", true, [] { return T(nullptr); }},
                {"destroyed", false, [this] { return destroyed<T>(); }},
                {"foreign (a pointer to an int)", false, [this] { return reinterpret_cast<T>(&foreign); }},
                {"another kind of object", false, [this] { return other_kind<T>(); }}};
    }

  private:
    struct Region {
        std::string name;
        unsigned char *p;
        size_t n;
    };
    std::vector<Region> regions_;
    std::vector<std::unique_ptr<Buffer>> buffers_;
    std::vector<twDnMatDescr_t> dns_;
    std::vector<twSpMatDescr_t> sps_;
    twSpMatDescr_t other_sp_ = nullptr;
};

/// Checks one failing call: status, message names, outputs untouched.
void check_failure(const std::string &what, twStatus_t expected, const std::vector<std::string> &names,
                   twStatus_t got, const std::string &message, const std::string &changed) {
    INFO(what);
    INFO("message: \"" << message << "\"");
    CHECK(status_name(got) == status_name(expected));
    if (got == TW_STATUS_SUCCESS) return;
    for (const std::string &n : names) {
        INFO("the message should name " << n);
        CHECK(mentions(message, n));
    }
    INFO("outputs written by the failing call: " << changed);
    CHECK(changed.empty());
}

/// One function's arguments: `good` must succeed; each case spoils one argument. Args is a
/// struct of the call's arguments whose first member is `twHandle_t h` (left NULL for the
/// functions that take no handle): the message is read from it when it is the fixture's.
template <class Args>
class Suite {
  public:
    using value_type = Args;
    using Call = std::function<twStatus_t(const Args &)>;
    Suite(Fixture &f, std::string function, Args good, Call call)
        : f_(f), fn_(std::move(function)), good_(good), call_(std::move(call)) {}

    Suite &bad(std::string what, std::function<void(Args &)> spoil, twStatus_t expected,
               std::vector<std::string> names = {}) {
        cases_.push_back({std::move(what), std::move(spoil), expected, std::move(names)});
        return *this;
    }
    /// NULL, destroyed, foreign and other-kind objects as argument `m` (named `name`).
    template <class T>
    Suite &objects(const std::string &name, T Args::*m, Null null = Null::NotInitialized) {
        for (auto &inv : f_.template invalid_objects<T>()) {
            if (inv.is_null && null == Null::Allowed) continue;
            const twStatus_t st = inv.is_null && null == Null::Invalid ? TW_STATUS_INVALID_VALUE
                                                                        : TW_STATUS_NOT_INITIALIZED;
            auto make = inv.make;
            bad(name + " " + inv.what, [m, make](Args &a) { a.*m = make(); }, st, {name});
        }
        return *this;
    }
    /// The handle argument (spelled `h` or `handle` in the header).
    Suite &handle() { return objects<twHandle_t>("h|handle", &Args::h); }
    /// Undoes an (unexpectedly) successful call: destroys what it created, resets what it set.
    Suite &cleanup(std::function<void(const Args &)> undo) {
        undo_ = std::move(undo);
        return *this;
    }

    void run() {
        good_call("with valid arguments");
        for (const Case &c : cases_) {
            Args a = good_;
            const Fixture::Snapshot before = f_.snapshot();
            c.spoil(a);
            const twStatus_t st = call_(a);
            const std::string msg = error_message(a.h == f_.h ? f_.h : nullptr);
            check_failure(fn_ + ": " + c.what, c.expected, c.names, st, msg, f_.changed_since(before));
            if (st == TW_STATUS_SUCCESS && undo_) undo_(a);
        }
        good_call("with valid arguments, after the failures");
    }

  private:
    struct Case {
        std::string what;
        std::function<void(Args &)> spoil;
        twStatus_t expected;
        std::vector<std::string> names;
    };
    void good_call(const char *when) {
        Args a = good_;
        const twStatus_t st = call_(a);
        INFO(fn_ << " " << when << "; message: \"" << error_message(a.h) << "\"");
        REQUIRE(status_name(st) == "TW_STATUS_SUCCESS");
        if (undo_) undo_(a);
    }
    Fixture &f_;
    std::string fn_;
    Args good_;
    Call call_;
    std::function<void(const Args &)> undo_;
    std::vector<Case> cases_;
};

constexpr twStatus_t kInvalid = TW_STATUS_INVALID_VALUE;
constexpr twStatus_t kNotInit = TW_STATUS_NOT_INITIALIZED;
constexpr twStatus_t kNotSupported = TW_STATUS_NOT_SUPPORTED;

/// Destroy functions: NULL succeeds; destroyed (twice), foreign and other-kind objects give
/// NOT_INITIALIZED; the other-kind object survives (checked by `alive`).
template <class T>
void check_destroy(Fixture &f, const char *fn, const char *name, twStatus_t (*destroy)(T),
                   const std::function<bool(void *)> &alive) {
    INFO(fn);
    CHECK(status_name(destroy(nullptr)) == "TW_STATUS_SUCCESS");
    for (auto &inv : f.template invalid_objects<T>()) {
        if (inv.is_null) continue;
        const T t = inv.make();
        const twStatus_t st = destroy(t);
        check_failure(std::string(fn) + ": " + inv.what, kNotInit, {name}, st, error_message(nullptr), "");
    }
    void *other = reinterpret_cast<void *>(f.template other_kind<T>());
    CHECK(alive(other));
}

/// Dense -> sparse in three phases; the status of the first phase that does not succeed.
twStatus_t dense_to_sparse(Fixture &f, twDnMatDescr_t in, twSpMatDescr_t out) {
    size_t n = 0;
    REQUIRE(twDenseToSparse_bufferSize(f.h, in, out, TW_CONVERT_PLAIN, &n) == TW_STATUS_SUCCESS);
    void *ws = f.workspace(n);
    const twStatus_t st = twDenseToSparse_analysis(f.h, in, out, TW_CONVERT_PLAIN, ws);
    if (st != TW_STATUS_SUCCESS && st != TW_STATUS_CAPACITY_EXCEEDED) return st;
    const twStatus_t st2 = twDenseToSparse_convert(f.h, in, out, TW_CONVERT_PLAIN, ws);
    return st2 == TW_STATUS_SUCCESS ? st : st2;  // CAPACITY_EXCEEDED: still run, and recorded
}

/// Bad X and Y for an FFN of the fixture (fp32, M x D).
struct BadXY {
    twDnMatDescr_t x17, x16, y4, y17, y16;
    explicit BadXY(Fixture &f)
        : x17(f.dense("X 3 x 17", kM, kD + 1, TW_R_32F, Fill::Data).d),
          x16(f.dense("X bf16", kM, kD, TW_R_16BF, Fill::Data).d),
          y4(f.dense("Y 4 x 16", kM + 1, kD, TW_R_32F, Fill::Poison).d),
          y17(f.dense("Y 3 x 17", kM, kD + 1, TW_R_32F, Fill::Poison).d),
          y16(f.dense("Y bf16", kM, kD, TW_R_16BF, Fill::Poison).d) {}
};
/// The checks of handle, ffn, X and Y that the forward calls share (A has h, ffn, X, Y).
template <class A>
Suite<A> &forward_cases(Suite<A> &s, const BadXY &b) {
    return s.handle()
        .template objects<twFfnDescr_t>("ffn", &A::ffn)
        .template objects<twDnMatDescr_t>("X", &A::X)
        .template objects<twDnMatDescr_t>("Y", &A::Y)
        .bad("X 3 x 17 (cols != D)", [b](A &a) { a.X = b.x17; }, kInvalid, {"X"})
        .bad("Y 4 x 16 (rows != X rows)", [b](A &a) { a.Y = b.y4; }, kInvalid, {"Y"})
        .bad("Y 3 x 17 (cols != D)", [b](A &a) { a.Y = b.y17; }, kInvalid, {"Y"})
        .bad("X bf16, weights fp32", [b](A &a) { a.X = b.x16; }, kNotSupported, {"X"})
        .bad("Y bf16, weights fp32", [b](A &a) { a.Y = b.y16; }, kNotSupported, {"Y"});
}
/// "workspace NULL" when the size query asked for some.
template <class A>
Suite<A> &workspace_case(Suite<A> &s, size_t bytes, const char *fn) {
    if (bytes > 0)
        s.bad("workspace NULL", [](A &a) { a.ws = nullptr; }, kInvalid, {"workspace"});
    else
        WARN(fn << ": the size query gave 0 bytes, so workspace NULL is not an error here");
    return s;
}

}  // namespace

// =============================================================================================
TEST_CASE("status names, strings and the version", "[api][errors]") {
    const char *names[] = {"TW_STATUS_SUCCESS",         "TW_STATUS_NOT_INITIALIZED",
                           "TW_STATUS_ALLOC_FAILED",    "TW_STATUS_INVALID_VALUE",
                           "TW_STATUS_ARCH_MISMATCH",   "TW_STATUS_EXECUTION_FAILED",
                           "TW_STATUS_INTERNAL_ERROR",  "TW_STATUS_NOT_SUPPORTED",
                           "TW_STATUS_INSUFFICIENT_WORKSPACE", "TW_STATUS_CAPACITY_EXCEEDED",
                           "TW_STATUS_INCOMPLETE_INPUT"};
    for (int s = 0; s <= 10; ++s) {
        const twStatus_t st = static_cast<twStatus_t>(s);
        INFO("status " << s);
        REQUIRE(twGetStatusName(st) != nullptr);
        CHECK(std::string(twGetStatusName(st)) == names[s]);
        REQUIRE(twGetStatusString(st) != nullptr);
        CHECK(std::strlen(twGetStatusString(st)) > 0);
    }
    CHECK(std::string(twGetStatusName(TW_STATUS_INVALID_VALUE)) == "TW_STATUS_INVALID_VALUE");
    for (int s : {-1, 11, 42, 1 << 30}) {
        INFO("unknown status " << s);
        const char *n = twGetStatusName(static_cast<twStatus_t>(s));
        REQUIRE(n != nullptr);
        CHECK(std::strlen(n) > 0);
        for (const char *known : names) CHECK(std::string(n) != known);
        REQUIRE(twGetStatusString(static_cast<twStatus_t>(s)) != nullptr);
    }

    int v = -1;
    REQUIRE(twGetVersion(&v) == TW_STATUS_SUCCESS);
    CHECK(v == TWBLAS_VERSION_MAJOR * 10000 + TWBLAS_VERSION_MINOR * 100 + TWBLAS_VERSION_PATCH);
    CHECK(status_name(twGetVersion(nullptr)) == "TW_STATUS_INVALID_VALUE");
    CHECK(mentions(error_message(nullptr), "version"));
}

TEST_CASE("handles: create, destroy, backend, stream, error messages", "[api][errors]") {
    Fixture f;

    struct CreateArgs {
        twHandle_t h;
        twHandle_t *out;
    };
    Suite<CreateArgs>(f, "twCreate", {nullptr, &f.out_h}, [](const CreateArgs &a) { return twCreate(a.out); })
        .bad("handle NULL", [](CreateArgs &a) { a.out = nullptr; }, kInvalid, {"handle"})
        .cleanup([&f](const CreateArgs &) {
            twDestroy(f.out_h);
            f.out_h = poison_ptr<twHandle_t>();
        })
        .run();

    struct CreateBackendArgs {
        twHandle_t h;
        twHandle_t *out;
        twBackend_t backend;
    };
    Suite<CreateBackendArgs>(f, "twCreateWithBackend", {nullptr, &f.out_h, TW_BACKEND_CPU},
                             [](const CreateBackendArgs &a) { return twCreateWithBackend(a.out, a.backend); })
        .bad("handle NULL", [](CreateBackendArgs &a) { a.out = nullptr; }, kInvalid, {"handle"})
        .bad("backend 7", [](CreateBackendArgs &a) { a.backend = static_cast<twBackend_t>(7); }, kInvalid, {"backend"})
        .bad("backend -1", [](CreateBackendArgs &a) { a.backend = static_cast<twBackend_t>(-1); }, kInvalid, {"backend"})
        .cleanup([&f](const CreateBackendArgs &) {
            twDestroy(f.out_h);
            f.out_h = poison_ptr<twHandle_t>();
        })
        .run();

    {  // TW_BACKEND_CUDA: a handle, or NOT_SUPPORTED with the output untouched
        twHandle_t c = poison_ptr<twHandle_t>();
        const twStatus_t st = twCreateWithBackend(&c, TW_BACKEND_CUDA);
        if (st == TW_STATUS_SUCCESS) {
            twBackend_t b = TW_BACKEND_DEFAULT;
            CHECK(twGetBackend(c, &b) == TW_STATUS_SUCCESS);
            CHECK(b == TW_BACKEND_CUDA);
            CHECK(twDestroy(c) == TW_STATUS_SUCCESS);
        } else {
            CHECK(status_name(st) == "TW_STATUS_NOT_SUPPORTED");
            CHECK(c == poison_ptr<twHandle_t>());
            CHECK(!error_message(nullptr).empty());
        }
    }

    check_destroy<twHandle_t>(f, "twDestroy", "handle", twDestroy, [](void *p) {
        int64_t r = 0;  // other_kind<twHandle_t> is a dense descriptor
        return twDnMatGet(static_cast<twDnMatDescr_t>(p), &r, nullptr, nullptr, nullptr, nullptr, nullptr) ==
                   TW_STATUS_SUCCESS && r == kH;
    });

    struct BackendArgs {
        twHandle_t h;
        twBackend_t *out;
    };
    Suite<BackendArgs>(f, "twGetBackend", {f.h, &f.out_backend},
                       [](const BackendArgs &a) { return twGetBackend(a.h, a.out); })
        .handle()
        .bad("backend NULL", [](BackendArgs &a) { a.out = nullptr; }, kInvalid, {"backend"})
        .run();
    CHECK(f.out_backend == TW_BACKEND_CPU);

    struct SetStreamArgs {
        twHandle_t h;
        void *stream;
    };
    Suite<SetStreamArgs>(f, "twSetStream", {f.h, nullptr},
                         [](const SetStreamArgs &a) { return twSetStream(a.h, a.stream); })
        .handle()
        .run();

    struct GetStreamArgs {
        twHandle_t h;
        void **out;
    };
    Suite<GetStreamArgs>(f, "twGetStream", {f.h, &f.out_ptr},
                         [](const GetStreamArgs &a) { return twGetStream(a.h, a.out); })
        .handle()
        .bad("stream NULL", [](GetStreamArgs &a) { a.out = nullptr; }, kInvalid, {"stream"})
        .run();
    CHECK(f.out_ptr == nullptr);
    int token = 0;  // any pointer: stored, never used on the CPU backend
    REQUIRE(twSetStream(f.h, &token) == TW_STATUS_SUCCESS);
    void *s = nullptr;
    REQUIRE(twGetStream(f.h, &s) == TW_STATUS_SUCCESS);
    CHECK(s == &token);
    REQUIRE(twSetStream(f.h, nullptr) == TW_STATUS_SUCCESS);

    struct VersionArgs {
        twHandle_t h;
        int *out;
    };
    Suite<VersionArgs>(f, "twGetVersion", {nullptr, &f.out_int},
                       [](const VersionArgs &a) { return twGetVersion(a.out); })
        .bad("version NULL", [](VersionArgs &a) { a.out = nullptr; }, kInvalid, {"version"})
        .run();

    {  // twGetErrorMessage
        twHandle_t fresh = nullptr;
        REQUIRE(twCreateWithBackend(&fresh, TW_BACKEND_CPU) == TW_STATUS_SUCCESS);
        CHECK(error_message(fresh).empty());  // "" when no call failed
        // never NULL, whatever the handle
        CHECK(twGetErrorMessage(nullptr) != nullptr);
        CHECK(twGetErrorMessage(reinterpret_cast<twHandle_t>(&f.foreign)) != nullptr);
        CHECK(twGetErrorMessage(f.destroyed<twHandle_t>()) != nullptr);
        // a failure on a handle goes to that handle; a handle-less one to the thread
        CHECK(twGetBackend(fresh, nullptr) == kInvalid);
        const std::string on_handle = error_message(fresh);
        CHECK(mentions(on_handle, "backend"));
        twDnMatDescr_t d = nullptr;
        CHECK(twCreateDnMat(&d, -1, 4, 4, &token, TW_R_32F, TW_ORDER_ROW) == kInvalid);
        CHECK(mentions(error_message(nullptr), "rows"));
        CHECK(error_message(fresh) == on_handle);
        CHECK(twDestroy(fresh) == TW_STATUS_SUCCESS);
    }
}

// =============================================================================================
TEST_CASE("dense descriptors", "[api][errors]") {
    Fixture f;
    std::vector<float> mem(static_cast<size_t>(kM * kD), 1.0f);

    struct CreateArgs {
        twHandle_t h;
        twDnMatDescr_t *out;
        int64_t rows, cols, ld;
        void *values;
        twDataType_t type;
        twOrder_t order;
    };
    const CreateArgs good{nullptr, &f.out_dn, kM, kD, kD, mem.data(), TW_R_32F, TW_ORDER_ROW};
    auto create = [](const CreateArgs &a) {
        return twCreateDnMat(a.out, a.rows, a.cols, a.ld, a.values, a.type, a.order);
    };
    auto undo = [&f](const CreateArgs &) {
        twDestroyDnMat(f.out_dn);
        f.out_dn = poison_ptr<twDnMatDescr_t>();
    };
    Suite<CreateArgs>(f, "twCreateDnMat", good, create)
        .bad("descr NULL", [](CreateArgs &a) { a.out = nullptr; }, kInvalid, {"descr"})
        .bad("rows -1", [](CreateArgs &a) { a.rows = -1; }, kInvalid, {"rows"})
        .bad("cols -1", [](CreateArgs &a) { a.cols = -1; }, kInvalid, {"cols"})
        .bad("ld -1", [](CreateArgs &a) { a.ld = -1; }, kInvalid, {"ld"})
        .bad("ld < cols (row-major)", [](CreateArgs &a) { a.ld = kD - 1; }, kInvalid, {"ld"})
        .bad("ld < rows (column-major)", [](CreateArgs &a) { a.order = TW_ORDER_COL; a.ld = kM - 1; }, kInvalid, {"ld"})
        .bad("values NULL for a non-empty matrix", [](CreateArgs &a) { a.values = nullptr; }, kInvalid, {"values"})
        .bad("valueType 7", [](CreateArgs &a) { a.type = static_cast<twDataType_t>(7); }, kInvalid, {"valueType"})
        .bad("valueType -1", [](CreateArgs &a) { a.type = static_cast<twDataType_t>(-1); }, kInvalid, {"valueType"})
        .bad("order 5", [](CreateArgs &a) { a.order = static_cast<twOrder_t>(5); }, kInvalid, {"order"})
        .bad("rows * ld overflows int64", [](CreateArgs &a) { a.rows = INT64_MAX / 4; }, kInvalid, {"rows|ld"})
        .cleanup(undo)
        .run();

    {  // valid variants succeed
        auto ok = [&](CreateArgs a, const char *what) {
            INFO(what << "; message: " << error_message(nullptr));
            CHECK(create(a) == TW_STATUS_SUCCESS);
            undo(a);
        };
        CreateArgs a = good;
        a.order = TW_ORDER_COL;
        a.ld = kM;
        ok(a, "column-major, ld == rows");
        a = good;
        a.rows = 0;
        a.values = nullptr;
        ok(a, "0 rows, values NULL");
        a = good;
        a.ld = kD + 5;
        a.rows = 1;
        ok(a, "ld > cols");
    }

    check_destroy<twDnMatDescr_t>(f, "twDestroyDnMat", "descr", twDestroyDnMat, [](void *p) {
        twFormat_t fmt;  // other_kind<twDnMatDescr_t> is a sparse descriptor
        return twSpMatGetFormat(static_cast<twSpMatDescr_t>(p), &fmt) == TW_STATUS_SUCCESS;
    });

    struct GetArgs {
        twHandle_t h;
        twDnMatDescr_t d;
        int64_t *rows, *cols, *ld;
        void **values;
        twDataType_t *type;
        twOrder_t *order;
    };
    Dn x = f.dense("x", kM, kD, TW_R_32F, Fill::Data, TW_ORDER_COL);
    GetArgs g{nullptr, x.d, &f.out_i64[0], &f.out_i64[1], &f.out_i64[2], &f.out_ptr, &f.out_type, &f.out_order};
    Suite<GetArgs>(f, "twDnMatGet", g, [](const GetArgs &a) {
        return twDnMatGet(a.d, a.rows, a.cols, a.ld, a.values, a.type, a.order);
    })
        .objects("descr", &GetArgs::d)
        .run();
    CHECK(f.out_i64[0] == kM);
    CHECK(f.out_i64[1] == kD);
    CHECK(f.out_i64[2] == kM);
    CHECK(f.out_ptr == x.mem->data());
    CHECK(f.out_type == TW_R_32F);
    CHECK(f.out_order == TW_ORDER_COL);
    CHECK(twDnMatGet(x.d, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr) == TW_STATUS_SUCCESS);
}

// =============================================================================================
TEST_CASE("sparse descriptors", "[api][errors]") {
    Fixture f;
    constexpr int64_t R = 4, C = 100;  // two TwELL tiles of 64, the second partial

    struct TwellSizeArgs {
        twHandle_t h;
        int64_t rows, cols;
        int32_t tile, comp;
        size_t *bytes;
    };
    Suite<TwellSizeArgs>(f, "twTwellBufferSize", {nullptr, R, C, 64, 8, &f.bytes}, [](const TwellSizeArgs &a) {
        return twTwellBufferSize(a.rows, a.cols, a.tile, a.comp, a.bytes);
    })
        .bad("rows -1", [](TwellSizeArgs &a) { a.rows = -1; }, kInvalid, {"rows"})
        .bad("cols -1", [](TwellSizeArgs &a) { a.cols = -1; }, kInvalid, {"cols"})
        .bad("tileWidth 100", [](TwellSizeArgs &a) { a.tile = 100; }, kInvalid, {"tileWidth"})
        .bad("tileWidth 32", [](TwellSizeArgs &a) { a.tile = 32; }, kInvalid, {"tileWidth"})
        .bad("tileWidth 512", [](TwellSizeArgs &a) { a.tile = 512; }, kInvalid, {"tileWidth"})
        .bad("tileWidth 0", [](TwellSizeArgs &a) { a.tile = 0; }, kInvalid, {"tileWidth"})
        .bad("compression 3", [](TwellSizeArgs &a) { a.comp = 3; }, kInvalid, {"compression"})
        .bad("compression 1", [](TwellSizeArgs &a) { a.comp = 1; }, kInvalid, {"compression"})
        .bad("compression 16", [](TwellSizeArgs &a) { a.comp = 16; }, kInvalid, {"compression"})
        .bad("compression 0", [](TwellSizeArgs &a) { a.comp = 0; }, kInvalid, {"compression"})
        .bad("bytes NULL", [](TwellSizeArgs &a) { a.bytes = nullptr; }, kInvalid, {"bytes"})
        .bad("cols 65537", [](TwellSizeArgs &a) { a.cols = 65537; }, kNotSupported, {"cols"})
        .run();
    // rows x NT*W words, then the overflow record (a count and up to `rows` row ids)
    CHECK(f.bytes == (R * 2 * 8 + 1 + R) * 4);
    size_t n = 0;
    CHECK(twTwellBufferSize(2, 65536, 256, 8, &n) == TW_STATUS_SUCCESS);
    CHECK(twTwellBufferSize(0, C, 64, 8, &n) == TW_STATUS_SUCCESS);
    CHECK(n == 4);

    size_t twell_bytes = 0;
    REQUIRE(twTwellBufferSize(R, C, 64, 8, &twell_bytes) == TW_STATUS_SUCCESS);
    Buffer &tbuf = f.buffer("twell buffer", twell_bytes + 16, kPoison, true);
    struct TwellArgs {
        twHandle_t h;
        twSpMatDescr_t *out;
        int64_t rows, cols;
        int32_t tile, comp;
        void *buffer;
        twDataType_t type;
    };
    Suite<TwellArgs>(f, "twCreateTwell", {nullptr, &f.out_sp, R, C, 64, 8, tbuf.data(), TW_R_16BF},
                     [](const TwellArgs &a) {
                         return twCreateTwell(a.out, a.rows, a.cols, a.tile, a.comp, a.buffer, a.type);
                     })
        .bad("descr NULL", [](TwellArgs &a) { a.out = nullptr; }, kInvalid, {"descr"})
        .bad("rows -1", [](TwellArgs &a) { a.rows = -1; }, kInvalid, {"rows"})
        .bad("cols -1", [](TwellArgs &a) { a.cols = -1; }, kInvalid, {"cols"})
        .bad("tileWidth 100", [](TwellArgs &a) { a.tile = 100; }, kInvalid, {"tileWidth"})
        .bad("compression 3", [](TwellArgs &a) { a.comp = 3; }, kInvalid, {"compression"})
        .bad("buffer NULL", [](TwellArgs &a) { a.buffer = nullptr; }, kInvalid, {"buffer"})
        .bad("buffer not 4-byte aligned", [](TwellArgs &a) { a.buffer = static_cast<char *>(a.buffer) + 2; }, kInvalid, {"buffer"})
        .bad("valueType 7", [](TwellArgs &a) { a.type = static_cast<twDataType_t>(7); }, kInvalid, {"valueType"})
        .bad("valueType TW_R_32F (16-bit container)", [](TwellArgs &a) { a.type = TW_R_32F; }, kNotSupported, {"valueType"})
        .bad("cols 65537", [](TwellArgs &a) { a.cols = 65537; }, kNotSupported, {"cols"})
        .cleanup([&f](const TwellArgs &) {
            twDestroySpMat(f.out_sp);
            f.out_sp = poison_ptr<twSpMatDescr_t>();
        })
        .run();

    struct HybridSizeArgs {
        twHandle_t h;
        int64_t rows, cols;
        int32_t ell;
        int64_t backup;
        twDataType_t type;
        size_t *bytes;
    };
    Suite<HybridSizeArgs>(f, "twHybridBufferSize", {nullptr, R, C, 16, R, TW_R_32F, &f.bytes},
                          [](const HybridSizeArgs &a) {
                              return twHybridBufferSize(a.rows, a.cols, a.ell, a.backup, a.type, a.bytes);
                          })
        .bad("rows -1", [](HybridSizeArgs &a) { a.rows = -1; }, kInvalid, {"rows"})
        .bad("cols -1", [](HybridSizeArgs &a) { a.cols = -1; }, kInvalid, {"cols"})
        .bad("ellWidth 0", [](HybridSizeArgs &a) { a.ell = 0; }, kInvalid, {"ellWidth"})
        .bad("ellWidth 12", [](HybridSizeArgs &a) { a.ell = 12; }, kInvalid, {"ellWidth"})
        .bad("ellWidth -8", [](HybridSizeArgs &a) { a.ell = -8; }, kInvalid, {"ellWidth"})
        .bad("backupRows -1", [](HybridSizeArgs &a) { a.backup = -1; }, kInvalid, {"backupRows"})
        .bad("backupRows > rows", [](HybridSizeArgs &a) { a.backup = R + 1; }, kInvalid, {"backupRows"})
        .bad("valueType 7", [](HybridSizeArgs &a) { a.type = static_cast<twDataType_t>(7); }, kInvalid, {"valueType"})
        .bad("bytes NULL", [](HybridSizeArgs &a) { a.bytes = nullptr; }, kInvalid, {"bytes"})
        .bad("cols 65537", [](HybridSizeArgs &a) { a.cols = 65537; }, kNotSupported, {"cols"})
        .run();

    size_t hybrid_bytes = 0;
    REQUIRE(twHybridBufferSize(R, C, 16, R, TW_R_32F, &hybrid_bytes) == TW_STATUS_SUCCESS);
    Buffer &hbuf = f.buffer("hybrid buffer", hybrid_bytes + 16, kPoison, true);
    struct HybridArgs {
        twHandle_t h;
        twSpMatDescr_t *out;
        int64_t rows, cols;
        int32_t ell;
        int64_t backup;
        void *buffer;
        twDataType_t type;
    };
    Suite<HybridArgs>(f, "twCreateHybrid", {nullptr, &f.out_sp, R, C, 16, R, hbuf.data(), TW_R_32F},
                      [](const HybridArgs &a) {
                          return twCreateHybrid(a.out, a.rows, a.cols, a.ell, a.backup, a.buffer, a.type);
                      })
        .bad("descr NULL", [](HybridArgs &a) { a.out = nullptr; }, kInvalid, {"descr"})
        .bad("rows -1", [](HybridArgs &a) { a.rows = -1; }, kInvalid, {"rows"})
        .bad("cols -1", [](HybridArgs &a) { a.cols = -1; }, kInvalid, {"cols"})
        .bad("ellWidth 12", [](HybridArgs &a) { a.ell = 12; }, kInvalid, {"ellWidth"})
        .bad("ellWidth 0", [](HybridArgs &a) { a.ell = 0; }, kInvalid, {"ellWidth"})
        .bad("backupRows -1", [](HybridArgs &a) { a.backup = -1; }, kInvalid, {"backupRows"})
        .bad("backupRows > rows", [](HybridArgs &a) { a.backup = R + 1; }, kInvalid, {"backupRows"})
        .bad("buffer NULL", [](HybridArgs &a) { a.buffer = nullptr; }, kInvalid, {"buffer"})
        .bad("buffer not 16-byte aligned", [](HybridArgs &a) { a.buffer = static_cast<char *>(a.buffer) + 8; }, kInvalid, {"buffer"})
        .bad("valueType 7", [](HybridArgs &a) { a.type = static_cast<twDataType_t>(7); }, kInvalid, {"valueType"})
        .bad("cols 65537", [](HybridArgs &a) { a.cols = 65537; }, kNotSupported, {"cols"})
        .cleanup([&f](const HybridArgs &) {
            twDestroySpMat(f.out_sp);
            f.out_sp = poison_ptr<twSpMatDescr_t>();
        })
        .run();

    check_destroy<twSpMatDescr_t>(f, "twDestroySpMat", "descr", twDestroySpMat, [](void *p) {
        int64_t r = 0;  // other_kind<twSpMatDescr_t> is a dense descriptor
        return twDnMatGet(static_cast<twDnMatDescr_t>(p), &r, nullptr, nullptr, nullptr, nullptr, nullptr) ==
                   TW_STATUS_SUCCESS && r == kH;
    });

    // Filled containers for the getters.
    Dn a = f.dense("A", R, C, TW_R_16BF, Fill::Sparse);
    Sp tw = f.twell("twell", R, C, 64, 8);
    {
        size_t wsb = 0;
        REQUIRE(twDenseToSparse_bufferSize(f.h, a.d, tw.d, TW_CONVERT_PLAIN, &wsb) == TW_STATUS_SUCCESS);
        void *ws = f.workspace(wsb);
        REQUIRE(twDenseToSparse_analysis(f.h, a.d, tw.d, TW_CONVERT_PLAIN, ws) == TW_STATUS_SUCCESS);
        REQUIRE(twDenseToSparse_convert(f.h, a.d, tw.d, TW_CONVERT_PLAIN, ws) == TW_STATUS_SUCCESS);
    }

    struct FormatArgs {
        twHandle_t h;
        twSpMatDescr_t d;
        twFormat_t *out;
    };
    Suite<FormatArgs>(f, "twSpMatGetFormat", {nullptr, tw.d, &f.out_format},
                      [](const FormatArgs &x) { return twSpMatGetFormat(x.d, x.out); })
        .objects("descr", &FormatArgs::d)
        .bad("format NULL", [](FormatArgs &x) { x.out = nullptr; }, kInvalid, {"format"})
        .run();
    CHECK(f.out_format == TW_FORMAT_TWELL);

    struct SizeArgs {
        twHandle_t h;
        twSpMatDescr_t d;
        int64_t *rows, *cols;
    };
    Suite<SizeArgs>(f, "twSpMatGetSize", {nullptr, tw.d, &f.out_i64[0], &f.out_i64[1]},
                    [](const SizeArgs &x) { return twSpMatGetSize(x.d, x.rows, x.cols); })
        .objects("descr", &SizeArgs::d)
        .run();
    CHECK(f.out_i64[0] == R);
    CHECK(f.out_i64[1] == C);
    CHECK(twSpMatGetSize(tw.d, nullptr, nullptr) == TW_STATUS_SUCCESS);

    struct BufferArgs {
        twHandle_t h;
        twSpMatDescr_t d;
        void **buffer;
        twDataType_t *type;
    };
    Suite<BufferArgs>(f, "twSpMatGetBuffer", {nullptr, tw.d, &f.out_ptr, &f.out_type},
                      [](const BufferArgs &x) { return twSpMatGetBuffer(x.d, x.buffer, x.type); })
        .objects("descr", &BufferArgs::d)
        .run();
    CHECK(f.out_ptr == tw.mem->data());
    CHECK(f.out_type == TW_R_16BF);
    CHECK(twSpMatGetBuffer(tw.d, nullptr, nullptr) == TW_STATUS_SUCCESS);

    struct InfoArgs {
        twHandle_t h;
        twSpMatDescr_t d;
        twSpMatInfo_t *info;
    };
    Suite<InfoArgs>(f, "twSpMatGetInfo", {f.h, tw.d, &f.out_info},
                    [](const InfoArgs &x) { return twSpMatGetInfo(x.h, x.d, x.info); })
        .handle()
        .objects("descr", &InfoArgs::d)
        .bad("info NULL", [](InfoArgs &x) { x.info = nullptr; }, kInvalid, {"info"})
        .run();
    CHECK(f.out_info.overflowRows == 0);
    CHECK(f.out_info.droppedValues == 0);

    struct ValidateArgs {
        twHandle_t h;
        twSpMatDescr_t d;
    };
    Suite<ValidateArgs>(f, "twSpMatValidate", {f.h, tw.d},
                        [](const ValidateArgs &x) { return twSpMatValidate(x.h, x.d); })
        .handle()
        .objects("descr", &ValidateArgs::d)
        .run();

    {  // twSpMatValidate reports corrupt buffers, never crashes
        Sp garbage_tw = f.twell("garbage twell", R, C, 64, 8);  // poison everywhere
        CHECK(status_name(twSpMatValidate(f.h, garbage_tw.d)) == "TW_STATUS_INVALID_VALUE");
        CHECK(!error_message(f.h).empty());
        Sp garbage_hy = f.hybrid("garbage hybrid", R, C, 16, R, TW_R_16BF);  // row_nnz negative
        CHECK(status_name(twSpMatValidate(f.h, garbage_hy.d)) == "TW_STATUS_INVALID_VALUE");
        CHECK(!error_message(f.h).empty());
        // Copies of the valid buffer with one violation in a block: the message locates it.
        auto corrupt = [&](const char *what, const std::function<void(uint32_t *)> &edit) {
            Sp bad = f.twell(what, R, C, 64, 8);
            std::memcpy(bad.mem->data(), tw.mem->data(), twell_bytes);
            uint32_t *w = reinterpret_cast<uint32_t *>(bad.mem->data());
            REQUIRE((w[0] & 0xffffu) > 0);  // row 0, tile 0 holds entries
            edit(w);
            INFO(what << "; message: " << error_message(f.h));
            CHECK(status_name(twSpMatValidate(f.h, bad.d)) == "TW_STATUS_INVALID_VALUE");
            CHECK(mentions(error_message(f.h), "row"));  // the first violation: (row, tile, slot)
        };
        corrupt("count 8 > 7 slots", [](uint32_t *w) { w[0] = 8; });
        corrupt("a column outside its tile", [](uint32_t *w) { w[1] = (w[1] & 0xffff0000u) | 70u; });
    }
}

// =============================================================================================
TEST_CASE("conversions", "[api][errors]") {
    Fixture f;
    constexpr int64_t R = 4, C = 100;
    Dn a16 = f.dense("A bf16", R, C, TW_R_16BF, Fill::Sparse);
    Dn a32 = f.dense("A fp32", R, C, TW_R_32F, Fill::Sparse);
    Dn a5 = f.dense("A 5 rows", R + 1, C, TW_R_16BF, Fill::Sparse);
    Dn out16 = f.dense("dense out", R, C, TW_R_16BF, Fill::Poison);
    Dn out32 = f.dense("dense out fp32", R, C, TW_R_32F, Fill::Poison);
    Dn out5 = f.dense("dense out 5 rows", R + 1, C, TW_R_16BF, Fill::Poison);
    Sp tw = f.twell("twell", R, C, 64, 8);
    Sp tw64 = f.twell("twell 4 x 64", R, 64, 64, 8);
    Sp hy = f.hybrid("hybrid", R, C, 16, R, TW_R_16BF);
    Sp hy2 = f.hybrid("hybrid 2", R, C, 16, R, TW_R_16BF);
    Sp hy32 = f.hybrid("hybrid fp32", R, C, 16, R, TW_R_32F);
    Sp hyT = f.hybrid("hybrid transposed", C, R, 8, C, TW_R_16BF);
    Sp hyT32 = f.hybrid("hybrid transposed fp32", C, R, 8, C, TW_R_32F);

    auto convert = [&f](twDnMatDescr_t in, twSpMatDescr_t out) { return dense_to_sparse(f, in, out); };
    REQUIRE(convert(a16.d, tw.d) == TW_STATUS_SUCCESS);
    REQUIRE(convert(a16.d, hy.d) == TW_STATUS_SUCCESS);

    struct D2SArgs {
        twHandle_t h;
        twDnMatDescr_t in;
        twSpMatDescr_t out;
        twConvertOp_t op;
        size_t *bytes;
        void *ws;
    };
    size_t d2s_bytes = 0;
    REQUIRE(twDenseToSparse_bufferSize(f.h, a16.d, tw.d, TW_CONVERT_PLAIN, &d2s_bytes) == TW_STATUS_SUCCESS);
    const D2SArgs d2s{f.h, a16.d, tw.d, TW_CONVERT_PLAIN, &f.bytes, f.workspace(d2s_bytes)};
    // The checks the three phases share.
    auto d2s_suite = [&](const char *fn, Suite<D2SArgs>::Call call) {
        Suite<D2SArgs> s(f, fn, d2s, std::move(call));
        s.handle()
            .objects("in", &D2SArgs::in)
            .objects("out", &D2SArgs::out)
            .bad("op 9", [](D2SArgs &x) { x.op = static_cast<twConvertOp_t>(9); }, kInvalid, {"op"})
            .bad("op -1", [](D2SArgs &x) { x.op = static_cast<twConvertOp_t>(-1); }, kInvalid, {"op"})
            .bad("in has more rows than out", [&](D2SArgs &x) { x.in = a5.d; }, kInvalid, {"in|out"})
            .bad("out has fewer columns than in", [&](D2SArgs &x) { x.out = tw64.d; }, kInvalid, {"in|out"})
            .bad("in fp32, out bf16", [&](D2SArgs &x) { x.in = a32.d; }, kNotSupported, {"in|out"});
        return s;
    };
    d2s_suite("twDenseToSparse_bufferSize", [](const D2SArgs &x) {
        return twDenseToSparse_bufferSize(x.h, x.in, x.out, x.op, x.bytes);
    })
        .bad("bytes NULL", [](D2SArgs &x) { x.bytes = nullptr; }, kInvalid, {"bytes"})
        .run();
    auto analysis = d2s_suite("twDenseToSparse_analysis", [](const D2SArgs &x) {
        return twDenseToSparse_analysis(x.h, x.in, x.out, x.op, x.ws);
    });
    auto conv = d2s_suite("twDenseToSparse_convert", [](const D2SArgs &x) {
        return twDenseToSparse_convert(x.h, x.in, x.out, x.op, x.ws);
    });
    workspace_case(analysis, d2s_bytes, "twDenseToSparse_analysis").run();
    workspace_case(conv, d2s_bytes, "twDenseToSparse_convert").run();

    struct S2DArgs {
        twHandle_t h;
        twSpMatDescr_t in;
        twDnMatDescr_t out;
    };
    Sp over = f.twell("overflowed twell", R, C, 64, 8);
    Dn full = f.dense("A, every element non-zero", R, C, TW_R_16BF, Fill::Full);
    REQUIRE(status_name(convert(full.d, over.d)) == "TW_STATUS_CAPACITY_EXCEEDED");
    Suite<S2DArgs>(f, "twSparseToDense", {f.h, tw.d, out16.d},
                   [](const S2DArgs &x) { return twSparseToDense(x.h, x.in, x.out); })
        .handle()
        .objects("in", &S2DArgs::in)
        .objects("out", &S2DArgs::out)
        .bad("out has 5 rows", [&](S2DArgs &x) { x.out = out5.d; }, kInvalid, {"out"})
        .bad("out fp32, in bf16", [&](S2DArgs &x) { x.out = out32.d; }, kNotSupported, {"out"})
        .bad("in records rows it could not hold", [&](S2DArgs &x) { x.in = over.d; }, TW_STATUS_INCOMPLETE_INPUT)
        .run();

    struct SpSpArgs {
        twHandle_t h;
        twSpMatDescr_t in, out;
    };
    Suite<SpSpArgs>(f, "twSparseConvert", {f.h, tw.d, hy2.d},
                    [](const SpSpArgs &x) { return twSparseConvert(x.h, x.in, x.out); })
        .handle()
        .objects("in", &SpSpArgs::in)
        .objects("out", &SpSpArgs::out)
        .bad("out 4 x 64", [&](SpSpArgs &x) { x.out = tw64.d; }, kInvalid, {"out"})
        .bad("out fp32, in bf16", [&](SpSpArgs &x) { x.out = hy32.d; }, kNotSupported, {"out"})
        .run();

    Suite<SpSpArgs>(f, "twSparseTranspose", {f.h, hy.d, hyT.d},
                    [](const SpSpArgs &x) { return twSparseTranspose(x.h, x.in, x.out); })
        .handle()
        .objects("in", &SpSpArgs::in)
        .objects("out", &SpSpArgs::out)
        .bad("out not transposed (rows x cols)", [&](SpSpArgs &x) { x.out = hy2.d; }, kInvalid, {"out"})
        .bad("out fp32, in bf16", [&](SpSpArgs &x) { x.out = hyT32.d; }, kNotSupported, {"out"})
        .run();
}

// =============================================================================================
TEST_CASE("FFN setup, size and attributes", "[api][errors]") {
    Fixture f;
    Dn wd_t = f.dense("wDown as D x H", kD, kH, TW_R_32F, Fill::Data);  // the nn.Linear mistake
    Dn wd_col = f.dense("wDown column-major", kH, kD, TW_R_32F, Fill::Data, TW_ORDER_COL);
    Dn wu41 = f.dense("wUp 41 x 16", kH + 1, kD, TW_R_32F, Fill::Data);
    Dn wg17 = f.dense("wGate 40 x 17", kH, kD + 1, TW_R_32F, Fill::Data);
    Dn wu16 = f.dense("wUp bf16", kH, kD, TW_R_16BF, Fill::Data);

    struct CreateArgs {
        twHandle_t h;
        twFfnDescr_t *out;
        twFfnKind_t kind;
        twDnMatDescr_t wg, wu, wd;
    };
    auto undo = [&f](const CreateArgs &) {
        twDestroyFfn(f.out_ffn);
        f.out_ffn = poison_ptr<twFfnDescr_t>();
    };
    auto create = [](const CreateArgs &a) { return twCreateFfn(a.h, a.out, a.kind, a.wg, a.wu, a.wd); };
    const CreateArgs good{f.h, &f.out_ffn, TW_FFN_GATED_RELU, f.wg.d, f.wu.d, f.wd.d};
    Suite<CreateArgs>(f, "twCreateFfn", good, create)
        .handle()
        .bad("ffn NULL", [](CreateArgs &a) { a.out = nullptr; }, kInvalid, {"ffn"})
        .bad("kind 3", [](CreateArgs &a) { a.kind = static_cast<twFfnKind_t>(3); }, kInvalid, {"kind"})
        .bad("kind -1", [](CreateArgs &a) { a.kind = static_cast<twFfnKind_t>(-1); }, kInvalid, {"kind"})
        .objects("wGate", &CreateArgs::wg, Null::Invalid)  // NULL for a gated FFN: INVALID_VALUE
        .objects("wUp", &CreateArgs::wu)
        .objects("wDown", &CreateArgs::wd)
        .bad("wGate given for TW_FFN_RELU", [](CreateArgs &a) { a.kind = TW_FFN_RELU; }, kInvalid, {"wGate"})
        .bad("wDown D x H (nn.Linear's shape, row-major)", [&](CreateArgs &a) { a.wd = wd_t.d; }, kInvalid,
             {"wDown", "40 x 16"})
        .bad("wUp 41 x 16", [&](CreateArgs &a) { a.wu = wu41.d; }, kInvalid, {"wUp"})
        .bad("wGate 40 x 17", [&](CreateArgs &a) { a.wg = wg17.d; }, kInvalid, {"wGate"})
        .bad("wUp bf16, the others fp32", [&](CreateArgs &a) { a.wu = wu16.d; }, kNotSupported, {"wUp"})
        .cleanup(undo)
        .run();

    {  // valid variants succeed
        CreateArgs a = good;
        a.wd = wd_col.d;  // nn.Linear's down_proj.weight memory
        CHECK(create(a) == TW_STATUS_SUCCESS);
        undo(a);
        a = good;
        a.kind = TW_FFN_RELU;
        a.wg = nullptr;
        CHECK(create(a) == TW_STATUS_SUCCESS);
        undo(a);
        CHECK(f.out_ffn == poison_ptr<twFfnDescr_t>());
    }

    struct UpdateArgs {
        twHandle_t h;
        twFfnDescr_t ffn;
        twDnMatDescr_t wg, wu, wd;
    };
    Suite<UpdateArgs>(f, "twFfnUpdateWeights", {f.h, f.ffn, f.wg.d, f.wu.d, f.wd.d},
                      [](const UpdateArgs &a) { return twFfnUpdateWeights(a.h, a.ffn, a.wg, a.wu, a.wd); })
        .handle()
        .objects("ffn", &UpdateArgs::ffn)
        .objects("wGate", &UpdateArgs::wg, Null::Invalid)
        .objects("wUp", &UpdateArgs::wu)
        .objects("wDown", &UpdateArgs::wd)
        .bad("wGate given for a TW_FFN_RELU ffn", [&](UpdateArgs &a) { a.ffn = f.ffn_relu; }, kInvalid, {"wGate"})
        .bad("wUp 41 x 16", [&](UpdateArgs &a) { a.wu = wu41.d; }, kInvalid, {"wUp"})
        .bad("wDown D x H", [&](UpdateArgs &a) { a.wd = wd_t.d; }, kInvalid, {"wDown", "40 x 16"})
        .bad("wUp bf16 for an fp32 ffn", [&](UpdateArgs &a) { a.wu = wu16.d; }, kNotSupported, {"wUp"})
        .run();

    check_destroy<twFfnDescr_t>(f, "twDestroyFfn", "ffn", twDestroyFfn, [](void *p) {
        int64_t r = 0;  // other_kind<twFfnDescr_t> is a dense descriptor
        return twDnMatGet(static_cast<twDnMatDescr_t>(p), &r, nullptr, nullptr, nullptr, nullptr, nullptr) ==
                   TW_STATUS_SUCCESS && r == kH;
    });

    struct SizeArgs {
        twHandle_t h;
        twFfnDescr_t ffn;
        int64_t *d, *hd;
    };
    Suite<SizeArgs>(f, "twFfnGetSize", {nullptr, f.ffn, &f.out_i64[0], &f.out_i64[1]},
                    [](const SizeArgs &a) { return twFfnGetSize(a.ffn, a.d, a.hd); })
        .objects("ffn", &SizeArgs::ffn)
        .run();
    CHECK(f.out_i64[0] == kD);
    CHECK(f.out_i64[1] == kH);
    CHECK(twFfnGetSize(f.ffn, nullptr, nullptr) == TW_STATUS_SUCCESS);

    // ---- attributes
    struct IntAttribute {
        twFfnAttribute_t attr;
        const char *name;
        int32_t default_value;
    };
    const std::vector<IntAttribute> int_attributes = {{TW_FFN_ATTR_TILE_WIDTH, "TW_FFN_ATTR_TILE_WIDTH", 256},
                                                      {TW_FFN_ATTR_COMPRESSION, "TW_FFN_ATTR_COMPRESSION", 8},
                                                      {TW_FFN_ATTR_COMPUTE_MODE, "TW_FFN_ATTR_COMPUTE_MODE", TW_COMPUTE_DEFAULT},
                                                      {TW_FFN_ATTR_DETERMINISTIC, "TW_FFN_ATTR_DETERMINISTIC", 0},
                                                      {TW_FFN_ATTR_SAVE_DENSE, "TW_FFN_ATTR_SAVE_DENSE", TW_SAVE_DENSE_AUTO},
                                                      {TW_FFN_ATTR_CALL_GRAPHS, "TW_FFN_ATTR_CALL_GRAPHS", 1},
                                                      {TW_FFN_ATTR_ALGORITHM, "TW_FFN_ATTR_ALGORITHM", TW_FFN_ALG_DEFAULT}};
    auto attr_name = [&int_attributes](twFfnAttribute_t attr) {
        for (const IntAttribute &a : int_attributes)
            if (a.attr == attr) return std::string(a.name);
        return std::string("?");
    };
    auto reset = [&int_attributes](twFfnDescr_t ffn) {
        for (const IntAttribute &a : int_attributes) twFfnSetAttribute(ffn, a.attr, &a.default_value, sizeof(int32_t));
    };
    struct SetArgs {
        twHandle_t h;
        twFfnDescr_t ffn;
        twFfnAttribute_t attr;
        int32_t v;
        bool null_value;
        size_t size;
    };
    auto set_suite = Suite<SetArgs>(f, "twFfnSetAttribute", {nullptr, f.ffn, TW_FFN_ATTR_TILE_WIDTH, 256, false, sizeof(int32_t)},
                                    [](const SetArgs &a) {
                                        return twFfnSetAttribute(a.ffn, a.attr, a.null_value ? nullptr : &a.v, a.size);
                                    });
    set_suite.objects("ffn", &SetArgs::ffn)
        .bad("attr 17", [](SetArgs &a) { a.attr = static_cast<twFfnAttribute_t>(17); }, kInvalid, {"attr"})
        .bad("attr -1", [](SetArgs &a) { a.attr = static_cast<twFfnAttribute_t>(-1); }, kInvalid, {"attr"})
        .bad("value NULL", [](SetArgs &a) { a.null_value = true; }, kInvalid, {"value"})
        .bad("size 8", [](SetArgs &a) { a.size = 8; }, kInvalid, {"size"})
        .bad("size 2", [](SetArgs &a) { a.size = 2; }, kInvalid, {"size"})
        .bad("size 0", [](SetArgs &a) { a.size = 0; }, kInvalid, {"size"})
        .cleanup([&](const SetArgs &a) { reset(a.ffn); });
    const std::vector<std::pair<twFfnAttribute_t, std::vector<int32_t>>> invalid_values = {
        {TW_FFN_ATTR_TILE_WIDTH, {100, 0, 32, 512, -256}},
        {TW_FFN_ATTR_COMPRESSION, {3, 0, 1, 16}},
        {TW_FFN_ATTR_COMPUTE_MODE, {9, 3, -1}},
        {TW_FFN_ATTR_DETERMINISTIC, {2, -1}},
        {TW_FFN_ATTR_SAVE_DENSE, {3, -1}},
        {TW_FFN_ATTR_CALL_GRAPHS, {2, -1}},
        {TW_FFN_ATTR_ALGORITHM, {7, -1, 100}}};
    for (const auto &[attr, values] : invalid_values)
        for (int32_t v : values) {
            const twFfnAttribute_t at = attr;
            set_suite.bad(attr_name(at) + " = " + std::to_string(v), [at, v](SetArgs &a) { a.attr = at; a.v = v; },
                          kInvalid, {std::string("value|") + attr_name(at)});
        }
    set_suite.run();
    {  // a failed set leaves the attribute; valid values read back
        for (const IntAttribute &a : int_attributes) {
            int32_t got = -1;
            REQUIRE(twFfnGetAttribute(f.ffn, a.attr, &got, sizeof got) == TW_STATUS_SUCCESS);
            CHECK(got == a.default_value);
        }
        const std::vector<std::pair<twFfnAttribute_t, std::vector<int32_t>>> valid = {
            {TW_FFN_ATTR_TILE_WIDTH, {64, 128, 256}},
            {TW_FFN_ATTR_COMPRESSION, {2, 4, 8}},
            {TW_FFN_ATTR_COMPUTE_MODE, {TW_COMPUTE_HIGHEST_PRECISION, TW_COMPUTE_DEFAULT}},
            {TW_FFN_ATTR_DETERMINISTIC, {1, 0}},
            {TW_FFN_ATTR_SAVE_DENSE, {TW_SAVE_DENSE_ALWAYS, TW_SAVE_DENSE_NEVER, TW_SAVE_DENSE_AUTO}},
            {TW_FFN_ATTR_CALL_GRAPHS, {0, 1}},
            {TW_FFN_ATTR_ALGORITHM, {TW_FFN_ALG_SERVE, TW_FFN_ALG_DECODE, TW_FFN_ALG_DENSE, TW_FFN_ALG_FUSED,
                                     TW_FFN_ALG_TWO_PASS, TW_FFN_ALG_MASKED_TWO_PASS, TW_FFN_ALG_DEFAULT}}};
        for (const auto &[attr, values] : valid)
            for (int32_t v : values) {
                INFO(attr_name(attr) << " = " << v);
                CHECK(twFfnSetAttribute(f.ffn, attr, &v, sizeof v) == TW_STATUS_SUCCESS);
                int32_t got = -1;
                CHECK(twFfnGetAttribute(f.ffn, attr, &got, sizeof got) == TW_STATUS_SUCCESS);
                CHECK(got == v);
            }
    }

    {  // tuning knobs: no FFN is NOT_INITIALIZED, a NULL name or value INVALID_VALUE; the CPU
       // backend has none
        double v = 0;
        CHECK(twFfnSetTuning(nullptr, "two_pass_min_tokens", 1) == TW_STATUS_NOT_INITIALIZED);
        CHECK(twFfnSetTuning(f.ffn, nullptr, 1) == TW_STATUS_INVALID_VALUE);
        CHECK(twFfnGetTuning(f.ffn, "two_pass_min_tokens", nullptr) == TW_STATUS_INVALID_VALUE);
        CHECK(twFfnSetTuning(f.ffn, "two_pass_min_tokens", 1) == TW_STATUS_NOT_SUPPORTED);
        CHECK(twFfnGetTuning(f.ffn, "two_pass_min_tokens", &v) == TW_STATUS_NOT_SUPPORTED);
    }

    {  // FP8 weights are for 16-bit FFNs: this one is fp32, and its mode is left as it was
        const int32_t fp8 = TW_COMPUTE_FP8_WEIGHTS;
        CHECK(twFfnSetAttribute(f.ffn, TW_FFN_ATTR_COMPUTE_MODE, &fp8, sizeof fp8) == TW_STATUS_NOT_SUPPORTED);
        CHECK(error_message(nullptr).find("16-bit") != std::string::npos);
        int32_t got = -1;
        CHECK(twFfnGetAttribute(f.ffn, TW_FFN_ATTR_COMPUTE_MODE, &got, sizeof got) == TW_STATUS_SUCCESS);
        CHECK(got == TW_COMPUTE_DEFAULT);
    }

    for (twFfnAttribute_t attr : {TW_FFN_ATTR_L1_OUTPUT, TW_FFN_ATTR_L1_COEFF_POINTER}) {
        // the pointer attributes: NULL by default, set and read back as a pointer (sizeof(void *)),
        // a float's alignment required, NULL turns them off
        INFO("pointer attribute " << attr);
        void *got = &got;
        CHECK(twFfnGetAttribute(f.ffn, attr, &got, sizeof got) == TW_STATUS_SUCCESS);
        CHECK(got == nullptr);
        float target[2] = {0.0f, 0.0f};
        void *p = &target[1];
        CHECK(twFfnSetAttribute(f.ffn, attr, &p, sizeof p) == TW_STATUS_SUCCESS);
        CHECK(twFfnGetAttribute(f.ffn, attr, &got, sizeof got) == TW_STATUS_SUCCESS);
        CHECK(got == p);
        const int32_t small = 0;
        CHECK(twFfnSetAttribute(f.ffn, attr, &small, sizeof small) == kInvalid);
        CHECK(error_message(nullptr).find("size") != std::string::npos);
        CHECK(twFfnGetAttribute(f.ffn, attr, &got, sizeof(int32_t)) == kInvalid);
        void *odd = reinterpret_cast<char *>(&target[0]) + 1;
        CHECK(twFfnSetAttribute(f.ffn, attr, &odd, sizeof odd) == kInvalid);
        CHECK(error_message(nullptr).find("aligned") != std::string::npos);
        CHECK(twFfnGetAttribute(f.ffn, attr, &got, sizeof got) == TW_STATUS_SUCCESS);
        CHECK(got == p);  // a failed set leaves it
        void *null = nullptr;
        CHECK(twFfnSetAttribute(f.ffn, attr, &null, sizeof null) == TW_STATUS_SUCCESS);
        CHECK(twFfnGetAttribute(f.ffn, attr, &got, sizeof got) == TW_STATUS_SUCCESS);
        CHECK(got == nullptr);
    }

    {  // TW_FFN_ATTR_WEIGHT_COPY_BYTES: int64, read-only
        int64_t bytes = -1;
        CHECK(twFfnGetAttribute(f.ffn, TW_FFN_ATTR_WEIGHT_COPY_BYTES, &bytes, sizeof bytes) == TW_STATUS_SUCCESS);
        CHECK(bytes >= 0);
        int32_t small = 0;
        CHECK(twFfnGetAttribute(f.ffn, TW_FFN_ATTR_WEIGHT_COPY_BYTES, &small, sizeof small) == kInvalid);
        CHECK(error_message(nullptr).find("size") != std::string::npos);
        for (size_t size : {sizeof(int64_t), sizeof(int32_t)}) {
            const int64_t v = 0;
            CHECK(twFfnSetAttribute(f.ffn, TW_FFN_ATTR_WEIGHT_COPY_BYTES, &v, size) == kInvalid);
            CHECK(error_message(nullptr).find("read-only") != std::string::npos);
        }
        int64_t again = -1;
        CHECK(twFfnGetAttribute(f.ffn, TW_FFN_ATTR_WEIGHT_COPY_BYTES, &again, sizeof again) == TW_STATUS_SUCCESS);
        CHECK(again == bytes);
    }

    struct GetArgs {
        twHandle_t h;
        twFfnDescr_t ffn;
        twFfnAttribute_t attr;
        void *value;
        size_t size;
    };
    Suite<GetArgs>(f, "twFfnGetAttribute", {nullptr, f.ffn, TW_FFN_ATTR_COMPRESSION, &f.out_attr, sizeof(int32_t)},
                   [](const GetArgs &a) { return twFfnGetAttribute(a.ffn, a.attr, a.value, a.size); })
        .objects("ffn", &GetArgs::ffn)
        .bad("attr 17", [](GetArgs &a) { a.attr = static_cast<twFfnAttribute_t>(17); }, kInvalid, {"attr"})
        .bad("value NULL", [](GetArgs &a) { a.value = nullptr; }, kInvalid, {"value"})
        .bad("size 8", [](GetArgs &a) { a.size = 8; }, kInvalid, {"size"})
        .bad("size 2", [](GetArgs &a) { a.size = 2; }, kInvalid, {"size"})
        .run();
}


// =============================================================================================
TEST_CASE("FFN forward, statistics and neuron counts", "[api][errors]") {
    Fixture f;
    const BadXY b(f);
    Dn x = f.dense("X", kM, kD, TW_R_32F, Fill::Data);
    Dn y = f.dense("Y", kM, kD, TW_R_32F, Fill::Poison);
    Sp hidden = f.hybrid("hidden", kM, kH, 8, kM, TW_R_32F);
    Sp hidden41 = f.hybrid("hidden 3 x 41", kM, kH + 1, 8, kM, TW_R_32F);
    Sp hidden4 = f.hybrid("hidden 4 x 40", kM + 1, kH, 8, kM + 1, TW_R_32F);
    Sp hidden16 = f.twell("hidden TwELL bf16", kM, kH, 64, 8);

    struct SizeArgs {
        twHandle_t h;
        twFfnDescr_t ffn;
        twDnMatDescr_t X, Y;
        size_t *bytes;
    };
    Suite<SizeArgs> size(f, "twSpGEMMFused_bufferSize", {f.h, f.ffn, x.d, y.d, &f.bytes},
                         [](const SizeArgs &a) { return twSpGEMMFused_bufferSize(a.h, a.ffn, a.X, a.Y, a.bytes); });
    forward_cases(size, b).bad("bytes NULL", [](SizeArgs &a) { a.bytes = nullptr; }, kInvalid, {"bytes"}).run();

    size_t bytes = 0;
    REQUIRE(twSpGEMMFused_bufferSize(f.h, f.ffn, x.d, y.d, &bytes) == TW_STATUS_SUCCESS);
    struct FusedArgs {
        twHandle_t h;
        twFfnDescr_t ffn;
        twDnMatDescr_t X, Y;
        twSpMatDescr_t hidden;
        void *ws;
    };
    Suite<FusedArgs> fused(f, "twSpGEMMFused", {f.h, f.ffn, x.d, y.d, hidden.d, f.workspace(bytes)},
                           [](const FusedArgs &a) { return twSpGEMMFused(a.h, a.ffn, a.X, a.Y, a.hidden, a.ws); });
    forward_cases(fused, b)
        .objects("hidden", &FusedArgs::hidden, Null::Allowed)
        .bad("hidden 3 x 41", [&](FusedArgs &a) { a.hidden = hidden41.d; }, kInvalid, {"hidden"})
        .bad("hidden 4 x 40", [&](FusedArgs &a) { a.hidden = hidden4.d; }, kInvalid, {"hidden"});
    // A sparse container has its own value type (h is rounded into it): a bf16 TwELL hidden
    // output of an fp32 FFN is valid, not a type mismatch.
    CHECK(twSpGEMMFused(f.h, f.ffn, x.d, y.d, hidden16.d, f.workspace(bytes)) == TW_STATUS_SUCCESS);
    workspace_case(fused, bytes, "twSpGEMMFused").run();
    CHECK(twSpGEMMFused(f.h, f.ffn, x.d, y.d, nullptr, f.workspace(bytes)) == TW_STATUS_SUCCESS);

    struct StatsArgs {
        twHandle_t h;
        twFfnDescr_t ffn;
        twFfnStats_t *stats;
    };
    Suite<StatsArgs>(f, "twFfnGetStats", {f.h, f.ffn, &f.out_stats},
                     [](const StatsArgs &a) { return twFfnGetStats(a.h, a.ffn, a.stats); })
        .handle()
        .objects("ffn", &StatsArgs::ffn)
        .bad("stats NULL", [](StatsArgs &a) { a.stats = nullptr; }, kInvalid, {"stats"})
        .run();
    CHECK(f.out_stats.tokens == kM);

    struct CountsArgs {
        twHandle_t h;
        twFfnDescr_t ffn;
        int64_t *counts;
    };
    int64_t *counts = reinterpret_cast<int64_t *>(f.counts->data());
    Suite<CountsArgs>(f, "twFfnGetNeuronCounts", {f.h, f.ffn, counts},
                      [](const CountsArgs &a) { return twFfnGetNeuronCounts(a.h, a.ffn, a.counts); })
        .handle()
        .objects("ffn", &CountsArgs::ffn)
        .bad("counts NULL", [](CountsArgs &a) { a.counts = nullptr; }, kInvalid, {"counts"})
        .run();
    for (int64_t j = 0; j < kH; ++j) CHECK(counts[j] >= 0);

    struct ResetArgs {
        twHandle_t h;
        twFfnDescr_t ffn;
    };
    Suite<ResetArgs>(f, "twFfnResetNeuronCounts", {f.h, f.ffn},
                     [](const ResetArgs &a) { return twFfnResetNeuronCounts(a.h, a.ffn); })
        .handle()
        .objects("ffn", &ResetArgs::ffn)
        .run();
    REQUIRE(twFfnGetNeuronCounts(f.h, f.ffn, counts) == TW_STATUS_SUCCESS);
    for (int64_t j = 0; j < kH; ++j) CHECK(counts[j] == 0);
}

// =============================================================================================
TEST_CASE("FFN training: saved state and backward", "[api][errors]") {
    Fixture f;
    const BadXY b(f);
    Dn x = f.dense("X", kM, kD, TW_R_32F, Fill::Data);
    Dn y = f.dense("Y", kM, kD, TW_R_32F, Fill::Poison);
    Dn dy = f.dense("dY", kM, kD, TW_R_32F, Fill::Data);
    Dn dx = f.dense("dX", kM, kD, TW_R_32F, Fill::Poison);
    Dn dwg = f.dense("dWgate", kH, kD, TW_R_32F, Fill::Poison);
    Dn dwu = f.dense("dWup", kH, kD, TW_R_32F, Fill::Poison);
    Dn dwd = f.dense("dWdown", kH, kD, TW_R_32F, Fill::Poison, TW_ORDER_COL);  // any order
    Dn dy4 = f.dense("dY 4 x 16", kM + 1, kD, TW_R_32F, Fill::Data);
    Dn dy17 = f.dense("dY 3 x 17", kM, kD + 1, TW_R_32F, Fill::Data);
    Dn dx4 = f.dense("dX 4 x 16", kM + 1, kD, TW_R_32F, Fill::Poison);
    Dn dx17 = f.dense("dX 3 x 17", kM, kD + 1, TW_R_32F, Fill::Poison);
    Dn dx16 = f.dense("dX bf16", kM, kD, TW_R_16BF, Fill::Poison);
    Dn dw41 = f.dense("dW 41 x 16", kH + 1, kD, TW_R_32F, Fill::Poison);
    Dn dwT = f.dense("dW 16 x 40", kD, kH, TW_R_32F, Fill::Poison);
    Dn dw16 = f.dense("dW bf16", kH, kD, TW_R_16BF, Fill::Poison);

    struct TokensArgs {
        twHandle_t h;
        twFfnDescr_t ffn;
        int64_t tokens;
        size_t *bytes;
    };
    using TokensQuery = twStatus_t (*)(twHandle_t, twFfnDescr_t, int64_t, size_t *);
    for (auto [fn, query] : {std::pair<const char *, TokensQuery>{"twSpGEMMFusedSaved_bufferSize", twSpGEMMFusedSaved_bufferSize},
                             std::pair<const char *, TokensQuery>{"twSpGEMMFusedBackward_bufferSize", twSpGEMMFusedBackward_bufferSize}}) {
        const TokensQuery q = query;
        Suite<TokensArgs>(f, fn, {f.h, f.ffn, kM, &f.bytes},
                          [q](const TokensArgs &a) { return q(a.h, a.ffn, a.tokens, a.bytes); })
            .handle()
            .objects("ffn", &TokensArgs::ffn)
            .bad("tokens -1", [](TokensArgs &a) { a.tokens = -1; }, kInvalid, {"tokens"})
            .bad("bytes NULL", [](TokensArgs &a) { a.bytes = nullptr; }, kInvalid, {"bytes"})
            .run();
    }

    size_t saved_bytes = 0, saved_relu_bytes = 0, fwd_bytes = 0, bwd_bytes = 0;
    REQUIRE(twSpGEMMFusedSaved_bufferSize(f.h, f.ffn, kM, &saved_bytes) == TW_STATUS_SUCCESS);
    REQUIRE(twSpGEMMFusedSaved_bufferSize(f.h, f.ffn_relu, kM, &saved_relu_bytes) == TW_STATUS_SUCCESS);
    REQUIRE(twSpGEMMFused_bufferSize(f.h, f.ffn, x.d, y.d, &fwd_bytes) == TW_STATUS_SUCCESS);
    REQUIRE(twSpGEMMFusedBackward_bufferSize(f.h, f.ffn, kM, &bwd_bytes) == TW_STATUS_SUCCESS);
    REQUIRE(saved_bytes > 0);
    void *saved = f.buffer("saved", saved_bytes, kPoison, true).data();
    void *saved_relu = f.buffer("saved (ReLU)", saved_relu_bytes, kPoison, true).data();
    void *fwd_ws = f.workspace(fwd_bytes);

    struct TrainArgs {
        twHandle_t h;
        twFfnDescr_t ffn;
        twDnMatDescr_t X, Y;
        void *saved, *ws;
    };
    Suite<TrainArgs> train(f, "twSpGEMMFusedForwardTrain", {f.h, f.ffn, x.d, y.d, saved, fwd_ws},
                           [](const TrainArgs &a) { return twSpGEMMFusedForwardTrain(a.h, a.ffn, a.X, a.Y, a.saved, a.ws); });
    forward_cases(train, b).bad("saved NULL", [](TrainArgs &a) { a.saved = nullptr; }, kInvalid, {"saved"});
    workspace_case(train, fwd_bytes, "twSpGEMMFusedForwardTrain").run();
    REQUIRE(twSpGEMMFusedForwardTrain(f.h, f.ffn_relu, x.d, y.d, saved_relu, fwd_ws) == TW_STATUS_SUCCESS);

    struct BackArgs {
        twHandle_t h;
        twFfnDescr_t ffn;
        twDnMatDescr_t X;
        const void *saved;
        twDnMatDescr_t dY;
        float l1;
        twDnMatDescr_t dX, dWg, dWu, dWd;
        void *ws;
    };
    Suite<BackArgs> back(f, "twSpGEMMFusedBackward",
                         {f.h, f.ffn, x.d, saved, dy.d, 0.01f, dx.d, dwg.d, dwu.d, dwd.d, f.workspace(bwd_bytes)},
                         [](const BackArgs &a) {
                             return twSpGEMMFusedBackward(a.h, a.ffn, a.X, a.saved, a.dY, a.l1, a.dX, a.dWg,
                                                          a.dWu, a.dWd, a.ws);
                         });
    back.handle()
        .objects("ffn", &BackArgs::ffn)
        .objects("X", &BackArgs::X)
        .objects("dY", &BackArgs::dY)
        .objects("dX", &BackArgs::dX)
        .objects("dWgate", &BackArgs::dWg, Null::Invalid)  // NULL for a gated FFN: INVALID_VALUE
        .objects("dWup", &BackArgs::dWu)
        .objects("dWdown", &BackArgs::dWd)
        .bad("dWgate given for a TW_FFN_RELU ffn", [&](BackArgs &a) { a.ffn = f.ffn_relu; a.saved = saved_relu; },
             kInvalid, {"dWgate"})
        .bad("X 3 x 17", [&](BackArgs &a) { a.X = b.x17; }, kInvalid, {"X"})
        .bad("X bf16, weights fp32", [&](BackArgs &a) { a.X = b.x16; }, kNotSupported, {"X"})
        .bad("dY 4 x 16", [&](BackArgs &a) { a.dY = dy4.d; }, kInvalid, {"dY"})
        .bad("dY 3 x 17", [&](BackArgs &a) { a.dY = dy17.d; }, kInvalid, {"dY"})
        .bad("dX 4 x 16", [&](BackArgs &a) { a.dX = dx4.d; }, kInvalid, {"dX"})
        .bad("dX 3 x 17", [&](BackArgs &a) { a.dX = dx17.d; }, kInvalid, {"dX"})
        .bad("dX bf16, weights fp32", [&](BackArgs &a) { a.dX = dx16.d; }, kNotSupported, {"dX"})
        .bad("dWgate 41 x 16", [&](BackArgs &a) { a.dWg = dw41.d; }, kInvalid, {"dWgate"})
        .bad("dWup 16 x 40", [&](BackArgs &a) { a.dWu = dwT.d; }, kInvalid, {"dWup"})
        .bad("dWdown 16 x 40", [&](BackArgs &a) { a.dWd = dwT.d; }, kInvalid, {"dWdown"})
        .bad("dWdown 41 x 16", [&](BackArgs &a) { a.dWd = dw41.d; }, kInvalid, {"dWdown"})
        .bad("dWup bf16, weights fp32", [&](BackArgs &a) { a.dWu = dw16.d; }, kNotSupported, {"dWup"})
        .bad("saved NULL", [](BackArgs &a) { a.saved = nullptr; }, kInvalid, {"saved"});
    workspace_case(back, bwd_bytes, "twSpGEMMFusedBackward").run();

    size_t relu_bwd_bytes = 0;
    REQUIRE(twSpGEMMFusedBackward_bufferSize(f.h, f.ffn_relu, kM, &relu_bwd_bytes) == TW_STATUS_SUCCESS);
    CHECK(twSpGEMMFusedBackward(f.h, f.ffn_relu, x.d, saved_relu, dy.d, 0.0f, dx.d, nullptr, dwu.d, dwd.d,
                                f.workspace(relu_bwd_bytes)) == TW_STATUS_SUCCESS);
}

// =============================================================================================
TEST_CASE("building blocks: GEMM to sparse and SpMM", "[api][errors]") {
    Fixture f;
    Dn x = f.dense("A", kM, kD, TW_R_32F, Fill::Data);
    Dn x16 = f.dense("A bf16", kM, kD, TW_R_16BF, Fill::Data);
    Dn w17 = f.dense("B 40 x 17", kH, kD + 1, TW_R_32F, Fill::Data);
    Sp c = f.hybrid("C", kM, kH, 8, kM, TW_R_32F);
    Sp c41 = f.hybrid("C 3 x 41", kM, kH + 1, 8, kM, TW_R_32F);
    Sp c4 = f.hybrid("C 4 x 40", kM + 1, kH, 8, kM + 1, TW_R_32F);

    struct GSizeArgs {
        twHandle_t h;
        twDnMatDescr_t A, B;
        twSpMatDescr_t C;
        twConvertOp_t act;
        size_t *bytes;
    };
    struct GArgs {
        twHandle_t h;
        float alpha;
        twDnMatDescr_t A, B;
        twSpMatDescr_t C;
        twConvertOp_t act;
        void *ws;
    };
    auto gemm_cases = [&](auto &s) {
        using T = typename std::remove_reference_t<decltype(s)>::value_type;
        s.handle()
            .objects("A", &T::A)
            .objects("B", &T::B)
            .objects("C", &T::C)
            .bad("act 9", [](T &a) { a.act = static_cast<twConvertOp_t>(9); }, kInvalid, {"act"})
            .bad("B 40 x 17 (K differs from A)", [&](T &a) { a.B = w17.d; }, kInvalid, {"A|B"})
            .bad("C 3 x 41", [&](T &a) { a.C = c41.d; }, kInvalid, {"C"})
            .bad("C 4 x 40", [&](T &a) { a.C = c4.d; }, kInvalid, {"C"})
            .bad("A bf16, B fp32", [&](T &a) { a.A = x16.d; }, kNotSupported, {"A|B"});  // either of the pair
        // C has its own value type (results are rounded into it): bf16 C from fp32 A, B is valid
    };
    Suite<GSizeArgs> gsize(f, "twGemmToSparse_bufferSize", {f.h, x.d, f.wu.d, c.d, TW_CONVERT_RELU, &f.bytes},
                           [](const GSizeArgs &a) { return twGemmToSparse_bufferSize(a.h, a.A, a.B, a.C, a.act, a.bytes); });
    gemm_cases(gsize);
    gsize.bad("bytes NULL", [](GSizeArgs &a) { a.bytes = nullptr; }, kInvalid, {"bytes"}).run();

    size_t gbytes = 0;
    REQUIRE(twGemmToSparse_bufferSize(f.h, x.d, f.wu.d, c.d, TW_CONVERT_RELU, &gbytes) == TW_STATUS_SUCCESS);
    Suite<GArgs> gemm(f, "twGemmToSparse", {f.h, 1.0f, x.d, f.wu.d, c.d, TW_CONVERT_RELU, f.workspace(gbytes)},
                      [](const GArgs &a) { return twGemmToSparse(a.h, a.alpha, a.A, a.B, a.C, a.act, a.ws); });
    gemm_cases(gemm);
    workspace_case(gemm, gbytes, "twGemmToSparse").run();

    // SpMM: S = C (3 x 40, filled above), W = wDown (40 x 16), Y 3 x 16.
    Dn y = f.dense("Y", kM, kD, TW_R_32F, Fill::Poison);
    Dn y4 = f.dense("Y 4 x 16", kM + 1, kD, TW_R_32F, Fill::Poison);
    Dn y17 = f.dense("Y 3 x 17", kM, kD + 1, TW_R_32F, Fill::Poison);
    Dn y16 = f.dense("Y bf16", kM, kD, TW_R_16BF, Fill::Poison);
    Dn w41 = f.dense("W 41 x 16", kH + 1, kD, TW_R_32F, Fill::Data);
    Dn w16 = f.dense("W bf16", kH, kD, TW_R_16BF, Fill::Data);
    struct SSizeArgs {
        twHandle_t h;
        twSpMatDescr_t S;
        twDnMatDescr_t W, Y;
        size_t *bytes;
    };
    struct SArgs {
        twHandle_t h;
        float alpha;
        twSpMatDescr_t S;
        twDnMatDescr_t W;
        float beta;
        twDnMatDescr_t Y;
        void *ws;
    };
    auto spmm_cases = [&](auto &s) {
        using T = typename std::remove_reference_t<decltype(s)>::value_type;
        s.handle()
            .objects("S", &T::S)
            .objects("W", &T::W)
            .objects("Y", &T::Y)
            .bad("W 41 x 16 (K differs from S)", [&](T &a) { a.W = w41.d; }, kInvalid, {"S|W"})
            .bad("Y 4 x 16", [&](T &a) { a.Y = y4.d; }, kInvalid, {"Y"})
            .bad("Y 3 x 17", [&](T &a) { a.Y = y17.d; }, kInvalid, {"Y"})
            .bad("W bf16, S and Y fp32", [&](T &a) { a.W = w16.d; }, kNotSupported, {"W|Y"})  // either of the pair
            .bad("Y bf16, S and W fp32", [&](T &a) { a.Y = y16.d; }, kNotSupported, {"Y|W"});
        // S has its own value type (read exactly as fp32): bf16 S with fp32 W, Y is valid
    };
    Suite<SSizeArgs> ssize(f, "twSpMM_bufferSize", {f.h, c.d, f.wd.d, y.d, &f.bytes},
                           [](const SSizeArgs &a) { return twSpMM_bufferSize(a.h, a.S, a.W, a.Y, a.bytes); });
    spmm_cases(ssize);
    ssize.bad("bytes NULL", [](SSizeArgs &a) { a.bytes = nullptr; }, kInvalid, {"bytes"}).run();

    size_t sbytes = 0;
    REQUIRE(twSpMM_bufferSize(f.h, c.d, f.wd.d, y.d, &sbytes) == TW_STATUS_SUCCESS);
    Suite<SArgs> spmm(f, "twSpMM", {f.h, 1.0f, c.d, f.wd.d, 0.0f, y.d, f.workspace(sbytes)},
                      [](const SArgs &a) { return twSpMM(a.h, a.alpha, a.S, a.W, a.beta, a.Y, a.ws); });
    spmm_cases(spmm);
    workspace_case(spmm, sbytes, "twSpMM").run();

    {  // twSpMM with an S that records overflowed rows: INCOMPLETE_INPUT, Y untouched
        constexpr int64_t R = 4, C = 100, N = 8;
        Dn full = f.dense("S dense, every element non-zero", R, C, TW_R_16BF, Fill::Full);
        Sp over = f.twell("overflowed S", R, C, 64, 8);
        REQUIRE(status_name(dense_to_sparse(f, full.d, over.d)) == "TW_STATUS_CAPACITY_EXCEEDED");
        Dn w = f.dense("W bf16 100 x 8", C, N, TW_R_16BF, Fill::Data);
        Dn yo = f.dense("Y bf16 4 x 8", R, N, TW_R_16BF, Fill::Poison);
        size_t n = 0;
        REQUIRE(twSpMM_bufferSize(f.h, over.d, w.d, yo.d, &n) == TW_STATUS_SUCCESS);
        void *ws = f.workspace(n);
        const Fixture::Snapshot before = f.snapshot();
        const twStatus_t st = twSpMM(f.h, 1.0f, over.d, w.d, 0.0f, yo.d, ws);
        check_failure("twSpMM: S records rows it could not hold", TW_STATUS_INCOMPLETE_INPUT, {}, st,
                      error_message(f.h), f.changed_since(before));
    }
}

// =============================================================================================
TEST_CASE("zero-sized problems succeed", "[api][errors]") {
    Fixture f;
    Dn x0 = f.dense("X 0 x 16", 0, kD, TW_R_32F, Fill::Poison);
    Dn y0 = f.dense("Y 0 x 16", 0, kD, TW_R_32F, Fill::Poison);
    REQUIRE(x0.mem == nullptr);  // values NULL

    {  // forward
        size_t n = kPoisonBytes;
        REQUIRE(twSpGEMMFused_bufferSize(f.h, f.ffn, x0.d, y0.d, &n) == TW_STATUS_SUCCESS);
        CHECK(n != kPoisonBytes);
        CHECK(twSpGEMMFused(f.h, f.ffn, x0.d, y0.d, nullptr, f.workspace(n)) == TW_STATUS_SUCCESS);
        CHECK(twSpGEMMFused(f.h, f.ffn_relu, x0.d, y0.d, nullptr, f.workspace(n)) == TW_STATUS_SUCCESS);
        Sp hidden0 = f.hybrid("hidden 0 x 40", 0, kH, 8, 0, TW_R_32F);
        CHECK(twSpGEMMFused(f.h, f.ffn, x0.d, y0.d, hidden0.d, f.workspace(n)) == TW_STATUS_SUCCESS);
    }
    {  // training forward and backward
        size_t saved_bytes = kPoisonBytes, fwd = 0, bwd = kPoisonBytes;
        REQUIRE(twSpGEMMFusedSaved_bufferSize(f.h, f.ffn, 0, &saved_bytes) == TW_STATUS_SUCCESS);
        REQUIRE(twSpGEMMFused_bufferSize(f.h, f.ffn, x0.d, y0.d, &fwd) == TW_STATUS_SUCCESS);
        REQUIRE(twSpGEMMFusedBackward_bufferSize(f.h, f.ffn, 0, &bwd) == TW_STATUS_SUCCESS);
        void *saved = f.workspace(saved_bytes);
        CHECK(twSpGEMMFusedForwardTrain(f.h, f.ffn, x0.d, y0.d, saved, f.workspace(fwd)) == TW_STATUS_SUCCESS);
        Dn dx0 = f.dense("dX 0 x 16", 0, kD, TW_R_32F, Fill::Poison);
        Dn dy0 = f.dense("dY 0 x 16", 0, kD, TW_R_32F, Fill::Poison);
        Dn dwg = f.dense("dWgate", kH, kD, TW_R_32F, Fill::Poison);
        Dn dwu = f.dense("dWup", kH, kD, TW_R_32F, Fill::Poison);
        Dn dwd = f.dense("dWdown", kH, kD, TW_R_32F, Fill::Poison);
        CHECK(twSpGEMMFusedBackward(f.h, f.ffn, x0.d, saved, dy0.d, 0.5f, dx0.d, dwg.d, dwu.d, dwd.d,
                                    f.workspace(bwd)) == TW_STATUS_SUCCESS);
        // "Outputs are overwritten": with no tokens every weight gradient is exactly zero.
        for (Dn *dw : {&dwg, &dwu, &dwd}) {
            const float *v = reinterpret_cast<const float *>(dw->mem->data());
            bool zero = true;
            for (int64_t i = 0; i < kH * kD; ++i) zero = zero && v[i] == 0.0f;
            CHECK(zero);
        }
    }
    {  // building blocks and conversions
        Sp c0 = f.hybrid("C 0 x 40", 0, kH, 8, 0, TW_R_32F);
        size_t n = 0;
        REQUIRE(twGemmToSparse_bufferSize(f.h, x0.d, f.wu.d, c0.d, TW_CONVERT_RELU, &n) == TW_STATUS_SUCCESS);
        CHECK(twGemmToSparse(f.h, 1.0f, x0.d, f.wu.d, c0.d, TW_CONVERT_RELU, f.workspace(n)) == TW_STATUS_SUCCESS);
        REQUIRE(twSpMM_bufferSize(f.h, c0.d, f.wd.d, y0.d, &n) == TW_STATUS_SUCCESS);
        CHECK(twSpMM(f.h, 1.0f, c0.d, f.wd.d, 0.0f, y0.d, f.workspace(n)) == TW_STATUS_SUCCESS);

        Dn a0 = f.dense("A 0 x 100", 0, 100, TW_R_16BF, Fill::Poison);
        Sp t0 = f.twell("TwELL 0 x 100", 0, 100, 64, 8);
        CHECK(dense_to_sparse(f, a0.d, t0.d) == TW_STATUS_SUCCESS);
        CHECK(twSparseToDense(f.h, t0.d, a0.d) == TW_STATUS_SUCCESS);
        twSpMatInfo_t info;
        REQUIRE(twSpMatGetInfo(f.h, t0.d, &info) == TW_STATUS_SUCCESS);
        CHECK(info.nnz == 0);
    }
}
