// The CUDA backend (sm_90a): maps each Backend method onto one operation of src/device.
// Compute calls (GemmToSparse, SpMM, the fused FFN) run as kernels on the handle's stream with
// scratch from the caller's workspace: no allocation, no synchronisation, capturable in CUDA
// graphs. Calls whose contract returns a result to the host (info, validation, conversions that
// report CAPACITY_EXCEEDED, statistics) run on the device too and synchronise the handle's stream
// to read back the few bytes that decide it (container_ops.hpp).
#include <cuda_runtime.h>

#include <cstdio>

#include "common/device_info.hpp"
#include "common/pointer_check.hpp"
#include "gemm/masked_gate_gemm.hpp"
#include "container_ops.hpp"
#include "ffn_backward.hpp"
#include "ffn_forward.hpp"
#include "ffn_state.hpp"
#include "host/backend.hpp"
#include "sparse_ops.hpp"

namespace twblas {

namespace {

/// The current device's name and compute capability, or major = -1 when no GPU answers.
struct DeviceArch {
    int major = -1, minor = 0;
    char name[256] = "";
};
DeviceArch current_device() {
    DeviceArch a;
    int count = 0, device = 0;
    cudaDeviceProp prop{};
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0 || cudaGetDevice(&device) != cudaSuccess ||
        cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
        (void)cudaGetLastError();  // clear the error of a machine without a driver
        return a;
    }
    a.major = prop.major;
    a.minor = prop.minor;
    std::snprintf(a.name, sizeof a.name, "%s", prop.name);
    return a;
}

/// Whether this binary holds code the current device can run: asks the runtime for a kernel's
/// attributes, which fails (no kernel image) on a GPU the build has no SASS or PTX for, such as
/// an sm_90a-only build on an A100 or a Blackwell GPU.
__global__ void arch_probe() {}
bool binary_runs_on_device() {
    cudaFuncAttributes attr{};
    if (cudaFuncGetAttributes(&attr, arch_probe) == cudaSuccess) return true;
    (void)cudaGetLastError();
    return false;
}
/// The PTX version of the code the runtime runs on this device (80 for a compute_80 build JIT-
/// compiled on an H100), 0 when there is none. Every kernel but the sm_90a ones is built alike.
int device_code_ptx_version() {
    cudaFuncAttributes attr{};
    if (cudaFuncGetAttributes(&attr, arch_probe) == cudaSuccess) return attr.ptxVersion;
    (void)cudaGetLastError();
    return 0;
}

#if !defined(TWBLAS_CUDA_ARCHITECTURES)
#define TWBLAS_CUDA_ARCHITECTURES "(not recorded)"
#endif
/// The oldest GPUs the kernels are written for: Ampere's cp.async, bf16 tensor cores.
constexpr int kMinMajor = 8;

}  // namespace

namespace cuda {
DeviceInfo current_device_info() {
    DeviceInfo info;
    int major = 0;
    if (cudaGetDevice(&info.device) == cudaSuccess) {
        cudaDeviceGetAttribute(&info.sm_count, cudaDevAttrMultiProcessorCount, info.device);
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, info.device);
        cudaDeviceGetAttribute(&info.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, info.device);
    }
    info.masked_gate = masked_gate_gemm_built() && major == 9;
    info.pdl = major >= 9 && device_code_ptx_version() >= 90;
    return info;
}
}  // namespace cuda

namespace {

class CudaBackend final : public Backend {
  public:
    explicit CudaBackend(void *const *stream_slot)
        : stream_slot_(stream_slot), device_(cuda::current_device_info()) {}
    twBackend_t kind() const override { return TW_BACKEND_CUDA; }
    void require_accessible(const void *p, const char *name) const override { cuda::require_device_accessible(p, name); }

