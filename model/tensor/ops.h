// Plain f32 row operations shared by the architectures, the decoder and
// sampling.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <span>

namespace kvcache::model {

// out = weight * x / sqrt(mean(x^2) + eps).
void RmsNorm(const float* x, std::span<const float> weight, float* out, float eps = 1e-5f);
// In-place softmax over n values.
void Softmax(float* x, uint32_t n);

}  // namespace kvcache::model
