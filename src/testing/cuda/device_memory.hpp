// The one owner of device memory for the programs around the library (tests, benchmark, demo):
// cudaMalloc'd bytes, freed once, filled with a garbage pattern (never zeros, which hide
// unwritten outputs), with upload and download helpers. Failures throw std::runtime_error; test
// programs turn that into a failed case. The library itself never uses this: its compute calls
// take memory from the caller's workspace.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace twblas::testing {

inline void cuda_check(cudaError_t e, const char *what) {
    if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

class DeviceMemory {
  public:
    /// `bytes` of device memory (at least 256, so that empty problems still get a valid pointer),
    /// filled with 0xA5 bytes.
    explicit DeviceMemory(size_t bytes) : bytes_(std::max<size_t>(bytes, 256)) {
        cuda_check(cudaMalloc(&ptr_, bytes_), "cudaMalloc");
        cuda_check(cudaMemset(ptr_, 0xA5, bytes_), "cudaMemset");
        settle();
    }
    /// A device copy of `bytes` host bytes.
    DeviceMemory(const void *host, size_t bytes) : DeviceMemory(bytes) { upload(host, bytes); }
    template <class T> explicit DeviceMemory(const std::vector<T> &host) : DeviceMemory(host.data(), host.size() * sizeof(T)) {}
    ~DeviceMemory() { cudaFree(ptr_); }
    DeviceMemory(const DeviceMemory &) = delete;
    DeviceMemory &operator=(const DeviceMemory &) = delete;

    template <class T = void> T *get() const { return static_cast<T *>(ptr_); }
    size_t bytes() const { return bytes_; }

    /// The first `count` values, copied back (synchronous).
    template <class T> std::vector<T> download(size_t count) const {
        std::vector<T> out(count);
        if (count) cuda_check(cudaMemcpy(out.data(), ptr_, count * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy (download)");
        return out;
    }
    /// Copies `bytes` host bytes in (synchronous).
    void upload(const void *host, size_t bytes) {
        if (bytes) cuda_check(cudaMemcpy(ptr_, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy (upload)");
        settle();
    }

  private:
    // cudaMemset and a pageable cudaMemcpy may still be running on the legacy default stream
    // when they return, and a non-blocking stream does not wait for that stream: wait here, so
    // that the fill or the upload cannot land after a kernel on any stream has used the memory.
    static void settle() { cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (DeviceMemory)"); }

    void *ptr_ = nullptr;
    size_t bytes_ = 0;
};

}  // namespace twblas::testing
