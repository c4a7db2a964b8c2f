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

// The K pass proper, by key path: kFloat (decoded keys, FMAs), kInt16
// (q8, q8_0, q4_0 keys through RowDotsInt with the queries already in q16, qscale),
// kInt8 (ggml keys through RowDotsInt8 with the queries in q8).
enum class KeyPath { kFloat, kInt16, kInt8 };

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

template <Format F, bool kExact, int kQB, KeyPath kPath>
void KPassRows(const KArgs& a, const int16_t* const* q16, const float* qscale,
               const Int8Query* const* q8) {
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
  auto row_dots = [&](const uint8_t* p, float* dots) HWY_ATTR {
    (void)q16;
    (void)qscale;
    (void)q8;
    if constexpr (kPath == KeyPath::kInt16) {
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
  return qb == 4 ? &KPass<F, kExact, 4> : qb == 2 ? &KPass<F, kExact, 2> : &KPass<F, kExact, 1>;
}

}  // namespace HWY_NAMESPACE
}  // namespace attention_internal
}  // namespace kvcache
HWY_AFTER_NAMESPACE();

#endif  // KVCACHE_SRC_ATTENTION_KPASS_INL_H_
