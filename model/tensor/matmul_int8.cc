// The integer-lane weight product (matmul.h, MatMulInputs::kInt8): Q4_1 and
// Q8_0 matrices times inputs rounded to int8 per 32 values, summed exactly
// in 32-bit integer lanes, scaled once per block.
//
// Inputs, per token and per block b of 32 values: dx = amax / 127, codes
// q = round-to-nearest-even(x * (127 / amax)) in [-127, 127] (all 0 when
// amax is 0), and c = dx * sum(q). A block of a row holds codes w (Q4_1:
// nibbles 0..15 with scale d and minimum m; Q8_0: int8 with scale d).
//
// The sum, fixed for every target: eight integer lanes per block, lane i
// (0..7) = w[4i]q[4i] + ... + w[4i+3]q[4i+3] (exact in int32; Q4_1's w[j]
// is the low nibble of byte j for j < 16, the high nibble of byte j - 16
// above); eight float accumulators, acc_i = acc_i + float(lane_i)
// * (d * dx) over the blocks in order, each operation rounded on its own
// (no FMA contraction); then ((a0+a1)+(a2+a3))+((a4+a5)+(a6+a7)), plus for
// Q4_1 the minimum term sum_b m * c summed in block order. The x86 kernels
// compute those lanes with byte multiply-adds (pmaddubsw + pmaddwd on SSE4,
// AVX2 and AVX3; vpdpbusd on AVX3_DL) and the same float steps, so every
// target, thread count, row split and batch size gives the scalar
// reference's bits; other targets run the reference.
//
// Thread safety: pure functions.
#pragma GCC optimize("fp-contract=off")

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kvcache/float16.h"
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

// The block's scale d (both types) and minimum m (Q4_1; 0 for Q8_0).
inline void BlockScales(GgmlType type, const uint8_t* block, float* d, float* m) {
  *d = HalfAt(block);
  *m = type == GgmlType::kQ4_1 ? HalfAt(block + 2) : 0.0f;
}

inline uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

inline size_t BlockBytes(GgmlType type) { return type == GgmlType::kQ4_1 ? 20 : 34; }

inline float SumLanes(const float* a) {
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

}  // namespace kvcache::model::int8_internal

namespace kvcache::model {

void QuantizeInputs(const float* x, uint32_t n, uint32_t cols, QuantizedInputs* out) {
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
      const float r = std::nearbyint(v[j] * inv);
      q[j] = static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
      sum += q[j];
    }
    out->dxc[2 * b] = dx;
    out->dxc[2 * b + 1] = dx * static_cast<float>(sum);
  }
}

