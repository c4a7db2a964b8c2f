// Decoder<F> of the plain float formats: f32, f16 (F16C where the target
// has it), bf16 (in even/odd order). Scalar reference: plain/scalar.cc.
//
// A fragment of format/decoders-inl.h, which includes it inside namespace
// kvcache::format_internal::HWY_NAMESPACE once per target (the contract and
// the shared helpers are there); include that header, not this one.

template <>
struct Decoder<Format::kF32> {
  static constexpr bool kTail = true;
  HWY_INLINE RowRef Prepare(const uint8_t* p, uint32_t) const { return {p, 1.0f}; }
  HWY_INLINE void Block(const RowRef& r, uint32_t b, VF* out) const {
    const float* f = reinterpret_cast<const float*>(r.p) + b * kBlockValues;
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
    const hwy::float16_t* h = reinterpret_cast<const hwy::float16_t*>(r.p) + b * kBlockValues;
    for (size_t v = 0; v < kVecs; ++v) out[v] = hn::PromoteTo(DF(), hn::LoadU(dh, h + v * kN));
  }
  HWY_INLINE float Value(const RowRef& r, uint32_t i) const { return F16ToFloat(LoadU16(r.p + 2 * i)); }
  // Finite values only: F16C quiets a signalling NaN (the format keeps it as
  // stored), and the conversion of targets without F16C makes inf and NaN
  // finite.
  HWY_INLINE bool Regular(const RowRef& r, uint32_t b) const {
    return !HasF16InfOrNaN(r.p + 32 * b);
  }
};

template <>
struct Decoder<Format::kBF16> {
  static constexpr bool kTail = true;
  static constexpr bool kEvenOdd = true;
  HWY_INLINE RowRef Prepare(const uint8_t* p, uint32_t) const { return {p, 1.0f}; }
  // Even/odd order: a 32-bit word holds value 2w in its low half and 2w + 1
  // in its high half, so the word shifted left by 16 is the even value as an
  // f32 and the word with its low half cleared is the odd one: one op per 8
  // values.
  HWY_INLINE void Block(const RowRef& r, uint32_t b, VF* out) const {
    const DU du;
    const uint8_t* g = r.p + b * 2 * kBlockValues;
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
  HWY_INLINE float Value(const RowRef& r, uint32_t i) const { return BF16ToFloat(LoadU16(r.p + 2 * i)); }
};
