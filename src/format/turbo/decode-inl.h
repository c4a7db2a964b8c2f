// Decoder<F> of the rotated turbo formats: turbo8 (E4M3 codes), turbo4 and
// turbo4i (in even/odd order: low nibbles, then high nibbles), turbo3,
// turbo2, turbo2i and turbo3i (packed codes through in-register level
// tables), one scale per 16-value group.
// They return rotated-space values (the attention kernels rotate the query
// instead). Scalar reference: turbo/scalar.cc.
//
// A fragment of format/decoders-inl.h, which includes it inside namespace
// kvcache::format_internal::HWY_NAMESPACE once per target (the contract and
// the shared helpers are there); include that header, not this one.

// Turbo rows: codes, then one scale per 16-value group at scales_offset.
template <>
struct Decoder<Format::kTurbo8> {
  static constexpr bool kTail = false;
  uint32_t scales_offset;
  explicit Decoder(uint32_t d) : scales_offset(d) {}
  HWY_INLINE RowRef Prepare(const uint8_t* p, uint32_t) const { return {p, 1.0f}; }
  HWY_INLINE void Block(const RowRef& r, uint32_t b, VF* out) const {
    // The codes come out times 2^-8, so the group scale goes in times 2^8.
    const VF s =
        hn::Set(DF(), kE4M3BlockMul * BF16ToFloat(LoadU16(r.p + scales_offset + 2 * b)));
    E4M3Block(r.p + b * kBlockValues, out);
    for (size_t v = 0; v < kVecs; ++v) out[v] = hn::Mul(out[v], s);
  }
  HWY_INLINE float Value(const RowRef&, uint32_t) const { return 0.0f; }
  // Finite codes, and a scale for which 2^8 * scale is finite (then the two
  // products round as the reference's one).
  HWY_INLINE bool Regular(const RowRef& r, uint32_t b) const {
    const float s = BF16ToFloat(LoadU16(r.p + scales_offset + 2 * b));
    return !HasE4M3NaN(r.p + b * kBlockValues) && std::fabs(s) < 0x1p120f;
  }
};

// Per-lane shift counts for packed codes of vector v of a block: value
// i = v * kN + lane sits at bit kBits * (i % kPeriod) of its 32-bit word.
template <uint32_t kBits, uint32_t kPeriod>
HWY_INLINE hn::Vec<DU> LaneShifts(size_t v) {
  alignas(64) uint32_t buf[kBlockValues];
  for (size_t i = 0; i < kN; ++i) buf[i] = kBits * static_cast<uint32_t>((v * kN + i) % kPeriod);
  return hn::Load(DU(), buf);
}

