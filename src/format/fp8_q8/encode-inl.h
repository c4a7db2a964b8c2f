// SIMD encoder of fp8_e4m3 and q8 (see fp8_q8.h): the conversions of
// codec_simd.cc, one vector at a time, the scalar reference for the tail.
//
// A fragment of codec_simd.cc, which includes it inside namespace
// kvcache::format_internal::HWY_NAMESPACE once per target, after the shared
// conversions; no other file includes it.

// One q8 row: scale amax / 127, codes nearest(x / scale) clamped to +-127.
HWY_INLINE void EncodeQ8Row(uint32_t d, const float* HWY_RESTRICT xr, uint8_t* HWY_RESTRICT o) {
  const DF df;
  const DI di;
  const float s = MaxAbs(xr, d) / 127.0f;
  if (s == 0.0f) {
    std::memset(o, 0, d);
  } else {
    const VF vs = hn::Set(df, s);
    size_t i = 0;
    for (; i + kN <= d; i += kN) {
      VI q = hn::NearestInt(hn::Div(hn::LoadU(df, xr + i), vs));
      q = hn::Min(hn::Max(q, hn::Set(di, -127)), hn::Set(di, 127));
      StoreI32AsI8(q, o + i);
    }
    for (; i < d; ++i) {
      const float q = std::clamp(std::nearbyint(xr[i] / s), -127.0f, 127.0f);
      o[i] = static_cast<uint8_t>(static_cast<int8_t>(q));
    }
  }
  std::memcpy(o + d, &s, 4);
}

// The rows of fp8_e4m3 or q8.
void EncodeFp8Q8RowsOf(Format f, uint32_t d, size_t n, const float* HWY_RESTRICT x,
                       uint8_t* HWY_RESTRICT out) {
  if (f == Format::kQ8) {
    const size_t rb = RowBytes(f, d);
    for (size_t r = 0; r < n; ++r) EncodeQ8Row(d, x + r * d, out + r * rb);
    return;
  }
  const DF df;
  const size_t total = n * d;
  size_t i = 0;
  for (; i + kN <= total; i += kN) StoreI32AsU8(EncodeE4M3(hn::LoadU(df, x + i)), out + i);
  for (; i < total; ++i) out[i] = FloatToE4M3(x[i]);
}
