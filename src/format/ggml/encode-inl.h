// SIMD encoder of q8_0 and q4_0 (see ggml.h): llama.cpp's reference
// arithmetic per lane, a batch of blocks at a time (one block's scale per
// lane; round-half-away-from-zero done exactly with a truncating convert,
// see RoundHalfAway).
//
// A fragment of codec_simd.cc, which includes it inside namespace
// kvcache::format_internal::HWY_NAMESPACE once per target, after the shared
// conversions; no other file includes it.

// std::round (half away from zero), exactly: Trunc(v + copysign(h, v)) with
// h = 0.5 - 2^-25, the float below 0.5. For v >= 0 with fraction f: f >= 0.5
// puts v + h within half a spacing of (or above) floor(v) + 1, which it then
// rounds to (1 - 2^-25 is the tie between 1 - 2^-24 and 1, and goes to 1);
// f < 0.5 means f <= 0.5 - ulp(v), so v + h <= floor(v) + 1 - ulp(v) - 2^-25,
// at or below the float under floor(v) + 1. v >= 2^23 is an integer and
// v + h rounds back to it. Negative v mirror this; NaN stays NaN.
HWY_INLINE VF RoundHalfAway(VF v) {
  const DF df;
  return hn::Trunc(hn::Add(v, hn::CopySign(hn::Set(df, 0.49999997f), v)));
}

HWY_INLINE float BlockMaxAbs(const float* xb) {
  const DF df;
  const size_t N = hn::Lanes(df);
  VF m = hn::Abs(hn::LoadU(df, xb));
  for (size_t i = N; i < 32; i += N) m = hn::Max(m, hn::Abs(hn::LoadU(df, xb + i)));
  return hn::GetLane(hn::MaxOfLanes(df, m));
}

// q4_0's scale source: the signed value of the block's first element of
// largest magnitude (0 if every element is 0).
HWY_INLINE float BlockSignedMax(const float* xb) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const float amax = BlockMaxAbs(xb);
  if (amax == 0.0f) return 0.0f;
  const VF va = hn::Set(df, amax);
  for (size_t i = 0; i < 32; i += N) {
    const intptr_t p = hn::FindFirstTrue(df, hn::Abs(hn::LoadU(df, xb + i)) == va);
    if (p >= 0) return xb[i + static_cast<size_t>(p)];
  }
  return 0.0f;
}

void EncodeQ8_0BlocksEach(size_t blocks, const float* HWY_RESTRICT x, uint8_t* HWY_RESTRICT out) {
  const DF df;
  const DI di;
  const size_t N = hn::Lanes(df);
  for (size_t b = 0; b < blocks; ++b) {
    const float* xb = x + 32 * b;
    uint8_t* ob = out + 34 * b;
    const float dd = BlockMaxAbs(xb) / 127.0f;
    const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
    StoreU16(FloatToF16(dd), ob);
    const VF vid = hn::Set(df, id);
    for (size_t i = 0; i < 32; i += N) {
      VF q = RoundHalfAway(hn::Mul(hn::LoadU(df, xb + i), vid));
      q = hn::IfThenZeroElse(hn::IsNaN(q), q);  // 0 * inf (a subnormal d): ClampToInt's 0
      q = hn::Min(hn::Max(q, hn::Set(df, -127.0f)), hn::Set(df, 127.0f));
      StoreI32AsI8(hn::ConvertTo(di, q), ob + 2 + i);
    }
  }
}

// min(15, ClampToInt(v, 0, 255)): NaN and negatives -> 0, then truncate.
HWY_INLINE VI Q4Code(VF v) {
  const DF df;
  const DI di;
  v = hn::IfThenElseZero(v >= hn::Zero(df), v);
  return hn::ConvertTo(di, hn::Min(v, hn::Set(df, 15.0f)));
}

void EncodeQ4_0BlocksEach(size_t blocks, const float* HWY_RESTRICT x, uint8_t* HWY_RESTRICT out) {
  const DF df;
  const size_t N = hn::Lanes(df);
  for (size_t b = 0; b < blocks; ++b) {
    const float* xb = x + 32 * b;
    uint8_t* ob = out + 18 * b;
    const float mx = BlockSignedMax(xb);
    const float dd = mx / -8.0f;
    const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
    StoreU16(FloatToF16(dd), ob);
    const VF vid = hn::Set(df, id);
    const VF half = hn::Set(df, 8.5f);
    for (size_t j = 0; j < 16; j += N) {
      const VI lo = Q4Code(hn::Add(hn::Mul(hn::LoadU(df, xb + j), vid), half));
      const VI hi = Q4Code(hn::Add(hn::Mul(hn::LoadU(df, xb + 16 + j), vid), half));
      StoreI32AsU8(hn::Or(lo, hn::ShiftLeft<4>(hi)), ob + 2 + j);
    }
  }
}

// The batched encoders: kQB blocks at a time, their scales made in one
// vector (d = amax / 127 or max / -8, id = 1 / d, the f16 of d: the scalar
// expressions lane by lane), then each value's code. With id finite, |x * id|
// <= 127 * (1 + 2^-22) (q8_0) or 8 * (1 + 2^-22) (q4_0) (x is at most the
// block's amax, and id is 1 / d within two roundings), so the clamps cannot
// bind and a truncating convert of x * id + copysign(0.49999997, x * id)
// (q8_0, see RoundHalfAway) or of x * id + 8.5 (q4_0, >= 0.4999) is the
// scalar code. A batch with an infinite id (d so small that 1 / d overflows;
// d = 0 gives id 0, which is fine) takes the per-block code. The last batch
// may be partial (a single row of head_dim 128 is 4 blocks).
constexpr size_t kQB = hn::MaxLanes(DF());

