// Products of the model's weight matrices with activations: the matrix-
// vector product of decoding and the chunked matrix products of prefill,
// over weights kept in their file's type: F32, F16, Q4_1, Q5_0, Q8_0, Q4_K
// and Q6_K (the types DequantizeRow decodes, ggml_type.h CanDequantize).
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
// MatMulInputs::kInt8 (a matrix's `inputs`, chosen at load) is the fast path
// for Q4_1, Q5_0, Q8_0, Q4_K and Q6_K matrices (UsesInt8): the inputs are
// rounded to int8 per 32 values (scale amax/127) and multiplied in integer
// lanes, as llama.cpp does (the K types' 32- and 16-value sub-block scales
// multiply the integer lanes); an
// approximation of the exact f32 product whose cost on a model is measured
// with `kvcache perplexity --matmul int8` against the f32 path. It keeps every
// property above: a (t, r) result depends on x[t] and row r only, and every
// target, thread count and row split gives the same bits
// (model/tensor/matmul_int8.h). Other types (F32, F16) ignore it.
//
// MatMulInputs::kBf16 is the fast path for products over many tokens (a
// decode step of many sequences, a prefill chunk): weights and inputs
// rounded to bf16, products summed in f32, on AMX tiles where the CPU has
// them (model/tensor/matmul_bf16.h). Every matrix type takes it. A (t, r)
// result again depends on x[t] and row r only, so batching and threads change
// no bit; which kernel runs (tiles or f32 FMA) is fixed per machine.
//
// Thread safety: reentrant (calls that share a pool are serialized by it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "kvcache/status.h"
#include "kvcache/thread_pool.h"
#include "model/tensor/ggml_type.h"
#include "model/tensor/gguf_dequant.h"

namespace kvcache::model {

enum class MatMulInputs : uint8_t { kF32, kInt8, kBf16 };

struct WeightMatrix {
  GgmlType type = GgmlType::kF32;
  const uint8_t* data = nullptr;  // rows * row_bytes bytes
  uint32_t rows = 0;
  uint32_t cols = 0;
  size_t row_bytes = 0;
  MatMulInputs inputs = MatMulInputs::kF32;

  // A view of f32 [rows][cols].
  static WeightMatrix F32(std::span<const float> w, uint32_t rows, uint32_t cols);
  // Rows [r, r + n) decoded to f32 into out[n][cols].
  void DecodeRows(uint32_t r, uint32_t n, float* out) const;
};

// The products "auto" picks on this CPU, and the feature that decided:
// bf16 where the bf16 product has a kernel of its own (AMX tiles, or
// vdpbf16ps on AVX512_BF16), else int8 where the integer lanes run (x86
// with SSE4 or better), else f32. `why` is a short phrase for a startup line
// ("AVX512_BF16 dot products").
struct MatMulChoice {
  MatMulInputs inputs = MatMulInputs::kF32;
  std::string_view why;
};
MatMulChoice AutoMatMulInputs();

// "f32" | "int8" | "bf16" | "auto" (AutoMatMulInputs' choice).
Result<MatMulInputs> ParseMatMulInputs(std::string_view name);
std::string_view MatMulInputsName(MatMulInputs inputs);

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
