// The architecture of a loaded model, and the Pass helpers.
#include "model/arch/architecture.h"

#include "model/arch/gemma3.h"
#include "model/arch/llama.h"
#include "model/tensor/ops.h"

namespace kvcache::model {

void Pass::NormRows(const float* in, std::span<const float> weight, float* out, uint32_t dim,
                    float eps) const {
  ForTokens([&](uint32_t t0, uint32_t t1) {
    for (uint32_t t = t0; t < t1; ++t) {
      RmsNorm(in + static_cast<size_t>(t) * dim, weight, out + static_cast<size_t>(t) * dim, eps);
    }
  });
}

void Pass::GatedFeedForward(const LayerWeights& w, uint32_t hidden,
                            void (*gate_times_up)(float* gate, const float* up, size_t n)) const {
  Product(w.w1, xb, hb);
  Product(w.w3, xb, hb2);
  ForTokens([&](uint32_t t0, uint32_t t1) {
    const size_t at = size_t{t0} * hidden;
    gate_times_up(hb + at, hb2 + at, size_t{t1 - t0} * hidden);
  });
  Product(w.w2, hb, xb);
}

std::unique_ptr<Architecture> MakeArchitecture(const Model& model) {
  switch (model.config().family) {
    case ModelFamily::kGemma3: return std::make_unique<Gemma3Architecture>(model);
    case ModelFamily::kLlama: break;
  }
  return std::make_unique<LlamaArchitecture>(model);
}

}  // namespace kvcache::model
