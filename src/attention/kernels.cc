// SIMD attention kernels over a Plan (plan.h), one Highway dispatch per call.
//
// Per job (one kv head of one sequence, nq query vectors) the work is three
// passes over the head's stored rows:
//   K pass:   s[qi][r] = scale * <q_qi, k_r> + bias_qi for visible rows,
//             -inf otherwise; running max per query vector.
//   exp pass: e[qi][r] = Exp(s - m) in place (Exp of reference.h, vectorized).
//   V pass:   per fixed 512-row segment: l += e_r, o[d] += e_r * v_r[d];
//             segments folded in order; out = o / l, then the value transforms.
// K and V rows are decoded 16 values at a time straight into registers
// (Decoder<F>) and consumed by up to 4 query vectors at once, so the decode
// of a row is shared by the q heads of a group and nothing is expanded to an
// f32 row in memory. The f32:f32 path without transforms ("exact") uses
// separate multiplies and adds in the order of reference.h, so it equals
// AttendReference bit for bit; every other path uses fused multiply-adds.
//
// Rows are walked as runs inside one block (HeadRows: one block-table read
// per block, not per row) with a software prefetch stream kPrefetchBytes
// ahead (Prefetcher: one prefetch per new cache line). When no row can be
// masked (no stored positions, no window, queries at or past the last row:
// plain decode) the passes skip every per-row visibility check.
//
// Parallelism: jobs run on the plan's pool, a job per task, or on paged
// f16/bf16/f32 views a group of up to 4 consecutive kv heads per task walked
// together 128 rows at a time (RunWhole, plan.h). When there are fewer jobs than
// twice the threads, each job's rows are split into chunks of whole segments
// (flash-decoding): K pass per chunk, a barrier, exp + V pass per chunk into
// per-segment partials, a barrier, then the in-order segment fold per job.
// The result is the same for every split.
//
// Thread safety: scratch is thread_local; a Plan is only read.
#pragma GCC optimize("fp-contract=off")

// SSSE3 adds compile time and nothing over SSE4 for these kernels.
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS HWY_SSSE3
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "attention/plan.h"
#include "attention/reference.h"
#include "format/format_internal.h"

