// SIMD (Highway, dynamic dispatch) row encoders/decoders on prepared rows.
//
// Every kernel reproduces the scalar reference in codec_scalar.cc bit for bit:
// conversions use the same integer rounding steps, per-group choices that sum
// errors (turbo4/3/2 scale search) keep one group per SIMD lane so each lane
// runs the scalar sequence of operations, and tails use the scalar code.
// Contraction into FMA is disabled so "x - s * l" rounds identically.
// q8_0/q4_0 encoding is scalar (llama.cpp's reference order); their decoding
// is SIMD.
//
// Dispatch happens once per EncodeRows/DecodeRows call.
// Thread safety: pure functions. Requires a little-endian host.
#pragma GCC optimize("fp-contract=off")

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "format/format_internal.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "format/codec_simd.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#ifndef KVCACHE_FORMAT_CODEC_SIMD_ONCE
#define KVCACHE_FORMAT_CODEC_SIMD_ONCE
namespace kvcache {
namespace format_internal {
namespace {

template <size_t L>
struct LevelTable {
  alignas(64) float level[L];
  float threshold[L / 2 - 1];  // midpoints of the non-negative half, as in codec_scalar.cc
  explicit LevelTable(const std::array<float, L>& lv) {
    for (size_t k = 0; k < L; ++k) level[k] = lv[k];
    for (size_t j = 0; j + 1 < L / 2; ++j) threshold[j] = (lv[L / 2 + j] + lv[L / 2 + j + 1]) / 2;
  }
};
const LevelTable<16>& Table4() {
  static const LevelTable<16> t(kTurbo4Levels);
  return t;
}
const LevelTable<8>& Table3() {
  static const LevelTable<8> t(kTurbo3Levels);
  return t;
}
const LevelTable<4>& Table2() {
  static const LevelTable<4> t(kTurbo2Levels);
  return t;
}

inline void StoreU16(uint16_t v, uint8_t* p) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}

void PackCodes(Format f, const uint8_t* c, uint8_t* dst) {
  switch (f) {
    case Format::kTurbo4:
      for (int j = 0; j < 8; ++j) dst[j] = static_cast<uint8_t>(c[2 * j] | (c[2 * j + 1] << 4));
      break;
    case Format::kTurbo3: {
      uint64_t w = 0;
      for (int i = 0; i < 16; ++i) w |= static_cast<uint64_t>(c[i]) << (3 * i);
      for (int b = 0; b < 6; ++b) dst[b] = static_cast<uint8_t>(w >> (8 * b));
      break;
    }
    default:
      for (int b = 0; b < 4; ++b) {
        dst[b] = static_cast<uint8_t>(c[4 * b] | (c[4 * b + 1] << 2) | (c[4 * b + 2] << 4) |
                                      (c[4 * b + 3] << 6));
      }
      break;
  }
}

void UnpackCodes(Format f, const uint8_t* src, int32_t* c) {
  switch (f) {
    case Format::kTurbo4:
      for (int j = 0; j < 8; ++j) {
        c[2 * j] = src[j] & 0xF;
        c[2 * j + 1] = src[j] >> 4;
      }
      break;
    case Format::kTurbo3: {
      const uint64_t w = LoadLe48(src);
      for (int i = 0; i < 16; ++i) c[i] = static_cast<int32_t>((w >> (3 * i)) & 7);
      break;
    }
    default:
      for (int i = 0; i < 16; ++i) c[i] = (src[i / 4] >> (2 * (i % 4))) & 3;
      break;
  }
}

}  // namespace
}  // namespace format_internal
}  // namespace kvcache
#endif

