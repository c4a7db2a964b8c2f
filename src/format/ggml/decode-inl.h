// Decoder<F> of the ggml block formats: q8_0 and q4_0 (32 values per block
// behind an f16 scale; Block b is half of block b / 2). Scalar reference:
// ggml/scalar.cc. (The attention kernels usually take an integer K path for
// q8_0 and q4_0 keys instead.)
//
// A fragment of format/decoders-inl.h, which includes it inside namespace
// kvcache::format_internal::HWY_NAMESPACE once per target (the contract and
// the shared helpers are there); include that header, not this one.

template <>
struct Decoder<Format::kQ8_0> {
  static constexpr bool kTail = false;
  HWY_INLINE RowRef Prepare(const uint8_t* p, uint32_t) const { return {p, 1.0f}; }
  HWY_INLINE void Block(const RowRef& r, uint32_t b, VF* out) const {
    const hn::Rebind<int8_t, DF> di8;
    const uint8_t* blk = r.p + 34 * (b / 2);
    const VF d = BroadcastF16(blk);
    const int8_t* c = reinterpret_cast<const int8_t*>(blk + 2 + 16 * (b % 2));
    for (size_t v = 0; v < kVecs; ++v) {
      out[v] = hn::Mul(d, hn::ConvertTo(DF(), hn::PromoteTo(DI(), hn::LoadU(di8, c + v * kN))));
    }
  }
  HWY_INLINE float Value(const RowRef&, uint32_t) const { return 0.0f; }
};

template <>
struct Decoder<Format::kQ4_0> {
  static constexpr bool kTail = false;
  HWY_INLINE RowRef Prepare(const uint8_t* p, uint32_t) const { return {p, 1.0f}; }
  HWY_INLINE void Block(const RowRef& r, uint32_t b, VF* out) const {
    const DU du;
    const uint8_t* blk = r.p + 18 * (b / 2);
    const VF d = BroadcastF16(blk);
    const auto eight = hn::Set(DI(), 8);
    for (size_t v = 0; v < kVecs; ++v) {
      auto u = LoadBytesU32(blk + 2 + v * kN);
      u = (b % 2) ? hn::ShiftRight<4>(u) : hn::And(u, hn::Set(du, 15u));
      const auto q = hn::Sub(hn::BitCast(DI(), u), eight);
      out[v] = hn::Mul(hn::ConvertTo(DF(), q), d);
    }
  }
  HWY_INLINE float Value(const RowRef&, uint32_t) const { return 0.0f; }
};
