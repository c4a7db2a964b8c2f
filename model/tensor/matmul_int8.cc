// The integer-lane weight product (matmul.h, MatMulInputs::kInt8): Q4_1,
// Q5_0, Q8_0, Q4_K and Q6_K matrices times inputs rounded to int8 per 32
// values, summed exactly in 32-bit integer lanes, scaled once per block of
// 32.
//
// Inputs, per token and per block b of 32 values: dx = amax / 127, codes
// q = round-to-nearest-even(x * (127 / amax)) in [-127, 127] (all 0 when
// amax is 0), and c = dx * sum(q). The 32 values of a row that meet block b
// have integer codes w, two integer sub-block scales s0 (values 0..15) and
// s1 (16..31), a float scale d and a float minimum m (the layouts are in
// ggml_blocks.h):
//   Q4_1: w = nibbles 0..15, s0 = s1 = 1, d and m the block's;
//   Q5_0: w = 5-bit codes - 16, s = 1, d the block's, m = 0;
//   Q8_0: w = int8, s = 1, d the block's, m = 0;
//   Q4_K: b is sub-block j of a super-block: w = its nibbles, s0 = s1 = its
//         6-bit scale, d the super-block's, m = -(dmin * its 6-bit min)
//         (exact);
//   Q6_K: w = 6-bit codes - 32, s0 and s1 the int8 scales of its two
//         16-value sub-blocks, d the super-block's, m = 0.
//
// The sum, fixed for every target: eight integer lanes per block, lane i
// (0..7) = s_(i / 4) * (w[4i]q[4i] + ... + w[4i+3]q[4i+3]) (exact in int32);
// eight float accumulators, acc_i = acc_i + float(lane_i) * (d * dx) over
// the blocks in order, each operation rounded on its own (no FMA
// contraction); then ((a0+a1)+(a2+a3))+((a4+a5)+(a6+a7)) plus the minimum
// term, sum_b m * c summed in block order (0 where m is). The x86 kernels
// compute those lanes with byte multiply-adds (pmaddubsw + pmaddwd, whose
// 16-bit multipliers carry the sub-block scales, on SSE4, AVX2 and AVX3;
// vpdpbusd for the unscaled types on AVX3_DL) and the same float steps, so
// every target, thread count, row split and batch size gives the scalar
// reference's bits; other targets run the reference.
//
// Thread safety: pure functions.
#pragma GCC optimize("fp-contract=off")

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "kvcache/float16.h"
#include "model/tensor/ggml_blocks.h"
#include "model/tensor/matmul.h"
#include "model/tensor/matmul_int8.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "model/tensor/matmul_int8.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#ifndef KVCACHE_MODEL_MATMUL_INT8_ONCE
#define KVCACHE_MODEL_MATMUL_INT8_ONCE
namespace kvcache::model::int8_internal {

inline float HalfAt(const uint8_t* p) {
  return F16ToFloat(static_cast<uint16_t>(p[0] | (p[1] << 8)));
}

inline uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

inline float SumLanes(const float* a) {
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

// What a row holds for input block b (matmul_int8.cc's opening comment).
struct BlockCodes {
  int32_t w[32];
  int32_t s[2];
  float d, m;
};

inline void DecodeBlock(GgmlType type, const uint8_t* row, uint32_t b, BlockCodes* c) {
  namespace gb = ggml_blocks;
  c->s[0] = c->s[1] = 1;
  c->m = 0;
  switch (type) {
    case GgmlType::kQ4_1: {
      const uint8_t* blk = row + static_cast<size_t>(b) * gb::kQ41Bytes;
      for (int j = 0; j < 16; ++j) {
        c->w[j] = blk[4 + j] & 0xF;
        c->w[j + 16] = blk[4 + j] >> 4;
      }
      c->d = HalfAt(blk);
      c->m = HalfAt(blk + 2);
      break;
    }
    case GgmlType::kQ5_0: {
      const uint8_t* blk = row + static_cast<size_t>(b) * gb::kQ50Bytes;
      const uint32_t qh = gb::LoadU32Le(blk + 2);
      for (int j = 0; j < 16; ++j) {
        c->w[j] = ((blk[6 + j] & 0xF) | static_cast<int32_t>(((qh >> j) & 1) << 4)) - 16;
        c->w[j + 16] = ((blk[6 + j] >> 4) | static_cast<int32_t>(((qh >> (j + 16)) & 1) << 4)) - 16;
      }
      c->d = HalfAt(blk);
      break;
    }
    case GgmlType::kQ4_K: {
      const uint8_t* sb = row + static_cast<size_t>(b / 8) * gb::kQ4KBytes;
      const uint32_t j = b % 8;
      uint8_t sc, mn;
      gb::Q4KScaleMin(j, sb + gb::kQ4KScales, &sc, &mn);
      const uint8_t* q = sb + gb::kQ4KQs + 32 * (j / 2);
      for (int l = 0; l < 32; ++l) c->w[l] = (q[l] >> (4 * (j % 2))) & 0xF;
      c->s[0] = c->s[1] = sc;
      c->d = HalfAt(sb);
      c->m = -(HalfAt(sb + 2) * static_cast<float>(mn));
      break;
    }
    case GgmlType::kQ6_K: {
      const uint8_t* sb = row + static_cast<size_t>(b / 8) * gb::kQ6KBytes;
      const uint32_t h = (b % 8) / 4, k = b % 4;
      for (uint32_t l = 0; l < 32; ++l) c->w[l] = gb::Q6KCode(sb, h, k, l) - 32;
      c->s[0] = static_cast<int8_t>(sb[gb::kQ6KScales + 8 * h + 2 * k]);
      c->s[1] = static_cast<int8_t>(sb[gb::kQ6KScales + 8 * h + 2 * k + 1]);
      c->d = HalfAt(sb + gb::kQ6KD);
      break;
    }
    default: {  // Q8_0
      const uint8_t* blk = row + static_cast<size_t>(b) * gb::kQ80Bytes;
      for (int j = 0; j < 32; ++j) c->w[j] = static_cast<int8_t>(blk[2 + j]);
      c->d = HalfAt(blk);
      break;
    }
  }
}

}  // namespace kvcache::model::int8_internal

namespace kvcache::model {

void QuantizeInputsScalar(const float* x, uint32_t n, uint32_t cols, QuantizedInputs* out) {
  const uint32_t nb = cols / kInt8Block;
  out->n = n;
  out->cols = cols;
  out->q.resize(static_cast<size_t>(n) * cols);
  out->dxc.resize(static_cast<size_t>(n) * nb * 2);
  for (size_t b = 0; b < static_cast<size_t>(n) * nb; ++b) {
    const float* v = x + b * kInt8Block;
    int8_t* q = out->q.data() + b * kInt8Block;
    float amax = 0;
    for (uint32_t j = 0; j < kInt8Block; ++j) amax = std::max(amax, std::fabs(v[j]));
    const float dx = amax / 127.0f;
    const float inv = amax > 0 ? 127.0f / amax : 0.0f;
    int32_t sum = 0;
    for (uint32_t j = 0; j < kInt8Block; ++j) {
      // A NaN (0 * inv where inv overflowed to infinity, for a block of
      // values below about 4e-37) is code 0.
      const float r = std::nearbyint(v[j] * inv);
      q[j] = std::isnan(r) ? int8_t{0} : static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
      sum += q[j];
    }
    out->dxc[2 * b] = dx;
    out->dxc[2 * b + 1] = dx * static_cast<float>(sum);
  }
}

void MatMulInt8Scalar(const WeightMatrix& w, const QuantizedInputs& x, float* out) {
  using namespace int8_internal;
  const uint32_t nb = w.cols / kInt8Block;
  for (uint32_t r = 0; r < w.rows; ++r) {
    const uint8_t* row = w.data + static_cast<size_t>(r) * w.row_bytes;
    for (uint32_t t = 0; t < x.n; ++t) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      float mterm = 0;
      for (uint32_t b = 0; b < nb; ++b) {
        const int8_t* q = x.q.data() + (static_cast<size_t>(t) * nb + b) * kInt8Block;
        BlockCodes c;
        DecodeBlock(w.type, row, b, &c);
        const float s = c.d * x.dxc[2 * (static_cast<size_t>(t) * nb + b)];
        for (int i = 0; i < 8; ++i) {
          int32_t lane = 0;
          for (int k = 0; k < 4; ++k) lane += c.w[4 * i + k] * q[4 * i + k];
          lane *= c.s[i / 4];
          acc[i] = acc[i] + static_cast<float>(lane) * s;
        }
        mterm = mterm + c.m * x.dxc[2 * (static_cast<size_t>(t) * nb + b) + 1];
      }
      out[static_cast<size_t>(t) * w.rows + r] = SumLanes(acc) + mterm;
    }
  }
}

}  // namespace kvcache::model
#endif  // KVCACHE_MODEL_MATMUL_INT8_ONCE