HWY_BEFORE_NAMESPACE();
namespace kvcache {
namespace format_internal {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::CappedTag<float, 16>;
using DI = hn::RebindToSigned<DF>;
using DU = hn::RebindToUnsigned<DF>;
using VF = hn::Vec<DF>;
using VI = hn::Vec<DI>;

// ---- conversions (mirror FloatToE4M3 / E4M3ToFloat / FloatToF16 / ... exactly) ----

HWY_INLINE VI EncodeE4M3(VF v) {
  const DF df;
  const DI di;
  const VI u = hn::BitCast(di, v);
  const VI sign = hn::And(hn::ShiftRight<24>(u), hn::Set(di, 0x80));
  const VI a = hn::And(u, hn::Set(di, 0x7FFFFFFF));
  const auto is_nan = a > hn::Set(di, 0x7F800000);
  const auto is_sat = a > hn::Set(di, 0x43DFFFFF);
  const auto is_sub = hn::Set(di, 0x3C800000) > a;
  const VF fs = hn::Mul(hn::BitCast(df, a), hn::Set(df, 512.0f));
  const VF r = hn::Sub(hn::Add(fs, hn::Set(df, 8388608.0f)), hn::Set(df, 8388608.0f));
  const VI sub_code = hn::ConvertTo(di, r);
  const VI rebased = hn::Sub(a, hn::Set(di, 120 << 23));
  const VI round = hn::Add(hn::Set(di, 0x7FFFF), hn::And(hn::ShiftRight<20>(rebased), hn::Set(di, 1)));
  const VI norm_code = hn::Min(hn::ShiftRight<20>(hn::Add(rebased, round)), hn::Set(di, 0x7E));
  VI res = hn::IfThenElse(is_sub, sub_code, norm_code);
  res = hn::IfThenElse(is_sat, hn::Set(di, 0x7E), res);
  res = hn::IfThenElse(is_nan, hn::Set(di, 0x7F), res);
  return hn::Or(res, sign);
}

// codes in [0, 255] -> exact values (NaN codes -> 0x7FC00000 like the table).
HWY_INLINE VF DecodeE4M3(VI c) {
  const DF df;
  const DI di;
  const VI sign = hn::ShiftLeft<24>(hn::And(c, hn::Set(di, 0x80)));
  const VI m7 = hn::And(c, hn::Set(di, 0x7F));
  const VI normal = hn::Add(hn::ShiftLeft<20>(m7), hn::Set(di, 120 << 23));
  const VF subf = hn::Mul(hn::ConvertTo(df, hn::And(c, hn::Set(di, 7))), hn::Set(df, 1.0f / 512.0f));
  VI bits = hn::IfThenElse(hn::Set(di, 8) > m7, hn::BitCast(di, subf), normal);
  bits = hn::Or(bits, sign);
  bits = hn::IfThenElse(m7 == hn::Set(di, 0x7F), hn::Set(di, 0x7FC00000), bits);
  return hn::BitCast(df, bits);
}

HWY_INLINE VI EncodeF16(VF v) {
  const DF df;
  const DI di;
  const VI u = hn::BitCast(di, v);
  const VI sign = hn::And(hn::ShiftRight<16>(u), hn::Set(di, 0x8000));
  const VI a = hn::And(u, hn::Set(di, 0x7FFFFFFF));
  const auto is_nan = a > hn::Set(di, 0x7F800000);
  const auto is_ovf = a > hn::Set(di, 0x477FEFFF);
  const auto is_sub = hn::Set(di, 0x38800000) > a;
  const VI nan_code = hn::Or(hn::Set(di, 0x7E00), hn::And(hn::ShiftRight<13>(a), hn::Set(di, 0x3FF)));
  const VF fs = hn::Mul(hn::BitCast(df, a), hn::Set(df, 16777216.0f));
  const VF r = hn::Sub(hn::Add(fs, hn::Set(df, 8388608.0f)), hn::Set(df, 8388608.0f));
  const VI sub_code = hn::ConvertTo(di, r);
  const VI rebased = hn::Sub(a, hn::Set(di, 112 << 23));
  const VI round = hn::Add(hn::Set(di, 0xFFF), hn::And(hn::ShiftRight<13>(rebased), hn::Set(di, 1)));
  const VI norm_code = hn::ShiftRight<13>(hn::Add(rebased, round));
  VI res = hn::IfThenElse(is_sub, sub_code, norm_code);
  res = hn::IfThenElse(is_ovf, hn::Set(di, 0x7C00), res);
  res = hn::IfThenElse(is_nan, nan_code, res);
  return hn::Or(res, sign);
}

HWY_INLINE VF DecodeF16(VI h) {
  const DF df;
  const DI di;
  const VI sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(di, 0x8000)));
  const VI e = hn::And(h, hn::Set(di, 0x7C00));
  const VI man = hn::And(h, hn::Set(di, 0x3FF));
  const VI normal = hn::Add(hn::ShiftLeft<13>(hn::And(h, hn::Set(di, 0x7FFF))), hn::Set(di, 112 << 23));
  const VI infnan = hn::Or(hn::Set(di, 0x7F800000), hn::ShiftLeft<13>(man));
  const VI sub = hn::BitCast(di, hn::Mul(hn::ConvertTo(df, man), hn::Set(df, 5.9604644775390625e-8f)));
  VI bits = hn::IfThenElse(e == hn::Set(di, 0x7C00), infnan, normal);
  bits = hn::IfThenElse(e == hn::Zero(di), sub, bits);
  return hn::BitCast(df, hn::Or(bits, sign));
}

