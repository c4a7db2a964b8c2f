// SIMD encoder of the plain float formats (see plain.h): the conversions of
// codec_simd.cc, one vector at a time, the scalar reference for the tail.
//
// A fragment of codec_simd.cc, which includes it inside namespace
// kvcache::format_internal::HWY_NAMESPACE once per target, after the shared
// conversions; no other file includes it.

// The rows of f32, f16 or bf16 (total = n * d values).
void EncodePlainRowsOf(Format f, size_t total, const float* HWY_RESTRICT x, uint8_t* HWY_RESTRICT out) {
  const DF df;
  size_t i = 0;
  switch (f) {
    case Format::kF16:
      for (; i + kN <= total; i += kN) StoreI32AsU16(EncodeF16(hn::LoadU(df, x + i)), out + 2 * i);
      for (; i < total; ++i) StoreU16(FloatToF16(x[i]), out + 2 * i);
      return;
    case Format::kBF16:
      for (; i + kN <= total; i += kN) StoreI32AsU16(EncodeBF16T(df, hn::LoadU(df, x + i)), out + 2 * i);
      for (; i < total; ++i) StoreU16(FloatToBF16(x[i]), out + 2 * i);
      return;
    default: CopyFloats(x, total, reinterpret_cast<float*>(out)); return;
  }
}
