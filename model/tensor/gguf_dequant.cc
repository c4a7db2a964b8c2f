// Dequantization of GGUF tensor rows and the weight products built on it
// (model/tensor/matmul.h): the scalar references and the Highway kernels (runtime
// dispatch once per DequantizeRow / MatMul part / DotF32 call).
//
// Every kernel reproduces the scalar reference bit for bit: values are
// integer codes converted exactly to float, then one multiply by the
// block's (exact) scale and (Q4_1, Q4_K) one add or subtract of its
// minimum, with contraction into FMA disabled so both round identically.
// The K types' scales d * sc are products of an f16 and a 6- or 8-bit
// integer, exact in f32, and so are their products with the codes.
// Thread safety: pure functions.
#pragma GCC optimize("fp-contract=off")

#include <algorithm>
#include <cstring>
#include <string>

#include "kvcache/float16.h"
#include "model/tensor/ggml_blocks.h"
#include "model/tensor/gguf_dequant.h"
#include "model/tensor/matmul.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "model/tensor/gguf_dequant.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/cache_control.h>
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
    return Status::Unimplemented("dequantizing " + GgmlTypeName(type) + " is not supported (" +
                                 DequantizableTypeNames() + ")");
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

Status DequantizeRowScalar(GgmlType type, const uint8_t* src, size_t n, float* dst) {
  KV_RETURN_IF_ERROR(dequant_internal::CheckRow(type, n));
  using dequant_internal::LoadU16;
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, src, n * 4);
      break;
    case GgmlType::kF16:
      for (size_t i = 0; i < n; ++i) dst[i] = F16ToFloat(LoadU16(src + 2 * i));
      break;
    case GgmlType::kQ4_1:
      for (size_t b = 0; b < n / 32; ++b, src += 20, dst += 32) {
        const float d = F16ToFloat(LoadU16(src)), m = F16ToFloat(LoadU16(src + 2));
        for (int j = 0; j < 16; ++j) {
          dst[j] = static_cast<float>(src[4 + j] & 0xF) * d + m;
          dst[j + 16] = static_cast<float>(src[4 + j] >> 4) * d + m;
        }
      }
      break;
    case GgmlType::kQ8_0:
      for (size_t b = 0; b < n / 32; ++b, src += 34, dst += 32) {
        const float d = F16ToFloat(LoadU16(src));
        for (int j = 0; j < 32; ++j) dst[j] = static_cast<float>(static_cast<int8_t>(src[2 + j])) * d;
      }
      break;
    case GgmlType::kQ5_0:
      for (size_t b = 0; b < n / 32; ++b, src += ggml_blocks::kQ50Bytes, dst += 32) {
        const float d = F16ToFloat(LoadU16(src));
        const uint32_t qh = ggml_blocks::LoadU32Le(src + 2);
        for (int j = 0; j < 16; ++j) {
          const int lo = (src[6 + j] & 0xF) | static_cast<int>(((qh >> j) & 1) << 4);
          const int hi = (src[6 + j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
          dst[j] = static_cast<float>(lo - 16) * d;
          dst[j + 16] = static_cast<float>(hi - 16) * d;
        }
      }
      break;
    case GgmlType::kQ4_K:
      for (size_t b = 0; b < n / 256; ++b, src += ggml_blocks::kQ4KBytes, dst += 256) {
        const float d = F16ToFloat(LoadU16(src)), dmin = F16ToFloat(LoadU16(src + 2));
        for (uint32_t j = 0; j < 8; ++j) {
          uint8_t sc, m;
          ggml_blocks::Q4KScaleMin(j, src + ggml_blocks::kQ4KScales, &sc, &m);
          const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
          const uint8_t* q = src + ggml_blocks::kQ4KQs + 32 * (j / 2);
          const int shift = (j % 2) * 4;
          for (int l = 0; l < 32; ++l) dst[32 * j + l] = static_cast<float>((q[l] >> shift) & 0xF) * d1 - m1;
        }
      }
      break;
    case GgmlType::kQ6_K:
      for (size_t b = 0; b < n / 256; ++b, src += ggml_blocks::kQ6KBytes, dst += 256) {
        const float d = F16ToFloat(LoadU16(src + ggml_blocks::kQ6KD));
        const int8_t* sc = reinterpret_cast<const int8_t*>(src + ggml_blocks::kQ6KScales);
        for (uint32_t h = 0; h < 2; ++h) {
          for (uint32_t k = 0; k < 4; ++k) {
            for (uint32_t l = 0; l < 32; ++l) {
              const float s = d * static_cast<float>(sc[8 * h + 2 * k + l / 16]);
              dst[128 * h + 32 * k + l] = s * static_cast<float>(ggml_blocks::Q6KCode(src, h, k, l) - 32);
            }
          }
        }
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
  for (; i < n; ++i) dst[i] = F16ToFloat(dequant_internal::LoadU16(src + 2 * i));
}

// The f16 at p as float, through the target's conversion (F16C on x86):
// exact, like F16ToFloat, without its branches.
HWY_INLINE float HalfT(const uint8_t* p) {
  const hn::CappedTag<hwy::float16_t, 1> dh;
  const hn::Rebind<float, decltype(dh)> df1;
  return hn::GetLane(hn::PromoteTo(df1, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p))));
}

