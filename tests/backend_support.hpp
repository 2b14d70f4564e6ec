// The backend a test program runs its cases on, and Buffers: the memory of one run on a backend.
//
// The sources that the CPU and the CUDA programs share (test_ffn_forward.cpp,
// test_ffn_backward.cpp, test_building_blocks.cpp) are compiled once per backend: plainly into
// the CPU programs, with TWTEST_BACKEND_CUDA defined into the CUDA ones (tests/CMakeLists.txt).
// Their data are built in host memory (Dense, test_support.hpp); Buffers hands them to the
// library on a backend: the host objects themselves on the CPU, device mirrors on CUDA
// (src/testing/cuda/device_memory.hpp), read back by fetch().
#pragma once

#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#include "test_support.hpp"

#if defined(TWTEST_BACKEND_CUDA)
#include <cuda_runtime.h>

#include "testing/cuda/device_memory.hpp"
#endif

namespace twtest {

#if defined(TWTEST_BACKEND_CUDA)
inline constexpr twBackend_t kBackend = TW_BACKEND_CUDA;
#define TWTEST_BACKEND_TAG "[cuda]"
#else
inline constexpr twBackend_t kBackend = TW_BACKEND_CPU;
#define TWTEST_BACKEND_TAG "[cpu]"
#endif
/// Whether the cases run on the CUDA backend (then the CPU reference is their oracle).
inline constexpr bool kOnCuda = kBackend == TW_BACKEND_CUDA;

/// Where a test puts a weight matrix: `pad` extra elements per row or column (they hold NaN,
/// which no kernel may read) and `offset` bytes past a 256-byte aligned address.
struct WeightLayout {
    int64_t pad = 0;
    size_t offset = 0;
};

/// The weight `values` (H x D row-major) as a host matrix of `order` and `layout`, pads NaN.
inline std::unique_ptr<Dense> weight_matrix(int64_t h, int64_t d, twDataType_t t, twOrder_t order,
                                            const WeightLayout &layout, const std::vector<float> &values) {
    auto w = std::make_unique<Dense>(h, d, t, order, layout.pad);
    w->poison();
    w->fill(values);
    return w;
}

/// Whether a value of `t` (bits as Dense::bits gives them) is non-zero (-0 counts as zero).
inline bool nonzero_bits(uint32_t bits, twDataType_t t) { return (bits & (t == TW_R_32F ? 0x7fffffffu : 0x7fffu)) != 0; }

/// The bits of `v` rounded to `t` (as Dense::bits gives them).
inline uint32_t value_bits(twDataType_t t, float v) {
    return t == TW_R_32F ? twblas::float_bits(v) : twblas::bits16_of(t, twblas::round_to(t, v));
}

/// The memory of one run on `backend`: descriptors of host data on that backend, workspaces and
/// sparse containers in its memory, all released together.
class Buffers {
  public:
    explicit Buffers(twBackend_t backend) : device_(backend == TW_BACKEND_CUDA) {
#if !defined(TWTEST_BACKEND_CUDA)
        if (device_) FAIL("this test program is built for the CPU backend only");
#endif
    }
    ~Buffers() {
        for (twDnMatDescr_t d : dense_) twDestroyDnMat(d);
        for (Container &c : sparse_) twDestroySpMat(c.d);
    }
    Buffers(const Buffers &) = delete;
    Buffers &operator=(const Buffers &) = delete;

    bool device() const { return device_; }

    /// `m` as an input on the backend: itself, or a device copy of its current values.
    twDnMatDescr_t input(const Dense &m) { return mirror(m, nullptr); }
    /// `m` as an input whose first element lies `offset` bytes past a 256-byte aligned address
    /// (a copy in backend memory, its own descriptor); offset 0 is input(m).
    twDnMatDescr_t input_at(const Dense &m, size_t offset) {
        if (offset == 0) return input(m);
        const size_t bytes = m.storage.size() * 4;
        char *base = nullptr;
#if defined(TWTEST_BACKEND_CUDA)
        if (device_) {
            base = static_cast<char *>(keep(bytes + offset)->get());
            twblas::testing::cuda_check(cudaMemcpy(base + offset, m.storage.data(), bytes, cudaMemcpyHostToDevice),
                                        "cudaMemcpy");
        }
#endif
        if (!base) {
            base = static_cast<char *>(container_memory(bytes + offset));
            std::memcpy(base + offset, m.storage.data(), bytes);
        }
        twDnMatDescr_t d = nullptr;
        REQUIRE(twCreateDnMat(&d, m.rows, m.cols, m.ld, base + offset, m.type, m.order) == TW_STATUS_SUCCESS);
        dense_.push_back(d);
        return d;
    }
    /// `m` as an output on the backend: itself, or a device copy that fetch() copies back.
    twDnMatDescr_t output(Dense &m) { return mirror(m, &m); }