HWY_INLINE VI EncodeBF16(VF v) {
  const DI di;
  const DU du;
  const auto uu = hn::BitCast(du, v);
  const VI a = hn::And(hn::BitCast(di, v), hn::Set(di, 0x7FFFFFFF));
  const auto is_nan = a > hn::Set(di, 0x7F800000);
  const auto nan_code = hn::Or(hn::ShiftRight<16>(uu), hn::Set(du, 0x40));
  const auto round = hn::Add(hn::Set(du, 0x7FFF), hn::And(hn::ShiftRight<16>(uu), hn::Set(du, 1)));
  const auto r = hn::ShiftRight<16>(hn::Add(uu, round));
  return hn::BitCast(di, hn::IfThenElse(hn::RebindMask(du, is_nan), nan_code, r));
}

// Loads / stores of narrow lanes as int32 vectors.
HWY_INLINE VI LoadU16AsI32(const uint8_t* p) {
  const DI di;
  const hn::Rebind<uint16_t, DI> d16;
  return hn::BitCast(di, hn::PromoteTo(DU(), hn::LoadU(d16, reinterpret_cast<const uint16_t*>(p))));
}
HWY_INLINE void StoreI32AsU16(VI v, uint8_t* p) {
  const hn::Rebind<uint16_t, DI> d16;
  hn::StoreU(hn::DemoteTo(d16, v), d16, reinterpret_cast<uint16_t*>(p));
}
HWY_INLINE VI LoadU8AsI32(const uint8_t* p) {
  const DI di;
  const hn::Rebind<uint8_t, DI> d8;
  return hn::BitCast(di, hn::PromoteTo(DU(), hn::LoadU(d8, p)));
}
HWY_INLINE VI LoadI8AsI32(const uint8_t* p) {
  const hn::Rebind<int8_t, DI> d8;
  return hn::PromoteTo(DI(), hn::LoadU(d8, reinterpret_cast<const int8_t*>(p)));
}
HWY_INLINE void StoreI32AsU8(VI v, uint8_t* p) {
  const hn::Rebind<uint8_t, DI> d8;
  hn::StoreU(hn::DemoteTo(d8, v), d8, p);
}
HWY_INLINE void StoreI32AsI8(VI v, uint8_t* p) {
  const hn::Rebind<int8_t, DI> d8;
  hn::StoreU(hn::DemoteTo(d8, v), d8, reinterpret_cast<int8_t*>(p));
}

