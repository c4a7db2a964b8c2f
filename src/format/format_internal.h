// Private facts about stored rows, for code that reads them directly (the
// fused attention kernels) and for the codecs themselves.
//
// What is here: the exact byte layout of one stored row of every format
// (RowLayout), scalar conversions for one value (f16/bf16/E4M3 <-> f32, round
// to nearest even), scalar decoders for one group of each blocked format, the
// turbo codebooks, and the Walsh-Hadamard rotation.
//
// Row layouts (d = head_dim, all little-endian, offsets from the row start):
//
//   f32       [0, 4d)        d x float
//   f16/bf16  [0, 2d)        d x uint16
//   fp8_e4m3  [0, d)         d x E4M3 byte
//   q8        [0, d)         d x int8 code; [d, d+4) f32 row scale (unaligned:
//                            read with memcpy). value = scale * code
//                            (keys: then times col_scale[i], plus mean[i]).
//   turbo8    [0, d)         d x E4M3 code (group g = bytes [16g, 16g+16));
//             [d, d + 2d/16) d/16 x bf16 group scale. value = scale * E4M3(code)
//   turbo4    [0, d/2)       byte j of group g (at 8g + j) holds value 2j in its low
//                            nibble and value 2j+1 in its high nibble;
//             [d/2, d/2 + d/16) d/16 x E4M3 group scale.
//                            value = scale * kTurbo4Levels[code]
//   turbo3    [0, 6d/16)     group g: bytes [6g, 6g+6) are one little-endian 48-bit
//                            word, code i at bits 3i..3i+2;
//             [6d/16, 7d/16) d/16 x E4M3 group scale. value = scale * kTurbo3Levels[code]
//   turbo2    [0, d/4)       group g: bytes [4g, 4g+4), code i at bits 2(i%4)
//                            of byte 4g + i/4;
//             [d/4, d/4 + d/16) d/16 x E4M3 group scale. value = scale * kTurbo2Levels[code]
//   q8_0      d/32 blocks of 34 bytes: f16 d, then 32 x int8. value = d * q
//   q4_0      d/32 blocks of 18 bytes: f16 d, then 16 bytes; byte j holds value j
//             (low nibble) and value j+16 (high nibble). value = d * (q - 8)
//
// Turbo values are in the ROTATED space (after mean subtraction): a kernel
// rotates the query with the same rotation (q.k is unchanged) and applies
// InverseRotate once to an output accumulated from rotated values.
//
// Thread safety: everything here is a pure function or constant data.
#pragma once

#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kvcache/codec.h"
#include "kvcache/format.h"

namespace kvcache {
namespace format_internal {

// ---------------------------------------------------------------------------
// Row layout.

struct RowLayout {
  uint32_t group_size = 1;     // values per scale (1: no scale / one per row for q8)
  size_t codes_offset = 0;     // where the codes start (0 for every format)
  size_t codes_bytes = 0;      // bytes of codes per row (q8_0/q4_0: whole row)
  size_t scales_offset = 0;    // where the per-group scales start (== codes_bytes)
  size_t scale_bytes = 0;      // bytes of one scale (0: none; q8: 4; turbo8: 2; turbo4/3/2: 1)
  size_t group_code_bytes = 0; // bytes of codes per group (turbo8 16, turbo4 8, turbo3 6,
                               // turbo2 4, q8_0 34 and q4_0 18 for a whole block incl. d)
};

// REQUIRES: CheckHeadDim(format, d) ok.
inline RowLayout LayoutOf(Format format, uint32_t d) {
  RowLayout l;
  l.group_size = GroupSize(format);
  switch (format) {
    case Format::kF32: l.codes_bytes = 4ull * d; break;
    case Format::kF16:
    case Format::kBF16: l.codes_bytes = 2ull * d; break;
    case Format::kFp8E4M3: l.codes_bytes = d; break;
    case Format::kQ8:
      l.group_size = d;
      l.codes_bytes = d;
      l.scale_bytes = 4;
      l.group_code_bytes = d;
      break;
    case Format::kTurbo8: l.codes_bytes = d; l.scale_bytes = 2; l.group_code_bytes = 16; break;
    case Format::kTurbo4: l.codes_bytes = d / 2; l.scale_bytes = 1; l.group_code_bytes = 8; break;
    case Format::kTurbo3: l.codes_bytes = 6ull * (d / 16); l.scale_bytes = 1; l.group_code_bytes = 6; break;
    case Format::kTurbo2: l.codes_bytes = d / 4; l.scale_bytes = 1; l.group_code_bytes = 4; break;
    case Format::kQ8_0: l.codes_bytes = 34ull * (d / 32); l.group_code_bytes = 34; break;
    case Format::kQ4_0: l.codes_bytes = 18ull * (d / 32); l.group_code_bytes = 18; break;
  }
  l.scales_offset = l.codes_bytes;
  return l;
}

// ---------------------------------------------------------------------------
// Scalar conversions (exact reference; SIMD paths must match them bit for bit).

inline uint32_t FloatBits(float f) { return std::bit_cast<uint32_t>(f); }
inline float BitsFloat(uint32_t u) { return std::bit_cast<float>(u); }

// IEEE binary16 -> f32, exact.
inline float F16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  const uint32_t man = h & 0x3FF;
  if (exp == 0) {
    // zero or subnormal: man * 2^-24
    const float v = static_cast<float>(man) * 5.9604644775390625e-8f;
    return BitsFloat(FloatBits(v) | sign);
  }
  if (exp == 31) return BitsFloat(sign | 0x7F800000u | (man << 13));  // inf / NaN (payload kept)
  return BitsFloat(sign | ((exp + 112) << 23) | (man << 13));
}

// f32 -> IEEE binary16, round to nearest even; overflow -> inf; NaN -> quiet NaN
// (payload's top bits kept, quiet bit set).
inline uint16_t FloatToF16(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a >= 0x7F800000u) {  // inf or NaN
    if (a == 0x7F800000u) return sign | 0x7C00u;
    return sign | 0x7E00u | static_cast<uint16_t>((a >> 13) & 0x3FFu);
  }
  if (a >= 0x477FF000u) return sign | 0x7C00u;  // >= 65520 rounds to inf
  if (a < 0x38800000u) {                         // below 2^-14: subnormal or zero
    // value / 2^-24 rounded to nearest even, done in float (exact: the result
    // fits 11 bits and the float add rounds RNE).
    const float v = BitsFloat(a) * 16777216.0f;  // * 2^24, exact
    // Round to an integer with RNE: adding 2^23 then subtracting is exact RNE for v < 2^23.
    const float r = (v + 8388608.0f) - 8388608.0f;
    return sign | static_cast<uint16_t>(static_cast<uint32_t>(r));
  }
  // Normal: rebias exponent, RNE on the 13 dropped bits (carry may bump exponent,
  // which is correct, including into inf at the top handled above).
  const uint32_t rebased = a - (112u << 23);
  const uint32_t round = 0xFFFu + ((rebased >> 13) & 1u);
  return sign | static_cast<uint16_t>((rebased + round) >> 13);
}

