// Exact tests of the scalar f16 / bf16 / E4M3 conversions in format_internal.h:
// every code decodes to its exact value, every finite code re-encodes to
// itself, midpoints round to even, values off a midpoint round to nearest,
// overflow, subnormals and NaN behave as documented.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "format/format_internal.h"

namespace kvcache::format_internal {
namespace {

float Up(float x) { return std::nextafter(x, std::numeric_limits<float>::infinity()); }
float Down(float x) { return std::nextafter(x, -std::numeric_limits<float>::infinity()); }

// Exact value of an IEEE binary16 code by its definition.
double F16Exact(uint16_t h) {
  const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  const double mag = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -mag : mag;
}

TEST(F16, EveryFiniteCodeDecodesExactlyAndRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if (((h >> 10) & 0x1F) == 0x1F) continue;
    const float f = F16ToFloat(static_cast<uint16_t>(h));
    ASSERT_EQ(static_cast<double>(f), F16Exact(static_cast<uint16_t>(h))) << h;
    ASSERT_EQ(FloatToF16(f), h) << h;
  }
}

// Every code, infinities and NaNs included, against the definition, sign of
// zero too.
TEST(F16, EveryCodeMatchesTheDefinitionWithItsSign) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint32_t e = (h >> 10) & 0x1F, m = h & 0x3FF;
    const float s = (h & 0x8000) ? -1.0f : 1.0f;
    const float got = F16ToFloat(static_cast<uint16_t>(h));
    if (e == 0x1F) {
      EXPECT_TRUE(m ? std::isnan(got) : std::isinf(got)) << h;
    } else {
      const float want = e == 0 ? s * std::ldexp(static_cast<float>(m), -24)
                                : s * std::ldexp(1.0f + m / 1024.0f, static_cast<int>(e) - 15);
      ASSERT_EQ(got, want) << h;
      ASSERT_EQ(std::signbit(got), std::signbit(s)) << h;
    }
  }
}

TEST(F16, MidpointsRoundToEvenAndNeighboursToNearest) {
  // Positive and negative, subnormals included: consecutive codes h, h+1.
  for (uint32_t sign : {0u, 0x8000u}) {
    for (uint32_t h = 0; h < 0x7BFF; ++h) {
      const uint16_t a = static_cast<uint16_t>(sign | h), b = static_cast<uint16_t>(sign | (h + 1));
      const float mid = static_cast<float>((F16Exact(a) + F16Exact(b)) / 2);  // exact in f32
      const uint16_t even = (h & 1) ? b : a;
      ASSERT_EQ(FloatToF16(mid), even) << h;
      const float toward_b = sign ? Down(mid) : Up(mid);
      const float toward_a = sign ? Up(mid) : Down(mid);
      ASSERT_EQ(FloatToF16(toward_b), b) << h;
      ASSERT_EQ(FloatToF16(toward_a), a) << h;
    }
  }
}

