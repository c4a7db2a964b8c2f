// Scalar reference rows of the turbo formats (see turbo.h) and the encoder's
// level tables. The SIMD encoder (encode-inl.h) and decoder (decode-inl.h)
// reproduce the rows bit for bit.
//
// Floating-point contraction is disabled (as in codec_simd.cc) so that
// "x - s * l" rounds the same way in every build and on every target.
//
// Thread safety: pure functions; the tables are built once (static locals).
#pragma GCC optimize("fp-contract=off")

#include <algorithm>
#include <cmath>
#include <limits>

#include "format/turbo/turbo.h"

namespace kvcache {
namespace format_internal {

const LevelTable<16>& Turbo4Table() {
  static const LevelTable<16> t(kTurbo4Levels);
  return t;
}
const LevelTable<16>& Turbo4ITable() {
  static const LevelTable<16> t(kTurbo4ILevels);
  return t;
}
const LevelTable<8>& Turbo3Table() {
  static const LevelTable<8> t(kTurbo3Levels);
  return t;
}
const LevelTable<4>& Turbo2Table() {
  static const LevelTable<4> t(kTurbo2Levels);
  return t;
}
const LevelTable<8>& Turbo3ITable() {
  static const LevelTable<8> t(kTurbo3ILevels);
  return t;
}
const LevelTable<4>& Turbo2ITable() {
  static const LevelTable<4> t(kTurbo2ILevels);
  return t;
}

namespace {

// Index of the nearest level (an exact tie goes to the smaller magnitude):
// c = number of midpoints strictly below |y|; code L/2 + c for y > 0, else
// L/2 - 1 - c.
template <size_t L>
inline int NearestCode(const LevelTable<L>& t, float y) {
  const float a = std::fabs(y);
  int c = 0;
  for (float th : t.threshold) c += (a > th) ? 1 : 0;
  return y > 0.0f ? static_cast<int>(L / 2) + c : static_cast<int>(L / 2) - 1 - c;
}

// Turbo4/3/2 group: picks the scale and codes (see kTurboScaleSearch).
template <size_t L>
void QuantizeTurboGroup(const float* x, const LevelTable<L>& t, uint8_t* scale_code,
                        uint8_t* codes) {
  float amax = 0.0f;
  for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(x[i]));
  if (amax == 0.0f) {
    *scale_code = 0;
    std::fill(codes, codes + 16, 0);
    return;
  }
  const int c0 = FloatToE4M3(amax);
  const int lo = std::max(1, c0 - kTurboScaleSearch);
  const int hi = std::min(0x7E, c0 + kTurboScaleSearch);
  int best_c = lo;
  float best_err = std::numeric_limits<float>::infinity();
  for (int c = lo; c <= hi; ++c) {
    const float s = kE4M3ToFloat[c];
    float err = 0.0f;
    for (int i = 0; i < 16; ++i) {
      const float y = x[i] / s;
      const float dd = x[i] - s * t.level[NearestCode<L>(t, y)];
      err = err + dd * dd;
    }
    if (err < best_err) {
      best_err = err;
      best_c = c;
    }
  }
  const float s = kE4M3ToFloat[best_c];
  *scale_code = static_cast<uint8_t>(best_c);
  for (int i = 0; i < 16; ++i) codes[i] = static_cast<uint8_t>(NearestCode<L>(t, x[i] / s));
}

void PackTurbo4(const uint8_t* c, uint8_t* out8) {
  for (int j = 0; j < 8; ++j) out8[j] = static_cast<uint8_t>(c[2 * j] | (c[2 * j + 1] << 4));
}
void PackTurbo3(const uint8_t* c, uint8_t* out6) {
  uint64_t w = 0;
  for (int i = 0; i < 16; ++i) w |= static_cast<uint64_t>(c[i]) << (3 * i);
  for (int b = 0; b < 6; ++b) out6[b] = static_cast<uint8_t>(w >> (8 * b));
}
void PackTurbo2(const uint8_t* c, uint8_t* out4) {
  for (int b = 0; b < 4; ++b) {
    out4[b] = static_cast<uint8_t>((c[4 * b] & 3) | ((c[4 * b + 1] & 3) << 2) |
                                   ((c[4 * b + 2] & 3) << 4) | ((c[4 * b + 3] & 3) << 6));
  }
}
// turbo3i: the low 2 bits as turbo2, bit 2 into the group's 16-bit word.
void PackTurbo3I(const uint8_t* c, uint8_t* low4, uint8_t* high2) {
  PackTurbo2(c, low4);
  uint16_t w = 0;
  for (int i = 0; i < 16; ++i) w = static_cast<uint16_t>(w | (((c[i] >> 2) & 1) << i));
  StoreU16(w, high2);
}

// turbo8 group g: bf16 scale amax / 448, E4M3 codes of x / scale.
void EncodeTurbo8Group(const float* xg, uint8_t* codes16, uint8_t* scale2) {
  float amax = 0.0f;
  for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(xg[i]));
  const uint16_t sb = FloatToBF16(amax / kE4M3Max);
  const float s = BF16ToFloat(sb);
  for (int i = 0; i < 16; ++i) codes16[i] = s == 0.0f ? 0 : FloatToE4M3(xg[i] / s);
  StoreU16(sb, scale2);
}

}  // namespace

