// The gate GEMM that packs in its epilogue (Hopper only: TMA, wgmma, warp-specialised persistent
// tiles from CUTLASS 3 collectives, with our own epilogue):
//   z = X Wg^T, each value rounded to the gate type, written at the active units only (ReLU:
//   > 0 or NaN; the other entries keep whatever the buffer held: ~99.5 % of them in a trained
//   FFN); and for each row one 32-bit active-unit word per 32 columns (bit b of word w: column
//   32 w + b is active). Readers take the entries outside the words as +0 (ActiveMask), and
//   lists_from_masks zeroes them in the dense path's rows, which are read whole.
// The words are what the sparse part reads to find a token's units, so no pass reads the dense
// gate output back (the packing pass read all of it: 184 MB at the paper's M = 16384).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "twblas/twblas.h"

namespace twblas::cuda {

struct MaskedGateGemm {
    const void *x;  // M x K, row-major
    int64_t ldx;
    const void *w;  // N x K, row-major (K contiguous)
    int64_t ldw;
    int64_t m, n, k;
    void *gate;  // M x N, row-major, the gate type
    int64_t ldg;
    uint32_t *masks;  // M x words, words >= ceil(N / 32)
    int64_t words;
};

/// Whether this build holds the kernel (it is compiled for sm_90a only).
bool masked_gate_gemm_built();

/// Whether the kernel takes these operands: 16-bit types, row strides, pointers and K on 16 bytes
/// (TMA), sizes below 2^31.
bool masked_gate_gemm_fits(twDataType_t type, const MaskedGateGemm &g);

/// Enqueues the GEMM on `stream` (no allocation, no synchronisation; graph capture works), with
/// tiles `tile_n` (256 or 192) columns wide. The device must be sm_90 and the operands must fit.
void launch_masked_gate_gemm(cudaStream_t stream, twDataType_t type, const MaskedGateGemm &g, int tile_n, int device,
                             int sm_count);

}  // namespace twblas::cuda