inline float BF16ToFloat(uint16_t b) { return BitsFloat(static_cast<uint32_t>(b) << 16); }

// f32 -> bf16, round to nearest even; overflow rounds to inf naturally; NaN ->
// quiet NaN with its sign and top payload bits.
inline uint16_t FloatToBF16(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  const uint32_t round = 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + round) >> 16);
}

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

// ---------------------------------------------------------------------------
// Turbo codebooks: levels in ascending order, code = index. Symmetric
// (level[n-1-i] == -level[i]). A group's stored scale s multiplies them; the
// encoder picks s (rounded to E4M3 first) and the nearest level per value.
// See docs/formats.md for how they were fitted and their measured error.

inline constexpr std::array<float, 16> kTurbo4Levels = {
    -1.0630157f, -0.8529882f, -0.6673639f, -0.5176435f, -0.3846969f, -0.2639617f,
    -0.1540296f, -0.0507288f, 0.0507288f,  0.1540296f,  0.2639617f,  0.3846969f,
    0.5176435f,  0.6673639f,  0.8529882f,  1.0630157f};
inline constexpr std::array<float, 8> kTurbo3Levels = {
    -0.9565287f, -0.5790571f, -0.3191016f, -0.1023969f,
    0.1023969f,  0.3191016f,  0.5790571f,  0.9565287f};
inline constexpr std::array<float, 4> kTurbo2Levels = {-0.7343107f, -0.2058505f, 0.2058505f,
                                                       0.7343107f};

// Encoder scale rule for turbo4/3/2: c0 = E4M3(amax of the group); try the
// stored scales c0-kTurboScaleSearch .. c0+kTurboScaleSearch (valid codes
// 1..0x7E), pick the one whose nearest-level reconstruction has the least
// squared error (first on ties). Codes are the nearest level to x / s (an exact
// tie between two levels goes to the smaller magnitude). An all-zero group
// stores scale 0 and codes 0.
inline constexpr int kTurboScaleSearch = 2;

// ---------------------------------------------------------------------------
// Scalar group decoders (reference; one group of 16 values, rotated space).

