// Highway SIMD path of the linear-attention kernels (contract in
// linear/linear_kernels.h). Vectorized across the d_v columns of each state
// row; sums over d_k run i = 0, 1, ... per column exactly as in the scalar
// reference, and multiplies and adds stay separate (this file turns FMA
// contraction off), so results equal ApplyTokensReference bit for bit.
// Column tails shorter than a vector go through a padded stack buffer and the
// same vector ops, never a separately written scalar loop.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")  // GCC contracts vector mul+add into FMA otherwise
#endif

#include <vector>

#include "linear/linear_kernels.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "linear/linear_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/aligned_allocator.h>
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace kvcache::linear {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using D = hn::ScalableTag<double>;

// Loads n <= Lanes(d) doubles, zeros beyond n. A partial vector goes through
// a stack buffer so nothing past p[n-1] is read on any target.
HWY_INLINE hn::Vec<D> LoadN(D d, const double* p, size_t n) {
  if (n == hn::Lanes(d)) return hn::LoadU(d, p);
  HWY_ALIGN double tmp[hn::MaxLanes(D())] = {};
  for (size_t i = 0; i < n; ++i) tmp[i] = p[i];
  return hn::Load(d, tmp);
}
// Stores the first n <= Lanes(d) lanes of x; nothing past p[n-1] is touched.
HWY_INLINE void StoreN(D d, hn::Vec<D> x, double* p, size_t n) {
  if (n == hn::Lanes(d)) {
    hn::StoreU(x, d, p);
    return;
  }
  HWY_ALIGN double tmp[hn::MaxLanes(D())];
  hn::Store(x, d, tmp);
  for (size_t i = 0; i < n; ++i) p[i] = tmp[i];
}

// acc [d_v] = Σ_i S[i][·] * x[i], i ascending, starting from 0.
void SumRows(const Shape& s, const double* S, const double* x, double* acc) {
  const D d;
  const size_t N = hn::Lanes(d);
  for (size_t j = 0; j < s.d_v; j += N) {
    const size_t n = HWY_MIN(N, s.d_v - j);
    auto sum = hn::Zero(d);
    for (uint32_t i = 0; i < s.d_k; ++i) {
      const auto prod = hn::Mul(LoadN(d, S + static_cast<size_t>(i) * s.d_v + j, n), hn::Set(d, x[i]));
      sum = hn::Add(sum, prod);
    }
    StoreN(d, sum, acc + j, n);
  }
}

// S[i][·] = scale_s * S[i][·] + a[i] * b[·] (scale_s == 1 skips the multiply,
// which is exact either way since 1*x == x).
void RankOneUpdate(const Shape& s, double* S, bool decay, double g, const double* a,
                   const double* b) {
  const D d;
  const size_t N = hn::Lanes(d);
  const auto vg = hn::Set(d, g);
  for (uint32_t i = 0; i < s.d_k; ++i) {
    double* row = S + static_cast<size_t>(i) * s.d_v;
    const auto ai = hn::Set(d, a[i]);
    for (size_t j = 0; j < s.d_v; j += N) {
      const size_t n = HWY_MIN(N, s.d_v - j);
      auto r = LoadN(d, row + j, n);
      if (decay) r = hn::Mul(vg, r);
      const auto kv = hn::Mul(ai, LoadN(d, b + j, n));
      StoreN(d, hn::Add(r, kv), row + j, n);
    }
  }
}

void ReadImpl(const Shape& s, const double* S, const float* q, float* out, double* qd,
              double* acc) {
  for (uint32_t i = 0; i < s.d_k; ++i) qd[i] = q[i];
  SumRows(s, S, qd, acc);
  for (uint32_t j = 0; j < s.d_v; ++j) out[j] = static_cast<float>(acc[j]);
}

void ApplyTokensSimd(LinearRule rule, const Shape& s, size_t n_tokens, const float* k,
                     const float* v, const float* gate, const float* q, float* out,
                     double* state) {
  const size_t mat = static_cast<size_t>(s.d_k) * s.d_v;
  // Widened inputs: kd, qd [d_k]; vd, e [d_v]; each padded to whole vectors.
  const size_t pad = hn::Lanes(D());
  std::vector<double> buf(2 * (s.d_k + pad) + 2 * (s.d_v + pad));
  double* kd = buf.data();
  double* qd = kd + s.d_k + pad;
  double* vd = qd + s.d_k + pad;
  double* e = vd + s.d_v + pad;
  for (size_t t = 0; t < n_tokens; ++t) {
    for (uint32_t h = 0; h < s.n_heads; ++h) {
      const size_t th = t * s.n_heads + h;
      double* S = state + h * mat;
      const float* kh = k + th * s.d_k;
      const float* vh = v + th * s.d_v;
      for (uint32_t j = 0; j < s.d_v; ++j) vd[j] = vh[j];
      switch (rule) {
        case LinearRule::kPlain:
        case LinearRule::kDecay:
          for (uint32_t i = 0; i < s.d_k; ++i) kd[i] = kh[i];
          RankOneUpdate(s, S, rule == LinearRule::kDecay,
                        rule == LinearRule::kDecay ? static_cast<double>(gate[th]) : 1.0, kd, vd);
          break;
        case LinearRule::kDelta: {
          for (uint32_t i = 0; i < s.d_k; ++i) kd[i] = kh[i];
          SumRows(s, S, kd, e);  // e = Sᵀk
          for (uint32_t j = 0; j < s.d_v; ++j) e[j] = vd[j] - e[j];
          const double beta = gate[th];
          for (uint32_t i = 0; i < s.d_k; ++i) kd[i] = beta * kd[i];
          RankOneUpdate(s, S, /*decay=*/false, 1.0, kd, e);
          break;
        }
      }
      if (q != nullptr) ReadImpl(s, S, q + th * s.d_k, out + th * s.d_v, qd, e);
    }
  }
}

void ReadSimd(const Shape& s, const double* state, const float* q, float* out) {
  const size_t pad = hn::Lanes(D());
  std::vector<double> buf(s.d_k + s.d_v + 2 * pad);
  const size_t mat = static_cast<size_t>(s.d_k) * s.d_v;
  for (uint32_t h = 0; h < s.n_heads; ++h) {
    ReadImpl(s, state + h * mat, q + static_cast<size_t>(h) * s.d_k,
             out + static_cast<size_t>(h) * s.d_v, buf.data(), buf.data() + s.d_k + pad);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace kvcache::linear
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvcache::linear {
HWY_EXPORT(ApplyTokensSimd);
HWY_EXPORT(ReadSimd);

void ApplyTokens(LinearRule rule, const Shape& shape, size_t n_tokens, const float* k,
                 const float* v, const float* gate, const float* q, float* out,
                 double* state) {
  HWY_DYNAMIC_DISPATCH(ApplyTokensSimd)(rule, shape, n_tokens, k, v, gate, q, out, state);
}

void Read(const Shape& shape, const double* state, const float* q, float* out) {
  HWY_DYNAMIC_DISPATCH(ReadSimd)(shape, state, q, out);
}
}  // namespace kvcache::linear
#endif