HWY_BEFORE_NAMESPACE();
namespace kvcache::model {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// QuantizeInputsScalar's rounding, a vector of values at a time: the same
// operations on each value (|v| into the block's maximum, v * inv rounded
// to nearest even, clamped, truncated; NaN to 0), so the same codes and
// scales.
void QuantizeBlocksT(const float* x, size_t blocks, int8_t* q, float* dxc) {
  const hn::CappedTag<float, kInt8Block> df;
  const hn::Rebind<int32_t, decltype(df)> di;
  const hn::Rebind<int8_t, decltype(df)> d8;
  const size_t N = hn::Lanes(df);
  const auto lo = hn::Set(df, -127.0f), hi = hn::Set(df, 127.0f);
  for (size_t b = 0; b < blocks; ++b, x += kInt8Block, q += kInt8Block) {
    // Max(|v|, amax) keeps amax where v is NaN, as std::max(amax, |v|) does.
    auto amax = hn::Zero(df);
    for (size_t j = 0; j < kInt8Block; j += N) amax = hn::Max(hn::Abs(hn::LoadU(df, x + j)), amax);
    const float am = hn::GetLane(hn::MaxOfLanes(df, amax));
    const float dx = am / 127.0f;
    const auto inv = hn::Set(df, am > 0 ? 127.0f / am : 0.0f);
    auto sum = hn::Zero(di);
    for (size_t j = 0; j < kInt8Block; j += N) {
      const auto r = hn::Round(hn::Mul(hn::LoadU(df, x + j), inv));
      const auto clamped = hn::ConvertTo(di, hn::Min(hn::Max(r, lo), hi));
      const auto code = hn::IfThenElseZero(hn::RebindMask(di, hn::Eq(r, r)), clamped);
      sum = hn::Add(sum, code);
      hn::StoreU(hn::DemoteTo(d8, code), d8, q + j);
    }
    dxc[2 * b] = dx;
    dxc[2 * b + 1] = dx * static_cast<float>(hn::GetLane(hn::SumOfLanes(di, sum)));
  }
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_SSE4
// The f16 at p through the target's conversion (F16C on x86): exact, like
// F16ToFloat, without its branches.
HWY_INLINE float HalfT(const uint8_t* p) {
  const hn::CappedTag<hwy::float16_t, 1> dh;
  const hn::Rebind<float, decltype(dh)> df1;
  return hn::GetLane(hn::PromoteTo(df1, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p))));
}

