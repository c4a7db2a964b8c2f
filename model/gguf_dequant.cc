// Dequantization of GGUF tensor rows: the scalar reference and the Highway
// kernels (runtime dispatch once per DequantizeRow call).
//
// Every kernel reproduces the scalar reference bit for bit: values are
// integer codes converted exactly to float, then one multiply and (Q4_1)
// one add, with contraction into FMA disabled so both round identically.
// Thread safety: pure functions.
#pragma GCC optimize("fp-contract=off")

#include <cstring>
#include <string>

#include "model/gguf.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "model/gguf_dequant.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#ifndef KVCACHE_MODEL_GGUF_DEQUANT_ONCE
#define KVCACHE_MODEL_GGUF_DEQUANT_ONCE
namespace kvcache::model {
namespace dequant_internal {

inline uint16_t LoadU16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}

// Checks shared by both paths: a known decodable type and whole blocks.
inline Status CheckRow(GgmlType type, size_t n) {
  if (!CanDequantize(type)) {
    return Status::Unimplemented("dequantizing " + GgmlTypeName(type) +
                                 " is not supported (F32, F16, Q4_1, Q8_0)");
  }
  const uint32_t bv = GgmlTypeSizeOf(type).block_values;
  if (n % bv != 0) {
    return Status::InvalidArgument("dequantizing " + std::to_string(n) + " values of " +
                                   GgmlTypeName(type) + ": not a multiple of its block size " +
                                   std::to_string(bv));
  }
  return Status::Ok();
}

}  // namespace dequant_internal

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalize
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400) == 0);
    bits = sign | ((112 - e) << 23) | ((mant & 0x3FF) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

Status DequantizeRowScalar(GgmlType type, const uint8_t* src, size_t n, float* dst) {
  KV_RETURN_IF_ERROR(dequant_internal::CheckRow(type, n));
  using dequant_internal::LoadU16;
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, src, n * 4);
      break;
    case GgmlType::kF16:
      for (size_t i = 0; i < n; ++i) dst[i] = HalfToFloat(LoadU16(src + 2 * i));
      break;
    case GgmlType::kQ4_1:
      for (size_t b = 0; b < n / 32; ++b, src += 20, dst += 32) {
        const float d = HalfToFloat(LoadU16(src)), m = HalfToFloat(LoadU16(src + 2));
        for (int j = 0; j < 16; ++j) {
          dst[j] = static_cast<float>(src[4 + j] & 0xF) * d + m;
          dst[j + 16] = static_cast<float>(src[4 + j] >> 4) * d + m;
        }
      }
      break;
    case GgmlType::kQ8_0:
      for (size_t b = 0; b < n / 32; ++b, src += 34, dst += 32) {
        const float d = HalfToFloat(LoadU16(src));
        for (int j = 0; j < 32; ++j) dst[j] = static_cast<float>(static_cast<int8_t>(src[2 + j])) * d;
      }
      break;
    default:
      break;
  }
  return Status::Ok();
}

}  // namespace kvcache::model
#endif  // KVCACHE_MODEL_GGUF_DEQUANT_ONCE

HWY_BEFORE_NAMESPACE();
namespace kvcache::model {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// At most 16 float lanes so a vector never spans past one 16-byte nibble run.
using DF = hn::CappedTag<float, 16>;

void DecodeF16(const uint8_t* src, size_t n, float* dst) {
  const DF df;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const size_t N = hn::Lanes(df);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto h = hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(src + 2 * i));
    hn::StoreU(hn::PromoteTo(df, h), df, dst + i);
  }
  for (; i < n; ++i) dst[i] = HalfToFloat(dequant_internal::LoadU16(src + 2 * i));
}

void DecodeQ41(const uint8_t* src, size_t n, float* dst) {
  const DF df;
  const hn::Rebind<int32_t, DF> di;
  const hn::Rebind<uint8_t, DF> du8;
  const size_t N = hn::Lanes(df);
  const auto mask = hn::Set(du8, 0xF);
  for (size_t b = 0; b < n / 32; ++b, src += 20, dst += 32) {
    const auto d = hn::Set(df, HalfToFloat(dequant_internal::LoadU16(src)));
    const auto m = hn::Set(df, HalfToFloat(dequant_internal::LoadU16(src + 2)));
    for (size_t j = 0; j < 16; j += N) {
      const auto q = hn::LoadU(du8, src + 4 + j);
      const auto lo = hn::ConvertTo(df, hn::PromoteTo(di, hn::And(q, mask)));
      const auto hi = hn::ConvertTo(df, hn::PromoteTo(di, hn::ShiftRight<4>(q)));
      hn::StoreU(hn::Add(hn::Mul(lo, d), m), df, dst + j);
      hn::StoreU(hn::Add(hn::Mul(hi, d), m), df, dst + 16 + j);
    }
  }
}

void DecodeQ80(const uint8_t* src, size_t n, float* dst) {
  const DF df;
  const hn::Rebind<int32_t, DF> di;
  const hn::Rebind<int8_t, DF> di8;
  const size_t N = hn::Lanes(df);
  for (size_t b = 0; b < n / 32; ++b, src += 34, dst += 32) {
    const auto d = hn::Set(df, HalfToFloat(dequant_internal::LoadU16(src)));
    const int8_t* q = reinterpret_cast<const int8_t*>(src + 2);
    for (size_t j = 0; j < 32; j += N) {
      const auto v = hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(di8, q + j)));
      hn::StoreU(hn::Mul(v, d), df, dst + j);
    }
  }
}

void DequantizeRowT(GgmlType type, const uint8_t* src, size_t n, float* dst) {
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, src, n * 4);
      break;
    case GgmlType::kF16:
      DecodeF16(src, n, dst);
      break;
    case GgmlType::kQ4_1:
      DecodeQ41(src, n, dst);
      break;
    case GgmlType::kQ8_0:
      DecodeQ80(src, n, dst);
      break;
    default:
      break;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace kvcache::model
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvcache::model {

HWY_EXPORT(DequantizeRowT);

Status DequantizeRow(GgmlType type, const uint8_t* src, size_t n, float* dst) {
  KV_RETURN_IF_ERROR(dequant_internal::CheckRow(type, n));
  HWY_DYNAMIC_DISPATCH(DequantizeRowT)(type, src, n, dst);
  return Status::Ok();
}

}  // namespace kvcache::model
#endif  // HWY_ONCE
