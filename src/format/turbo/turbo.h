// The rotated turbo formats: turbo8, turbo4, turbo3 and turbo2, one scale per
// 16-value group, stored in a rotated space; and the rotation itself.
//
// Row layouts (d = head_dim, a multiple of 16; little-endian, offsets from
// the row start):
//   turbo8    [0, d)         d x E4M3 code (group g = bytes [16g, 16g+16));
//             [d, d + 2d/16) d/16 x bf16 group scale. value = scale * E4M3(code)
//   turbo4    [0, d/2)       byte j of group g (at 8g + j) holds value 2j in its low
//                            nibble and value 2j+1 in its high nibble;
//             [d/2, d/2 + d/16) d/16 x E4M3 group scale.
//                            value = scale * kTurbo4Levels[code]
//   turbo4i   turbo4's layout; value = scale * kTurbo4ILevels[code], the levels
//             integers / 128 (kTurbo4IInt), so integer kernels are exact
//   turbo3    [0, 6d/16)     group g: bytes [6g, 6g+6) are one little-endian 48-bit
//                            word, code i at bits 3i..3i+2;
//             [6d/16, 7d/16) d/16 x E4M3 group scale. value = scale * kTurbo3Levels[code]
//   turbo2    [0, d/4)       group g: bytes [4g, 4g+4), code i at bits 2(i%4)
//                            of byte 4g + i/4;
//             [d/4, d/4 + d/16) d/16 x E4M3 group scale. value = scale * kTurbo2Levels[code]
//   turbo2i   turbo2's layout; value = scale * kTurbo2ILevels[code], the levels
//             integers / 128 (kTurbo2IInt)
//   turbo3i   [0, d/4)       the low 2 bits of each code, in turbo2's layout;
//             [d/4, 3d/8)    bit 2 of each code: group g: bytes [2g, 2g+2), a
//                            little-endian 16-bit word whose bit i is bit 2 of
//                            code i (the levels ascend, so it is set for the
//                            positive levels);
//             [3d/8, 7d/16)  d/16 x E4M3 group scale. value = scale * kTurbo3ILevels[code]
//             (the same size as turbo3; the two planes let a kernel unpack the
//             codes with byte shifts and one byte shuffle instead of 48-bit
//             words: docs/formats.md)
//
// Turbo values are in the ROTATED space (after mean subtraction): a kernel
// rotates the query with the same rotation (q.k is unchanged) and applies
// InverseRotate once to an output accumulated from rotated values.
//
// This family's files: turbo.h (layout, codebooks, scalar reference),
// scalar.cc (the reference rows, the encoder's level tables), encode-inl.h
// (SIMD encoder, part of codec_simd.cc), decode-inl.h (Decoder<F> of each,
// part of format/decoders-inl.h), rotation.cc (the rotation's signs and
// scalar reference) and rotate-inl.h (the SIMD rotation, part of
// codec_simd.cc).
//
// Thread safety: pure functions and constant data.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "format/fp8_q8/fp8_q8.h"
#include "format/row_layout.h"

