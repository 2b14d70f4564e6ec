// The gathered GEMM (gathered_gemm.hpp): kernels, epilogues and the launcher, instantiated once
// for each value type.
#include "gemm/gathered_gemm.hpp"

#include <mma.h>

#include <algorithm>

#include <type_traits>

#include "common/check.hpp"
#include "common/dependent_launch.cuh"
#include "common/dispatch.hpp"
#include "common/values.cuh"
#include "kernels/ffn_math.cuh"

namespace twblas::cuda {

namespace {

constexpr int kGm = 64, kGn = 128, kGk = 32;

template <class T> __device__ inline float dev_a(const GatheredGemm &g, int64_t ai, int64_t k) {
    const bool second = k >= g.ksplit;
    const float v = gate_value<T>(second ? g.a2 : g.a, ai * g.a_ri + (second ? k - g.ksplit : k) * g.a_ck, g.a_f32);
    return g.relu_a && !relu_active(v) ? 0.0f : v;
}
template <class T> __device__ inline float dev_b(const GatheredGemm &g, int64_t bk, int64_t k, int64_t j) {
    const bool second = k >= g.ksplit;
    const int64_t kk = second ? k - g.ksplit : k;
    const int64_t r = g.b_rows ? bk : kk;
    return gate_value<T>(second ? g.b2 : g.b, r * (second ? g.b2_rk : g.b_rk) + j * g.b_cj, g.b_f32);
}

template <class T> __device__ inline void dev_epilogue(const GatheredGemm &g, int64_t i, int64_t j, float v) {
    if (j >= g.n) return;
    switch (g.epi) {
        case GatherEpilogue::StoreGate: gate_store<T>(g.c, i * g.c_rs + j, g.c_f32, g.highest ? v : round_to<T>(v)); break;
        case GatherEpilogue::GateProduct: {
            const int64_t at = g.c_rows[i] * g.c_rs + j;
            const float gv = gate_value<T>(g.c, at, g.c_f32);
            float h = 0.0f;
            if (relu_active(gv)) {
                const float u = g.highest ? v : round_to<T>(v);
                h = g.highest ? gv * u : round_to<T>(gv * u);
            }
            gate_store<T>(g.c, at, g.c_f32, h);
            break;
        }
        case GatherEpilogue::BackwardGrad: {
            const int64_t at = i * g.ldr + j;
            const float z = gate_value<T>(g.rz, at, g.c_f32);
            UnitGrad ug{0.0f, 0.0f, 0.0f};
            if (relu_active(z)) {
                const float u = g.gated ? gate_value<T>(g.ru, at, g.c_f32) : 0.0f;
                ug = unit_grad<T>(z, u, v, g.gated, g.highest, g.l1_scale.get());
            }
            gate_store<T>(g.rz, at, g.c_f32, ug.dz);
            if (g.gated) gate_store<T>(g.ru, at, g.c_f32, ug.du);
            gate_store<T>(g.rh, at, g.c_f32, ug.h);
            break;
        }
        case GatherEpilogue::ScatterRows: store_elem(static_cast<T *>(g.c), g.c_rows[i] * g.c_rs + j * g.c_cs, v); break;
        case GatherEpilogue::StoreF32: static_cast<float *>(g.c)[i * g.c_rs + j] = v; break;
        case GatherEpilogue::AccumF32: static_cast<float *>(g.c)[i * g.c_rs + j] += v; break;
    }
}

struct GatherRange {
    int64_t m_beg, m_end, k_beg, k_end;
};
__device__ inline GatherRange dev_range(const GatheredGemm &g) {
    const int64_t cnt = *g.dev_count;
    GatherRange r{0, g.m, 0, g.k};
    if (g.m_dev) r.m_beg = g.first, r.m_end = min(cnt, g.m);
    if (g.k_dev) r.k_beg = g.first, r.k_end = min(cnt, g.k);
    return r;
}

/// Fills the A tile (kGm x kGk) and B tile (kGk x kGn) in shared memory through `put`, with
/// consecutive threads on the operand's contiguous dimension.
template <class T, class PutA, class PutB>
__device__ inline void dev_fill(const GatheredGemm &g, const GatherRange &r, int64_t m0, int64_t n0, int64_t k0,
                                const int64_t *arow, const int64_t *brow, PutA &&put_a, PutB &&put_b, bool fill_b = true) {
    const int tid = threadIdx.x;
    const bool a_k_fast = g.a_ck == 1;
    for (int e = tid; e < kGm * kGk; e += 256) {
        const int ri = a_k_fast ? e / kGk : e % kGm, kk = a_k_fast ? e % kGk : e / kGm;
        const int64_t k = k0 + kk;
        float v = 0.0f;
        if (arow[ri] >= 0 && k < r.k_end) v = dev_a<T>(g, arow[ri], k);
        put_a(ri, kk, v);
    }
    if (!fill_b) return;
    const bool b_k_fast = g.b_cj != 1;
    for (int e = tid; e < kGk * kGn; e += 256) {
        const int jj = b_k_fast ? e / kGk : e % kGn, kk = b_k_fast ? e % kGk : e / kGn;
        const int64_t k = k0 + kk, j = n0 + jj;
        float v = 0.0f;
        if (k < r.k_end && j < g.n && brow[kk] >= -1) v = dev_b<T>(g, brow[kk], k, j);
        put_b(kk, jj, v);
    }
    (void)m0;
}

template <class T>
__device__ inline void dev_rows(const GatheredGemm &g, const GatherRange &r, int64_t m0, int64_t k0, int64_t *arow, int64_t *brow,
                                bool a_part) {
    const int tid = threadIdx.x;
    if (a_part && tid < kGm) {
        const int64_t i = m0 + tid;
        arow[tid] = i < r.m_end ? (g.a_rows ? g.a_rows[i] : i) : -1;
    }
    if (!a_part && tid < kGk) {
        const int64_t k = k0 + tid;
        brow[tid] = k < r.k_end ? (g.b_rows ? g.b_rows[k] : k) : -2;
    }
}

/// Tensor-core version (16-bit data): wmma 16x16x16 with fp32 accumulation, 8 warps of 32 x 32.
template <class T> __global__ void __launch_bounds__(256) gathered_gemm_tc(GatheredGemm g) {
    using namespace nvcuda;
    constexpr int kLd = kGk + 8;
    constexpr size_t kAB = (kGm + kGn) * kLd * sizeof(T), kC = kGm * (kGn + 4) * sizeof(float);
    __shared__ __align__(32) unsigned char raw[kAB > kC ? kAB : kC];
    __shared__ int64_t arow[kGm], brow[kGk];
    T(*sa)[kLd] = reinterpret_cast<T(*)[kLd]>(raw);
    T(*sb)[kLd] = reinterpret_cast<T(*)[kLd]>(raw + kGm * kLd * sizeof(T));  // [j][k]: B col-major
    float(*sc)[kGn + 4] = reinterpret_cast<float(*)[kGn + 4]>(raw);
    wait_for_prior_grid();  // launch_dependent
    allow_dependent_launch();
    const GatherRange r = dev_range(g);
    if (r.k_end <= r.k_beg && g.k_dev) return;
    const int tid = threadIdx.x, warp = tid / 32, wm = warp / 4, wn = warp % 4;
    const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kGn;
    for (int64_t m0 = r.m_beg + static_cast<int64_t>(blockIdx.y) * kGm; m0 < r.m_end;
         m0 += static_cast<int64_t>(gridDim.y) * kGm) {
        __syncthreads();
        dev_rows<T>(g, r, m0, 0, arow, brow, true);
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
        for (int i = 0; i < 2; ++i)
            for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
        for (int64_t k0 = r.k_beg; k0 < r.k_end; k0 += kGk) {
            __syncthreads();
            dev_rows<T>(g, r, m0, k0, arow, brow, false);
            __syncthreads();
            dev_fill<T>(
                g, r, m0, n0, k0, arow, brow, [&](int i, int k, float v) { sa[i][k] = Value<T>::from_float(v); },
                [&](int k, int j, float v) { sb[j][k] = Value<T>::from_float(v); }, !g.b_vec);
            if (g.b_vec) {
                // B rows are K-contiguous weights: 16-byte loads (a chunk past the reduction's
                // end element by element, so that nothing beyond it is read)
                const T *b = static_cast<const T *>(g.b);
                for (int e = tid; e < kGn * kGk / 8; e += 256) {
                    const int jj = e / (kGk / 8), kc = (e % (kGk / 8)) * 8;
                    const int64_t j = n0 + jj, k = k0 + kc;
                    uint4 v = make_uint4(0, 0, 0, 0);
                    if (j < g.n && k + 8 <= r.k_end) {
                        v = *reinterpret_cast<const uint4 *>(b + j * g.b_cj + k);
                    } else if (j < g.n && k < r.k_end) {
                        T tmp[8];
                        for (int q = 0; q < 8; ++q) tmp[q] = k + q < r.k_end ? b[j * g.b_cj + k + q] : Value<T>::from_float(0.0f);
                        v = *reinterpret_cast<const uint4 *>(tmp);
                    }
                    *reinterpret_cast<uint4 *>(&sb[jj][kc]) = v;
                }
            }
            __syncthreads();
            for (int kk = 0; kk < kGk; kk += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa[2];
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb[2];
                for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], &sa[wm * 32 + i * 16][kk], kLd);
                for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(fb[j], &sb[wn * 32 + j * 16][kk], kLd);
                for (int i = 0; i < 2; ++i)
                    for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
            }
        }
        __syncthreads();
        for (int i = 0; i < 2; ++i)
            for (int j = 0; j < 2; ++j)
                wmma::store_matrix_sync(&sc[wm * 32 + i * 16][wn * 32 + j * 16], acc[i][j], kGn + 4, wmma::mem_row_major);
        __syncthreads();
        for (int e = tid; e < kGm * kGn; e += 256) {
            const int ri = e / kGn, c = e % kGn;
            if (m0 + ri < r.m_end) dev_epilogue<T>(g, m0 + ri, n0 + c, sc[ri][c]);
        }
    }
}

