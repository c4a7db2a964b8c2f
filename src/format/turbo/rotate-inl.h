// The SIMD rotation of turbo rows (see turbo.h); its scalar reference and
// the signs are in rotation.cc.
//
// Operation order (identical in the scalar reference and every SIMD target, so
// rotated rows are bit-identical everywhere): multiply by the signs; in each
// power-of-two block the butterfly stages h = 1, 2, 4, ... (x[k], x[k+h]) ->
// (x[k] + x[k+h], x[k] - x[k+h]); finally scale the block by 1/sqrt(block).
// SIMD stages with h below the vector width permute lanes (lane i ^ h) and
// flip the sign bit of the lanes that take the difference: -b + a == a - b
// exactly, so the results match the scalar butterflies bit for bit. Blocks of
// up to 16 vectors (d <= 128 on AVX2, 256 on AVX3) stay in registers through
// all the stages; larger ones make one pass through memory per stage.
//
// A fragment of codec_simd.cc, which includes it inside namespace
// kvcache::format_internal::HWY_NAMESPACE once per target and exports
// RotateRowsT / InverseRotateRowsT; no other file includes it.

// Hadamard-transforms x[0, block) in place (unnormalized), block a power of two >= 16.
void WhtBlock(float* HWY_RESTRICT x, uint32_t block) {
  const hn::CappedTag<float, 16> d;
  const hn::RebindToSigned<decltype(d)> di;
  const size_t N = hn::Lanes(d);
  for (uint32_t half = 1; half < N && half < block; half *= 2) {
    const auto idx = hn::IndicesFromVec(d, hn::Xor(hn::Iota(di, 0), hn::Set(di, static_cast<int32_t>(half))));
    // Sign bit set in the lanes that receive a - b.
    const auto lane_has_h = hn::And(hn::Iota(di, 0), hn::Set(di, static_cast<int32_t>(half)));
    const auto flip = hn::BitCast(
        d, hn::IfThenElseZero(lane_has_h == hn::Set(di, static_cast<int32_t>(half)),
                              hn::Set(di, static_cast<int32_t>(0x80000000u))));
    for (uint32_t k = 0; k < block; k += static_cast<uint32_t>(N)) {
      const auto v = hn::LoadU(d, x + k);
      hn::StoreU(hn::Add(hn::Xor(v, flip), hn::TableLookupLanes(v, idx)), d, x + k);
    }
  }
  for (uint32_t half = static_cast<uint32_t>(N); half < block; half *= 2) {
    for (uint32_t base = 0; base < block; base += 2 * half) {
      for (uint32_t k = 0; k < half; k += static_cast<uint32_t>(N)) {
        const auto a = hn::LoadU(d, x + base + k);
        const auto b = hn::LoadU(d, x + base + half + k);
        hn::StoreU(hn::Add(a, b), d, x + base + k);
        hn::StoreU(hn::Sub(a, b), d, x + base + half + k);
      }
    }
  }
}

void ScaleBy(float* HWY_RESTRICT x, uint32_t n, float s) {
  const hn::CappedTag<float, 16> d;
  const size_t N = hn::Lanes(d);
  const auto vs = hn::Set(d, s);
  for (uint32_t i = 0; i < n; i += static_cast<uint32_t>(N)) {
    hn::StoreU(hn::Mul(hn::LoadU(d, x + i), vs), d, x + i);
  }
}

void MulSigns(const float* HWY_RESTRICT signs, uint32_t n, float* HWY_RESTRICT x) {
  const hn::CappedTag<float, 16> d;
  const size_t N = hn::Lanes(d);
  for (uint32_t i = 0; i < n; i += static_cast<uint32_t>(N)) {
    hn::StoreU(hn::Mul(hn::LoadU(d, x + i), hn::LoadU(d, signs + i)), d, x + i);
  }
}

