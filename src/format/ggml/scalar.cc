// Scalar reference rows of q8_0 and q4_0 (see ggml.h): llama.cpp's
// quantize_row_q8_0_ref / quantize_row_q4_0_ref arithmetic. The SIMD encoder
// (encode-inl.h) and decoder (decode-inl.h) reproduce them bit for bit.
//
// Floating-point contraction is disabled (as in codec_simd.cc) so that
// "x * id + 8.5" rounds the same way in every build and on every target.
//
// Thread safety: pure functions.
#pragma GCC optimize("fp-contract=off")

#include <algorithm>
#include <cmath>

#include "format/ggml/ggml.h"

namespace kvcache {
namespace format_internal {
namespace {

// Clamp-and-convert used where llama.cpp would cast an out-of-range float
// (only reachable with a subnormal scale whose reciprocal overflows).
inline int ClampToInt(float v, int lo, int hi) {
  if (!(v >= static_cast<float>(lo))) return (v != v) ? 0 : lo;
  if (v > static_cast<float>(hi)) return hi;
  return static_cast<int>(v);
}

// quantize_row_q8_0_ref: codes from the unrounded f32 d.
void EncodeQ8_0Block(const float* xb, uint8_t* ob) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
  const float dd = amax / 127.0f;
  const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
  StoreU16(FloatToF16(dd), ob);
  for (int j = 0; j < 32; ++j) {
    ob[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(ClampToInt(std::round(xb[j] * id), -127, 127)));
  }
}

// quantize_row_q4_0_ref: d from the block's first value of largest magnitude.
void EncodeQ4_0Block(const float* xb, uint8_t* ob) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < 32; ++j) {
    if (amax < std::fabs(xb[j])) {
      amax = std::fabs(xb[j]);
      max = xb[j];
    }
  }
  const float dd = max / -8.0f;
  const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
  StoreU16(FloatToF16(dd), ob);
  for (int j = 0; j < 16; ++j) {
    const int q0 = std::min(15, ClampToInt(xb[j] * id + 8.5f, 0, 255));
    const int q1 = std::min(15, ClampToInt(xb[j + 16] * id + 8.5f, 0, 255));
    ob[2 + j] = static_cast<uint8_t>(q0 | (q1 << 4));
  }
}

}  // namespace

void EncodeGgmlRow(Format f, uint32_t d, const float* x, uint8_t* out) {
  for (uint32_t b = 0; b < d / 32; ++b) {
    if (f == Format::kQ8_0) EncodeQ8_0Block(x + 32 * b, out + 34 * b);
    if (f == Format::kQ4_0) EncodeQ4_0Block(x + 32 * b, out + 18 * b);
  }
}

void DecodeGgmlRow(Format f, uint32_t d, const uint8_t* in, float* x) {
  for (uint32_t b = 0; b < d / 32; ++b) {
    if (f == Format::kQ8_0) DecodeQ8_0Block(in + 34 * b, x + 32 * b);
    if (f == Format::kQ4_0) DecodeQ4_0Block(in + 18 * b, x + 32 * b);
  }
}

}  // namespace format_internal
}  // namespace kvcache