void DecodeQ41(const uint8_t* src, size_t n, float* dst) {
  const DF df;
  const hn::Rebind<int32_t, DF> di;
  const hn::Rebind<uint8_t, DF> du8;
  const size_t N = hn::Lanes(df);
  const auto mask = hn::Set(du8, 0xF);
  for (size_t b = 0; b < n / 32; ++b, src += 20, dst += 32) {
    const auto d = hn::Set(df, HalfT(src));
    const auto m = hn::Set(df, HalfT(src + 2));
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
    const auto d = hn::Set(df, HalfT(src));
    const int8_t* q = reinterpret_cast<const int8_t*>(src + 2);
    for (size_t j = 0; j < 32; j += N) {
      const auto v = hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(di8, q + j)));
      hn::StoreU(hn::Mul(v, d), df, dst + j);
    }
  }
}

using DI = hn::Rebind<int32_t, DF>;
using VI = hn::Vec<DI>;

// The bytes p[0, N) as int32 lanes.
HWY_INLINE VI BytesAt(const uint8_t* p) { return hn::PromoteTo(DI(), hn::LoadU(hn::Rebind<uint8_t, DF>(), p)); }

// dst[0, N) = float(codes) * scale.
HWY_INLINE void StoreTimes(VI codes, float scale, float* dst) {
  const DF df;
  hn::StoreU(hn::Mul(hn::ConvertTo(df, codes), hn::Set(df, scale)), df, dst);
}

void DecodeQ50(const uint8_t* src, size_t n, float* dst) {
  const DI di;
  const size_t N = hn::Lanes(di);
  const auto one = hn::Set(di, 1), nib = hn::Set(di, 0xF), bias = hn::Set(di, 16);
  for (size_t b = 0; b < n / 32; ++b, src += ggml_blocks::kQ50Bytes, dst += 32) {
    const float d = HalfT(src);
    // qh as a signed lane: shifted right by at most 31 and masked to its
    // low bit, the sign extension never shows.
    const auto qh = hn::Set(di, static_cast<int32_t>(ggml_blocks::LoadU32Le(src + 2)));
    for (size_t j = 0; j < 16; j += N) {
      const VI q = BytesAt(src + 6 + j);
      const VI idx = hn::Iota(di, static_cast<int32_t>(j));
      const VI hlo = hn::ShiftLeft<4>(hn::And(hn::Shr(qh, idx), one));
      const VI hhi = hn::ShiftLeft<4>(hn::And(hn::Shr(qh, hn::Add(idx, bias)), one));
      StoreTimes(hn::Sub(hn::Or(hn::And(q, nib), hlo), bias), d, dst + j);
      StoreTimes(hn::Sub(hn::Or(hn::ShiftRight<4>(q), hhi), bias), d, dst + 16 + j);
    }
  }
}

void DecodeQ4K(const uint8_t* src, size_t n, float* dst) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const auto nib = hn::Set(DI(), 0xF);
  for (size_t b = 0; b < n / 256; ++b, src += ggml_blocks::kQ4KBytes, dst += 256) {
    const float d = HalfT(src), dmin = HalfT(src + 2);
    for (uint32_t j = 0; j < 8; ++j) {
      uint8_t sc, m;
      ggml_blocks::Q4KScaleMin(j, src + ggml_blocks::kQ4KScales, &sc, &m);
      const auto d1 = hn::Set(df, d * static_cast<float>(sc));
      const auto m1 = hn::Set(df, dmin * static_cast<float>(m));
      const uint8_t* q = src + ggml_blocks::kQ4KQs + 32 * (j / 2);
      for (size_t l = 0; l < 32; l += N) {
        const VI v = BytesAt(q + l);
        const VI code = j % 2 == 0 ? hn::And(v, nib) : hn::ShiftRight<4>(v);
        hn::StoreU(hn::Sub(hn::Mul(hn::ConvertTo(df, code), d1), m1), df, dst + 32 * j + l);
      }
    }
  }
}

