// The byte-per-value formats: fp8_e4m3 and q8. The E4M3 conversions here
// also serve turbo8's codes and turbo4/3/2's group scales (format/turbo).
//
// Row layouts (d = head_dim, little-endian, offsets from the row start):
//   fp8_e4m3  [0, d)    d x E4M3 byte
//   q8        [0, d)    d x int8 code; [d, d+4) f32 row scale (unaligned:
//                       read with memcpy). value = scale * code
//                       (keys: then times col_scale[i], plus mean[i]).
//
// This family's files: fp8_q8.h (layout, scalar reference), scalar.cc (the
// reference rows), encode-inl.h (SIMD encoder, part of codec_simd.cc) and
// decode-inl.h (Decoder<kFp8E4M3/kQ8>, part of format/decoders-inl.h).
//
// Thread safety: pure functions and constant data.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <limits>

#include "format/row_layout.h"

namespace kvcache {
namespace format_internal {

// OCP E4M3 "fn": sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities;
// 0x7F and 0xFF are NaN; max normal 448 (0x7E); subnormals m * 2^-9.
constexpr uint8_t kE4M3NaN = 0x7F;
constexpr float kE4M3Max = 448.0f;

constexpr float E4M3ToFloatCompute(uint8_t c) {
  const bool neg = (c & 0x80) != 0;
  const int exp = (c >> 3) & 0xF;
  const int man = c & 0x7;
  if (exp == 15 && man == 7) return std::numeric_limits<float>::quiet_NaN();
  float v = 0.0f;
  if (exp == 0) {
    v = static_cast<float>(man) / 512.0f;  // m * 2^-9
  } else {
    float p = 1.0f;
    for (int e = 7; e < exp; ++e) p *= 2.0f;
    for (int e = exp; e < 7; ++e) p /= 2.0f;
    v = p * (1.0f + static_cast<float>(man) / 8.0f);
  }
  return neg ? -v : v;
}

constexpr std::array<float, 256> MakeE4M3Table() {
  std::array<float, 256> t{};
  for (int c = 0; c < 256; ++c) t[c] = E4M3ToFloatCompute(static_cast<uint8_t>(c));
  return t;
}
// Every code's exact value (NaN for 0x7F/0xFF).
inline constexpr std::array<float, 256> kE4M3ToFloat = MakeE4M3Table();

inline float E4M3ToFloat(uint8_t c) { return kE4M3ToFloat[c]; }

// f32 -> E4M3, round to nearest even, saturating to +-448 (inf too); NaN -> 0x7F
// (sign kept: 0xFF for negative NaN).
inline uint8_t FloatToE4M3(float f) {
  const uint32_t u = FloatBits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | kE4M3NaN;
  if (a >= 0x43E00000u) return sign | 0x7E;  // >= 448 (incl. inf): saturate
  if (a < 0x3C800000u) {                      // below 2^-6: subnormal range, step 2^-9
    const float v = BitsFloat(a) * 512.0f;    // exact
    const float r = (v + 8388608.0f) - 8388608.0f;  // RNE to integer, 0..8
    return sign | static_cast<uint8_t>(static_cast<uint32_t>(r));  // 8 -> 0x08 = 2^-6, correct
  }
  // Normal: exponent rebias 127 -> 7, keep 3 mantissa bits, RNE on 20 dropped bits.
  const uint32_t rebased = a - (120u << 23);
  const uint32_t round = 0x7FFFFu + ((rebased >> 20) & 1u);
  uint32_t r = (rebased + round) >> 20;
  if (r > 0x7E) r = 0x7E;  // 448 < a < 464 rounds to 448 (464 would be NaN code)
  return sign | static_cast<uint8_t>(r);
}

// True when the 16 E4M3 codes at p16 include a NaN code (c & 0x7F == 0x7F),
// eight per 64-bit word: adding 1 to a 7-bit lane sets its bit 7 exactly
// when the lane is 0x7F, and cannot carry out of the lane.
inline bool HasE4M3NaN(const uint8_t* p16) {
  uint64_t a, b;
  std::memcpy(&a, p16, 8);
  std::memcpy(&b, p16 + 8, 8);
  constexpr uint64_t kLow7 = 0x7F7F7F7F7F7F7F7Full, kOne = 0x0101010101010101ull;
  const uint64_t hit = ((a & kLow7) + kOne) | ((b & kLow7) + kOne);
  return (hit & 0x8080808080808080ull) != 0;
}

// q8 row scale (f32 at offset d).
inline float Q8RowScale(const uint8_t* row, uint32_t d) {
  float s;
  std::memcpy(&s, row + d, 4);
  return s;
}

// Scalar reference rows of fp8_e4m3 and q8 (other formats: no-op).
void EncodeFp8Q8Row(Format format, uint32_t d, const float* x, uint8_t* out);
void DecodeFp8Q8Row(Format format, uint32_t d, const uint8_t* in, float* x);

}  // namespace format_internal
}  // namespace kvcache
