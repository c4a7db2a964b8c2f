// The llama.cpp (ggml) block formats: q8_0 and q4_0, 32 values per block
// behind an f16 scale, encoded with llama.cpp's reference arithmetic.
//
// Row layouts (d = head_dim, a multiple of 32; little-endian):
//   q8_0  d/32 blocks of 34 bytes: f16 d, then 32 x int8. value = d * q
//   q4_0  d/32 blocks of 18 bytes: f16 d, then 16 bytes; byte j holds value j
//         (low nibble) and value j+16 (high nibble). value = d * (q - 8)
//
// This family's files: ggml.h (layout, scalar reference), scalar.cc (the
// reference rows), encode-inl.h (SIMD encoder, part of codec_simd.cc) and
// decode-inl.h (Decoder<kQ8_0/kQ4_0>, part of format/decoders-inl.h).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>

#include "format/row_layout.h"

namespace kvcache {
namespace format_internal {

// One block (34 / 18 bytes) -> 32 values.
inline void DecodeQ8_0Block(const uint8_t* block34, float* out32) {
  const float d = F16ToFloat(LoadU16(block34));
  for (int i = 0; i < 32; ++i) out32[i] = d * static_cast<float>(static_cast<int8_t>(block34[2 + i]));
}
inline void DecodeQ4_0Block(const uint8_t* block18, float* out32) {
  const float d = F16ToFloat(LoadU16(block18));
  for (int j = 0; j < 16; ++j) {
    out32[j] = d * static_cast<float>((block18[2 + j] & 0xF) - 8);
    out32[j + 16] = d * static_cast<float>((block18[2 + j] >> 4) - 8);
  }
}

// Scalar reference rows of q8_0 and q4_0 (other formats: no-op).
void EncodeGgmlRow(Format format, uint32_t d, const float* x, uint8_t* out);
void DecodeGgmlRow(Format format, uint32_t d, const uint8_t* in, float* x);

}  // namespace format_internal
}  // namespace kvcache