HWY_BEFORE_NAMESPACE();
namespace kvcache {
namespace attention_internal {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace fi = format_internal;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
using DU = hn::RebindToUnsigned<DF>;
using DI = hn::RebindToSigned<DF>;
constexpr size_t kN = hn::MaxLanes(DF());
constexpr size_t kVecs = kDotLanes / kN;  // vectors per 16-value block
static_assert(kN <= kDotLanes && kDotLanes % kN == 0, "lane count must divide 16");

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kTwo112 = 5.192296858534827628530496329220096e33f;  // 2^112

// ---------------------------------------------------------------------------
// Table lookups on small float tables (idx in u32 lanes, already < size).

template <size_t kSize>
struct Table {
  // kSize <= 8: one vector when kN >= 8, else two 4-lane halves; a plain
  // array on single-lane targets.
  VF lo, hi;
  float raw[8] = {};
  explicit Table(const float* t) {
    // Entries repeat with period kSize, so a lookup that reads only the low
    // 3 bits of an index (Permute8) sees the right value for any index whose
    // low log2(kSize) bits are the code.
    alignas(64) float buf[2 * kDotLanes] = {};
    for (size_t i = 0; i < 8; ++i) buf[i] = raw[i] = t[i % kSize];
    const DF df;
    if constexpr (kN < 4) {
      lo = hi = hn::Zero(df);
    } else if constexpr (kN >= 8) {
      lo = hn::Load(df, buf);
      hi = lo;
    } else {
      lo = hn::Load(df, buf);
      hi = hn::Load(df, buf + 4);
    }
  }
  HWY_INLINE VF Lookup(hn::Vec<DU> idx) const {
    const DF df;
    const DI di;
    if constexpr (kN < 4) {
      alignas(64) uint32_t ib[kDotLanes];
      alignas(64) float fb[kDotLanes];
      hn::Store(idx, DU(), ib);
      for (size_t i = 0; i < kN; ++i) fb[i] = raw[ib[i] & 7];
      return hn::Load(df, fb);
    } else if constexpr (kN >= 8 || kSize <= 4) {
      return hn::TableLookupLanes(lo, hn::IndicesFromVec(df, hn::BitCast(di, idx)));
    } else {
      const auto i3 = hn::BitCast(di, hn::And(idx, hn::Set(DU(), 3)));
      const VF a = hn::TableLookupLanes(lo, hn::IndicesFromVec(df, i3));
      const VF b = hn::TableLookupLanes(hi, hn::IndicesFromVec(df, i3));
      // bit 2 of idx selects the upper half
      const auto upper = hn::RebindMask(df, hn::TestBit(idx, hn::Set(DU(), 4u)));
      return hn::IfThenElse(upper, b, a);
    }
  }
};

// table[idx & 7] per lane, for tables of at most 8 entries: on AVX2 one
// vpermps, which reads only the low 3 bits of each index, so callers skip
// masking the code out of its packed word; elsewhere Table::Lookup on the
// masked index.
template <size_t kSize>
HWY_INLINE VF Permute8(const Table<kSize>& t, hn::Vec<DU> idx) {
#if HWY_TARGET == HWY_AVX2
  return VF{_mm256_permutevar8x32_ps(t.lo.raw, idx.raw)};
#else
  return t.Lookup(hn::And(idx, hn::Set(DU(), static_cast<uint32_t>(kSize - 1))));
#endif
}

// ---------------------------------------------------------------------------
// Decoders: Block(row, b, out) writes values [16b, 16b + 16) of a stored row,
// scales applied, into kVecs vectors. Tail formats (any head_dim) also
// provide Value(row, i) for the last partial block.

struct RowRef {
  const uint8_t* p;
  float scale;  // q8 row scale; unused elsewhere
};

HWY_INLINE hn::Vec<DU> LoadBytesU32(const uint8_t* p) {
  const hn::Rebind<uint8_t, DF> du8;
  return hn::PromoteTo(DU(), hn::LoadU(du8, p));
}

HWY_INLINE VF E4M3Bits(hn::Vec<DU> u) {
  // sign -> bit 31, exponent+mantissa -> bits 20..26: the value times 2^-120
  // (subnormal codes become f32 subnormals, exactly).
  const DU du;
  const auto mag = hn::ShiftLeft<20>(hn::And(u, hn::Set(du, 0x7Fu)));
  const auto sign = hn::ShiftLeft<24>(hn::And(u, hn::Set(du, 0x80u)));
  return hn::BitCast(DF(), hn::Or(mag, sign));
}

// What E4M3Block's values must be multiplied by to be the code values.
constexpr float kE4M3BlockMul = 256.0f;

// The values of 16 E4M3 codes at p times 2^-8 (exact: the 2^8 goes into a
// scale the caller applies anyway, see ValueMul). With F16C (AVX2 and up)
// each code becomes an f16 by moving its bits (sign stays at bit 15,
// exponent and mantissa shift right by one: the f16 is the value times
// 2^-8, subnormals included), one conversion per 8 values. Without F16C,
// E4M3Bits: the value times 2^-120, then times 2^112.
HWY_INLINE void E4M3Block(const uint8_t* p, VF* out) {
#if HWY_TARGET <= HWY_AVX2
  const hn::FixedTag<uint8_t, 16> d8;
  const hn::FixedTag<int16_t, 16> d16;
  const hn::FixedTag<hwy::float16_t, 16> dh;
  const auto w = hn::BitCast(d16, hn::ShiftLeft<8>(hn::PromoteTo(hn::RebindToUnsigned<decltype(d16)>(), hn::LoadU(d8, p))));
  const auto h = hn::BitCast(dh, hn::And(hn::ShiftRight<1>(w), hn::Set(d16, static_cast<int16_t>(0xBFFF))));
#if HWY_TARGET == HWY_AVX2
  const hn::FixedTag<hwy::float16_t, 8> dh8;
  out[0] = hn::PromoteTo(DF(), hn::LowerHalf(dh8, h));
  out[1] = hn::PromoteTo(DF(), hn::UpperHalf(dh8, h));
#else
  out[0] = hn::PromoteTo(DF(), h);
#endif
#else
  const VF m = hn::Set(DF(), kTwo112);
  for (size_t v = 0; v < kVecs; ++v) out[v] = hn::Mul(E4M3Bits(LoadBytesU32(p + v * kN)), m);
#endif
}

// The f16 at p in every lane: one vcvtph2ps with F16C (AVX2 and up), the
// scalar decode elsewhere. Both are exact.
HWY_INLINE VF BroadcastF16(const uint8_t* p) {
#if HWY_TARGET <= HWY_AVX2
  const hn::Rebind<uint16_t, DF> d16;
  const hn::Rebind<hwy::float16_t, DF> dh;
  return hn::PromoteTo(DF(), hn::BitCast(dh, hn::Set(d16, fi::LoadU16(p))));
#else
  return hn::Set(DF(), fi::F16ToFloat(fi::LoadU16(p)));
#endif
}

HWY_INLINE uint32_t LoadU32(const uint8_t* p) {
  uint32_t w;
  std::memcpy(&w, p, 4);
  return w;
}

template <Format F>
struct Decoder;

template <>
struct Decoder<Format::kF32> {
  static constexpr bool kTail = true;
  HWY_INLINE RowRef Prepare(const uint8_t* p, uint32_t) const { return {p, 1.0f}; }
  HWY_INLINE void Block(const RowRef& r, uint32_t b, VF* out) const {
    const float* f = reinterpret_cast<const float*>(r.p) + b * kDotLanes;
    for (size_t v = 0; v < kVecs; ++v) out[v] = hn::LoadU(DF(), f + v * kN);
  }
  HWY_INLINE float Value(const RowRef& r, uint32_t i) const {
    float x;
    std::memcpy(&x, r.p + 4 * i, 4);
    return x;
  }
};

template <>
struct Decoder<Format::kF16> {
  static constexpr bool kTail = true;
  HWY_INLINE RowRef Prepare(const uint8_t* p, uint32_t) const { return {p, 1.0f}; }
  HWY_INLINE void Block(const RowRef& r, uint32_t b, VF* out) const {
    const hn::Rebind<hwy::float16_t, DF> dh;
    const hwy::float16_t* h = reinterpret_cast<const hwy::float16_t*>(r.p) + b * kDotLanes;
    for (size_t v = 0; v < kVecs; ++v) out[v] = hn::PromoteTo(DF(), hn::LoadU(dh, h + v * kN));
  }
  HWY_INLINE float Value(const RowRef& r, uint32_t i) const {
    return fi::F16ToFloat(fi::LoadU16(r.p + 2 * i));
  }
};

template <>
struct Decoder<Format::kBF16> {
  static constexpr bool kTail = true;
  HWY_INLINE RowRef Prepare(const uint8_t* p, uint32_t) const { return {p, 1.0f}; }
  // Kernel order (plan.h): the even values of the group, then the odd ones.
  // A 32-bit word holds value 2w in its low half and 2w + 1 in its high
  // half, so the word shifted left by 16 is the even value as an f32 and the
  // word with its low half cleared is the odd one: one op per 8 values.
  HWY_INLINE void Block(const RowRef& r, uint32_t b, VF* out) const {
    const DU du;
    const uint8_t* g = r.p + b * 2 * kDotLanes;
    if constexpr (kVecs >= 2) {
      for (size_t v = 0; v < kVecs / 2; ++v) {
        const auto w = hn::LoadU(du, reinterpret_cast<const uint32_t*>(g) + v * kN);
        out[v] = hn::BitCast(DF(), hn::ShiftLeft<16>(w));
        out[kVecs / 2 + v] = hn::BitCast(DF(), hn::And(w, hn::Set(du, 0xFFFF0000u)));
      }
    } else {
      alignas(64) uint32_t buf[kDotLanes];
      for (size_t i = 0; i < kDotLanes / 2; ++i) {
        const uint32_t w = LoadU32(g + 4 * i);
        buf[i] = w << 16;
        buf[kDotLanes / 2 + i] = w & 0xFFFF0000u;
      }
      out[0] = hn::BitCast(DF(), hn::Load(du, buf));
    }
  }
  HWY_INLINE float Value(const RowRef& r, uint32_t i) const {
    return fi::BF16ToFloat(fi::LoadU16(r.p + 2 * i));
  }
};

// fp8 values come out times 2^-8 (E4M3Block); ValueMul puts the 2^8 back
// once per score (K) and once per output (Finalize), which is exact and
// saves a multiply per 8 values.
template <>
struct Decoder<Format::kFp8E4M3> {
  static constexpr bool kTail = true;
  HWY_INLINE RowRef Prepare(const uint8_t* p, uint32_t) const { return {p, 1.0f}; }
  HWY_INLINE void Block(const RowRef& r, uint32_t b, VF* out) const {
    E4M3Block(r.p + b * kDotLanes, out);
  }
  HWY_INLINE float Value(const RowRef& r, uint32_t i) const {
    return fi::E4M3ToFloat(r.p[i]) * (1.0f / kE4M3BlockMul);
  }
};

// What a format's decoded values must be multiplied by to be the stored
// values (a power of two).
constexpr float ValueMul(Format f) { return f == Format::kFp8E4M3 ? kE4M3BlockMul : 1.0f; }

template <>
struct Decoder<Format::kQ8> {
  static constexpr bool kTail = true;
  HWY_INLINE RowRef Prepare(const uint8_t* p, uint32_t d) const { return {p, fi::Q8RowScale(p, d)}; }
  HWY_INLINE void Block(const RowRef& r, uint32_t b, VF* out) const {
    const hn::Rebind<int8_t, DF> di8;
    const VF s = hn::Set(DF(), r.scale);
    const int8_t* c = reinterpret_cast<const int8_t*>(r.p) + b * kDotLanes;
    for (size_t v = 0; v < kVecs; ++v) {
      out[v] = hn::Mul(s, hn::ConvertTo(DF(), hn::PromoteTo(DI(), hn::LoadU(di8, c + v * kN))));
    }
  }
  HWY_INLINE float Value(const RowRef& r, uint32_t i) const {
    return r.scale * static_cast<float>(static_cast<int8_t>(r.p[i]));
  }
};

// Turbo rows: codes, then one scale per 16-value group at scales_offset.
template <>
struct Decoder<Format::kTurbo8> {
  static constexpr bool kTail = false;
  uint32_t scales_offset;
  explicit Decoder(uint32_t d) : scales_offset(d) {}
  HWY_INLINE RowRef Prepare(const uint8_t* p, uint32_t) const { return {p, 1.0f}; }
  HWY_INLINE void Block(const RowRef& r, uint32_t b, VF* out) const {
    // The codes come out times 2^-8, so the group scale goes in times 2^8.
    const VF s =
        hn::Set(DF(), kE4M3BlockMul * fi::BF16ToFloat(fi::LoadU16(r.p + scales_offset + 2 * b)));
    E4M3Block(r.p + b * kDotLanes, out);
    for (size_t v = 0; v < kVecs; ++v) out[v] = hn::Mul(out[v], s);
  }
  HWY_INLINE float Value(const RowRef&, uint32_t) const { return 0.0f; }
};

// Per-lane shift counts for packed codes of vector v of a block: value
// i = v * kN + lane sits at bit kBits * (i % kPeriod) of its 32-bit word.
template <uint32_t kBits, uint32_t kPeriod>
HWY_INLINE hn::Vec<DU> LaneShifts(size_t v) {
  alignas(64) uint32_t buf[kDotLanes];
  for (size_t i = 0; i < kN; ++i) buf[i] = kBits * static_cast<uint32_t>((v * kN + i) % kPeriod);
  return hn::Load(DU(), buf);
}

// turbo4 in nibble order (plan.h): vector v of a group holds the low
// nibbles (v * kN < 8) or the high nibbles of kN consecutive code bytes.
template <>
struct Decoder<Format::kTurbo4> {
  static constexpr bool kTail = false;
  uint32_t scales_offset;
  Table<8> neg, pos;  // levels 0..7 and 8..15
  explicit Decoder(uint32_t d)
      : scales_offset(d / 2), neg(fi::kTurbo4Levels.data()), pos(fi::kTurbo4Levels.data() + 8) {}
  HWY_INLINE RowRef Prepare(const uint8_t* p, uint32_t) const { return {p, 1.0f}; }
  HWY_INLINE void Block(const RowRef& r, uint32_t b, VF* out) const {
    const uint8_t* c = r.p + 8 * b;
    const VF sv = hn::Set(DF(), fi::E4M3ToFloat(r.p[scales_offset + b]));
#if HWY_TARGET == HWY_AVX2
    // Low nibbles, then high nibbles, of the 8 code bytes: two vpermps on
    // the code's low 3 bits, its bit 3 moved to the sign bit picks the half.
    const auto u = LoadBytesU32(c);
    const auto h = hn::ShiftRight<4>(u);
    out[0] = hn::Mul(hn::IfNegativeThenElse(hn::BitCast(DF(), hn::ShiftLeft<28>(u)), Permute8(pos, u),
                                            Permute8(neg, u)),
                     sv);
    out[1] = hn::Mul(hn::IfNegativeThenElse(hn::BitCast(DF(), hn::ShiftLeft<24>(u)), Permute8(pos, h),
                                            Permute8(neg, h)),
                     sv);
#else
    const DU du;
    for (size_t v = 0; v < kVecs; ++v) {
      hn::Vec<DU> idx;
      if constexpr (kN <= 8) {
        const auto u = LoadBytesU32(c + (v * kN) % 8);
        idx = (v * kN < 8) ? hn::And(u, hn::Set(du, 15u)) : hn::ShiftRight<4>(u);
      } else {
        alignas(64) uint32_t buf[kDotLanes];
        for (size_t i = 0; i < 8; ++i) {
          buf[i] = c[i] & 15u;
          buf[8 + i] = c[i] >> 4;
        }
        idx = hn::Load(du, buf);
      }
      const auto i7 = hn::And(idx, hn::Set(du, 7u));
      const VF a = neg.Lookup(i7);
      const VF bb = pos.Lookup(i7);
      const auto upper = hn::RebindMask(DF(), hn::TestBit(idx, hn::Set(du, 8u)));
      out[v] = hn::Mul(hn::IfThenElse(upper, bb, a), sv);
    }
#endif
  }
  HWY_INLINE float Value(const RowRef&, uint32_t) const { return 0.0f; }
};

template <>
struct Decoder<Format::kTurbo3> {
  static constexpr bool kTail = false;
  uint32_t scales_offset;
  Table<8> levels;
  hn::Vec<DU> shifts[kVecs];
  explicit Decoder(uint32_t d) : scales_offset(6 * (d / 16)), levels(fi::kTurbo3Levels.data()) {
    for (size_t v = 0; v < kVecs; ++v) shifts[v] = LaneShifts<3, 8>(v);
  }
  HWY_INLINE RowRef Prepare(const uint8_t* p, uint32_t) const { return {p, 1.0f}; }
  HWY_INLINE void Block(const RowRef& r, uint32_t b, VF* out) const {
    const DU du;
    const uint8_t* c = r.p + 6 * b;
    const VF sv = hn::Set(DF(), fi::E4M3ToFloat(r.p[scales_offset + b]));
    // Values 0..7 are bits 0..23 of bytes 0..3, values 8..15 bits 0..23 of
    // bytes 3..6 (byte 6 is still inside the row: next group or a scale).
    for (size_t v = 0; v < kVecs; ++v) {
      hn::Vec<DU> w;
      if constexpr (kN <= 8) {
        w = hn::Set(du, LoadU32(c + 3 * ((v * kN) / 8)));
      } else {
        w = hn::IfThenElse(hn::FirstN(du, 8), hn::Set(du, LoadU32(c)), hn::Set(du, LoadU32(c + 3)));
      }
      out[v] = hn::Mul(Permute8(levels, w >> shifts[v]), sv);
    }
  }
  HWY_INLINE float Value(const RowRef&, uint32_t) const { return 0.0f; }
};

template <>
struct Decoder<Format::kTurbo2> {
  static constexpr bool kTail = false;
  uint32_t scales_offset;
  Table<4> levels;
  hn::Vec<DU> shifts[kVecs];
  explicit Decoder(uint32_t d) : scales_offset(d / 4), levels(fi::kTurbo2Levels.data()) {
    for (size_t v = 0; v < kVecs; ++v) shifts[v] = LaneShifts<2, 16>(v);
  }
  HWY_INLINE RowRef Prepare(const uint8_t* p, uint32_t) const { return {p, 1.0f}; }
  HWY_INLINE void Block(const RowRef& r, uint32_t b, VF* out) const {
    const DU du;
    const auto w = hn::Set(du, LoadU32(r.p + 4 * b));
    const VF sv = hn::Set(DF(), fi::E4M3ToFloat(r.p[scales_offset + b]));
    for (size_t v = 0; v < kVecs; ++v) {
      out[v] = hn::Mul(Permute8(levels, w >> shifts[v]), sv);
    }
  }
  HWY_INLINE float Value(const RowRef&, uint32_t) const { return 0.0f; }
};

template <>
struct Decoder<Format::kQ8_0> {
  static constexpr bool kTail = false;
  HWY_INLINE RowRef Prepare(const uint8_t* p, uint32_t) const { return {p, 1.0f}; }
  HWY_INLINE void Block(const RowRef& r, uint32_t b, VF* out) const {
    const hn::Rebind<int8_t, DF> di8;
    const uint8_t* blk = r.p + 34 * (b / 2);
    const VF d = BroadcastF16(blk);
    const int8_t* c = reinterpret_cast<const int8_t*>(blk + 2 + 16 * (b % 2));
    for (size_t v = 0; v < kVecs; ++v) {
      out[v] = hn::Mul(d, hn::ConvertTo(DF(), hn::PromoteTo(DI(), hn::LoadU(di8, c + v * kN))));
    }
  }
  HWY_INLINE float Value(const RowRef&, uint32_t) const { return 0.0f; }
};

template <>
struct Decoder<Format::kQ4_0> {
  static constexpr bool kTail = false;
  HWY_INLINE RowRef Prepare(const uint8_t* p, uint32_t) const { return {p, 1.0f}; }
  HWY_INLINE void Block(const RowRef& r, uint32_t b, VF* out) const {
    const DU du;
    const uint8_t* blk = r.p + 18 * (b / 2);
    const VF d = BroadcastF16(blk);
    const auto eight = hn::Set(DI(), 8);
    for (size_t v = 0; v < kVecs; ++v) {
      auto u = LoadBytesU32(blk + 2 + v * kN);
      u = (b % 2) ? hn::ShiftRight<4>(u) : hn::And(u, hn::Set(du, 15u));
      const auto q = hn::Sub(hn::BitCast(DI(), u), eight);
      out[v] = hn::Mul(hn::ConvertTo(DF(), q), d);
    }
  }
  HWY_INLINE float Value(const RowRef&, uint32_t) const { return 0.0f; }
};

template <Format F>
HWY_INLINE Decoder<F> MakeDecoder(uint32_t d) {
  if constexpr (F == Format::kTurbo8 || F == Format::kTurbo4 || F == Format::kTurbo3 ||
                F == Format::kTurbo2) {
    return Decoder<F>(d);
  } else {
    (void)d;
    return Decoder<F>();
  }
}

// Values [16b, head_dim) of a tail block, zero padded.
template <Format F>
HWY_INLINE void TailBlock(const Decoder<F>& dec, const RowRef& r, uint32_t b, uint32_t head_dim,
                          VF* out) {
  alignas(64) float buf[kDotLanes] = {};
  for (uint32_t i = b * kDotLanes; i < head_dim; ++i) buf[i - b * kDotLanes] = dec.Value(r, i);
  for (size_t v = 0; v < kVecs; ++v) out[v] = hn::Load(DF(), buf + v * kN);
}

// ---------------------------------------------------------------------------
// The reference reduction of 16 running sums held as kVecs vectors.

template <class D>
HWY_INLINE float ReduceHalving(D d, hn::Vec<D> v) {
#if HWY_TARGET == HWY_SCALAR
  (void)d;
  return hn::GetLane(v);
#else
  if constexpr (hn::MaxLanes(D()) > 4) {
    const hn::Half<D> dh;
    return ReduceHalving(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)));
  } else {
    (void)d;
    v = hn::Add(v, hn::Shuffle1032(v));
    v = hn::Add(v, hn::Shuffle2301(v));
    return hn::GetLane(v);
  }
#endif
}