    /// Rows [row0, row0 + rows) of the row-major matrix `whole` (a descriptor of these Buffers),
    /// as a descriptor of the same memory.
    twDnMatDescr_t rows_of(twDnMatDescr_t whole, int64_t row0, int64_t rows) {
        int64_t r = 0, c = 0, ld = 0;
        void *values = nullptr;
        twDataType_t t{};
        twOrder_t order{};
        REQUIRE(twDnMatGet(whole, &r, &c, &ld, &values, &t, &order) == TW_STATUS_SUCCESS);
        REQUIRE(order == TW_ORDER_ROW);
        REQUIRE(row0 + rows <= r);
        const size_t elem = t == TW_R_32F ? 4 : 2;
        twDnMatDescr_t d = nullptr;
        REQUIRE(twCreateDnMat(&d, rows, c, ld, static_cast<char *>(values) + static_cast<size_t>(row0 * ld) * elem, t,
                              order) == TW_STATUS_SUCCESS);
        dense_.push_back(d);
        return d;
    }

    /// `bytes` (at least one) of backend memory holding garbage, never zeros.
    void *memory(size_t bytes) {
#if defined(TWTEST_BACKEND_CUDA)
        if (device_) return keep(bytes)->get();
#endif
        host_.emplace_back(std::max<size_t>(bytes, 1), uint8_t{0xA5});
        return host_.back().data();
    }

    /// An empty TwELL or hybrid container in backend memory (its buffer garbage).
    twSpMatDescr_t twell(int64_t rows, int64_t cols, twDataType_t t, int32_t tile = 256, int32_t compression = 8) {
        size_t bytes = 0;
        REQUIRE(twTwellBufferSize(rows, cols, tile, compression, &bytes) == TW_STATUS_SUCCESS);
        Container c{nullptr, container_memory(bytes), bytes};
        REQUIRE(twCreateTwell(&c.d, rows, cols, tile, compression, c.buffer, t) == TW_STATUS_SUCCESS);
        sparse_.push_back(c);
        return c.d;
    }
    twSpMatDescr_t hybrid(int64_t rows, int64_t cols, int32_t ell_width, int64_t backup, twDataType_t t) {
        size_t bytes = 0;
        REQUIRE(twHybridBufferSize(rows, cols, ell_width, backup, t, &bytes) == TW_STATUS_SUCCESS);
        Container c{nullptr, container_memory(bytes), bytes};
        REQUIRE(twCreateHybrid(&c.d, rows, cols, ell_width, backup, c.buffer, t) == TW_STATUS_SUCCESS);
        sparse_.push_back(c);
        return c.d;
    }

    /// The buffer of a container made by twell() or hybrid(), as 32-bit words (waits for the
    /// backend).
    std::vector<uint32_t> words(twSpMatDescr_t s) {
        for (const Container &c : sparse_)
            if (c.d == s) return read<uint32_t>(c.buffer, c.bytes / 4);
        FAIL("not a container of these Buffers");
        return {};
    }

