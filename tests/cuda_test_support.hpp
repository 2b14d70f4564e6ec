// Helpers of the CUDA test programs: device memory with host mirrors, dense matrices mirrored on
// the device, graph capture. (Without a usable GPU the programs never run a case: their main(),
// cuda_test_main.cpp, exits with CTest's skip code.)
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "test_support.hpp"

namespace twtest {

inline void cuda_ok(cudaError_t e) {
    INFO(cudaGetErrorString(e));
    REQUIRE(e == cudaSuccess);
}

/// Device memory with a host mirror of the same bytes.
struct DeviceCopy {
    void *ptr = nullptr;
    size_t bytes = 0;
    explicit DeviceCopy(size_t n) : bytes(std::max<size_t>(n, 1)) {
        cuda_ok(cudaMalloc(&ptr, bytes));
        cuda_ok(cudaMemset(ptr, 0xA5, bytes));  // garbage, never zeros
    }
    DeviceCopy(const void *host, size_t n) : DeviceCopy(n) { cuda_ok(cudaMemcpy(ptr, host, n, cudaMemcpyHostToDevice)); }
    ~DeviceCopy() { cudaFree(ptr); }
    DeviceCopy(const DeviceCopy &) = delete;
    DeviceCopy &operator=(const DeviceCopy &) = delete;
    template <class T> std::vector<T> download(size_t count) const {
        std::vector<T> out(count);
        cuda_ok(cudaMemcpy(out.data(), ptr, count * sizeof(T), cudaMemcpyDeviceToHost));
        return out;
    }
};

/// A Dense (host storage + descriptor) mirrored on the device with its own descriptor.
struct DeviceDense {
    Dense &host;
    DeviceCopy mem;
    twDnMatDescr_t d = nullptr;
    explicit DeviceDense(Dense &h) : host(h), mem(h.storage.data(), h.storage.size() * 4) {
        REQUIRE(twCreateDnMat(&d, h.rows, h.cols, h.ld, mem.ptr, h.type, h.order) == TW_STATUS_SUCCESS);
    }
    ~DeviceDense() { twDestroyDnMat(d); }
    operator twDnMatDescr_t() const { return d; }
    /// Copies the device values back into the host Dense.
    void fetch() { cuda_ok(cudaMemcpy(host.storage.data(), mem.ptr, host.storage.size() * 4, cudaMemcpyDeviceToHost)); }
};

/// Captures `call` (the twblas calls of one step, returning a status) on a new stream into a CUDA
/// graph and replays it `repeats` times; the handle is back on the default stream afterwards.
template <class F> void replay_captured(twHandle_t h, int repeats, F &&call) {
    cudaStream_t stream;
    cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    TW_REQUIRE_OK(h, twSetStream(h, stream));
    cudaGraph_t graph;
    cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    const twStatus_t st = call();
    cuda_ok(cudaStreamEndCapture(stream, &graph));
    INFO(twGetErrorMessage(h));
    REQUIRE(st == TW_STATUS_SUCCESS);
    cudaGraphExec_t exec;
    cuda_ok(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < repeats; ++i) cuda_ok(cudaGraphLaunch(exec, stream));
    cuda_ok(cudaStreamSynchronize(stream));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    TW_REQUIRE_OK(h, twSetStream(h, nullptr));
    cudaStreamDestroy(stream);
}

}  // namespace twtest
