// Scalar reference encoders/decoders for every format, on prepared rows (see
// format_internal.h). These define the bytes each format stores; the SIMD
// kernels in codec_simd.cc must reproduce them exactly, and the tests check it.
//
// Floating-point contraction is disabled here (and in codec_simd.cc) so that
// "x - s * l" rounds the same way in every build and on every target.
//
// Thread safety: pure functions.
#pragma GCC optimize("fp-contract=off")

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "format/format_internal.h"

namespace kvcache {
namespace format_internal {
namespace {

// Midpoints between consecutive non-negative levels (the codebooks are
// symmetric): [L/2 - 1].
template <size_t L>
struct Thresholds {
  std::array<float, L / 2 - 1> t{};
  explicit Thresholds(const std::array<float, L>& lv) {
    for (size_t j = 0; j + 1 < L / 2; ++j) t[j] = (lv[L / 2 + j] + lv[L / 2 + j + 1]) / 2;
  }
};

// Index of the nearest level (an exact tie goes to the smaller magnitude):
// c = number of midpoints strictly below |y|; code L/2 + c for y > 0, else
// L/2 - 1 - c.
template <size_t L>
inline int NearestCode(const std::array<float, L / 2 - 1>& th, float y) {
  const float a = std::fabs(y);
  int c = 0;
  for (float t : th) c += (a > t) ? 1 : 0;
  return y > 0.0f ? static_cast<int>(L / 2) + c : static_cast<int>(L / 2) - 1 - c;
}

// Turbo4/3/2 group: picks the scale and codes (see kTurboScaleSearch).
template <size_t L>
void QuantizeTurboGroup(const float* x, const std::array<float, L>& lv, uint8_t* scale_code,
                        uint8_t* codes) {
  static const Thresholds<L> th(lv);
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
      const float dd = x[i] - s * lv[NearestCode<L>(th.t, y)];
      err = err + dd * dd;
    }
    if (err < best_err) {
      best_err = err;
      best_c = c;
    }
  }
  const float s = kE4M3ToFloat[best_c];
  *scale_code = static_cast<uint8_t>(best_c);
  for (int i = 0; i < 16; ++i) codes[i] = static_cast<uint8_t>(NearestCode<L>(th.t, x[i] / s));
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
    out4[b] = static_cast<uint8_t>(c[4 * b] | (c[4 * b + 1] << 2) | (c[4 * b + 2] << 4) |
                                   (c[4 * b + 3] << 6));
  }
}

void StoreU16(uint16_t v, uint8_t* p) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}

// Clamp-and-convert used where llama.cpp would cast an out-of-range float
// (only reachable with a subnormal scale whose reciprocal overflows).
inline int ClampToInt(float v, int lo, int hi) {
  if (!(v >= static_cast<float>(lo))) return (v != v) ? 0 : lo;
  if (v > static_cast<float>(hi)) return hi;
  return static_cast<int>(v);
}