    // ---- inspection and conversions (setup calls: they read back the bytes that decide their status)
    twSpMatInfo_t sparse_info(const twSpMatDescr &s) override { return containers_.info(stream(), s); }
    void sparse_validate(const twSpMatDescr &s) override { containers_.validate(stream(), s, "descr"); }
    size_t dense_to_sparse_workspace(const twDnMatDescr &, const twSpMatDescr &out) override {
        return cuda::sparse_writer_workspace(out);
    }
    twStatus_t dense_to_sparse_analysis(const twDnMatDescr &in, const twSpMatDescr &out, twConvertOp_t op,
                                        void *) override {
        return containers_.dense_to_sparse_analysis(stream(), in, out, op);
    }
    twStatus_t dense_to_sparse_convert(const twDnMatDescr &in, const twSpMatDescr &out, twConvertOp_t op,
                                       void *workspace) override {
        return containers_.dense_to_sparse_convert(stream(), in, out, op, workspace);
    }
    twStatus_t sparse_to_dense(const twSpMatDescr &in, const twDnMatDescr &out) override {
        return containers_.sparse_to_dense(stream(), in, out);
    }
    twStatus_t sparse_convert(const twSpMatDescr &in, const twSpMatDescr &out) override {
        return containers_.sparse_convert(stream(), in, out);
    }
    twStatus_t sparse_transpose(const twSpMatDescr &in, const twSpMatDescr &out) override {
        return containers_.sparse_transpose(stream(), in, out);
    }

    // ---- building blocks (compute calls)
    size_t gemm_to_sparse_workspace(const twDnMatDescr &a, const twDnMatDescr &b, const twSpMatDescr &c) override {
        return cuda::gemm_to_sparse_workspace(a, b, c);
    }
    void gemm_to_sparse(float alpha, const twDnMatDescr &a, const twDnMatDescr &b, const twSpMatDescr &c,
                        twConvertOp_t act, void *workspace) override {
        cuda::gemm_to_sparse(stream(), gemm_, device_, alpha, a, b, c, act, workspace);
    }
    size_t spmm_workspace(const twSpMatDescr &, const twDnMatDescr &, const twDnMatDescr &) override { return 0; }
    twStatus_t spmm(float alpha, const twSpMatDescr &s, const twDnMatDescr &w, float beta, const twDnMatDescr &y,
                    void *) override {
        // rows of S that a producer could not hold completely come out as NaN; their count is
        // in twSpMatGetInfo(S).overflowRows (a compute call cannot return it without a sync)
        cuda::spmm(stream(), alpha, s, cuda::matrix_arg(w), beta, cuda::matrix_arg(y));
        return TW_STATUS_SUCCESS;
    }

    // ---- fused feed-forward
    std::unique_ptr<FfnState> ffn_create(const twFfnDescr &ffn, const twDnMatDescr *wg, const twDnMatDescr &wu,
                                         const twDnMatDescr &wd) override {
        std::unique_ptr<cuda::CudaFfnState> st = cuda::make_ffn_state(ffn, device_, stream());
        cuda::ffn_place_weights(stream(), *st, cuda::problem_of(ffn, 0), wg, wu, wd, /*wait=*/true);
        return st;
    }
    void ffn_update_weights(twFfnDescr &ffn, const twDnMatDescr *wg, const twDnMatDescr &wu,
                            const twDnMatDescr &wd) override {
        // stream-ordered: a training loop refreshes every layer each step, and a wait per layer
        // drained the GPU's queue each time
        cuda::ffn_place_weights(stream(), cuda::state_of(ffn), cuda::problem_of(ffn, 0), wg, wu, wd, /*wait=*/false);
    }
    bool ffn_fp8_weights() const override { return true; }
    size_t ffn_forward_workspace(const twFfnDescr &ffn, int64_t tokens) override {
        size_t bytes = 0;
        cuda::carve_ffn_scratch(nullptr, cuda::problem_of(ffn, tokens), &bytes);
        return bytes;
    }
    void ffn_forward(twFfnDescr &ffn, const twDnMatDescr &x, const twDnMatDescr &y, const twSpMatDescr *hidden,
                     void *workspace) override {
        cuda::ffn_forward(stream(), ffn, x, y, hidden, workspace);
    }
    twFfnStats_t ffn_stats(const twFfnDescr &ffn) override {
        return cuda::read_ffn_stats(stream(), cuda::state_of(ffn));
    }
    void ffn_write_l1(const twFfnDescr &ffn, float *dst) override { cuda::write_forward_l1(stream(), ffn, dst); }
    void ffn_neuron_counts(const twFfnDescr &ffn, int64_t *counts) override {
        const cuda::CudaFfnState &st = cuda::state_of(ffn);
        cuda::check(cudaMemcpyAsync(counts, st.counts.get(), st.counts.bytes(), cudaMemcpyDeviceToDevice, stream()),
                    "cudaMemcpyAsync");
    }
    void ffn_reset_neuron_counts(twFfnDescr &ffn) override {
        cuda::CudaFfnState &st = cuda::state_of(ffn);
        cuda::check(cudaMemsetAsync(st.counts.get(), 0, st.counts.bytes(), stream()), "cudaMemsetAsync");
    }