    /// Overwrites the buffer of a container made by twell() or hybrid() with `w` (its words).
    void write_words(twSpMatDescr_t s, const std::vector<uint32_t> &w) {
        for (const Container &c : sparse_)
            if (c.d == s) {
                REQUIRE(w.size() * 4 == c.bytes);
#if defined(TWTEST_BACKEND_CUDA)
                if (device_) {
                    synchronize();
                    twblas::testing::cuda_check(cudaMemcpy(c.buffer, w.data(), c.bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
                    return;
                }
#endif
                std::memcpy(c.buffer, w.data(), c.bytes);
                return;
            }
        FAIL("not a container of these Buffers");
    }

    /// Writes `values` into this backend's memory at `dst`, after waiting for the backend.
    template <class T> void write(void *dst, const std::vector<T> &values) {
#if defined(TWTEST_BACKEND_CUDA)
        if (device_) {
            synchronize();
            twblas::testing::cuda_check(cudaMemcpy(dst, values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice),
                                        "cudaMemcpy");
            return;
        }
#endif
        std::memcpy(dst, values.data(), values.size() * sizeof(T));
    }

    /// Copies `bytes` of this backend's memory from `src` to `dst`, after waiting for the backend.
    void copy(void *dst, const void *src, size_t bytes) {
#if defined(TWTEST_BACKEND_CUDA)
        if (device_) {
            synchronize();
            twblas::testing::cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy");
            return;
        }
#endif
        std::memcpy(dst, src, bytes);
    }

    /// Sets `bytes` of this backend's memory at `dst` to zero, after waiting for the backend.
    void zero(void *dst, size_t bytes) {
#if defined(TWTEST_BACKEND_CUDA)
        if (device_) {
            synchronize();
            twblas::testing::cuda_check(cudaMemset(dst, 0, bytes), "cudaMemset");
            return;
        }
#endif
        std::memset(dst, 0, bytes);
    }

    /// `count` values of type T at `p` (memory of this backend), after waiting for the backend.
    template <class T> std::vector<T> read(const void *p, size_t count) {
        std::vector<T> out(count);
#if defined(TWTEST_BACKEND_CUDA)
        if (device_) {
            synchronize();
            if (count) twblas::testing::cuda_check(cudaMemcpy(out.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
            return out;
        }
#endif
        if (count) std::memcpy(out.data(), p, count * sizeof(T));
        return out;
    }

    /// Waits for the backend, then copies every output() mirror back into its Dense.
    void fetch() {
#if defined(TWTEST_BACKEND_CUDA)
        synchronize();
        for (const Mirror &m : mirrors_)
            if (m.host) m.host->storage = m.memory->download<uint32_t>(m.host->storage.size());
#endif
    }

    /// The values of a sparse container as a dense rows x cols matrix of type `t`, through
    /// twSparseToDense on `h` (which must be of this backend).
    std::unique_ptr<Dense> to_dense(twHandle_t h, twSpMatDescr_t s, twDataType_t t) {
        int64_t rows = 0, cols = 0;
        REQUIRE(twSpMatGetSize(s, &rows, &cols) == TW_STATUS_SUCCESS);
        auto out = std::make_unique<Dense>(rows, cols, t);
        out->poison();  // every element must be written
        Buffers local(device_ ? TW_BACKEND_CUDA : TW_BACKEND_CPU);
        TW_REQUIRE_OK(h, twSparseToDense(h, s, local.output(*out)));
        local.fetch();
        return out;
    }

  private:
    struct Container {
        twSpMatDescr_t d;
        void *buffer;
        size_t bytes;
    };
#if defined(TWTEST_BACKEND_CUDA)
    using DeviceMemory = twblas::testing::DeviceMemory;
    struct Mirror {
        Dense *host;  // null for inputs
        DeviceMemory *memory;
    };
    DeviceMemory *keep(size_t bytes, const void *host = nullptr) {
        device_memory_.push_back(host ? std::make_unique<DeviceMemory>(host, bytes) : std::make_unique<DeviceMemory>(bytes));
        return device_memory_.back().get();
    }
    void synchronize() {
        if (device_) twblas::testing::cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    }
    std::vector<std::unique_ptr<DeviceMemory>> device_memory_;
    std::vector<Mirror> mirrors_;
#endif

    twDnMatDescr_t mirror(const Dense &m, Dense *fetch_into) {
#if defined(TWTEST_BACKEND_CUDA)
        if (device_) {
            DeviceMemory *mem = keep(m.storage.size() * 4, m.storage.data());
            twDnMatDescr_t d = nullptr;
            REQUIRE(twCreateDnMat(&d, m.rows, m.cols, m.ld, mem->get(), m.type, m.order) == TW_STATUS_SUCCESS);
            dense_.push_back(d);
            mirrors_.push_back({fetch_into, mem});
            return d;
        }
#endif
        (void)fetch_into;
        return m.d;
    }
    /// Container memory: 256-byte aligned, garbage (writers must not rely on a cleared buffer).
    void *container_memory(size_t bytes) {
#if defined(TWTEST_BACKEND_CUDA)
        if (device_) return keep(bytes)->get();
#endif
        host_.emplace_back(bytes + 256, uint8_t{0xA5});
        const uintptr_t p = reinterpret_cast<uintptr_t>(host_.back().data());
        return host_.back().data() + (256 - p % 256) % 256;
    }

    bool device_;
    std::deque<std::vector<uint8_t>> host_;  // a deque: growing it never moves an element
    std::vector<twDnMatDescr_t> dense_;
    std::vector<Container> sparse_;
};

}  // namespace twtest
