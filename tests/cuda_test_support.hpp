// Helpers of the CUDA-only cases (test_cuda_backend.cpp, test_cuda_training.cpp): CUDA runtime
// checks and graph capture. Device memory is Buffers' (backend_support.hpp), which keeps it in
// src/testing/cuda/device_memory.hpp. (Without a usable GPU the CUDA programs never run a case:
// their main(), cuda_test_main.cpp, exits with CTest's skip code.)
#pragma once

#include <cuda_runtime.h>

#include <functional>

#include "backend_support.hpp"
#include "test_support.hpp"

namespace twtest {

inline void cuda_ok(cudaError_t e) {
    INFO(cudaGetErrorString(e));
    REQUIRE(e == cudaSuccess);
}

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

/// The replay of FfnRun / TrainRun: the steps captured into a CUDA graph and replayed.
inline void graph_replay(twHandle_t h, int repeats, const std::function<twStatus_t()> &step) {
    replay_captured(h, repeats, step);
}

}  // namespace twtest
