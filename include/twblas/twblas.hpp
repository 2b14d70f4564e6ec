/**
 * @file twblas.hpp
 * @brief Header-only C++17 RAII layer over the twblas C API (twblas.h).
 *
 * Every class owns one C object and destroys it in its destructor; classes are move-only.
 * A failed call throws twblas::Exception carrying the status, the name of the C function and
 * twGetErrorMessage()'s explanation. The C objects stay reachable through get(), so the C API
 * can be mixed in freely.
 *
 * Memory: like the C API, descriptors never own the data they describe (except the *_host
 * sparse factories, which allocate their buffer on the host). Pointers must live where the
 * handle's backend computes: host memory for TW_BACKEND_CPU, device memory for
 * TW_BACKEND_CUDA. The convenience overloads that allocate a workspace themselves allocate it
 * on the host, so they are only for the CPU backend (NOT_SUPPORTED otherwise).
 *
 * Lifetimes: a DenseMatrix, SparseMatrix or Ffn must not outlive the memory it describes; an
 * Ffn keeps the raw handle it was created with, so the Handle must outlive it.
 *
 * @code
 * twblas::Handle handle(TW_BACKEND_CPU);
 * auto wg = twblas::DenseMatrix::row_major(gate.data(), H, D);   // nn.Linear gate_proj.weight
 * auto wu = twblas::DenseMatrix::row_major(up.data(), H, D);     // nn.Linear up_proj.weight
 * auto wd = twblas::DenseMatrix::col_major(down.data(), H, D);   // nn.Linear down_proj.weight
 * auto ffn = twblas::Ffn::gated(handle, wg, wu, wd);
 * auto X = twblas::DenseMatrix::row_major(x.data(), M, D);
 * auto Y = twblas::DenseMatrix::row_major(y.data(), M, D);
 * ffn.forward(X, Y);                                             // Y = FFN(X)
 * @endcode
 */
#ifndef TWBLAS_TWBLAS_HPP
#define TWBLAS_TWBLAS_HPP

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "twblas/twblas.h"

/** The twblas C++ layer. */
namespace twblas {

/** Error thrown by the C++ layer when a twblas call does not return TW_STATUS_SUCCESS. */
class Exception : public std::runtime_error {
  public:
    /** @param status the status returned; @param call the C function that failed;
     *  @param detail the library's explanation (twGetErrorMessage). */
    Exception(twStatus_t status, const std::string &call, const std::string &detail)
        : std::runtime_error(call + ": " + name_of(status) + (detail.empty() ? "" : ": ") +
                             detail),
          status_(status), call_(call), detail_(detail) {}

    /** The status the failed call returned. */
    twStatus_t status() const noexcept { return status_; }
    /** Name of the C function that failed, e.g. "twCreateFfn". */
    const std::string &call() const noexcept { return call_; }
    /** twGetErrorMessage() right after the failure ("" when the library gave none). */
    const std::string &detail() const noexcept { return detail_; }