HWY_INLINE float Reduce16(VF* acc) {
  for (size_t c = kVecs; c > 1; c /= 2) {
    for (size_t i = 0; i < c / 2; ++i) acc[i] = hn::Add(acc[i], acc[i + c / 2]);
  }
  return ReduceHalving(DF(), acc[0]);
}

#if HWY_TARGET != HWY_SCALAR
// Sums the 128-bit blocks of v and stores the 4 resulting lanes.
template <class D>
HWY_INLINE void StoreBlockSum(D d, hn::Vec<D> v, float* out4) {
  if constexpr (hn::MaxLanes(D()) > 4) {
    const hn::Half<D> dh;
    StoreBlockSum(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)), out4);
  } else {
    hn::StoreU(v, d, out4);
  }
}
#endif

// Four dot products at once (any order: lossy paths only): out4[j] = sum of
// the lanes of acc_j.
HWY_INLINE void Reduce4(VF a, VF b, VF c, VF d, float* out4) {
#if HWY_TARGET == HWY_SCALAR
  out4[0] = hn::GetLane(a);
  out4[1] = hn::GetLane(b);
  out4[2] = hn::GetLane(c);
  out4[3] = hn::GetLane(d);
#else
  const DF df;
  const hn::Repartition<double, DF> dd;
  const VF ab = hn::Add(hn::InterleaveLower(df, a, b), hn::InterleaveUpper(df, a, b));
  const VF cd = hn::Add(hn::InterleaveLower(df, c, d), hn::InterleaveUpper(df, c, d));
  const auto ab64 = hn::BitCast(dd, ab), cd64 = hn::BitCast(dd, cd);
  const VF s = hn::Add(hn::BitCast(df, hn::InterleaveLower(dd, ab64, cd64)),
                       hn::BitCast(df, hn::InterleaveUpper(dd, ab64, cd64)));
  StoreBlockSum(df, s, out4);
#endif
}

template <bool kExact>
HWY_INLINE VF MulAcc(VF a, VF b, VF acc) {
  if constexpr (kExact) {
    return hn::Add(acc, hn::Mul(a, b));
  } else {
    return hn::MulAdd(a, b, acc);
  }
}

// Vector Exp with exactly the operations of reference.h's Exp.
HWY_INLINE VF ExpV(VF x) {
  const DF df;
  const DI di;
  const auto ok = x >= hn::Set(df, kExpMin);
  x = hn::IfThenElseZero(ok, x);
  const VF t = hn::Mul(x, hn::Set(df, kLog2e));
  const VF magic = hn::Set(df, kRoundMagic);
  const VF n = hn::Sub(hn::Add(t, magic), magic);
  const VF a = hn::Mul(n, hn::Set(df, kLn2Hi));
  const VF r1 = hn::Sub(x, a);
  const VF b = hn::Mul(n, hn::Set(df, kLn2Lo));
  const VF r = hn::Sub(r1, b);
  VF p = hn::Set(df, kExpC6);
  p = hn::Mul(p, r);
  p = hn::Add(p, hn::Set(df, kExpC5));
  p = hn::Mul(p, r);
  p = hn::Add(p, hn::Set(df, kExpC4));
  p = hn::Mul(p, r);
  p = hn::Add(p, hn::Set(df, kExpC3));
  p = hn::Mul(p, r);
  p = hn::Add(p, hn::Set(df, kExpC2));
  p = hn::Mul(p, r);
  p = hn::Mul(p, r);
  p = hn::Add(p, r);
  p = hn::Add(p, hn::Set(df, 1.0f));
  const auto ni = hn::ConvertTo(di, n);
  const VF pow2 = hn::BitCast(df, hn::ShiftLeft<23>(hn::Add(ni, hn::Set(di, 127))));
  return hn::IfThenElseZero(ok, hn::Mul(p, pow2));
}

