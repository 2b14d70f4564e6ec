// Probe: eager twSpGEMMFused calls while another thread of the process calls
// cudaDeviceSynchronize in a loop. An FFN captures the kernels of an argument set into a CUDA
// graph the second time it sees it (src/device/call_graphs.hpp), on a private stream; CUDA
// refuses a device synchronisation while any stream of the device is capturing, and the refusal
// spoils the capture. Each argument set (12 outputs Y, more than the 8 graphs an FFN keeps) is
// called twice in a row, so every second call captures. Prints the twblas calls that failed and
// the synchronisations CUDA refused; a backtrace on SIGSEGV (the driver itself was seen to crash
// inside cuCtxSynchronize under this pattern, bench/results/h100-capture-sync-probe-2026-11-26.txt).
// Not a test: the crash is the driver's, and it comes in some runs only.
// Build (from the repository root, after the library):
//   g++ -std=c++17 -O1 -g -rdynamic -Iinclude -Ibuild/include -I/usr/local/cuda/include \
//       bench/probes/capture_sync_probe.cpp -o capture_sync_probe -Lbuild/src -ltwblas \
//       -L/usr/local/cuda/lib64 -lcudart -lpthread
// Run: capture_sync_probe [rounds, default 3] [graphs: 1 default, 0 sets TW_FFN_ATTR_CALL_GRAPHS 0]
#include <cuda_runtime.h>
#include <execinfo.h>
#include <signal.h>
#include <twblas/twblas.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

void print_backtrace(int sig) {
    void *frames[64];
    const int n = backtrace(frames, 64);
    fprintf(stderr, "signal %d, backtrace:\n", sig);
    backtrace_symbols_fd(frames, n, 2);
    _exit(3);
}

twDnMatDescr_t device_matrix(int64_t rows, int64_t cols, const std::vector<uint16_t> *init) {
    void *p = nullptr;
    cudaMalloc(&p, static_cast<size_t>(rows * cols) * 2);
    if (init) cudaMemcpy(p, init->data(), init->size() * 2, cudaMemcpyHostToDevice);
    twDnMatDescr_t d = nullptr;
    twCreateDnMat(&d, rows, cols, cols, p, TW_R_16BF, TW_ORDER_ROW);
    return d;
}

}  // namespace

int main(int argc, char **argv) {
    signal(SIGSEGV, print_backtrace);
    signal(SIGABRT, print_backtrace);
    const int64_t m = 33, d = 72, h = 300;
    const int rounds = argc > 1 ? atoi(argv[1]) : 3;
    const int32_t graphs = argc > 2 ? atoi(argv[2]) : 1;
    std::vector<uint16_t> x(static_cast<size_t>(m * d)), w(static_cast<size_t>(h * d));
    for (size_t i = 0; i < x.size(); ++i) x[i] = i % 7 == 0 ? 0x3f80 : 0;  // bf16 1.0
    for (size_t i = 0; i < w.size(); ++i) w[i] = i % 5 == 0 ? 0x3f80 : (i % 11 == 0 ? 0xbf80 : 0);
    twHandle_t handle = nullptr;
    twCreateWithBackend(&handle, TW_BACKEND_CUDA);
    const twDnMatDescr_t X = device_matrix(m, d, &x);
    twFfnDescr_t ffn = nullptr;
    if (twCreateFfn(handle, &ffn, TW_FFN_GATED_RELU, device_matrix(h, d, &w), device_matrix(h, d, &w),
                    device_matrix(h, d, &w)) != TW_STATUS_SUCCESS) {
        printf("twCreateFfn: %s\n", twGetErrorMessage(handle));
        return 1;
    }
    twFfnSetAttribute(ffn, TW_FFN_ATTR_CALL_GRAPHS, &graphs, sizeof graphs);
    constexpr int kOutputs = 12;
    std::vector<twDnMatDescr_t> Y;
    for (int i = 0; i < kOutputs; ++i) Y.push_back(device_matrix(m, d, nullptr));
    size_t ws_bytes = 0;
    twSpGEMMFused_bufferSize(handle, ffn, X, Y[0], &ws_bytes);
    void *ws = nullptr;
    cudaMalloc(&ws, ws_bytes + 1);

    std::atomic<bool> done{false};
    std::atomic<int> refused{0};
    std::thread syncer([&] {
        while (!done)
            if (cudaDeviceSynchronize() != cudaSuccess) {
                ++refused;
                (void)cudaGetLastError();
            }
    });
    int failed = 0;
    for (int r = 0; r < rounds; ++r)
        for (int i = 0; i < kOutputs; ++i)
            for (int twice = 0; twice < 2; ++twice) {
                const twStatus_t s = twSpGEMMFused(handle, ffn, X, Y[static_cast<size_t>(i)], nullptr, ws);
                if (s != TW_STATUS_SUCCESS) {
                    ++failed;
                    fprintf(stderr, "call failed: %s %s\n", twGetStatusName(s), twGetErrorMessage(handle));
                }
            }
    cudaStreamSynchronize(nullptr);
    done = true;
    syncer.join();
    printf("rounds %d, call graphs %d: %d of %d twblas calls failed, %d device synchronisations refused\n", rounds,
           graphs, failed, rounds * kOutputs * 2, refused.load());
    return failed ? 1 : 0;
}