// turbo4 and turbo4i (the same layout, 16 levels) in even/odd order:
// vector v of a group holds the low nibbles (v * kN < 8) or the high
// nibbles of kN consecutive code bytes.
struct Nibble4Decoder {
  static constexpr bool kTail = false;
  static constexpr bool kEvenOdd = true;
  uint32_t scales_offset;
  Table<8> neg, pos;  // levels 0..7 and 8..15
  VF all;             // 16 lanes: levels 0..15 (the first kN elsewhere, unused)
  Nibble4Decoder(uint32_t d, const float* levels)
      : scales_offset(d / 2), neg(levels), pos(levels + 8), all(hn::LoadU(DF(), levels)) {}
  HWY_INLINE RowRef Prepare(const uint8_t* p, uint32_t) const { return {p, 1.0f}; }
  HWY_INLINE void Block(const RowRef& r, uint32_t b, VF* out) const {
    const uint8_t* c = r.p + 8 * b;
    const VF sv = hn::Set(DF(), E4M3ToFloat(r.p[scales_offset + b]));
#if HWY_TARGET == HWY_AVX2
    // Low nibbles, then high nibbles, of the 8 code bytes: two vpermps on
    // the code's low 3 bits, its bit 3 moved to the sign bit picks the half.
    const auto u = LoadBytesU32(c);
    const auto h = hn::ShiftRight<4>(u);
    out[0] = hn::Mul(hn::IfNegativeThenElse(hn::BitCast(DF(), hn::ShiftLeft<28>(u)), Permute8(pos, u),
                                            Permute8(neg, u)),
                     sv);
    out[1] = hn::Mul(hn::IfNegativeThenElse(hn::BitCast(DF(), hn::ShiftLeft<24>(u)), Permute8(pos, h),
                                            Permute8(neg, h)),
                     sv);
#elif HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86
    // 16 lanes: the 8 code bytes widened to u32 (low nibbles) beside the
    // same shifted right by 4 (high nibbles), then one vpermps over the 16
    // levels, which reads only the low 4 bits of each index.
    static_assert(kN == 16, "AVX-512 targets have 16 f32 lanes");
    const hn::Half<DU> dh;
    const auto u = hn::PromoteTo(dh, hn::LoadU(hn::Rebind<uint8_t, decltype(dh)>(), c));
    const auto idx = hn::Combine(DU(), hn::ShiftRight<4>(u), u);
    out[0] = hn::Mul(VF{_mm512_permutexvar_ps(idx.raw, all.raw)}, sv);
#else
    const DU du;
    static_assert(kN <= 8, "16-lane targets take the branch above");
    for (size_t v = 0; v < kVecs; ++v) {
      const auto u = LoadBytesU32(c + (v * kN) % 8);
      const hn::Vec<DU> idx = (v * kN < 8) ? hn::And(u, hn::Set(du, 15u)) : hn::ShiftRight<4>(u);
      const auto i7 = hn::And(idx, hn::Set(du, 7u));
      const VF a = neg.Lookup(i7);
      const VF bb = pos.Lookup(i7);
      const auto upper = hn::RebindMask(DF(), hn::TestBit(idx, hn::Set(du, 8u)));
      out[v] = hn::Mul(hn::IfThenElse(upper, bb, a), sv);
    }
#endif
  }
  HWY_INLINE float Value(const RowRef&, uint32_t) const { return 0.0f; }
};
template <>
struct Decoder<Format::kTurbo4> : Nibble4Decoder {
  explicit Decoder(uint32_t d) : Nibble4Decoder(d, kTurbo4Levels.data()) {}
};
// turbo4i: levels that are int8 / 128, so s * level is exact and the float
// decode equals the integer kernels' products (attention/kpass-inl.h).
template <>
struct Decoder<Format::kTurbo4I> : Nibble4Decoder {
  explicit Decoder(uint32_t d) : Nibble4Decoder(d, kTurbo4ILevels.data()) {}
};

template <>
struct Decoder<Format::kTurbo3> {
  static constexpr bool kTail = false;
  uint32_t scales_offset;
  Table<8> levels;
  hn::Vec<DU> shifts[kVecs];
  explicit Decoder(uint32_t d) : scales_offset(6 * (d / 16)), levels(kTurbo3Levels.data()) {
    for (size_t v = 0; v < kVecs; ++v) shifts[v] = LaneShifts<3, 8>(v);
  }
  HWY_INLINE RowRef Prepare(const uint8_t* p, uint32_t) const { return {p, 1.0f}; }
  HWY_INLINE void Block(const RowRef& r, uint32_t b, VF* out) const {
    const DU du;
    const uint8_t* c = r.p + 6 * b;
    const VF sv = hn::Set(DF(), E4M3ToFloat(r.p[scales_offset + b]));
    // Values 0..7 are bits 0..23 of bytes 0..3, values 8..15 bits 0..23 of
    // bytes 3..6 (byte 6 is still inside the row: next group or a scale).
    for (size_t v = 0; v < kVecs; ++v) {
      hn::Vec<DU> w;
      if constexpr (kN <= 8) {
        w = hn::Set(du, LoadU32(c + 3 * ((v * kN) / 8)));
      } else {
        w = hn::IfThenElse(hn::FirstN(du, 8), hn::Set(du, LoadU32(c)), hn::Set(du, LoadU32(c + 3)));
      }
      out[v] = hn::Mul(Permute8(levels, w >> shifts[v]), sv);
    }
  }
  HWY_INLINE float Value(const RowRef&, uint32_t) const { return 0.0f; }
};