// Signed codes go through |w| times sign(w) * q, which keeps every product
// and pair sum exact (pmaddubsw takes an unsigned and a signed operand).
constexpr bool SignedCodes(GgmlType t) {
  return t == GgmlType::kQ8_0 || t == GgmlType::kQ5_0 || t == GgmlType::kQ6_K;
}
// Sub-block scales multiply the integer lanes.
constexpr bool SubScales(GgmlType t) { return t == GgmlType::kQ4_K || t == GgmlType::kQ6_K; }
// A minimum term.
constexpr bool HasMin(GgmlType t) { return t == GgmlType::kQ4_1 || t == GgmlType::kQ4_K; }
// The bytes a row spends on 32 values (Q6_K: rounded down; for prefetching
// and the 32-value types' block addresses only).
constexpr size_t BytesPer32(GgmlType t) {
  switch (t) {
    case GgmlType::kQ4_1: return ggml_blocks::kQ41Bytes;
    case GgmlType::kQ5_0: return ggml_blocks::kQ50Bytes;
    case GgmlType::kQ4_K: return ggml_blocks::kQ4KBytes / 8;
    case GgmlType::kQ6_K: return ggml_blocks::kQ6KBytes / 8;
    default: return ggml_blocks::kQ80Bytes;
  }
}