void EncodeRowScalar(Format f, uint32_t d, const float* x, uint8_t* out) {
  const RowLayout l = LayoutOf(f, d);
  switch (f) {
    case Format::kF32: std::memcpy(out, x, 4ull * d); return;
    case Format::kF16:
      for (uint32_t i = 0; i < d; ++i) StoreU16(FloatToF16(x[i]), out + 2 * i);
      return;
    case Format::kBF16:
      for (uint32_t i = 0; i < d; ++i) StoreU16(FloatToBF16(x[i]), out + 2 * i);
      return;
    case Format::kFp8E4M3:
      for (uint32_t i = 0; i < d; ++i) out[i] = FloatToE4M3(x[i]);
      return;
    case Format::kQ8: {
      float amax = 0.0f;
      for (uint32_t i = 0; i < d; ++i) amax = std::max(amax, std::fabs(x[i]));
      const float s = amax / 127.0f;
      for (uint32_t i = 0; i < d; ++i) {
        const float q = s == 0.0f ? 0.0f : std::nearbyint(x[i] / s);
        out[i] = static_cast<uint8_t>(static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f)));
      }
      std::memcpy(out + d, &s, 4);
      return;
    }
    case Format::kTurbo8:
      for (uint32_t g = 0; g < d / 16; ++g) {
        const float* xg = x + 16 * g;
        float amax = 0.0f;
        for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(xg[i]));
        const uint16_t sb = FloatToBF16(amax / kE4M3Max);
        const float s = BF16ToFloat(sb);
        for (int i = 0; i < 16; ++i) out[16 * g + i] = s == 0.0f ? 0 : FloatToE4M3(xg[i] / s);
        StoreU16(sb, out + l.scales_offset + 2 * g);
      }
      return;
    case Format::kTurbo4:
    case Format::kTurbo3:
    case Format::kTurbo2:
      for (uint32_t g = 0; g < d / 16; ++g) {
        uint8_t codes[16];
        uint8_t* sc = out + l.scales_offset + g;
        uint8_t* dst = out + l.group_code_bytes * g;
        if (f == Format::kTurbo4) {
          QuantizeTurboGroup(x + 16 * g, kTurbo4Levels, sc, codes);
          PackTurbo4(codes, dst);
        } else if (f == Format::kTurbo3) {
          QuantizeTurboGroup(x + 16 * g, kTurbo3Levels, sc, codes);
          PackTurbo3(codes, dst);
        } else {
          QuantizeTurboGroup(x + 16 * g, kTurbo2Levels, sc, codes);
          PackTurbo2(codes, dst);
        }
      }
      return;
    case Format::kQ8_0:
      // llama.cpp quantize_row_q8_0_ref: codes from the unrounded f32 d.
      for (uint32_t b = 0; b < d / 32; ++b) {
        const float* xb = x + 32 * b;
        uint8_t* ob = out + 34 * b;
        float amax = 0.0f;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
        const float dd = amax / 127.0f;
        const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
        StoreU16(FloatToF16(dd), ob);
        for (int j = 0; j < 32; ++j) {
          ob[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(ClampToInt(std::round(xb[j] * id), -127, 127)));
        }
      }
      return;
    case Format::kQ4_0:
      // llama.cpp quantize_row_q4_0_ref.
      for (uint32_t b = 0; b < d / 32; ++b) {
        const float* xb = x + 32 * b;
        uint8_t* ob = out + 18 * b;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 32; ++j) {
          if (amax < std::fabs(xb[j])) {
            amax = std::fabs(xb[j]);
            max = xb[j];
          }
        }
        const float dd = max / -8.0f;
        const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
        StoreU16(FloatToF16(dd), ob);
        for (int j = 0; j < 16; ++j) {
          const int q0 = std::min(15, ClampToInt(xb[j] * id + 8.5f, 0, 255));
          const int q1 = std::min(15, ClampToInt(xb[j + 16] * id + 8.5f, 0, 255));
          ob[2 + j] = static_cast<uint8_t>(q0 | (q1 << 4));
        }
      }
      return;
  }
}

void DecodeRowScalar(Format f, uint32_t d, const uint8_t* in, float* x) {
  const RowLayout l = LayoutOf(f, d);
  switch (f) {
    case Format::kF32: std::memcpy(x, in, 4ull * d); return;
    case Format::kF16:
      for (uint32_t i = 0; i < d; ++i) x[i] = F16ToFloat(LoadU16(in + 2 * i));
      return;
    case Format::kBF16:
      for (uint32_t i = 0; i < d; ++i) x[i] = BF16ToFloat(LoadU16(in + 2 * i));
      return;
    case Format::kFp8E4M3:
      for (uint32_t i = 0; i < d; ++i) x[i] = kE4M3ToFloat[in[i]];
      return;
    case Format::kQ8: {
      const float s = Q8RowScale(in, d);
      for (uint32_t i = 0; i < d; ++i) x[i] = s * static_cast<float>(static_cast<int8_t>(in[i]));
      return;
    }
    case Format::kTurbo8:
      for (uint32_t g = 0; g < d / 16; ++g) {
        DecodeTurbo8Group(in + 16 * g, LoadU16(in + l.scales_offset + 2 * g), x + 16 * g);
      }
      return;
    case Format::kTurbo4:
      for (uint32_t g = 0; g < d / 16; ++g) {
        DecodeTurbo4Group(in + 8 * g, in[l.scales_offset + g], x + 16 * g);
      }
      return;
    case Format::kTurbo3:
      for (uint32_t g = 0; g < d / 16; ++g) {
        DecodeTurbo3Group(in + 6 * g, in[l.scales_offset + g], x + 16 * g);
      }
      return;
    case Format::kTurbo2:
      for (uint32_t g = 0; g < d / 16; ++g) {
        DecodeTurbo2Group(in + 4 * g, in[l.scales_offset + g], x + 16 * g);
      }
      return;
    case Format::kQ8_0:
      for (uint32_t b = 0; b < d / 32; ++b) DecodeQ8_0Block(in + 34 * b, x + 32 * b);
      return;
    case Format::kQ4_0:
      for (uint32_t b = 0; b < d / 32; ++b) DecodeQ4_0Block(in + 18 * b, x + 32 * b);
      return;
  }
}

}  // namespace

void EncodeRowsScalar(Format f, uint32_t d, size_t n, const float* x, uint8_t* out) {
  const size_t rb = RowBytes(f, d);
  for (size_t r = 0; r < n; ++r) EncodeRowScalar(f, d, x + r * d, out + r * rb);
}

void DecodeRowsScalar(Format f, uint32_t d, size_t n, const uint8_t* in, float* x) {
  const size_t rb = RowBytes(f, d);
  for (size_t r = 0; r < n; ++r) DecodeRowScalar(f, d, in + r * rb, x + r * d);
}

}  // namespace format_internal
}  // namespace kvcache