inline void DecodeTurbo8Group(const uint8_t* codes16, uint16_t scale_bf16, float* out16) {
  const float s = BF16ToFloat(scale_bf16);
  for (int i = 0; i < 16; ++i) out16[i] = s * kE4M3ToFloat[codes16[i]];
}
inline void DecodeTurbo4Group(const uint8_t* codes8, uint8_t scale_e4m3, float* out16) {
  const float s = E4M3ToFloat(scale_e4m3);
  for (int j = 0; j < 8; ++j) {
    out16[2 * j] = s * kTurbo4Levels[codes8[j] & 0xF];
    out16[2 * j + 1] = s * kTurbo4Levels[codes8[j] >> 4];
  }
}
inline uint64_t LoadLe48(const uint8_t* p) {
  uint64_t w = 0;
  for (int b = 0; b < 6; ++b) w |= static_cast<uint64_t>(p[b]) << (8 * b);
  return w;
}
inline void DecodeTurbo3Group(const uint8_t* codes6, uint8_t scale_e4m3, float* out16) {
  const float s = E4M3ToFloat(scale_e4m3);
  const uint64_t w = LoadLe48(codes6);
  for (int i = 0; i < 16; ++i) out16[i] = s * kTurbo3Levels[(w >> (3 * i)) & 7];
}
inline void DecodeTurbo2Group(const uint8_t* codes4, uint8_t scale_e4m3, float* out16) {
  const float s = E4M3ToFloat(scale_e4m3);
  for (int i = 0; i < 16; ++i) out16[i] = s * kTurbo2Levels[(codes4[i / 4] >> (2 * (i % 4))) & 3];
}
// One llama.cpp block (34 / 18 bytes) -> 32 values.
inline uint16_t LoadU16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
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
// q8 row scale (f32 at offset d).
inline float Q8RowScale(const uint8_t* row, uint32_t d) {
  float s;
  std::memcpy(&s, row + d, 4);
  return s;
}

// ---------------------------------------------------------------------------
// Rotation: x -> H_blocks * (signs ⊙ x). head_dim (a multiple of 16) is split
// greedily into power-of-two blocks, largest first (128 -> 128; 96 -> 64+32;
// 80 -> 64+16); each block gets an unnormalized fast Walsh-Hadamard transform
// scaled by 1/sqrt(block). The transform is orthonormal, so q.k is preserved
// when both sides are rotated. Inverse: the same blocks' transform (it is its
// own inverse), then multiply by the signs.

// The +-1 signs for a seed: [head_dim], deterministic (SplitMix64 bits).
std::vector<float> RotationSigns(uint64_t seed, uint32_t head_dim);

// In place on x[head_dim]. SIMD, dispatched once per call.
void RotateInPlace(const float* signs, uint32_t head_dim, float* x);
void InverseRotateInPlace(const float* signs, uint32_t head_dim, float* x);
// Many rows: x[n][head_dim], one dispatch.
void RotateRows(const float* signs, uint32_t head_dim, size_t n, float* x);
void InverseRotateRows(const float* signs, uint32_t head_dim, size_t n, float* x);

// Scalar references.
void RotateInPlaceScalar(const float* signs, uint32_t head_dim, float* x);
void InverseRotateInPlaceScalar(const float* signs, uint32_t head_dim, float* x);

// ---------------------------------------------------------------------------
// Whole-row kernels on prepared rows: x[n][d] is already in storage space (mean
// subtracted, column scales divided out, rotated for turbo) and finite.
// out/in are [n][RowBytes(format, d)]. The dispatched versions are SIMD and
// produce bytes (and floats) identical to the scalar references.
void EncodeRows(Format format, uint32_t d, size_t n, const float* x, uint8_t* out);
void DecodeRows(Format format, uint32_t d, size_t n, const uint8_t* in, float* x);
// Index of the first NaN/Inf in x[0, n), or n. SIMD.
size_t FirstNonFinite(const float* x, size_t n);
void EncodeRowsScalar(Format format, uint32_t d, size_t n, const float* x, uint8_t* out);
// EncodeRows of row i of x[n][d] into dst[i] (RowBytes(format, d) bytes each),
// one dispatch for all n rows: the append path's rows go to n different heads.
void EncodeRowsScattered(Format format, uint32_t d, size_t n, const float* x,
                         uint8_t* const* dst);

// The append path's encode: row i of x[n][head_dim] (finite: the caller has
// checked) with transform tf[i] (tf == nullptr, or tf[i] nullptr or empty:
// none) into dst[i]. Writes the bytes codec.Encode writes for each row, with
// one dispatch for all rows and no allocation once this thread's scratch has
// grown. InvalidArgument (Encode's messages, row = the index i) for a
// transform Encode would refuse or a value that overflows after its
// transform; rows may have been written by then.
Status EncodeHeadRows(const RowCodec& codec, size_t n, const float* x, uint8_t* const* dst,
                      const RowTransform* const* tf);
void DecodeRowsScalar(Format format, uint32_t d, size_t n, const uint8_t* in, float* x);

// For tests: the non-negative level the turbo4/3/2 scale search (dispatched,
// SIMD) takes for |x| = a[i] under scale s[i] (an E4M3 value in [2^-9, 448]);
// it must equal the level of NearestCode(a[i] / s[i]) in codec_scalar.cc.
void TurboSearchLevels(Format format, size_t n, const float* a, const float* s, float* level);

}  // namespace format_internal
}  // namespace kvcache