  private:
    static std::string name_of(twStatus_t status) {
        const char *name = twGetStatusName(status);
        return name ? name : "TW_STATUS_<unknown>";
    }
    twStatus_t status_;
    std::string call_;
    std::string detail_;
};

/** Throws Exception when @p status is not TW_STATUS_SUCCESS. @p handle (may be NULL) is the
 *  handle of the failed call, for twGetErrorMessage; NULL reads the thread's last error. */
inline void check(twStatus_t status, const char *call, twHandle_t handle = nullptr) {
    if (status != TW_STATUS_SUCCESS) {
        const char *detail = twGetErrorMessage(handle);
        throw Exception(status, call, detail ? detail : "");
    }
}

/** Library version, MAJOR*10000 + MINOR*100 + PATCH (twGetVersion). */
inline int version() {
    int v = 0;
    check(twGetVersion(&v), "twGetVersion");
    return v;
}

/** Implementation details of the C++ layer (not part of its interface). */
namespace cxx_detail {

/** Move-only owner of a C object of pointer type @p T destroyed by @p Destroy. */
template <class T, twStatus_t (*Destroy)(T)>
class Owner {
  public:
    /** Owns nothing. */
    Owner() noexcept = default;
    /** Takes ownership of @p object (may be NULL). */
    explicit Owner(T object) noexcept : object_(object) {}
    /** Destroys the object (a NULL object is a no-op). */
    ~Owner() { reset(); }
    /** Not copyable: one owner per C object. */
    Owner(const Owner &) = delete;
    /** Not copyable: one owner per C object. */
    Owner &operator=(const Owner &) = delete;
    /** Moves ownership; @p other owns nothing afterwards. */
    Owner(Owner &&other) noexcept : object_(other.release()) {}
    /** Destroys the current object and takes @p other's. */
    Owner &operator=(Owner &&other) noexcept {
        if (this != &other) reset(other.release());
        return *this;
    }
    /** The C object (NULL if none). */
    T get() const noexcept { return object_; }
    /** Gives the C object up without destroying it. */
    T release() noexcept { return std::exchange(object_, nullptr); }
    /** Destroys the current object and owns @p object instead. */
    void reset(T object = nullptr) noexcept {
        T old = std::exchange(object_, object);
        if (old) (void)Destroy(old);  // destroy cannot fail on a live object we own
    }

  private:
    T object_ = nullptr;
};

/** 16-byte block: host buffers made of these meet the alignment of every twblas buffer. */
struct alignas(16) Block16 {
    unsigned char bytes[16]; /**< storage */
};

/** Host storage of at least @p bytes bytes, 16-byte aligned. */
inline std::vector<Block16> host_storage(std::size_t bytes) {
    return std::vector<Block16>((bytes + sizeof(Block16) - 1) / sizeof(Block16) + 1);
}

}  // namespace cxx_detail

/** A library context (twHandle_t): backend, stream and last error message. */
class Handle {
  public:
    /** Creates a handle on @p backend (twCreateWithBackend). TW_BACKEND_DEFAULT picks CUDA
     *  when built with it and a usable GPU is present, else the CPU. */
    explicit Handle(twBackend_t backend = TW_BACKEND_DEFAULT) {
        twHandle_t h = nullptr;
        check(twCreateWithBackend(&h, backend), "twCreateWithBackend");
        owner_.reset(h);
    }
    /** The C handle. */
    twHandle_t get() const noexcept { return owner_.get(); }
    /** Gives the C handle up without destroying it. */
    twHandle_t release() noexcept { return owner_.release(); }
    /** The backend the handle computes on (never TW_BACKEND_DEFAULT). */
    twBackend_t backend() const {
        twBackend_t b = TW_BACKEND_CPU;
        check(twGetBackend(get(), &b), "twGetBackend", get());
        return b;
    }
    /** Sets the cudaStream_t of every call on this handle (NULL: the default). */
    void set_stream(void *stream) { check(twSetStream(get(), stream), "twSetStream", get()); }
    /** The stream set with set_stream (NULL if none). */
    void *stream() const {
        void *s = nullptr;
        check(twGetStream(get(), &s), "twGetStream", get());
        return s;
    }
    /** Detail of the last failed call on this handle ("" if none). */
    std::string last_error() const {
        const char *m = twGetErrorMessage(get());
        return m ? m : "";
    }

