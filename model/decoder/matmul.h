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
// passes and to any thread count. Rows are split between the
// calling thread and the pool's workers in contiguous ranges.
//
// Thread safety: MatMul with a pool must not be called concurrently on the
// same pool; without one it is reentrant.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "kvcache/status.h"
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

// A fixed set of worker threads for MatMul (num_threads - 1 workers: the
// calling thread takes a share). num_threads <= 1 starts none.
class ThreadPool {
 public:
  explicit ThreadPool(uint32_t num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  uint32_t num_threads() const { return static_cast<uint32_t>(workers_.size()) + 1; }

  // Runs fn(ctx, part, num_parts) for part in [0, num_threads) and waits
  // for all of them; the caller runs part 0.
  void Run(void (*fn)(void* ctx, uint32_t part, uint32_t num_parts), void* ctx);

 private:
  void Work(uint32_t part);
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  uint64_t generation_ = 0;  // guarded by mu_
  uint32_t pending_ = 0;     // workers still running this generation
  bool stop_ = false;
  void (*fn_)(void*, uint32_t, uint32_t) = nullptr;
  void* ctx_ = nullptr;
};

// x: [n][w.cols], out: [n][w.rows] (row stride w.rows). pool may be null.
void MatMul(const WeightMatrix& w, const float* x, uint32_t n, float* out, ThreadPool* pool);
// The scalar reference: the same decoded rows, a plain double-free f32 loop
// in index order (differs from MatMul by summation order only).
void MatMulScalar(const WeightMatrix& w, const float* x, uint32_t n, float* out);

// SIMD f32 dot product (runtime dispatch per call).
float DotF32(const float* a, const float* b, size_t n);

}  // namespace kvcache::model