void DecodeQ6K(const uint8_t* src, size_t n, float* dst) {
  const DI di;
  const size_t N = hn::Lanes(di);
  const auto nib = hn::Set(di, 0xF), two = hn::Set(di, 3), bias = hn::Set(di, 32);
  for (size_t b = 0; b < n / 256; ++b, src += ggml_blocks::kQ6KBytes, dst += 256) {
    const float d = HalfT(src + ggml_blocks::kQ6KD);
    const int8_t* sc = reinterpret_cast<const int8_t*>(src + ggml_blocks::kQ6KScales);
    for (uint32_t h = 0; h < 2; ++h) {
      const uint8_t* ql = src + 64 * h;
      const uint8_t* qh = src + ggml_blocks::kQ6KQh + 32 * h;
      float* y = dst + 128 * h;
      // N divides 16: a vector's lanes share one scale.
      for (size_t l = 0; l < 32; l += N) {
        const VI a = BytesAt(ql + l), c = BytesAt(ql + l + 32), hb = BytesAt(qh + l);
        const VI q[4] = {hn::Or(hn::And(a, nib), hn::ShiftLeft<4>(hn::And(hb, two))),
                         hn::Or(hn::And(c, nib), hn::ShiftLeft<4>(hn::And(hn::ShiftRight<2>(hb), two))),
                         hn::Or(hn::ShiftRight<4>(a), hn::ShiftLeft<4>(hn::And(hn::ShiftRight<4>(hb), two))),
                         hn::Or(hn::ShiftRight<4>(c), hn::ShiftLeft<4>(hn::ShiftRight<6>(hb)))};
        for (int k = 0; k < 4; ++k) {
          StoreTimes(hn::Sub(q[k], bias), d * static_cast<float>(sc[8 * h + 2 * k + l / 16]), y + 32 * k + l);
        }
      }
    }
  }
}

// One accumulator per (row, input) pair, fed in index order, then a lane
// sum and a scalar tail: a pair's result does not depend on how many pairs
// are computed together, so blocking (R rows x T inputs at once, for
// instruction-level parallelism and fewer loads) changes nothing.
template <int R, int T>
HWY_INLINE void DotBlock(const float* const* rows, const float* const* xs, size_t n, float* out,
                         size_t out_stride) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  using V = hn::Vec<decltype(d)>;
  V acc[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) acc[r][t] = hn::Zero(d);
  }
  size_t i = 0;
  for (; i + N <= n; i += N) {
    V x[T];
    for (int t = 0; t < T; ++t) x[t] = hn::LoadU(d, xs[t] + i);
    for (int r = 0; r < R; ++r) {
      const V w = hn::LoadU(d, rows[r] + i);
      for (int t = 0; t < T; ++t) acc[r][t] = hn::MulAdd(w, x[t], acc[r][t]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      float sum = hn::GetLane(hn::SumOfLanes(d, acc[r][t]));
      for (size_t k = i; k < n; ++k) sum += rows[r][k] * xs[t][k];
      out[t * out_stride + r] = sum;
    }
  }
}

float DotT(const float* a, const float* b, size_t n) {
  float out;
  DotBlock<1, 1>(&a, &b, n, &out, 1);
  return out;
}

void DequantizeRowT(GgmlType type, const uint8_t* src, size_t n, float* dst);

// Inputs per block: 4 where the target has 32 vector registers (R x 4
// accumulators, 4 inputs and a row fit), 2 elsewhere.
#if HWY_TARGET <= HWY_AVX3
constexpr int kInputsPerBlock = 4;
#else
constexpr int kInputsPerBlock = 2;
#endif

template <int R>
void RowsTimesInputs(const float* const* rows, const float* x, uint32_t n, uint32_t cols, float* out,
                     uint32_t out_stride) {
  uint32_t t = 0;
  if constexpr (kInputsPerBlock == 4) {
    for (; t + 4 <= n; t += 4) {
      const float* xs[4] = {x + static_cast<size_t>(t) * cols, x + static_cast<size_t>(t + 1) * cols,
                            x + static_cast<size_t>(t + 2) * cols, x + static_cast<size_t>(t + 3) * cols};
      DotBlock<R, 4>(rows, xs, cols, out + static_cast<size_t>(t) * out_stride, out_stride);
    }
  }
  for (; t + 2 <= n; t += 2) {
    const float* xs[2] = {x + static_cast<size_t>(t) * cols, x + static_cast<size_t>(t + 1) * cols};
    DotBlock<R, 2>(rows, xs, cols, out + static_cast<size_t>(t) * out_stride, out_stride);
  }
  if (t < n) {
    const float* xs[1] = {x + static_cast<size_t>(t) * cols};
    DotBlock<R, 1>(rows, xs, cols, out + static_cast<size_t>(t) * out_stride, out_stride);
  }
}

