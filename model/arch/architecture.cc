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

std::unique_ptr<Architecture> MakeArchitecture(const Model& model) {
  switch (model.config().family) {
    case ModelFamily::kGemma3: return std::make_unique<Gemma3Architecture>(model);
    case ModelFamily::kLlama: break;
  }
  return std::make_unique<LlamaArchitecture>(model);
}

}  // namespace kvcache::model