  private:
    cxx_detail::Owner<twHandle_t, twDestroy> owner_;
};

/** A dense matrix descriptor (twDnMatDescr_t) over memory it does not own. */
class DenseMatrix {
  public:
    /** Describes @p rows x @p cols values at @p values, stored in @p order with leading
     *  dimension @p ld (twCreateDnMat). */
    DenseMatrix(std::int64_t rows, std::int64_t cols, std::int64_t ld, void *values,
                twDataType_t type, twOrder_t order) {
        twDnMatDescr_t d = nullptr;
        check(twCreateDnMat(&d, rows, cols, ld, values, type, order), "twCreateDnMat");
        owner_.reset(d);
    }
    /** Row-major fp32 rows x cols, ld = cols. */
    static DenseMatrix row_major(float *values, std::int64_t rows, std::int64_t cols) {
        return DenseMatrix(rows, cols, cols, values, TW_R_32F, TW_ORDER_ROW);
    }
    /** Column-major fp32 rows x cols, ld = rows (e.g. nn.Linear's down_proj.weight seen as
     *  the logical H x D matrix). */
    static DenseMatrix col_major(float *values, std::int64_t rows, std::int64_t cols) {
        return DenseMatrix(rows, cols, rows, values, TW_R_32F, TW_ORDER_COL);
    }
    /** Row-major 16-bit rows x cols (TW_R_16BF or TW_R_16F bit patterns), ld = cols. */
    static DenseMatrix row_major(std::uint16_t *values, std::int64_t rows, std::int64_t cols,
                                 twDataType_t type) {
        return DenseMatrix(rows, cols, cols, values, type, TW_ORDER_ROW);
    }
    /** Column-major 16-bit rows x cols (TW_R_16BF or TW_R_16F bit patterns), ld = rows. */
    static DenseMatrix col_major(std::uint16_t *values, std::int64_t rows, std::int64_t cols,
                                 twDataType_t type) {
        return DenseMatrix(rows, cols, rows, values, type, TW_ORDER_COL);
    }
    /** Row-major fp32 over a host vector; throws INVALID_VALUE when it is too small. */
    static DenseMatrix row_major(std::vector<float> &values, std::int64_t rows,
                                 std::int64_t cols) {
        require_size(values.size(), rows, cols);
        return row_major(values.data(), rows, cols);
    }
    /** Column-major fp32 over a host vector; throws INVALID_VALUE when it is too small. */
    static DenseMatrix col_major(std::vector<float> &values, std::int64_t rows,
                                 std::int64_t cols) {
        require_size(values.size(), rows, cols);
        return col_major(values.data(), rows, cols);
    }

    /** The C descriptor. */
    twDnMatDescr_t get() const noexcept { return owner_.get(); }
    /** Gives the C descriptor up without destroying it. */
    twDnMatDescr_t release() noexcept { return owner_.release(); }
    /** Number of rows. */
    std::int64_t rows() const {
        std::int64_t r = 0;
        check(twDnMatGet(get(), &r, nullptr, nullptr, nullptr, nullptr, nullptr), "twDnMatGet");
        return r;
    }
    /** Number of columns. */
    std::int64_t cols() const {
        std::int64_t c = 0;
        check(twDnMatGet(get(), nullptr, &c, nullptr, nullptr, nullptr, nullptr), "twDnMatGet");
        return c;
    }
    /** Leading dimension. */
    std::int64_t ld() const {
        std::int64_t l = 0;
        check(twDnMatGet(get(), nullptr, nullptr, &l, nullptr, nullptr, nullptr), "twDnMatGet");
        return l;
    }
    /** The memory described. */
    void *values() const {
        void *v = nullptr;
        check(twDnMatGet(get(), nullptr, nullptr, nullptr, &v, nullptr, nullptr), "twDnMatGet");
        return v;
    }
    /** Value type. */
    twDataType_t type() const {
        twDataType_t t = TW_R_32F;
        check(twDnMatGet(get(), nullptr, nullptr, nullptr, nullptr, &t, nullptr), "twDnMatGet");
        return t;
    }
    /** Storage order. */
    twOrder_t order() const {
        twOrder_t o = TW_ORDER_ROW;
        check(twDnMatGet(get(), nullptr, nullptr, nullptr, nullptr, nullptr, &o), "twDnMatGet");
        return o;
    }

  private:
    static void require_size(std::size_t size, std::int64_t rows, std::int64_t cols) {
        if (rows >= 0 && cols >= 0 &&
            size < static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols))
            throw Exception(TW_STATUS_INVALID_VALUE, "twblas::DenseMatrix",
                            "values: the vector holds " + std::to_string(size) +
                                " elements, fewer than " + std::to_string(rows) + " x " +
                                std::to_string(cols));
    }
    cxx_detail::Owner<twDnMatDescr_t, twDestroyDnMat> owner_;
};

