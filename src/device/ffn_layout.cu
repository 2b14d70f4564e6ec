// Layouts of the forward's scratch, the saved state and the backward's scratch (ffn_layout.hpp).
// A .cu file because the backward's sort space is sized by CUB.
#include "ffn_layout.hpp"

#include <cub/device/device_radix_sort.cuh>

#include <algorithm>

#include "common/check.hpp"
#include "common/workspace.hpp"
#include "gemm/lt_gemm.hpp"
#include "plan/forward_plan.hpp"

namespace twblas::cuda {

int32_t ffn_list_width(const FfnProblem &p) {
    // a row that fits every TwELL tile has at most tiles x slots active units
    const int64_t tiles = (p.h + p.tile - 1) / p.tile;
    return static_cast<int32_t>(std::min<int64_t>(tiles * p.slots, p.h));
}

FfnScratch carve_ffn_scratch(void *workspace, const FfnProblem &p, size_t *bytes) {
    WorkspaceCarver c(workspace);
    FfnScratch s{};
    s.lt_bytes = GemmRunner::kWorkspaceBytes;
    s.lt_workspace = c.take<char>(s.lt_bytes);
    s.ldg = p.hp;
    s.gate = c.take<char>(static_cast<size_t>(p.m * p.hp) * p.gate_bytes());
    // dense mode's U and the cuBLAS dense path's compacted X then Y rows: where cuBLAS runs only
    s.up = p.cublas_ok() ? c.take<char>(static_cast<size_t>(p.m * p.hp) * 2) : nullptr;
    s.xc = p.cublas_ok() ? c.take<char>(static_cast<size_t>(p.m * p.dp) * 2) : nullptr;
    s.cap = ffn_list_width(p);
    s.idx = c.take<uint16_t>(static_cast<size_t>(p.m * s.cap));
    s.row_limit = dense_path_row_limit(p.h);
    s.count = c.take<int32_t>(static_cast<size_t>(p.m));
    s.row_nnz = c.take<int32_t>(static_cast<size_t>(p.m));
    s.row_l1 = c.take<float>(static_cast<size_t>(p.m));
    s.header = c.take<uint32_t>(2);
    s.dense_count = s.header;
    s.dense_rows = c.take<int32_t>(static_cast<size_t>(p.m));
    s.writer_flags = c.take<int32_t>(static_cast<size_t>(p.m) + 64);
    if (decode_fits(p.m, p.dp, p.gate_f32())) {
        const int64_t blocks = (p.h + kDecodeUnitsPerBlock - 1) / kDecodeUnitsPerBlock;
        const int64_t tiles = (p.h + p.tile - 1) / p.tile;
        // the header first, so that one memset zeroes everything the decode kernels count in
        s.header = reinterpret_cast<uint32_t *>(c.take<int32_t>(static_cast<size_t>(2 + p.m * (2 + tiles))));
        s.dense_count = s.header;
        s.dec_zero = reinterpret_cast<int32_t *>(s.header + 2);
        s.dec_list = c.take<int32_t>(static_cast<size_t>(p.m * blocks));
        s.dec_partial = c.take<float>(static_cast<size_t>(blocks * p.m * (p.dp + 1)));
    }
    if (p.cublas_ok()) {  // H / 8 bytes a token, 1/16 of the gate buffer
        s.unit_words = (p.h + 31) / 32;
        s.unit_masks = c.take<uint32_t>(static_cast<size_t>(p.m * s.unit_words));
    }
    // the serving path's ticket wherever a plan may pick it (the tuning moves where it ends)
    if (p.cublas_ok() && p.m >= 1) s.serve_ticket = c.take<uint32_t>(1);
    if (p.cublas_ok() && p.m >= 1 && p.m <= kServeGateTokenCapacity) {  // serve_down's groups
        s.serve_parts = c.take<float>(static_cast<size_t>(kServeDownMaxBlocks * kServeDownCols));
        s.serve_part_l1 = c.take<float>(static_cast<size_t>(kServeDownMaxBlocks));
        s.serve_part_nnz = c.take<int32_t>(static_cast<size_t>(kServeDownMaxBlocks));
        s.serve_part_over = c.take<int32_t>(static_cast<size_t>(kServeDownMaxBlocks));
        s.serve_tickets = c.take<uint32_t>(static_cast<size_t>(kServeDownMaxBlocks));  // a (slice, token) has >= 1 block
    }
    s.splits = fused_splits(p.m);
    s.partial = s.splits > 1 ? c.take<float>(static_cast<size_t>(s.splits * p.m * (p.dp + 1))) : nullptr;
    if (bytes) *bytes = c.used();
    return s;
}

// ---- the saved state

SavedLayout saved_layout(const FfnProblem &p) {
    WorkspaceCarver c(nullptr);
    SavedLayout l{};
    l.ell = std::min<int32_t>(kSavedEll, ffn_list_width(p));
    const size_t m = static_cast<size_t>(p.m), e = static_cast<size_t>(l.ell);
    auto at = [&](size_t bytes) {
        const size_t offset = c.offset_of_next();
        c.take<char>(bytes);
        return offset;
    };
    l.header = at(sizeof(SavedHeader));
    l.words = at(2 * sizeof(uint32_t));
    l.count = at(m * 4);
    l.dense_rows = at(m * 4);
    l.idx = at(m * e * 2);
    l.g = at(m * e * p.gate_bytes());
    l.u = at(p.gated ? m * e * p.gate_bytes() : 0);
    const size_t dense = p.save_dense ? m * static_cast<size_t>(p.hp) * 2 : 0;  // 16-bit values
    l.dense_z = at(dense);
    l.dense_u = at(p.gated ? dense : 0);
    l.total = c.used();
    return l;
}

SavedHeader saved_header(const FfnProblem &p) {
    return SavedHeader{kSavedMagic, p.m, p.d, p.h, p.gated, static_cast<int32_t>(p.type), p.highest, saved_layout(p).ell};
}

SavedView saved_view(const FfnProblem &p, const void *saved) {
    const SavedLayout l = saved_layout(p);
    const auto *b = static_cast<const char *>(saved);
    return {reinterpret_cast<const uint32_t *>(b + l.words), reinterpret_cast<const int32_t *>(b + l.count),
            reinterpret_cast<const int32_t *>(b + l.dense_rows), reinterpret_cast<const uint16_t *>(b + l.idx),
            b + l.g, b + l.u, p.save_dense ? b + l.dense_z : nullptr,
            p.save_dense && p.gated ? b + l.dense_u : nullptr};
}

void point_scratch_into_saved(const FfnProblem &p, void *saved, FfnScratch &s) {
    const SavedLayout l = saved_layout(p);
    char *b = static_cast<char *>(saved);
    s.header = reinterpret_cast<uint32_t *>(b + l.words);
    s.dense_count = s.header;
    s.count = reinterpret_cast<int32_t *>(b + l.count);
    s.dense_rows = reinterpret_cast<int32_t *>(b + l.dense_rows);
    s.idx = reinterpret_cast<uint16_t *>(b + l.idx);
    s.cap = l.ell;
    s.row_limit = l.ell;
    s.save_g = b + l.g;
    s.save_u = p.gated ? b + l.u : nullptr;
}

// ---- the backward's scratch

int key_bits(int64_t max_value) {
    int bits = 1;
    while ((int64_t{1} << bits) <= max_value) ++bits;
    return bits;
}

namespace {

size_t row_sort_bytes(int64_t m, int bits) {
    size_t bytes = 0;
    check(cub::DeviceRadixSort::SortKeys(nullptr, bytes, static_cast<const int32_t *>(nullptr),
                                         static_cast<int32_t *>(nullptr), static_cast<int>(m), 0, bits),
          "cub::DeviceRadixSort (size)");
    return std::max<size_t>(bytes, 1);
}

size_t slot_sort_bytes(int64_t n, int bits) {
    size_t bytes = 0;
    check(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const uint32_t *>(nullptr),
                                          static_cast<uint32_t *>(nullptr), static_cast<const int32_t *>(nullptr),
                                          static_cast<int32_t *>(nullptr), static_cast<int>(n), 0, bits),
          "cub::DeviceRadixSort (size)");
    return std::max<size_t>(bytes, 1);
}

}  // namespace

