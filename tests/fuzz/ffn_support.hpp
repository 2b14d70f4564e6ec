// The fused FFN of the FFN fuzzers: a tiny problem decoded from the fuzz input, its matrices in
// exactly sized memory, and an FFN descriptor over them on the CPU backend.
#pragma once

#include "fuzz_support.hpp"

namespace twfuzz {

/// Shape, numerics and data of one fuzzed FFN. Every value is a multiple of 1/64 in [-2, 2)
/// (exact in every value type, and every dot product of D <= 16 of them is exact in fp32), or,
/// when `specials`, NaN, +-Inf or -0.
struct FfnCase {
    bool gated = true, highest = false, specials = false, deterministic = false;
    twDataType_t type = TW_R_16BF;
    int64_t m = 1, d = 1, h = 1;
    int32_t tile = 256, compression = 8;
    float l1 = 0.0f;
    uint8_t flags = 0;  // spare bits of the header for the fuzzer's own choices
    std::vector<float> x, wg, wu, wd, dy;  // row-major; every weight H x D; wg empty when plain

    static float value(uint8_t b, bool specials) {
        if (specials && b < 8) {
            static const float kSpecial[8] = {NAN, INFINITY, -INFINITY, -0.0f, -NAN, INFINITY, -INFINITY, -0.0f};
            return kSpecial[b];
        }
        return static_cast<float>(static_cast<int>(b) - 128) / 64.0f;
    }

    /// Header: byte 0: gated (bit 0), value type (bits 1-2), HIGHEST_PRECISION (bit 3), specials
    /// (bit 4, when allowed), deterministic (bit 5), spare (bits 6-7, in flags); byte 1: M (0..8);
    /// byte 2: D (1..16); byte 3: H (1..160); byte 4: tile width and compression; byte 5: l1
    /// (M times 0, 1/4, -1/2 or 1/64: l1 / M is exact) and more spare bits. Then one byte per
    /// value: X, Wgate (gated), Wup, Wdown, dY.
    static FfnCase decode(Input &in, bool allow_specials) {
        static constexpr twDataType_t kTypes[3] = {TW_R_16BF, TW_R_16F, TW_R_32F};
        FfnCase c;
        const uint8_t b0 = in.byte();
        c.gated = !(b0 & 1);
        c.type = kTypes[(b0 >> 1 & 3) % 3];
        c.highest = b0 & 8;
        c.specials = allow_specials && (b0 & 16);
        c.deterministic = b0 & 32;
        c.m = in.byte() % 9;
        c.d = 1 + in.byte() % 16;
        c.h = 1 + in.byte() % 160;
        const uint8_t b4 = in.byte();
        c.tile = 64 << (b4 % 3);
        c.compression = 2 << (b4 / 3 % 3);
        const uint8_t b5 = in.byte();
        static constexpr float kL1[4] = {0.0f, 0.25f, -0.5f, 1.0f / 64};
        c.l1 = static_cast<float>(c.m) * kL1[b5 % 4];
        c.flags = static_cast<uint8_t>((b0 >> 6) | ((b5 >> 2) << 2));
        auto fill = [&](std::vector<float> &v, int64_t rows) {
            v.resize(static_cast<size_t>(rows * c.d));
            for (float &f : v) f = value(in.byte(), c.specials);
        };
        fill(c.x, c.m);
        if (c.gated) fill(c.wg, c.h);
        fill(c.wu, c.h);
        fill(c.wd, c.h);
        fill(c.dy, c.m);
        return c;
    }
};

/// The matrices of a case on the CPU backend and an FFN descriptor over its weights, with the
/// case's attributes set.
struct FfnSetup {
    const FfnCase &c;
    Handle h;
    Dense x, y, dy, wu, wd;
    std::unique_ptr<Dense> wg;
    twFfnDescr_t ffn = nullptr;