#if HWY_TARGET <= HWY_AVX2
// One 256-bit vector holds a block: 32 weight bytes against 32 signed
// codes, eight int32 lanes of four consecutive products each.
using VI = __m256i;
using VF = __m256;
constexpr int kGroups = 1;
HWY_INLINE VF ZeroF() { return _mm256_setzero_ps(); }
HWY_INLINE VI LoadCodes(const int8_t* q, int) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)); }
HWY_INLINE VI Load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
HWY_INLINE VI Nibbles(VI v, bool high) {
  return _mm256_and_si256(high ? _mm256_srli_epi16(v, 4) : v, _mm256_set1_epi8(0x0F));
}
HWY_INLINE void Q41Weights(const uint8_t* nib, VI* w) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(nib));
  const __m128i mask = _mm_set1_epi8(0x0F);
  w[0] = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), mask), _mm_and_si128(b, mask));
}
HWY_INLINE void Q80Weights(const int8_t* v, VI* w) { w[0] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v)); }
// Q5_0: byte k of the fifth bits is bit k of qh (each 128-bit half picks
// its two bytes of the broadcast qh, then tests one bit per byte); a code
// whose fifth bit is clear is its nibble - 16, i.e. the nibble with the
// top four bits set.
HWY_INLINE void Q50Weights(const uint8_t* blk, VI* w) {
  VI nib;
  Q41Weights(blk + 6, &nib);
#if HWY_TARGET <= HWY_AVX3
  // AVX-512: qh is the byte mask itself; 16 off where its bit is clear.
  w[0] = _mm256_mask_sub_epi8(nib, static_cast<__mmask32>(~int8_internal::LoadU32(blk + 2)), nib,
                              _mm256_set1_epi8(16));
#else
  const VI qh = _mm256_set1_epi32(static_cast<int>(int8_internal::LoadU32(blk + 2)));
  const VI sel = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3,
                                  3, 3, 3, 3);
  const VI bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  const VI set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(qh, sel), bit), bit);
  w[0] = _mm256_or_si256(nib, _mm256_andnot_si256(set, _mm256_set1_epi8(static_cast<char>(0xF0))));
