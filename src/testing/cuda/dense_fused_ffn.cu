// The dense_fused baseline's host side: support check, weight interleaving, the two launches.
#include "testing/cuda/dense_fused_ffn.hpp"

#include <stdexcept>

#include "testing/cuda/gate_up_relu_gemm.hpp"

namespace twblas::testing {

std::string dense_fused_unsupported(int64_t model_dim, int64_t hidden_dim) {
#if !defined(TWBLAS_TESTING_HAVE_SM90A)
    (void)model_dim, (void)hidden_dim;
    return "needs sm_90a code, which this build does not hold (TWBLAS_HOPPER_KERNELS=OFF)";
#else
    int device = 0, major = 0, minor = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
        cudaGetLastError();
        return "finds no usable GPU";
    }
    // sm_90a code (wgmma, TMA multicast) runs on compute capability 9.0 alone
    if (major != 9 || minor != 0)
        return "needs an sm_90a GPU (compute capability 9.0), this one is " + std::to_string(major) + "." +
               std::to_string(minor);
    // TMA: rows on 16 bytes; the epilogue: whole blocks of 8 units
    if (model_dim % 8 != 0 || hidden_dim % 8 != 0) return "needs D and H multiples of 8";
    if (model_dim <= 0 || hidden_dim <= 0 || 2 * hidden_dim >= (int64_t{1} << 31) || model_dim >= (int64_t{1} << 31))
        return "needs 0 < D, 2H < 2^31";
    return {};
#endif
}

void interleave_gate_up(cudaStream_t stream, const void *gate_up, int64_t hidden_dim, int64_t model_dim, void *out) {
    if (hidden_dim % 8 != 0) throw std::runtime_error("interleave_gate_up: H must be a multiple of 8");
    // blocks of 8 rows: Wg's into the even blocks of 8, Wu's into the odd ones
    const size_t block = static_cast<size_t>(8 * model_dim) * 2;  // bytes
    const auto *src = static_cast<const char *>(gate_up);
    auto *dst = static_cast<char *>(out);
    const size_t blocks = static_cast<size_t>(hidden_dim / 8), half = blocks * block;
    cuda_check(cudaMemcpy2DAsync(dst, 2 * block, src, block, block, blocks, cudaMemcpyDeviceToDevice, stream),
               "interleave_gate_up (Wg)");
    cuda_check(cudaMemcpy2DAsync(dst + block, 2 * block, src + half, block, block, blocks, cudaMemcpyDeviceToDevice,
                                 stream),
               "interleave_gate_up (Wu)");
}

DenseFusedFfn::DenseFusedFfn(const DenseFfnShape &shape, FusedTile tile)
    : shape_(shape),
      tile_(tile),
      workspace_(LtGemm::kWorkspaceBytes),
      hidden_(static_cast<size_t>(shape.max_tokens * shape.hidden_dim) * 2) {
    if (!shape.gated || shape.training)
        throw std::runtime_error("DenseFusedFfn: the gated FFN's forward only (no plain ReLU, no training)");
    const std::string why = dense_fused_unsupported(shape.model_dim, shape.hidden_dim);
    if (!why.empty()) throw std::runtime_error("DenseFusedFfn " + why);
    cuda_check(cudaGetDevice(&device_), "cudaGetDevice");
    cuda_check(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device_), "SM count");
}

void DenseFusedFfn::compute_hidden(cudaStream_t stream, const void *x, const void *gate_up_interleaved, int64_t m) {
    if (m > shape_.max_tokens) throw std::runtime_error("DenseFusedFfn: more tokens than max_tokens");
    if (m <= 0) return;
    const int64_t d = shape_.model_dim, h = shape_.hidden_dim;
#if defined(TWBLAS_TESTING_HAVE_SM90A)
    const fused::GateUpRelu g{x, d, gate_up_interleaved, d, m, h, d, hidden_.get(), h};
    (wide_tiles(m) ? fused::launch_wide : fused::launch_narrow)(stream, g, device_, sm_count_);
    cuda_check(cudaGetLastError(), "fused gate+up GEMM launch");
#else
    (void)stream, (void)x, (void)gate_up_interleaved, (void)d, (void)h;
    throw std::runtime_error("DenseFusedFfn: this build holds no sm_90a code");
#endif
}

void DenseFusedFfn::forward(cudaStream_t stream, const void *x, const DenseFusedWeights &w, int64_t m, void *y) {
    compute_hidden(stream, x, w.gate_up_interleaved, m);
    const int64_t d = shape_.model_dim, h = shape_.hidden_dim;
    gemm_.run(stream, {hidden_.get(), m, h, h}, {w.down, d, h, h}, GemmOutput{y, d}, workspace_.get(),
              workspace_.bytes());
}

}  // namespace twblas::testing