void EncodeTurboRow(Format f, uint32_t d, const float* x, uint8_t* out) {
  const RowLayout l = LayoutOf(f, d);
  for (uint32_t g = 0; g < d / 16; ++g) {
    const float* xg = x + 16 * g;
    uint8_t* sc = out + l.scales_offset + l.scale_bytes * g;
    uint8_t* dst = out + l.group_code_bytes * g;
    uint8_t codes[16];
    switch (f) {
      case Format::kTurbo8: EncodeTurbo8Group(xg, dst, sc); break;
      case Format::kTurbo4:
        QuantizeTurboGroup(xg, Turbo4Table(), sc, codes);
        PackTurbo4(codes, dst);
        break;
      case Format::kTurbo4I:
        QuantizeTurboGroup(xg, Turbo4ITable(), sc, codes);
        PackTurbo4(codes, dst);
        break;
      case Format::kTurbo3:
        QuantizeTurboGroup(xg, Turbo3Table(), sc, codes);
        PackTurbo3(codes, dst);
        break;
      case Format::kTurbo2:
        QuantizeTurboGroup(xg, Turbo2Table(), sc, codes);
        PackTurbo2(codes, dst);
        break;
      case Format::kTurbo2I:
        QuantizeTurboGroup(xg, Turbo2ITable(), sc, codes);
        PackTurbo2(codes, dst);
        break;
      case Format::kTurbo3I:
        QuantizeTurboGroup(xg, Turbo3ITable(), sc, codes);
        PackTurbo3I(codes, out + 4 * g, out + d / 4 + 2 * g);
        break;
      default: return;
    }
  }
}

void DecodeTurboRow(Format f, uint32_t d, const uint8_t* in, float* x) {
  const RowLayout l = LayoutOf(f, d);
  for (uint32_t g = 0; g < d / 16; ++g) {
    const uint8_t* codes = in + l.group_code_bytes * g;
    const uint8_t* sc = in + l.scales_offset + l.scale_bytes * g;
    switch (f) {
      case Format::kTurbo8: DecodeTurbo8Group(codes, LoadU16(sc), x + 16 * g); break;
      case Format::kTurbo4: DecodeTurbo4Group(codes, *sc, x + 16 * g); break;
      case Format::kTurbo4I:
        DecodeTurbo4Group(codes, *sc, x + 16 * g, kTurbo4ILevels.data());
        break;
      case Format::kTurbo3: DecodeTurbo3Group(codes, *sc, x + 16 * g); break;
      case Format::kTurbo2: DecodeTurbo2Group(codes, *sc, x + 16 * g); break;
      case Format::kTurbo2I:
        DecodeTurbo2Group(codes, *sc, x + 16 * g, kTurbo2ILevels.data());
        break;
      case Format::kTurbo3I:
        DecodeTurbo3IGroup(in + 4 * g, LoadU16(in + d / 4 + 2 * g), *sc, x + 16 * g);
        break;
      default: return;
    }
  }
}

}  // namespace format_internal
}  // namespace kvcache
