// The SIMD gated activations against their scalar references, on every
// Highway target this CPU runs; and the split of the values into calls
// changes no bit.
#include "model/tensor/activations.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "hwy_targets.h"

namespace kvcache::model {
namespace {

std::vector<float> Values(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

struct Gated {
  const char* name;
  void (*simd)(float*, const float*, size_t);
  float (*scalar)(float);
};
const Gated kGated[] = {{"GeGluTanh", GeGluTanh, GeluTanhScalar}, {"SwiGlu", SwiGlu, SiluScalar}};

TEST(Activations, MatchTheScalarReferencesOnEveryTarget) {
  testing::ForEachHwyTarget([] {
    for (const Gated& f : kGated) {
      for (size_t n : {1u, 7u, 16u, 33u, 2048u}) {
        SCOPED_TRACE(std::string(f.name) + " n=" + std::to_string(n));
        std::vector<float> gate = Values(n, 11 + n, 3.0f);
        // The edges: zero, both signs past the functions' saturation, tiny
        // values, a value whose exp(-x) overflows.
        const float edges[] = {0.0f, -0.0f, 12.0f, -12.0f, 30.0f, -30.0f, 1e-20f, -100.0f};
        for (size_t i = 0; i < n && i < 8; ++i) gate[i] = edges[i];
        const std::vector<float> up = Values(n, 97 + n, 1.0f);
        std::vector<float> got = gate;
        f.simd(got.data(), up.data(), n);
        for (size_t i = 0; i < n; ++i) {
          const float x = gate[i];
          const double want = static_cast<double>(f.scalar(x)) * up[i];
          // A few ULP of tanh or exp, carried through to the product.
          const double tol = 4e-7 * (std::fabs(x) + 1.0) * std::fabs(up[i]) + 1e-30;
          ASSERT_NEAR(got[i], want, tol) << "x=" << x << " up=" << up[i];
        }
      }
    }
  });
  // The references themselves.
  EXPECT_NEAR(SiluScalar(1.0f), 0.7310586f, 1e-6f);
  EXPECT_NEAR(SiluScalar(-2.0f), -0.2384058f, 1e-6f);
}

TEST(Activations, GiveTheSameBitsHoweverTheValuesAreSplit) {
  testing::ForEachHwyTarget([] {
    for (const Gated& f : kGated) {
      SCOPED_TRACE(f.name);
      const size_t n = 3 * 2048 + 5;
      const std::vector<float> gate = Values(n, 5, 2.0f), up = Values(n, 6, 1.0f);
      std::vector<float> whole = gate;
      f.simd(whole.data(), up.data(), n);
      // Rows of odd lengths at every offset: each value is the body's or a
      // padded tail's, through the same code.
      std::vector<float> pieces = gate;
      for (size_t at = 0, len = 1; at < n; at += len, len = len * 3 % 37 + 1) {
        f.simd(pieces.data() + at, up.data() + at, std::min(len, n - at));
      }
      ASSERT_EQ(0, std::memcmp(whole.data(), pieces.data(), n * sizeof(float)));
    }
  });
}

}  // namespace
}  // namespace kvcache::model