/** A sparse matrix descriptor (twSpMatDescr_t), TwELL or hybrid, over a buffer that it owns
 *  (the *_host factories) or that the caller owns (the other factories). */
class SparseMatrix {
  public:
    /** Bytes of a TwELL buffer (twTwellBufferSize). */
    static std::size_t twell_buffer_size(std::int64_t rows, std::int64_t cols,
                                         std::int32_t tileWidth = 256,
                                         std::int32_t compression = 8) {
        std::size_t bytes = 0;
        check(twTwellBufferSize(rows, cols, tileWidth, compression, &bytes), "twTwellBufferSize");
        return bytes;
    }
    /** Bytes of a hybrid buffer (twHybridBufferSize). */
    static std::size_t hybrid_buffer_size(std::int64_t rows, std::int64_t cols,
                                          std::int32_t ellWidth, std::int64_t backupRows,
                                          twDataType_t type) {
        std::size_t bytes = 0;
        check(twHybridBufferSize(rows, cols, ellWidth, backupRows, type, &bytes),
              "twHybridBufferSize");
        return bytes;
    }

    /** TwELL over a caller's buffer of twell_buffer_size() bytes (backend memory, 4-byte
     *  aligned); values TW_R_16BF or TW_R_16F (twCreateTwell). */
    static SparseMatrix twell(std::int64_t rows, std::int64_t cols, void *buffer,
                              twDataType_t type, std::int32_t tileWidth = 256,
                              std::int32_t compression = 8) {
        twSpMatDescr_t d = nullptr;
        check(twCreateTwell(&d, rows, cols, tileWidth, compression, buffer, type),
              "twCreateTwell");
        return SparseMatrix(d, {});
    }
    /** TwELL with a buffer allocated on the host and owned by the object (CPU backend). */
    static SparseMatrix twell_host(std::int64_t rows, std::int64_t cols, twDataType_t type,
                                   std::int32_t tileWidth = 256, std::int32_t compression = 8) {
        auto storage = cxx_detail::host_storage(twell_buffer_size(rows, cols, tileWidth,
                                                                  compression));
        twSpMatDescr_t d = nullptr;
        check(twCreateTwell(&d, rows, cols, tileWidth, compression, storage.data(), type),
              "twCreateTwell");
        return SparseMatrix(d, std::move(storage));
    }
    /** Hybrid over a caller's buffer of hybrid_buffer_size() bytes (backend memory, 16-byte
     *  aligned); values TW_R_16BF, TW_R_16F or TW_R_32F (twCreateHybrid). backupRows = rows
     *  guarantees that nothing can overflow. */
    static SparseMatrix hybrid(std::int64_t rows, std::int64_t cols, std::int32_t ellWidth,
                               std::int64_t backupRows, void *buffer, twDataType_t type) {
        twSpMatDescr_t d = nullptr;
        check(twCreateHybrid(&d, rows, cols, ellWidth, backupRows, buffer, type),
              "twCreateHybrid");
        return SparseMatrix(d, {});
    }
    /** Hybrid with a buffer allocated on the host and owned by the object (CPU backend). */
    static SparseMatrix hybrid_host(std::int64_t rows, std::int64_t cols, std::int32_t ellWidth,
                                    std::int64_t backupRows, twDataType_t type) {
        auto storage = cxx_detail::host_storage(
            hybrid_buffer_size(rows, cols, ellWidth, backupRows, type));
        twSpMatDescr_t d = nullptr;
        check(twCreateHybrid(&d, rows, cols, ellWidth, backupRows, storage.data(), type),
              "twCreateHybrid");
        return SparseMatrix(d, std::move(storage));
    }