// amax[kQB] (q8_0) or the signed first-largest value mx[kQB] (q4_0) -> the
// f16 codes of d and the lanes of id; false if some id is not finite.
HWY_INLINE bool BatchScales(const float* m, float divisor, uint16_t* f16, float* id) {
  const DF df;
  const VF dd = hn::Div(hn::Load(df, m), hn::Set(df, divisor));
  const VF inv = hn::IfThenZeroElse(dd == hn::Zero(df), hn::Div(hn::Set(df, 1.0f), dd));
  hn::Store(inv, df, id);
  alignas(64) int32_t h[kQB];
  hn::Store(EncodeF16(dd), DI(), h);
  for (size_t b = 0; b < kQB; ++b) f16[b] = static_cast<uint16_t>(h[b]);
  const DI di;
  const VI e = hn::And(hn::BitCast(di, inv), hn::Set(di, 0x7F800000));
  return hn::AllFalse(di, e == hn::Set(di, 0x7F800000));
}

// 32 int32 codes q[32 / N] -> 32 int8 bytes at o.
HWY_INLINE void StoreCodes32(const VI* q, uint8_t* o) {
  const DI di;
  const size_t N = hn::Lanes(di);
#if HWY_TARGET == HWY_SSE4
  {
    // packssdw of two vectors, then packsswb: 8 codes per pair.
    const hn::Repartition<int16_t, DI> d16;
    const hn::Rebind<int8_t, decltype(d16)> d8;
    for (size_t i = 0; i < 32 / N; i += 2) {
      hn::StoreU(hn::DemoteTo(d8, hn::ReorderDemote2To(d16, q[i], q[i + 1])), d8,
                 reinterpret_cast<int8_t*>(o + i * N));
    }
  }
#else
  for (size_t i = 0; i < 32 / N; ++i) StoreI32AsI8(q[i], o + i * N);
#endif
}

// The batch loop of both formats: kQB blocks of kBytes bytes at a time, each
// block's scale source (Source: the amax, or q4_0's signed max) divided by
// `divisor`; Codes(xb, vid, ob) writes one block's codes after its f16 d;
// Each(cnt, x, out) is the per-block encoder for a batch with an infinite id.
template <size_t kBytes, class Source, class Codes, class Each>
HWY_INLINE void EncodeBlockBatches(size_t blocks, const float* HWY_RESTRICT x,
                                   uint8_t* HWY_RESTRICT out, float divisor, const Source& source,
                                   const Codes& codes, const Each& each) {
  for (size_t b0 = 0; b0 < blocks; b0 += kQB) {
    const size_t cnt = std::min(kQB, blocks - b0);  // lanes past cnt: source 0, unused
    alignas(64) float m[kQB] = {}, id[kQB];
    uint16_t f16[kQB];
    for (size_t b = 0; b < cnt; ++b) m[b] = source(x + 32 * (b0 + b));
    if (!BatchScales(m, divisor, f16, id)) {
      each(cnt, x + 32 * b0, out + kBytes * b0);
      continue;
    }
    for (size_t b = 0; b < cnt; ++b) {
      uint8_t* ob = out + kBytes * (b0 + b);
      StoreU16(f16[b], ob);
      codes(x + 32 * (b0 + b), hn::Set(DF(), id[b]), ob + 2);
    }
  }
}

void EncodeQ8_0Blocks(size_t blocks, const float* HWY_RESTRICT x, uint8_t* HWY_RESTRICT out) {
  const DF df;
  const DI di;
  const VF half = hn::Set(df, 0.49999997f);
  auto codes = [&](const float* HWY_RESTRICT xb, VF vid, uint8_t* HWY_RESTRICT o) HWY_ATTR {
    VI q[32 / kQB];
    for (size_t i = 0; i < 32 / kN; ++i) {
      const VF v = hn::Mul(hn::LoadU(df, xb + i * kN), vid);
      q[i] = hn::ConvertTo(di, hn::Add(v, hn::CopySign(half, v)));
    }
    StoreCodes32(q, o);
  };
  auto source = [](const float* xb) HWY_ATTR { return BlockMaxAbs(xb); };
  EncodeBlockBatches<34>(blocks, x, out, 127.0f, source, codes, EncodeQ8_0BlocksEach);
}

void EncodeQ4_0Blocks(size_t blocks, const float* HWY_RESTRICT x, uint8_t* HWY_RESTRICT out) {
  const DF df;
  const DI di;
  const VF half = hn::Set(df, 8.5f);
  const VI fifteen = hn::Set(di, 15);
  auto codes = [&](const float* HWY_RESTRICT xb, VF vid, uint8_t* HWY_RESTRICT o) HWY_ATTR {
    for (size_t j = 0; j < 16; j += kN) {
      const VI lo = hn::Min(hn::ConvertTo(di, hn::Add(hn::Mul(hn::LoadU(df, xb + j), vid), half)), fifteen);
      const VI hi = hn::Min(hn::ConvertTo(di, hn::Add(hn::Mul(hn::LoadU(df, xb + 16 + j), vid), half)), fifteen);
      StoreI32AsU8(hn::Or(lo, hn::ShiftLeft<4>(hi)), o + j);
    }
  };
  auto source = [](const float* xb) HWY_ATTR { return BlockSignedMax(xb); };
  EncodeBlockBatches<18>(blocks, x, out, -8.0f, source, codes, EncodeQ4_0BlocksEach);
}

// The rows of q8_0 or q4_0 (total = n * d values).
void EncodeGgmlRowsOf(Format f, size_t total, const float* HWY_RESTRICT x, uint8_t* HWY_RESTRICT out) {
  if (f == Format::kQ8_0) return EncodeQ8_0Blocks(total / 32, x, out);
  EncodeQ4_0Blocks(total / 32, x, out);
}
