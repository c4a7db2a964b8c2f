// Decoders of the plain float formats: f32, f16 (F16C where the target
// has it), bf16 (in even/odd order). Scalar reference:
// format_internal::DecodeRowsScalar; tested against it on every target by
// tests/attention/decoders_test.cc.
//
// Per-target header (Highway's -inl.h convention): included by a kernel .cc
// after hwy/foreach_target.h, so once per compiled target, at file scope.

#include "attention/kernel_common-inl.h"

#if defined(KVCACHE_SRC_ATTENTION_DECODE_PLAIN_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVCACHE_SRC_ATTENTION_DECODE_PLAIN_INL_H_
#undef KVCACHE_SRC_ATTENTION_DECODE_PLAIN_INL_H_
#else
#define KVCACHE_SRC_ATTENTION_DECODE_PLAIN_INL_H_
#endif

HWY_BEFORE_NAMESPACE();
namespace kvcache {
namespace attention_internal {
namespace HWY_NAMESPACE {

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
#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86
    // 16 lanes (AVX-512): the group's 8 words in a half vector, the even
    // values in the lower half and the odd ones in the upper (one insert).
    static_assert(kVecs == 1, "AVX-512 targets have 16 f32 lanes");
    const hn::Half<DU> dh;
    const auto w = hn::LoadU(dh, reinterpret_cast<const uint32_t*>(g));
    out[0] = hn::BitCast(
        DF(), hn::Combine(du, hn::And(w, hn::Set(dh, 0xFFFF0000u)), hn::ShiftLeft<16>(w)));
#else
    static_assert(kVecs >= 2, "at most 8 lanes here");
    for (size_t v = 0; v < kVecs / 2; ++v) {
      const auto w = hn::LoadU(du, reinterpret_cast<const uint32_t*>(g) + v * kN);
      out[v] = hn::BitCast(DF(), hn::ShiftLeft<16>(w));
      out[kVecs / 2 + v] = hn::BitCast(DF(), hn::And(w, hn::Set(du, 0xFFFF0000u)));
    }
#endif
  }
  HWY_INLINE float Value(const RowRef& r, uint32_t i) const {
    return fi::BF16ToFloat(fi::LoadU16(r.p + 2 * i));
  }
};

}  // namespace HWY_NAMESPACE
}  // namespace attention_internal
}  // namespace kvcache
HWY_AFTER_NAMESPACE();

#endif  // KVCACHE_SRC_ATTENTION_DECODE_PLAIN_INL_H_