    /** The C descriptor. */
    twSpMatDescr_t get() const noexcept { return owner_.get(); }
    /** Format (TW_FORMAT_TWELL or TW_FORMAT_HYBRID). */
    twFormat_t format() const {
        twFormat_t f = TW_FORMAT_TWELL;
        check(twSpMatGetFormat(get(), &f), "twSpMatGetFormat");
        return f;
    }
    /** Number of rows. */
    std::int64_t rows() const {
        std::int64_t r = 0;
        check(twSpMatGetSize(get(), &r, nullptr), "twSpMatGetSize");
        return r;
    }
    /** Number of columns. */
    std::int64_t cols() const {
        std::int64_t c = 0;
        check(twSpMatGetSize(get(), nullptr, &c), "twSpMatGetSize");
        return c;
    }
    /** The buffer described. */
    void *buffer() const {
        void *b = nullptr;
        check(twSpMatGetBuffer(get(), &b, nullptr), "twSpMatGetBuffer");
        return b;
    }
    /** Value type. */
    twDataType_t type() const {
        twDataType_t t = TW_R_16BF;
        check(twSpMatGetBuffer(get(), nullptr, &t), "twSpMatGetBuffer");
        return t;
    }
    /** Content counts, read back to the host (twSpMatGetInfo; blocking). */
    twSpMatInfo_t info(const Handle &handle) const {
        twSpMatInfo_t i{};
        check(twSpMatGetInfo(handle.get(), get(), &i), "twSpMatGetInfo", handle.get());
        return i;
    }
    /** Checks every format invariant; throws INVALID_VALUE naming the first violation. */
    void validate(const Handle &handle) const {
        check(twSpMatValidate(handle.get(), get()), "twSpMatValidate", handle.get());
    }

    /** Fills this matrix from @p in (the three phases of twDenseToSparse_*, with a host
     *  workspace: CPU backend). CAPACITY_EXCEEDED is thrown after the conversion, which then
     *  records the rows that did not fit (info()). */
    void assign_from_dense(const Handle &handle, const DenseMatrix &in,
                           twConvertOp_t op = TW_CONVERT_PLAIN) {
        require_cpu(handle, "twDenseToSparse_convert");
        std::size_t bytes = 0;
        check(twDenseToSparse_bufferSize(handle.get(), in.get(), get(), op, &bytes),
              "twDenseToSparse_bufferSize", handle.get());
        auto ws = cxx_detail::host_storage(bytes);
        const twStatus_t analysed =
            twDenseToSparse_analysis(handle.get(), in.get(), get(), op, ws.data());
        if (analysed != TW_STATUS_CAPACITY_EXCEEDED)
            check(analysed, "twDenseToSparse_analysis", handle.get());
        check(twDenseToSparse_convert(handle.get(), in.get(), get(), op, ws.data()),
              "twDenseToSparse_convert", handle.get());
    }
    /** Writes every element of @p out (twSparseToDense). */
    void to_dense(const Handle &handle, const DenseMatrix &out) const {
        check(twSparseToDense(handle.get(), get(), out.get()), "twSparseToDense", handle.get());
    }
    /** Re-packs this matrix into @p out, another container of the same size and value type
     *  (twSparseConvert). */
    void convert_to(const Handle &handle, SparseMatrix &out) const {
        check(twSparseConvert(handle.get(), get(), out.get()), "twSparseConvert", handle.get());
    }
    /** out = this^T (twSparseTranspose). */
    void transpose_to(const Handle &handle, SparseMatrix &out) const {
        check(twSparseTranspose(handle.get(), get(), out.get()), "twSparseTranspose",
              handle.get());
    }

  private:
    SparseMatrix(twSpMatDescr_t d, std::vector<cxx_detail::Block16> storage) noexcept
        : storage_(std::move(storage)), owner_(d) {}
    static void require_cpu(const Handle &handle, const char *call) {
        if (handle.backend() != TW_BACKEND_CPU)
            throw Exception(TW_STATUS_NOT_SUPPORTED, call,
                            "the C++ convenience call allocates its workspace on the host; use "
                            "the C API with a device workspace on this backend");
    }
    friend class Ffn;
    // Declared first so that the descriptor is destroyed before the buffer it describes.
    std::vector<cxx_detail::Block16> storage_;
    cxx_detail::Owner<twSpMatDescr_t, twDestroySpMat> owner_;
};