/// fp32 version (fp32 data or HIGHEST_PRECISION): 4 x 8 outputs per thread.
template <class T> __global__ void __launch_bounds__(256) gathered_gemm_f32(GatheredGemm g) {
    __shared__ float sa[kGk][kGm + 1];
    __shared__ float sb[kGk][kGn + 1];
    __shared__ int64_t arow[kGm], brow[kGk];
    wait_for_prior_grid();  // launch_dependent
    allow_dependent_launch();
    const GatherRange r = dev_range(g);
    if (r.k_end <= r.k_beg && g.k_dev) return;
    const int tid = threadIdx.x, tr = tid / 16, tc = tid % 16;
    const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kGn;
    for (int64_t m0 = r.m_beg + static_cast<int64_t>(blockIdx.y) * kGm; m0 < r.m_end;
         m0 += static_cast<int64_t>(gridDim.y) * kGm) {
        __syncthreads();
        dev_rows<T>(g, r, m0, 0, arow, brow, true);
        float acc[4][8] = {};
        for (int64_t k0 = r.k_beg; k0 < r.k_end; k0 += kGk) {
            __syncthreads();
            dev_rows<T>(g, r, m0, k0, arow, brow, false);
            __syncthreads();
            dev_fill<T>(
                g, r, m0, n0, k0, arow, brow, [&](int i, int k, float v) { sa[k][i] = v; },
                [&](int k, int j, float v) { sb[k][j] = v; });
            __syncthreads();
            for (int kk = 0; kk < kGk; ++kk) {
                float av[4], bv[8];
                for (int i = 0; i < 4; ++i) av[i] = sa[kk][tr * 4 + i];
                for (int j = 0; j < 8; ++j) bv[j] = sb[kk][tc + 16 * j];
                for (int i = 0; i < 4; ++i)
                    for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
            }
        }
        for (int i = 0; i < 4; ++i) {
            const int64_t row = m0 + tr * 4 + i;
            if (row >= r.m_end) continue;
            for (int j = 0; j < 8; ++j) dev_epilogue<T>(g, row, n0 + tc + 16 * j, acc[i][j]);
        }
    }
}