HWY_INLINE float MaxAbs(const float* x, size_t n) {
  const DF df;
  const size_t N = hn::Lanes(df);
  size_t i = 0;
  float amax = 0.0f;
  if (n >= N) {
    VF m = hn::Zero(df);
    for (; i + N <= n; i += N) m = hn::Max(m, hn::Abs(hn::LoadU(df, x + i)));
    amax = hn::GetLane(hn::MaxOfLanes(df, m));
  }
  for (; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  return amax;
}

// ---- turbo4/3/2: one group per lane ----

template <size_t L>
HWY_INLINE VI NearestCodes(const LevelTable<L>& t, VF y) {
  const DI di;
  const DF df;
  const VF a = hn::Abs(y);
  VI c = hn::Zero(di);
  for (size_t j = 0; j + 1 < L / 2; ++j) {
    const auto gt = hn::RebindMask(di, a > hn::Set(df, t.threshold[j]));
    c = hn::Sub(c, hn::VecFromMask(di, gt));  // mask lanes are -1
  }
  const auto pos = hn::RebindMask(di, y > hn::Zero(df));
  constexpr int32_t kHalf = static_cast<int32_t>(L / 2);
  return hn::IfThenElse(pos, hn::Add(hn::Set(di, kHalf), c), hn::Sub(hn::Set(di, kHalf - 1), c));
}

// The level NearestCodes(t, y) indexes, without a gather: a select chain over
// the non-negative half, then the sign (levels are exactly symmetric).
template <size_t L>
HWY_INLINE VF NearestLevel(const LevelTable<L>& t, VF y) {
  const DF df;
  const VF a = hn::Abs(y);
  VF lv = hn::Set(df, t.level[L / 2]);
  for (size_t j = 0; j + 1 < L / 2; ++j) {
    lv = hn::IfThenElse(a > hn::Set(df, t.threshold[j]), hn::Set(df, t.level[L / 2 + j + 1]), lv);
  }
  return hn::IfThenElse(y > hn::Zero(df), lv, hn::Neg(lv));
}

// x: N groups of 16 values (group lane at x + 16 * lane); writes scale codes
// [N] and codes [16][N].
template <size_t L>
void QuantizeTurboLanes(const LevelTable<L>& t, const float* x, int32_t* scale_out,
                        int32_t* codes_out) {
  const DF df;
  const DI di;
  const size_t N = hn::Lanes(df);
  const VI idx = hn::Mul(hn::Iota(di, 0), hn::Set(di, 16));
  VF v[16];
  VF amax = hn::Zero(df);
  for (int i = 0; i < 16; ++i) {
    v[i] = hn::GatherIndex(df, x + i, idx);
    amax = hn::Max(amax, hn::Abs(v[i]));
  }
  const VI c0 = EncodeE4M3(amax);
  VI best_c = hn::Max(hn::Sub(c0, hn::Set(di, kTurboScaleSearch)), hn::Set(di, 1));
  VF best_err = hn::Set(df, std::numeric_limits<float>::infinity());
  for (int dc = -kTurboScaleSearch; dc <= kTurboScaleSearch; ++dc) {
    const VI c = hn::Add(c0, hn::Set(di, dc));
    const auto valid = hn::And(c > hn::Zero(di), hn::Set(di, 0x7F) > c);
    const VI cc = hn::Min(hn::Max(c, hn::Set(di, 1)), hn::Set(di, 0x7E));
    const VF s = DecodeE4M3(cc);
    VF err = hn::Zero(df);
    for (int i = 0; i < 16; ++i) {
      const VF y = hn::Div(v[i], s);
      const VF lv = NearestLevel(t, y);
      const VF dd = hn::Sub(v[i], hn::Mul(s, lv));
      err = hn::Add(err, hn::Mul(dd, dd));
    }
    const auto better = hn::And(valid, hn::RebindMask(di, err < best_err));
    best_c = hn::IfThenElse(better, cc, best_c);
    best_err = hn::IfThenElse(hn::RebindMask(df, better), err, best_err);
  }
  const auto zero = hn::RebindMask(di, amax == hn::Zero(df));
  const VF s = DecodeE4M3(best_c);
  hn::StoreU(hn::IfThenZeroElse(zero, best_c), di, scale_out);
  for (int i = 0; i < 16; ++i) {
    const VI k = hn::IfThenZeroElse(zero, NearestCodes(t, hn::Div(v[i], s)));
    hn::StoreU(k, di, codes_out + i * N);
  }
}

template <size_t L>
void EncodeTurboRows(const LevelTable<L>& t, Format f, uint32_t d, size_t n, const float* x,
                     uint8_t* out) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const RowLayout l = LayoutOf(f, d);
  const size_t rb = RowBytes(f, d);
  const size_t gpr = d / 16;
  const size_t groups = n * gpr;
  alignas(64) float pad[16 * 16];
  int32_t scales[16];
  int32_t codes[16 * 16];
  for (size_t g0 = 0; g0 < groups; g0 += N) {
    const size_t cnt = std::min(N, groups - g0);
    const float* src = x + g0 * 16;
    if (cnt < N) {
      std::fill(pad, pad + 16 * N, 0.0f);
      std::memcpy(pad, src, cnt * 16 * sizeof(float));
      src = pad;
    }
    QuantizeTurboLanes(t, src, scales, codes);
    for (size_t lane = 0; lane < cnt; ++lane) {
      const size_t gi = g0 + lane;
      uint8_t* row = out + (gi / gpr) * rb;
      const size_t g = gi % gpr;
      uint8_t c[16];
      for (int i = 0; i < 16; ++i) c[i] = static_cast<uint8_t>(codes[i * N + lane]);
      PackCodes(f, c, row + g * l.group_code_bytes);
      row[l.scales_offset + g] = static_cast<uint8_t>(scales[lane]);
    }
  }
}

