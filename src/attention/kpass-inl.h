// The K pass: scores s[qi][r] = scale * <q_qi, k_r> + bias_qi for the
// visible rows of a job (-inf for the others) and the running max per query
// vector, for kQB query vectors per stored row (a row is decoded once per
// block of queries). The f32 exact instance adds rounded products in the
// reference order (reference.h); the others use FMAs. q8, q8_0 and q4_0
// keys take the integer path: the query rounded to int16 once per K pass (or,
// for q8_0/q4_0 with AttentionOptions::int8_query_keys, to int8 per 32
// values).
//
// Per-target header (Highway's -inl.h convention): included by a kernel .cc
// after hwy/foreach_target.h, so once per compiled target, at file scope.

#include <optional>

#include "attention/kernel_common-inl.h"

#if defined(KVCACHE_SRC_ATTENTION_KPASS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVCACHE_SRC_ATTENTION_KPASS_INL_H_
#undef KVCACHE_SRC_ATTENTION_KPASS_INL_H_
#else
#define KVCACHE_SRC_ATTENTION_KPASS_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
namespace kvcache {
namespace attention_internal {
namespace HWY_NAMESPACE {

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
// Integer K path for q8, q8_0 and q4_0 keys (q4_0: nibble - 8 widened to
// int16; the default path of all three): each query vector is quantized
// once per K pass to int16 (q ~= qscale * q16, |q16| <= 32767, round to
// nearest), and a row's dot product is int8 x int16 multiply-adds into int32
// lanes (ReorderWidenMulAccumulate: vpmaddwd on x86, 2x the multiply-adds
// of an f32 FMA and no float conversion of the codes). The query's rounding
// moves a score by at most scale * qscale / 2 * sum_i |k_i| (documented in
// docs/attention.md). Used when head_dim is a multiple of 32 and at most
// kIntMaxDim, so that no int32 lane can overflow (a lane adds at most d / 8
// pairs, on SSE4, of at most 2 * 128 * 32767 each: < 2^30 for d = 1024).

constexpr uint32_t kIntMaxDim = 1024;

// The x86 SIMD targets (SSE4 to AVX3_DL): q4_0's integer keys and the int8
// key path below use their fixed 128/256-bit descriptors and instructions.
// Elsewhere (EMU128, which clang compiles where GCC 12 compiles SCALAR; NEON;
// SVE) q4_0 keys take the float path.
#undef KVCACHE_ATTN_X86_SIMD
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_SSE4
#define KVCACHE_ATTN_X86_SIMD 1
#else
#define KVCACHE_ATTN_X86_SIMD 0
#endif

// (Not on the scalar target, whose 1-lane vectors have no int16 pairs.)
template <Format F>
constexpr bool kIntKeys = HWY_TARGET != HWY_SCALAR &&
                          (F == Format::kQ8 || F == Format::kQ8_0 ||
                           (KVCACHE_ATTN_X86_SIMD && F == Format::kQ4_0));

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

// dots[j] ~= <q_j, k> for the q8, q8_0 or q4_0 row at p (scales applied), kQB queries.
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
#if KVCACHE_ATTN_X86_SIMD
  } else if constexpr (F == Format::kQ4_0) {
    // 16 bytes per block: value i in the low nibble of byte i, 16 + i in
    // its high nibble; widened to int16 (nibble - 8), kN16 values at a time.
    const DI16 d16;
    const hn::Full128<uint8_t> d8;
    for (int j = 0; j < kQB; ++j) tot[j] = hn::Zero(DF());
    for (uint32_t blk = 0; blk < d / 32; ++blk) {
      const uint8_t* b = p + 18 * blk;
      const VF scale = BroadcastF16(b);
      const auto x = hn::LoadU(d8, b + 2);
      const auto mask = hn::Set(d8, uint8_t{15});
      const auto lo = hn::And(x, mask);
      const auto hi = hn::And(hn::BitCast(d8, hn::ShiftRight<4>(hn::BitCast(hn::Full128<uint16_t>(), x))), mask);
      hn::Vec<DI16> c[32 / kN16];
#if HWY_TARGET == HWY_SSE4
      const hn::Full64<uint8_t> d8h;
      c[0] = hn::BitCast(d16, hn::PromoteTo(hn::RebindToUnsigned<DI16>(), hn::LowerHalf(d8h, lo)));
      c[1] = hn::BitCast(d16, hn::PromoteTo(hn::RebindToUnsigned<DI16>(), hn::UpperHalf(d8h, lo)));
      c[2] = hn::BitCast(d16, hn::PromoteTo(hn::RebindToUnsigned<DI16>(), hn::LowerHalf(d8h, hi)));
      c[3] = hn::BitCast(d16, hn::PromoteTo(hn::RebindToUnsigned<DI16>(), hn::UpperHalf(d8h, hi)));
#elif HWY_TARGET == HWY_AVX2
      c[0] = hn::BitCast(d16, hn::PromoteTo(hn::RebindToUnsigned<DI16>(), lo));
      c[1] = hn::BitCast(d16, hn::PromoteTo(hn::RebindToUnsigned<DI16>(), hi));
#else  // AVX3, AVX3_DL: 32 int16 lanes, one vector per block
      c[0] = hn::BitCast(d16, hn::PromoteTo(hn::RebindToUnsigned<DI16>(),
                                            hn::Combine(hn::Full256<uint8_t>(), hi, lo)));
#endif
      const auto eight = hn::Set(d16, int16_t{8});
      for (auto& v : c) v = hn::Sub(v, eight);
      hn::Vec<DI32> s0[kQB], s1[kQB];
      for (int j = 0; j < kQB; ++j) s0[j] = s1[j] = hn::Zero(di);
      for (uint32_t i = 0; i < 32 / kN16; ++i) {
        for (int j = 0; j < kQB; ++j) {
          s0[j] = hn::ReorderWidenMulAccumulate(di, c[i], hn::LoadU(d16, q16[j] + 32 * blk + i * kN16),
                                                s0[j], s1[j]);
        }
      }
      for (int j = 0; j < kQB; ++j) {
        tot[j] = hn::MulAdd(hn::ConvertTo(DF(), hn::Add(s0[j], s1[j])), scale, tot[j]);
      }
    }
#endif
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

// ---------------------------------------------------------------------------
// Integer K path for the ggml block formats (q8_0, q4_0): each query vector
// is quantized once per K pass to int8 with one scale per 32-value block,
// q ~= qs_b * q8 (qs_b = max|q_b| / 127, |q8| <= 127, round to nearest),
// and a row's dot product is, per block, sum(k_code * q8) in int32 lanes
// times (k_scale_b * qs_b) in f32. The codes (q8_0's int8, q4_0's nibble - 8)
// are made unsigned with their signs moved onto the query (|c| x sign(q, c):
// vpsignb), so one u8 x i8 multiply-add of byte pairs into int16
// (vpmaddubsw; a pair is at most 2 * 128 * 127 < 2^15: no saturation) and
// one int16-pair add into int32 (vpmaddwd by ones) take 32 values per
// instruction pair; on AVX3_DL one vpdpbusd does both. The codes are
// loaded, unpacked and made unsigned once per row for all kQB queries.
// A score moves by at most scale * sum_b qs_b / 2 * sum_{i in b} |k_i|
// (docs/attention.md). x86 only (the byte multiply-adds are raw
// intrinsics); other targets take the int16 or float path.
//
// Vectors: one 32-value block per 256-bit vector on AVX2, AVX3 and
// AVX3_DL (ggml blocks are 32 values behind their own scale, so a 512-bit
// vector would need two blocks' codes from two places and a two-scale
// vector; AVX3 uses its 256-bit forms of the same instructions), two
// 128-bit vectors per block on SSE4.

template <Format F>
constexpr bool kInt8Keys = KVCACHE_ATTN_X86_SIMD && (F == Format::kQ8_0 || F == Format::kQ4_0);

// One query vector quantized for the int8 path.
struct Int8Query {
  alignas(64) int8_t q[kIntMaxDim];
  float qs[kIntMaxDim / 32];
};

// q[d] (d a multiple of 32, <= kIntMaxDim) into out. Once per K pass per
// query vector (O(d), outside the row loop), plain C++ so every target
// rounds the query the same way. A block with an inf or NaN (a finite
// query can overflow in the column scales) gets a NaN scale, so its scores
// are NaN as in the float path; a zero block gets scale 0.
inline void QuantizeQuery8(const float* q, uint32_t d, Int8Query* out) {
  for (uint32_t b = 0; b < d / 32; ++b) {
    const float* x = q + 32 * b;
    float amax = 0.0f;
    bool finite = true;
    for (uint32_t i = 0; i < 32; ++i) {
      finite = finite && std::isfinite(x[i]);
      amax = std::max(amax, std::fabs(x[i]));
    }
    int8_t* c = out->q + 32 * b;
    if (!finite || amax == 0.0f) {
      std::fill(c, c + 32, int8_t{0});
      out->qs[b] = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    const float inv = 127.0f / amax;
    for (uint32_t i = 0; i < 32; ++i) {
      const float r = std::nearbyint(x[i] * inv);
      c[i] = static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
    }
    out->qs[b] = amax / 127.0f;
  }
}

#if KVCACHE_ATTN_X86_SIMD
#if HWY_TARGET == HWY_SSE4
using D8 = hn::Full128<int8_t>;
#else
using D8 = hn::Full256<int8_t>;
#endif
using D8U = hn::RebindToUnsigned<D8>;
using D8I32 = hn::Repartition<int32_t, D8>;
using D8F = hn::Repartition<float, D8>;
using V8 = hn::Vec<D8>;
using V8I32 = hn::Vec<D8I32>;
constexpr size_t kB8 = hn::MaxLanes(D8());  // codes per vector: 16 or 32
constexpr size_t kVecs8 = 32 / kB8;          // vectors per 32-value block

// acc + (the sums of 4 adjacent products a_u8[i] * b_i8[i]) per int32 lane.
HWY_INLINE V8I32 DotBytes(V8 a_u8, V8 b_i8, V8I32 acc) {
#if HWY_TARGET == HWY_AVX3_DL
  return V8I32{_mm256_dpbusd_epi32(acc.raw, a_u8.raw, b_i8.raw)};
#elif HWY_TARGET == HWY_SSE4
  const __m128i p = _mm_maddubs_epi16(a_u8.raw, b_i8.raw);
  return hn::Add(acc, V8I32{_mm_madd_epi16(p, _mm_set1_epi16(1))});
#else
  const __m256i p = _mm256_maddubs_epi16(a_u8.raw, b_i8.raw);
  return hn::Add(acc, V8I32{_mm256_madd_epi16(p, _mm256_set1_epi16(1))});
#endif
}

// b with its sign flipped where c < 0 and zeroed where c == 0 (vpsignb).
HWY_INLINE V8 SignBytes(V8 b, V8 c) {
#if HWY_TARGET == HWY_SSE4
  return V8{_mm_sign_epi8(b.raw, c.raw)};
#else
  return V8{_mm256_sign_epi8(b.raw, c.raw)};
#endif
}


// Signed codes [32k + kB8 * v, ...) of block blk (vector v of kVecs8).
template <Format F>
HWY_INLINE V8 BlockCodes(const uint8_t* blk, size_t v) {
  const D8 d8;
  if constexpr (F == Format::kQ8_0) {
    return hn::LoadU(d8, reinterpret_cast<const int8_t*>(blk + 2) + v * kB8);
  } else {
    // q4_0: 16 bytes, value i in the low nibble of byte i, value 16 + i in
    // its high nibble.
    const hn::Full128<uint8_t> d16b;
    const auto x = hn::LoadU(d16b, blk + 2);
    const auto hi = hn::BitCast(d16b, hn::ShiftRight<4>(hn::BitCast(hn::Full128<uint16_t>(), x)));
#if HWY_TARGET == HWY_SSE4
    const auto u = v == 0 ? x : hi;
#else
    (void)v;
    const auto u = hn::Combine(D8U(), hi, x);
#endif
    const auto nib = hn::And(u, hn::Set(D8U(), uint8_t{15}));
    return hn::Sub(hn::BitCast(d8, nib), hn::Set(d8, int8_t{8}));
  }
}

// dots[j] ~= <q_j, k> for the row at p (scales applied), kQB queries.
template <Format F, int kQB>
HWY_INLINE void RowDotsInt8(const uint8_t* p, uint32_t d, const Int8Query* const* qq,
                            float* dots) {
  constexpr uint32_t kBlockBytes = F == Format::kQ8_0 ? 34 : 18;
  const D8 d8;
  const D8F df;
  hn::Vec<D8F> tot[kQB];
  for (int j = 0; j < kQB; ++j) tot[j] = hn::Zero(df);
  for (uint32_t blk = 0; blk < d / 32; ++blk) {
    const uint8_t* b = p + kBlockBytes * blk;
    V8I32 acc[kQB];
    for (int j = 0; j < kQB; ++j) acc[j] = hn::Zero(D8I32());
    for (size_t v = 0; v < kVecs8; ++v) {
      const V8 c = BlockCodes<F>(b, v);
      const V8 ac = hn::Abs(c);  // vpabsb: -128 stays 0x80, read as unsigned 128
      for (int j = 0; j < kQB; ++j) {
        const V8 qv = hn::Load(d8, qq[j]->q + 32 * blk + v * kB8);
        acc[j] = DotBytes(ac, SignBytes(qv, c), acc[j]);
      }
    }
    const auto ks = BroadcastF16(b, D8F());
    for (int j = 0; j < kQB; ++j) {
      const auto s = hn::Mul(ks, hn::Set(df, qq[j]->qs[blk]));
      tot[j] = hn::MulAdd(hn::ConvertTo(df, acc[j]), s, tot[j]);
    }
  }
  if constexpr (kQB == 4) {
    Reduce4(df, tot[0], tot[1], tot[2], tot[3], dots);
  } else {
    for (int j = 0; j < kQB; ++j) dots[j] = hn::GetLane(hn::SumOfLanes(df, tot[j]));
  }
}
#else
template <Format F, int kQB>
void RowDotsInt8(const uint8_t* p, uint32_t d, const Int8Query* const* qq,
                 float* dots);  // never instantiated on this target
#endif

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

template <Format F>
constexpr bool kNibbleIntKeys = KVCACHE_ATTN_X86_SIMD && F == Format::kTurbo4I;

#if KVCACHE_ATTN_X86_SIMD
using D8N = hn::Rebind<uint8_t, DI16>;   // kN16 code bytes
using D8NI = hn::Rebind<int8_t, DI16>;

constexpr bool kNibbleIntPath = true;  // this target has RowDotsNibble
HWY_INLINE bool NibbleIntFits(uint32_t d) { return IntPathFits(d) && d % (2 * kN16) == 0; }

// q16[d] in chunk order from q[d] in nibble order (plan.h); returns qscale.
HWY_INLINE float QuantizeQueryNibble(const float* q, uint32_t d, int16_t* q16) {
  alignas(64) float perm[kIntMaxDim];
  for (uint32_t j = 0; j < d / 2; ++j) {  // code byte j: group j / 8, values 2 (j % 8) + 0, 1
    const uint32_t base = 2 * kN16 * (j / kN16) + j % kN16;
    const float* g = q + 16 * (j / 8) + j % 8;
    perm[base] = g[0];
    perm[base + kN16] = g[8];
  }
  return QuantizeQuery(perm, d, q16);
}

#if HWY_TARGET <= HWY_AVX2
// f32 lane k from byte k of `rep` (an E4M3 scale per lane) times 2^-8: the
// shared step of GroupScaleLanes and GroupScalePairs.
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

// f32 lane k: the E4M3 group scale sc[k / 4] times 2^-8 (exact; the f16
// move of E4M3Block with F16C; NaN codes 0x7F/0xFF, which the encoder never
// writes, read as numbers), for the kN / 4 groups of a chunk.
HWY_INLINE VF GroupScaleLanes(const uint8_t* sc) {
#if HWY_TARGET <= HWY_AVX2
  constexpr size_t kG = kN / 4;
  uint32_t w = 0;
  std::memcpy(&w, sc, kG);
  const hn::Full128<uint8_t> d8;
  alignas(16) static constexpr uint8_t kRep[16] = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3};
  return E4M3BytesToLanes(hn::TableLookupBytes(
      hn::BitCast(d8, hn::Set(hn::Full128<uint32_t>(), w)), hn::Load(d8, kRep)));
#else
  static_assert(kN == 4, "SSE4: one group per chunk");
  return hn::Set(DF(), fi::E4M3ToFloat(sc[0]) * (1.0f / kE4M3BlockMul));
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
  const auto mask = hn::Set(d8, uint8_t{15});
  const hn::Repartition<uint16_t, D8N> dw;
  const uint8_t* sc = p + d / 2;
  VF tot[kQB];
  for (int j = 0; j < kQB; ++j) tot[j] = hn::Zero(df);
  for (uint32_t c = 0; c < d / (2 * kN16); ++c) {
    const auto x = hn::LoadU(d8, p + c * kN16);
    const auto lo = hn::BitCast(d8i, hn::And(x, mask));
    const auto hi = hn::BitCast(d8i, hn::And(hn::BitCast(d8, hn::ShiftRight<4>(hn::BitCast(dw, x))), mask));
    const auto lv = hn::PromoteTo(d16, hn::TableLookupBytes(table, lo));
    const auto hv = hn::PromoteTo(d16, hn::TableLookupBytes(table, hi));
    const VF s = GroupScaleLanes(sc + c * (kN16 / 8));
    for (int j = 0; j < kQB; ++j) {
      const int16_t* qc = q16[j] + 2 * kN16 * c;
      auto s1 = hn::Zero(di);
      auto acc = hn::ReorderWidenMulAccumulate(di, lv, hn::Load(d16, qc), hn::Zero(di), s1);
      acc = hn::ReorderWidenMulAccumulate(di, hv, hn::Load(d16, qc + kN16), acc, s1);
      tot[j] = hn::MulAdd(hn::ConvertTo(df, hn::Add(acc, s1)), s, tot[j]);
    }
  }
  if constexpr (kQB == 4) {
    Reduce4(tot[0], tot[1], tot[2], tot[3], dots);
  } else {
    for (int j = 0; j < kQB; ++j) dots[j] = hn::GetLane(hn::SumOfLanes(df, tot[j]));
  }
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
  for (uint32_t j = 0; j < d / 2; ++j) {  // code byte j: group j / 8, values 2 (j % 8) + 0, 1
    const uint32_t base = 2 * kB8N * (j / kB8N) + j % kB8N;
    const float* g = q + 16 * (j / 8) + j % 8;
    for (uint32_t h = 0; h < 2; ++h) {
      const float r = std::clamp(std::nearbyint(g[8 * h] * inv), -127.0f, 127.0f);
      out->q[base + h * kB8N] = static_cast<int8_t>(r);
      out->neg[base + h * kB8N] = static_cast<int8_t>(-r);
    }
  }
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

// f32 lane k: the E4M3 group scale sc[k / 2] times 2^-8 (as
// GroupScaleLanes), for the kN / 2 groups of a chunk.
HWY_INLINE VF GroupScalePairs(const uint8_t* sc) {
#if HWY_TARGET <= HWY_AVX2
  constexpr size_t kG = kN / 2;
  uint64_t w = 0;
  std::memcpy(&w, sc, kG);
  const hn::Full128<uint8_t> d8;
  alignas(16) static constexpr uint8_t kRep[16] = {0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7};
  return E4M3BytesToLanes(hn::TableLookupBytes(
      hn::BitCast(d8, hn::Set(hn::Full128<uint64_t>(), w)), hn::Load(d8, kRep)));
#else
  const float a = fi::E4M3ToFloat(sc[0]) * (1.0f / kE4M3BlockMul);
  const float b = fi::E4M3ToFloat(sc[1]) * (1.0f / kE4M3BlockMul);
  return VF{_mm_setr_ps(a, a, b, b)};
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
  const hn::Repartition<uint16_t, D8N8> dw;
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
  const auto mask = hn::Set(du8, uint8_t{15});
  const uint8_t* sc = p + d / 2;
  VF tot[kQB];
  for (int j = 0; j < kQB; ++j) tot[j] = hn::Zero(df);
  for (uint32_t c = 0; c < d / (2 * kB8N); ++c) {
    const auto x = hn::LoadU(du8, p + c * kB8N);
    const auto lo = hn::BitCast(d8, hn::And(x, mask));
    const auto hi = hn::BitCast(d8, hn::And(hn::BitCast(du8, hn::ShiftRight<4>(hn::BitCast(dw, x))), mask));
    const VF s = GroupScalePairs(sc + c * (kB8N / 8));
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
  if constexpr (kQB == 4) {
    Reduce4(tot[0], tot[1], tot[2], tot[3], dots);
  } else {
    for (int j = 0; j < kQB; ++j) dots[j] = hn::GetLane(hn::SumOfLanes(df, tot[j]));
  }
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

template <Format F>
constexpr bool kPlaneIntKeys =
    KVCACHE_ATTN_X86_SIMD && (F == Format::kTurbo3I || F == Format::kTurbo2I);

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
// GroupScaleLanes), for the kB / 4 groups of a chunk.
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
  if constexpr (kQB == 4) {
    Reduce4(df, tot[0], tot[1], tot[2], tot[3], dots);
  } else {
    for (int j = 0; j < kQB; ++j) dots[j] = hn::GetLane(hn::SumOfLanes(df, tot[j]));
  }
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

// The K pass proper, by key path: kFloat (decoded keys, FMAs), kInt16
// (q8, q8_0, q4_0 keys through RowDotsInt with the queries already in q16, qscale),
// kInt8 (ggml keys through RowDotsInt8 with the queries in q8).
// kNibble (turbo4i keys through RowDotsNibble, queries in q16, qscale),
// kNibble8 (turbo4i keys through RowDotsNibble8, queries in a.n8),
// kPlanes (turbo3i and turbo2i keys through RowDotsPlanes, chunks of kPlaneB
// bytes, queries in a.n8).
enum class KeyPath { kFloat, kInt16, kInt8, kNibble, kNibble8, kPlanes };

// Where a K pass over kQB query vectors puts its scores (s[j][r]), their
// running maxima, and what each score adds (scale, then bias when
// has_bias).
template <int kQB>
struct KScores {
  float* s[kQB];
  float m[kQB];
  float bias[kQB];
  float scale;
  bool has_bias;
};

// Scores of rows [r, run_end) of one run (row r at p), every row visible
// to every query. row_dots(p, dots) gives a row's kQB dot products.
template <int kQB, class RowDotsFn>
HWY_INLINE void ScoreRunVisible(const RowDotsFn& row_dots, const uint8_t* p, uint32_t r,
                                uint32_t run_end, uint32_t row_bytes, Prefetcher& pf,
                                KScores<kQB>& k) {
  // Locals in the row loop (not k's fields): nothing a score store could
  // alias, so the maxima stay in registers.
  float* const* s = k.s;
  const float scale = k.scale;
  const bool has_bias = k.has_bias;
#if HWY_TARGET <= HWY_AVX2
  if constexpr (kQB == 4) {
    // The 4 scores of a row as one 128-bit vector: the same multiply,
    // add and max as the scalar loop below (bit for bit), in 3 vector
    // ops. Kept scalar, GCC held m[] packed in two 64-bit stack words
    // and spent ~10 ops per query per row on it. AVX2 and AVX-512 only:
    // SSE4's 16 registers are already short of its 16 accumulators
    // (turbo2 measured ~5% slower there with the vector form).
    const hn::FixedTag<float, 4> d4;
    const auto scale4 = hn::Set(d4, scale);
    const auto bias4 = hn::LoadU(d4, k.bias);
    auto m4 = hn::LoadU(d4, k.m);
    float* s0 = s[0];
    float* s1 = s[1];
    float* s2 = s[2];
    float* s3 = s[3];
    for (; r < run_end; ++r, p += row_bytes) {
      pf.Step();
      alignas(16) float dots[4];
      row_dots(p, dots);
      auto x4 = hn::Mul(hn::Load(d4, dots), scale4);
      if (has_bias) x4 = hn::Add(x4, bias4);
      m4 = hn::IfThenElse(m4 < x4, x4, m4);  // std::max(m, x), NaN x included
      s0[r] = hn::GetLane(x4);
      s1[r] = hn::ExtractLane(x4, 1);
      s2[r] = hn::ExtractLane(x4, 2);
      s3[r] = hn::ExtractLane(x4, 3);
    }
    hn::StoreU(m4, d4, k.m);
    return;
  }
#endif
  float m[kQB], bias[kQB];
  for (int j = 0; j < kQB; ++j) m[j] = k.m[j], bias[j] = k.bias[j];
  for (; r < run_end; ++r, p += row_bytes) {
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
  for (int j = 0; j < kQB; ++j) k.m[j] = m[j];
}

// As ScoreRunVisible, testing each row's visibility to each query (-inf
// where hidden; a row no query sees is not decoded).
template <int kQB, class RowDotsFn>
HWY_INLINE void ScoreRunMasked(const RowDotsFn& row_dots, const uint8_t* p, uint32_t r,
                               uint32_t run_end, uint32_t row_bytes, Prefetcher& pf,
                               const Visibility& vis, const QueryVec* qv, KScores<kQB>& k) {
  float* const* s = k.s;  // locals in the row loop, as in ScoreRunVisible
  const float scale = k.scale;
  const bool has_bias = k.has_bias;
  float m[kQB], bias[kQB];
  for (int j = 0; j < kQB; ++j) m[j] = k.m[j], bias[j] = k.bias[j];
  for (; r < run_end; ++r, p += row_bytes) {
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
  for (int j = 0; j < kQB; ++j) k.m[j] = m[j];
}

template <Format F, bool kExact, int kQB, KeyPath kPath, uint32_t kPlaneB = 0>
void KPassRows(const KArgs& a, const int16_t* const* q16, const float* qscale,
               const Int8Query* const* q8, const Nibble8Query* const* n8 = nullptr) {
  const Plan& plan = *a.plan;
  const HeadJob& job = *a.job;
  const LayerKvView& view = *job.view;
  const uint32_t d = plan.head_dim;
  const Decoder<F> dec = MakeDecoder<F>(d);
  const Visibility vis = MakeVisibility(job);
  const QueryVec* qv = plan.queries.data() + job.first_query + a.qi0;
  const float* q[kQB];
  KScores<kQB> k;
  for (int j = 0; j < kQB; ++j) {
    q[j] = qv[j].q;
    k.s[j] = a.scores + static_cast<size_t>(a.qi0 + j) * job.rows;
    k.m[j] = a.maxes[a.qi0 + j];
    k.bias[j] = qv[j].bias;
  }
  k.scale = plan.scale * ValueMul(F);
  k.has_bias = job.has_bias;
  const bool all_visible = AllVisible(vis, qv, kQB, a.r0, a.r1);
  const HeadRows rows(view, view.k, job.head);
  float n8mul[kQB] = {};
  if constexpr (kPath == KeyPath::kNibble8) {
    for (int j = 0; j < kQB; ++j) n8mul[j] = Nibble8Mul(*n8[j]);
  } else if constexpr (kPath == KeyPath::kPlanes) {
    for (int j = 0; j < kQB; ++j) n8mul[j] = PlaneMul(*n8[j]);
  }
  auto row_dots = [&](const uint8_t* p, float* dots) HWY_ATTR {
    (void)q16;
    (void)qscale;
    (void)q8;
    (void)n8;
    if constexpr (kPath == KeyPath::kPlanes) {
      RowDotsPlanes<F, kQB, kPlaneB>(p, d, n8, n8mul, dots);
    } else if constexpr (kPath == KeyPath::kNibble8) {
      RowDotsNibble8<kQB>(p, d, n8, n8mul, dots);
    } else if constexpr (kPath == KeyPath::kNibble) {
      RowDotsNibble<kQB>(p, d, q16, qscale, dots);
    } else if constexpr (kPath == KeyPath::kInt16) {
      RowDotsInt<F, kQB>(p, d, q16, qscale, dots);
    } else if constexpr (kPath == KeyPath::kInt8) {
      RowDotsInt8<F, kQB>(p, d, q8, dots);
    } else {
      RowDots<F, kExact, kQB>(dec, p, d, q, dots);
    }
  };
  std::optional<Prefetcher> own_pf;
  if (a.pf == nullptr) own_pf.emplace(&rows, &a.r1, 1, a.r0, kWholeRun);
  Prefetcher& pf = a.pf ? *a.pf : *own_pf;
  for (uint32_t r = a.r0; r < a.r1;) {
    uint32_t n;
    const uint8_t* p = rows.Run(r, a.r1, &n);
    if (all_visible) {
      ScoreRunVisible<kQB>(row_dots, p, r, r + n, rows.row_bytes, pf, k);
    } else {
      ScoreRunMasked<kQB>(row_dots, p, r, r + n, rows.row_bytes, pf, vis, qv, k);
    }
    r += n;
  }
  for (int j = 0; j < kQB; ++j) a.maxes[a.qi0 + j] = k.m[j];
}

template <Format F, bool kExact, int kQB>
void KPass(const KArgs& a) {
  const uint32_t d = a.plan->head_dim;
  const QueryVec* qv = a.plan->queries.data() + a.job->first_query + a.qi0;
  if constexpr (kPlaneIntKeys<F> && !kExact) {
    const uint32_t kb = a.plan->int_keys ? PlaneChunkBytes(d) : 0;
    if (kb != 0) {
      // turbo3i and turbo2i keys: the queries rounded to int8 once per K pass.
      Nibble8Query qbuf[kQB];
      const Nibble8Query* n8[kQB];
      for (int j = 0; j < kQB; ++j) {
        QuantizeQueryPlanes(qv[j].q, d, kb, &qbuf[j]);
        n8[j] = &qbuf[j];
      }
      if constexpr (kPlanePath) {
        if constexpr (kPlaneMaxB >= 64) {
          if (kb == 64) return KPassRows<F, kExact, kQB, KeyPath::kPlanes, 64>(a, nullptr, nullptr, nullptr, n8);
        }
        if constexpr (kPlaneMaxB >= 32) {
          if (kb == 32) return KPassRows<F, kExact, kQB, KeyPath::kPlanes, 32>(a, nullptr, nullptr, nullptr, n8);
        }
        return KPassRows<F, kExact, kQB, KeyPath::kPlanes, 16>(a, nullptr, nullptr, nullptr, n8);
      }
    }
  }
  if constexpr (kNibbleIntKeys<F> && !kExact) {
    if (kNibble8Path && a.plan->int_keys && Nibble8Fits(d)) {
      // turbo4i keys: the queries rounded to int8 once per K pass.
      Nibble8Query qbuf[kQB];
      const Nibble8Query* n8[kQB];
      for (int j = 0; j < kQB; ++j) {
        QuantizeQueryNibble8(qv[j].q, d, &qbuf[j]);
        n8[j] = &qbuf[j];
      }
      if constexpr (kNibble8Path) {
        return KPassRows<F, kExact, kQB, KeyPath::kNibble8>(a, nullptr, nullptr, nullptr, n8);
      }
    }
    if (a.plan->int_keys && NibbleIntFits(d)) {
      // turbo4i keys: the queries rounded to int16 once per K pass.
      alignas(64) int16_t q16_buf[kQB * kIntMaxDim];
      const int16_t* q16[kQB];
      float qscale[kQB];
      for (int j = 0; j < kQB; ++j) {
        qscale[j] = QuantizeQueryNibble(qv[j].q, d, q16_buf + j * kIntMaxDim);
        q16[j] = q16_buf + j * kIntMaxDim;
      }
      if constexpr (kNibbleIntPath) {
        return KPassRows<F, kExact, kQB, KeyPath::kNibble>(a, q16, qscale, nullptr);
      }
    }
  }
  if constexpr (kIntKeys<F> && !kExact) {
    if (a.plan->int_keys && IntPathFits(d)) {
      if constexpr (kInt8Keys<F>) {
        if (a.plan->int8_keys) {
          // ggml keys, int8 query: the queries rounded once per K pass (a
          // chunk of rows).
          Int8Query qbuf[kQB];
          const Int8Query* q8[kQB];
          for (int j = 0; j < kQB; ++j) {
            QuantizeQuery8(qv[j].q, d, &qbuf[j]);
            q8[j] = &qbuf[j];
          }
          return KPassRows<F, kExact, kQB, KeyPath::kInt8>(a, nullptr, nullptr, q8);
        }
      }
      // q8, q8_0, q4_0 keys in int16 lanes, the queries rounded once per K
      // pass (a chunk of rows).
      alignas(64) int16_t q16_buf[kQB * kIntMaxDim];
      const int16_t* q16[kQB];
      float qscale[kQB];
      for (int j = 0; j < kQB; ++j) {
        qscale[j] = QuantizeQuery(qv[j].q, d, q16_buf + j * kIntMaxDim);
        q16[j] = q16_buf + j * kIntMaxDim;
      }
      return KPassRows<F, kExact, kQB, KeyPath::kInt16>(a, q16, qscale, nullptr);
    }
  }
  (void)d;
  (void)qv;
  KPassRows<F, kExact, kQB, KeyPath::kFloat>(a, nullptr, nullptr, nullptr);
}

template <Format F, bool kExact>
KFn KFor(int qb) {
  return qb == 4   ? &KPass<F, kExact, 4>
         : qb == 3 ? &KPass<F, kExact, 3>
         : qb == 2 ? &KPass<F, kExact, 2>
                   : &KPass<F, kExact, 1>;
}

}  // namespace HWY_NAMESPACE
}  // namespace attention_internal
}  // namespace kvcache
HWY_AFTER_NAMESPACE();

#endif  // KVCACHE_SRC_ATTENTION_KPASS_INL_H_
