// Small CUDA helpers shared by the device sources: error checks that become twblas::Error, an
// owning device buffer for setup-time allocations, and value-type access in kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "host/error.hpp"

namespace twblas::cuda {

/// Throws EXECUTION_FAILED naming the call and the CUDA error.
inline void check(cudaError_t e, const char *what) {
    if (e != cudaSuccess) fail(TW_STATUS_EXECUTION_FAILED, "%s: %s", what, cudaGetErrorString(e));
}
/// After a launch: reports a bad launch configuration or an earlier asynchronous fault.
inline void check_launch(const char *kernel) { check(cudaGetLastError(), kernel); }

/// Device memory owned by a setup-time object (FFN weights, counters). Never used by compute
/// calls, which take their scratch from the caller's workspace.
class DeviceBuffer {
  public:
    DeviceBuffer() = default;
    explicit DeviceBuffer(size_t bytes) { reset(bytes); }
    ~DeviceBuffer() { release(); }
    DeviceBuffer(const DeviceBuffer &) = delete;
    DeviceBuffer &operator=(const DeviceBuffer &) = delete;
    void reset(size_t bytes) {
        release();
        if (bytes == 0) return;
        if (cudaMalloc(&ptr_, bytes) != cudaSuccess) {
            (void)cudaGetLastError();
            ptr_ = nullptr;
            fail(TW_STATUS_ALLOC_FAILED, "cudaMalloc of %zu bytes failed", bytes);
        }
        bytes_ = bytes;
    }
    template <class T = void> T *get() const { return static_cast<T *>(ptr_); }
    size_t bytes() const { return bytes_; }

  private:
    void release() {
        if (ptr_) (void)cudaFree(ptr_);
        ptr_ = nullptr;
        bytes_ = 0;
    }
    void *ptr_ = nullptr;
    size_t bytes_ = 0;
};

/// Carves aligned pieces out of a caller's workspace (and measures it when base is NULL).
class WorkspaceCarver {
  public:
    explicit WorkspaceCarver(void *base) : base_(static_cast<char *>(base)) {}
    template <class T> T *take(size_t count) {
        at_ = (at_ + 255) & ~static_cast<size_t>(255);
        T *p = base_ ? reinterpret_cast<T *>(base_ + at_) : nullptr;
        at_ += count * sizeof(T);
        return p;
    }
    size_t used() const { return (at_ + 255) & ~static_cast<size_t>(255); }

  private:
    char *base_;
    size_t at_ = 0;
};

inline size_t elem_bytes(twDataType_t t) { return t == TW_R_32F ? 4 : 2; }

// ---- value types in kernels ------------------------------------------------------------------

template <class T> struct Value;
template <> struct Value<float> {
    __device__ static float to_float(float v) { return v; }
    __device__ static float from_float(float v) { return v; }
};
template <> struct Value<__nv_bfloat16> {
    __device__ static float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
    __device__ static __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }
};
template <> struct Value<__half> {
    __device__ static float to_float(__half v) { return __half2float(v); }
    __device__ static __half from_float(float v) { return __float2half_rn(v); }
};

/// Rounds an fp32 value to the value type and back (the DEFAULT mode's rounding of g, u, h).
template <class T> __device__ inline float round_to(float v) { return Value<T>::to_float(Value<T>::from_float(v)); }

/// torch.relu keeps values > 0 and NaN; +0 and -0 are inactive.
__device__ inline bool relu_active(float v) { return v > 0.0f || v != v; }

/// Inclusive sum over the lanes of a full warp.
__device__ inline int warp_scan_incl(int v) {
    const int lane = static_cast<int>(threadIdx.x & 31u);
    for (int o = 1; o < 32; o <<= 1) {
        const int n = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += n;
    }
    return v;
}

/// SMs of the current device (132 if the query fails): sizes grids that loop over their work.
inline int sm_count() {
    int sms = 132, dev = 0;
    if (cudaGetDevice(&dev) == cudaSuccess) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    return sms;
}

inline int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

}  // namespace twblas::cuda
