// The fp8_q8 family's piece of the attention K pass: q8 keys' integer path
// (IntKeyPass<kQ8>, the generic pass in src/attention/kpass-inl.h asks it
// first). fp8_e4m3 keys take the float path over their Decoder.
//
// Per-target header (Highway's -inl.h convention): included by the family's
// attention kernels (src/attention/kernels_<family>.cc) after
// hwy/foreach_target.h, so once per compiled target, at file scope.

#include "attention/kpass-inl.h"

#if defined(KVCACHE_SRC_FORMAT_FP8_Q8_KPASS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVCACHE_SRC_FORMAT_FP8_Q8_KPASS_INL_H_
#undef KVCACHE_SRC_FORMAT_FP8_Q8_KPASS_INL_H_
#else
#define KVCACHE_SRC_FORMAT_FP8_Q8_KPASS_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
namespace kvcache {
namespace attention_internal {
namespace HWY_NAMESPACE {

// ---------------------------------------------------------------------------
// Integer K path for q8 keys (the default; not on the scalar target): each
// query vector is rounded once per K pass to int16 (QuantizeQuery), and a
// row's dot product is int8 x int16 multiply-adds into int32 lanes
// (ReorderWidenMulAccumulate: vpmaddwd on x86, 2x the multiply-adds of an
// f32 FMA and no float conversion of the codes), times the row scale.

#if HWY_TARGET != HWY_SCALAR
// dots[j] ~= <q_j, k> for the q8 row at p (row scale applied), kQB queries.
template <int kQB>
HWY_INLINE void RowDotsQ8(const uint8_t* p, uint32_t d, const int16_t* const* q16,
                          const float* qscale, float* dots) {
  const DI32 di;
  VF tot[kQB];
  hn::Vec<DI32> s0[kQB], s1[kQB];
  for (int j = 0; j < kQB; ++j) s0[j] = s1[j] = hn::Zero(di);
  const int8_t* c = reinterpret_cast<const int8_t*>(p);
  for (uint32_t i = 0; i < d; i += kN16) {
    for (int j = 0; j < kQB; ++j) MulAddCodes(c + i, q16[j] + i, s0[j], s1[j]);
  }
  for (int j = 0; j < kQB; ++j) tot[j] = hn::ConvertTo(DF(), hn::Add(s0[j], s1[j]));
  const float row_scale = fi::Q8RowScale(p, d);
  ReduceDots<kQB>(DF(), tot, dots);
  for (int j = 0; j < kQB; ++j) dots[j] = dots[j] * (qscale[j] * row_scale);
}
#else
template <int kQB>
void RowDotsQ8(const uint8_t* p, uint32_t d, const int16_t* const* q16, const float* qscale,
               float* dots);  // never instantiated on this target
#endif

template <>
struct IntKeyPass<Format::kQ8> {
  static constexpr bool kDefined = true;
  template <int kQB>
  static bool Run(const KArgs& a) {
    const uint32_t d = a.plan->head_dim;
    if constexpr (kInt16Lanes) {
      if (a.plan->int_keys && IntPathFits(d)) {
        // The queries rounded once per K pass (a chunk of rows).
        WithInt16Queries<kQB>(
            a, [](const float* q, uint32_t n, int16_t* q16) HWY_ATTR { return QuantizeQuery(q, n, q16); },
            [&](const auto& q16, const auto& qscale) HWY_ATTR {
              KPassRows<Format::kQ8, kQB>(a, [=](const uint8_t* p, float* dots) HWY_ATTR {
                RowDotsQ8<kQB>(p, d, q16, qscale, dots);
              });
            });
        return true;
      }
    }
    return false;
  }
};

}  // namespace HWY_NAMESPACE
}  // namespace attention_internal
}  // namespace kvcache
HWY_AFTER_NAMESPACE();

#endif  // KVCACHE_SRC_FORMAT_FP8_Q8_KPASS_INL_H_
