// Fuzzer (b): a valid TwELL or hybrid container, written by twDenseToSparse from dense values of
// the fuzz input (and checked: valid, and bit-exact back through twSparseToDense when complete),
// then a few bytes or words of its buffer changed as the input says, through every consumer
// (twfuzz::check_consumers).
//
// Input: byte 0: format (bit 0: hybrid), value type (bits 1-2), conversion op (bit 3: RELU);
// byte 1: rows (1..12); bytes 2-3: columns (1..600); byte 4: tile width and compression or ELL
// width; byte 5: backup rows (hybrid); byte 6: density (values from bytes below it are zero);
// then one byte per dense value (row-major), then the changes: a count (0..8) and for each a
// kind, a position and a value.
#include "fuzz_support.hpp"

namespace {

using namespace twfuzz;

/// The value of a dense element from one fuzz byte: zero below the density threshold, else an
/// IEEE special (NaN, +-Inf, -0, the largest finite, the smallest subnormals, 1) or a small
/// multiple of 1/8.
uint32_t value_bits(twDataType_t t, uint8_t b, uint8_t density) {
    if (b < density) return 0;
    const unsigned idx = b % 64;
    const bool f32 = t == TW_R_32F, f16 = t == TW_R_16F;
    switch (idx) {
        case 0: return f32 ? 0x7fc00000u : f16 ? 0x7e00u : 0x7fc0u;  // NaN
        case 1: return f32 ? 0x7f800000u : f16 ? 0x7c00u : 0x7f80u;  // +Inf
        case 2: return f32 ? 0xff800000u : f16 ? 0xfc00u : 0xff80u;  // -Inf
        case 3: return f32 ? 0x80000000u : 0x8000u;                   // -0
        case 4: return f32 ? 0x7f7fffffu : f16 ? 0x7bffu : 0x7f7fu;  // largest finite
        case 5: return 1u;                                            // smallest subnormal
        case 6: return f32 ? 0x80000001u : 0x8001u;                   // its negative
        case 7: return f32 ? 0xfffc0001u : f16 ? 0xfd01u : 0xffc1u;  // a negative NaN with payload
        default: {
            const float v = (static_cast<float>(idx) - 36.0f) / 8.0f;  // +0 at idx 36
            return f32 ? twblas::float_bits(v) : twblas::bits16_of(t, v);
        }
    }
}

bool relu_keeps_bits(twDataType_t t, uint32_t b) {
    const float v = t == TW_R_32F ? twblas::bits_float(b) : twblas::value_of_bits16(t, static_cast<uint16_t>(b));
    return twblas::relu_keeps(v);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Input in(data, size);
    const uint8_t head = in.byte();
    const bool hybrid = head & 1;
    static constexpr twDataType_t kTypes[3] = {TW_R_16BF, TW_R_16F, TW_R_32F};
    twDataType_t type = kTypes[(head >> 1 & 3) % 3];
    if (!hybrid && type == TW_R_32F) type = TW_R_16BF;
    const twConvertOp_t op = (head & 8) ? TW_CONVERT_RELU : TW_CONVERT_PLAIN;
    const int64_t rows = 1 + in.byte() % 12;
    const int64_t cols = 1 + in.u16() % 600;
    const uint8_t params = in.byte(), backup_byte = in.byte(), density = in.byte();
    std::unique_ptr<Sparse> s;
    if (hybrid)
        s = std::make_unique<Sparse>(rows, cols, type, 8 * (1 + params % 4), backup_byte % (rows + 1), true);
    else
        s = std::make_unique<Sparse>(rows, cols, type, 64 << (params % 3), 2 << (params / 3 % 3));

    Dense dense(rows, cols, type);
    std::vector<uint32_t> want(dense.count());
    for (size_t i = 0; i < dense.count(); ++i) {
        const uint32_t b = value_bits(type, in.byte(), density);
        dense.set_bits(i, b);
        const bool kept = b != 0 && (op == TW_CONVERT_PLAIN || relu_keeps_bits(type, b));
        want[i] = kept ? b : 0;
    }
    // rows the container cannot hold, as docs/formats.md counts them
    int64_t overflow_rows = 0;
    for (int64_t r = 0; r < rows; ++r) {
        int64_t nnz = 0, worst_tile = 0;
        std::vector<int64_t> per_tile(static_cast<size_t>(cols / 64 + 1), 0);
        for (int64_t c = 0; c < cols; ++c) {
            if (!want[static_cast<size_t>(r * cols + c)]) continue;
            ++nnz;
            if (!hybrid) worst_tile = std::max(worst_tile, ++per_tile[static_cast<size_t>(c / s->tile)]);
        }
        overflow_rows += hybrid ? nnz > s->ell_width : worst_tile > s->tile / s->compression - 1;
    }

    Handle h;
    size_t ws = 0;
    TWFUZZ_CHECK(twDenseToSparse_bufferSize(h, dense, *s, op, &ws) == TW_STATUS_SUCCESS, "%s", twGetErrorMessage(h));
    Bytes workspace(ws);
    void *wsp = ws ? workspace.data() : nullptr;
    const twStatus_t sa = twDenseToSparse_analysis(h, dense, *s, op, wsp);
    const twStatus_t sc = twDenseToSparse_convert(h, dense, *s, op, wsp);
    const bool lost = hybrid ? overflow_rows > s->backup_rows : overflow_rows > 0;
    const twStatus_t expected = lost ? TW_STATUS_CAPACITY_EXCEEDED : TW_STATUS_SUCCESS;
    TWFUZZ_CHECK(sa == expected && sc == expected, "twDenseToSparse_analysis %s, _convert %s, expected %s (%s)",
                 status_name(sa), status_name(sc), status_name(expected), twGetErrorMessage(h));
    TWFUZZ_CHECK(twSpMatValidate(h, *s) == TW_STATUS_SUCCESS, "twDenseToSparse_convert wrote an invalid container: %s",
                 twGetErrorMessage(h));
    twSpMatInfo_t info{};
    TWFUZZ_CHECK(twSpMatGetInfo(h, *s, &info) == TW_STATUS_SUCCESS, "twSpMatGetInfo");
    TWFUZZ_CHECK(info.overflowRows == overflow_rows, "overflowRows %lld, expected %lld",
                 static_cast<long long>(info.overflowRows), static_cast<long long>(overflow_rows));
    if (!lost) {
        std::vector<uint32_t> back;
        TWFUZZ_CHECK(to_dense(h, *s, back) == TW_STATUS_SUCCESS, "twSparseToDense: %s", twGetErrorMessage(h));
        TWFUZZ_CHECK(back == want, "dense -> sparse -> dense is not bit-exact");
    }

    // the changes
    static constexpr uint32_t kWords[] = {0u, 1u, 0xffffffffu, 0x80000000u, 0x7fffffffu, 0xffffu, 0x10000u,
                                          0x8000001fu, 0x8000003fu, 0x8000007fu, 0x0000001fu, 0x00000020u};
    const int changes = in.byte() % 9;
    const size_t bytes = s->mem.size();
    for (int i = 0; i < changes; ++i) {
        const uint8_t kind = in.byte();
        size_t at = in.u32() % bytes;
        switch (kind % 4) {
            case 0: s->mem.data()[at] ^= static_cast<uint8_t>(in.byte() | 1); break;
            case 1: s->mem.data()[at] = in.byte(); break;
            case 2: {  // a word: an interesting constant, or the shape's numbers
                at &= ~static_cast<size_t>(3);
                if (at + 4 > bytes) break;
                const uint8_t w = in.byte();
                const uint32_t v = w < 12 ? kWords[w]
                                   : w < 128 ? static_cast<uint32_t>(rows + (w % 3) - 1)
                                             : static_cast<uint32_t>(cols + (w % 3) - 1);
                std::memcpy(s->mem.data() + at, &v, 4);
                break;
            }
            default: {  // a 16-bit column index or value: near cols, or the byte itself
                at &= ~static_cast<size_t>(1);
                if (at + 2 > bytes) break;
                const uint8_t w = in.byte();
                const uint16_t v = static_cast<uint16_t>(w < 128 ? cols + (w % 5) - 2 : w);
                std::memcpy(s->mem.data() + at, &v, 2);
                break;
            }
        }
    }
    check_consumers(*s, in);
    return 0;
}