    // ---- training
    void fill_zero(const twDnMatDescr &m) override {  // the weight gradients of an M = 0 backward
        if (m.empty()) return;
        cuda::require_device_accessible(m.values, "dW");
        const size_t e = cuda::elem_bytes(m.type);
        const bool row = m.order == TW_ORDER_ROW;
        cuda::check(cudaMemset2DAsync(m.values, static_cast<size_t>(m.ld) * e, 0,
                                      static_cast<size_t>(row ? m.cols : m.rows) * e,
                                      static_cast<size_t>(row ? m.rows : m.cols), stream()),
                    "cudaMemset2DAsync");
    }
    size_t ffn_saved_bytes(const twFfnDescr &ffn, int64_t tokens) override {
        return cuda::saved_layout(cuda::saved_size_problem(ffn, tokens)).total;
    }
    size_t ffn_saved_extent(const twFfnDescr &ffn, int64_t tokens, const void *saved, bool backward) override {
        return cuda::saved_extent(ffn, tokens, saved, backward);
    }
    void ffn_forward_train(twFfnDescr &ffn, const twDnMatDescr &x, const twDnMatDescr &y, void *saved,
                           void *workspace) override {
        cuda::training_problem_of(ffn, x.rows);  // the token limit
        cuda::ffn_forward_train(stream(), ffn, x, y, saved, workspace);
    }
    size_t ffn_backward_workspace(const twFfnDescr &ffn, int64_t tokens) override {
        size_t bytes = 0;
        cuda::carve_train_scratch(nullptr, cuda::training_problem_of(ffn, tokens), &bytes);
        return bytes;
    }
    void ffn_backward(twFfnDescr &ffn, const twDnMatDescr &x, const void *saved, const twDnMatDescr &dy, L1Coefficient l1,
                      const twDnMatDescr &dx, const twDnMatDescr *dwg, const twDnMatDescr &dwu, const twDnMatDescr &dwd,
                      void *workspace) override {
        cuda::training_problem_of(ffn, x.rows);
        cuda::ffn_backward(stream(), ffn, x, saved, dy, l1, dx, dwg, dwu, dwd, workspace);
    }

  private:
    cudaStream_t stream() const { return static_cast<cudaStream_t>(*stream_slot_); }

    void *const *stream_slot_;
    cuda::DeviceInfo device_;
    cuda::ContainerOps containers_{device_};
    cuda::GemmRunner gemm_;  // the building blocks' cuBLASLt plans
};

}  // namespace

bool cuda_backend_usable() { return current_device().major >= kMinMajor && binary_runs_on_device(); }

std::unique_ptr<Backend> make_cuda_backend(void *const *stream_slot) {
    const DeviceArch dev = current_device();
    if (dev.major < 0) fail(TW_STATUS_NOT_SUPPORTED, "backend: no usable GPU found by the CUDA runtime");
    // the kernels need sm_80 features; and the binary must hold code (SASS or PTX) for this GPU
    if (dev.major < kMinMajor)
        fail(TW_STATUS_ARCH_MISMATCH, "backend: the CUDA backend needs compute capability 8.0 or newer; the GPU is %s (%d.%d)",
             dev.name, dev.major, dev.minor);
    if (!binary_runs_on_device())
        fail(TW_STATUS_ARCH_MISMATCH,
             "backend: this libtwblas holds CUDA code for the architectures %s, none of which runs on %s (compute "
             "capability %d.%d); rebuild with CMAKE_CUDA_ARCHITECTURES naming it",
             TWBLAS_CUDA_ARCHITECTURES, dev.name, dev.major, dev.minor);
    return std::make_unique<CudaBackend>(stream_slot);
}

}  // namespace twblas
