// The scalar conversions every backend and test relies on: bf16 and fp16 round to nearest even.
#include "test_support.hpp"

using namespace twblas;

TEST_CASE("bf16 conversion rounds to nearest even and keeps specials", "[numeric]") {
    CHECK(float_to_bf16(1.5f) == 0x3FC0);
    CHECK(float_to_bf16(0.25f) == 0x3E80);
    CHECK(float_to_bf16(2.0f) == 0x4000);
    CHECK(float_to_bf16(-0.0f) == 0x8000);
    // 1 + 2^-8 is halfway between bf16 1.0 and 1 + 2^-7: ties to the even pattern (1.0)
    CHECK(float_to_bf16(1.0f + std::ldexp(1.0f, -8)) == 0x3F80);
    // 1 + 3*2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): rounds up
    CHECK(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3F82);
    CHECK(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -9)) == 0x3F81);  // above the tie: up
    CHECK(float_to_bf16(INFINITY) == 0x7F80);
    CHECK(std::isnan(bf16_to_float(float_to_bf16(NAN))));
    CHECK(float_to_bf16(3.4e38f) == 0x7F80);  // rounds past the largest finite bf16
    for (uint32_t b = 0; b < 0x10000; b += 7) {
        const float f = bf16_to_float(static_cast<uint16_t>(b));
        if (!std::isnan(f)) CHECK(float_to_bf16(f) == b);
    }
}

TEST_CASE("FP8 E4M3 rounding: nearest, ties to even, saturating, subnormals", "[numeric][fp8]") {
    CHECK(round_to_e4m3(0.0f) == 0.0f);
    CHECK(round_to_e4m3(1.0f) == 1.0f);
    CHECK(round_to_e4m3(1.07f) == 1.125f);    // [1, 2) in steps of 1/8
    CHECK(round_to_e4m3(1.0625f) == 1.0f);    // tie between 1 (even) and 1.125 (odd)
    CHECK(round_to_e4m3(1.1875f) == 1.25f);   // tie between 1.125 (odd) and 1.25 (even)
    CHECK(round_to_e4m3(-3.3f) == -3.25f);    // [2, 4) in steps of 1/4
    CHECK(round_to_e4m3(232.0f) == 224.0f);   // tie between 224 (even) and 240 (odd)
    CHECK(round_to_e4m3(240.0f) == 240.0f);
    CHECK(round_to_e4m3(448.0f) == 448.0f);   // the largest finite value
    CHECK(round_to_e4m3(500.0f) == 448.0f);   // saturates
    CHECK(round_to_e4m3(-1e30f) == -448.0f);
    CHECK(round_to_e4m3(INFINITY) == 448.0f);
    const float sub = std::ldexp(1.0f, -9);   // the smallest subnormal
    CHECK(round_to_e4m3(sub) == sub);
    CHECK(round_to_e4m3(0.5f * sub) == 0.0f);         // tie between 0 (even) and 2^-9 (odd)
    CHECK(round_to_e4m3(1.5f * sub) == 2.0f * sub);   // tie between 2^-9 (odd) and 2^-8 (even)
    CHECK(round_to_e4m3(7.5f * sub) == std::ldexp(1.0f, -6));  // up to the smallest normal
    CHECK(std::isnan(round_to_e4m3(NAN)));
}

TEST_CASE("fp16 conversion round-trips every pattern and rounds to nearest even", "[numeric]") {
    for (uint32_t b = 0; b < 0x10000; ++b) {
        const float f = fp16_to_float(static_cast<uint16_t>(b));
        if (std::isnan(f)) continue;
        REQUIRE(float_to_fp16(f) == b);
    }
    CHECK(fp16_to_float(0x3C00) == 1.0f);
    CHECK(fp16_to_float(0x0001) == std::ldexp(1.0f, -24));
    CHECK(float_to_fp16(65520.0f) == 0x7C00);                        // halfway to inf: rounds to inf
    CHECK(float_to_fp16(65504.0f) == 0x7BFF);                        // largest finite
    CHECK(float_to_fp16(std::ldexp(1.0f, -25)) == 0x0000);           // tie between 0 and 2^-24: even
    CHECK(float_to_fp16(std::ldexp(3.0f, -26)) == 0x0001);           // above the tie
    CHECK(float_to_fp16(1.0f + std::ldexp(1.0f, -11)) == 0x3C00);    // tie: even
    CHECK(float_to_fp16(1.0f + std::ldexp(3.0f, -11)) == 0x3C02);    // tie: even (up)
}

TEST_CASE("relu keeps positives and NaN only", "[numeric]") {
    CHECK(relu_keeps(1e-30f));
    CHECK(relu_keeps(NAN));
    CHECK_FALSE(relu_keeps(0.0f));
    CHECK_FALSE(relu_keeps(-0.0f));
    CHECK_FALSE(relu_keeps(-1.0f));
}