void MatMulInt8Scalar(const WeightMatrix& w, const QuantizedInputs& x, float* out) {
  using namespace int8_internal;
  const uint32_t nb = w.cols / kInt8Block;
  const size_t bb = BlockBytes(w.type);
  for (uint32_t r = 0; r < w.rows; ++r) {
    const uint8_t* row = w.data + static_cast<size_t>(r) * w.row_bytes;
    for (uint32_t t = 0; t < x.n; ++t) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      float mterm = 0;
      for (uint32_t b = 0; b < nb; ++b) {
        const uint8_t* blk = row + b * bb;
        const int8_t* q = x.q.data() + (static_cast<size_t>(t) * nb + b) * kInt8Block;
        int32_t wv[32];
        if (w.type == GgmlType::kQ4_1) {
          for (int j = 0; j < 16; ++j) {
            wv[j] = blk[4 + j] & 0xF;
            wv[j + 16] = blk[4 + j] >> 4;
          }
        } else {
          for (int j = 0; j < 32; ++j) wv[j] = static_cast<int8_t>(blk[2 + j]);
        }
        float d, m;
        BlockScales(w.type, blk, &d, &m);
        const float s = d * x.dxc[2 * (static_cast<size_t>(t) * nb + b)];
        for (int i = 0; i < 8; ++i) {
          int32_t lane = 0;
          for (int k = 0; k < 4; ++k) lane += wv[4 * i + k] * q[4 * i + k];
          acc[i] = acc[i] + static_cast<float>(lane) * s;
        }
        mterm = mterm + m * x.dxc[2 * (static_cast<size_t>(t) * nb + b) + 1];
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

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_SSE4
// The block's d and (Q4_1) m through the target's f16 conversion (F16C on
// x86): exact, like F16ToFloat, without its branches.
HWY_INLINE void BlockScalesT(GgmlType type, const uint8_t* blk, float* d, float* m) {
  const hn::CappedTag<hwy::float16_t, 1> dh;
  const hn::Rebind<float, decltype(dh)> df1;
  const auto* h = reinterpret_cast<const hwy::float16_t*>(blk);
  *d = hn::GetLane(hn::PromoteTo(df1, hn::LoadU(dh, h)));
  *m = type == GgmlType::kQ4_1 ? hn::GetLane(hn::PromoteTo(df1, hn::LoadU(dh, h + 1))) : 0.0f;
}

#if HWY_TARGET <= HWY_AVX2
// One 256-bit vector holds a block: 32 unsigned weight bytes against 32
// signed codes, eight int32 lanes of four consecutive products each.
using VI = __m256i;
using VF = __m256;
constexpr int kGroups = 1;
HWY_INLINE VF ZeroF() { return _mm256_setzero_ps(); }
HWY_INLINE VI LoadCodes(const int8_t* q, int) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)); }
HWY_INLINE void Q41Weights(const uint8_t* nib, VI* w) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(nib));
  const __m128i mask = _mm_set1_epi8(0x0F);
  w[0] = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), mask), _mm_and_si128(b, mask));
}
HWY_INLINE void Q80Weights(const int8_t* v, VI* w) { w[0] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v)); }
// Four products per int32 lane: unsigned a times signed b.
HWY_INLINE VI Dot4(VI a, VI b) {
#if HWY_TARGET <= HWY_AVX3_DL
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1));
#endif
}
HWY_INLINE VI AbsI8(VI v) { return _mm256_abs_epi8(v); }
HWY_INLINE VI SignI8(VI v, VI s) { return _mm256_sign_epi8(v, s); }
// (d, m, -, -) of a block: both halves converted at once (F16C); for Q8_0
// lane 1 is not a scale and is never used.
HWY_INLINE __m128 LoadDm(GgmlType, const uint8_t* blk) {
  return _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(int8_internal::LoadU32(blk))));
}
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
HWY_INLINE void Q41Weights(const uint8_t* nib, VI* w) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(nib));
  const __m128i mask = _mm_set1_epi8(0x0F);
  w[0] = _mm_and_si128(b, mask);
  w[1] = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
}
HWY_INLINE void Q80Weights(const int8_t* v, VI* w) {
  w[0] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v));
  w[1] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v + 16));
}
HWY_INLINE VI Dot4(VI a, VI b) { return _mm_madd_epi16(_mm_maddubs_epi16(a, b), _mm_set1_epi16(1)); }
HWY_INLINE VI AbsI8(VI v) { return _mm_abs_epi8(v); }
HWY_INLINE VI SignI8(VI v, VI s) { return _mm_sign_epi8(v, s); }
HWY_INLINE __m128 LoadDm(GgmlType type, const uint8_t* blk) {
  float d, m;
  BlockScalesT(type, blk, &d, &m);
  return _mm_setr_ps(d, m, 0.0f, 0.0f);
}
HWY_INLINE VF Accumulate(VF acc, VI lanes, __m128 scale) {
  return _mm_add_ps(acc, _mm_mul_ps(_mm_cvtepi32_ps(lanes), _mm_shuffle_ps(scale, scale, 0)));
}
HWY_INLINE void StoreF(VF v, float* out) { _mm_storeu_ps(out, v); }
#endif

constexpr size_t kPrefetchBytes = 2048;