#endif
}
// Q4_K sub-block: the low (even sub-block) or high nibbles of 32 bytes.
HWY_INLINE void Q4KWeights(const uint8_t* q, bool high, VI* w) { w[0] = Nibbles(Load32(q), high); }
// Q6_K group k of a half: low bits from ql (32 bytes), bits 2k, 2k + 1 of
// qh (32 bytes), minus 32.
HWY_INLINE void Q6KWeights(const uint8_t* ql, const uint8_t* qh, uint32_t k, VI* w) {
  const VI low = Nibbles(Load32(ql), k >= 2);
  const VI hi = _mm256_and_si256(_mm256_srl_epi16(Load32(qh), _mm_cvtsi32_si128(static_cast<int>(2 * k))),
                                 _mm256_set1_epi8(3));
  w[0] = _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(hi, 4)), _mm256_set1_epi8(32));
}
// The 16-bit multipliers of pmaddwd: s0 for values 0..15, s1 for 16..31.
HWY_INLINE void SubScalesT(int s0, int s1, VI* s) {
  s[0] = _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(s1)), _mm_set1_epi16(static_cast<int16_t>(s0)));
}
// (d, m, -, -) of a 32-value block: both halves converted at once (F16C);
// without a minimum lane 1 is not a scale and is never used.
HWY_INLINE __m128 LoadDm(const uint8_t* blk, bool) {
  return _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(int8_internal::LoadU32(blk))));
}
// Four products per int32 lane: unsigned a times signed b.
HWY_INLINE VI Dot4(VI a, VI b) {
#if HWY_TARGET <= HWY_AVX3_DL
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1));
#endif
}
// The same times the lane's 16-bit multiplier s (|s| <= 128: exact).
HWY_INLINE VI Dot4Scaled(VI a, VI b, VI s) { return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), s); }
HWY_INLINE VI AbsI8(VI v) { return _mm256_abs_epi8(v); }
HWY_INLINE VI SignI8(VI v, VI s) { return _mm256_sign_epi8(v, s); }
// acc + float(lanes) * lane 0 of `scale`.
HWY_INLINE VF Accumulate(VF acc, VI lanes, __m128 scale) {
  return _mm256_add_ps(acc, _mm256_mul_ps(_mm256_cvtepi32_ps(lanes), _mm256_broadcastss_ps(scale)));
}
HWY_INLINE void StoreF(VF v, float* out) { _mm256_storeu_ps(out, v); }
#else
// SSE4: two 128-bit halves per block (values 0..15, then 16..31), four
// lanes each.
using VI = __m128i;
using VF = __m128;
constexpr int kGroups = 2;
HWY_INLINE VF ZeroF() { return _mm_setzero_ps(); }
HWY_INLINE VI LoadCodes(const int8_t* q, int g) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16 * g)); }
HWY_INLINE VI Load16(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
HWY_INLINE VI Nibbles(VI v, bool high) { return _mm_and_si128(high ? _mm_srli_epi16(v, 4) : v, _mm_set1_epi8(0x0F)); }
HWY_INLINE void Q41Weights(const uint8_t* nib, VI* w) {
  const __m128i b = Load16(nib);
  w[0] = Nibbles(b, false);
  w[1] = Nibbles(b, true);
}
HWY_INLINE void Q80Weights(const int8_t* v, VI* w) {
  w[0] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v));
  w[1] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v + 16));
}
HWY_INLINE void Q50Weights(const uint8_t* blk, VI* w) {
  Q41Weights(blk + 6, w);
  const VI qh = _mm_set1_epi32(static_cast<int>(int8_internal::LoadU32(blk + 2)));
  const VI bit = _mm_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  const VI top = _mm_set1_epi8(static_cast<char>(0xF0));
  for (int g = 0; g < 2; ++g) {
    const VI sel = g == 0 ? _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1)
                          : _mm_setr_epi8(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const VI set = _mm_cmpeq_epi8(_mm_and_si128(_mm_shuffle_epi8(qh, sel), bit), bit);
    w[g] = _mm_or_si128(w[g], _mm_andnot_si128(set, top));
  }
}
HWY_INLINE void Q4KWeights(const uint8_t* q, bool high, VI* w) {
  w[0] = Nibbles(Load16(q), high);
  w[1] = Nibbles(Load16(q + 16), high);
}
HWY_INLINE void Q6KWeights(const uint8_t* ql, const uint8_t* qh, uint32_t k, VI* w) {
  const __m128i count = _mm_cvtsi32_si128(static_cast<int>(2 * k));
  for (int g = 0; g < 2; ++g) {
    const VI low = Nibbles(Load16(ql + 16 * g), k >= 2);
    const VI hi = _mm_and_si128(_mm_srl_epi16(Load16(qh + 16 * g), count), _mm_set1_epi8(3));
    w[g] = _mm_sub_epi8(_mm_or_si128(low, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
  }
}
HWY_INLINE void SubScalesT(int s0, int s1, VI* s) {
  s[0] = _mm_set1_epi16(static_cast<int16_t>(s0));
  s[1] = _mm_set1_epi16(static_cast<int16_t>(s1));
}
HWY_INLINE __m128 LoadDm(const uint8_t* blk, bool has_min) {
  return _mm_setr_ps(HalfT(blk), has_min ? HalfT(blk + 2) : 0.0f, 0.0f, 0.0f);
}
HWY_INLINE VI Dot4(VI a, VI b) { return _mm_madd_epi16(_mm_maddubs_epi16(a, b), _mm_set1_epi16(1)); }
HWY_INLINE VI Dot4Scaled(VI a, VI b, VI s) { return _mm_madd_epi16(_mm_maddubs_epi16(a, b), s); }
HWY_INLINE VI AbsI8(VI v) { return _mm_abs_epi8(v); }
HWY_INLINE VI SignI8(VI v, VI s) { return _mm_sign_epi8(v, s); }
HWY_INLINE VF Accumulate(VF acc, VI lanes, __m128 scale) {
  return _mm_add_ps(acc, _mm_mul_ps(_mm_cvtepi32_ps(lanes), _mm_shuffle_ps(scale, scale, 0)));
}
HWY_INLINE void StoreF(VF v, float* out) { _mm_storeu_ps(out, v); }
#endif

// One row's share of input block b: its codes as the unsigned operand of
// the byte products (|w| for signed codes), the codes themselves (the sign
// source), the pmaddwd multipliers (types with sub-block scales) and (d, m,
// -, -) for the float steps.
struct RowBlock {
  VI a[kGroups], w[kGroups], s[kGroups];
  __m128 dm;
};

// A K type super-block's scales for its eight blocks of 32, decoded once
// at its first block: (d, m, -, -) and the pmaddwd multipliers of each.
struct SuperScales {
  __m128 dm[8];
  VI s[8][kGroups];
};

template <GgmlType kT>
HWY_INLINE void LoadSuperScales(const uint8_t* sb, SuperScales* out) {
  namespace gb = ggml_blocks;
  if constexpr (kT == GgmlType::kQ4_K) {
    const float d = HalfT(sb), dmin = HalfT(sb + 2);
    for (uint32_t j = 0; j < 8; ++j) {
      uint8_t sc, mn;
      gb::Q4KScaleMin(j, sb + gb::kQ4KScales, &sc, &mn);
      out->dm[j] = _mm_setr_ps(d, -(dmin * static_cast<float>(mn)), 0.0f, 0.0f);
      SubScalesT(sc, sc, out->s[j]);
    }
  } else {
    const __m128 dm = _mm_setr_ps(HalfT(sb + gb::kQ6KD), 0.0f, 0.0f, 0.0f);
    const int8_t* sc = reinterpret_cast<const int8_t*>(sb + gb::kQ6KScales);
    for (uint32_t j = 0; j < 8; ++j) {
      out->dm[j] = dm;
      SubScalesT(sc[2 * j], sc[2 * j + 1], out->s[j]);
    }
  }
}

// Block b's codes; for the K types b is block kJ of its super-block
// (b % 8 == kJ, known at compile time) and its scales come from `ss`, the
// super-block's (Q6_K's block j = 4 h + k takes scales 8 h + 2 k and the
// next, i.e. 2 j and 2 j + 1).
template <GgmlType kT, uint32_t kJ>
HWY_INLINE void LoadRowBlock(const uint8_t* row, uint32_t b, const SuperScales* ss, RowBlock* rb) {
  namespace gb = ggml_blocks;
  if constexpr (kT == GgmlType::kQ4_1 || kT == GgmlType::kQ8_0 || kT == GgmlType::kQ5_0) {
    (void)ss;
    const uint8_t* blk = row + static_cast<size_t>(b) * BytesPer32(kT);
    if constexpr (kT == GgmlType::kQ4_1) {
      Q41Weights(blk + 4, rb->w);
    } else if constexpr (kT == GgmlType::kQ5_0) {
      Q50Weights(blk, rb->w);
    } else {
      Q80Weights(reinterpret_cast<const int8_t*>(blk + 2), rb->w);
    }
    rb->dm = LoadDm(blk, kT == GgmlType::kQ4_1);
  } else {
    constexpr uint32_t j = kJ;
    if constexpr (kT == GgmlType::kQ4_K) {
      const uint8_t* sb = row + static_cast<size_t>(b / 8) * gb::kQ4KBytes;
      Q4KWeights(sb + gb::kQ4KQs + 32 * (j / 2), j % 2 != 0, rb->w);
    } else {
      const uint8_t* sb = row + static_cast<size_t>(b / 8) * gb::kQ6KBytes;
      constexpr uint32_t h = j / 4, k = j % 4;
      Q6KWeights(sb + 64 * h + 32 * (k % 2), sb + gb::kQ6KQh + 32 * h, k, rb->w);
    }
    for (int g = 0; g < kGroups; ++g) rb->s[g] = ss->s[j][g];
    rb->dm = ss->dm[j];
  }
  for (int g = 0; g < kGroups; ++g) rb->a[g] = SignedCodes(kT) ? AbsI8(rb->w[g]) : rb->w[g];
}

constexpr size_t kPrefetchBytes = 2048;

// The accumulators of R rows x T tokens: per group the eight lanes' sums,
// and in lane 1 of mt the minimum term, sum of m * c in block order (lane 0
// unused).
template <int R, int T>
struct Accumulators {
  VF acc[R][T][kGroups];
  __m128 mt[R][T];
};

// Block b (block kJ of its super-block for the K types) of R rows times T
// tokens of x from token t0, into a.
template <GgmlType kT, int R, int T, uint32_t kJ>
HWY_INLINE void BlockStep(const uint8_t* const* rows, const QuantizedInputs& x, uint32_t t0, uint32_t nb,
                          uint32_t b, const SuperScales* ss, Accumulators<R, T>& a) {
  VI xv[T][kGroups];
  __m128 dxc[T];  // (dx, c, -, -) of the token's block
  for (int t = 0; t < T; ++t) {
    const size_t xb = static_cast<size_t>(t0 + t) * nb + b;
    for (int g = 0; g < kGroups; ++g) xv[t][g] = LoadCodes(x.q.data() + xb * kInt8Block, g);
    dxc[t] = _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(x.dxc.data() + 2 * xb)));
  }
  for (int r = 0; r < R; ++r) {
    // Weights stream from memory once per product: ask for them well
    // ahead (the hardware prefetcher alone leaves decode waiting on DRAM).
    _mm_prefetch(reinterpret_cast<const char*>(rows[r] + b * BytesPer32(kT)) + kPrefetchBytes, _MM_HINT_T0);
    RowBlock rb;
    LoadRowBlock<kT, kJ>(rows[r], b, SubScales(kT) ? &ss[r] : nullptr, &rb);
    for (int t = 0; t < T; ++t) {
      const __m128 prod = _mm_mul_ps(rb.dm, dxc[t]);  // (d * dx, m * c)
      for (int g = 0; g < kGroups; ++g) {
        const VI xs = SignedCodes(kT) ? SignI8(xv[t][g], rb.w[g]) : xv[t][g];
        VI lanes;
        if constexpr (SubScales(kT)) {
          lanes = Dot4Scaled(rb.a[g], xs, rb.s[g]);
        } else {
          lanes = Dot4(rb.a[g], xs);
        }
        a.acc[r][t][g] = Accumulate(a.acc[r][t][g], lanes, prod);
      }
      if constexpr (HasMin(kT)) a.mt[r][t] = _mm_add_ps(a.mt[r][t], prod);
    }
  }
}