TrainScratch carve_train_scratch(void *workspace, const FfnProblem &p, size_t *bytes) {
    WorkspaceCarver c(workspace);
    TrainScratch s{};
    const int32_t ell = saved_layout(p).ell;
    const size_t n = static_cast<size_t>(p.m) * static_cast<size_t>(ell), gb = p.gate_bytes();
    s.keys = c.take<uint32_t>(n);
    s.keys_sorted = c.take<uint32_t>(n);
    s.slots = c.take<int32_t>(n);
    s.slots_sorted = c.take<int32_t>(n);
    s.sort_bytes = n > 0 ? slot_sort_bytes(static_cast<int64_t>(n), key_bits(p.h)) : 1;
    s.sort_temp = c.take<char>(s.sort_bytes);
    s.rows_key = c.take<int32_t>(static_cast<size_t>(p.m));
    s.rows_sorted = c.take<int32_t>(static_cast<size_t>(p.m));
    s.rows_bytes = p.m > 0 ? row_sort_bytes(p.m, key_bits(p.m)) : 1;
    s.rows_temp = c.take<char>(s.rows_bytes);
    s.unit_start = c.take<int32_t>(static_cast<size_t>(p.h) + 1);
    s.hot_units = c.take<int32_t>(static_cast<size_t>(p.h));
    s.hot_count = c.take<uint32_t>(1);
    s.dz = c.take<char>(n * gb);
    s.du = c.take<char>(p.gated ? n * gb : 0);
    const size_t rows = static_cast<size_t>(p.m * p.hp) * gb;
    // ru right after rz: a dense-mode backward may view them as one M x 2hp matrix [dZ | dU]
    s.rz = c.take<char>(p.gated ? 2 * rows : rows);
    s.ru = p.gated ? static_cast<char *>(s.rz) + rows : nullptr;
    s.rh = c.take<char>(rows);
    s.dw_dense = c.take<float>(static_cast<size_t>(3 * p.h * p.dp));
    if (p.cublas_ok()) {
        s.lt_bytes = GemmRunner::kWorkspaceBytes;
        s.lt_workspace = c.take<char>(s.lt_bytes);
        s.xc = c.take<char>(static_cast<size_t>(p.m * p.dp) * 2);
        s.dyc = c.take<char>(static_cast<size_t>(p.m * p.dp) * 2);
        s.dxc = c.take<float>(static_cast<size_t>((p.gated ? 2 : 1) * p.m * p.dp));
    }
    if (bytes) *bytes = c.used();
    return s;
}

}  // namespace twblas::cuda
