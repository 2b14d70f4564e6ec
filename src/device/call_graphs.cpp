#include "call_graphs.hpp"

#include <algorithm>

#include "common/check.hpp"

namespace twblas::cuda {

CallGraphs::CallGraphs(size_t capacity) : capacity_(capacity) {
    check(cudaStreamCreateWithFlags(&capture_stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
}

CallGraphs::~CallGraphs() {
    // a graph still in flight is freed by the driver once it completes
    for (Entry &e : entries_)
        if (e.exec) cudaGraphExecDestroy(e.exec);
    if (capture_stream_) cudaStreamDestroy(capture_stream_);
}

CallGraphs::Entry *CallGraphs::find(const CallKey &key) {
    for (Entry &e : entries_)
        if (e.key == key) return &e;
    return nullptr;
}

CallGraphs::Entry &CallGraphs::insert(const CallKey &key) {
    if (entries_.size() >= capacity_) {
        auto oldest = std::min_element(entries_.begin(), entries_.end(),
                                       [](const Entry &a, const Entry &b) { return a.last_use < b.last_use; });
        if (oldest->exec) cudaGraphExecDestroy(oldest->exec);
        entries_.erase(oldest);
    }
    entries_.push_back(Entry{key, nullptr, ++clock_});
    return entries_.back();
}

void CallGraphs::begin_capture() {
    check(cudaStreamBeginCapture(capture_stream_, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
}

void CallGraphs::abandon_capture() {
    cudaGraph_t graph = nullptr;
    (void)cudaStreamEndCapture(capture_stream_, &graph);
    if (graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
}

bool CallGraphs::capture_invalidated() const {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    return cudaStreamIsCapturing(capture_stream_, &status) == cudaSuccess && status == cudaStreamCaptureStatusInvalidated;
}

cudaGraphExec_t CallGraphs::end_capture() {
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(capture_stream_, &graph);
    cudaGraphExec_t exec = nullptr;
    const cudaError_t inst = end == cudaSuccess ? cudaGraphInstantiate(&exec, graph, 0) : end;
    if (graph) cudaGraphDestroy(graph);
    if (inst != cudaSuccess) {
        (void)cudaGetLastError();
        return nullptr;
    }
    return exec;
}

void CallGraphs::launch(Entry &e, cudaStream_t stream) {
    e.last_use = ++clock_;
    check(cudaGraphLaunch(e.exec, stream), "cudaGraphLaunch");
}

}  // namespace twblas::cuda