/** A fused sparse feed-forward layer (twFfnDescr_t): the weights' packed copy and its
 *  attributes. Gated: Y = (ReLU(X Wg^T) * (X Wu^T)) Wd; plain: Y = ReLU(X Wu^T) Wd. */
class Ffn {
  public:
    /** Creates the layer (twCreateFfn; setup call: allocates and blocks). Every weight is the
     *  logical H x D matrix; @p wGate is NULL for TW_FFN_RELU. */
    Ffn(const Handle &handle, twFfnKind_t kind, const DenseMatrix *wGate, const DenseMatrix &wUp,
        const DenseMatrix &wDown)
        : handle_(handle.get()) {
        twFfnDescr_t f = nullptr;
        check(twCreateFfn(handle_, &f, kind, wGate ? wGate->get() : nullptr, wUp.get(),
                          wDown.get()),
              "twCreateFfn", handle_);
        owner_.reset(f);
    }
    /** Gated ReLU layer: Y = (ReLU(X Wg^T) * (X Wu^T)) Wd. */
    static Ffn gated(const Handle &handle, const DenseMatrix &wGate, const DenseMatrix &wUp,
                     const DenseMatrix &wDown) {
        return Ffn(handle, TW_FFN_GATED_RELU, &wGate, wUp, wDown);
    }
    /** Plain ReLU layer: Y = ReLU(X Wu^T) Wd. */
    static Ffn relu(const Handle &handle, const DenseMatrix &wUp, const DenseMatrix &wDown) {
        return Ffn(handle, TW_FFN_RELU, nullptr, wUp, wDown);
    }

    /** The C descriptor. */
    twFfnDescr_t get() const noexcept { return owner_.get(); }
    /** The C handle the layer computes with. */
    twHandle_t handle() const noexcept { return handle_; }
    /** Model dimension D. */
    std::int64_t model_dim() const {
        std::int64_t d = 0;
        check(twFfnGetSize(get(), &d, nullptr), "twFfnGetSize", handle_);
        return d;
    }
    /** Hidden dimension H. */
    std::int64_t hidden_dim() const {
        std::int64_t h = 0;
        check(twFfnGetSize(get(), nullptr, &h), "twFfnGetSize", handle_);
        return h;
    }
    /** Sets an int32 attribute (twFfnSetAttribute), e.g. TW_FFN_ATTR_DETERMINISTIC, 1. */
    void set_attribute(twFfnAttribute_t attr, std::int32_t value) {
        check(twFfnSetAttribute(get(), attr, &value, sizeof value), "twFfnSetAttribute",
              handle_);
    }
    /** Reads an int32 attribute (twFfnGetAttribute). */
    std::int32_t attribute(twFfnAttribute_t attr) const {
        std::int32_t value = 0;
        check(twFfnGetAttribute(get(), attr, &value, sizeof value), "twFfnGetAttribute",
              handle_);
        return value;
    }
    /** Pins the forward's algorithm (TW_FFN_ATTR_ALGORITHM; TW_FFN_ALG_DEFAULT chooses). */
    void set_algorithm(twFfnAlgorithm_t algorithm) { set_attribute(TW_FFN_ATTR_ALGORITHM, algorithm); }
    /** Sets a tuning knob of the backend's path choice by name (twFfnSetTuning). */
    void set_tuning(const char *name, double value) {
        check(twFfnSetTuning(get(), name, value), "twFfnSetTuning", handle_);
    }
    /** Reads a tuning knob by name (twFfnGetTuning). */
    double tuning(const char *name) const {
        double value = 0;
        check(twFfnGetTuning(get(), name, &value), "twFfnGetTuning", handle_);
        return value;
    }
    /** Bytes of weight copies the FFN holds in the backend's memory
     *  (TW_FFN_ATTR_WEIGHT_COPY_BYTES; 0 when every weight is read in place). */
    std::int64_t weight_copy_bytes() const {
        std::int64_t value = 0;
        check(twFfnGetAttribute(get(), TW_FFN_ATTR_WEIGHT_COPY_BYTES, &value, sizeof value),
              "twFfnGetAttribute", handle_);
        return value;
    }
    /** Points the FFN at new weights, or re-copies those it holds copies of
     *  (twFfnUpdateWeights; same shapes and types). */
    void update_weights(const DenseMatrix *wGate, const DenseMatrix &wUp,
                        const DenseMatrix &wDown) {
        check(twFfnUpdateWeights(handle_, get(), wGate ? wGate->get() : nullptr, wUp.get(),
                                 wDown.get()),
              "twFfnUpdateWeights", handle_);
    }

