// Every compiled SIMD target this CPU supports against the scalar references:
// encoded bytes and decoded floats must be identical, and the rotation must be
// bit-identical (the kernels follow the scalar order of operations).
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "format/format_internal.h"
#include "kvcache/simd.h"

namespace kvcache::format_internal {
namespace {

// Runs `body` once per supported target, with dispatch forced to it through
// the public UseSimdTarget; restores the best target afterwards.
template <class Body>
void ForEachTarget(Body body) {
  const std::vector<std::string> targets = SupportedSimdTargets();
  ASSERT_FALSE(targets.empty());
  for (const std::string& target : targets) {
    SCOPED_TRACE(target);
    ASSERT_TRUE(UseSimdTarget(target).ok());
    ASSERT_EQ(SimdTarget(), target);
    body();
  }
  ASSERT_TRUE(UseSimdTarget(targets.front()).ok());
}

TEST(SimdTargets, SupportedListMatchesHighwayBestFirst) {
  std::vector<std::string> want;
  for (int64_t t : hwy::SupportedAndGeneratedTargets()) want.emplace_back(hwy::TargetName(t));
  EXPECT_EQ(SupportedSimdTargets(), want);
  EXPECT_EQ(SimdTarget(), want.front());
}

TEST(SimdTargets, UseSimdTargetRejectsUnknownAndUnsupportedNames) {
  const std::vector<std::string> targets = SupportedSimdTargets();
  ASSERT_TRUE(UseSimdTarget(targets.back()).ok());  // the worst, so a change would show
  const std::string before = SimdTarget();
  ASSERT_EQ(before, targets.back());
  // Not a target at all, empty, and real Highway targets that are either not
  // compiled in (SSSE3 in every build; AVX3_DL unless KVCACHE_HWY_AVX3_DL) or
  // not on this CPU.
  std::vector<const char*> bads = {"AVX9", "", "SSSE3", "NEON", "avx2 "};
  if (std::find(targets.begin(), targets.end(), "AVX3_DL") == targets.end()) bads.push_back("AVX3_DL");
  for (const char* bad : bads) {
    SCOPED_TRACE(bad);
    const Status s = UseSimdTarget(bad);
    ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(std::string("'") + bad + "'"), std::string::npos) << s.message();
    for (const std::string& t : targets) EXPECT_NE(s.message().find(t), std::string::npos) << s.message();
    EXPECT_EQ(SimdTarget(), before);
  }
  if (std::find(targets.begin(), targets.end(), "AVX3") == targets.end()) {
    EXPECT_EQ(UseSimdTarget("AVX3").code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(SimdTarget(), before);
  }
  // Case does not matter; the best target restores the default.
  std::string lower = targets.front();
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  ASSERT_TRUE(UseSimdTarget(lower).ok());
  EXPECT_EQ(SimdTarget(), targets.front());
  EXPECT_EQ(SupportedSimdTargets(), targets);  // the list does not shrink with a restriction
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

// Rows aimed at the blocked encoders' corners: all-zero and single-value
// groups, subnormals beside huge values (a positive value whose quotient by
// the scale underflows to +0), exact rounding ties of q8_0 (d = 1), q4_0's
// first-largest sign choice with +-a in one block, values sitting exactly on a
// turbo threshold times an E4M3 scale, the two floats around each threshold's
// rounding boundary of |x| / s (where the encoder's division-free test could
// differ by one ulp), and magnitudes from 2^-149 to 2^127.
// The midpoints between consecutive non-negative levels of turbo4, turbo3 and
// turbo2, computed as codec_scalar.cc does.
template <size_t L>
std::vector<float> Midpoints(const std::array<float, L>& lv) {
  std::vector<float> t;
  for (size_t j = 0; j + 1 < L / 2; ++j) t.push_back((lv[L / 2 + j] + lv[L / 2 + j + 1]) / 2);
  return t;
}
const std::vector<float> kAllTurboThresholds[5] = {Midpoints(kTurbo4Levels), Midpoints(kTurbo3Levels),
                                                   Midpoints(kTurbo2Levels), Midpoints(kTurbo3ILevels),
                                                   Midpoints(kTurbo2ILevels)};

std::vector<float> EdgeRows(uint32_t d, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> x(n * d);
  const float turbo_thresholds[] = {0.1023969f, 0.2090295f, 0.3243f, 0.4511702f,
                                    0.5925037f, 0.7601761f, 0.9580f, 0.4703f, 0.7678f};
  for (size_t r = 0; r < n; ++r) {
    float* row = x.data() + r * d;
    const int kind = static_cast<int>(rng() % 9);
    const float scale = std::ldexp(1.0f, static_cast<int>(rng() % 250) - 130);
    for (uint32_t i = 0; i < d; ++i) row[i] = nd(rng) * scale;
    switch (kind) {
      case 0:  // zeros and signed zeros, one lone value per 16
        for (uint32_t i = 0; i < d; ++i) row[i] = (i % 16 == 5) ? row[i] : ((i & 1) ? -0.0f : 0.0f);
        break;
      case 1:  // subnormals beside large values
        for (uint32_t i = 0; i < d; ++i) {
          if (rng() % 3 == 0) row[i] = BitsFloat(static_cast<uint32_t>(rng() % 0x7FFFFF) + 1) * ((rng() & 1) ? 1.0f : -1.0f);
          if (rng() % 7 == 0) row[i] = std::ldexp(1.0f + static_cast<float>(rng() % 8) / 8, static_cast<int>(rng() % 248) - 120);
        }
        break;
      case 2:  // q8_0 ties: one +-127 per block, the rest k + 0.5
        for (uint32_t i = 0; i < d; ++i) {
          row[i] = (i % 32 == rng() % 32) ? ((rng() & 1) ? 127.0f : -127.0f)
                                           : static_cast<float>(static_cast<int>(rng() % 254) - 127) + 0.5f;
          if (row[i] > 127.0f) row[i] = 126.5f;
          // The float just inside a tie (k + 0.5 toward zero) must not round away.
          if (i % 4 == 1) row[i] = std::nextafter(row[i], 0.0f);
        }
        break;
      case 3:  // q4_0: -8 and +8 in one block (first one wins), halves elsewhere
        for (uint32_t i = 0; i < d; ++i) row[i] = static_cast<float>(static_cast<int>(rng() % 16) - 8) + 0.5f;
        for (uint32_t b = 0; b < d / 32; ++b) {
          const uint32_t p = static_cast<uint32_t>(rng() % 16), q = 16 + static_cast<uint32_t>(rng() % 16);
          row[32 * b + p] = (rng() & 1) ? 8.0f : -8.0f;
          row[32 * b + q] = -row[32 * b + p];
        }
        break;
      case 4:  // turbo thresholds times an E4M3 scale
        for (uint32_t g = 0; g < d / 16; ++g) {
          const float s = E4M3ToFloat(static_cast<uint8_t>(8 + rng() % 110));
          for (int i = 0; i < 16; ++i) {
            const float t = turbo_thresholds[rng() % 9];
            row[16 * g + i] = ((rng() & 1) ? s : -s) * t;
          }
        }
        break;
      case 5:  // huge
        for (uint32_t i = 0; i < d; ++i) row[i] = nd(rng) * 1e37f;
        break;
      case 6:  // the smallest subnormals beside scales >= 2 (quotients round to 0)
        for (uint32_t i = 0; i < d; ++i) {
          row[i] = (rng() & 1) ? BitsFloat(1u + static_cast<uint32_t>(rng() % 2)) * ((rng() & 1) ? 1.0f : -1.0f)
                               : nd(rng) * 64.0f;
        }
        break;
      case 7:  // the floats on either side of fl(|x| / s) > t for a scale s and a threshold t
        for (uint32_t g = 0; g < d / 16; ++g) {
          const int c = 1 + static_cast<int>(rng() % 0x7E);
          const float s = E4M3ToFloat(static_cast<uint8_t>(c));
          // The group's largest value puts s among the scales searched (c0 - 2 .. c0 + 2).
          const int c_top = std::clamp(c + static_cast<int>(rng() % 5) - 2, 1, 0x7E);
          row[16 * g] = ((rng() & 1) ? 1.0f : -1.0f) * E4M3ToFloat(static_cast<uint8_t>(c_top));
          for (int i = 1; i < 16; ++i) {
            const std::vector<float>& th = kAllTurboThresholds[rng() % 5];
            const float t = th[rng() % th.size()];
            float a = t * s;  // then the smallest a with a / s > t
            while (a / s > t) a = std::nextafter(a, 0.0f);
            while (!(a / s > t)) a = std::nextafter(a, 1e30f);
            if (rng() & 1) a = std::nextafter(a, 0.0f);
            row[16 * g + i] = ((rng() & 1) ? 1.0f : -1.0f) * a;
          }
        }
        break;
      default: break;
    }
  }
  return x;
}

TEST(SimdTargets, EncodersMatchScalarOnEdgeCases) {
  ForEachTarget([] {
    for (Format f : kAllFormats) {
      for (uint32_t d : {128u, 96u, 80u, 64u, 32u}) {
        if (!CheckHeadDim(f, d).ok()) continue;
        SCOPED_TRACE(std::string(FormatName(f)) + " d=" + std::to_string(d));
        const size_t n = 200;
        const std::vector<float> x = EdgeRows(d, n, 77 + d);
        const size_t rb = RowBytes(f, d);
        std::vector<uint8_t> want(n * rb, 0xAB), got(n * rb, 0xCD);
        EncodeRowsScalar(f, d, n, x.data(), want.data());
        EncodeRows(f, d, n, x.data(), got.data());
        for (size_t r = 0; r < n; ++r) {
          if (std::memcmp(want.data() + r * rb, got.data() + r * rb, rb) != 0) {
            for (size_t b = 0; b < rb; ++b) {
              if (want[r * rb + b] != got[r * rb + b]) {
                ADD_FAILURE() << "row " << r << " byte " << b << " want " << int(want[r * rb + b])
                              << " got " << int(got[r * rb + b]) << " x " << (b < d ? x[r * d + b] : 0.0f);
                break;
              }
            }
            return;
          }
        }
      }
    }
  });
}

// The turbo scale search picks levels without dividing (|x|-space thresholds
// per scale): for every E4M3 scale and every threshold, the floats around the
// boundary of fl(a / s) > t, and a spread of magnitudes (subnormal to huge),
// must get the level of the scalar NearestCode(a / s).
TEST(SimdTargets, TurboSearchLevelsMatchNearestCode) {
  const Format formats[5] = {Format::kTurbo4, Format::kTurbo3, Format::kTurbo2, Format::kTurbo3I,
                             Format::kTurbo2I};
  const float* levels[5] = {kTurbo4Levels.data() + 8, kTurbo3Levels.data() + 4, kTurbo2Levels.data() + 2,
                            kTurbo3ILevels.data() + 4, kTurbo2ILevels.data() + 2};
  std::mt19937_64 rng(5);
  for (int fi = 0; fi < 5; ++fi) {
    const std::vector<float>& th = kAllTurboThresholds[fi];
    std::vector<float> a, s;
    for (int c = 1; c <= 0x7E; ++c) {
      const float sc = E4M3ToFloat(static_cast<uint8_t>(c));
      for (float t : th) {
        float b = t * sc;  // the smallest b with b / sc > t
        while (b / sc > t) b = std::nextafter(b, 0.0f);
        while (!(b / sc > t)) b = std::nextafter(b, 1e30f);
        float lo = b;
        for (int k = 0; k < 3; ++k) lo = std::nextafter(lo, 0.0f);
        for (float v = lo; a.size() < 1000000 && v <= b * 1.000001f; v = std::nextafter(v, 1e30f)) {
          a.push_back(v);
          s.push_back(sc);
        }
      }
      for (int k = 0; k < 40; ++k) {
        a.push_back(BitsFloat(static_cast<uint32_t>(rng() % 0x7F800000u)));
        s.push_back(sc);
      }
      a.push_back(0.0f);
      s.push_back(sc);
    }
    std::vector<float> want(a.size());
    for (size_t i = 0; i < a.size(); ++i) {
      const float y = a[i] / s[i];
      size_t c = 0;
      for (float t : th) c += y > t ? 1 : 0;
      want[i] = levels[fi][c];
    }
    ForEachTarget([&] {
      SCOPED_TRACE(FormatName(formats[fi]));
      std::vector<float> got(a.size(), -1.0f);
      TurboSearchLevels(formats[fi], a.size(), a.data(), s.data(), got.data());
      for (size_t i = 0; i < a.size(); ++i) {
        if (got[i] != want[i]) {
          ADD_FAILURE() << "a " << a[i] << " s " << s[i] << " want " << want[i] << " got " << got[i];
          return;
        }
      }
    });
  }
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