// ---- whole-row kernels ----

// Index of the first NaN/Inf in x[0, n), or n.
size_t FirstNonFiniteT(const float* HWY_RESTRICT x, size_t n) {
  const DF df;
  const DI di;
  const size_t N = hn::Lanes(df);
  const VI exp_mask = hn::Set(di, 0x7F800000);
  size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    // A lane is non-finite iff its exponent bits are all ones.
    VI m = hn::And(hn::BitCast(di, hn::LoadU(df, x + i)), exp_mask);
    VI hit = hn::VecFromMask(di, m == exp_mask);
    for (size_t k = 1; k < 4; ++k) {
      m = hn::And(hn::BitCast(di, hn::LoadU(df, x + i + k * N)), exp_mask);
      hit = hn::Or(hit, hn::VecFromMask(di, m == exp_mask));
    }
    if (!hn::AllFalse(di, hn::MaskFromVec(hit))) break;
  }
  for (; i < n; ++i) {
    if (!std::isfinite(x[i])) return i;
  }
  return n;
}

HWY_INLINE void CopyFloats(const float* HWY_RESTRICT src, size_t n, float* HWY_RESTRICT dst) {
  const DF df;
  const size_t N = hn::Lanes(df);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::LoadU(df, src + i), df, dst + i);
  if (i < n) std::memcpy(dst + i, src + i, (n - i) * sizeof(float));  // may be unaligned
}

