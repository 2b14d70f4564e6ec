// What the gate GEMM probes that link the library's kernel headers share on the host
// (serving_gate_probe.cu, twell_epilogue_probe.cu): the library's fail() (its headers call it;
// here it ends the probe; defined here, so one translation unit a probe), bf16 bit patterns, the
// inputs that leave ~0.5 % of the gate active, the device setup and the timing loop.
#pragma once

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "twblas/twblas.h"

namespace twblas {
[[noreturn]] void fail(twStatus_t s, const char *fmt, ...) {
    va_list a;
    va_start(a, fmt);
    vfprintf(stderr, fmt, a);
    va_end(a);
    fprintf(stderr, " (%d)\n", static_cast<int>(s));
    std::exit(1);
}
}  // namespace twblas

namespace gate_probe {

inline float bf16_to_float(uint16_t b) {
    const uint32_t u = static_cast<uint32_t>(b) << 16;
    float v;
    std::memcpy(&v, &u, 4);
    return v;
}

/// The bf16 pattern of f (truncated: exact for the values the probes pass).
inline uint16_t bf16_of(float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return static_cast<uint16_t>(b >> 16);
}

/// rows x k uniform values in [-0.5, 0.5) from `seed`, column 0 set to `bias`: x with bias 1 and
/// w with bias -9.75 (at K = 2048; scaled with sqrt(K) elsewhere) leave ~0.5 % of X W^T positive.
inline std::vector<uint16_t> random_bf16(int64_t rows, int64_t k, uint32_t seed, uint16_t bias) {
    std::vector<uint16_t> h(static_cast<size_t>(rows * k));
    uint32_t s = seed;
    for (auto &v : h) {
        s = s * 1664525u + 1013904223u;
        v = bf16_of((s >> 8) / 16777216.0f - 0.5f);
    }
    for (int64_t r = 0; r < rows; ++r) h[static_cast<size_t>(r * k)] = bias;
    return h;
}

/// The GPU, a stream and a cuBLAS handle on it.
struct ProbeDevice {
    int sms;
    cudaStream_t stream;
    cublasHandle_t cublas;
};
inline ProbeDevice open_probe_device() {
    ProbeDevice d{};
    cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, 0);
    cudaStreamCreate(&d.stream);
    cublasCreate(&d.cublas);
    cublasSetStream(d.cublas, d.stream);
    return d;
}

/// Microseconds a launch: launch(0) once to warm up, then launch(0 .. n - 1) back to back
/// between two events on `st` (the index picks rotated inputs where a probe has them).
template <class F>
float time_us(cudaStream_t st, F &&launch, int n = 10) {
    launch(0);
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    cudaEventRecord(a, st);
    for (int i = 0; i < n; ++i) launch(i);
    cudaEventRecord(b, st);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return ms * 1000 / n;
}

}  // namespace gate_probe
