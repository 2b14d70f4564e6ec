// Fuzzer (a): a TwELL or hybrid container whose buffer is raw fuzz bytes, through every consumer
// (twfuzz::check_consumers: info, validation, to-dense, convert, transpose, SpMM).
//
// Input: byte 0 picks the format (bit 0: hybrid), the value type (bits 1-2) and what fills the
// buffer past the input (bit 3: 0xff, else 0x00); byte 1 the rows (0..12); bytes 2-3 the
// columns (0..600); byte 4 the tile width and compression (TwELL) or ELL width (hybrid); byte 5
// (hybrid) the backup rows. The rest is the buffer, then the choices of the consumers.
#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    using namespace twfuzz;
    Input in(data, size);
    const uint8_t head = in.byte();
    const bool hybrid = head & 1;
    static constexpr twDataType_t kTypes[3] = {TW_R_16BF, TW_R_16F, TW_R_32F};
    twDataType_t type = kTypes[(head >> 1 & 3) % 3];
    if (!hybrid && type == TW_R_32F) type = TW_R_16BF;  // TwELL holds 16-bit values only
    const uint8_t fill = (head & 8) ? 0xff : 0x00;
    const int64_t rows = in.byte() % 13;
    const int64_t cols = in.u16() % 601;
    const uint8_t params = in.byte();
    std::unique_ptr<Sparse> s;
    if (hybrid) {
        const int64_t backup = in.byte() % (rows + 1);
        s = std::make_unique<Sparse>(rows, cols, type, 8 * (1 + params % 4), backup, true);
    } else {
        s = std::make_unique<Sparse>(rows, cols, type, 64 << (params % 3), 2 << (params / 3 % 3));
    }
    const size_t n = std::min(in.left(), s->mem.size());
    if (n) std::memcpy(s->mem.data(), in.rest(), n);
    std::memset(s->mem.data() + n, fill, s->mem.size() - n);
    in.skip(n);
    check_consumers(*s, in);
    return 0;
}
