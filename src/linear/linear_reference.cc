// Scalar reference of the linear-attention kernels: the obviously-correct
// loops the SIMD path is tested against (contract in linear/linear_kernels.h).
#include <vector>

#include "linear/linear_kernels.h"

namespace kvcache::linear {
namespace {

// out [d_v] = Σ_i S[i][·] * q[i], i ascending.
void ReadHead(const Shape& s, const double* S, const float* q, float* out) {
  for (uint32_t j = 0; j < s.d_v; ++j) {
    double acc = 0.0;
    for (uint32_t i = 0; i < s.d_k; ++i) {
      const double prod = S[static_cast<size_t>(i) * s.d_v + j] * static_cast<double>(q[i]);
      acc = acc + prod;
    }
    out[j] = static_cast<float>(acc);
  }
}

}  // namespace

void ApplyTokensReference(LinearRule rule, const Shape& s, size_t n_tokens, const float* k,
                          const float* v, const float* gate, const float* q, float* out,
                          double* state) {
  const size_t mat = static_cast<size_t>(s.d_k) * s.d_v;
  std::vector<double> e(s.d_v);  // [d_v] delta-rule error v - Sᵀk
  for (size_t t = 0; t < n_tokens; ++t) {
    for (uint32_t h = 0; h < s.n_heads; ++h) {
      const size_t th = t * s.n_heads + h;
      const float* kh = k + th * s.d_k;
      const float* vh = v + th * s.d_v;
      double* S = state + h * mat;
      switch (rule) {
        case LinearRule::kPlain:
          for (uint32_t i = 0; i < s.d_k; ++i) {
            const double ki = kh[i];
            for (uint32_t j = 0; j < s.d_v; ++j) {
              const double kv = ki * static_cast<double>(vh[j]);
              S[i * s.d_v + j] = S[i * s.d_v + j] + kv;
            }
          }
          break;
        case LinearRule::kDecay: {
          const double g = gate[th];
          for (uint32_t i = 0; i < s.d_k; ++i) {
            const double ki = kh[i];
            for (uint32_t j = 0; j < s.d_v; ++j) {
              const double decayed = g * S[i * s.d_v + j];
              const double kv = ki * static_cast<double>(vh[j]);
              S[i * s.d_v + j] = decayed + kv;
            }
          }
          break;
        }
        case LinearRule::kDelta: {
          const double beta = gate[th];
          for (uint32_t j = 0; j < s.d_v; ++j) {
            double u = 0.0;
            for (uint32_t i = 0; i < s.d_k; ++i) {
              const double prod = S[i * s.d_v + j] * static_cast<double>(kh[i]);
              u = u + prod;
            }
            e[j] = static_cast<double>(vh[j]) - u;
          }
          for (uint32_t i = 0; i < s.d_k; ++i) {
            const double bk = beta * static_cast<double>(kh[i]);
            for (uint32_t j = 0; j < s.d_v; ++j) {
              const double step = bk * e[j];
              S[i * s.d_v + j] = S[i * s.d_v + j] + step;
            }
          }
          break;
        }
      }
      if (q != nullptr) ReadHead(s, S, q + th * s.d_k, out + th * s.d_v);
    }
  }
}

void ReadReference(const Shape& s, const double* state, const float* q, float* out) {
  const size_t mat = static_cast<size_t>(s.d_k) * s.d_v;
  for (uint32_t h = 0; h < s.n_heads; ++h) {
    ReadHead(s, state + h * mat, q + static_cast<size_t>(h) * s.d_k,
             out + static_cast<size_t>(h) * s.d_v);
  }
}

}  // namespace kvcache::linear
