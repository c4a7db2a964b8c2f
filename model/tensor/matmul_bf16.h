// The bf16 weight product behind MatMul's MatMulInputs::kBf16 path: every
// decoded weight (the exact value DequantizeRow gives) and every input is
// rounded to the nearest bf16 (ties to even), the products are exact in f32
// and summed in f32.
//
// Three kernels compute it:
// * tiles (x86 CPUs with AMX-BF16, e.g. Intel Sapphire Rapids): 16 weight
//   rows decoded to bf16 at a time, the inputs laid out once per product as
//   AMX B tiles (16 tokens x 32 values), `tdpbf16ps` into f32 tiles of 16
//   rows x 16 tokens. The hardware's summation order inside one
//   instruction is its own (it matches neither a sequential nor a pairwise
//   f32 sum), so the result differs from the FMA kernel's in the last bits.
// * dot (x86 CPUs with AVX512_BF16 but no AMX, e.g. AMD Zen 4): 4 weight
//   rows decoded to bf16 at a time, the inputs rounded once per product,
//   `vdpbf16ps` (16 lanes, each adding two products per 32-value step) into
//   one f32 accumulator per row and input, then a lane sum. For 1 to 3
//   inputs, rows of the quantized types are decoded 32 values at a time in
//   registers and multiplied at once (the same operands in the same order,
//   so the same bits as through the row buffer). Like the tiles, its
//   summation order inside the instruction is the hardware's own.
// * fma (every other CPU): the same rounded values through MatMul's f32
//   kernel (4 rows x 2 or 4 inputs, index order).
// Either way a (t, r) result depends on x[t] and row r only: the batch size,
// the other tokens, the thread count and the row split change no bit (the
// tiles kernel computes each output element by the same instruction
// sequence whatever else shares its tile). Which kernel runs is fixed per
// process (PreferredBf16Kernel), so results are reproducible on one machine
// but not across machines with different kernels.
//
// Thread safety: pure functions; the tile permission is requested once per
// process (thread-safe).
#pragma once

#include <cstdint>
#include <vector>

#include "model/tensor/matmul.h"

namespace kvcache::model {

enum class Bf16Kernel { kFma, kTiles, kDot };

// Whether this CPU runs `kernel`, found once per process. fma: always. dot:
// AVX-512 F/BW/VL with AVX512_BF16 and the OS saving the AVX-512 state.
// tiles: that, AMX-BF16 and AMX-TILE, and the Linux permission request for
// the tile state; never when the environment variable KVCACHE_NO_AMX is set
// to a non-empty value other than "0".
bool Bf16KernelAvailable(Bf16Kernel kernel);
// The kernel MatMul uses: tiles, else dot, else fma.
Bf16Kernel PreferredBf16Kernel();
// "tiles", "dot" or "fma": the name a run records beside its results.
const char* Bf16KernelName(Bf16Kernel kernel);

// The inputs of one product, rounded to bf16 once: for the tiles kernel in
// tile order ([token tile][32-value step][16 value pairs][16 tokens][2]),
// for the dot kernel as bf16 rows [n][cols rounded up to 32] (zero beyond
// cols), for the fma kernel as f32 [n][cols].
struct Bf16Inputs {
  uint32_t n = 0, cols = 0;
  Bf16Kernel kernel = Bf16Kernel::kFma;
  std::vector<uint16_t> packed;  // tiles, dot
  std::vector<float> rounded;    // fma
};

// For `kernel`, or for fma where this CPU does not run it.
void PrepareBf16Inputs(const float* x, uint32_t n, uint32_t cols, Bf16Kernel kernel, Bf16Inputs* out);

// Rows [r0, r1) of out[t][r] (row stride w.rows) with the kernel `x` was
// prepared for.
void MatMulRowsBf16(const WeightMatrix& w, uint32_t r0, uint32_t r1, const Bf16Inputs& x, float* out);

// The reference: decoded rows and inputs rounded to bf16, products summed in
// double (the kernels differ from it by f32 summation only).
void MatMulBf16Reference(const WeightMatrix& w, const float* x, uint32_t n, double* out);

}  // namespace kvcache::model