// The eight blocks of a K type's super-block starting at block b, each
// with its position known at compile time.
template <GgmlType kT, int R, int T, uint32_t... kJ>
HWY_INLINE void SuperBlockSteps(const uint8_t* const* rows, const QuantizedInputs& x, uint32_t t0, uint32_t nb,
                                uint32_t b, const SuperScales* ss, Accumulators<R, T>& a,
                                std::integer_sequence<uint32_t, kJ...>) {
  (BlockStep<kT, R, T, kJ>(rows, x, t0, nb, b + kJ, ss, a), ...);
}

// R rows (pointers to their first block; row r is row ids[r] of the
// matrix) times T tokens of x from token t0, over nb blocks of 32;
// out[t * out_stride + ids[r]].
template <GgmlType kT, int R, int T>
HWY_INLINE void RowsTimesTokens(const uint8_t* const* rows, const uint32_t* ids, const QuantizedInputs& x,
                                uint32_t t0, uint32_t nb, float* out, size_t out_stride) {
  using namespace int8_internal;
  Accumulators<R, T> a;
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      a.mt[r][t] = _mm_setzero_ps();
      for (int g = 0; g < kGroups; ++g) a.acc[r][t][g] = ZeroF();
    }
  }
  if constexpr (SubScales(kT)) {
    SuperScales ss[R];
    for (uint32_t b = 0; b < nb; b += 8) {
      const size_t sb = static_cast<size_t>(b / 8) * GgmlTypeSizeOf(kT).block_bytes;
      for (int r = 0; r < R; ++r) LoadSuperScales<kT>(rows[r] + sb, &ss[r]);
      SuperBlockSteps<kT, R, T>(rows, x, t0, nb, b, ss, a, std::make_integer_sequence<uint32_t, 8>());
    }
  } else {
    for (uint32_t b = 0; b < nb; ++b) BlockStep<kT, R, T, 0>(rows, x, t0, nb, b, nullptr, a);
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      float lanes[8];
      HWY_ALIGN float m4[4];
      for (int g = 0; g < kGroups; ++g) StoreF(a.acc[r][t][g], lanes + 4 * g);
      _mm_store_ps(m4, a.mt[r][t]);
      out[t * out_stride + ids[r]] = SumLanes(lanes) + m4[1];
    }
  }
}