void EncodeRowsT(Format f, uint32_t d, size_t n, const float* HWY_RESTRICT x,
                 uint8_t* HWY_RESTRICT out) {
  const DF df;
  const DI di;
  const size_t N = hn::Lanes(df);
  const size_t total = n * d;
  switch (f) {
    case Format::kF32: CopyFloats(x, total, reinterpret_cast<float*>(out)); return;
    case Format::kF16: {
      size_t i = 0;
      for (; i + N <= total; i += N) StoreI32AsU16(EncodeF16(hn::LoadU(df, x + i)), out + 2 * i);
      for (; i < total; ++i) StoreU16(FloatToF16(x[i]), out + 2 * i);
      return;
    }
    case Format::kBF16: {
      size_t i = 0;
      for (; i + N <= total; i += N) StoreI32AsU16(EncodeBF16(hn::LoadU(df, x + i)), out + 2 * i);
      for (; i < total; ++i) StoreU16(FloatToBF16(x[i]), out + 2 * i);
      return;
    }
    case Format::kFp8E4M3: {
      size_t i = 0;
      for (; i + N <= total; i += N) StoreI32AsU8(EncodeE4M3(hn::LoadU(df, x + i)), out + i);
      for (; i < total; ++i) out[i] = FloatToE4M3(x[i]);
      return;
    }
    case Format::kQ8: {
      const size_t rb = RowBytes(f, d);
      for (size_t r = 0; r < n; ++r) {
        const float* xr = x + r * d;
        uint8_t* o = out + r * rb;
        const float s = MaxAbs(xr, d) / 127.0f;
        if (s == 0.0f) {
          std::memset(o, 0, d);
        } else {
          const VF vs = hn::Set(df, s);
          size_t i = 0;
          for (; i + N <= d; i += N) {
            VI q = hn::NearestInt(hn::Div(hn::LoadU(df, xr + i), vs));
            q = hn::Min(hn::Max(q, hn::Set(di, -127)), hn::Set(di, 127));
            StoreI32AsI8(q, o + i);
          }
          for (; i < d; ++i) {
            const float q = std::clamp(std::nearbyint(xr[i] / s), -127.0f, 127.0f);
            o[i] = static_cast<uint8_t>(static_cast<int8_t>(q));
          }
        }
        std::memcpy(o + d, &s, 4);
      }
      return;
    }
    case Format::kTurbo8: {
      const RowLayout l = LayoutOf(f, d);
      const size_t rb = RowBytes(f, d);
      for (size_t r = 0; r < n; ++r) {
        for (uint32_t g = 0; g < d / 16; ++g) {
          const float* xg = x + r * d + 16 * g;
          uint8_t* o = out + r * rb;
          const uint16_t sb = FloatToBF16(MaxAbs(xg, 16) / kE4M3Max);
          const float s = BF16ToFloat(sb);
          if (s == 0.0f) {
            std::memset(o + 16 * g, 0, 16);
          } else {
            const VF vs = hn::Set(df, s);
            for (size_t i = 0; i < 16; i += N) {
              StoreI32AsU8(EncodeE4M3(hn::Div(hn::LoadU(df, xg + i), vs)), o + 16 * g + i);
            }
          }
          StoreU16(sb, o + l.scales_offset + 2 * g);
        }
      }
      return;
    }
    case Format::kTurbo4: EncodeTurboRows(Table4(), f, d, n, x, out); return;
    case Format::kTurbo3: EncodeTurboRows(Table3(), f, d, n, x, out); return;
    case Format::kTurbo2: EncodeTurboRows(Table2(), f, d, n, x, out); return;
    case Format::kQ8_0:
    case Format::kQ4_0: EncodeRowsScalar(f, d, n, x, out); return;
  }
}

