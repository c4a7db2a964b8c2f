// The turbo family's piece of the attention K pass: the integer paths of
// the integer-level formats (IntKeyPass<kTurbo4I/kTurbo3I/kTurbo2I>; the
// generic pass in src/attention/kpass-inl.h asks them first): turbo4i's
// nibble paths (int16 or int8 query) and turbo3i/turbo2i's bit-plane path.
// turbo8/4/3/2 keys take the float path over their Decoders.
//
// Per-target header (Highway's -inl.h convention): included by the family's
// attention kernels (src/attention/kernels_<family>.cc) after
// hwy/foreach_target.h, so once per compiled target, at file scope.

#include <algorithm>
#include <array>
#include <cstring>

#include "attention/kpass-inl.h"

#if defined(KVCACHE_SRC_FORMAT_TURBO_KPASS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVCACHE_SRC_FORMAT_TURBO_KPASS_INL_H_
#undef KVCACHE_SRC_FORMAT_TURBO_KPASS_INL_H_
#else
#define KVCACHE_SRC_FORMAT_TURBO_KPASS_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
namespace kvcache {
namespace attention_internal {
namespace HWY_NAMESPACE {

// ---------------------------------------------------------------------------
// Integer K path for turbo4i keys (x86 SIMD targets, the default for that
// format): the levels are int8 / 128 by construction (format/turbo/turbo.h),
// so a row's dot product is, exactly, sum_g (s_g / 128) * sum_{i in g}
// L[c_i] * q16_i with the query rounded to int16 once per K pass (as the
// q8_0 path above: qscale = max|q| / 32767). Per chunk of kN16 code bytes
// (2 * kN16 values, kN16 / 8 groups): the low and the high nibbles are
// looked up in the 16 int8 levels (TableLookupBytes: vpshufb) and widened to
// int16 (vpmovsxbw), two int16 multiply-adds into int32 lanes (vpmaddwd)
// per query, then one int32 -> f32 conversion and one FMA by the group
// scales, lane k holding group k / 4 of the chunk. The codes are decoded
// once per row for all kQB queries. An int32 lane adds 4 products of at most
// 127 * 32767 per chunk (< 2^24, so its conversion is exact too): the
// only rounding of the path is the query's (bound: docs/attention.md).
// The query is permuted once into the order the chunks consume (the low
// nibble values of the chunk's bytes, then the high ones).

// The low and the high nibbles of the bytes x, each in its byte.
template <class DU8>
HWY_INLINE void SplitNibbles(DU8 du8, hn::Vec<DU8> x, hn::Vec<DU8>* lo, hn::Vec<DU8>* hi) {
  const hn::Repartition<uint16_t, DU8> dw;
  const auto mask = hn::Set(du8, uint8_t{15});
  *lo = hn::And(x, mask);
  *hi = hn::And(hn::BitCast(du8, hn::ShiftRight<4>(hn::BitCast(dw, x))), mask);
}

// The order both turbo4i paths consume a query in, for chunks of kb code
// bytes (2 kb values): per chunk, the values in the low nibbles of its bytes,
// then those in the high nibbles. put(at, x) for each value x of q[d] (in
// nibble order, plan.h: code byte j holds values 2 (j % 8) and 2 (j % 8) + 1
// of group j / 8, which sit at j % 8 and 8 + j % 8 of the group) and its
// place `at` in that order.
template <class Put>
HWY_INLINE void ForChunkOrder(const float* q, uint32_t d, uint32_t kb, const Put& put) {
  for (uint32_t j = 0; j < d / 2; ++j) {
    const uint32_t base = 2 * kb * (j / kb) + j % kb;
    const float* g = q + 16 * (j / 8) + j % 8;
    put(base, g[0]);
    put(base + kb, g[8]);
  }
}

#if KVCACHE_ATTN_X86_SIMD
using D8N = hn::Rebind<uint8_t, DI16>;   // kN16 code bytes
using D8NI = hn::Rebind<int8_t, DI16>;

constexpr bool kNibbleIntPath = true;  // this target has RowDotsNibble
HWY_INLINE bool NibbleIntFits(uint32_t d) { return IntPathFits(d) && d % (2 * kN16) == 0; }

// q16[d] in chunk order (ForChunkOrder, chunks of kN16 code bytes) from q[d]
// in nibble order (plan.h); returns qscale.
HWY_INLINE float QuantizeQueryNibble(const float* q, uint32_t d, int16_t* q16) {
  alignas(64) float perm[kIntMaxDim];
  ForChunkOrder(q, d, kN16, [&](uint32_t at, float x) HWY_ATTR { perm[at] = x; });
  return QuantizeQuery(perm, d, q16);
}

#if HWY_TARGET <= HWY_AVX2
// f32 lane k from byte k of `rep` (an E4M3 scale per lane) times 2^-8: the
// shared step of GroupScales<4> and GroupScales<2>.
HWY_INLINE VF E4M3BytesToLanes(hn::Vec<hn::Full128<uint8_t>> rep) {
#if HWY_TARGET == HWY_AVX2
  const auto b = hn::LowerHalf(rep);
#else
  const auto b = rep;
#endif
  const hn::Rebind<uint16_t, DF> du16;
  const hn::Rebind<int16_t, DF> di16;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const auto wv = hn::BitCast(di16, hn::ShiftLeft<8>(hn::PromoteTo(du16, b)));
  const auto h = hn::BitCast(dh, hn::And(hn::ShiftRight<1>(wv), hn::Set(di16, static_cast<int16_t>(0xBFFF))));
  return hn::PromoteTo(DF(), h);
}
#endif

// f32 lane k: the E4M3 group scale sc[k / kPer] times 2^-8 (exact; the f16
// move of E4M3Block with F16C; NaN codes 0x7F/0xFF, which the encoder never
// writes, read as numbers), for the kN / kPer groups of a chunk: kPer 4 for
// the int16-query path (4 lanes a group), 2 for the int8-query one.
template <size_t kPer>
HWY_INLINE VF GroupScales(const uint8_t* sc) {
  static_assert(kPer == 2 || kPer == 4, "2 or 4 lanes per group");
#if HWY_TARGET <= HWY_AVX2
  constexpr size_t kG = kN / kPer;
  uint64_t w = 0;
  std::memcpy(&w, sc, kG);
  const hn::Full128<uint8_t> d8;
  alignas(16) static constexpr auto kRep = [] {
    std::array<uint8_t, 16> r{};
    for (size_t i = 0; i < 16; ++i) r[i] = static_cast<uint8_t>(i / kPer);
    return r;
  }();
  return E4M3BytesToLanes(hn::TableLookupBytes(
      hn::BitCast(d8, hn::Set(hn::Full128<uint64_t>(), w)), hn::Load(d8, kRep.data())));
#else
  static_assert(kN == 4, "SSE4: 4 lanes");
  alignas(16) float lanes[4];
  for (size_t k = 0; k < 4; ++k) lanes[k] = fi::E4M3ToFloat(sc[k / kPer]) * (1.0f / kE4M3BlockMul);
  return hn::Load(DF(), lanes);
#endif
}

// dots[j] ~= <q_j, k> for the turbo4i row at p, kQB queries (q16 from
// QuantizeQueryNibble, scale qscale[j]).
template <int kQB>
HWY_INLINE void RowDotsNibble(const uint8_t* p, uint32_t d, const int16_t* const* q16,
                              const float* qscale, float* dots) {
  const DI32 di;
  const DI16 d16;
  const D8N d8;
  const D8NI d8i;
  const DF df;
#if HWY_TARGET <= HWY_AVX3
  const auto table = hn::LoadDup128(d8i, fi::kTurbo4IInt.data());
#else
  const auto table = hn::LoadU(hn::Full128<int8_t>(), fi::kTurbo4IInt.data());
#endif
  const uint8_t* sc = p + d / 2;
  VF tot[kQB];
  for (int j = 0; j < kQB; ++j) tot[j] = hn::Zero(df);
  for (uint32_t c = 0; c < d / (2 * kN16); ++c) {
    hn::Vec<D8N> ulo, uhi;
    SplitNibbles(d8, hn::LoadU(d8, p + c * kN16), &ulo, &uhi);
    const auto lo = hn::BitCast(d8i, ulo);
    const auto hi = hn::BitCast(d8i, uhi);
    const auto lv = hn::PromoteTo(d16, hn::TableLookupBytes(table, lo));
    const auto hv = hn::PromoteTo(d16, hn::TableLookupBytes(table, hi));
    const VF s = GroupScales<4>(sc + c * (kN16 / 8));
    for (int j = 0; j < kQB; ++j) {
      const int16_t* qc = q16[j] + 2 * kN16 * c;
      auto s1 = hn::Zero(di);
      auto acc = hn::ReorderWidenMulAccumulate(di, lv, hn::Load(d16, qc), hn::Zero(di), s1);
      acc = hn::ReorderWidenMulAccumulate(di, hv, hn::Load(d16, qc + kN16), acc, s1);
      tot[j] = hn::MulAdd(hn::ConvertTo(df, hn::Add(acc, s1)), s, tot[j]);
    }
  }
  ReduceDots<kQB>(df, tot, dots);
  // Scale lanes are s * 2^-8 and levels L / 128: the product is s * L * 2^-7.
  for (int j = 0; j < kQB; ++j) dots[j] = dots[j] * (qscale[j] * (kE4M3BlockMul * fi::kTurbo4IStep));
}
#else
constexpr bool kNibbleIntPath = false;  // tested at compile time, as kNibble8Path
HWY_INLINE bool NibbleIntFits(uint32_t) { return false; }
inline float QuantizeQueryNibble(const float*, uint32_t, int16_t*) { return 0.0f; }
template <int kQB>
void RowDotsNibble(const uint8_t* p, uint32_t d, const int16_t* const* q16, const float* qscale,
                   float* dots);  // never instantiated on this target
#endif

// ---------------------------------------------------------------------------
// The int8-query turbo4i path (x86 SIMD targets, the default where head_dim
// is a multiple of 2 * kB8N: 128 on AVX3, 64 on AVX2, 32 on SSE4; the int16
// path above otherwise): the query rounded to int8 once per K pass with one
// step for the whole vector (qs = max|q| / 127), and per chunk of kB8N code
// bytes (a full vector: 2 * kB8N values, kB8N / 8 groups) the level
// magnitudes |L| looked up from the low and the high nibbles (vpshufb), the
// query's sign flipped where the level is negative (vpsignb by the signed
// levels; AVX-512, which has no vpsignb: a byte blend with -q, computed
// once per K pass, on codes 0..7), u8 x i8 multiply-adds of byte pairs
// into int16 (vpmaddubsw: a pair is at most 2 * 127 * 127 < 2^15, no
// saturation) and of int16 pairs into int32 (vpmaddwd by ones), the low
// and the high halves added: int32 lane k then holds 8
// products of group k / 2 of the chunk, converted and multiplied by the
// group scales in one FMA. Half the per-query instructions of the int16
// path. Exact but for the query's rounding: a score moves by at most
// scale * qs / 2 * sum_i |k_i| (docs/attention.md).

#if KVCACHE_ATTN_X86_SIMD
#if HWY_TARGET <= HWY_AVX3
using D8N8 = hn::Full512<int8_t>;
#elif HWY_TARGET == HWY_AVX2
using D8N8 = hn::Full256<int8_t>;
#else
using D8N8 = hn::Full128<int8_t>;
#endif
constexpr size_t kB8N = hn::MaxLanes(D8N8());  // code bytes per chunk
static_assert(kB8N == 4 * kN, "an int32 lane per 4 code bytes");

constexpr bool kNibble8Path = true;  // this target has RowDotsNibble8
HWY_INLINE bool Nibble8Fits(uint32_t d) { return IntPathFits(d) && d % (2 * kB8N) == 0; }

// The int8 query of the turbo4i path: q and -q in chunk order (per chunk,
// the low-nibble values of its bytes, then the high ones), one step qs.
struct Nibble8Query {
  alignas(64) int8_t q[kIntMaxDim];
  alignas(64) int8_t neg[kIntMaxDim];
  float qs;
};

// The int8 step of q[d] (max |q| / 127) into out->qs, and its inverse.
// False, with zeros in out, when q is zero or not finite: inf or NaN (a
// finite query can overflow in the column scales or the rotation) gives a
// NaN step, so every score is NaN as in the float path.
inline bool Int8QueryStep(const float* q, uint32_t d, Nibble8Query* out, float* inv) {
  float amax = 0.0f;
  bool finite = true;
  for (uint32_t i = 0; i < d; ++i) {
    finite = finite && std::isfinite(q[i]);
    amax = std::max(amax, std::fabs(q[i]));
  }
  if (!finite || amax == 0.0f) {
    std::fill(out->q, out->q + d, int8_t{0});
    std::fill(out->neg, out->neg + d, int8_t{0});
    out->qs = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
    return false;
  }
  *inv = 127.0f / amax;
  out->qs = amax / 127.0f;
  return true;
}

// From q[d] in nibble order (plan.h). Plain C++: every target rounds alike.
inline void QuantizeQueryNibble8(const float* q, uint32_t d, Nibble8Query* out) {
  float inv;
  if (!Int8QueryStep(q, d, out, &inv)) return;
  ForChunkOrder(q, d, kB8N, [&](uint32_t at, float x) HWY_ATTR {
    const float r = std::clamp(std::nearbyint(x * inv), -127.0f, 127.0f);
    out->q[at] = static_cast<int8_t>(r);
    out->neg[at] = static_cast<int8_t>(-r);
  });
}

// acc + the sums of 4 adjacent products a_u8[i] * b_i8[i] per int32 lane,
// full vectors.
HWY_INLINE hn::Vec<hn::Repartition<int32_t, D8N8>> DotBytesN(hn::Vec<D8N8> a_u8, hn::Vec<D8N8> b_i8,
                                                             hn::Vec<hn::Repartition<int32_t, D8N8>> acc) {
  using VI = hn::Vec<hn::Repartition<int32_t, D8N8>>;
#if HWY_TARGET <= HWY_AVX3
  // (Highway 1.0.3's AVX3_DL target enables avxvnni, the 256-bit VEX form,
  // not avx512vnni: the 512-bit vpdpbusd is not available to it.)
  const __m512i p = _mm512_maddubs_epi16(a_u8.raw, b_i8.raw);
  return hn::Add(acc, VI{_mm512_madd_epi16(p, _mm512_set1_epi16(1))});
#elif HWY_TARGET == HWY_AVX2
  const __m256i p = _mm256_maddubs_epi16(a_u8.raw, b_i8.raw);
  return hn::Add(acc, VI{_mm256_madd_epi16(p, _mm256_set1_epi16(1))});
#else
  const __m128i p = _mm_maddubs_epi16(a_u8.raw, b_i8.raw);
  return hn::Add(acc, VI{_mm_madd_epi16(p, _mm_set1_epi16(1))});
#endif
}

// dots[j] ~= <q_j, k> for the turbo4i row at p, kQB queries.
// The factor each dot takes (qmul[j]: the query's step times 2^8 / 128,
// Nibble8Mul, computed once per K pass so no row reloads it).
HWY_INLINE float Nibble8Mul(const Nibble8Query& q) {
  return q.qs * (kE4M3BlockMul * fi::kTurbo4IStep);
}

template <int kQB>
HWY_INLINE void RowDotsNibble8(const uint8_t* p, uint32_t d, const Nibble8Query* const* qq,
                               const float* qmul, float* dots) {
  const D8N8 d8;
  const hn::RebindToUnsigned<D8N8> du8;
  const hn::Repartition<int32_t, D8N8> di;
  const DF df;
  alignas(16) static constexpr int8_t kAbs[16] = {127, 102, 80, 62, 46, 32, 18, 6,
                                                  6,   18,  32, 46, 62, 80, 102, 127};
#if HWY_TARGET <= HWY_AVX3
  const auto abs_table = hn::LoadDup128(d8, kAbs);
  const auto eight = hn::Set(d8, int8_t{8});
#else
  (void)kAbs;
  const auto signed_table = hn::LoadDup128(d8, fi::kTurbo4IInt.data());
#endif
  const uint8_t* sc = p + d / 2;
  VF tot[kQB];
  for (int j = 0; j < kQB; ++j) tot[j] = hn::Zero(df);
  for (uint32_t c = 0; c < d / (2 * kB8N); ++c) {
    hn::Vec<decltype(du8)> ulo, uhi;
    SplitNibbles(du8, hn::LoadU(du8, p + c * kB8N), &ulo, &uhi);
    const auto lo = hn::BitCast(d8, ulo);
    const auto hi = hn::BitCast(d8, uhi);
    const VF s = GroupScales<2>(sc + c * (kB8N / 8));
#if HWY_TARGET <= HWY_AVX3
    // No vpsignb on 512-bit vectors: |L| from its own table, and a byte
    // blend of q and -q on the codes' sign (codes 0..7: negative levels).
    const auto alo = hn::TableLookupBytes(abs_table, lo);
    const auto ahi = hn::TableLookupBytes(abs_table, hi);
    const auto nlo = hn::Lt(lo, eight);
    const auto nhi = hn::Lt(hi, eight);
#else
    // The signed levels, their magnitudes (vpabsb), and the query's sign
    // flipped by theirs (vpsignb: one instruction, no -q loads).
    const auto llo = hn::TableLookupBytes(signed_table, lo);
    const auto lhi = hn::TableLookupBytes(signed_table, hi);
    const auto alo = hn::Abs(llo);
    const auto ahi = hn::Abs(lhi);
#endif
    for (int j = 0; j < kQB; ++j) {
      const int8_t* q = qq[j]->q + 2 * kB8N * c;
#if HWY_TARGET <= HWY_AVX3
      const int8_t* nq = qq[j]->neg + 2 * kB8N * c;
      const auto qlo = hn::IfThenElse(nlo, hn::Load(d8, nq), hn::Load(d8, q));
      const auto qhi = hn::IfThenElse(nhi, hn::Load(d8, nq + kB8N), hn::Load(d8, q + kB8N));
#else
      const auto qlo = SignBytes(hn::Load(d8, q), llo);
      const auto qhi = SignBytes(hn::Load(d8, q + kB8N), lhi);
#endif
      auto acc = DotBytesN(alo, qlo, hn::Zero(di));
      acc = DotBytesN(ahi, qhi, acc);
      tot[j] = hn::MulAdd(hn::ConvertTo(df, acc), s, tot[j]);
    }
  }
  ReduceDots<kQB>(df, tot, dots);
  for (int j = 0; j < kQB; ++j) dots[j] = dots[j] * qmul[j];
}
#else
// No RowDotsNibble8 on this target: KPass tests the flag at compile time, so
// no call to it is left for the linker even without optimization.
constexpr bool kNibble8Path = false;
HWY_INLINE bool Nibble8Fits(uint32_t) { return false; }
struct Nibble8Query {
  float qs;
};
inline void QuantizeQueryNibble8(const float*, uint32_t, Nibble8Query*) {}
inline float Nibble8Mul(const Nibble8Query&) { return 0.0f; }
template <int kQB>
void RowDotsNibble8(const uint8_t* p, uint32_t d, const Nibble8Query* const* qq,
                    const float* qmul, float* dots);  // never instantiated on this target
#endif

// ---------------------------------------------------------------------------
// Integer K path for turbo3i and turbo2i keys (x86 SIMD targets, the default
// for those formats): their levels are int8 / 128 (format/turbo/turbo.h), so,
// as for turbo4i, a row's dot product is exactly sum_g (s_g / 128) * sum_{i
// in g} L[c_i] * q8_i with the query rounded to int8 once per K pass (one
// step qs = max|q| / 127 for the whole rotated query). A chunk is kB bytes
// of the low-bit plane (4 kB values, kB / 4 groups; kB = 64, 32 or 16, the
// widest vector that divides d / 4, see PlaneChunkBytes): shifted right by
// 0, 2, 4 and 6 and masked to 2 bits it gives 4 code vectors, code vector
// k's byte b holding value 4 (b % 4) + k of the chunk's group b / 4.
// turbo3i adds bit 2 of each code from its bit-2 plane: the chunk's kB / 2
// plane bytes widened to u16 and OR-ed with themselves shifted left by 4
// put the 4 bits of code vector lane b at bits 0..3 of byte b (the low
// nibble of plane byte m at byte 2m, the high one at byte 2m + 1), so code
// vector k takes bit k of that byte to bit 2 with one shift. The codes look
// up the signed int8 levels (TableLookupBytes: vpshufb), the query's sign is
// flipped by the level's (vpsignb; 512-bit vectors, which have no vpsignb:
// a blend with -q on the level's sign), and |L| x q byte pairs are
// multiply-added into int16 (vpmaddubsw: a pair is at most 2 * 122 * 127 <
// 2^15) and int16 pairs into int32 (vpmaddwd by ones): int32 lane l of the
// 4 code vectors' sum holds the 16 products of group l of the chunk (at most
// 16 * 122 * 127 < 2^24, so its conversion to f32 is exact), multiplied by
// that group's scale in one FMA. The only rounding of the path is the
// query's (bound: docs/attention.md) and the f32 sums over groups. The query
// is permuted once per K pass into the code vectors' order.

#if KVCACHE_ATTN_X86_SIMD
#if HWY_TARGET <= HWY_AVX3
constexpr uint32_t kPlaneMaxB = 64;
#elif HWY_TARGET == HWY_AVX2
constexpr uint32_t kPlaneMaxB = 32;
#else
constexpr uint32_t kPlaneMaxB = 16;
#endif
constexpr bool kPlanePath = true;  // this target has RowDotsPlanes

// The chunk bytes of the integer path for head_dim d (0: it does not fit,
// the float path runs): the widest vector of this target that divides the
// d / 4 bytes of the low-bit plane.
HWY_INLINE uint32_t PlaneChunkBytes(uint32_t d) {
  if (d == 0 || d > kIntMaxDim) return 0;
  for (uint32_t b = kPlaneMaxB; b >= 16; b /= 2) {
    if ((d / 4) % b == 0 && d % 4 == 0) return b;
  }
  return 0;
}

// From q[d] in natural order: q and -q in the code vectors' order for
// chunks of kb bytes, one step qs (rounded as QuantizeQueryNibble8).
inline void QuantizeQueryPlanes(const float* q, uint32_t d, uint32_t kb, Nibble8Query* out) {
  float inv;
  if (!Int8QueryStep(q, d, out, &inv)) return;
  for (uint32_t c = 0; c < d / (4 * kb); ++c) {
    for (uint32_t k = 0; k < 4; ++k) {
      for (uint32_t b = 0; b < kb; ++b) {
        const uint32_t value = 16 * (c * kb / 4 + b / 4) + 4 * (b % 4) + k;
        const uint32_t at = c * 4 * kb + k * kb + b;
        const float r = std::clamp(std::nearbyint(q[value] * inv), -127.0f, 127.0f);
        out->q[at] = static_cast<int8_t>(r);
        out->neg[at] = static_cast<int8_t>(-r);
      }
    }
  }
}

// acc + the sums of 4 adjacent products a_u8[i] * b_i8[i] per int32 lane,
// for the 128, 256 and 512-bit vectors of this target.
template <class D8>
HWY_INLINE hn::Vec<hn::Repartition<int32_t, D8>> DotBytesW(D8, hn::Vec<D8> a_u8, hn::Vec<D8> b_i8,
                                                           hn::Vec<hn::Repartition<int32_t, D8>> acc) {
  using VI = hn::Vec<hn::Repartition<int32_t, D8>>;
  constexpr size_t kB = hn::MaxLanes(D8());
  if constexpr (kB == 16) {
    const __m128i p = _mm_maddubs_epi16(a_u8.raw, b_i8.raw);
    return hn::Add(acc, VI{_mm_madd_epi16(p, _mm_set1_epi16(1))});
  } else {
#if HWY_TARGET <= HWY_AVX2
    if constexpr (kB == 32) {
      const __m256i p = _mm256_maddubs_epi16(a_u8.raw, b_i8.raw);
      return hn::Add(acc, VI{_mm256_madd_epi16(p, _mm256_set1_epi16(1))});
    } else {
#if HWY_TARGET <= HWY_AVX3
      const __m512i p = _mm512_maddubs_epi16(a_u8.raw, b_i8.raw);
      return hn::Add(acc, VI{_mm512_madd_epi16(p, _mm512_set1_epi16(1))});
#endif
    }
#endif
  }
}

// b with its sign flipped where c < 0 and zeroed where c == 0 (vpsignb,
// 128 and 256-bit vectors).
template <class D8>
HWY_INLINE hn::Vec<D8> SignBytesW(D8, hn::Vec<D8> b, hn::Vec<D8> c) {
  if constexpr (hn::MaxLanes(D8()) == 16) {
    return hn::Vec<D8>{_mm_sign_epi8(b.raw, c.raw)};
  } else {
#if HWY_TARGET <= HWY_AVX2
    return hn::Vec<D8>{_mm256_sign_epi8(b.raw, c.raw)};
#endif
  }
}

// f32 lane l of DF4: the E4M3 scale sc[l] times 2^-8 (exact, as
// GroupScales), for the kB / 4 groups of a chunk.
template <class DF4>
HWY_INLINE hn::Vec<DF4> PlaneScales(DF4 df4, const uint8_t* sc) {
#if HWY_TARGET <= HWY_AVX2
  const hn::Rebind<uint8_t, DF4> d8;
  const hn::Rebind<uint16_t, DF4> du16;
  const hn::Rebind<int16_t, DF4> di16;
  const hn::Rebind<hwy::float16_t, DF4> dh;
  const auto wv = hn::BitCast(di16, hn::ShiftLeft<8>(hn::PromoteTo(du16, hn::LoadU(d8, sc))));
  const auto h = hn::BitCast(dh, hn::And(hn::ShiftRight<1>(wv), hn::Set(di16, static_cast<int16_t>(0xBFFF))));
  return hn::PromoteTo(df4, h);
#else
  alignas(16) float buf[4];
  for (int l = 0; l < 4; ++l) buf[l] = fi::E4M3ToFloat(sc[l]) * (1.0f / kE4M3BlockMul);
  return hn::Load(df4, buf);
#endif
}

// The factor each dot takes: the query's step times 2^8 / 128.
HWY_INLINE float PlaneMul(const Nibble8Query& q) {
  return q.qs * (kE4M3BlockMul * fi::kTurboIStep);
}

// dots[j] ~= <q_j, k> for the turbo3i or turbo2i row at p, kQB queries (from
// QuantizeQueryPlanes with chunks of kB bytes).
template <Format F, int kQB, uint32_t kB>
HWY_INLINE void RowDotsPlanes(const uint8_t* p, uint32_t d, const Nibble8Query* const* qq,
                              const float* qmul, float* dots) {
  static_assert(kB >= 16 && kB <= kPlaneMaxB, "a vector of this target");
  const hn::FixedTag<int8_t, kB> d8;
  const hn::RebindToUnsigned<decltype(d8)> du8;
  const hn::Repartition<uint16_t, decltype(d8)> dw;
  const hn::Repartition<int32_t, decltype(d8)> di;
  const hn::Repartition<float, decltype(d8)> df;
  constexpr bool k3 = F == Format::kTurbo3I;
  alignas(16) static constexpr int8_t kSigned[16] = {-122, -74, -41, -13, 13, 41, 74, 122,
                                                     -94,  -26, 26,  94,  0,  0,  0,  0};
  // turbo2i's codes 0..3 index entries 8..11 (the OR of 8 below).
  const auto table = hn::LoadDup128(d8, kSigned);
  const auto three = hn::Set(du8, uint8_t{3});
  const auto four = hn::Set(du8, uint8_t{4});
  const auto eight = hn::Set(du8, uint8_t{8});
  const uint8_t* sc = p + (k3 ? 6 * (d / 16) : d / 4);
  const uint8_t* high = p + d / 4;  // turbo3i's bit-2 plane
  (void)four;
  (void)eight;
  (void)high;
  hn::Vec<decltype(df)> tot[kQB];
  for (int j = 0; j < kQB; ++j) tot[j] = hn::Zero(df);
  for (uint32_t c = 0; c < d / (4 * kB); ++c) {
    const auto x = hn::LoadU(du8, p + c * kB);
    hn::Vec<decltype(du8)> e;
    if constexpr (k3) {
      const hn::Rebind<uint8_t, decltype(dw)> dh8;
      const auto h16 = hn::PromoteTo(dw, hn::LoadU(dh8, high + c * (kB / 2)));
      e = hn::BitCast(du8, hn::Or(h16, hn::ShiftLeft<4>(h16)));
    }
    hn::Vec<decltype(d8)> lv[4];
    for (int k = 0; k < 4; ++k) {
      auto code = hn::And(hn::BitCast(du8, hn::ShiftRightSame(hn::BitCast(dw, x), 2 * k)), three);
      if constexpr (k3) {
        const auto bit2 = k <= 2 ? hn::ShiftLeftSame(hn::BitCast(dw, e), 2 - k)
                                 : hn::ShiftRight<1>(hn::BitCast(dw, e));
        code = hn::Or(code, hn::And(hn::BitCast(du8, bit2), four));
      } else {
        code = hn::Or(code, eight);
      }
      lv[k] = hn::TableLookupBytes(table, hn::BitCast(d8, code));
    }
    hn::Vec<decltype(d8)> mag[4];
    for (int k = 0; k < 4; ++k) mag[k] = hn::Abs(lv[k]);
    const auto s = PlaneScales(df, sc + c * (kB / 4));
    for (int j = 0; j < kQB; ++j) {
      const int8_t* q = qq[j]->q + 4 * kB * c;
      auto acc = hn::Zero(di);
      for (int k = 0; k < 4; ++k) {
        hn::Vec<decltype(d8)> qk;
        if constexpr (kB == 64) {
          const int8_t* nq = qq[j]->neg + 4 * kB * c;
          qk = hn::IfThenElse(hn::Lt(lv[k], hn::Zero(d8)), hn::Load(d8, nq + k * kB),
                              hn::Load(d8, q + k * kB));
        } else {
          qk = SignBytesW(d8, hn::Load(d8, q + k * kB), lv[k]);
        }
        acc = DotBytesW(d8, mag[k], qk, acc);
      }
      tot[j] = hn::MulAdd(hn::ConvertTo(df, acc), s, tot[j]);
    }
  }
  ReduceDots<kQB>(df, tot, dots);
  for (int j = 0; j < kQB; ++j) dots[j] = dots[j] * qmul[j];
}
#else
constexpr bool kPlanePath = false;  // tested at compile time, as kNibble8Path
constexpr uint32_t kPlaneMaxB = 16;
HWY_INLINE uint32_t PlaneChunkBytes(uint32_t) { return 0; }
inline void QuantizeQueryPlanes(const float*, uint32_t, uint32_t, Nibble8Query*) {}
inline float PlaneMul(const Nibble8Query&) { return 0.0f; }
template <Format F, int kQB, uint32_t kB>
void RowDotsPlanes(const uint8_t* p, uint32_t d, const Nibble8Query* const* qq, const float* qmul,
                   float* dots);  // never instantiated on this target
#endif

// ---------------------------------------------------------------------------
// The turbo formats' integer K paths, as KPass asks for them.

// turbo4i keys: the int8-query path where it fits this target's chunks,
// else the int16-query one.
template <>
struct IntKeyPass<Format::kTurbo4I> {
  static constexpr bool kDefined = true;
  template <int kQB>
  static bool Run(const KArgs& a) {
    const uint32_t d = a.plan->head_dim;
    if constexpr (kNibble8Path) {
      if (a.plan->int_keys && Nibble8Fits(d)) {
        // The queries rounded to int8 once per K pass.
        WithQueries<Nibble8Query, kQB>(
            a, [](const float* q, uint32_t n, Nibble8Query* out) { QuantizeQueryNibble8(q, n, out); },
            [&](const auto& n8) HWY_ATTR {
              float qmul[kQB];
              for (int j = 0; j < kQB; ++j) qmul[j] = Nibble8Mul(*n8[j]);
              KPassRows<Format::kTurbo4I, kQB>(a, [=](const uint8_t* p, float* dots) HWY_ATTR {
                RowDotsNibble8<kQB>(p, d, n8, qmul, dots);
              });
            });
        return true;
      }
    }
    if constexpr (kNibbleIntPath) {
      if (a.plan->int_keys && NibbleIntFits(d)) {
        // The queries rounded to int16 once per K pass.
        WithInt16Queries<kQB>(
            a, [](const float* q, uint32_t n, int16_t* q16) HWY_ATTR { return QuantizeQueryNibble(q, n, q16); },
            [&](const auto& q16, const auto& qscale) HWY_ATTR {
              KPassRows<Format::kTurbo4I, kQB>(a, [=](const uint8_t* p, float* dots) HWY_ATTR {
                RowDotsNibble<kQB>(p, d, q16, qscale, dots);
              });
            });
        return true;
      }
    }
    (void)d;
    return false;
  }
};

// turbo3i and turbo2i keys: the plane path in chunks of the widest vector
// that divides the plane (PlaneChunkBytes).
template <Format F>
struct PlaneIntKeyPass {
  static constexpr bool kDefined = true;
  template <int kQB>
  static bool Run(const KArgs& a) {
    if constexpr (kPlanePath) {
      const uint32_t d = a.plan->head_dim;
      const uint32_t kb = a.plan->int_keys ? PlaneChunkBytes(d) : 0;
      if (kb == 0) return false;
      // The queries rounded to int8 once per K pass.
      WithQueries<Nibble8Query, kQB>(
          a, [kb](const float* q, uint32_t n, Nibble8Query* out) { QuantizeQueryPlanes(q, n, kb, out); },
          [&](const auto& n8) HWY_ATTR {
            float qmul[kQB];
            for (int j = 0; j < kQB; ++j) qmul[j] = PlaneMul(*n8[j]);
            auto rows = [&]<uint32_t kB>() HWY_ATTR {
              KPassRows<F, kQB>(a, [=](const uint8_t* p, float* dots) HWY_ATTR {
                RowDotsPlanes<F, kQB, kB>(p, d, n8, qmul, dots);
              });
            };
            if constexpr (kPlaneMaxB >= 64) {
              if (kb == 64) return rows.template operator()<64>();
            }
            if constexpr (kPlaneMaxB >= 32) {
              if (kb == 32) return rows.template operator()<32>();
            }
            rows.template operator()<16>();
          });
      return true;
    }
    (void)a;
    return false;
  }
};

template <>
struct IntKeyPass<Format::kTurbo3I> : PlaneIntKeyPass<Format::kTurbo3I> {};
template <>
struct IntKeyPass<Format::kTurbo2I> : PlaneIntKeyPass<Format::kTurbo2I> {};

}  // namespace HWY_NAMESPACE
}  // namespace attention_internal
}  // namespace kvcache
HWY_AFTER_NAMESPACE();

#endif  // KVCACHE_SRC_FORMAT_TURBO_KPASS_INL_H_
