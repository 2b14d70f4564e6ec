// The decode path (1 to 4 tokens, 16-bit DEFAULT): one kernel does the gate, the unit choice and
// the up and down projections, a block per 8 units; decode_reduce sums the blocks' partial rows
// per token in block order (kernels/decode.cuh).
#include "launch/launch.hpp"

#include <type_traits>

#include "common/check.hpp"
#include "common/dispatch.hpp"
#include "kernels/decode.cuh"

namespace twblas::cuda {

namespace {

template <class T>
void launch_decode_t(cudaStream_t stream, const FfnCall &c, bool write_h) {
    const FfnProblem &p = c.p;
    const FfnScratch &s = c.s;
    const FfnWeights &w = c.w;
    const MatrixArg &x = c.xa, &y = c.ya;
    const int blocks = ceil_div(p.h, kDecodeUnitsPerBlock);
    const int nt = ceil_div(p.h, p.tile);
    // the header and the counters after it (ffn_layout: one memset, one graph node fewer)
    check(cudaMemsetAsync(s.header, 0, static_cast<size_t>(2 + p.m * (2 + nt)) * 4, stream), "cudaMemsetAsync");
    DecodeArgs<T> a{static_cast<const T *>(x.ptr), x.rs, x.cs, rows_vectorizable(x, p.d), static_cast<int>(p.m), p.d,
                    p.dp, p.h, static_cast<const T *>(w.gate), w.gate_ld, static_cast<const T *>(w.up), w.up_ld,
                    static_cast<const T *>(w.down), w.down_ld, p.gated, p.highest, false, write_h, s.gate, s.ldg, p.tile, nt, s.dec_zero, s.dec_zero + 2 * p.m,
                    s.dec_zero + p.m, s.dec_list, blocks, s.dec_partial,
                    s.dec_partial + static_cast<int64_t>(blocks) * p.m * p.dp, c.st.neuron_counts()};
    // x of every token in shared memory: at most 4 x 4096 x 2 bytes (kDecodeMaxTokens,
    // kDecodeMaxModelDim), under 48 KB
    const size_t xs_bytes = static_cast<size_t>(p.m * p.dp) * sizeof(T);
    // rows of up to 2048 values need 8 chunks per lane (64 registers), wider ones 16
    if (p.dp <= 2048)
        decode_ffn<T, 8><<<blocks, 32 * kDecodeUnitsPerBlock, xs_bytes, stream>>>(a);
    else
        decode_ffn<T, 16><<<blocks, 32 * kDecodeUnitsPerBlock, xs_bytes, stream>>>(a);
    check_launch("decode_ffn");
    const dim3 rgrid(static_cast<unsigned>(p.m), static_cast<unsigned>(ceil_div(p.d, 256)));
    decode_reduce<T><<<rgrid, 256, static_cast<size_t>(a.nblk) * 4, stream>>>(a, static_cast<T *>(y.ptr), y.rs, y.cs,
                                                                                p.slots, s.count, s.row_nnz, s.row_l1);
    check_launch("decode_reduce");
}

}  // namespace

void launch_decode(cudaStream_t stream, const FfnCall &c, bool write_h) {
    by_type(c.p.type, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (std::is_same_v<T, float>)
            fail(TW_STATUS_INTERNAL_ERROR, "the decode path runs 16-bit FFNs");
        else
            launch_decode_t<T>(stream, c, write_h);
    });
}

}  // namespace twblas::cuda
