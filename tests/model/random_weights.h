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

// rows x cols of random codes of a quantized type with scales of
// real-model magnitude: Q4_1 d in [0.001, 0.05], m in [-0.4, 0]; Q8_0 d in
// [0.0005, 0.01]; Q5_0 d in [0.001, 0.02]; Q4_K d and dmin in [0.0002,
// 0.002] (times 6-bit sub-block scales and mins); Q6_K d in [0.0001, 0.001]
// (times int8 sub-block scales). The codes and the K types' sub-block
// scales are random bytes.
inline std::vector<uint8_t> RandomQuantMatrix(GgmlType t, uint32_t rows, uint32_t cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const GgmlTypeSize size = GgmlTypeSizeOf(t);
  const size_t bb = size.block_bytes;
  std::vector<uint8_t> b(static_cast<size_t>(rows) * cols / size.block_values * bb);
  for (uint8_t& x : b) x = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> u(0, 1);
  auto put = [](uint8_t* p, float v) {
    const uint16_t h = FloatToF16(v);
    std::memcpy(p, &h, 2);
  };
  for (size_t blk = 0; blk < b.size() / bb; ++blk) {
    uint8_t* p = &b[blk * bb];
    switch (t) {
      case GgmlType::kQ4_1:
        put(p, 0.001f + 0.049f * u(rng));
        put(p + 2, -0.4f * u(rng));
        break;
      case GgmlType::kQ5_0:
        put(p, 0.001f + 0.019f * u(rng));
        break;
      case GgmlType::kQ4_K:
        put(p, 0.0002f + 0.0018f * u(rng));
        put(p + 2, 0.0002f + 0.0018f * u(rng));
        break;
      case GgmlType::kQ6_K:
        put(p + 208, 0.0001f + 0.0009f * u(rng));
        break;
      default:  // Q8_0
        put(p, 0.0005f + 0.0095f * u(rng));
        break;
    }
  }
  return b;
}

// Bytes of one row of `cols` values of t.
inline size_t QuantRowBytes(GgmlType t, uint32_t cols) {
  const GgmlTypeSize s = GgmlTypeSizeOf(t);
  return static_cast<size_t>(cols) / s.block_values * s.block_bytes;
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
