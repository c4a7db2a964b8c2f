// Decoder<F> of the byte-per-value formats: fp8_e4m3 (values times 2^-8,
// see ValueMul) and q8 (int8 codes times the row scale). Scalar reference:
// fp8_q8/scalar.cc. (The attention kernels usually take an integer K path
// for q8 keys instead.)
//
// A fragment of format/decoders-inl.h, which includes it inside namespace
// kvcache::format_internal::HWY_NAMESPACE once per target (the contract and
// the shared helpers are there); include that header, not this one.

// fp8 values come out times 2^-8 (E4M3Block); ValueMul puts the 2^8 back
// (the attention kernels: once per score and once per output, which is
// exact and saves a multiply per 8 values).
template <>
struct Decoder<Format::kFp8E4M3> {
  static constexpr bool kTail = true;
  HWY_INLINE RowRef Prepare(const uint8_t* p, uint32_t) const { return {p, 1.0f}; }
  HWY_INLINE void Block(const RowRef& r, uint32_t b, VF* out) const {
    E4M3Block(r.p + b * kBlockValues, out);
  }
  HWY_INLINE float Value(const RowRef& r, uint32_t i) const {
    return E4M3ToFloat(r.p[i]) * (1.0f / kE4M3BlockMul);
  }
  HWY_INLINE bool Regular(const RowRef& r, uint32_t b) const {
    return !HasE4M3NaN(r.p + b * kBlockValues);
  }
};

template <>
struct Decoder<Format::kQ8> {
  static constexpr bool kTail = true;
  HWY_INLINE RowRef Prepare(const uint8_t* p, uint32_t d) const { return {p, Q8RowScale(p, d)}; }
  HWY_INLINE void Block(const RowRef& r, uint32_t b, VF* out) const {
    const hn::Rebind<int8_t, DF> di8;
    const VF s = hn::Set(DF(), r.scale);
    const int8_t* c = reinterpret_cast<const int8_t*>(r.p) + b * kBlockValues;
    for (size_t v = 0; v < kVecs; ++v) {
      out[v] = hn::Mul(s, hn::ConvertTo(DF(), hn::PromoteTo(DI(), hn::LoadU(di8, c + v * kN))));
    }
  }
  HWY_INLINE float Value(const RowRef& r, uint32_t i) const {
    return r.scale * static_cast<float>(static_cast<int8_t>(r.p[i]));
  }
};