    /** Workspace bytes of forward() for these X and Y (twSpGEMMFused_bufferSize). */
    std::size_t workspace_size(const DenseMatrix &X, const DenseMatrix &Y) const {
        std::size_t bytes = 0;
        check(twSpGEMMFused_bufferSize(handle_, get(), X.get(), Y.get(), &bytes),
              "twSpGEMMFused_bufferSize", handle_);
        return bytes;
    }
    /** Y = FFN(X) (twSpGEMMFused) with a caller's workspace of workspace_size() bytes in
     *  backend memory. @p hidden (may be NULL) receives the activations h. */
    void forward(const DenseMatrix &X, const DenseMatrix &Y, SparseMatrix *hidden,
                 void *workspace) {
        check(twSpGEMMFused(handle_, get(), X.get(), Y.get(), hidden ? hidden->get() : nullptr,
                            workspace),
              "twSpGEMMFused", handle_);
    }
    /** Y = FFN(X) with a host workspace kept by the object (CPU backend only). @p hidden
     *  (optional) receives the activations h. */
    void forward(const DenseMatrix &X, const DenseMatrix &Y, SparseMatrix *hidden = nullptr) {
        require_cpu("twSpGEMMFused");
        forward(X, Y, hidden, host_workspace(workspace_size(X, Y)));
    }
    /** Activation statistics of the last forward (twFfnGetStats; blocking). */
    twFfnStats_t stats() const {
        twFfnStats_t s{};
        check(twFfnGetStats(handle_, get(), &s), "twFfnGetStats", handle_);
        return s;
    }
    /** Per-neuron activation counts since the last reset, H values written to @p counts in
     *  backend memory (twFfnGetNeuronCounts). */
    void neuron_counts(std::int64_t *counts) const {
        check(twFfnGetNeuronCounts(handle_, get(), counts), "twFfnGetNeuronCounts", handle_);
    }
    /** Per-neuron activation counts since the last reset (CPU backend only). */
    std::vector<std::int64_t> neuron_counts() const {
        require_cpu("twFfnGetNeuronCounts");
        std::vector<std::int64_t> counts(static_cast<std::size_t>(hidden_dim()));
        neuron_counts(counts.data());
        return counts;
    }
    /** Sets the per-neuron counts to zero (twFfnResetNeuronCounts). */
    void reset_neuron_counts() {
        check(twFfnResetNeuronCounts(handle_, get()), "twFfnResetNeuronCounts", handle_);
    }

