// SIMD (Highway, dynamic dispatch) row encoders/decoders on prepared rows:
// the conversions the families' encoders share, then each family's encoder
// (format/<family>/encode-inl.h, included here) and its Decoder<F>
// (format/decoders-inl.h), picked by format.
//
// Every kernel reproduces the scalar reference (format/<family>/scalar.cc)
// bit for bit: conversions use the same integer rounding steps, per-group
// choices that sum errors keep one group per SIMD lane, and tails use the
// scalar code. Contraction into FMA is disabled so "x - s * l" rounds
// identically. Decoding runs the attention kernels' decoders and puts their
// values back in natural order; a row holding a block that decoder does not
// decode as the format defines (Decoder::Regular: NaN codes, huge scales; the
// encoder never writes them) takes the scalar reference.
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

#include "format/decoders-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvcache {
namespace format_internal {
namespace HWY_NAMESPACE {

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

// Stores of int32 lanes as narrow lanes.
HWY_INLINE void StoreI32AsU16(VI v, uint8_t* p) {
  const hn::Rebind<uint16_t, DI> d16;
  hn::StoreU(hn::DemoteTo(d16, v), d16, reinterpret_cast<uint16_t*>(p));
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

HWY_INLINE void CopyFloats(const float* HWY_RESTRICT src, size_t n, float* HWY_RESTRICT dst) {
  const DF df;
  const size_t N = hn::Lanes(df);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::LoadU(df, src + i), df, dst + i);
  if (i < n) std::memcpy(dst + i, src + i, (n - i) * sizeof(float));  // may be unaligned
}

// The families' encoders.
#include "format/plain/encode-inl.h"
#include "format/fp8_q8/encode-inl.h"
#include "format/turbo/encode-inl.h"
#include "format/ggml/encode-inl.h"
#include "format/turbo/rotate-inl.h"

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

// Each family's SIMD encoder of n rows of d values, by Family (traits.h).
using EncodeRowsFn = void (*)(Format f, uint32_t d, size_t n, const float* HWY_RESTRICT x,
                              uint8_t* HWY_RESTRICT out);
void EncodePlainRows(Format f, uint32_t d, size_t n, const float* HWY_RESTRICT x,
                     uint8_t* HWY_RESTRICT out) {
  EncodePlainRowsOf(f, n * d, x, out);
}
void EncodeGgmlRows(Format f, uint32_t d, size_t n, const float* HWY_RESTRICT x,
                    uint8_t* HWY_RESTRICT out) {
  EncodeGgmlRowsOf(f, n * d, x, out);
}
constexpr EncodeRowsFn kFamilyEncoders[kNumFamilies] = {
    &EncodePlainRows,    // Family::kPlain
    &EncodeFp8Q8RowsOf,  // Family::kFp8Q8
    &EncodeTurboRowsOf,  // Family::kTurbo
    &EncodeGgmlRows,     // Family::kGgml
};

void EncodeRowsT(Format f, uint32_t d, size_t n, const float* HWY_RESTRICT x,
                 uint8_t* HWY_RESTRICT out) {
  kFamilyEncoders[static_cast<size_t>(FamilyOf(f))](f, d, n, x, out);
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

void TurboSearchLevelsT(Format f, size_t n, const float* a, const float* s, float* level) {
  TurboSearchLevelsFor(f, n, a, s, level);
}

// Block's output (kernel order, divided by ValueMul(F)) as the stored
// values [16b, 16b + 16) in natural order at out.
template <Format F>
HWY_INLINE void StoreNatural(VF* v, float* HWY_RESTRICT out) {
  const DF df;
  if constexpr (ValueMul(F) != 1.0f) {
    for (size_t i = 0; i < kVecs; ++i) v[i] = hn::Mul(v[i], hn::Set(df, ValueMul(F)));
  }
  if constexpr (!EvenOdd<F>()) {
    for (size_t i = 0; i < kVecs; ++i) hn::StoreU(v[i], df, out + i * kN);
  } else if constexpr (kVecs == 1) {
    // 16 lanes: one permutation, lane 2i from lane i and lane 2i + 1 from 8 + i.
    alignas(64) static constexpr int32_t kInterleave[16] = {0, 8,  1, 9,  2, 10, 3, 11,
                                                            4, 12, 5, 13, 6, 14, 7, 15};
    hn::StoreU(hn::TableLookupLanes(v[0], hn::SetTableIndices(df, kInterleave)), df, out);
  } else {
    for (size_t i = 0; i < kVecs / 2; ++i) {
      hn::StoreInterleaved2(v[i], v[kVecs / 2 + i], df, out + 2 * i * kN);
    }
  }
}

// Row decode through Decoder<F>: false (x partly written) if some block is
// not Regular.
template <Format F>
HWY_INLINE bool DecodeRowWith(const Decoder<F>& dec, const uint8_t* HWY_RESTRICT p, uint32_t d,
                              float* HWY_RESTRICT x) {
  const RowRef row = dec.Prepare(p, d);
  const uint32_t full = d / kBlockValues;
  for (uint32_t b = 0; b < full; ++b) {
    if (!RegularBlock(dec, row, b)) return false;
    VF v[kVecs];
    dec.Block(row, b, v);
    StoreNatural<F>(v, x + b * kBlockValues);
  }
  if constexpr (Decoder<F>::kTail) {
    for (uint32_t i = full * kBlockValues; i < d; ++i) x[i] = dec.Value(row, i) * ValueMul(F);
  }
  return true;
}

template <Format F>
void DecodeRowsOf(uint32_t d, size_t n, const uint8_t* HWY_RESTRICT in, float* HWY_RESTRICT x) {
  const Decoder<F> dec = MakeDecoder<F>(d);
  const size_t rb = RowBytes(F, d);
  for (size_t r = 0; r < n; ++r) {
    if (!DecodeRowWith(dec, in + r * rb, d, x + r * d)) DecodeRowsScalar(F, d, 1, in + r * rb, x + r * d);
  }
}

void DecodeRowsT(Format f, uint32_t d, size_t n, const uint8_t* HWY_RESTRICT in,
                 float* HWY_RESTRICT x) {
  VisitFormat(f, [&]<Format F>() HWY_ATTR { DecodeRowsOf<F>(d, n, in, x); });
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
HWY_EXPORT(RotateRowsT);
HWY_EXPORT(InverseRotateRowsT);

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

void RotateRows(const float* signs, uint32_t head_dim, size_t n, float* x) {
  HWY_DYNAMIC_DISPATCH(RotateRowsT)(signs, head_dim, n, x);
}
void InverseRotateRows(const float* signs, uint32_t head_dim, size_t n, float* x) {
  HWY_DYNAMIC_DISPATCH(InverseRotateRowsT)(signs, head_dim, n, x);
}
void RotateInPlace(const float* signs, uint32_t head_dim, float* x) {
  RotateRows(signs, head_dim, 1, x);
}
void InverseRotateInPlace(const float* signs, uint32_t head_dim, float* x) {
  InverseRotateRows(signs, head_dim, 1, x);
}

}  // namespace format_internal
}  // namespace kvcache
#endif
