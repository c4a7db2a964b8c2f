// Kernels of the linear-attention state update and read (see
// kvcache/linear_state.h for the rules), in two versions with the same
// contract: a plain scalar reference and a Highway SIMD path dispatched once
// per call. Both vectorize nothing across the summed index: each output
// element is a sum over i = 0..d_k-1 in ascending order, and every update is
// separate multiplies and adds (the SIMD file is compiled without FMA
// contraction), so the two agree bit for bit on every target.
//
// Thread safety: pure functions of their arguments.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvcache/linear_state.h"

namespace kvcache::linear {

struct Shape {
  uint32_t n_heads = 0, d_k = 0, d_v = 0;
};

// Applies n_tokens tokens in order to state [n_heads][d_k][d_v]:
//   k    [n_tokens][n_heads][d_k]
//   v    [n_tokens][n_heads][d_v]
//   gate [n_tokens][n_heads]        g (kDecay) or β (kDelta); unused for kPlain
//   q    [n_tokens][n_heads][d_k]   or nullptr
//   out  [n_tokens][n_heads][d_v]   Sᵀq after each token's update; nullptr iff q is
// Per token and head, with S the head's matrix:
//   kPlain  S[i][j] = S[i][j] + k[i]*v[j]
//   kDecay  S[i][j] = g*S[i][j] + k[i]*v[j]
//   kDelta  u[j] = Σ_i S[i][j]*k[i];  e[j] = v[j] - u[j];  S[i][j] = S[i][j] + (β*k[i])*e[j]
//   out[j] = (float) Σ_i S[i][j]*q[i]
// (sums start at 0.0 and add i = 0, 1, ... in order; all in f64).
void ApplyTokensReference(LinearRule rule, const Shape& shape, size_t n_tokens,
                          const float* k, const float* v, const float* gate,
                          const float* q, float* out, double* state);
void ApplyTokens(LinearRule rule, const Shape& shape, size_t n_tokens, const float* k,
                 const float* v, const float* gate, const float* q, float* out,
                 double* state);

// out [n_heads][d_v] = Sᵀq for q [n_heads][d_k], state [n_heads][d_k][d_v].
void ReadReference(const Shape& shape, const double* state, const float* q, float* out);
void Read(const Shape& shape, const double* state, const float* q, float* out);

}  // namespace kvcache::linear
