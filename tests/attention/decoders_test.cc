// The attention kernels' row decoders (src/attention/decode_*-inl.h), one
// format family at a time, against their scalar reference, the codec's
// format_internal::DecodeRowsScalar: bit for bit, on every SIMD target this
// CPU runs (on an AVX-512 machine that includes the 16-lane AVX3 paths,
// which a 16-value group fills with one vector).
//
// Rows are random (normal values, several scales, zeros and large values
// mixed in) encoded by the scalar encoder, for head dims that exercise full
// 16-value blocks and, for the formats that allow it, a partial tail block.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attention/plan.h"
#include "attention/reference.h"
#include "format/format_internal.h"
#include "kvcache/format.h"
#include "hwy_targets.h"

namespace kvcache {
namespace {

using testing::ForEachHwyTarget;

using attention_internal::DecodeRowForTest;
using attention_internal::FromNibbleOrder;
using attention_internal::PaddedDim;
using attention_internal::UsesNibbleOrder;

// n rows of d values: mostly normal with a per-row scale over 6 decades,
// some exact zeros and a few large outliers.
std::vector<float> TestRows(uint32_t d, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 63);
  std::vector<float> x(d * n);
  for (size_t r = 0; r < n; ++r) {
    const float scale = std::ldexp(1.0f, static_cast<int>(r % 20) - 10);
    for (uint32_t i = 0; i < d; ++i) {
      const int p = pick(rng);
      float v = normal(rng) * scale;
      if (p == 0) v = 0.0f;
      if (p == 1) v *= 40.0f;
      x[r * d + i] = v;
    }
  }
  return x;
}

// Every row of `format` at head_dim d decoded by the kernels equals the
// scalar decode (after the kernel order and value multiplier are undone).
void CheckFormat(Format format, uint32_t d) {
  SCOPED_TRACE(std::string(FormatName(format)) + " d=" + std::to_string(d));
  constexpr size_t kRows = 48;
  const size_t rb = RowBytes(format, d);
  const std::vector<float> x = TestRows(d, kRows, 1000 + d + static_cast<uint64_t>(format));
  std::vector<uint8_t> rows(rb * kRows);
  format_internal::EncodeRowsScalar(format, d, kRows, x.data(), rows.data());
  std::vector<float> want(d * kRows);
  format_internal::DecodeRowsScalar(format, d, kRows, rows.data(), want.data());
  const float mul = format == Format::kFp8E4M3 ? 256.0f : 1.0f;
  ForEachHwyTarget([&] {
    std::vector<float> got(PaddedDim(d));
    for (size_t r = 0; r < kRows; ++r) {
      std::fill(got.begin(), got.end(), std::nanf(""));
      DecodeRowForTest(format, rows.data() + r * rb, d, got.data());
      for (uint32_t i = d; i < PaddedDim(d); ++i) {
        ASSERT_EQ(got[i], 0.0f) << "row " << r << " padding " << i;
      }
      for (uint32_t i = 0; i < d; ++i) got[i] *= mul;  // exact: a power of two
      if (UsesNibbleOrder(format)) FromNibbleOrder(got.data(), d);
      for (uint32_t i = 0; i < d; ++i) {
        const float w = want[r * d + i];
        ASSERT_EQ(std::memcmp(&got[i], &w, 4), 0)
            << "row " << r << " value " << i << ": " << got[i] << " vs " << w;
      }
    }
  });
}

// Head dims per family: multiples of 32 for every format, plus tails (not a
// multiple of 16) where the format allows any head_dim.
void CheckFamily(std::initializer_list<Format> formats) {
  for (Format f : formats) {
    for (uint32_t d : {32u, 64u, 128u, 256u, 48u, 40u, 7u}) {
      if (!CheckHeadDim(f, d).ok()) continue;
      CheckFormat(f, d);
    }
  }
}

TEST(AttentionDecoders, PlainF32F16Bf16EqualScalarDecode) {
  CheckFamily({Format::kF32, Format::kF16, Format::kBF16});
}

TEST(AttentionDecoders, Fp8AndQ8EqualScalarDecode) {
  CheckFamily({Format::kFp8E4M3, Format::kQ8});
}

TEST(AttentionDecoders, GgmlQ8_0Q4_0EqualScalarDecode) {
  CheckFamily({Format::kQ8_0, Format::kQ4_0});
}

TEST(AttentionDecoders, TurboEqualScalarDecode) {
  CheckFamily({Format::kTurbo8, Format::kTurbo4, Format::kTurbo3, Format::kTurbo2,
               Format::kTurbo4I, Format::kTurbo3I, Format::kTurbo2I});
}

}  // namespace
}  // namespace kvcache