// ---------------------------------------------------------------------------
// Walking the stored rows of one head on one side.

// Software prefetch distance in bytes of one head's row stream: paged
// blocks are scattered, so the hardware prefetcher loses the stream at every
// block boundary.
constexpr uint32_t kPrefetchBytes = 6144;
// The stored rows of one head on one side, handed out as runs of consecutive
// rows inside one block (the whole range for per-head contiguous storage),
// so the block table is read once per block, not once per row.
struct HeadRows {
  const uint8_t* head_base;
  const uint32_t* table;
  size_t block_stride;
  uint32_t block_size, row_bytes;
  const uint8_t* contiguous;  // per-head contiguous storage (side.head_base)
  HeadRows() = default;
  HeadRows(const LayerKvView& v, const KvSideView& s, uint32_t head)
      : head_base(s.base + static_cast<size_t>(head) * s.head_stride),
        table(v.block_table),
        block_stride(s.block_stride),
        block_size(v.block_size),
        row_bytes(s.row_bytes),
        contiguous(s.head_base ? s.head_base[head] : nullptr) {}
  // Row r (< r_end) and the number of rows of its run: *n in [1, r_end - r].
  HWY_INLINE const uint8_t* Run(uint32_t r, uint32_t r_end, uint32_t* n) const {
    if (contiguous != nullptr) {
      *n = r_end - r;
      return contiguous + static_cast<size_t>(r) * row_bytes;
    }
    const uint32_t b = r / block_size, off = r - b * block_size;
    *n = std::min(block_size - off, r_end - r);
    return head_base + static_cast<size_t>(table[b]) * block_stride +
           static_cast<size_t>(off) * row_bytes;
  }
};

// Prefetches a row stream kPrefetchBytes ahead of its consumer: Step() once
// per consumed row issues one prefetch per new cache line. The stream is
// rows [r0, ends[g]) of n heads taken chunk by chunk: rows [c, c + chunk) of
// head 0, then of head 1, ..., then the next chunk; with one head and
// chunk = kWholeRun, that head's rows in order.
constexpr uint32_t kWholeRun = 0xFFFFFFFFu;
struct Prefetcher {
  const HeadRows* heads;
  const uint32_t* ends;
  uint32_t n, chunk, row_bytes, max_end = 0;  // row_bytes: the same for every head of a view
  uint64_t c0;        // first row of the current chunk
  uint32_t g = 0;     // current head
  uint32_t r, seg_end, left = 0;
  bool done = false;
  const uint8_t* p = nullptr;  // next row to prefetch
  uintptr_t next_line = 0;     // first line not yet prefetched in this run
  Prefetcher(const HeadRows* h, const uint32_t* e, uint32_t n_heads, uint32_t r0, uint32_t chunk_rows)
      : heads(h), ends(e), n(n_heads), chunk(chunk_rows), row_bytes(h[0].row_bytes), c0(r0), r(r0) {
    for (uint32_t i = 0; i < n; ++i) max_end = std::max(max_end, ends[i]);
    seg_end = static_cast<uint32_t>(std::min<uint64_t>(c0 + chunk, ends[0]));
    const uint32_t ahead = std::max<uint32_t>(1, kPrefetchBytes / row_bytes);
    for (uint32_t i = 0; i < ahead && !done; ++i) Step();
  }
  HWY_INLINE void Step() {
    if (left == 0) {
      if (done) return;
      while (r >= seg_end) {  // the next head's part of this chunk, or the next chunk
        if (++g == n) {
          g = 0;
          c0 += chunk;
        }
        if (c0 >= max_end) {
          done = true;
          return;
        }
        r = static_cast<uint32_t>(c0);
        seg_end = static_cast<uint32_t>(std::min<uint64_t>(c0 + chunk, ends[g]));
      }
      p = heads[g].Run(r, seg_end, &left);
      next_line = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63};
    }
    const uintptr_t end = reinterpret_cast<uintptr_t>(p) + row_bytes;
    for (; next_line < end; next_line += 64) {
      __builtin_prefetch(reinterpret_cast<const void*>(next_line), 0, 3);
    }
    p += row_bytes;
    ++r;
    --left;
  }
};

struct Visibility {
  const uint32_t* positions;  // nullptr: row r is position r
  uint32_t window, n_sink;
  HWY_INLINE uint32_t Pos(uint32_t r) const { return positions ? positions[r] : r; }
  HWY_INLINE bool Visible(uint32_t p, uint32_t qpos) const {
    if (p > qpos) return false;
    return window == 0 || p + window > qpos || p < n_sink;
  }
};

HWY_INLINE Visibility MakeVisibility(const Plan& plan, const HeadJob& job) {
  const LayerKvView& v = *job.view;
  return {v.positions ? v.positions[job.head] : nullptr, plan.window, plan.n_sink};
}

// ---------------------------------------------------------------------------
// K pass: rows [r0, r1) for query vectors [qi0, qi0 + kQB).

struct KArgs {
  const Plan* plan;
  const HeadJob* job;
  uint32_t qi0, r0, r1;
  float* scores;  // [nq][job.rows] (the job's whole buffer)
  float* maxes;   // [nq] running maxima (the job's)
  Prefetcher* pf;  // the walk's stream, or nullptr: one of the call's own
};

// The kQB dot products of one stored row with queries q[0..kQB).
template <Format F, bool kExact, int kQB>
HWY_INLINE void RowDots(const Decoder<F>& dec, const uint8_t* p, uint32_t d,
                        const float* const* q, float* dots) {
  const uint32_t full_blocks = d / kDotLanes;
  const uint32_t n_blocks = full_blocks + ((d % kDotLanes) != 0 ? 1 : 0);
  const RowRef row = dec.Prepare(p, d);
  VF acc[kQB][kVecs];
  for (int j = 0; j < kQB; ++j) {
    for (size_t v = 0; v < kVecs; ++v) acc[j][v] = hn::Zero(DF());
  }
  // Full blocks, then the zero-padded tail block (no per-block test).
  auto accumulate = [&](uint32_t b, const VF* kv) HWY_ATTR {
    for (int j = 0; j < kQB; ++j) {
      for (size_t v = 0; v < kVecs; ++v) {
        const VF qq = hn::LoadU(DF(), q[j] + b * kDotLanes + v * kN);
        acc[j][v] = MulAcc<kExact>(qq, kv[v], acc[j][v]);
      }
    }
  };
  for (uint32_t b = 0; b < full_blocks; ++b) {
    VF kv[kVecs];
    dec.Block(row, b, kv);
    accumulate(b, kv);
  }
  if constexpr (Decoder<F>::kTail) {
    if (n_blocks != full_blocks) {
      VF kv[kVecs];
      TailBlock(dec, row, full_blocks, d, kv);
      accumulate(full_blocks, kv);
    }
  }
  if constexpr (!kExact && kQB == 4) {
    for (int j = 0; j < kQB; ++j) {
      for (size_t v = 1; v < kVecs; ++v) acc[j][0] = hn::Add(acc[j][0], acc[j][v]);
    }
    Reduce4(acc[0][0], acc[1][0], acc[2][0], acc[3][0], dots);
  } else {
    for (int j = 0; j < kQB; ++j) dots[j] = Reduce16(acc[j]);
  }
}

// ---------------------------------------------------------------------------
// Integer K path for int8 keys (q8, q8_0): each query vector is quantized
// once per K pass to int16 (q ~= qscale * q16, |q16| <= 32767, round to
// nearest), and a row's dot product is int8 x int16 multiply-adds into int32
// lanes (ReorderWidenMulAccumulate: vpmaddwd on x86, 2x the multiply-adds
// of an f32 FMA and no float conversion of the codes). The query's rounding
// moves a score by at most scale * qscale / 2 * sum_i |k_i| (documented in
// docs/attention.md). Used when head_dim is a multiple of 32 and at most
// kIntMaxDim, so that no int32 lane can overflow (a lane adds at most d / 8
// pairs, on SSE4, of at most 2 * 128 * 32767 each: < 2^30 for d = 1024).

constexpr uint32_t kIntMaxDim = 1024;

// (Not on the scalar target, whose 1-lane vectors have no int16 pairs.)
template <Format F>
constexpr bool kIntKeys = HWY_TARGET != HWY_SCALAR && (F == Format::kQ8 || F == Format::kQ8_0);

HWY_INLINE bool IntPathFits(uint32_t d) { return d % 32 == 0 && d <= kIntMaxDim; }

