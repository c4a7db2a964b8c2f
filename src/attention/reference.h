// The arithmetic that defines exact f32 attention: scalar versions of the
// dot product, exp and row-sum order that AttendReference uses and that the
// SIMD f32 kernel reproduces bit for bit on every target.
//
//  * Dot(q, k) over head_dim values: 16 running sums, value i goes into sum
//    i % 16 (head_dim is zero-padded to a multiple of 16); every product is
//    rounded, then added (no fused multiply-add). The 16 sums are reduced by
//    halving: w = 8, 4, 2, 1: sum[j] = sum[j] + sum[j + w] for j < w.
//    A SIMD target with N lanes holds sum i in lane i % N of vector i / N,
//    so the same pairs meet in the same order.
//  * Exp(x) for x <= 0: Cody-Waite reduction x = n ln2 + r, a degree-6
//    polynomial in r evaluated with separate multiplies and adds, scaled by
//    2^n built from the exponent bits. Exp(x) = 0 for x < kExpMin (and -inf).
//    Only IEEE-exact operations, so scalar and vector lanes agree bit for bit.
//  * Sums over rows (the softmax denominator l and the output numerator o):
//    rows are grouped into fixed segments of kSegmentRows stored rows (by row
//    index, not by thread or chunk); inside a segment, a fold from +0 over
//    the visible rows in increasing order, adding e_r (for l) and the rounded
//    product e_r * v_r[d] (for o[d]); then a fold from +0 over the segment
//    results in increasing segment order. Chunked, multi-threaded kernels
//    split work on segment boundaries and merge in segment order, so the
//    result does not depend on the thread count.
//  * out[d] = o[d] / l, probs_r = e_r / l, lse = m + std::log(l).
//
// Everything here is a pure function. This file must be compiled without
// floating-point contraction (see the pragma at the top of the users).
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

namespace kvcache::attention_internal {

inline constexpr uint32_t kDotLanes = 16;
inline constexpr uint32_t kSegmentRows = 512;

inline constexpr uint32_t PaddedDim(uint32_t head_dim) {
  return (head_dim + kDotLanes - 1) / kDotLanes * kDotLanes;
}

// Exp constants (shared by the scalar and the SIMD version).
inline constexpr float kExpMin = -87.0f;       // below: 0 (no subnormal results)
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23: add/sub rounds to int
inline constexpr float kLn2Hi = 0.693145751953125f;     // 16 significant bits: n * kLn2Hi exact
inline constexpr float kLn2Lo = 1.428606765330187045e-06f;
// Taylor coefficients 1/k! for k = 6..2 (Horner), then + r, + 1.
inline constexpr float kExpC6 = 1.0f / 720.0f;
inline constexpr float kExpC5 = 1.0f / 120.0f;
inline constexpr float kExpC4 = 1.0f / 24.0f;
inline constexpr float kExpC3 = 1.0f / 6.0f;
inline constexpr float kExpC2 = 0.5f;

// REQUIRES x <= 0 (or -inf). Relative error about 2 ulp over [-87, 0].
inline float Exp(float x) {
  if (!(x >= kExpMin)) return 0.0f;  // also -inf
  const float t = x * kLog2e;
  const float n = (t + kRoundMagic) - kRoundMagic;  // round to nearest integer
  const float a = n * kLn2Hi;
  const float r1 = x - a;
  const float b = n * kLn2Lo;
  const float r = r1 - b;
  float p = kExpC6;
  p = p * r;
  p = p + kExpC5;
  p = p * r;
  p = p + kExpC4;
  p = p * r;
  p = p + kExpC3;
  p = p * r;
  p = p + kExpC2;
  p = p * r;
  p = p * r;  // c2 r^2 + c3 r^3 + ...
  p = p + r;
  p = p + 1.0f;
  const int32_t ni = static_cast<int32_t>(n);
  const uint32_t bits = static_cast<uint32_t>(ni + 127) << 23;
  return p * std::bit_cast<float>(bits);
}

inline float ReduceSums16(float* s) {
  for (uint32_t w = kDotLanes / 2; w >= 1; w /= 2) {
    for (uint32_t j = 0; j < w; ++j) s[j] = s[j] + s[j + w];
  }
  return s[0];
}

// q and k are [head_dim]; values past head_dim count as zero products.
inline float Dot(const float* q, const float* k, uint32_t head_dim) {
  float s[kDotLanes] = {};
  const uint32_t padded = PaddedDim(head_dim);
  for (uint32_t i = 0; i < padded; ++i) {
    const float prod = i < head_dim ? q[i] * k[i] : 0.0f;
    s[i % kDotLanes] = s[i % kDotLanes] + prod;
  }
  return ReduceSums16(s);
}

}  // namespace kvcache::attention_internal
