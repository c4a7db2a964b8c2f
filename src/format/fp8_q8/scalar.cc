// Scalar reference rows of fp8_e4m3 and q8 (see fp8_q8.h). The SIMD encoder
// (encode-inl.h) and decoder (decode-inl.h) reproduce them bit for bit.
//
// Thread safety: pure functions.
#pragma GCC optimize("fp-contract=off")

#include <algorithm>
#include <cmath>
#include <cstring>

#include "format/fp8_q8/fp8_q8.h"

namespace kvcache {
namespace format_internal {

void EncodeFp8Q8Row(Format f, uint32_t d, const float* x, uint8_t* out) {
  if (f == Format::kFp8E4M3) {
    for (uint32_t i = 0; i < d; ++i) out[i] = FloatToE4M3(x[i]);
    return;
  }
  if (f != Format::kQ8) return;
  float amax = 0.0f;
  for (uint32_t i = 0; i < d; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float s = amax / 127.0f;
  for (uint32_t i = 0; i < d; ++i) {
    const float q = s == 0.0f ? 0.0f : std::nearbyint(x[i] / s);
    out[i] = static_cast<uint8_t>(static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f)));
  }
  std::memcpy(out + d, &s, 4);
}

void DecodeFp8Q8Row(Format f, uint32_t d, const uint8_t* in, float* x) {
  if (f == Format::kFp8E4M3) {
    for (uint32_t i = 0; i < d; ++i) x[i] = kE4M3ToFloat[in[i]];
    return;
  }
  if (f != Format::kQ8) return;
  const float s = Q8RowScale(in, d);
  for (uint32_t i = 0; i < d; ++i) x[i] = s * static_cast<float>(static_cast<int8_t>(in[i]));
}

}  // namespace format_internal
}  // namespace kvcache