template <GgmlType kT, int R>
void RowsTimesAll(const uint8_t* const* rows, const uint32_t* ids, const QuantizedInputs& x, uint32_t nb,
                  float* out, uint32_t out_stride) {
  uint32_t t = 0;
  for (; t + 2 <= x.n; t += 2) {
    RowsTimesTokens<kT, R, 2>(rows, ids, x, t, nb, out + static_cast<size_t>(t) * out_stride, out_stride);
  }
  if (t < x.n) {
    RowsTimesTokens<kT, R, 1>(rows, ids, x, t, nb, out + static_cast<size_t>(t) * out_stride, out_stride);
  }
}

template <GgmlType kT>
void RowsInt8(const WeightMatrix& w, uint32_t r0, uint32_t r1, const QuantizedInputs& x, float* out) {
  const uint32_t nb = w.cols / kInt8Block;
  // Groups of four rows a quarter of the range apart: each of the four
  // streams the hardware prefetcher follows then runs through a quarter of
  // the range in address order (four neighbouring rows would make four
  // streams of one row each, too short for it to follow).
  // Which rows share a group changes no bit: a row's sums are its own.
  const uint32_t q = (r1 - r0) / 4;
  for (uint32_t i = 0; i < q; ++i) {
    const uint8_t* rows[4];
    uint32_t ids[4];
    for (uint32_t k = 0; k < 4; ++k) {
      ids[k] = r0 + k * q + i;
      rows[k] = w.data + static_cast<size_t>(ids[k]) * w.row_bytes;
    }
    RowsTimesAll<kT, 4>(rows, ids, x, nb, out, w.rows);
  }
  r0 += 4 * q;
  for (uint32_t r = r0; r < r1; r += 4) {
    const uint32_t m = std::min<uint32_t>(4, r1 - r);
    const uint8_t* rows[4];
    uint32_t ids[4];
    for (uint32_t k = 0; k < m; ++k) {
      ids[k] = r + k;
      rows[k] = w.data + static_cast<size_t>(r + k) * w.row_bytes;
    }
    switch (m) {
      case 4: RowsTimesAll<kT, 4>(rows, ids, x, nb, out, w.rows); break;
      case 3: RowsTimesAll<kT, 3>(rows, ids, x, nb, out, w.rows); break;
      case 2: RowsTimesAll<kT, 2>(rows, ids, x, nb, out, w.rows); break;
      default: RowsTimesAll<kT, 1>(rows, ids, x, nb, out, w.rows); break;
    }
  }
}