    explicit FfnSetup(const FfnCase &cs)
        : c(cs), x(cs.m, cs.d, cs.type), y(cs.m, cs.d, cs.type), dy(cs.m, cs.d, cs.type), wu(cs.h, cs.d, cs.type),
          wd(cs.h, cs.d, cs.type) {
        set_all(x, c.x);
        set_all(dy, c.dy);
        set_all(wu, c.wu);
        set_all(wd, c.wd);
        if (c.gated) {
            wg = std::make_unique<Dense>(c.h, c.d, c.type);
            set_all(*wg, c.wg);
        }
        const twStatus_t st =
            twCreateFfn(h, &ffn, c.gated ? TW_FFN_GATED_RELU : TW_FFN_RELU, wg ? wg->d : nullptr, wu, wd);
        TWFUZZ_CHECK(st == TW_STATUS_SUCCESS, "twCreateFfn: %s: %s", status_name(st), twGetErrorMessage(h));
        const int32_t mode = c.highest ? TW_COMPUTE_HIGHEST_PRECISION : TW_COMPUTE_DEFAULT;
        const int32_t det = c.deterministic;
        TWFUZZ_CHECK(twFfnSetAttribute(ffn, TW_FFN_ATTR_COMPUTE_MODE, &mode, sizeof mode) == TW_STATUS_SUCCESS, "mode");
        TWFUZZ_CHECK(twFfnSetAttribute(ffn, TW_FFN_ATTR_DETERMINISTIC, &det, sizeof det) == TW_STATUS_SUCCESS, "det");
        TWFUZZ_CHECK(twFfnSetAttribute(ffn, TW_FFN_ATTR_TILE_WIDTH, &c.tile, sizeof c.tile) == TW_STATUS_SUCCESS, "tile");
        TWFUZZ_CHECK(twFfnSetAttribute(ffn, TW_FFN_ATTR_COMPRESSION, &c.compression, sizeof c.compression) ==
                         TW_STATUS_SUCCESS,
                     "compression");
    }
    ~FfnSetup() { twDestroyFfn(ffn); }
    FfnSetup(const FfnSetup &) = delete;
    FfnSetup &operator=(const FfnSetup &) = delete;

    static void set_all(Dense &m, const std::vector<float> &v) {
        for (size_t i = 0; i < v.size(); ++i) m.set(i, v[i]);
    }
    size_t saved_bytes() {
        size_t n = 0;
        const twStatus_t st = twSpGEMMFusedSaved_bufferSize(h, ffn, c.m, &n);
        TWFUZZ_CHECK(st == TW_STATUS_SUCCESS, "twSpGEMMFusedSaved_bufferSize: %s", status_name(st));
        return n;
    }
    size_t forward_workspace() {
        size_t n = 0;
        const twStatus_t st = twSpGEMMFused_bufferSize(h, ffn, x, y, &n);
        TWFUZZ_CHECK(st == TW_STATUS_SUCCESS, "twSpGEMMFused_bufferSize: %s", status_name(st));
        return n;
    }
    size_t backward_workspace() {
        size_t n = 0;
        const twStatus_t st = twSpGEMMFusedBackward_bufferSize(h, ffn, c.m, &n);
        TWFUZZ_CHECK(st == TW_STATUS_SUCCESS, "twSpGEMMFusedBackward_bufferSize: %s", status_name(st));
        return n;
    }
};

/// The gradients' outputs of one backward (dWgate only when gated), over exactly sized memory.
struct Grads {
    Dense dx, dwu, dwd;
    std::unique_ptr<Dense> dwg;
    explicit Grads(const FfnCase &c) : dx(c.m, c.d, c.type), dwu(c.h, c.d, c.type), dwd(c.h, c.d, c.type) {
        if (c.gated) dwg = std::make_unique<Dense>(c.h, c.d, c.type);
    }
    void poison(uint8_t v) {
        dx.poison(v);
        dwu.poison(v);
        dwd.poison(v);
        if (dwg) dwg->poison(v);
    }
    std::vector<uint8_t> bytes() const {
        std::vector<uint8_t> out;
        for (const Dense *m : {&dx, static_cast<const Dense *>(dwg.get()), &dwu, &dwd})
            if (m) {
                const std::vector<uint8_t> b = m->mem.copy();
                out.insert(out.end(), b.begin(), b.end());
            }
        return out;
    }
    twStatus_t run(FfnSetup &s, const void *saved, void *workspace) {
        return twSpGEMMFusedBackward(s.h, s.ffn, s.x, saved, s.dy, s.c.l1, dx, dwg ? dwg->d : nullptr, dwu, dwd,
                                     workspace);
    }
};

}  // namespace twfuzz
