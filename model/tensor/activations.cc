// The gated activations (activations.h): one vector code path per Highway
// target, the tail through the same code on a zero-padded copy.
#include "model/tensor/activations.h"

#include <cmath>
#include <cstring>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "model/tensor/activations.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#ifndef KVCACHE_MODEL_ACTIVATIONS_ONCE
#define KVCACHE_MODEL_ACTIVATIONS_ONCE
namespace kvcache::model::activations_internal {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;
}  // namespace kvcache::model::activations_internal
#endif

HWY_BEFORE_NAMESPACE();
namespace kvcache::model {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class D, class V>
HWY_INLINE V GeluTanhV(D d, V x) {
  using namespace activations_internal;
  const V cubic = hn::Mul(hn::Mul(hn::Mul(hn::Set(d, kCubic), x), x), x);
  const V t = hn::Tanh(d, hn::Mul(hn::Set(d, kSqrt2OverPi), hn::Add(x, cubic)));
  return hn::Mul(hn::Mul(hn::Set(d, 0.5f), x), hn::Add(hn::Set(d, 1.0f), t));
}

template <class D, class V>
HWY_INLINE V SiluV(D d, V x) {
  return hn::Div(x, hn::Add(hn::Set(d, 1.0f), hn::Exp(d, hn::Neg(x))));
}

// gate[i] = f(gate[i]) * up[i] over n values, f one vector function.
template <class F>
HWY_INLINE void GatedRows(float* gate, const float* up, size_t n, const F& f) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(hn::Mul(f(d, hn::LoadU(d, gate + i)), hn::LoadU(d, up + i)), d, gate + i);
  }
  if (i < n) {
    HWY_ALIGN float g[HWY_MAX_BYTES / sizeof(float)] = {};
    HWY_ALIGN float u[HWY_MAX_BYTES / sizeof(float)] = {};
    std::memcpy(g, gate + i, (n - i) * sizeof(float));
    std::memcpy(u, up + i, (n - i) * sizeof(float));
    hn::Store(hn::Mul(f(d, hn::Load(d, g)), hn::Load(d, u)), d, g);
    std::memcpy(gate + i, g, (n - i) * sizeof(float));
  }
}

void GeGluTanhT(float* gate, const float* up, size_t n) {
  GatedRows(gate, up, n, [](auto d, auto x) { return GeluTanhV(d, x); });
}

void SwiGluT(float* gate, const float* up, size_t n) {
  GatedRows(gate, up, n, [](auto d, auto x) { return SiluV(d, x); });
}

}  // namespace HWY_NAMESPACE
}  // namespace kvcache::model
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvcache::model {

HWY_EXPORT(GeGluTanhT);
HWY_EXPORT(SwiGluT);

void GeGluTanh(float* gate, const float* up, size_t n) { HWY_DYNAMIC_DISPATCH(GeGluTanhT)(gate, up, n); }
void SwiGlu(float* gate, const float* up, size_t n) { HWY_DYNAMIC_DISPATCH(SwiGluT)(gate, up, n); }

float GeluTanhScalar(float x) {
  using namespace activations_internal;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + kCubic * x * x * x)));
}

float SiluScalar(float x) { return x / (1.0f + std::exp(-x)); }

}  // namespace kvcache::model
#endif  // HWY_ONCE
