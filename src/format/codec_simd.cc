// SIMD (Highway, dynamic dispatch) row encoders/decoders on prepared rows.
//
// Every kernel reproduces the scalar reference in codec_scalar.cc bit for bit:
// conversions use the same integer rounding steps, per-group choices that sum
// errors (turbo4/3/2 scale search) keep one group per SIMD lane so each lane
// runs the scalar sequence of operations, and tails use the scalar code.
// Contraction into FMA is disabled so "x - s * l" rounds identically.
//
// Turbo4/3/2 encoding works on 8 (AVX2, AVX3) or 4 (SSE4, EMU128) groups at a
// time (SCALAR: the reference): the groups' rows are transposed in registers
// (group = lane), the scale search runs on |x| (QuantizeTurboBatch says why
// that is exact) without dividing (LevelTable's |x|-space thresholds), and the
// codes are packed into words in registers.
// q8_0/q4_0 encoding follows llama.cpp's reference arithmetic per lane, a
// batch of blocks at a time (one block's scale per lane; round-half-away-from-
// zero done exactly with a truncating convert, see EncodeQ8_0Blocks).
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

// A turbo codebook as the encoder uses it. The nearest-level test fl(a / s) >
// t_j (a = |x|) is done without the division: every E4M3 scale is s = M * 2^E
// with M = 1 + m / 8 (m = its 3 top mantissa bits as a float), and abs_thr[j][m]
// is the largest float a' with fl(a' / M) <= t_j (found with the division
// itself, below). Then fl(a / s) > t_j iff a > abs_thr[j][m] * 2^E: when
// a * 2^-E is a float, a / s and (a * 2^-E) / M are the same real number and
// round alike, and fl(a' / M) > t_j iff a' > abs_thr (the division rounds
// monotonically); otherwise a < 2^-117, below both sides' boundaries. The
// product abs_thr * 2^E is exact (a normal float times a power of two, 2^-9 <=
// s <= 448). A NaN a compares false on both sides.
template <size_t L>
struct LevelTable {
  static constexpr size_t kT = L / 2 - 1;  // thresholds of the non-negative half
  alignas(64) float level[L];
  float threshold[kT];  // midpoints of the non-negative half, as in codec_scalar.cc
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

template <class DF_, class VF_ = hn::Vec<DF_>>
HWY_INLINE hn::Vec<hn::RebindToSigned<DF_>> EncodeE4M3T(DF_ df, VF_ v) {
  const hn::RebindToSigned<DF_> di;
  using VI_ = hn::Vec<decltype(di)>;
  const VI_ u = hn::BitCast(di, v);
  const VI_ sign = hn::And(hn::ShiftRight<24>(u), hn::Set(di, 0x80));
  const VI_ a = hn::And(u, hn::Set(di, 0x7FFFFFFF));
  const auto is_nan = a > hn::Set(di, 0x7F800000);
  const auto is_sat = a > hn::Set(di, 0x43DFFFFF);
  const auto is_sub = hn::Set(di, 0x3C800000) > a;
  const VF_ fs = hn::Mul(hn::BitCast(df, a), hn::Set(df, 512.0f));
  const VF_ r = hn::Sub(hn::Add(fs, hn::Set(df, 8388608.0f)), hn::Set(df, 8388608.0f));
  const VI_ sub_code = hn::ConvertTo(di, r);
  const VI_ rebased = hn::Sub(a, hn::Set(di, 120 << 23));
  const VI_ round = hn::Add(hn::Set(di, 0x7FFFF), hn::And(hn::ShiftRight<20>(rebased), hn::Set(di, 1)));
  const VI_ norm_code = hn::Min(hn::ShiftRight<20>(hn::Add(rebased, round)), hn::Set(di, 0x7E));
  VI_ res = hn::IfThenElse(is_sub, sub_code, norm_code);
  res = hn::IfThenElse(is_sat, hn::Set(di, 0x7E), res);
  res = hn::IfThenElse(is_nan, hn::Set(di, 0x7F), res);
  return hn::Or(res, sign);
}
HWY_INLINE VI EncodeE4M3(VF v) { return EncodeE4M3T(DF(), v); }

// codes in [0, 255] -> exact values (NaN codes -> 0x7FC00000 like the table).
template <class DF_>
HWY_INLINE hn::Vec<DF_> DecodeE4M3T(DF_ df, hn::Vec<hn::RebindToSigned<DF_>> c) {
  const hn::RebindToSigned<DF_> di;
  using VI_ = hn::Vec<decltype(di)>;
  const VI_ sign = hn::ShiftLeft<24>(hn::And(c, hn::Set(di, 0x80)));
  const VI_ m7 = hn::And(c, hn::Set(di, 0x7F));
  const VI_ normal = hn::Add(hn::ShiftLeft<20>(m7), hn::Set(di, 120 << 23));
  const auto subf = hn::Mul(hn::ConvertTo(df, hn::And(c, hn::Set(di, 7))), hn::Set(df, 1.0f / 512.0f));
  VI_ bits = hn::IfThenElse(hn::Set(di, 8) > m7, hn::BitCast(di, subf), normal);
  bits = hn::Or(bits, sign);
  bits = hn::IfThenElse(m7 == hn::Set(di, 0x7F), hn::Set(di, 0x7FC00000), bits);
  return hn::BitCast(df, bits);
}
HWY_INLINE VF DecodeE4M3(VI c) { return DecodeE4M3T(DF(), c); }

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

template <class DF_>
HWY_INLINE hn::Vec<hn::RebindToSigned<DF_>> EncodeBF16T(DF_, hn::Vec<DF_> v) {
  const hn::RebindToSigned<DF_> di;
  const hn::RebindToUnsigned<DF_> du;
  const auto uu = hn::BitCast(du, v);
  const auto a = hn::And(hn::BitCast(di, v), hn::Set(di, 0x7FFFFFFF));
  const auto is_nan = a > hn::Set(di, 0x7F800000);
  const auto nan_code = hn::Or(hn::ShiftRight<16>(uu), hn::Set(du, 0x40));
  const auto round = hn::Add(hn::Set(du, 0x7FFF), hn::And(hn::ShiftRight<16>(uu), hn::Set(du, 1)));
  const auto r = hn::ShiftRight<16>(hn::Add(uu, round));
  return hn::BitCast(di, hn::IfThenElse(hn::RebindMask(du, is_nan), nan_code, r));
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
//
// The SCALAR target (one lane) uses the scalar reference for these formats.
#if HWY_TARGET != HWY_SCALAR
//
// DT: 8 lanes where the target has them (AVX2, AVX3), else 4 (SSE4, EMU128).
using DT = hn::CappedTag<float, 8>;
using DTI = hn::RebindToSigned<DT>;
using DTU = hn::RebindToUnsigned<DT>;
using VT = hn::Vec<DT>;
using VTI = hn::Vec<DTI>;
using VTU = hn::Vec<DTU>;
constexpr size_t kTL = hn::MaxLanes(DT());
static_assert(kTL == 4 || kTL == 8, "turbo encoder: 4 or 8 lanes");

// In-register transpose of kTL rows of kTL floats: out[c] lane r = rows[r][c].
HWY_INLINE void Transpose(const VT* r, VT* out) {
  const DT d;
  const hn::Repartition<uint64_t, DT> d64;
  auto lo64 = [&](VT a, VT b) {
    return hn::BitCast(d, hn::InterleaveLower(d64, hn::BitCast(d64, a), hn::BitCast(d64, b)));
  };
  auto hi64 = [&](VT a, VT b) {
    return hn::BitCast(d, hn::InterleaveUpper(d64, hn::BitCast(d64, a), hn::BitCast(d64, b)));
  };
  // 4x4 within each 128-bit block of rows [base, base + 4).
  auto block4 = [&](size_t base, VT* c) {
    const VT t0 = hn::InterleaveLower(d, r[base + 0], r[base + 1]);
    const VT t1 = hn::InterleaveLower(d, r[base + 2], r[base + 3]);
    const VT t2 = hn::InterleaveUpper(d, r[base + 0], r[base + 1]);
    const VT t3 = hn::InterleaveUpper(d, r[base + 2], r[base + 3]);
    c[0] = lo64(t0, t1);
    c[1] = hi64(t0, t1);
    c[2] = lo64(t2, t3);
    c[3] = hi64(t2, t3);
  };
  if constexpr (kTL == 4) {
    block4(0, out);
  } else {
    VT a[4], b[4];
    block4(0, a);  // block 0: columns 0..3 of rows 0..3; block 1: columns 4..7
    block4(4, b);
    for (size_t c = 0; c < 4; ++c) {
      out[c] = hn::ConcatLowerLower(d, b[c], a[c]);
      out[c + 4] = hn::ConcatUpperUpper(d, b[c], a[c]);
    }
  }
}

// Lanes of an 8-entry table picked by idx (only its low 3 bits count).
HWY_INLINE VT Lookup8(const float* tab8, VTI idx) {
  const DT d;
  const DTI di;
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  (void)di;
  return VT{_mm256_permutevar8x32_ps(hn::Load(d, tab8).raw, idx.raw)};  // vpermps
#else
  if constexpr (kTL == 8) {
    return hn::TableLookupLanes(hn::Load(d, tab8), hn::IndicesFromVec(d, hn::And(idx, hn::Set(di, 7))));
  } else {
    const auto ix = hn::IndicesFromVec(d, hn::And(idx, hn::Set(di, 3)));
    const VT lo = hn::TableLookupLanes(hn::Load(d, tab8), ix);
    const VT hi = hn::TableLookupLanes(hn::Load(d, tab8 + 4), ix);
    const auto upper = hn::RebindMask(d, hn::TestBit(idx, hn::Set(di, 4)));
    return hn::IfThenElse(upper, hi, lo);
  }
#endif
}

// The scale's thresholds in |x| space (see LevelTable): thr[j] lane g =
// abs_thr[j][mantissa of s] * 2^exponent of s.
template <size_t L>
HWY_INLINE void AbsThresholds(const LevelTable<L>& t, VT s, VT* thr) {
  const DT d;
  const DTI di;
  const VTI bits = hn::BitCast(di, s);
  const VTI m = hn::ShiftRight<20>(bits);  // the exponent above bit 3 is ignored by Lookup8
  // Times 2^E as an add to the exponent field (exact: the product is normal).
  const VTI e = hn::Sub(hn::And(bits, hn::Set(di, 0x7F800000)), hn::Set(di, 127 << 23));
  for (size_t j = 0; j < LevelTable<L>::kT; ++j) {
    thr[j] = hn::BitCast(d, hn::Add(hn::BitCast(di, Lookup8(t.abs_thr[j], m)), e));
  }
}

// The non-negative level nearest to fl(a / s), from the scale's |x|-space
// thresholds: 8 lanes count the thresholds below a and look the level up
// (turbo4, turbo3); 4 lanes and turbo2 run a select chain.
template <size_t L>
HWY_INLINE VT AbsLevel(const LevelTable<L>& t, const VT* thr, VT a) {
  const DT d;
  const DTI di;
  constexpr size_t kT = LevelTable<L>::kT;
  if constexpr (kTL == 8 && L >= 8) {
    // Integer compares of the bits (non-negative floats order as their bits;
    // they issue on more pipes than float compares). A NaN a compares above
    // every threshold here and below them in the scalar code; its error is
    // NaN with any level, so the choice of scale is the same.
    const VTI ai = hn::BitCast(di, a);
    VTI sum = hn::VecFromMask(di, ai > hn::BitCast(di, thr[0]));
    for (size_t j = 1; j < kT; ++j) sum = hn::Add(sum, hn::VecFromMask(di, ai > hn::BitCast(di, thr[j])));
    return Lookup8(t.perm_level, sum);
  } else {
    VT lv = hn::Set(d, t.level[L / 2]);
    for (size_t j = 0; j < kT; ++j) lv = hn::IfThenElse(a > thr[j], hn::Set(d, t.level[L / 2 + j + 1]), lv);
    return lv;
  }
}

// Level of the nearest code for y = |x| / s (the quotient itself): a select
// chain over the shared thresholds. 4-lane targets use it for turbo4, where
// building the |x|-space thresholds (8-entry lookups in two halves) costs more
// than the divisions (measured).
template <size_t L>
HWY_INLINE VT AbsLevelOfQuotient(const LevelTable<L>& t, VT y) {
  const DT d;
  VT lv = hn::Set(d, t.level[L / 2]);
  for (size_t j = 0; j < LevelTable<L>::kT; ++j) {
    lv = hn::IfThenElse(y > hn::Set(d, t.threshold[j]), hn::Set(d, t.level[L / 2 + j + 1]), lv);
  }
  return lv;
}

template <size_t L>
constexpr bool ByQuotient() {
  return kTL == 4 && L == 16;
}

// The search's nearest non-negative level for a = |x| under scale s, given
// AbsThresholds(s) (unused where ByQuotient).
template <size_t L>
HWY_INLINE VT SearchLevel(const LevelTable<L>& t, const VT* thr, VT a, VT s) {
  if constexpr (ByQuotient<L>()) {
    (void)thr;
    return AbsLevelOfQuotient(t, hn::Div(a, s));
  } else {
    (void)s;
    return AbsLevel(t, thr, a);
  }
}

template <size_t L>
void TurboSearchLevelsOf(const LevelTable<L>& t, size_t n, const float* a, const float* s, float* level) {
  const DT d;
  alignas(64) float pa[kTL], ps[kTL], pl[kTL];
  for (size_t i = 0; i < n; i += kTL) {
    const size_t cnt = std::min(kTL, n - i);
    std::fill(pa, pa + kTL, 0.0f);
    std::fill(ps, ps + kTL, 1.0f);
    std::copy(a + i, a + i + cnt, pa);
    std::copy(s + i, s + i + cnt, ps);
    const VT vs = hn::Load(d, ps);
    VT thr[LevelTable<L>::kT];
    if constexpr (!ByQuotient<L>()) AbsThresholds(t, vs, thr);
    hn::Store(SearchLevel(t, thr, hn::Load(d, pa), vs), d, pl);
    std::copy(pl, pl + cnt, level + i);
  }
}

// NearestCode of y = x / s, exactly as codec_scalar.cc (sign of y decides the half).
template <size_t L>
HWY_INLINE VTI CodesOf(const LevelTable<L>& t, VT y) {
  const DT d;
  const DTI di;
  const VT a = hn::Abs(y);
  VTI c = hn::Zero(di);
  for (size_t j = 0; j < LevelTable<L>::kT; ++j) {
    c = hn::Sub(c, hn::VecFromMask(di, hn::RebindMask(di, a > hn::Set(d, t.threshold[j]))));
  }
  const auto pos = hn::RebindMask(di, y > hn::Zero(d));
  constexpr int32_t kHalf = static_cast<int32_t>(L / 2);
  return hn::IfThenElse(pos, hn::Add(hn::Set(di, kHalf), c), hn::Sub(hn::Set(di, kHalf - 1), c));
}

// One batch of kTL groups, v[i] lane g = value i of group g, a[i] = |v[i]|.
// Picks each lane's scale code (as QuantizeTurboGroup) and the 16 codes.
//
// The candidates' errors use |x| and the non-negative level: the scalar
// x - s * level(x / s) is the exact negation of that (division, products and
// the subtraction are sign-symmetric, the codebook is symmetric), so the
// squares are equal, except where the scalar code's sign choice differs: x > 0
// whose quotient rounds to +0, which then takes the negative level. That needs
// x <= s * 2^-150 <= 448 * 2^-150 < 2^-141, while s * level >= 2^-9 * 0.0507
// (the smallest scale and level) has a half-ulp above 2^-39, so x + s * l and
// x - s * l both round to +-(s * l): the squares are equal there too. In the
// search the nearest level comes from |x|-space thresholds (no division, see
// LevelTable; turbo4 on 4 lanes divides); the final codes divide, as the scalar code.
template <size_t L>
HWY_INLINE void QuantizeTurboBatch(const LevelTable<L>& t, const VT* v, const VT* a, VT amax,
                                   VTI* scale_code, VTI* codes) {
  const DT d;
  const DTI di;
  constexpr int kC = 2 * kTurboScaleSearch + 1;  // candidates c0-2 .. c0+2
  constexpr size_t kT = LevelTable<L>::kT;
  const VTI c0 = EncodeE4M3T(d, amax);
  VTI cc[kC];
  VT s[kC], err[kC], thr[kC][kT];
  constexpr bool kByQuotient = ByQuotient<L>();
  for (int k = 0; k < kC; ++k) {
    const VTI c = hn::Add(c0, hn::Set(di, k - kTurboScaleSearch));
    cc[k] = hn::Min(hn::Max(c, hn::Set(di, 1)), hn::Set(di, 0x7E));
    s[k] = DecodeE4M3T(d, cc[k]);
    if constexpr (!kByQuotient) AbsThresholds(t, s[k], thr[k]);
    err[k] = hn::Zero(d);
  }
  // The candidates' error sums run side by side (each in the scalar order
  // over i): five independent add chains instead of one after another.
  for (int i = 0; i < 16; ++i) {
    for (int k = 0; k < kC; ++k) {
      const VT lv = SearchLevel(t, thr[k], a[i], s[k]);
      const VT dd = hn::Sub(a[i], hn::Mul(s[k], lv));
      err[k] = hn::Add(err[k], hn::Mul(dd, dd));
    }
  }
  VTI best_c = cc[0];
  VT best_err = hn::Set(d, std::numeric_limits<float>::infinity());
  for (int k = 0; k < kC; ++k) {
    const VTI c = hn::Add(c0, hn::Set(di, k - kTurboScaleSearch));
    const auto valid = hn::And(c > hn::Zero(di), hn::Set(di, 0x7F) > c);
    const auto better = hn::And(valid, hn::RebindMask(di, err[k] < best_err));
    best_c = hn::IfThenElse(better, cc[k], best_c);
    best_err = hn::IfThenElse(hn::RebindMask(d, better), err[k], best_err);
  }
  const auto zero = hn::RebindMask(di, amax == hn::Zero(d));
  const VT sb = DecodeE4M3T(d, best_c);
  *scale_code = hn::IfThenZeroElse(zero, best_c);
  for (int i = 0; i < 16; ++i) codes[i] = hn::IfThenZeroElse(zero, CodesOf(t, hn::Div(v[i], sb)));
}

// Packs the 16 codes of each lane into its group's code bytes, as little-endian
// words: lo = bytes [0, 4), hi = bytes [4, 8) (turbo4) or [4, 6) (turbo3).
HWY_INLINE void PackWords(Format f, const VTI* k, VTU* lo, VTU* hi) {
  const DTU du;
  auto u = [&](int i) { return hn::BitCast(du, k[i]); };
  VTU a = hn::Zero(du), b = hn::Zero(du);
  if (f == Format::kTurbo4) {
    for (int i = 0; i < 8; ++i) {
      a = hn::Or(a, hn::ShiftLeftSame(u(i), 4 * i));
      b = hn::Or(b, hn::ShiftLeftSame(u(i + 8), 4 * i));
    }
  } else if (f == Format::kTurbo3) {
    for (int i = 0; i <= 10; ++i) a = hn::Or(a, hn::ShiftLeftSame(u(i), 3 * i));  // k10: low 2 bits
    b = hn::ShiftRight<2>(u(10));
    for (int i = 11; i < 16; ++i) b = hn::Or(b, hn::ShiftLeftSame(u(i), 3 * i - 32));
  } else {
    for (int i = 0; i < 16; ++i) a = hn::Or(a, hn::ShiftLeftSame(u(i), 2 * i));
  }
  *lo = a;
  *hi = b;
}

template <size_t L>
void EncodeTurboRows(const LevelTable<L>& t, Format f, uint32_t d, size_t n, const float* x,
                     uint8_t* out) {
  const DT dt;
  const RowLayout l = LayoutOf(f, d);
  const size_t rb = RowBytes(f, d);
  const size_t gpr = d / 16;
  const size_t groups = n * gpr;
  const size_t code_bytes = l.group_code_bytes;
  alignas(64) float pad[16 * kTL];
  alignas(64) uint32_t wlo[kTL], whi[kTL];
  alignas(64) int32_t sc[kTL];
  size_t row = 0, g_in_row = 0;  // of group g0
  for (size_t g0 = 0; g0 < groups; g0 += kTL) {
    const size_t cnt = std::min(kTL, groups - g0);
    const float* src = x + g0 * 16;
    if (cnt < kTL) {
      std::fill(pad, pad + 16 * kTL, 0.0f);
      std::memcpy(pad, src, cnt * 16 * sizeof(float));
      src = pad;
    }
    VT v[16], a[16];
    for (size_t q = 0; q < 16 / kTL; ++q) {
      VT r[kTL];
      for (size_t g = 0; g < kTL; ++g) r[g] = hn::LoadU(dt, src + 16 * g + q * kTL);
      Transpose(r, v + q * kTL);
    }
    VT amax = hn::Zero(dt);
    for (int i = 0; i < 16; ++i) {
      a[i] = hn::Abs(v[i]);
      amax = hn::Max(amax, a[i]);
    }
    VTI scale_code, codes[16];
    QuantizeTurboBatch(t, v, a, amax, &scale_code, codes);
    VTU lo, hi;
    PackWords(f, codes, &lo, &hi);
    hn::Store(lo, DTU(), wlo);
    hn::Store(hi, DTU(), whi);
    hn::Store(scale_code, DTI(), sc);
    for (size_t g = 0; g < cnt; ++g) {
      uint8_t* o = out + row * rb;
      uint8_t* dst = o + g_in_row * code_bytes;
      std::memcpy(dst, &wlo[g], 4);  // little-endian host (see the file comment)
      if (code_bytes > 4) std::memcpy(dst + 4, &whi[g], code_bytes - 4);
      o[l.scales_offset + g_in_row] = static_cast<uint8_t>(sc[g]);
      if (++g_in_row == gpr) {
        g_in_row = 0;
        ++row;
      }
    }
  }
}

// Turbo8 on 8-lane targets, 8 groups at a time (transposed as above): each lane's bf16 scale
// amax / 448 and 16 E4M3 codes of x / scale, as codec_scalar.cc; the codes
// packed four to a little-endian word in registers.
void EncodeTurbo8Rows(uint32_t d, size_t n, const float* x, uint8_t* out) {
  const DT dt;
  const DTI di;
  const DTU du;
  const RowLayout l = LayoutOf(Format::kTurbo8, d);
  const size_t rb = RowBytes(Format::kTurbo8, d);
  const size_t gpr = d / 16;
  const size_t groups = n * gpr;
  alignas(64) float pad[16 * kTL];
  alignas(64) uint32_t w[4][kTL];
  alignas(64) int32_t sc[kTL];
  size_t row = 0, g_in_row = 0;  // of group g0
  for (size_t g0 = 0; g0 < groups; g0 += kTL) {
    const size_t cnt = std::min(kTL, groups - g0);
    const float* src = x + g0 * 16;
    if (cnt < kTL) {
      std::fill(pad, pad + 16 * kTL, 0.0f);
      std::memcpy(pad, src, cnt * 16 * sizeof(float));
      src = pad;
    }
    VT v[16];
    for (size_t q = 0; q < 16 / kTL; ++q) {
      VT r[kTL];
      for (size_t g = 0; g < kTL; ++g) r[g] = hn::LoadU(dt, src + 16 * g + q * kTL);
      Transpose(r, v + q * kTL);
    }
    VT amax = hn::Zero(dt);
    for (int i = 0; i < 16; ++i) amax = hn::Max(amax, hn::Abs(v[i]));
    const VTI sb = EncodeBF16T(dt, hn::Div(amax, hn::Set(dt, kE4M3Max)));
    const VT s = hn::BitCast(dt, hn::ShiftLeft<16>(sb));
    const auto zero = hn::RebindMask(di, s == hn::Zero(dt));  // codes 0 (x / 0 is discarded)
    VTU words[4] = {hn::Zero(du), hn::Zero(du), hn::Zero(du), hn::Zero(du)};
    for (int i = 0; i < 16; ++i) {
      const VTI c = hn::IfThenZeroElse(zero, EncodeE4M3T(dt, hn::Div(v[i], s)));
      words[i / 4] = hn::Or(words[i / 4], hn::ShiftLeftSame(hn::BitCast(du, c), 8 * (i % 4)));
    }
    for (int j = 0; j < 4; ++j) hn::Store(words[j], du, w[j]);
    hn::Store(sb, di, sc);
    for (size_t g = 0; g < cnt; ++g) {
      uint8_t* o = out + row * rb;
      uint8_t* dst = o + g_in_row * 16;
      for (int j = 0; j < 4; ++j) std::memcpy(dst + 4 * j, &w[j][g], 4);  // little-endian host
      StoreU16(static_cast<uint16_t>(sc[g]), o + l.scales_offset + 2 * g_in_row);
      if (++g_in_row == gpr) {
        g_in_row = 0;
        ++row;
      }
    }
  }
}

#endif  // HWY_TARGET != HWY_SCALAR

// ---- q8_0 / q4_0 (llama.cpp's reference arithmetic, 32-value blocks) ----

// std::round (half away from zero), exactly: Trunc(v + copysign(h, v)) with
// h = 0.5 - 2^-25, the float below 0.5. For v >= 0 with fraction f: f >= 0.5
// puts v + h within half a spacing of (or above) floor(v) + 1, which it then
// rounds to (1 - 2^-25 is the tie between 1 - 2^-24 and 1, and goes to 1);
// f < 0.5 means f <= 0.5 - ulp(v), so v + h <= floor(v) + 1 - ulp(v) - 2^-25,
// at or below the float under floor(v) + 1. v >= 2^23 is an integer and
// v + h rounds back to it. Negative v mirror this; NaN stays NaN.
HWY_INLINE VF RoundHalfAway(VF v) {
  const DF df;
  return hn::Trunc(hn::Add(v, hn::CopySign(hn::Set(df, 0.49999997f), v)));
}

HWY_INLINE float BlockMaxAbs(const float* xb) {
  const DF df;
  const size_t N = hn::Lanes(df);
  VF m = hn::Abs(hn::LoadU(df, xb));
  for (size_t i = N; i < 32; i += N) m = hn::Max(m, hn::Abs(hn::LoadU(df, xb + i)));
  return hn::GetLane(hn::MaxOfLanes(df, m));
}

// q4_0's scale source: the signed value of the block's first element of
// largest magnitude (0 if every element is 0).
HWY_INLINE float BlockSignedMax(const float* xb) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const float amax = BlockMaxAbs(xb);
  if (amax == 0.0f) return 0.0f;
  const VF va = hn::Set(df, amax);
  for (size_t i = 0; i < 32; i += N) {
    const intptr_t p = hn::FindFirstTrue(df, hn::Abs(hn::LoadU(df, xb + i)) == va);
    if (p >= 0) return xb[i + static_cast<size_t>(p)];
  }
  return 0.0f;
}

void EncodeQ8_0BlocksEach(size_t blocks, const float* HWY_RESTRICT x, uint8_t* HWY_RESTRICT out) {
  const DF df;
  const DI di;
  const size_t N = hn::Lanes(df);
  for (size_t b = 0; b < blocks; ++b) {
    const float* xb = x + 32 * b;
    uint8_t* ob = out + 34 * b;
    const float dd = BlockMaxAbs(xb) / 127.0f;
    const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
    StoreU16(FloatToF16(dd), ob);
    const VF vid = hn::Set(df, id);
    for (size_t i = 0; i < 32; i += N) {
      VF q = RoundHalfAway(hn::Mul(hn::LoadU(df, xb + i), vid));
      q = hn::IfThenZeroElse(hn::IsNaN(q), q);  // 0 * inf (a subnormal d): ClampToInt's 0
      q = hn::Min(hn::Max(q, hn::Set(df, -127.0f)), hn::Set(df, 127.0f));
      StoreI32AsI8(hn::ConvertTo(di, q), ob + 2 + i);
    }
  }
}

// min(15, ClampToInt(v, 0, 255)): NaN and negatives -> 0, then truncate.
HWY_INLINE VI Q4Code(VF v) {
  const DF df;
  const DI di;
  v = hn::IfThenElseZero(v >= hn::Zero(df), v);
  return hn::ConvertTo(di, hn::Min(v, hn::Set(df, 15.0f)));
}

void EncodeQ4_0BlocksEach(size_t blocks, const float* HWY_RESTRICT x, uint8_t* HWY_RESTRICT out) {
  const DF df;
  const size_t N = hn::Lanes(df);
  for (size_t b = 0; b < blocks; ++b) {
    const float* xb = x + 32 * b;
    uint8_t* ob = out + 18 * b;
    const float mx = BlockSignedMax(xb);
    const float dd = mx / -8.0f;
    const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
    StoreU16(FloatToF16(dd), ob);
    const VF vid = hn::Set(df, id);
    const VF half = hn::Set(df, 8.5f);
    for (size_t j = 0; j < 16; j += N) {
      const VI lo = Q4Code(hn::Add(hn::Mul(hn::LoadU(df, xb + j), vid), half));
      const VI hi = Q4Code(hn::Add(hn::Mul(hn::LoadU(df, xb + 16 + j), vid), half));
      StoreI32AsU8(hn::Or(lo, hn::ShiftLeft<4>(hi)), ob + 2 + j);
    }
  }
}

// The batched encoders: kQB blocks at a time, their scales made in one
// vector (d = amax / 127 or max / -8, id = 1 / d, the f16 of d: the scalar
// expressions lane by lane), then each value's code. With id finite, |x * id|
// <= 127 * (1 + 2^-22) (q8_0) or 8 * (1 + 2^-22) (q4_0) (x is at most the
// block's amax, and id is 1 / d within two roundings), so the clamps cannot
// bind and a truncating convert of x * id + copysign(0.49999997, x * id)
// (q8_0, see RoundHalfAway) or of x * id + 8.5 (q4_0, >= 0.4999) is the
// scalar code. A batch with an infinite id (d so small that 1 / d overflows;
// d = 0 gives id 0, which is fine) takes the per-block code. The last batch
// may be partial (a single row of head_dim 128 is 4 blocks).
constexpr size_t kQB = hn::MaxLanes(DF());

// amax[kQB] (q8_0) or the signed first-largest value mx[kQB] (q4_0) -> the
// f16 codes of d and the lanes of id; false if some id is not finite.
HWY_INLINE bool BatchScales(const float* m, float divisor, uint16_t* f16, float* id) {
  const DF df;
  const VF dd = hn::Div(hn::Load(df, m), hn::Set(df, divisor));
  const VF inv = hn::IfThenZeroElse(dd == hn::Zero(df), hn::Div(hn::Set(df, 1.0f), dd));
  hn::Store(inv, df, id);
  alignas(64) int32_t h[kQB];
  hn::Store(EncodeF16(dd), DI(), h);
  for (size_t b = 0; b < kQB; ++b) f16[b] = static_cast<uint16_t>(h[b]);
  const DI di;
  const VI e = hn::And(hn::BitCast(di, inv), hn::Set(di, 0x7F800000));
  return hn::AllFalse(di, e == hn::Set(di, 0x7F800000));
}

// 32 int32 codes q[32 / N] -> 32 int8 bytes at o.
HWY_INLINE void StoreCodes32(const VI* q, uint8_t* o) {
  const DI di;
  const size_t N = hn::Lanes(di);
#if HWY_TARGET == HWY_SSE4
  {
    // packssdw of two vectors, then packsswb: 8 codes per pair.
    const hn::Repartition<int16_t, DI> d16;
    const hn::Rebind<int8_t, decltype(d16)> d8;
    for (size_t i = 0; i < 32 / N; i += 2) {
      hn::StoreU(hn::DemoteTo(d8, hn::ReorderDemote2To(d16, q[i], q[i + 1])), d8,
                 reinterpret_cast<int8_t*>(o + i * N));
    }
  }
#else
  for (size_t i = 0; i < 32 / N; ++i) StoreI32AsI8(q[i], o + i * N);
#endif
}

void EncodeQ8_0Blocks(size_t blocks, const float* HWY_RESTRICT x, uint8_t* HWY_RESTRICT out) {
  const DF df;
  const DI di;
  const size_t N = hn::Lanes(df);
  const VF half = hn::Set(df, 0.49999997f);
  for (size_t b0 = 0; b0 < blocks; b0 += kQB) {
    const size_t cnt = std::min(kQB, blocks - b0);  // lanes past cnt: amax 0, unused
    alignas(64) float amax[kQB] = {}, id[kQB];
    uint16_t f16[kQB];
    for (size_t b = 0; b < cnt; ++b) amax[b] = BlockMaxAbs(x + 32 * (b0 + b));
    if (!BatchScales(amax, 127.0f, f16, id)) {
      EncodeQ8_0BlocksEach(cnt, x + 32 * b0, out + 34 * b0);
      continue;
    }
    for (size_t b = 0; b < cnt; ++b) {
      const float* xb = x + 32 * (b0 + b);
      uint8_t* ob = out + 34 * (b0 + b);
      StoreU16(f16[b], ob);
      const VF vid = hn::Set(df, id[b]);
      VI q[32 / kQB];
      for (size_t i = 0; i < 32 / N; ++i) {
        const VF v = hn::Mul(hn::LoadU(df, xb + i * N), vid);
        q[i] = hn::ConvertTo(di, hn::Add(v, hn::CopySign(half, v)));
      }
      StoreCodes32(q, ob + 2);
    }
  }
}

void EncodeQ4_0Blocks(size_t blocks, const float* HWY_RESTRICT x, uint8_t* HWY_RESTRICT out) {
  const DF df;
  const DI di;
  const size_t N = hn::Lanes(df);
  const VF half = hn::Set(df, 8.5f);
  const VI fifteen = hn::Set(di, 15);
  for (size_t b0 = 0; b0 < blocks; b0 += kQB) {
    const size_t cnt = std::min(kQB, blocks - b0);  // lanes past cnt: mx 0, unused
    alignas(64) float mx[kQB] = {}, id[kQB];
    uint16_t f16[kQB];
    for (size_t b = 0; b < cnt; ++b) mx[b] = BlockSignedMax(x + 32 * (b0 + b));
    if (!BatchScales(mx, -8.0f, f16, id)) {
      EncodeQ4_0BlocksEach(cnt, x + 32 * b0, out + 18 * b0);
      continue;
    }
    for (size_t b = 0; b < cnt; ++b) {
      const float* xb = x + 32 * (b0 + b);
      uint8_t* ob = out + 18 * (b0 + b);
      StoreU16(f16[b], ob);
      const VF vid = hn::Set(df, id[b]);
      for (size_t j = 0; j < 16; j += N) {
        const VI lo = hn::Min(hn::ConvertTo(di, hn::Add(hn::Mul(hn::LoadU(df, xb + j), vid), half)), fifteen);
        const VI hi = hn::Min(hn::ConvertTo(di, hn::Add(hn::Mul(hn::LoadU(df, xb + 16 + j), vid), half)), fifteen);
        StoreI32AsU8(hn::Or(lo, hn::ShiftLeft<4>(hi)), ob + 2 + j);
      }
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
#if HWY_TARGET != HWY_SCALAR
      // 8 lanes: transposed batches; 4 lanes (SSE4) measured no faster that way.
      if constexpr (kTL == 8) {
        EncodeTurbo8Rows(d, n, x, out);
        return;
      }
#endif
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
#if HWY_TARGET != HWY_SCALAR
    case Format::kTurbo4: EncodeTurboRows(Table4(), f, d, n, x, out); return;
    case Format::kTurbo3: EncodeTurboRows(Table3(), f, d, n, x, out); return;
    case Format::kTurbo2: EncodeTurboRows(Table2(), f, d, n, x, out); return;
#else
    case Format::kTurbo4:
    case Format::kTurbo3:
    case Format::kTurbo2: EncodeRowsScalar(f, d, n, x, out); return;
#endif
    case Format::kQ8_0: EncodeQ8_0Blocks(total / 32, x, out); return;
    case Format::kQ4_0: EncodeQ4_0Blocks(total / 32, x, out); return;
  }
}

void TurboSearchLevelsT(Format f, size_t n, const float* a, const float* s, float* level) {
#if HWY_TARGET != HWY_SCALAR
  switch (f) {
    case Format::kTurbo4: TurboSearchLevelsOf(Table4(), n, a, s, level); return;
    case Format::kTurbo3: TurboSearchLevelsOf(Table3(), n, a, s, level); return;
    default: TurboSearchLevelsOf(Table2(), n, a, s, level); return;
  }
#else
  // SCALAR encodes turbo with the reference: the level of NearestCode.
  const LevelTable<16>& t4 = Table4();
  const LevelTable<8>& t3 = Table3();
  const LevelTable<4>& t2 = Table2();
  for (size_t i = 0; i < n; ++i) {
    const float y = a[i] / s[i];
    const float* th = f == Format::kTurbo4 ? t4.threshold : f == Format::kTurbo3 ? t3.threshold : t2.threshold;
    const float* lv = f == Format::kTurbo4 ? t4.level + 8 : f == Format::kTurbo3 ? t3.level + 4 : t2.level + 2;
    const size_t nt = f == Format::kTurbo4 ? 7 : f == Format::kTurbo3 ? 3 : 1;
    size_t c = 0;
    for (size_t j = 0; j < nt; ++j) c += y > th[j] ? 1 : 0;
    level[i] = lv[c];
  }
#endif
}

void EncodeRowsScatteredT(Format f, uint32_t d, size_t n, const float* HWY_RESTRICT x,
                          uint8_t* const* HWY_RESTRICT dst) {
  // The rows go to n slots that are usually not in cache (a pool block per
  // head): their lines are requested for writing up front, so the misses
  // overlap instead of stalling each row's stores in turn.
  const size_t rb = RowBytes(f, d);
  for (size_t r = 0; r < n; ++r) {
    for (size_t o = 0; o < rb; o += 64) __builtin_prefetch(dst[r] + o, 1, 3);
    __builtin_prefetch(dst[r] + rb - 1, 1, 3);
  }
  for (size_t r = 0; r < n; ++r) EncodeRowsT(f, d, 1, x + r * d, dst[r]);
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
HWY_EXPORT(EncodeRowsScatteredT);
HWY_EXPORT(DecodeRowsT);
HWY_EXPORT(FirstNonFiniteT);
HWY_EXPORT(TurboSearchLevelsT);

void TurboSearchLevels(Format f, size_t n, const float* a, const float* s, float* level) {
  HWY_DYNAMIC_DISPATCH(TurboSearchLevelsT)(f, n, a, s, level);
}

size_t FirstNonFinite(const float* x, size_t n) { return HWY_DYNAMIC_DISPATCH(FirstNonFiniteT)(x, n); }

void EncodeRows(Format f, uint32_t d, size_t n, const float* x, uint8_t* out) {
  HWY_DYNAMIC_DISPATCH(EncodeRowsT)(f, d, n, x, out);
}
void EncodeRowsScattered(Format f, uint32_t d, size_t n, const float* x, uint8_t* const* dst) {
  HWY_DYNAMIC_DISPATCH(EncodeRowsScatteredT)(f, d, n, x, dst);
}
void DecodeRows(Format f, uint32_t d, size_t n, const uint8_t* in, float* x) {
  HWY_DYNAMIC_DISPATCH(DecodeRowsT)(f, d, n, in, x);
}

}  // namespace format_internal
}  // namespace kvcache
#endif