// q16[d] and its scale from q[d] (d a multiple of 32).
HWY_INLINE float QuantizeQuery(const float* q, uint32_t d, int16_t* q16) {
#if HWY_TARGET == HWY_SCALAR
  (void)q;
  (void)d;
  (void)q16;
  return 0.0f;  // the integer path is off on this target
#else
  const DF df;
  VF vmax = hn::Zero(df);
  VF vbad = hn::Zero(df);  // x * 0 is NaN exactly for x inf or NaN
  for (uint32_t i = 0; i < d; i += kN) {
    const VF x = hn::LoadU(df, q + i);
    vmax = hn::Max(vmax, hn::Abs(x));
    vbad = hn::Add(vbad, hn::Mul(x, hn::Zero(df)));
  }
  const float amax = std::isnan(hn::GetLane(hn::SumOfLanes(df, vbad)))
                         ? std::numeric_limits<float>::infinity()
                         : hn::GetLane(hn::MaxOfLanes(df, vmax));
  if (!(amax > 0.0f) || !std::isfinite(amax)) {
    // Zero: every dot is 0. inf or NaN (the calls reject a non-finite
    // query, but a finite one can still overflow in the column scales or the
    // rotation): the scale is NaN, so every dot is NaN, as in the float path.
    std::fill(q16, q16 + d, int16_t{0});
    return amax == 0.0f ? 0.0f : std::numeric_limits<float>::quiet_NaN();
  }
  // Round to nearest; |q * inv| <= 32767 up to rounding, and the demotion
  // saturates.
  const VF inv = hn::Set(df, 32767.0f / amax);
  const hn::Rebind<int16_t, DI> d16;
  for (uint32_t i = 0; i < d; i += kN) {
    hn::StoreU(hn::DemoteTo(d16, hn::NearestInt(hn::Mul(hn::LoadU(df, q + i), inv))), d16, q16 + i);
  }
  return amax / 32767.0f;
#endif
}

#if HWY_TARGET != HWY_SCALAR
using DI32 = hn::ScalableTag<int32_t>;
using DI16 = hn::Repartition<int16_t, DI32>;
constexpr size_t kN16 = hn::MaxLanes(DI16());
static_assert(32 % kN16 == 0, "int16 lanes must divide a q8_0 block");

// The int16 x int8 products of values [i, i + kN16) of q16 and codes, added
// into (s0, s1).
HWY_INLINE void MulAddCodes(const int8_t* codes, const int16_t* q16, hn::Vec<DI32>& s0,
                            hn::Vec<DI32>& s1) {
  const DI16 d16;
  const hn::Rebind<int8_t, DI16> d8;
  const auto c = hn::PromoteTo(d16, hn::LoadU(d8, codes));
  s0 = hn::ReorderWidenMulAccumulate(DI32(), c, hn::LoadU(d16, q16), s0, s1);
}

// dots[j] ~= <q_j, k> for the int8 row at p (scales applied), kQB queries.
template <Format F, int kQB>
HWY_INLINE void RowDotsInt(const uint8_t* p, uint32_t d, const int16_t* const* q16,
                           const float* qscale, float* dots) {
  const DI32 di;
  VF tot[kQB];
  if constexpr (F == Format::kQ8) {
    hn::Vec<DI32> s0[kQB], s1[kQB];
    for (int j = 0; j < kQB; ++j) s0[j] = s1[j] = hn::Zero(di);
    const int8_t* c = reinterpret_cast<const int8_t*>(p);
    for (uint32_t i = 0; i < d; i += kN16) {
      for (int j = 0; j < kQB; ++j) MulAddCodes(c + i, q16[j] + i, s0[j], s1[j]);
    }
    for (int j = 0; j < kQB; ++j) tot[j] = hn::ConvertTo(DF(), hn::Add(s0[j], s1[j]));
  } else {
    for (int j = 0; j < kQB; ++j) tot[j] = hn::Zero(DF());
    for (uint32_t blk = 0; blk < d / 32; ++blk) {
      const uint8_t* b = p + 34 * blk;
      const VF scale = BroadcastF16(b);
      const int8_t* c = reinterpret_cast<const int8_t*>(b + 2);
      hn::Vec<DI32> s0[kQB], s1[kQB];
      for (int j = 0; j < kQB; ++j) s0[j] = s1[j] = hn::Zero(di);
      for (uint32_t i = 0; i < 32; i += kN16) {
        for (int j = 0; j < kQB; ++j) MulAddCodes(c + i, q16[j] + 32 * blk + i, s0[j], s1[j]);
      }
      for (int j = 0; j < kQB; ++j) {
        tot[j] = hn::MulAdd(hn::ConvertTo(DF(), hn::Add(s0[j], s1[j])), scale, tot[j]);
      }
    }
  }
  const float row_scale = F == Format::kQ8 ? fi::Q8RowScale(p, d) : 1.0f;
  if constexpr (kQB == 4) {
    Reduce4(tot[0], tot[1], tot[2], tot[3], dots);
  } else {
    for (int j = 0; j < kQB; ++j) dots[j] = hn::GetLane(hn::SumOfLanes(DF(), tot[j]));
  }
  for (int j = 0; j < kQB; ++j) dots[j] = dots[j] * (qscale[j] * row_scale);
}
#else
template <Format F, int kQB>
void RowDotsInt(const uint8_t* p, uint32_t d, const int16_t* const* q16, const float* qscale,
                float* dots);  // never instantiated on this target
#endif

// True when every row in [r0, r1) is visible to every query of the job
// (no stored positions, no window, queries at or after row r1 - 1): the
// common decode case, which skips all per-row visibility checks.
HWY_INLINE bool AllVisible(const Visibility& vis, const QueryVec* qv, int nq, uint32_t r1) {
  if (vis.positions != nullptr || vis.window != 0) return false;
  for (int j = 0; j < nq; ++j) {
    if (qv[j].qpos + 1 < r1) return false;
  }
  return true;
}

// The K pass proper; kInt: int8 keys through RowDotsInt with the queries
// already quantized (q16, qscale).
template <Format F, bool kExact, int kQB, bool kInt>
void KPassRows(const KArgs& a, const int16_t* const* q16, const float* qscale) {
  const Plan& plan = *a.plan;
  const HeadJob& job = *a.job;
  const LayerKvView& view = *job.view;
  const uint32_t d = plan.head_dim;
  const Decoder<F> dec = MakeDecoder<F>(d);
  const Visibility vis = MakeVisibility(plan, job);
  const QueryVec* qv = plan.queries.data() + job.first_query + a.qi0;
  const float* q[kQB];
  float* s[kQB];
  float m[kQB];
  float bias[kQB];
  for (int j = 0; j < kQB; ++j) {
    q[j] = qv[j].q;
    s[j] = a.scores + static_cast<size_t>(a.qi0 + j) * job.rows;
    m[j] = a.maxes[a.qi0 + j];
    bias[j] = qv[j].bias;
  }
  const float scale = plan.scale * ValueMul(F);
  const bool has_bias = job.has_bias;
  const bool all_visible = AllVisible(vis, qv, kQB, a.r1);
  const HeadRows rows(view, view.k, job.head);
  auto row_dots = [&](const uint8_t* p, float* dots) HWY_ATTR {
    if constexpr (kInt) {
      RowDotsInt<F, kQB>(p, d, q16, qscale, dots);
    } else {
      (void)q16;
      (void)qscale;
      RowDots<F, kExact, kQB>(dec, p, d, q, dots);
    }
  };
  std::optional<Prefetcher> own_pf;
  if (a.pf == nullptr) own_pf.emplace(&rows, &a.r1, 1, a.r0, kWholeRun);
  Prefetcher& pf = a.pf ? *a.pf : *own_pf;
  for (uint32_t r = a.r0; r < a.r1;) {
    uint32_t n;
    const uint8_t* p = rows.Run(r, a.r1, &n);
    const uint32_t run_end = r + n;
    if (all_visible) {
      for (; r < run_end; ++r, p += rows.row_bytes) {
        pf.Step();
        float dots[4];
        row_dots(p, dots);
        for (int j = 0; j < kQB; ++j) {
          float x = dots[j] * scale;
          if (has_bias) x = x + bias[j];
          s[j][r] = x;
          m[j] = std::max(m[j], x);
        }
      }
      continue;
    }
    for (; r < run_end; ++r, p += rows.row_bytes) {
      pf.Step();
      const uint32_t pos = vis.Pos(r);
      uint32_t mask = 0;
      for (int j = 0; j < kQB; ++j) mask |= vis.Visible(pos, qv[j].qpos) ? (1u << j) : 0u;
      if (mask == 0) {
        for (int j = 0; j < kQB; ++j) s[j][r] = kNegInf;
        continue;
      }
      float dots[4];
      row_dots(p, dots);
      for (int j = 0; j < kQB; ++j) {
        if (!(mask & (1u << j))) {
          s[j][r] = kNegInf;
          continue;
        }
        float x = dots[j] * scale;
        if (has_bias) x = x + bias[j];
        s[j][r] = x;
        m[j] = std::max(m[j], x);
      }
    }
  }
  for (int j = 0; j < kQB; ++j) a.maxes[a.qi0 + j] = m[j];
}

