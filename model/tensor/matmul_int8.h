// The integer-lane weight product behind MatMul's MatMulInputs::kInt8 path
// (the rounding and the exact summation order are in matmul_int8.cc's
// opening comment): inputs rounded to int8 per 32 values once per product,
// Q4_1 / Q5_0 / Q8_0 / Q4_K / Q6_K rows multiplied in integer lanes (the K
// types' sub-block scales multiply the integer lanes), one float scale per
// block of 32.
//
// Thread safety: pure functions; a QuantizedInputs is read-only once made.
#pragma once

#include <cstdint>
#include <vector>

#include "model/tensor/matmul.h"

namespace kvcache::model {

inline constexpr uint32_t kInt8Block = 32;

// n tokens of `cols` values (a multiple of 32), rounded per block of 32.
struct QuantizedInputs {
  uint32_t n = 0, cols = 0;
  std::vector<int8_t> q;   // [n][cols] codes in [-127, 127]
  // [n][cols / 32][2]: the block's scale dx = amax / 127, then
  // c = dx * the sum of its codes.
  std::vector<float> dxc;
};

// The best SIMD target (runtime dispatch); the same codes and scales as
// QuantizeInputsScalar, the reference.
void QuantizeInputs(const float* x, uint32_t n, uint32_t cols, QuantizedInputs* out);
void QuantizeInputsScalar(const float* x, uint32_t n, uint32_t cols, QuantizedInputs* out);

// True for the types the integer path multiplies: Q4_1, Q5_0, Q8_0, Q4_K,
// Q6_K.
inline bool Int8Type(GgmlType t) {
  return t == GgmlType::kQ4_1 || t == GgmlType::kQ5_0 || t == GgmlType::kQ8_0 || t == GgmlType::kQ4_K ||
         t == GgmlType::kQ6_K;
}

// True iff MatMul takes the integer path for w (kInt8 requested, a matrix
// of an Int8Type).
inline bool UsesInt8(const WeightMatrix& w) { return w.inputs == MatMulInputs::kInt8 && Int8Type(w.type); }

// The reference: out[t][r] for every row (w a matrix of an Int8Type).
void MatMulInt8Scalar(const WeightMatrix& w, const QuantizedInputs& x, float* out);
// Rows [r0, r1), the best SIMD target (runtime dispatch); bit-identical to
// MatMulInt8Scalar.
void MatMulRowsInt8(const WeightMatrix& w, uint32_t r0, uint32_t r1, const QuantizedInputs& x,
                    float* out);
// True iff MatMulRowsInt8 runs integer lanes here (an x86 CPU with SSE4 or
// better); elsewhere it runs the reference, slower than the f32 product.
bool Int8LanesAvailable();

}  // namespace kvcache::model
