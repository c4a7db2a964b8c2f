// Decoders of the byte-per-value formats: fp8_e4m3 (values times 2^-8, see
// ValueMul) and q8 (int8 codes times the row scale). Scalar reference:
// format_internal::DecodeRowsScalar; tested by tests/attention/decoders_test.cc.
// q8 keys usually take the integer K path instead (kpass-inl.h).
//
// Per-target header (Highway's -inl.h convention): included by a kernel .cc
// after hwy/foreach_target.h, so once per compiled target, at file scope.

#include "attention/kernel_common-inl.h"

#if defined(KVCACHE_SRC_ATTENTION_DECODE_FP8_Q8_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVCACHE_SRC_ATTENTION_DECODE_FP8_Q8_INL_H_
#undef KVCACHE_SRC_ATTENTION_DECODE_FP8_Q8_INL_H_
#else
#define KVCACHE_SRC_ATTENTION_DECODE_FP8_Q8_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
namespace kvcache {
namespace attention_internal {
namespace HWY_NAMESPACE {

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


}  // namespace HWY_NAMESPACE
}  // namespace attention_internal
}  // namespace kvcache
HWY_AFTER_NAMESPACE();

#endif  // KVCACHE_SRC_ATTENTION_DECODE_FP8_Q8_INL_H_
