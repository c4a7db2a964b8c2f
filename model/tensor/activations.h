// The gated activations of feed-forward blocks, in SIMD on every Highway
// target.
//
// GeGluTanh: gate[i] = gelu_tanh(gate[i]) * up[i], with
// gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) (Gemma's
// GeGLU); SwiGlu: gate[i] = silu(gate[i]) * up[i], silu(x) = x / (1 +
// exp(-x)) (LLaMA's SwiGLU). tanh and exp are Highway's (at most 4 ULP from the exact value), so a value
// differs from its scalar reference's (std::tanh, std::exp) by a few ULP
// of that function; every value's result
// depends on that value alone (the last, partial vector goes through the
// same code on a padded copy), so how values are split into calls (rows,
// batches, threads) changes no bit.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>

namespace kvcache::model {

void GeGluTanh(float* gate, const float* up, size_t n);
void SwiGlu(float* gate, const float* up, size_t n);

// The scalar references: std::tanh and std::exp.
float GeluTanhScalar(float x);
float SiluScalar(float x);

}  // namespace kvcache::model