void DecodeRowsT(Format f, uint32_t d, size_t n, const uint8_t* HWY_RESTRICT in,
                 float* HWY_RESTRICT x) {
  const DF df;
  const DI di;
  const size_t N = hn::Lanes(df);
  const size_t total = n * d;
  switch (f) {
    case Format::kF32: CopyFloats(reinterpret_cast<const float*>(in), total, x); return;
    case Format::kF16: {
      size_t i = 0;
      for (; i + N <= total; i += N) hn::StoreU(DecodeF16(LoadU16AsI32(in + 2 * i)), df, x + i);
      for (; i < total; ++i) x[i] = F16ToFloat(LoadU16(in + 2 * i));
      return;
    }
    case Format::kBF16: {
      size_t i = 0;
      for (; i + N <= total; i += N) {
        hn::StoreU(hn::BitCast(df, hn::ShiftLeft<16>(LoadU16AsI32(in + 2 * i))), df, x + i);
      }
      for (; i < total; ++i) x[i] = BF16ToFloat(LoadU16(in + 2 * i));
      return;
    }
    case Format::kFp8E4M3: {
      size_t i = 0;
      for (; i + N <= total; i += N) hn::StoreU(DecodeE4M3(LoadU8AsI32(in + i)), df, x + i);
      for (; i < total; ++i) x[i] = kE4M3ToFloat[in[i]];
      return;
    }
    case Format::kQ8: {
      const size_t rb = RowBytes(f, d);
      for (size_t r = 0; r < n; ++r) {
        const uint8_t* row = in + r * rb;
        float* xr = x + r * d;
        const float s = Q8RowScale(row, d);
        const VF vs = hn::Set(df, s);
        size_t i = 0;
        for (; i + N <= d; i += N) {
          hn::StoreU(hn::Mul(vs, hn::ConvertTo(df, LoadI8AsI32(row + i))), df, xr + i);
        }
        for (; i < d; ++i) xr[i] = s * static_cast<float>(static_cast<int8_t>(row[i]));
      }
      return;
    }
    case Format::kTurbo8: {
      const RowLayout l = LayoutOf(f, d);
      const size_t rb = RowBytes(f, d);
      for (size_t r = 0; r < n; ++r) {
        const uint8_t* row = in + r * rb;
        for (uint32_t g = 0; g < d / 16; ++g) {
          const VF vs = hn::Set(df, BF16ToFloat(LoadU16(row + l.scales_offset + 2 * g)));
          for (size_t i = 0; i < 16; i += N) {
            hn::StoreU(hn::Mul(vs, DecodeE4M3(LoadU8AsI32(row + 16 * g + i))), df,
                       x + r * d + 16 * g + i);
          }
        }
      }
      return;
    }
    case Format::kTurbo4:
    case Format::kTurbo3:
    case Format::kTurbo2: {
      const RowLayout l = LayoutOf(f, d);
      const size_t rb = RowBytes(f, d);
      const float* levels = f == Format::kTurbo4   ? Table4().level
                            : f == Format::kTurbo3 ? Table3().level
                                                   : Table2().level;
      alignas(64) int32_t c[16];
      for (size_t r = 0; r < n; ++r) {
        const uint8_t* row = in + r * rb;
        for (uint32_t g = 0; g < d / 16; ++g) {
          UnpackCodes(f, row + g * l.group_code_bytes, c);
          const VF vs = hn::Set(df, E4M3ToFloat(row[l.scales_offset + g]));
          for (size_t i = 0; i < 16; i += N) {
            hn::StoreU(hn::Mul(vs, hn::GatherIndex(df, levels, hn::Load(di, c + i))), df,
                       x + r * d + 16 * g + i);
          }
        }
      }
      return;
    }
    case Format::kQ8_0:
      for (size_t b = 0; b < total / 32; ++b) {
        const uint8_t* blk = in + 34 * b;
        const VF vd = hn::Set(df, F16ToFloat(LoadU16(blk)));
        for (size_t i = 0; i < 32; i += N) {
          hn::StoreU(hn::Mul(vd, hn::ConvertTo(df, LoadI8AsI32(blk + 2 + i))), df, x + 32 * b + i);
        }
      }
      return;
    case Format::kQ4_0:
      for (size_t b = 0; b < total / 32; ++b) {
        const uint8_t* blk = in + 18 * b;
        const VF vd = hn::Set(df, F16ToFloat(LoadU16(blk)));
        const VI eight = hn::Set(di, 8);
        for (size_t i = 0; i < 16; i += N) {
          const VI q = LoadU8AsI32(blk + 2 + i);
          const VI lo = hn::Sub(hn::And(q, hn::Set(di, 0xF)), eight);
          const VI hi = hn::Sub(hn::ShiftRight<4>(q), eight);
          hn::StoreU(hn::Mul(vd, hn::ConvertTo(df, lo)), df, x + 32 * b + i);
          hn::StoreU(hn::Mul(vd, hn::ConvertTo(df, hi)), df, x + 32 * b + 16 + i);
        }
      }
      return;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace format_internal
}  // namespace kvcache
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvcache {
namespace format_internal {

HWY_EXPORT(EncodeRowsT);
HWY_EXPORT(DecodeRowsT);
HWY_EXPORT(FirstNonFiniteT);

size_t FirstNonFinite(const float* x, size_t n) { return HWY_DYNAMIC_DISPATCH(FirstNonFiniteT)(x, n); }

void EncodeRows(Format f, uint32_t d, size_t n, const float* x, uint8_t* out) {
  HWY_DYNAMIC_DISPATCH(EncodeRowsT)(f, d, n, x, out);
}
void DecodeRows(Format f, uint32_t d, size_t n, const uint8_t* in, float* x) {
  HWY_DYNAMIC_DISPATCH(DecodeRowsT)(f, d, n, in, x);
}

}  // namespace format_internal
}  // namespace kvcache
#endif