template <Format F, bool kExact, int kQB>
void KPass(const KArgs& a) {
  if constexpr (kIntKeys<F> && !kExact) {
    const uint32_t d = a.plan->head_dim;
    if (IntPathFits(d)) {
      // int8 keys: the integer path, the queries quantized once per call.
      alignas(64) int16_t q16_buf[kQB * kIntMaxDim];
      const int16_t* q16[kQB];
      float qscale[kQB];
      const QueryVec* qv = a.plan->queries.data() + a.job->first_query + a.qi0;
      for (int j = 0; j < kQB; ++j) {
        qscale[j] = QuantizeQuery(qv[j].q, d, q16_buf + j * kIntMaxDim);
        q16[j] = q16_buf + j * kIntMaxDim;
      }
      return KPassRows<F, kExact, kQB, true>(a, q16, qscale);
    }
  }
  KPassRows<F, kExact, kQB, false>(a, nullptr, nullptr);
}

// ---------------------------------------------------------------------------
// V pass: rows [r0, r1) inside one segment, query vectors [qi0, qi0 + kQB);
// adds into l[nq] and o[nq][padded_dim] (the segment's partial sums).

struct VArgs {
  const Plan* plan;
  const HeadJob* job;
  uint32_t qi0, r0, r1;
  const float* e;  // [nq][job.rows]
  float* l;        // [nq]
  float* o;        // [nq][padded_dim]
  Prefetcher* pf;  // the walk's stream, or nullptr: one of the call's own
};

constexpr uint32_t kTileRows = 16;