    /** Bytes of the saved state of forward_train() for @p tokens tokens. */
    std::size_t saved_size(std::int64_t tokens) const {
        std::size_t bytes = 0;
        check(twSpGEMMFusedSaved_bufferSize(handle_, get(), tokens, &bytes),
              "twSpGEMMFusedSaved_bufferSize", handle_);
        return bytes;
    }
    /** Forward that also writes what backward() needs into @p saved
     *  (twSpGEMMFusedForwardTrain; workspace of workspace_size() bytes). */
    void forward_train(const DenseMatrix &X, const DenseMatrix &Y, void *saved, void *workspace) {
        check(twSpGEMMFusedForwardTrain(handle_, get(), X.get(), Y.get(), saved, workspace),
              "twSpGEMMFusedForwardTrain", handle_);
    }
    /** Workspace bytes of backward() for @p tokens tokens. */
    std::size_t backward_workspace_size(std::int64_t tokens) const {
        std::size_t bytes = 0;
        check(twSpGEMMFusedBackward_bufferSize(handle_, get(), tokens, &bytes),
              "twSpGEMMFusedBackward_bufferSize", handle_);
        return bytes;
    }
    /** dX, dWgate (NULL for a plain layer), dWup, dWdown from X, the saved state of
     *  forward_train on X and dY (twSpGEMMFusedBackward); l1Coeff adds the L1 regulariser. */
    void backward(const DenseMatrix &X, const void *saved, const DenseMatrix &dY, float l1Coeff,
                  const DenseMatrix &dX, const DenseMatrix *dWgate, const DenseMatrix &dWup,
                  const DenseMatrix &dWdown, void *workspace) {
        check(twSpGEMMFusedBackward(handle_, get(), X.get(), saved, dY.get(), l1Coeff, dX.get(),
                                    dWgate ? dWgate->get() : nullptr, dWup.get(), dWdown.get(),
                                    workspace),
              "twSpGEMMFusedBackward", handle_);
    }

  private:
    void require_cpu(const char *call) const {
        twBackend_t b = TW_BACKEND_CPU;
        check(twGetBackend(handle_, &b), "twGetBackend", handle_);
        if (b != TW_BACKEND_CPU)
            throw Exception(TW_STATUS_NOT_SUPPORTED, call,
                            "the C++ convenience call uses host memory; pass backend memory "
                            "through the other overload on this backend");
    }
    void *host_workspace(std::size_t bytes) {
        if (workspace_.size() * sizeof(cxx_detail::Block16) < bytes)
            workspace_ = cxx_detail::host_storage(bytes);
        return workspace_.data();
    }
    twHandle_t handle_ = nullptr;
    std::vector<cxx_detail::Block16> workspace_;
    cxx_detail::Owner<twFfnDescr_t, twDestroyFfn> owner_;
};

/** C = act(alpha * A B^T) into a sparse @p C (twGemmToSparse; host workspace: CPU backend). */
inline void gemm_to_sparse(const Handle &handle, float alpha, const DenseMatrix &A,
                           const DenseMatrix &B, SparseMatrix &C,
                           twConvertOp_t act = TW_CONVERT_RELU) {
    std::size_t bytes = 0;
    check(twGemmToSparse_bufferSize(handle.get(), A.get(), B.get(), C.get(), act, &bytes),
          "twGemmToSparse_bufferSize", handle.get());
    if (handle.backend() != TW_BACKEND_CPU)
        throw Exception(TW_STATUS_NOT_SUPPORTED, "twGemmToSparse",
                        "twblas::gemm_to_sparse allocates a host workspace: CPU backend only");
    auto ws = cxx_detail::host_storage(bytes);
    check(twGemmToSparse(handle.get(), alpha, A.get(), B.get(), C.get(), act, ws.data()),
          "twGemmToSparse", handle.get());
}

/** Y = alpha * S W + beta * Y (twSpMM; host workspace: CPU backend). */
inline void spmm(const Handle &handle, float alpha, const SparseMatrix &S, const DenseMatrix &W,
                 float beta, const DenseMatrix &Y) {
    std::size_t bytes = 0;
    check(twSpMM_bufferSize(handle.get(), S.get(), W.get(), Y.get(), &bytes),
          "twSpMM_bufferSize", handle.get());
    if (handle.backend() != TW_BACKEND_CPU)
        throw Exception(TW_STATUS_NOT_SUPPORTED, "twSpMM",
                        "twblas::spmm allocates a host workspace: CPU backend only");
    auto ws = cxx_detail::host_storage(bytes);
    check(twSpMM(handle.get(), alpha, S.get(), W.get(), beta, Y.get(), ws.data()), "twSpMM",
          handle.get());
}

}  // namespace twblas

#endif  // TWBLAS_TWBLAS_HPP
