// The randomized Walsh-Hadamard rotation of turbo rows (see turbo.h): the
// signs and the scalar reference. The SIMD rotation (rotate-inl.h, part of
// codec_simd.cc) follows the same order of operations and is bit-identical.
//
// Thread safety: pure functions.
#include <cmath>
#include <cstdint>
#include <vector>

#include "format/turbo/turbo.h"

namespace kvcache {
namespace format_internal {

std::vector<float> RotationSigns(uint64_t seed, uint32_t head_dim) {
  std::vector<float> s(head_dim);
  uint64_t state = seed;
  for (uint32_t i = 0; i < head_dim; ++i) {
    // SplitMix64.
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    s[i] = (z >> 63) ? -1.0f : 1.0f;
  }
  return s;
}

namespace {
void ScalarTransformBlocks(uint32_t head_dim, float* x) {
  for (uint32_t off = 0; off < head_dim;) {
    const uint32_t b = RotationBlockAt(head_dim - off);
    float* blk = x + off;
    for (uint32_t half = 1; half < b; half *= 2) {
      for (uint32_t base = 0; base < b; base += 2 * half) {
        for (uint32_t k = 0; k < half; ++k) {
          const float a = blk[base + k], bb = blk[base + half + k];
          blk[base + k] = a + bb;
          blk[base + half + k] = a - bb;
        }
      }
    }
    const float s = 1.0f / std::sqrt(static_cast<float>(b));
    for (uint32_t i = 0; i < b; ++i) blk[i] *= s;
    off += b;
  }
}
}  // namespace

void RotateInPlaceScalar(const float* signs, uint32_t head_dim, float* x) {
  for (uint32_t i = 0; i < head_dim; ++i) x[i] *= signs[i];
  ScalarTransformBlocks(head_dim, x);
}
void InverseRotateInPlaceScalar(const float* signs, uint32_t head_dim, float* x) {
  ScalarTransformBlocks(head_dim, x);
  for (uint32_t i = 0; i < head_dim; ++i) x[i] *= signs[i];
}

}  // namespace format_internal
}  // namespace kvcache