void MatMulRowsInt8T(const WeightMatrix& w, uint32_t r0, uint32_t r1, const QuantizedInputs& x,
                     float* out) {
  switch (w.type) {
    case GgmlType::kQ4_1: RowsInt8<GgmlType::kQ4_1>(w, r0, r1, x, out); break;
    case GgmlType::kQ5_0: RowsInt8<GgmlType::kQ5_0>(w, r0, r1, x, out); break;
    case GgmlType::kQ4_K: RowsInt8<GgmlType::kQ4_K>(w, r0, r1, x, out); break;
    case GgmlType::kQ6_K: RowsInt8<GgmlType::kQ6_K>(w, r0, r1, x, out); break;
    default: RowsInt8<GgmlType::kQ8_0>(w, r0, r1, x, out); break;
  }
}

#else
// Targets without byte multiply-adds (the portable fallbacks): the
// reference is the kernel.
void MatMulRowsInt8T(const WeightMatrix& w, uint32_t r0, uint32_t r1, const QuantizedInputs& x,
                     float* out) {
  WeightMatrix part = w;
  part.data = w.data + static_cast<size_t>(r0) * w.row_bytes;
  part.rows = r1 - r0;
  std::vector<float> tmp(static_cast<size_t>(x.n) * part.rows);
  MatMulInt8Scalar(part, x, tmp.data());
  for (uint32_t t = 0; t < x.n; ++t) {
    std::memcpy(out + static_cast<size_t>(t) * w.rows + r0, tmp.data() + static_cast<size_t>(t) * part.rows,
                part.rows * sizeof(float));
  }
}
#endif

}  // namespace HWY_NAMESPACE
}  // namespace kvcache::model
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvcache::model {

HWY_EXPORT(MatMulRowsInt8T);
HWY_EXPORT(QuantizeBlocksT);

void QuantizeInputs(const float* x, uint32_t n, uint32_t cols, QuantizedInputs* out) {
  out->n = n;
  out->cols = cols;
  const size_t blocks = static_cast<size_t>(n) * (cols / kInt8Block);
  out->q.resize(blocks * kInt8Block);
  out->dxc.resize(blocks * 2);
  HWY_DYNAMIC_DISPATCH(QuantizeBlocksT)(x, blocks, out->q.data(), out->dxc.data());
}

void MatMulRowsInt8(const WeightMatrix& w, uint32_t r0, uint32_t r1, const QuantizedInputs& x,
                    float* out) {
  HWY_DYNAMIC_DISPATCH(MatMulRowsInt8T)(w, r0, r1, x, out);
}

bool Int8LanesAvailable() {
#if HWY_ARCH_X86
  // The byte multiply-add kernels: SSE4 and every better x86 target (the
  // lower bits), where one of them is compiled in.
  return (hwy::SupportedTargets() & HWY_TARGETS & (HWY_SSE4 | (HWY_SSE4 - 1))) != 0;
#else
  return false;
#endif
}

}  // namespace kvcache::model
#endif  // HWY_ONCE
