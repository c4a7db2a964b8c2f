// Scalar reference encoders/decoders for every format, on prepared rows (see
// format_internal.h): each family's reference (format/<family>/scalar.cc),
// picked by the format's family (format/traits.h). These define the bytes
// each format stores; the SIMD kernels in codec_simd.cc must reproduce them
// exactly, and the tests check it.
//
// Thread safety: pure functions.
#include "format/format_internal.h"

namespace kvcache {
namespace format_internal {
namespace {

// Each family's scalar reference rows, by Family.
struct ScalarFamily {
  RowEncodeFn encode;
  RowDecodeFn decode;
};
constexpr ScalarFamily kScalarFamilies[kNumFamilies] = {
    {EncodePlainRow, DecodePlainRow},  // Family::kPlain
    {EncodeFp8Q8Row, DecodeFp8Q8Row},  // Family::kFp8Q8
    {EncodeTurboRow, DecodeTurboRow},  // Family::kTurbo
    {EncodeGgmlRow, DecodeGgmlRow},    // Family::kGgml
};
const ScalarFamily& ScalarOf(Format f) { return kScalarFamilies[static_cast<size_t>(FamilyOf(f))]; }

}  // namespace

void EncodeRowsScalar(Format f, uint32_t d, size_t n, const float* x, uint8_t* out) {
  const RowEncodeFn encode = ScalarOf(f).encode;
  const size_t rb = RowBytes(f, d);
  for (size_t r = 0; r < n; ++r) encode(f, d, x + r * d, out + r * rb);
}

void DecodeRowsScalar(Format f, uint32_t d, size_t n, const uint8_t* in, float* x) {
  const RowDecodeFn decode = ScalarOf(f).decode;
  const size_t rb = RowBytes(f, d);
  for (size_t r = 0; r < n; ++r) decode(f, d, in + r * rb, x + r * d);
}

}  // namespace format_internal
}  // namespace kvcache