namespace kvcache {
namespace format_internal {

// ---------------------------------------------------------------------------
// Codebooks: levels in ascending order, code = index. Symmetric
// (level[n-1-i] == -level[i]). A group's stored scale s multiplies them; the
// encoder picks s (rounded to E4M3 first) and the nearest level per value.
// See docs/formats.md for how they were fitted and their measured error.

inline constexpr std::array<float, 16> kTurbo4Levels = {
    -1.0630157f, -0.8529882f, -0.6673639f, -0.5176435f, -0.3846969f, -0.2639617f,
    -0.1540296f, -0.0507288f, 0.0507288f,  0.1540296f,  0.2639617f,  0.3846969f,
    0.5176435f,  0.6673639f,  0.8529882f,  1.0630157f};
// turbo4i: turbo4's levels scaled so that the largest is 127 and rounded to
// integers (round(127 * l / 1.0630157)), over 128: every level is an int8
// times 2^-7, so s * level is exact in f32 for every E4M3 scale s, and a
// kernel may multiply the int8 levels in integer lanes and apply s / 128 per
// group afterwards with no rounding of its own (docs/formats.md: its error).
inline constexpr std::array<int8_t, 16> kTurbo4IInt = {-127, -102, -80, -62, -46, -32, -18, -6,
                                                       6,    18,   32,  46,  62,  80,  102, 127};
inline constexpr float kTurbo4IStep = 1.0f / 128.0f;
inline constexpr std::array<float, 16> kTurbo4ILevels = [] {
  std::array<float, 16> l{};
  for (size_t i = 0; i < 16; ++i) l[i] = static_cast<float>(kTurbo4IInt[i]) * kTurbo4IStep;
  return l;
}();
inline constexpr std::array<float, 8> kTurbo3Levels = {
    -0.9565287f, -0.5790571f, -0.3191016f, -0.1023969f,
    0.1023969f,  0.3191016f,  0.5790571f,  0.9565287f};
inline constexpr std::array<float, 4> kTurbo2Levels = {-0.7343107f, -0.2058505f, 0.2058505f,
                                                       0.7343107f};
// turbo3i and turbo2i: turbo3's and turbo2's levels times 128, rounded to
// integers, over 128 (as turbo4i: s * level is exact in f32, and integer
// kernels multiply the int8 levels and apply s / 128 per group afterwards).
inline constexpr std::array<int8_t, 8> kTurbo3IInt = {-122, -74, -41, -13, 13, 41, 74, 122};
inline constexpr std::array<int8_t, 4> kTurbo2IInt = {-94, -26, 26, 94};
inline constexpr float kTurboIStep = 1.0f / 128.0f;  // every integer-level format's step
template <size_t L>
constexpr std::array<float, L> IntLevels(const std::array<int8_t, L>& in) {
  std::array<float, L> l{};
  for (size_t i = 0; i < L; ++i) l[i] = static_cast<float>(in[i]) * kTurboIStep;
  return l;
}
inline constexpr std::array<float, 8> kTurbo3ILevels = IntLevels(kTurbo3IInt);
inline constexpr std::array<float, 4> kTurbo2ILevels = IntLevels(kTurbo2IInt);

// Encoder scale rule for turbo4/3/2: c0 = E4M3(amax of the group); try the
// stored scales c0-kTurboScaleSearch .. c0+kTurboScaleSearch (valid codes
// 1..0x7E), pick the one whose nearest-level reconstruction has the least
// squared error (first on ties). Codes are the nearest level to x / s (an exact
// tie between two levels goes to the smaller magnitude). An all-zero group
// stores scale 0 and codes 0.
inline constexpr int kTurboScaleSearch = 2;

// A codebook as the encoders use it. threshold[j] are the midpoints between
// consecutive non-negative levels (x / s above threshold[j] takes a level
// above level[L/2 + j]). The SIMD encoder's nearest-level test fl(a / s) >
// t_j (a = |x|) is done without the division: every E4M3 scale is s = M * 2^E
// with M = 1 + m / 8 (m = its 3 top mantissa bits as a float), and
// abs_thr[j][m] is the largest float a' with fl(a' / M) <= t_j (found with the
// division itself). Then fl(a / s) > t_j iff a > abs_thr[j][m] * 2^E: when
// a * 2^-E is a float, a / s and (a * 2^-E) / M are the same real number and
// round alike, and fl(a' / M) > t_j iff a' > abs_thr (the division rounds
// monotonically); otherwise a < 2^-117, below both sides' boundaries. The
// product abs_thr * 2^E is exact (a normal float times a power of two, 2^-9 <=
// s <= 448). A NaN a compares false on both sides.
template <size_t L>
struct LevelTable {
  static constexpr size_t kT = L / 2 - 1;  // thresholds of the non-negative half
  alignas(64) float level[L];
  float threshold[kT];
  alignas(32) float abs_thr[kT][8];
  // perm_level[(8 - c) & 7] = level[L / 2 + c]: indexed by minus the count of
  // thresholds below (a sum of all-ones compare masks), for L >= 8.
  alignas(32) float perm_level[8] = {};
  explicit LevelTable(const std::array<float, L>& lv) {
    for (size_t k = 0; k < L; ++k) level[k] = lv[k];
    for (size_t j = 0; j < kT; ++j) threshold[j] = (lv[L / 2 + j] + lv[L / 2 + j + 1]) / 2;
    for (size_t j = 0; j < kT; ++j) {
      for (int m = 0; m < 8; ++m) {
        const float mant = 1.0f + static_cast<float>(m) / 8.0f;
        const float t = threshold[j];
        float a = t * mant;
        while (a / mant > t) a = std::nextafter(a, 0.0f);
        while (std::nextafter(a, 4.0f) / mant <= t) a = std::nextafter(a, 4.0f);
        abs_thr[j][m] = a;
      }
    }
    if constexpr (L >= 8) {
      for (size_t c = 0; c < L / 2; ++c) perm_level[(8 - c) & 7] = lv[L / 2 + c];
    }
  }
};
// The tables of the codebooks (built once, on first use).
const LevelTable<16>& Turbo4Table();
const LevelTable<16>& Turbo4ITable();
const LevelTable<8>& Turbo3Table();
const LevelTable<4>& Turbo2Table();
const LevelTable<8>& Turbo3ITable();
const LevelTable<4>& Turbo2ITable();

// ---------------------------------------------------------------------------
// Scalar group decoders (reference; one group of 16 values, rotated space).

inline void DecodeTurbo8Group(const uint8_t* codes16, uint16_t scale_bf16, float* out16) {
  const float s = BF16ToFloat(scale_bf16);
  for (int i = 0; i < 16; ++i) out16[i] = s * kE4M3ToFloat[codes16[i]];
}
// turbo4 (levels kTurbo4Levels) and turbo4i (kTurbo4ILevels).
inline void DecodeTurbo4Group(const uint8_t* codes8, uint8_t scale_e4m3, float* out16,
                              const float* levels = kTurbo4Levels.data()) {
  const float s = E4M3ToFloat(scale_e4m3);
  for (int j = 0; j < 8; ++j) {
    out16[2 * j] = s * levels[codes8[j] & 0xF];
    out16[2 * j + 1] = s * levels[codes8[j] >> 4];
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
// turbo2 (levels kTurbo2Levels) and turbo2i (kTurbo2ILevels).
inline void DecodeTurbo2Group(const uint8_t* codes4, uint8_t scale_e4m3, float* out16,
                              const float* levels = kTurbo2Levels.data()) {
  const float s = E4M3ToFloat(scale_e4m3);
  for (int i = 0; i < 16; ++i) out16[i] = s * levels[(codes4[i / 4] >> (2 * (i % 4))) & 3];
}
// turbo3i: the low bits (4 bytes, turbo2's layout) and the bit-2 word.
inline int Turbo3ICode(const uint8_t* low4, uint16_t high, int i) {
  return ((low4[i / 4] >> (2 * (i % 4))) & 3) | (((high >> i) & 1) << 2);
}
inline void DecodeTurbo3IGroup(const uint8_t* low4, uint16_t high, uint8_t scale_e4m3, float* out16) {
  const float s = E4M3ToFloat(scale_e4m3);
  for (int i = 0; i < 16; ++i) out16[i] = s * kTurbo3ILevels[Turbo3ICode(low4, high, i)];
}

// Scalar reference rows of the turbo formats (other formats: no-op).
void EncodeTurboRow(Format format, uint32_t d, const float* x, uint8_t* out);
void DecodeTurboRow(Format format, uint32_t d, const uint8_t* in, float* x);

// ---------------------------------------------------------------------------
// Rotation (rotation.cc, rotate-inl.h): x -> H_blocks * (signs ⊙ x). head_dim (a multiple
// of 16) is split greedily into power-of-two blocks, largest first (128 ->
// 128; 96 -> 64+32; 80 -> 64+16); each block gets an unnormalized fast
// Walsh-Hadamard transform scaled by 1/sqrt(block). The transform is
// orthonormal, so q.k is preserved when both sides are rotated. Inverse: the
// same blocks' transform (it is its own inverse), then multiply by the signs.

// The size of the next block when `remaining` values (a multiple of 16, at
// least 16) are left: the largest power of two not above it.
inline uint32_t RotationBlockAt(uint32_t remaining) {
  uint32_t b = 16;
  while (b * 2 <= remaining) b *= 2;
  return b;
}

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

}  // namespace format_internal
}  // namespace kvcache