// Rounds p[0, n) to the nearest bf16 value (ties to even), kept as f32: the
// weights and inputs of the bf16 products (matmul_bf16.h), bit for bit
// FloatToBF16 (NaN and infinity do not arise in a model's rows).
void RoundToBf16T(float* p, size_t n) {
  const hn::ScalableTag<uint32_t> du;
  const hn::Repartition<float, decltype(du)> df;
  const size_t N = hn::Lanes(du);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    auto u = hn::BitCast(du, hn::LoadU(df, p + i));
    const auto odd = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
    u = hn::And(hn::Add(u, hn::Add(hn::Set(du, 0x7fffu), odd)), hn::Set(du, 0xffff0000u));
    hn::StoreU(hn::BitCast(df, u), df, p + i);
  }
  for (; i < n; ++i) p[i] = BF16ToFloat(FloatToBF16(p[i]));
}

// Rows [r0, r1) of w times the n inputs, 4 rows at a time; buf holds 4
// decoded rows ([4][cols]). bf16: the decoded rows are rounded to bf16
// first (the inputs already are).
void MatMulRowsT(const WeightMatrix& w, uint32_t r0, uint32_t r1, const float* x, uint32_t n,
                 float* out, float* buf, bool bf16) {
  for (uint32_t r = r0; r < r1; r += 4) {
    const uint32_t m = std::min<uint32_t>(4, r1 - r);
    // The next four rows, from memory while these four are decoded and
    // multiplied (decode otherwise waits on DRAM for each row).
    if (w.type != GgmlType::kF32 && r + 4 < r1) {
      const uint8_t* next = w.data + static_cast<size_t>(r + 4) * w.row_bytes;
      const size_t bytes = std::min<size_t>(r1 - r - 4, 4) * w.row_bytes;
      for (size_t o = 0; o < bytes; o += 64) hwy::Prefetch(next + o);
    }
    const float* rows[4];
    for (uint32_t k = 0; k < m; ++k) {
      const uint8_t* src = w.data + static_cast<size_t>(r + k) * w.row_bytes;
      if (w.type == GgmlType::kF32 && !bf16) {
        rows[k] = reinterpret_cast<const float*>(src);
      } else {
        float* dst = buf + static_cast<size_t>(k) * w.cols;
        DequantizeRowT(w.type, src, w.cols, dst);
        if (bf16) RoundToBf16T(dst, w.cols);
        rows[k] = dst;
      }
    }
    float* o = out + r;
    switch (m) {
      case 4: RowsTimesInputs<4>(rows, x, n, w.cols, o, w.rows); break;
      case 3: RowsTimesInputs<3>(rows, x, n, w.cols, o, w.rows); break;
      case 2: RowsTimesInputs<2>(rows, x, n, w.cols, o, w.rows); break;
      default: RowsTimesInputs<1>(rows, x, n, w.cols, o, w.rows); break;
    }
  }
}

void DequantizeRowT(GgmlType type, const uint8_t* src, size_t n, float* dst) {
  using Decoder = void (*)(const uint8_t*, size_t, float*);
  Decoder decode = nullptr;
  switch (type) {
    case GgmlType::kF32: std::memcpy(dst, src, n * 4); return;
    case GgmlType::kF16: decode = DecodeF16; break;
    case GgmlType::kQ4_1: decode = DecodeQ41; break;
    case GgmlType::kQ8_0: decode = DecodeQ80; break;
    case GgmlType::kQ5_0: decode = DecodeQ50; break;
    case GgmlType::kQ4_K: decode = DecodeQ4K; break;
    case GgmlType::kQ6_K: decode = DecodeQ6K; break;
    default: return;
  }
  decode(src, n, dst);
}

}  // namespace HWY_NAMESPACE
}  // namespace kvcache::model
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvcache::model {

HWY_EXPORT(DequantizeRowT);
HWY_EXPORT(DotT);
HWY_EXPORT(MatMulRowsT);
HWY_EXPORT(RoundToBf16T);

float DotF32(const float* a, const float* b, size_t n) { return HWY_DYNAMIC_DISPATCH(DotT)(a, b, n); }

namespace dequant_internal {
void MatMulRows(const WeightMatrix& w, uint32_t r0, uint32_t r1, const float* x, uint32_t n,
                float* out, float* buf, bool bf16) {
  HWY_DYNAMIC_DISPATCH(MatMulRowsT)(w, r0, r1, x, n, out, buf, bf16);
}
void RoundToBf16Rows(float* p, size_t n) { HWY_DYNAMIC_DISPATCH(RoundToBf16T)(p, n); }
}  // namespace dequant_internal

Status DequantizeRow(GgmlType type, const uint8_t* src, size_t n, float* dst) {
  KV_RETURN_IF_ERROR(dequant_internal::CheckRow(type, n));
  HWY_DYNAMIC_DISPATCH(DequantizeRowT)(type, src, n, dst);
  return Status::Ok();
}

}  // namespace kvcache::model
#endif  // HWY_ONCE
