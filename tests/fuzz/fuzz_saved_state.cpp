// Fuzzer (d): the backward on a corrupted saved state. A valid training forward on a tiny problem
// decoded from the input (finite values), then bytes, 16-bit or 32-bit words of the saved buffer
// past its header overwritten as the input says, then twSpGEMMFusedBackward: it must answer
// SUCCESS or INVALID_VALUE, never read or write out of bounds (the buffers are exactly sized),
// never write into the saved state; with INVALID_VALUE its outputs stay untouched; with SUCCESS
// they are fully written (two runs over different poisons agree).
//
// Input: the FFN header and values of ffn_support.hpp, then a count of changes (1..8) and for
// each a kind (byte, 16-bit word or 32-bit word; near the start of the saved state or anywhere
// in it), a position and a value.
#include "ffn_support.hpp"

namespace {

/// Bytes of the saved state's header in the reference backend's layout (magic, tokens, D, H,
/// kind, type, mode, ELL width); changes land past it (the header itself is checked field by
/// field already).
constexpr size_t kHeaderBytes = 48;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    using namespace twfuzz;
    Input in(data, size);
    const FfnCase c = FfnCase::decode(in, false);
    FfnSetup s(c);
    const twHandle_t h = s.h;
    Bytes ws(s.forward_workspace()), wsb(s.backward_workspace());
    Bytes saved(s.saved_bytes());
    // M = 0: no saved state at all (0 bytes, the calls touch no pointer); nothing to corrupt
    if (c.m == 0) {
        TWFUZZ_CHECK(saved.size() == 0, "saved state of %zu bytes for M = 0", saved.size());
        return 0;
    }
    TWFUZZ_CHECK(saved.size() > kHeaderBytes, "saved state of %zu bytes", saved.size());
    const twStatus_t st = twSpGEMMFusedForwardTrain(h, s.ffn, s.x, s.y, saved.data(), ws.size() ? ws.data() : nullptr);
    TWFUZZ_CHECK(st == TW_STATUS_SUCCESS, "twSpGEMMFusedForwardTrain: %s: %s", status_name(st), twGetErrorMessage(h));

    static constexpr uint32_t kWords[] = {0u, 1u, 0xffffffffu, 0x80000000u, 0x7fffffffu, 0xffffu, 0x10000u,
                                          127u, 128u, 129u, 0x7fc00000u, 0x7f800000u};
    const int changes = 1 + in.byte() % 8;
    const size_t span = saved.size() - kHeaderBytes;
    for (int i = 0; i < changes; ++i) {
        const uint8_t kind = in.byte();
        const uint32_t pos = in.u32();
        // half the changes near the start (the per-token counts and unit ids come first)
        size_t at = kHeaderBytes + ((kind & 8) ? pos % std::min<size_t>(span, 2048) : pos % span);
        uint8_t *p = saved.data();
        switch (kind % 3) {
            case 0: p[at] = in.byte(); break;
            case 1: {
                at &= ~static_cast<size_t>(1);
                if (at < kHeaderBytes || at + 2 > saved.size()) break;
                const uint8_t w = in.byte();
                // a unit id near H, or an arbitrary one
                const uint16_t v = static_cast<uint16_t>(w < 128 ? c.h + (w % 5) - 2 : (w << 8) | in.byte());
                std::memcpy(p + at, &v, 2);
                break;
            }
            default: {
                at &= ~static_cast<size_t>(3);
                if (at < kHeaderBytes || at + 4 > saved.size()) break;
                const uint8_t w = in.byte();
                const uint32_t v = w < 12 ? kWords[w] : w < 128 ? static_cast<uint32_t>(c.h + (w % 5) - 2) : in.u32();
                std::memcpy(p + at, &v, 4);
                break;
            }
        }
    }

    const std::vector<uint8_t> saved_before = saved.copy();
    Grads a(c), b(c);
    a.poison(0x7f);
    b.poison(0x3c);
    const std::vector<uint8_t> a0 = a.bytes(), b0 = b.bytes();
    void *wsbp = wsb.size() ? wsb.data() : nullptr;
    const twStatus_t sa = a.run(s, saved.data(), wsbp);
    const twStatus_t sb = b.run(s, saved.data(), wsbp);
    if (verbose())
        std::fprintf(stderr, "twfuzz: M %lld D %lld H %lld, %d changes: %s %s\n", static_cast<long long>(c.m),
                     static_cast<long long>(c.d), static_cast<long long>(c.h), changes, status_name(sa),
                     sa == TW_STATUS_SUCCESS ? "" : twGetErrorMessage(h));
    TWFUZZ_CHECK(sa == TW_STATUS_SUCCESS || sa == TW_STATUS_INVALID_VALUE, "twSpGEMMFusedBackward: %s: %s", status_name(sa),
                 twGetErrorMessage(h));
    TWFUZZ_CHECK(sa == sb, "twSpGEMMFusedBackward answered %s then %s on the same input", status_name(sa), status_name(sb));
    TWFUZZ_CHECK(saved.equals(saved_before), "twSpGEMMFusedBackward wrote into the saved state");
    if (sa == TW_STATUS_INVALID_VALUE) {
        TWFUZZ_CHECK(a.bytes() == a0 && b.bytes() == b0, "twSpGEMMFusedBackward returned INVALID_VALUE but wrote outputs");
    } else {
        TWFUZZ_CHECK(a.bytes() == b.bytes(), "twSpGEMMFusedBackward left outputs unwritten");
    }
    return 0;
}