// One block of kNV vectors held in registers: the same operations in the same
// order as MulSigns + WhtBlock + ScaleBy (kInverse: WhtBlock + ScaleBy +
// MulSigns) on that block, without a pass through memory per stage.
template <size_t kNV, bool kInverse>
HWY_INLINE void RotateBlockInRegs(const float* HWY_RESTRICT signs, float* HWY_RESTRICT x,
                                  float scale) {
  const hn::CappedTag<float, 16> d;
  const hn::RebindToSigned<decltype(d)> di;
  constexpr size_t N = hn::MaxLanes(d);
  hn::Vec<decltype(d)> r[kNV];
  for (size_t i = 0; i < kNV; ++i) {
    r[i] = hn::LoadU(d, x + i * N);
    if constexpr (!kInverse) r[i] = hn::Mul(r[i], hn::LoadU(d, signs + i * N));
  }
  for (uint32_t half = 1; half < N; half *= 2) {
    const auto idx = hn::IndicesFromVec(d, hn::Xor(hn::Iota(di, 0), hn::Set(di, static_cast<int32_t>(half))));
    const auto lane_has_h = hn::And(hn::Iota(di, 0), hn::Set(di, static_cast<int32_t>(half)));
    const auto flip = hn::BitCast(
        d, hn::IfThenElseZero(lane_has_h == hn::Set(di, static_cast<int32_t>(half)),
                              hn::Set(di, static_cast<int32_t>(0x80000000u))));
    for (size_t i = 0; i < kNV; ++i) r[i] = hn::Add(hn::Xor(r[i], flip), hn::TableLookupLanes(r[i], idx));
  }
  for (size_t hv = 1; hv < kNV; hv *= 2) {
    for (size_t base = 0; base < kNV; base += 2 * hv) {
      for (size_t k = 0; k < hv; ++k) {
        const auto a = r[base + k], b = r[base + hv + k];
        r[base + k] = hn::Add(a, b);
        r[base + hv + k] = hn::Sub(a, b);
      }
    }
  }
  const auto vs = hn::Set(d, scale);
  for (size_t i = 0; i < kNV; ++i) {
    r[i] = hn::Mul(r[i], vs);
    if constexpr (kInverse) r[i] = hn::Mul(r[i], hn::LoadU(d, signs + i * N));
    hn::StoreU(r[i], d, x + i * N);
  }
}

// Rotates (or un-rotates) one row: register blocks where the block is 1 to 16
// vectors, the memory passes otherwise; bit-identical either way.
template <bool kInverse>
void RotateRow(const float* HWY_RESTRICT signs, uint32_t head_dim, float* HWY_RESTRICT row) {
  const hn::CappedTag<float, 16> d;
  constexpr size_t N = hn::MaxLanes(d);
  for (uint32_t off = 0; off < head_dim;) {
    const uint32_t b = RotationBlockAt(head_dim - off);
    const float scale = 1.0f / std::sqrt(static_cast<float>(b));
    float* x = row + off;
    const float* sg = signs + off;
    if (b % N != 0 || b / N > 16 || b < N) {
      if (!kInverse) MulSigns(sg, b, x);
      WhtBlock(x, b);
      ScaleBy(x, b, scale);
      if (kInverse) MulSigns(sg, b, x);
    } else {
      switch (b / N) {
        case 1: RotateBlockInRegs<1, kInverse>(sg, x, scale); break;
        case 2: RotateBlockInRegs<2, kInverse>(sg, x, scale); break;
        case 4: RotateBlockInRegs<4, kInverse>(sg, x, scale); break;
        case 8: RotateBlockInRegs<8, kInverse>(sg, x, scale); break;
        default: RotateBlockInRegs<16, kInverse>(sg, x, scale); break;
      }
    }
    off += b;
  }
}

void RotateRowsT(const float* signs, uint32_t head_dim, size_t n, float* x) {
  for (size_t r = 0; r < n; ++r) RotateRow<false>(signs, head_dim, x + r * head_dim);
}

void InverseRotateRowsT(const float* signs, uint32_t head_dim, size_t n, float* x) {
  for (size_t r = 0; r < n; ++r) RotateRow<true>(signs, head_dim, x + r * head_dim);
}