template <Format F, bool kExact, int kQB>
void VPass(const VArgs& a) {
  const Plan& plan = *a.plan;
  const HeadJob& job = *a.job;
  const LayerKvView& view = *job.view;
  const uint32_t d = plan.head_dim, pd = plan.padded_dim;
  const uint32_t n_blocks = pd / kDotLanes;
  const uint32_t full_blocks = d / kDotLanes;
  const Decoder<F> dec = MakeDecoder<F>(d);
  const Visibility vis = MakeVisibility(plan, job);
  const QueryVec* qv = plan.queries.data() + job.first_query + a.qi0;
  const float* e[kQB];
  float* o[kQB];
  for (int j = 0; j < kQB; ++j) {
    e[j] = a.e + static_cast<size_t>(a.qi0 + j) * job.rows;
    o[j] = a.o + static_cast<size_t>(a.qi0 + j) * pd;
  }
  const bool all_visible = AllVisible(vis, qv, kQB, a.r1);
  const HeadRows hrows(view, view.v, job.head);
  // Prefetch runs on past the segment, so the next segment's rows are in
  // flight when this call ends. A tile's prefetch steps are spread over its
  // value blocks, not issued as the tile is gathered: a burst of 16 rows'
  // lines (64 for bf16) at once made the V pass on a 32k context 1.7-1.8x
  // slower than the K pass over the same bytes, spread ~1.0x (see
  // docs/attention.md).
  std::optional<Prefetcher> own_pf;
  if (a.pf == nullptr) own_pf.emplace(&hrows, &job.rows, 1, a.r0, kWholeRun);
  Prefetcher& pf = a.pf ? *a.pf : *own_pf;
  RowRef rows[kTileRows];
  uint32_t masks[kTileRows];
  uint32_t ridx[kTileRows];
  const uint8_t* run_p = nullptr;
  uint32_t run_left = 0;
  for (uint32_t t0 = a.r0; t0 < a.r1;) {
    const uint32_t tile_r0 = t0;
    uint32_t n = 0;
    bool all = true;
    for (; n < kTileRows && t0 < a.r1; ++t0) {
      if (run_left == 0) run_p = hrows.Run(t0, a.r1, &run_left);
      const uint8_t* p = run_p;
      run_p += hrows.row_bytes;
      --run_left;
      if (!all_visible) {
        // masks and ridx are read only here (masked tiles, gathered weights).
        const uint32_t pos = vis.Pos(t0);
        uint32_t mask = 0;
        for (int j = 0; j < kQB; ++j) mask |= vis.Visible(pos, qv[j].qpos) ? (1u << j) : 0u;
        if (mask == 0) continue;
        all = all && mask == (1u << kQB) - 1;
        masks[n] = mask;
        ridx[n] = t0;
      }
      rows[n] = dec.Prepare(p, d);
      ++n;
    }
    // One prefetch step per row taken from the stream (masked ones too),
    // `per` (+1 for the first `extra` blocks) before each value block.
    const uint32_t steps = t0 - tile_r0;
    const uint32_t per = steps / n_blocks, extra = steps % n_blocks;
    auto prefetch_part = [&](uint32_t b) {
      for (uint32_t k = per + (b < extra ? 1 : 0); k > 0; --k) pf.Step();
    };
    if (n == 0) {
      for (uint32_t k = 0; k < steps; ++k) pf.Step();
      continue;
    }
    // The tile's weights w[j][i] (masked entries are never read): straight
    // from e when every row is visible (the tile is rows tile_r0 + i), else
    // gathered. l adds them in row order either way.
    float et[kQB][kTileRows];
    const float* w[kQB];
    for (int j = 0; j < kQB; ++j) {
      float l = a.l[a.qi0 + j];
      if (all_visible) {
        w[j] = e[j] + tile_r0;
        for (uint32_t i = 0; i < n; ++i) l = l + w[j][i];
      } else {
        for (uint32_t i = 0; i < n; ++i) {
          et[j][i] = e[j][ridx[i]];
          if (masks[i] & (1u << j)) l = l + et[j][i];
        }
        w[j] = et[j];
      }
      a.l[a.qi0 + j] = l;
    }
    // Per 16-value block b: o[., b] += sum over the tile's rows of e * v,
    // rows in order. The tail block and the masked case are separate loops
    // so the common one tests nothing per row.
    auto block = [&](uint32_t b, auto decode) HWY_ATTR {
      VF acc[kQB][kVecs];
      for (int j = 0; j < kQB; ++j) {
        for (size_t v = 0; v < kVecs; ++v) acc[j][v] = hn::LoadU(DF(), o[j] + b * kDotLanes + v * kN);
      }
      if (all) {
        for (uint32_t i = 0; i < n; ++i) {
          VF vv[kVecs];
          decode(rows[i], vv);
          for (int j = 0; j < kQB; ++j) {
            const VF ew = hn::Set(DF(), w[j][i]);
            for (size_t v = 0; v < kVecs; ++v) acc[j][v] = MulAcc<kExact>(ew, vv[v], acc[j][v]);
          }
        }
      } else {
        for (uint32_t i = 0; i < n; ++i) {
          VF vv[kVecs];
          decode(rows[i], vv);
          for (int j = 0; j < kQB; ++j) {
            if (!(masks[i] & (1u << j))) continue;
            const VF ew = hn::Set(DF(), w[j][i]);
            for (size_t v = 0; v < kVecs; ++v) acc[j][v] = MulAcc<kExact>(ew, vv[v], acc[j][v]);
          }
        }
      }
      for (int j = 0; j < kQB; ++j) {
        for (size_t v = 0; v < kVecs; ++v) hn::StoreU(acc[j][v], DF(), o[j] + b * kDotLanes + v * kN);
      }
    };
    for (uint32_t b = 0; b < full_blocks; ++b) {
      prefetch_part(b);
      block(b, [&](const RowRef& row, VF* vv) HWY_ATTR { dec.Block(row, b, vv); });
    }
    if constexpr (Decoder<F>::kTail) {
      if (n_blocks != full_blocks) {
        prefetch_part(full_blocks);
        block(full_blocks, [&](const RowRef& row, VF* vv) HWY_ATTR {
          TailBlock(dec, row, full_blocks, d, vv);
        });
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Kernel selection (per job, by format; QB in {1, 2, 4}).

using KFn = void (*)(const KArgs&);
using VFn = void (*)(const VArgs&);

template <Format F, bool kExact>
KFn KFor(int qb) {
  return qb == 4 ? &KPass<F, kExact, 4> : qb == 2 ? &KPass<F, kExact, 2> : &KPass<F, kExact, 1>;
}
template <Format F, bool kExact>
VFn VFor(int qb) {
  return qb == 4 ? &VPass<F, kExact, 4> : qb == 2 ? &VPass<F, kExact, 2> : &VPass<F, kExact, 1>;
}

#define KV_ATTN_FORMAT_SWITCH(fmt, FN, qb)                        \
  switch (fmt) {                                                  \
    case Format::kF32: return FN<Format::kF32, false>(qb);        \
    case Format::kF16: return FN<Format::kF16, false>(qb);        \
    case Format::kBF16: return FN<Format::kBF16, false>(qb);      \
    case Format::kFp8E4M3: return FN<Format::kFp8E4M3, false>(qb); \
    case Format::kQ8: return FN<Format::kQ8, false>(qb);          \
    case Format::kTurbo8: return FN<Format::kTurbo8, false>(qb);  \
    case Format::kTurbo4: return FN<Format::kTurbo4, false>(qb);  \
    case Format::kTurbo3: return FN<Format::kTurbo3, false>(qb);  \
    case Format::kTurbo2: return FN<Format::kTurbo2, false>(qb);  \
    case Format::kQ8_0: return FN<Format::kQ8_0, false>(qb);      \
    case Format::kQ4_0: return FN<Format::kQ4_0, false>(qb);      \
  }                                                               \
  return nullptr

KFn SelectK(const HeadJob& job, int qb) {
  if (job.exact) return KFor<Format::kF32, true>(qb);
  KV_ATTN_FORMAT_SWITCH(job.view->k.format, KFor, qb);
}
VFn SelectV(const HeadJob& job, int qb) {
  if (job.exact) return VFor<Format::kF32, true>(qb);
  KV_ATTN_FORMAT_SWITCH(job.view->v.format, VFor, qb);
}
#undef KV_ATTN_FORMAT_SWITCH

// Calls fn(qi0, qb) over query blocks of 4, then 2, then 1.
template <class Fn>
HWY_INLINE void ForQueryBlocks(uint32_t nq, const Fn& fn) {
  uint32_t qi = 0;
  for (; qi + 4 <= nq; qi += 4) fn(qi, 4);
  for (; qi + 2 <= nq; qi += 2) fn(qi, 2);
  for (; qi < nq; ++qi) fn(qi, 1);
}

// ---------------------------------------------------------------------------
// Job-level steps.

// pf (optional) is the walk's prefetch stream, stepped by the first query
// block only: the others read rows the first has just brought in.
void RunK(const Plan& plan, const HeadJob& job, uint32_t r0, uint32_t r1, float* scores,
          float* maxes, Prefetcher* pf = nullptr) {
  ForQueryBlocks(job.nq, [&](uint32_t qi0, int qb) {
    SelectK(job, qb)(KArgs{&plan, &job, qi0, r0, r1, scores, maxes, qi0 == 0 ? pf : nullptr});
  });
}

void RunExp(const HeadJob& job, uint32_t r0, uint32_t r1, float* scores, const float* m) {
  const DF df;
  for (uint32_t qi = 0; qi < job.nq; ++qi) {
    if (m[qi] == kNegInf) continue;
    float* s = scores + static_cast<size_t>(qi) * job.rows;
    const VF mv = hn::Set(df, m[qi]);
    uint32_t r = r0;
    for (; r + kN <= r1; r += kN) hn::StoreU(ExpV(hn::Sub(hn::LoadU(df, s + r), mv)), df, s + r);
    for (; r < r1; ++r) s[r] = Exp(s[r] - m[qi]);
  }
}

// Rows [r0, r1) added into l[nq] and o[nq][pd]; pf as for RunK.
void RunV(const Plan& plan, const HeadJob& job, uint32_t r0, uint32_t r1, const float* e,
          float* l, float* o, Prefetcher* pf = nullptr) {
  ForQueryBlocks(job.nq, [&](uint32_t qi0, int qb) {
    SelectV(job, qb)(VArgs{&plan, &job, qi0, r0, r1, e, l, o, qi0 == 0 ? pf : nullptr});
  });
}

// Segment [r0, r1): partial sums into l[nq] (zeroed here) and o[nq][pd].
void RunVSegment(const Plan& plan, const HeadJob& job, uint32_t r0, uint32_t r1,
                 const float* e, float* l, float* o) {
  std::fill(l, l + job.nq, 0.0f);
  std::fill(o, o + static_cast<size_t>(job.nq) * plan.padded_dim, 0.0f);
  RunV(plan, job, r0, r1, e, l, o);
}

// total += part, elementwise (the segment fold).
void AddInto(float* total, const float* part, size_t n) {
  const DF df;
  size_t i = 0;
  for (; i + kN <= n; i += kN) {
    hn::StoreU(hn::Add(hn::LoadU(df, total + i), hn::LoadU(df, part + i)), df, total + i);
  }
  for (; i < n; ++i) total[i] = total[i] + part[i];
}

// Writes every output of the job from the folded sums. e: [nq][rows].
void Finalize(const Plan& plan, const HeadJob& job, const float* e, const float* m,
              const float* l, const float* o, float* tmp) {
  const LayerKvView& view = *job.view;
  const uint32_t d = plan.head_dim, pd = plan.padded_dim;
  const RowTransform* vt = view.v.transforms ? &view.v.transforms[job.head] : nullptr;
  const bool rotated = IsRotated(view.v.format);
  const float vmul = ValueMul(view.v.format);
  if (job.kv_probs) std::fill(job.kv_probs, job.kv_probs + view.num_tokens, 0.0f);
  for (uint32_t qi = 0; qi < job.nq; ++qi) {
    const QueryVec& q = plan.queries[job.first_query + qi];
    if (m[qi] == kNegInf) {
      std::fill(q.out, q.out + d, 0.0f);
      if (q.lse) *q.lse = kNegInf;
      if (q.probs) std::fill(q.probs, q.probs + view.num_tokens, 0.0f);
      continue;
    }
    const float lsum = l[qi];
    const float* oq = o + static_cast<size_t>(qi) * pd;
    for (uint32_t i = 0; i < d; ++i) tmp[i] = (oq[i] * vmul) / lsum;
    if (UsesNibbleOrder(view.v.format)) FromNibbleOrder(tmp, d);
    if (rotated) view.v.codec->InverseRotate(tmp);
    if (vt != nullptr && !vt->col_scale.empty()) {
      for (uint32_t i = 0; i < d; ++i) tmp[i] *= vt->col_scale[i];
    }
    if (vt != nullptr && !vt->mean.empty()) {
      for (uint32_t i = 0; i < d; ++i) tmp[i] += vt->mean[i];
    }
    std::memcpy(q.out, tmp, d * sizeof(float));
    if (q.lse) *q.lse = m[qi] + std::log(lsum);
    const float* eq = e + static_cast<size_t>(qi) * job.rows;
    if (q.probs) {
      for (uint32_t r = 0; r < job.rows; ++r) q.probs[r] = eq[r] / lsum;
      std::fill(q.probs + job.rows, q.probs + view.num_tokens, 0.0f);
    }
    if (job.kv_probs) {
      for (uint32_t r = 0; r < job.rows; ++r) job.kv_probs[r] = job.kv_probs[r] + eq[r] / lsum;
    }
  }
}

struct Scratch {
  std::vector<float> scores, m, l, o, l_seg, o_seg, tmp;
};
thread_local Scratch tls_scratch;
thread_local Scratch tls_whole_scratch[kGroupHeads];  // RunWhole's, one per head

// Whole jobs on one thread: one job, or n <= kGroupHeads jobs of
// consecutive kv heads of one sequence walked together (plan.h
// WalkHeadsGrouped): kGroupChunkRows rows at a time, head after head inside
// a chunk, one prefetch stream over that order per pass. At block 16 a
// head's piece of a block is 4 KiB (bf16, d = 128); walked one head after
// another, the pieces of a block are read far apart in time. Grouped, the
// bf16/f16 paged step took 0.81-0.88x the time (docs/attention.md). The
// results do not depend on the grouping, bit for bit: a chunk is whole V
// tiles inside one segment, and every sum still runs over the rows in
// order.
void RunWhole(const Plan& plan, const HeadJob* jobs, uint32_t n) {
  Scratch* s = tls_whole_scratch;
  const size_t pd = plan.padded_dim;
  uint32_t ends[kGroupHeads];
  uint32_t max_rows = 0;
  for (uint32_t g = 0; g < n; ++g) {
    const HeadJob& job = jobs[g];
    const size_t nq = job.nq;
    s[g].scores.resize(std::max<size_t>(1, nq * job.rows));
    s[g].m.assign(nq, kNegInf);
    s[g].l.assign(nq, 0.0f);
    s[g].o.assign(nq * pd, 0.0f);
    s[g].l_seg.resize(nq);
    s[g].o_seg.resize(nq * pd);
    ends[g] = job.rows;
    max_rows = std::max(max_rows, job.rows);
  }
  s[0].tmp.resize(pd);
  const uint32_t chunk = n == 1 ? kSegmentRows : kGroupChunkRows;
  // fn(g, a, b) for each head's rows [a, b) of every chunk in [c0, c1), in
  // walk order; the prefetch stream over one side's rows in that order.
  auto walk = [&](uint32_t c0, uint32_t c1, const auto& fn) {
    for (uint32_t c = c0; c < c1; c += chunk) {
      for (uint32_t g = 0; g < n; ++g) {
        if (c < ends[g]) fn(g, c, std::min(ends[g], c + chunk));
      }
    }
  };
  HeadRows hr[kGroupHeads];
  auto stream = [&](bool keys) {
    for (uint32_t g = 0; g < n; ++g) {
      const LayerKvView& v = *jobs[g].view;
      hr[g] = HeadRows(v, keys ? v.k : v.v, jobs[g].head);
    }
    return Prefetcher(hr, ends, n, 0, chunk);
  };
  {
    Prefetcher pf = stream(true);
    walk(0, max_rows, [&](uint32_t g, uint32_t a, uint32_t b) {
      RunK(plan, jobs[g], a, b, s[g].scores.data(), s[g].m.data(), &pf);
    });
  }
  for (uint32_t g = 0; g < n; ++g) RunExp(jobs[g], 0, jobs[g].rows, s[g].scores.data(), s[g].m.data());
  Prefetcher pf = stream(false);
  for (uint32_t r0 = 0; r0 < max_rows; r0 += kSegmentRows) {
    const uint32_t r1 = std::min(max_rows, r0 + kSegmentRows);
    for (uint32_t g = 0; g < n; ++g) {
      std::fill(s[g].l_seg.begin(), s[g].l_seg.end(), 0.0f);
      std::fill(s[g].o_seg.begin(), s[g].o_seg.end(), 0.0f);
    }
    walk(r0, r1, [&](uint32_t g, uint32_t a, uint32_t b) {
      RunV(plan, jobs[g], a, b, s[g].scores.data(), s[g].l_seg.data(), s[g].o_seg.data(), &pf);
    });
    for (uint32_t g = 0; g < n; ++g) {
      if (r0 >= ends[g]) continue;
      AddInto(s[g].l.data(), s[g].l_seg.data(), jobs[g].nq);
      AddInto(s[g].o.data(), s[g].o_seg.data(), jobs[g].nq * pd);
    }
  }
  for (uint32_t g = 0; g < n; ++g) {
    Finalize(plan, jobs[g], s[g].scores.data(), s[g].m.data(), s[g].l.data(), s[g].o.data(),
             s[0].tmp.data());
  }
}

void ParallelFor(ThreadPool* pool, uint32_t n, const ThreadPool::Task& fn) {
  if (pool == nullptr) {
    for (uint32_t i = 0; i < n; ++i) fn(i, 0);
  } else {
    pool->ParallelFor(n, fn);
  }
}

// Jobs split into chunks of whole segments (flash-decoding).
void RunSplit(const Plan& plan, uint32_t chunks_wanted) {
  const size_t pd = plan.padded_dim;
  struct JobSplit {
    uint32_t segments, seg_per_chunk, chunks;
    size_t scores_off, max_off, part_off;  // into the shared buffers
  };
  std::vector<JobSplit> split(plan.jobs.size());
  struct Item {
    uint32_t job, chunk;
  };
  std::vector<Item> items;
  size_t scores_n = 0, max_n = 0, part_n = 0;
  for (uint32_t j = 0; j < plan.jobs.size(); ++j) {
    const HeadJob& job = plan.jobs[j];
    JobSplit& js = split[j];
    js.segments = std::max<uint32_t>(1, (job.rows + kSegmentRows - 1) / kSegmentRows);
    const uint32_t c = std::min(js.segments, std::max<uint32_t>(1, chunks_wanted));
    js.seg_per_chunk = (js.segments + c - 1) / c;
    js.chunks = (js.segments + js.seg_per_chunk - 1) / js.seg_per_chunk;
    js.scores_off = scores_n;
    js.max_off = max_n;
    js.part_off = part_n;
    scores_n += static_cast<size_t>(job.nq) * job.rows;
    max_n += static_cast<size_t>(job.nq) * js.chunks;
    part_n += static_cast<size_t>(job.nq) * (pd + 1) * js.segments;
    for (uint32_t c2 = 0; c2 < js.chunks; ++c2) items.push_back({j, c2});
  }
  thread_local std::vector<float> scores, maxes, parts;
  scores.resize(std::max<size_t>(1, scores_n));
  maxes.assign(max_n, kNegInf);
  parts.resize(std::max<size_t>(1, part_n));

  auto rows_of = [&](uint32_t j, uint32_t c, uint32_t* r0, uint32_t* r1) {
    const JobSplit& js = split[j];
    *r0 = c * js.seg_per_chunk * kSegmentRows;
    *r1 = std::min(plan.jobs[j].rows, (c + 1) * js.seg_per_chunk * kSegmentRows);
  };
  float* sc = scores.data();
  float* mx = maxes.data();
  float* pt = parts.data();
  ParallelFor(plan.pool, static_cast<uint32_t>(items.size()), [&](uint32_t i, uint32_t) {
    const Item it = items[i];
    const HeadJob& job = plan.jobs[it.job];
    const JobSplit& js = split[it.job];
    uint32_t r0, r1;
    rows_of(it.job, it.chunk, &r0, &r1);
    RunK(plan, job, r0, r1, sc + js.scores_off, mx + js.max_off + static_cast<size_t>(it.chunk) * job.nq);
  });
  ParallelFor(plan.pool, static_cast<uint32_t>(items.size()), [&](uint32_t i, uint32_t) {
    const Item it = items[i];
    const HeadJob& job = plan.jobs[it.job];
    const JobSplit& js = split[it.job];
    Scratch& s = tls_scratch;
    s.m.assign(job.nq, kNegInf);
    for (uint32_t c = 0; c < js.chunks; ++c) {
      for (uint32_t qi = 0; qi < job.nq; ++qi) {
        s.m[qi] = std::max(s.m[qi], mx[js.max_off + static_cast<size_t>(c) * job.nq + qi]);
      }
    }
    uint32_t r0, r1;
    rows_of(it.job, it.chunk, &r0, &r1);
    float* e = sc + js.scores_off;
    RunExp(job, r0, r1, e, s.m.data());
    for (uint32_t seg = r0 / kSegmentRows; seg * kSegmentRows < r1; ++seg) {
      float* part = pt + js.part_off + static_cast<size_t>(seg) * job.nq * (pd + 1);
      RunVSegment(plan, job, seg * kSegmentRows, std::min(r1, (seg + 1) * kSegmentRows), e,
                  part, part + job.nq);
    }
  });
  ParallelFor(plan.pool, static_cast<uint32_t>(plan.jobs.size()), [&](uint32_t j, uint32_t) {
    const HeadJob& job = plan.jobs[j];
    const JobSplit& js = split[j];
    Scratch& s = tls_scratch;
    s.m.assign(job.nq, kNegInf);
    for (uint32_t c = 0; c < js.chunks; ++c) {
      for (uint32_t qi = 0; qi < job.nq; ++qi) {
        s.m[qi] = std::max(s.m[qi], mx[js.max_off + static_cast<size_t>(c) * job.nq + qi]);
      }
    }
    s.l.assign(job.nq, 0.0f);
    s.o.assign(static_cast<size_t>(job.nq) * pd, 0.0f);
    s.tmp.resize(pd);
    const uint32_t segs_with_rows = (job.rows + kSegmentRows - 1) / kSegmentRows;
    for (uint32_t seg = 0; seg < segs_with_rows; ++seg) {
      const float* part = pt + js.part_off + static_cast<size_t>(seg) * job.nq * (pd + 1);
      AddInto(s.l.data(), part, job.nq);
      AddInto(s.o.data(), part + job.nq, static_cast<size_t>(job.nq) * pd);
    }
    Finalize(plan, job, sc + js.scores_off, s.m.data(), s.l.data(), s.o.data(), s.tmp.data());
  });
}

void RunPlanImpl(const Plan& plan) {
  const uint32_t threads = plan.pool ? plan.pool->num_threads() : 1;
  const uint32_t n_jobs = static_cast<uint32_t>(plan.jobs.size());
  if (threads == 1 || n_jobs >= 2 * threads) {
    // Tasks: runs of up to HeadsPerTask (plan.h) jobs of consecutive kv
    // heads of one view; a job alone where the view is not grouped.
    std::vector<uint32_t> starts;
    for (uint32_t j = 0; j < n_jobs;) {
      starts.push_back(j);
      const LayerKvView* v = plan.jobs[j].view;
      const uint32_t group = HeadsPerTask(*v, n_jobs, threads);
      uint32_t k = j + 1;
      while (k < n_jobs && k - j < group && plan.jobs[k].view == v &&
             plan.jobs[k].head == plan.jobs[k - 1].head + 1) {
        ++k;
      }
      j = k;
    }
    starts.push_back(n_jobs);
    ParallelFor(plan.pool, static_cast<uint32_t>(starts.size() - 1), [&](uint32_t i, uint32_t) {
      RunWhole(plan, plan.jobs.data() + starts[i], starts[i + 1] - starts[i]);
    });
    return;
  }
  RunSplit(plan, (2 * threads + n_jobs - 1) / n_jobs);
}

// Exposed for tests: the vector Exp on a buffer.
void ExpBuffer(float* x, size_t n) {
  const DF df;
  size_t i = 0;
  for (; i + kN <= n; i += kN) hn::StoreU(ExpV(hn::LoadU(df, x + i)), df, x + i);
  for (; i < n; ++i) x[i] = Exp(x[i]);
}

// Exposed for tests: the kernels' E4M3 decode, 16 codes at a time.
void E4M3Decode(const uint8_t* codes, size_t n, float* out) {
  const VF m = hn::Set(DF(), kE4M3BlockMul);
  for (size_t i = 0; i + kDotLanes <= n; i += kDotLanes) {
    VF v[kVecs];
    E4M3Block(codes + i, v);
    for (size_t j = 0; j < kVecs; ++j) hn::StoreU(hn::Mul(v[j], m), DF(), out + i + j * kN);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attention_internal
}  // namespace kvcache
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvcache {
namespace attention_internal {
HWY_EXPORT(RunPlanImpl);
HWY_EXPORT(ExpBuffer);
HWY_EXPORT(E4M3Decode);

void RunPlan(const Plan& plan) { HWY_DYNAMIC_DISPATCH(RunPlanImpl)(plan); }
void ExpBufferForTest(float* x, size_t n) { HWY_DYNAMIC_DISPATCH(ExpBuffer)(x, n); }
void E4M3DecodeForTest(const uint8_t* codes, size_t n, float* out) {
  HWY_DYNAMIC_DISPATCH(E4M3Decode)(codes, n, out);
}
}  // namespace attention_internal
}  // namespace kvcache
#endif
