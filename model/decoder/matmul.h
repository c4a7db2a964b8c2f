// Products of the model's weight matrices with activations: the matrix-
// vector product of decoding and the chunked matrix products of prefill,
// over weights kept in their file's type (F32, F16, Q4_1, Q8_0).
//
// A WeightMatrix is a non-owning view: `rows` rows of `cols` values, each
// row `row_bytes` bytes of whole blocks of `type`. MatMul computes
//   out[t][r] = sum_c W[r][c] * x[t][c]        (t < n, r < rows)
// by decoding 4 rows at a time into f32 (the exact values DequantizeRow
// gives) and taking SIMD dot products of 4 rows x 2 inputs at once, each
// (t, r) pair with its own accumulator fed in index order. Every (t, r) is
// computed by the same sequence of operations whatever n, the thread count
// or the row split, so a chunked pass is bit-identical to single-token
// passes and to any thread count.
//
// Thread safety: reentrant (calls that share a pool are serialized by it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kvcache/status.h"
#include "kvcache/thread_pool.h"
#include "model/io/gguf.h"

namespace kvcache::model {

struct WeightMatrix {
  GgmlType type = GgmlType::kF32;
  const uint8_t* data = nullptr;  // rows * row_bytes bytes
  uint32_t rows = 0;
  uint32_t cols = 0;
  size_t row_bytes = 0;

  // A view of f32 [rows][cols].
  static WeightMatrix F32(std::span<const float> w, uint32_t rows, uint32_t cols);
  // A view of a 2-D GGUF tensor ([cols, rows] in GGUF order).
  static WeightMatrix FromTensor(const GgufTensor& t);
  // Rows [r, r + n) decoded to f32 into out[n][cols].
  void DecodeRows(uint32_t r, uint32_t n, float* out) const;
};

// x: [n][w.cols], out: [n][w.rows] (row stride w.rows). pool may be null;
// with one, the rows are split into pool->num_threads() contiguous parts
// (one ParallelFor task each).
void MatMul(const WeightMatrix& w, const float* x, uint32_t n, float* out, ThreadPool* pool);
// The scalar reference: the same decoded rows, a plain double-free f32 loop
// in index order (differs from MatMul by summation order only).
void MatMulScalar(const WeightMatrix& w, const float* x, uint32_t n, float* out);

// SIMD f32 dot product (runtime dispatch per call).
float DotF32(const float* a, const float* b, size_t n);

}  // namespace kvcache::model
