// Probe: what a setup call's fixed cost is made of. twSpMatValidate of a 4096 x 5632 TwELL took
// 33.6 us of host wall time on an H100 while its kernels ran ~8 us (ncu), and twSparseToDense
// ~27 us over its kernels: the conversions lose to cuSPARSE at small sizes by about that much.
// Each pattern below is timed as the conversions bench times a call (host wall time from before
// the first enqueue to after the stream's synchronisation, median of many), so the parts that a
// call can drop (a launch, a memset, a pageable copy, a pointer query) show as differences.
// Build: nvcc -O3 -std=c++17 -arch=sm_90 readback_probe.cu -o readback_probe
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "probe_common.cuh"

struct Result {
    unsigned long long a[6];
};

__global__ void empty_kernel(Result *r) {
    if (r && threadIdx.x == 1000) r->a[0] = 1;  // never true: keeps the argument live
}
__global__ void reset_kernel(Result *r) { *r = Result{{0, 0, 0, ~0ull, ~0ull, 0}}; }
__global__ void publish_kernel(const Result *r, Result *mapped) { *mapped = *r; }

double median_us(const std::function<void()> &call, cudaStream_t s) {
    for (int i = 0; i < 50; ++i) call();
    CHECK(cudaStreamSynchronize(s));
    std::vector<double> t;
    for (int i = 0; i < 400; ++i) {
        const auto a = std::chrono::steady_clock::now();
        call();
        const auto b = std::chrono::steady_clock::now();
        t.push_back(std::chrono::duration<double, std::micro>(b - a).count());
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

int main() {
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    Result *dev = nullptr, *pinned = nullptr, *mapped_host = nullptr, *mapped_dev = nullptr;
    CHECK(cudaMalloc(&dev, sizeof(Result)));
    CHECK(cudaMallocHost(&pinned, sizeof(Result)));
    CHECK(cudaHostAlloc(reinterpret_cast<void **>(&mapped_host), sizeof(Result), cudaHostAllocMapped));
    CHECK(cudaHostGetDevicePointer(reinterpret_cast<void **>(&mapped_dev), mapped_host, 0));
    void *big = nullptr;
    CHECK(cudaMalloc(&big, 1 << 20));
    Result pageable{};

    struct Pattern {
        const char *name;
        std::function<void()> call;
    };
    const std::vector<Pattern> patterns = {
        {"sync only", [&] { CHECK(cudaStreamSynchronize(s)); }},
        {"1 kernel + sync", [&] {
             empty_kernel<<<1, 32, 0, s>>>(dev);
             CHECK(cudaStreamSynchronize(s));
         }},
        {"1 kernel + pinned copy + sync", [&] {
             empty_kernel<<<1, 32, 0, s>>>(dev);
             CHECK(cudaMemcpyAsync(pinned, dev, sizeof(Result), cudaMemcpyDeviceToHost, s));
             CHECK(cudaStreamSynchronize(s));
         }},
        {"1 kernel + pageable copy + sync", [&] {
             empty_kernel<<<1, 32, 0, s>>>(dev);
             CHECK(cudaMemcpyAsync(&pageable, dev, sizeof(Result), cudaMemcpyDeviceToHost, s));
             CHECK(cudaStreamSynchronize(s));
         }},
        {"1 kernel + publish kernel (mapped) + sync", [&] {
             empty_kernel<<<1, 32, 0, s>>>(dev);
             publish_kernel<<<1, 1, 0, s>>>(dev, mapped_dev);
             CHECK(cudaStreamSynchronize(s));
         }},
        {"2 memsets + 2 kernels + pageable copy + sync (old validate)", [&] {
             CHECK(cudaMemsetAsync(dev, 0, sizeof(Result), s));
             CHECK(cudaMemsetAsync(&dev->a[3], 0xff, 16, s));
             empty_kernel<<<1, 32, 0, s>>>(dev);
             empty_kernel<<<1, 32, 0, s>>>(dev);
             CHECK(cudaMemcpyAsync(&pageable, dev, sizeof(Result), cudaMemcpyDeviceToHost, s));
             CHECK(cudaStreamSynchronize(s));
         }},
        {"reset kernel + 2 kernels + pinned copy + sync (new validate)", [&] {
             reset_kernel<<<1, 1, 0, s>>>(dev);
             empty_kernel<<<1, 32, 0, s>>>(dev);
             empty_kernel<<<1, 32, 0, s>>>(dev);
             CHECK(cudaMemcpyAsync(pinned, dev, sizeof(Result), cudaMemcpyDeviceToHost, s));
             CHECK(cudaStreamSynchronize(s));
         }},
        {"2 cudaPointerGetAttributes", [&] {
             cudaPointerAttributes a{};
             CHECK(cudaPointerGetAttributes(&a, big));
             CHECK(cudaPointerGetAttributes(&a, dev));
         }},
        {"1 kernel (no sync)", [&] { empty_kernel<<<1, 32, 0, s>>>(dev); }},
        {"cudaMemsetAsync (no sync)", [&] { CHECK(cudaMemsetAsync(dev, 0, sizeof(Result), s)); }},
    };
    std::printf("%-64s %10s\n", "pattern (host wall time, median of 400)", "us");
    for (int round = 0; round < 2; ++round)
        for (const auto &p : patterns) {
            CHECK(cudaStreamSynchronize(s));
            std::printf("%-64s %10.2f\n", p.name, median_us(p.call, s));
        }
    return 0;
}