/// Row blocks of a gathered GEMM per column tile: enough blocks for 4 per SM.
int gathered_row_blocks(int64_t max_rows, int64_t column_tiles, int sm_count) {
    const int64_t row_blocks = (max_rows + 63) / 64;
    return static_cast<int>(
        std::max<int64_t>(1, std::min<int64_t>(row_blocks, std::max<int64_t>(1, 4 * sm_count / column_tiles))));
}

}  // namespace

void launch_gathered_gemm(cudaStream_t stream, GatheredGemm g, twDataType_t value_type, bool tensor_cores, int sm_count,
                          bool pdl) {
    if (g.n == 0 || g.m == 0) return;
    const int tiles_n = ceil_div(g.n, kGn);
    const dim3 grid(static_cast<unsigned>(tiles_n),
                    static_cast<unsigned>(gathered_row_blocks(g.m, tiles_n, sm_count)));
    g.b_vec = !g.b_f32 && !g.k_dev && g.b_rk == 1 && !g.b_rows && g.ksplit >= g.k && g.b_cj % 8 == 0 &&
              reinterpret_cast<uintptr_t>(g.b) % 16 == 0;
    by_type(value_type, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (!std::is_same_v<T, float>) {
            if (tensor_cores) {
                launch_dependent(gathered_gemm_tc<T>, grid, dim3(256), 0, stream, pdl, "cudaLaunchKernelEx(gathered_gemm_tc)", g);
                return;
            }
        }
        launch_dependent(gathered_gemm_f32<T>, grid, dim3(256), 0, stream, pdl, "cudaLaunchKernelEx(gathered_gemm_f32)", g);
    });
}

}  // namespace twblas::cuda
