// Every compiled SIMD target this CPU supports against the scalar references:
// encoded bytes and decoded floats must be identical, and the rotation must be
// bit-identical (the kernels follow the scalar order of operations).
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "format/format_internal.h"
#include "kvcache/simd.h"

namespace kvcache::format_internal {
namespace {

// Runs `body` once per supported target, with dispatch forced to it.
template <class Body>
void ForEachTarget(Body body) {
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    ASSERT_EQ(SimdTarget(), hwy::TargetName(target));
    body();
  }
  hwy::SetSupportedTargetsForTest(0);
}

// Rows mixing magnitudes, exact zeros, all-zero groups, and (for the plain
// conversions) values sitting on rounding midpoints and beyond the range.
std::vector<float> TestRows(uint32_t d, size_t n, uint64_t seed, bool specials) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> x(n * d);
  for (size_t r = 0; r < n; ++r) {
    const float scale = std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
    for (uint32_t i = 0; i < d; ++i) x[r * d + i] = nd(rng) * scale;
  }
  if (n > 2) std::fill(x.begin() + d, x.begin() + 2 * d, 0.0f);  // an all-zero row
  if (specials) {
    const float sp[] = {65520.0f, 65504.0f, 1e30f,   -1e30f, 448.0f, 464.0f,
                        1e-40f,   -1e-42f,  5.96e-8f, 2.98e-8f, 0.0f, -0.0f};
    for (size_t i = 0; i < sizeof(sp) / sizeof(sp[0]) && i < x.size(); ++i) x[i] = sp[i];
    // Midpoints of f16, bf16 and E4M3 codes.
    for (size_t i = 20; i + 3 < x.size(); i += 7) {
      const uint32_t h = static_cast<uint32_t>(rng() % 0x7BFF);
      x[i] = (F16ToFloat(static_cast<uint16_t>(h)) + F16ToFloat(static_cast<uint16_t>(h + 1))) / 2;
      x[i + 1] = BitsFloat((static_cast<uint32_t>(rng() % 0x7F00) << 16) | 0x8000u);
      const uint8_t c = static_cast<uint8_t>(rng() % 0x7E);
      x[i + 2] = -(E4M3ToFloat(c) + E4M3ToFloat(static_cast<uint8_t>(c + 1))) / 2;
    }
  }
  return x;
}

TEST(SimdTargets, EncodeDecodeMatchScalarForEveryFormat) {
  ForEachTarget([] {
    for (Format f : kAllFormats) {
      for (uint32_t d : {16u, 32u, 64u, 80u, 96u, 128u, 256u, 7u, 100u}) {
        if (!CheckHeadDim(f, d).ok()) continue;
        SCOPED_TRACE(std::string(FormatName(f)) + " d=" + std::to_string(d));
        const bool plain = GroupSize(f) == 1 && f != Format::kQ8;
        for (size_t n : {1u, 3u, 9u}) {
          const std::vector<float> x = TestRows(d, n, 1234 + d + n, plain);
          const size_t rb = RowBytes(f, d);
          std::vector<uint8_t> want(n * rb, 0xAB), got(n * rb, 0xCD);
          EncodeRowsScalar(f, d, n, x.data(), want.data());
          EncodeRows(f, d, n, x.data(), got.data());
          ASSERT_EQ(want, got) << "n=" << n;
          std::vector<float> dw(n * d), dg(n * d);
          DecodeRowsScalar(f, d, n, want.data(), dw.data());
          DecodeRows(f, d, n, want.data(), dg.data());
          ASSERT_EQ(0, std::memcmp(dw.data(), dg.data(), dw.size() * 4)) << "n=" << n;
        }
      }
    }
  });
}

TEST(SimdTargets, DecodeOfArbitraryBytesMatchesScalar) {
  // Garbage rows (NaN codes, any nibble) decode identically too.
  ForEachTarget([] {
    std::mt19937_64 rng(99);
    for (Format f : kAllFormats) {
      const uint32_t d = 128;
      const size_t n = 5, rb = RowBytes(f, d);
      std::vector<uint8_t> in(n * rb);
      for (auto& b : in) b = static_cast<uint8_t>(rng());
      std::vector<float> dw(n * d), dg(n * d);
      DecodeRowsScalar(f, d, n, in.data(), dw.data());
      DecodeRows(f, d, n, in.data(), dg.data());
      ASSERT_EQ(0, std::memcmp(dw.data(), dg.data(), dw.size() * 4)) << FormatName(f);
    }
  });
}

TEST(SimdTargets, RotationMatchesScalarBitForBit) {
  ForEachTarget([] {
    for (uint32_t d : {16u, 32u, 48u, 64u, 80u, 96u, 112u, 128u, 256u}) {
      const std::vector<float> signs = RotationSigns(7, d);
      std::vector<float> x = TestRows(d, 4, d, false);
      std::vector<float> a = x, b = x;
      RotateRows(signs.data(), d, 4, a.data());
      for (size_t r = 0; r < 4; ++r) RotateInPlaceScalar(signs.data(), d, b.data() + r * d);
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << d;
      InverseRotateRows(signs.data(), d, 4, a.data());
      for (size_t r = 0; r < 4; ++r) InverseRotateInPlaceScalar(signs.data(), d, b.data() + r * d);
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << d;
    }
  });
}

}  // namespace
}  // namespace kvcache::format_internal
