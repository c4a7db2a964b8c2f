// Scalar reference encoders/decoders for every format, on prepared rows (see
// format_internal.h): each family's reference (format/<family>/scalar.cc),
// picked by format. These define the bytes each format stores; the SIMD
// kernels in codec_simd.cc must reproduce them exactly, and the tests check it.
//
// Thread safety: pure functions.
#include "format/format_internal.h"

namespace kvcache {
namespace format_internal {
namespace {

RowEncodeFn ScalarEncoder(Format f) {
  switch (f) {
    case Format::kF32:
    case Format::kF16:
    case Format::kBF16: return EncodePlainRow;
    case Format::kFp8E4M3:
    case Format::kQ8: return EncodeFp8Q8Row;
    case Format::kTurbo8:
    case Format::kTurbo4:
    case Format::kTurbo4I:
    case Format::kTurbo3:
    case Format::kTurbo2:
    case Format::kTurbo3I:
    case Format::kTurbo2I: return EncodeTurboRow;
    case Format::kQ8_0:
    case Format::kQ4_0: break;
  }
  return EncodeGgmlRow;
}

RowDecodeFn ScalarDecoder(Format f) {
  switch (f) {
    case Format::kF32:
    case Format::kF16:
    case Format::kBF16: return DecodePlainRow;
    case Format::kFp8E4M3:
    case Format::kQ8: return DecodeFp8Q8Row;
    case Format::kTurbo8:
    case Format::kTurbo4:
    case Format::kTurbo4I:
    case Format::kTurbo3:
    case Format::kTurbo2:
    case Format::kTurbo3I:
    case Format::kTurbo2I: return DecodeTurboRow;
    case Format::kQ8_0:
    case Format::kQ4_0: break;
  }
  return DecodeGgmlRow;
}

}  // namespace

void EncodeRowsScalar(Format f, uint32_t d, size_t n, const float* x, uint8_t* out) {
  const RowEncodeFn encode = ScalarEncoder(f);
  const size_t rb = RowBytes(f, d);
  for (size_t r = 0; r < n; ++r) encode(f, d, x + r * d, out + r * rb);
}

void DecodeRowsScalar(Format f, uint32_t d, size_t n, const uint8_t* in, float* x) {
  const RowDecodeFn decode = ScalarDecoder(f);
  const size_t rb = RowBytes(f, d);
  for (size_t r = 0; r < n; ++r) decode(f, d, in + r * rb, x + r * d);
}

}  // namespace format_internal
}  // namespace kvcache