TEST(F16, OverflowInfinityAndNaN) {
  EXPECT_EQ(FloatToF16(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToF16(Down(65520.0f)), 0x7BFF);  // just below the midpoint to 65536
  EXPECT_EQ(FloatToF16(65520.0f), 0x7C00);        // the tie goes to even = inf
  EXPECT_EQ(FloatToF16(1e10f), 0x7C00);
  EXPECT_EQ(FloatToF16(-1e10f), 0xFC00);
  EXPECT_EQ(FloatToF16(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(FloatToF16(-std::numeric_limits<float>::infinity()), 0xFC00);
  EXPECT_TRUE(std::isinf(F16ToFloat(0x7C00)));
  // Smallest subnormal is 2^-24; half of it is a tie to 0, a bit more rounds up.
  EXPECT_EQ(FloatToF16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(FloatToF16(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(FloatToF16(Up(std::ldexp(1.0f, -25))), 0x0001);
  EXPECT_EQ(FloatToF16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 ulp: tie to even (2)
  EXPECT_EQ(FloatToF16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToF16(1e-30f), 0x0000);
  // NaN stays NaN, quiet, sign kept; the payload's top bits survive.
  const float qnan = std::numeric_limits<float>::quiet_NaN();
  const uint16_t hq = FloatToF16(qnan);
  EXPECT_EQ(hq & 0x7C00, 0x7C00);
  EXPECT_NE(hq & 0x0200, 0);
  const float snan = BitsFloat(0xFF800001u);  // signalling NaN, low payload only
  const uint16_t hs = FloatToF16(snan);
  EXPECT_EQ(hs, 0xFE00);
  EXPECT_TRUE(std::isnan(F16ToFloat(hs)));
  EXPECT_EQ(FloatToF16(BitsFloat(0x7FA00000u)), 0x7F00);  // payload bit kept, quieted
}

TEST(BF16, EveryFiniteCodeRoundTripsAndTiesGoToEven) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    if (((b >> 7) & 0xFF) == 0xFF) continue;
    const float f = BF16ToFloat(static_cast<uint16_t>(b));
    ASSERT_EQ(FloatBits(f), b << 16);
    ASSERT_EQ(FloatToBF16(f), b);
    // Midpoint to the next code (same sign, larger magnitude), if finite.
    if ((b & 0x7FFF) == 0x7F7F) continue;
    const uint32_t mid_bits = (b << 16) | 0x8000u;
    const uint16_t even = (b & 1) ? static_cast<uint16_t>(b + 1) : static_cast<uint16_t>(b);
    ASSERT_EQ(FloatToBF16(BitsFloat(mid_bits)), even) << b;
    ASSERT_EQ(FloatToBF16(BitsFloat(mid_bits + 1)), b + 1) << b;
    ASSERT_EQ(FloatToBF16(BitsFloat(mid_bits - 1)), b) << b;
  }
}

TEST(BF16, OverflowSubnormalAndNaN) {
  const float max = std::numeric_limits<float>::max();
  EXPECT_EQ(FloatToBF16(max), 0x7F80);  // rounds up past the largest bf16
  EXPECT_EQ(FloatToBF16(BitsFloat(0x7F7F7FFFu)), 0x7F7F);
  EXPECT_EQ(FloatToBF16(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_EQ(FloatToBF16(BitsFloat(0x00018000u)), 0x0002);  // subnormal tie to even
  EXPECT_EQ(FloatToBF16(BitsFloat(0x00008000u)), 0x0000);
  const uint16_t n1 = FloatToBF16(BitsFloat(0x7F800001u));  // NaN with only low payload
  EXPECT_TRUE(std::isnan(BF16ToFloat(n1)));
  EXPECT_EQ(n1, 0x7FC0);
  EXPECT_EQ(FloatToBF16(BitsFloat(0xFFC12345u)), 0xFFC1);
}

// Exact E4M3 value by definition.
double E4M3Exact(uint8_t c) {
  const int e = (c >> 3) & 0xF, m = c & 7;
  const double mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return (c & 0x80) ? -mag : mag;
}

TEST(E4M3, All256CodesDecodeExactlyAndReencode) {
  int nan_codes = 0;
  for (int c = 0; c < 256; ++c) {
    const float f = E4M3ToFloat(static_cast<uint8_t>(c));
    if ((c & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(f)) << c;
      ++nan_codes;
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), E4M3Exact(static_cast<uint8_t>(c))) << c;
    ASSERT_EQ(FloatToE4M3(f), c) << c;
  }
  EXPECT_EQ(nan_codes, 2);
  EXPECT_EQ(E4M3ToFloat(0x7E), 448.0f);
  EXPECT_EQ(E4M3ToFloat(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(E4M3ToFloat(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(E4M3ToFloat(0x38), 1.0f);
}

TEST(E4M3, MidpointsRoundToEvenAndNeighboursToNearest) {
  for (uint32_t sign : {0u, 0x80u}) {
    for (uint32_t c = 0; c < 0x7E; ++c) {
      const uint8_t a = static_cast<uint8_t>(sign | c), b = static_cast<uint8_t>(sign | (c + 1));
      const float mid = static_cast<float>((E4M3Exact(a) + E4M3Exact(b)) / 2);
      const uint8_t even = (c & 1) ? b : a;
      ASSERT_EQ(FloatToE4M3(mid), even) << c;
      ASSERT_EQ(FloatToE4M3(sign ? Down(mid) : Up(mid)), b) << c;
      ASSERT_EQ(FloatToE4M3(sign ? Up(mid) : Down(mid)), a) << c;
    }
  }
}

TEST(E4M3, SaturatesAndKeepsNaN) {
  EXPECT_EQ(FloatToE4M3(448.0f), 0x7E);
  EXPECT_EQ(FloatToE4M3(463.0f), 0x7E);
  EXPECT_EQ(FloatToE4M3(464.0f), 0x7E);  // would round to 480: saturate instead
  EXPECT_EQ(FloatToE4M3(1e6f), 0x7E);
  EXPECT_EQ(FloatToE4M3(-1e6f), 0xFE);
  EXPECT_EQ(FloatToE4M3(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(FloatToE4M3(-std::numeric_limits<float>::infinity()), 0xFE);
  EXPECT_EQ(FloatToE4M3(std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(FloatToE4M3(-std::numeric_limits<float>::quiet_NaN()), 0xFF);
  EXPECT_EQ(FloatToE4M3(std::ldexp(1.0f, -10)), 0x00);  // tie between 0 and 2^-9 -> 0
  EXPECT_EQ(FloatToE4M3(Up(std::ldexp(1.0f, -10))), 0x01);
  EXPECT_EQ(FloatToE4M3(-0.0f), 0x80);
  EXPECT_EQ(FloatToE4M3(1e-20f), 0x00);
}

}  // namespace
}  // namespace kvcache::format_internal
