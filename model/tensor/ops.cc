// Plain f32 row operations.
#include "model/tensor/ops.h"

#include <algorithm>
#include <cmath>

namespace kvcache::model {

void RmsNorm(const float* x, std::span<const float> weight, float* out, float eps) {
  const size_t n = weight.size();
  float ss = 0;
  for (size_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (size_t i = 0; i < n; ++i) out[i] = weight[i] * (scale * x[i]);
}

void Softmax(float* x, uint32_t n) {
  float mx = x[0];
  for (uint32_t i = 1; i < n; ++i) mx = std::max(mx, x[i]);
  float sum = 0;
  for (uint32_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  for (uint32_t i = 0; i < n; ++i) x[i] /= sum;
}

}  // namespace kvcache::model
