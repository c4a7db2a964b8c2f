// Random weight matrices and activations for the weight-product tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kvcache/float16.h"
#include "model/tensor/ggml_type.h"

namespace kvcache::model {

// rows x cols of random Q4_1 or Q8_0 codes with scales of real-model
// magnitude (Q4_1: d in [0.001, 0.05], m in [-0.4, 0]; Q8_0: d in
// [0.0005, 0.01]).
inline std::vector<uint8_t> RandomQuantMatrix(GgmlType t, uint32_t rows, uint32_t cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const size_t bb = t == GgmlType::kQ4_1 ? 20 : 34;
  std::vector<uint8_t> b(static_cast<size_t>(rows) * cols / 32 * bb);
  for (uint8_t& x : b) x = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> u(0, 1);
  for (size_t blk = 0; blk < b.size() / bb; ++blk) {
    uint8_t* p = &b[blk * bb];
    const uint16_t d = FloatToF16(t == GgmlType::kQ4_1 ? 0.001f + 0.049f * u(rng) : 0.0005f + 0.0095f * u(rng));
    std::memcpy(p, &d, 2);
    if (t == GgmlType::kQ4_1) {
      const uint16_t m = FloatToF16(-0.4f * u(rng));
      std::memcpy(p + 2, &m, 2);
    }
  }
  return b;
}

// n normal activations with one outlier channel, as real activations have.
inline std::vector<float> RandomInputs(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> x(n);
  for (float& v : x) v = nd(rng);
  x[0] = 40.0f;
  return x;
}

}  // namespace kvcache::model
