// The LLaMA architecture's per-layer math.
#include "model/arch/llama.h"

#include <cmath>

#include "model/tensor/activations.h"
#include "model/tensor/ops.h"

namespace kvcache::model {

void LlamaArchitecture::Embed(int32_t token, float* out) const {
  model_->embedding().DecodeRows(static_cast<uint32_t>(token), 1, out);
}

LayerAttention LlamaArchitecture::Layer(uint32_t) const {
  const ModelConfig& c = config();
  return {AttentionKind::kFull, 0, {c.rope_theta, c.head_dim(), 1.0f}};
}

void LlamaArchitecture::NormInput(const Pass& p, std::span<const float> weight) const {
  p.NormRows(p.x, weight, p.xb, config().dim, config().rms_eps);
}

void LlamaArchitecture::AttentionInputs(uint32_t l, const Pass& p) const {
  const LayerWeights& w = model_->layer(l);
  NormInput(p, w.rms_att);
  p.Product(w.wq, p.xb, p.q);
  p.Product(w.wk, p.xb, p.k);
  p.Product(w.wv, p.xb, p.v);
}

void LlamaArchitecture::AttentionProjection(uint32_t l, const Pass& p) const {
  p.Product(model_->layer(l).wo, p.att, p.xb);
}

void LlamaArchitecture::FeedForward(uint32_t l, const Pass& p) const {
  const LayerWeights& w = model_->layer(l);
  NormInput(p, w.rms_ffn);
  p.GatedFeedForward(w, config().hidden_dim, &SwiGlu);  // silu(gate) * up
}

void LlamaArchitecture::FinalNorm(const float* x, float* out) const {
  RmsNorm(x, model_->rms_final(), out, config().rms_eps);
}

}  // namespace kvcache::model
