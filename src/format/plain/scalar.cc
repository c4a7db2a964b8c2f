// Scalar reference rows of the plain float formats (see plain.h). The SIMD
// encoder (encode-inl.h) and decoder (decode-inl.h) reproduce them bit for bit.
//
// Thread safety: pure functions.
#include <cstring>

#include "format/plain/plain.h"

namespace kvcache {
namespace format_internal {

void EncodePlainRow(Format f, uint32_t d, const float* x, uint8_t* out) {
  switch (f) {
    case Format::kF32: std::memcpy(out, x, 4ull * d); return;
    case Format::kF16:
      for (uint32_t i = 0; i < d; ++i) StoreU16(FloatToF16(x[i]), out + 2 * i);
      return;
    case Format::kBF16:
      for (uint32_t i = 0; i < d; ++i) StoreU16(FloatToBF16(x[i]), out + 2 * i);
      return;
    default: return;
  }
}

void DecodePlainRow(Format f, uint32_t d, const uint8_t* in, float* x) {
  switch (f) {
    case Format::kF32: std::memcpy(x, in, 4ull * d); return;
    case Format::kF16:
      for (uint32_t i = 0; i < d; ++i) x[i] = F16ToFloat(LoadU16(in + 2 * i));
      return;
    case Format::kBF16:
      for (uint32_t i = 0; i < d; ++i) x[i] = BF16ToFloat(LoadU16(in + 2 * i));
      return;
    default: return;
  }
}

}  // namespace format_internal
}  // namespace kvcache
