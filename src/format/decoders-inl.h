// The SIMD row decoders of every format, shared by the codec
// (codec_simd.cc: RowCodec::Decode) and the fused attention kernels
// (src/attention): one Decoder<F> per format, in its family's
// format/<family>/decode-inl.h, which this header includes.
//
// A decoder holds only constants (thread-safe) and gives:
//   Prepare(row, d)      once per row: a RowRef (the row; q8: its scale);
//   Block(ref, b, out)   values [16b, 16b + 16) of the row into kVecs vectors
//                        of kN lanes, scales applied, in kernel order (even
//                        values, then odd ones, where kEvenOdd: bf16, turbo4)
//                        and divided by ValueMul(F) (256 for fp8_e4m3, else 1);
//   Value(ref, i)        value i the same way, for formats that allow any
//                        head_dim (kTail): the last partial block;
//   Regular(ref, b)      (f16, fp8_e4m3, turbo8 only) false where Block(b)
//                        may differ from the scalar reference: f16 inf/NaN,
//                        E4M3 NaN codes, scales too large for the 2^8 trick.
//                        The encoder writes none of these except f16 inf
//                        (values beyond 65504); the codec decodes a row
//                        holding one with the scalar reference.
// On every other byte pattern, Block and Value equal the family's scalar
// reference bit for bit (tests/format/simd_targets_test.cc,
// tests/attention/decoders_test.cc).
//
// Per-target header (Highway's -inl.h convention): included after
// hwy/foreach_target.h, so once per compiled target, at file scope.

#include <hwy/highway.h>

#include <cmath>
#include <cstring>
#include <type_traits>

#include "format/format_internal.h"

#if defined(KVCACHE_SRC_FORMAT_DECODERS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVCACHE_SRC_FORMAT_DECODERS_INL_H_
#undef KVCACHE_SRC_FORMAT_DECODERS_INL_H_
#else
#define KVCACHE_SRC_FORMAT_DECODERS_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
namespace kvcache {
namespace format_internal {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
using DU = hn::RebindToUnsigned<DF>;
using DI = hn::RebindToSigned<DF>;
constexpr size_t kBlockValues = 16;  // values per Block
constexpr size_t kN = hn::MaxLanes(DF());
constexpr size_t kVecs = kBlockValues / kN;  // vectors per block
static_assert(kN <= kBlockValues && kBlockValues % kN == 0, "lane count must divide 16");

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
    alignas(64) float buf[2 * kBlockValues] = {};
    for (size_t i = 0; i < kBlockValues; ++i) buf[i] = t[i % kSize];
    for (size_t i = 0; i < 8; ++i) raw[i] = buf[i];
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
      alignas(64) uint32_t ib[kBlockValues];
      alignas(64) float fb[kBlockValues];
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
// masking the code out of its packed word; on AVX-512 (16 lanes) one
// vpermps over the 16-lane table, which reads the low 4 bits, the same
// entry since the table repeats with period kSize (<= 8); elsewhere
// Table::Lookup on the masked index.
template <size_t kSize>
HWY_INLINE VF Permute8(const Table<kSize>& t, hn::Vec<DU> idx) {
#if HWY_TARGET == HWY_AVX2
  return VF{_mm256_permutevar8x32_ps(t.lo.raw, idx.raw)};
#elif HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86
  static_assert(kN == 16, "AVX-512 targets have 16 f32 lanes");
  return VF{_mm512_permutexvar_ps(idx.raw, t.lo.raw)};
#else
  return t.Lookup(hn::And(idx, hn::Set(DU(), static_cast<uint32_t>(kSize - 1))));
#endif
}

// ---------------------------------------------------------------------------
// The pieces the decoders share.

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
// E4M3Bits: the value times 2^-120, then times 2^112. NaN codes come out
// as numbers (see Regular).
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

// The f16 at p in every lane of a D vector (DF unless given): one
// vcvtph2ps with F16C (AVX2 and up), the scalar decode elsewhere. Both are
// exact.
template <class D = DF>
HWY_INLINE hn::Vec<D> BroadcastF16(const uint8_t* p, D d = D()) {
#if HWY_TARGET <= HWY_AVX2
  const hn::Rebind<uint16_t, D> d16;
  const hn::Rebind<hwy::float16_t, D> dh;
  return hn::PromoteTo(d, hn::BitCast(dh, hn::Set(d16, LoadU16(p))));
#else
  return hn::Set(d, F16ToFloat(LoadU16(p)));
#endif
}

HWY_INLINE uint32_t LoadU32(const uint8_t* p) {
  uint32_t w;
  std::memcpy(&w, p, 4);
  return w;
}

template <Format F>
struct Decoder;

// What a format's decoded values must be multiplied by to be the stored
// values (a power of two).
constexpr float ValueMul(Format f) { return f == Format::kFp8E4M3 ? kE4M3BlockMul : 1.0f; }

// Whether Decoder<F>::Block gives even values, then odd ones.
template <Format F>
constexpr bool EvenOdd() {
  if constexpr (requires { Decoder<F>::kEvenOdd; }) {
    return Decoder<F>::kEvenOdd;
  } else {
    return false;
  }
}

// The family fragments: Decoder<F> for each format.
#include "format/plain/decode-inl.h"
#include "format/fp8_q8/decode-inl.h"
#include "format/turbo/decode-inl.h"
#include "format/ggml/decode-inl.h"

template <Format F>
HWY_INLINE Decoder<F> MakeDecoder(uint32_t d) {
  if constexpr (std::is_default_constructible_v<Decoder<F>>) {
    (void)d;
    return Decoder<F>();
  } else {  // a decoder that depends on head_dim (where the scales start)
    return Decoder<F>(d);
  }
}

// Whether Block(r, b) equals the scalar reference (see Regular above).
template <Format F>
HWY_INLINE bool RegularBlock(const Decoder<F>& dec, const RowRef& r, uint32_t b) {
  if constexpr (requires { dec.Regular(r, b); }) {
    return dec.Regular(r, b);
  } else {
    return true;
  }
}

// Values [16b, head_dim) of a tail block, zero padded.
template <Format F>
HWY_INLINE void TailBlock(const Decoder<F>& dec, const RowRef& r, uint32_t b, uint32_t head_dim,
                          VF* out) {
  alignas(64) float buf[kBlockValues] = {};
  for (uint32_t i = b * kBlockValues; i < head_dim; ++i) buf[i - b * kBlockValues] = dec.Value(r, i);
  for (size_t v = 0; v < kVecs; ++v) out[v] = hn::Load(DF(), buf + v * kN);
}

}  // namespace HWY_NAMESPACE
}  // namespace format_internal
}  // namespace kvcache
HWY_AFTER_NAMESPACE();

#endif  // KVCACHE_SRC_FORMAT_DECODERS_INL_H_
