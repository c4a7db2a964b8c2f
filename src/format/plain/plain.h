// The plain float formats: f32, f16 and bf16, one value per element.
//
// Row layouts (d = head_dim, little-endian, offsets from the row start):
//   f32       [0, 4d)  d x float
//   f16/bf16  [0, 2d)  d x uint16 (IEEE binary16 / bfloat16, kvcache/float16.h)
//
// This family's files: plain.h (layout, scalar reference), scalar.cc (the
// reference rows), encode-inl.h (SIMD encoder, part of codec_simd.cc) and
// decode-inl.h (Decoder<kF32/kF16/kBF16>, part of format/decoders-inl.h).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <cstring>

#include "format/row_layout.h"

namespace kvcache {
namespace format_internal {

// Scalar reference rows of f32, f16 and bf16 (other formats: no-op).
void EncodePlainRow(Format format, uint32_t d, const float* x, uint8_t* out);
void DecodePlainRow(Format format, uint32_t d, const uint8_t* in, float* x);

// True when the 16 f16 values at p32 include an infinity or a NaN ((h &
// 0x7FFF) >= 0x7C00), four values per 64-bit word: adding 0x400 to a 15-bit
// lane sets its bit 15 exactly when the lane is at least 0x7C00, and cannot
// carry out of the lane.
inline bool HasF16InfOrNaN(const uint8_t* p32) {
  uint64_t any = 0;
  for (int i = 0; i < 4; ++i) {
    uint64_t w;
    std::memcpy(&w, p32 + 8 * i, 8);
    any |= (w & 0x7FFF7FFF7FFF7FFFull) + 0x0400040004000400ull;
  }
  return (any & 0x8000800080008000ull) != 0;
}

}  // namespace format_internal
}  // namespace kvcache
