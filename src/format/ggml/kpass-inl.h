// The ggml family's piece of the attention K pass: the integer paths of
// q8_0 and q4_0 keys (IntKeyPass<kQ8_0/kQ4_0>; the generic pass in
// src/attention/kpass-inl.h asks them first): int16 query by default, int8
// query with AttentionOptions::int8_query_keys.
//
// Per-target header (Highway's -inl.h convention): included by the family's
// attention kernels (src/attention/kernels_<family>.cc) after
// hwy/foreach_target.h, so once per compiled target, at file scope.

#include "attention/kpass-inl.h"

#if defined(KVCACHE_SRC_FORMAT_GGML_KPASS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVCACHE_SRC_FORMAT_GGML_KPASS_INL_H_
#undef KVCACHE_SRC_FORMAT_GGML_KPASS_INL_H_
#else
#define KVCACHE_SRC_FORMAT_GGML_KPASS_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
namespace kvcache {
namespace attention_internal {
namespace HWY_NAMESPACE {

// ---------------------------------------------------------------------------
// Integer K path for q8_0 and q4_0 keys with an int16 query (q4_0: nibble - 8
// widened to int16; x86 SIMD targets for q4_0, every SIMD target for q8_0):
// each query vector is rounded once per K pass to int16 (QuantizeQuery), and
// a row's dot product is, per 32-value block, int8 x int16 multiply-adds into
// int32 lanes (ReorderWidenMulAccumulate: vpmaddwd on x86) times the block's
// f16 scale in one FMA.

#if HWY_TARGET != HWY_SCALAR
// dots[j] ~= <q_j, k> for the q8_0 or q4_0 row at p (scales applied), kQB
// queries.
template <Format F, int kQB>
HWY_INLINE void RowDotsGgml16(const uint8_t* p, uint32_t d, const int16_t* const* q16,
                              const float* qscale, float* dots) {
  const DI32 di;
  VF tot[kQB];
  if constexpr (F == Format::kQ4_0) {
#if KVCACHE_ATTN_X86_SIMD
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
  ReduceDots<kQB>(DF(), tot, dots);
  for (int j = 0; j < kQB; ++j) dots[j] = dots[j] * qscale[j];
}
#else
template <Format F, int kQB>
void RowDotsGgml16(const uint8_t* p, uint32_t d, const int16_t* const* q16, const float* qscale,
                   float* dots);  // never instantiated on this target
#endif

// ---------------------------------------------------------------------------
// The int8-query path for q8_0 and q4_0 keys (AttentionOptions::
// int8_query_keys; x86 SIMD targets): each query vector
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
  ReduceDots<kQB>(df, tot, dots);
}
#else
template <Format F, int kQB>
void RowDotsInt8(const uint8_t* p, uint32_t d, const Int8Query* const* qq,
                 float* dots);  // never instantiated on this target
#endif

template <Format F>
struct GgmlIntKeyPass {
  static constexpr bool kDefined = true;
  // q4_0's int16 path needs the x86 SIMD targets' byte unpacking.
  static constexpr bool kInt16Path = kInt16Lanes && (F == Format::kQ8_0 || KVCACHE_ATTN_X86_SIMD);

  template <int kQB>
  static bool Run(const KArgs& a) {
    const uint32_t d = a.plan->head_dim;
    if constexpr (kInt16Path) {
      if (!a.plan->int_keys || !IntPathFits(d)) return false;
      if constexpr (KVCACHE_ATTN_X86_SIMD) {
        if (a.plan->int8_keys) {
          // The queries rounded to int8 once per K pass (a chunk of rows).
          WithQueries<Int8Query, kQB>(
              a, [](const float* q, uint32_t n, Int8Query* out) { QuantizeQuery8(q, n, out); },
              [&](const auto& q8) HWY_ATTR {
                KPassRows<F, kQB>(a, [=](const uint8_t* p, float* dots) HWY_ATTR {
                  RowDotsInt8<F, kQB>(p, d, q8, dots);
                });
              });
          return true;
        }
      }
      // The queries rounded to int16 once per K pass (a chunk of rows).
      WithInt16Queries<kQB>(
          a, [](const float* q, uint32_t n, int16_t* q16) HWY_ATTR { return QuantizeQuery(q, n, q16); },
          [&](const auto& q16, const auto& qscale) HWY_ATTR {
            KPassRows<F, kQB>(a, [=](const uint8_t* p, float* dots) HWY_ATTR {
              RowDotsGgml16<F, kQB>(p, d, q16, qscale, dots);
            });
          });
      return true;
    }
    (void)a;
    (void)d;
    return false;
  }
};

template <>
struct IntKeyPass<Format::kQ8_0> : GgmlIntKeyPass<Format::kQ8_0> {};
template <>
struct IntKeyPass<Format::kQ4_0> : GgmlIntKeyPass<Format::kQ4_0> {};

}  // namespace HWY_NAMESPACE
}  // namespace attention_internal
}  // namespace kvcache
HWY_AFTER_NAMESPACE();

#endif  // KVCACHE_SRC_FORMAT_GGML_KPASS_INL_H_