// R rows (pointers to their first block) times T tokens of x from token t0,
// over nb blocks; out[t * out_stride + r]. Q8_0's signed weights go through
// |w| times sign(w) * q, which keeps every product and pair sum exact.
template <int R, int T>
HWY_INLINE void RowsTimesTokens(GgmlType type, const uint8_t* const* rows, const QuantizedInputs& x,
                                uint32_t t0, uint32_t nb, float* out, size_t out_stride) {
  using namespace int8_internal;
  const bool q41 = type == GgmlType::kQ4_1;
  const size_t bb = BlockBytes(type);
  VF acc[R][T][kGroups];
  // Lane 1: the minimum term, sum of m * c in block order (lane 0 unused).
  __m128 mt[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      mt[r][t] = _mm_setzero_ps();
      for (int g = 0; g < kGroups; ++g) acc[r][t][g] = ZeroF();
    }
  }
  for (uint32_t b = 0; b < nb; ++b) {
    VI xv[T][kGroups];
    __m128 dxc[T];  // (dx, c, -, -) of the token's block
    for (int t = 0; t < T; ++t) {
      const size_t xb = static_cast<size_t>(t0 + t) * nb + b;
      for (int g = 0; g < kGroups; ++g) xv[t][g] = LoadCodes(x.q.data() + xb * kInt8Block, g);
      dxc[t] = _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(x.dxc.data() + 2 * xb)));
    }
    for (int r = 0; r < R; ++r) {
      const uint8_t* blk = rows[r] + b * bb;
      // Weights stream from memory once per product: ask for them well
      // ahead (the hardware prefetcher alone leaves decode waiting on DRAM).
      _mm_prefetch(reinterpret_cast<const char*>(blk) + kPrefetchBytes, _MM_HINT_T0);
      VI w[kGroups];
      if (q41) {
        Q41Weights(blk + 4, w);
      } else {
        Q80Weights(reinterpret_cast<const int8_t*>(blk + 2), w);
      }
      const __m128 dm = LoadDm(type, blk);
      for (int t = 0; t < T; ++t) {
        const __m128 prod = _mm_mul_ps(dm, dxc[t]);  // (d * dx, m * c)
        for (int g = 0; g < kGroups; ++g) {
          const VI lanes = q41 ? Dot4(w[g], xv[t][g]) : Dot4(AbsI8(w[g]), SignI8(xv[t][g], w[g]));
          acc[r][t][g] = Accumulate(acc[r][t][g], lanes, prod);
        }
        if (q41) mt[r][t] = _mm_add_ps(mt[r][t], prod);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      float lanes[8];
      HWY_ALIGN float m4[4];
      for (int g = 0; g < kGroups; ++g) StoreF(acc[r][t][g], lanes + 4 * g);
      _mm_store_ps(m4, mt[r][t]);
      out[t * out_stride + r] = SumLanes(lanes) + m4[1];
    }
  }
}

template <int R>
void RowsTimesAll(GgmlType type, const uint8_t* const* rows, const QuantizedInputs& x, uint32_t nb,
                  float* out, uint32_t out_stride) {
  uint32_t t = 0;
  for (; t + 2 <= x.n; t += 2) {
    RowsTimesTokens<R, 2>(type, rows, x, t, nb, out + static_cast<size_t>(t) * out_stride, out_stride);
  }
  if (t < x.n) {
    RowsTimesTokens<R, 1>(type, rows, x, t, nb, out + static_cast<size_t>(t) * out_stride, out_stride);
  }
}

void MatMulRowsInt8T(const WeightMatrix& w, uint32_t r0, uint32_t r1, const QuantizedInputs& x,
                     float* out) {
  const uint32_t nb = w.cols / kInt8Block;
  for (uint32_t r = r0; r < r1; r += 4) {
    const uint32_t m = std::min<uint32_t>(4, r1 - r);
    const uint8_t* rows[4];
    for (uint32_t k = 0; k < m; ++k) rows[k] = w.data + static_cast<size_t>(r + k) * w.row_bytes;
    float* o = out + r;
    switch (m) {
      case 4: RowsTimesAll<4>(w.type, rows, x, nb, o, w.rows); break;
      case 3: RowsTimesAll<3>(w.type, rows, x, nb, o, w.rows); break;
      case 2: RowsTimesAll<2>(w.type, rows, x, nb, o, w.rows); break;
      default: RowsTimesAll<1>(w.type, rows, x, nb, o, w.rows); break;
    }
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

void MatMulRowsInt8(const WeightMatrix& w, uint32_t r0, uint32_t r1, const QuantizedInputs& x,
                    float* out) {
  HWY_DYNAMIC_DISPATCH(MatMulRowsInt8T)(w, r0, r1, x, out);
}

}  // namespace kvcache::model
#endif  // HWY_ONCE