// turbo2 and turbo2i (the same layout, 4 levels).
struct Pack2Decoder {
  static constexpr bool kTail = false;
  uint32_t scales_offset;
  Table<4> levels;
  hn::Vec<DU> shifts[kVecs];
  Pack2Decoder(uint32_t d, const float* lv) : scales_offset(d / 4), levels(lv) {
    for (size_t v = 0; v < kVecs; ++v) shifts[v] = LaneShifts<2, 16>(v);
  }
  HWY_INLINE RowRef Prepare(const uint8_t* p, uint32_t) const { return {p, 1.0f}; }
  HWY_INLINE void Block(const RowRef& r, uint32_t b, VF* out) const {
    const DU du;
    const auto w = hn::Set(du, LoadU32(r.p + 4 * b));
    const VF sv = hn::Set(DF(), E4M3ToFloat(r.p[scales_offset + b]));
    for (size_t v = 0; v < kVecs; ++v) {
      out[v] = hn::Mul(Permute8(levels, w >> shifts[v]), sv);
    }
  }
  HWY_INLINE float Value(const RowRef&, uint32_t) const { return 0.0f; }
};
template <>
struct Decoder<Format::kTurbo2> : Pack2Decoder {
  explicit Decoder(uint32_t d) : Pack2Decoder(d, kTurbo2Levels.data()) {}
};
// turbo2i: levels that are int8 / 128 (as turbo4i).
template <>
struct Decoder<Format::kTurbo2I> : Pack2Decoder {
  explicit Decoder(uint32_t d) : Pack2Decoder(d, kTurbo2ILevels.data()) {}
};

// turbo3i: the low 2 bits of code i at bit 2i of the group's 32-bit word
// (turbo2's), bit 2 at bit i of its 16-bit word; per lane, the low bits
// shifted down and the high word shifted so that bit i lands on bit 2.
// AVX2 and AVX-512: the negative and the positive levels as two 4-entry
// tables (period 4, so vpermps ignores bit 2 of the shifted low-bit word)
// and bit 2 picking between them, moved to the sign bit (AVX2: vblendvps)
// or as the blend mask itself (AVX-512: the 16-bit word in a mask
// register): no masking of the index.
template <>
struct Decoder<Format::kTurbo3I> {
  static constexpr bool kTail = false;
  uint32_t high_offset, scales_offset;
  Table<8> levels;
  Table<4> neg, pos;  // levels 0..3 and 4..7 (AVX2, AVX-512)
  hn::Vec<DU> shifts[kVecs], high_shifts[kVecs];
  explicit Decoder(uint32_t d)
      : high_offset(d / 4),
        scales_offset(6 * (d / 16)),
        levels(kTurbo3ILevels.data()),
        neg(kTurbo3ILevels.data()),
        pos(kTurbo3ILevels.data() + 4) {
    for (size_t v = 0; v < kVecs; ++v) {
      shifts[v] = LaneShifts<2, 16>(v);
      high_shifts[v] = LaneShifts<1, 16>(v);
#if HWY_TARGET == HWY_AVX2
      // Left shifts taking bit i (value i) of the high word to bit 31.
      high_shifts[v] = hn::Sub(hn::Set(DU(), 31u), high_shifts[v]);
#endif
    }
  }
  HWY_INLINE RowRef Prepare(const uint8_t* p, uint32_t) const { return {p, 1.0f}; }
  HWY_INLINE void Block(const RowRef& r, uint32_t b, VF* out) const {
    const DU du;
    const auto w = hn::Set(du, LoadU32(r.p + 4 * b));
    const VF sv = hn::Set(DF(), E4M3ToFloat(r.p[scales_offset + b]));
#if HWY_TARGET == HWY_AVX2
    const auto h = hn::Set(du, static_cast<uint32_t>(LoadU16(r.p + high_offset + 2 * b)));
    for (size_t v = 0; v < kVecs; ++v) {
      const auto lo = w >> shifts[v];
      const VF sign = hn::BitCast(DF(), h << high_shifts[v]);
      out[v] = hn::Mul(hn::IfNegativeThenElse(sign, Permute8(pos, lo), Permute8(neg, lo)), sv);
    }
#elif HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86
    // 16 lanes, value i in lane i: the high word is the blend mask itself.
    static_assert(kN == 16, "AVX-512 targets have 16 f32 lanes");
    const __mmask16 m = static_cast<__mmask16>(LoadU16(r.p + high_offset + 2 * b));
    const auto lo = w >> shifts[0];
    out[0] = hn::Mul(VF{_mm512_mask_blend_ps(m, Permute8(neg, lo).raw, Permute8(pos, lo).raw)}, sv);
#else
    const auto h = hn::Set(du, static_cast<uint32_t>(LoadU16(r.p + high_offset + 2 * b)) << 2);
    const auto three = hn::Set(du, 3u);
    const auto four = hn::Set(du, 4u);
    for (size_t v = 0; v < kVecs; ++v) {
      const auto idx = hn::Or(hn::And(w >> shifts[v], three), hn::And(h >> high_shifts[v], four));
      out[v] = hn::Mul(Permute8(levels, idx), sv);
    }
#endif
  }
  HWY_INLINE float Value(const RowRef&, uint32_t) const { return 0.0f; }
};
