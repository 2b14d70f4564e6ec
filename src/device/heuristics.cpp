#include "heuristics.hpp"

#include <algorithm>

#include "ffn_layout.hpp"

namespace twblas::cuda::heuristics {

bool decode_applies(const FfnProblem &p) {
    return p.m >= 1 && p.m <= kDecodeMaxTokens && !p.gate_f32() && p.dp <= 4096;
}

bool serve_applies(const FfnProblem &p) {
    return p.m >= 1 && p.m <= serve_max_tokens(p.d, p.h) && !p.gate_f32() && p.dp <= max_model_dim(p.type);
}

int64_t serve_max_tokens(int64_t d, int64_t h) {
    return h * d > kServeGateLargeWeights ? std::min(kServeMaxTokens, kServeMaxTokensLarge) : kServeMaxTokens;
}

int64_t masked_gate_min_tokens(int64_t d, int64_t h) {
    return h * d > kServeGateLargeWeights ? std::min(kMaskedGateMinTokens, kServeMaxTokensLarge + 1)
                                          : kMaskedGateMinTokens;
}

int64_t serve_gate_max_tokens(int64_t d, int64_t h) {
    return h * d > kServeGateLargeWeights ? std::min<int64_t>(kServeGateMaxTokens, 8) : kServeGateMaxTokens;
}

bool gathers_pay_in_dense_mode(double mean_active, int64_t tokens, int64_t hidden_dim) {
    return static_cast<double>(tokens) * mean_active <= kDenseModeGatherShare * static_cast<double>(hidden_dim);
}

int serve_token_warps(int64_t tokens, bool writes_h) {
    return tokens >= kServeTokenNarrowMinTokens && !writes_h ? 8 : 16;
}

int serve_token_splits(int64_t tokens, int64_t dp, bool writes_h, int warps) {
    if (writes_h) return 1;
    const int64_t threads = 32 * warps, per_16_warps = 16 / warps;  // 1 or 2
    const int64_t chunks = (dp + 7) / 8, at_least = (chunks + threads - 1) / threads;
    return static_cast<int>(std::max<int64_t>(
        at_least,
        std::min<int64_t>(4 * per_16_warps, kServeTokenBlocks * per_16_warps / std::max<int64_t>(1, tokens))));
}

int masked_gate_tile_n(int64_t m, int64_t n, int sm_count) {
    const int64_t slots = std::max(1, sm_count / 2);  // clusters of two CTAs
    const auto up = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
    const auto waves = [&](int64_t tile_n) { return up(up(m, 256) * up(n, tile_n), slots); };
    // in units of a 256-wide wave's time / 4: a 192-wide wave is 3 of them, plus 5 %
    return waves(192) * 3 * 105 < waves(256) * 4 * 100 ? 192 : 256;
}

bool two_pass_applies(const FfnProblem &p) { return p.m >= kTwoPassMinTokens; }

int fused_splits(int64_t tokens) {
    if (tokens <= 0 || tokens >= kTwoPassMinTokens) return 1;
    return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(32, 512 / tokens)));
}

int64_t max_model_dim(twDataType_t type) {
    const int64_t values_per_chunk = type == TW_R_32F ? 4 : 8;
    return int64_t{kFusedMaxTeamWarps} * kFusedWarpChunks * 32 * values_per_chunk;
}

int32_t dense_path_row_limit(int64_t hidden_dim) {
    return static_cast<int32_t>(std::max<int64_t>(hidden_dim / 32, 64));
}

int64_t dense_path_cublas_rows(double dense_row_fraction, int64_t tokens) {
    if (dense_row_fraction <= 0.0) return 0;
    const double want = 1.25 * dense_row_fraction * static_cast<double>(tokens) + 64.0;
    return std::min<int64_t>(tokens, (static_cast<int64_t>(want) + 63) / 64 * 64);
}

int gathered_row_blocks(int64_t max_rows, int64_t column_tiles, int sm_count) {
    const int64_t row_blocks = (max_rows + 63) / 64;
    return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(row_blocks, std::max<int64_t>(1, 4 * sm_count / column_tiles))));
}

}  // namespace twblas::cuda::heuristics
