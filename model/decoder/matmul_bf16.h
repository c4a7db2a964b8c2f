// The bf16 weight product behind MatMul's MatMulInputs::kBf16 path: every
// decoded weight (the exact value DequantizeRow gives) and every input is
// rounded to the nearest bf16 (ties to even), the products are exact in f32
// and summed in f32.
//
// Two kernels compute it:
// * tiles (x86 CPUs with AMX-BF16, e.g. Intel Sapphire Rapids): 16 weight
//   rows decoded to bf16 at a time, the inputs laid out once per product as
//   AMX B tiles (16 tokens x 32 values), `tdpbf16ps` into f32 tiles of 16
//   rows x 16 tokens. The hardware's summation order inside one
//   instruction is its own (it matches neither a sequential nor a pairwise
//   f32 sum), so the result differs from the FMA kernel's in the last bits.
// * fma (every other CPU): the same rounded values through MatMul's f32
//   kernel (4 rows x 2 inputs, index order).
// Either way a (t, r) result depends on x[t] and row r only: the batch size,
// the other tokens, the thread count and the row split change no bit (the
// tiles kernel computes each output element by the same instruction
// sequence whatever else shares its tile). Which kernel runs is fixed per
// process (Bf16TilesAvailable), so results are reproducible on one machine
// but not across machines with and without AMX.
//
// Thread safety: pure functions; the tile permission is requested once per
// process (thread-safe).
#pragma once

#include <cstdint>
#include <vector>

#include "model/decoder/matmul.h"

namespace kvcache::model {

// True iff this CPU and OS run AMX-BF16 tiles (cpuid, XCR0 and the Linux
// permission request, made once); false elsewhere or when the environment
// variable KVCACHE_NO_AMX is set to a non-empty value other than "0".
bool Bf16TilesAvailable();

// The inputs of one product, rounded to bf16 once: for the tiles kernel in
// tile order ([token tile][32-value step][16 value pairs][16 tokens][2]),
// for the fma kernel as f32 [n][cols].
struct Bf16Inputs {
  uint32_t n = 0, cols = 0;
  bool tiles = false;
  std::vector<uint16_t> packed;  // tiles
  std::vector<float> rounded;    // fma
};

void PrepareBf16Inputs(const float* x, uint32_t n, uint32_t cols, bool tiles, Bf16Inputs* out);

// Rows [r0, r1) of out[t][r] (row stride w.rows) with the kernel `x` was
// prepared for.
void MatMulRowsBf16(const WeightMatrix& w, uint32_t r0, uint32_t r1, const Bf16Inputs& x, float* out);

// The reference: decoded rows and inputs rounded to bf16, products summed in
// double (the kernels differ from it by f32 summation only).
void MatMulBf16Reference(const WeightMatrix& w, const float* x, uint32_t n, double* out);

}  // namespace kvcache::model
