// The LLaMA architecture (llama2.c checkpoints, GGUF's "llama": SmolLM2,
// TinyLlama, ...): token embedding, then per layer
//   x += Wo * Attention(RoPE(Wq * RMSNorm(x)), RoPE(Wk * RMSNorm(x)), Wv * RMSNorm(x))
//   x += W2 * (SiLU(W1 * RMSNorm(x)) * (W3 * RMSNorm(x)))
// then the final RMSNorm and the classifier. Every layer attends to every
// earlier position, with RoPE base config().rope_theta over the whole head
// (pairs (2i, 2i+1), as llama2.c and GGUF's llama layout store them).
//
// Thread safety: immutable; the Model must outlive it.
#pragma once

#include "model/arch/architecture.h"

namespace kvcache::model {

class LlamaArchitecture final : public Architecture {
 public:
  explicit LlamaArchitecture(const Model& model) : model_(&model) {}

  const ModelConfig& config() const override { return model_->config(); }
  void Embed(int32_t token, float* out) const override;
  LayerAttention Layer(uint32_t l) const override;
  void AttentionInputs(uint32_t l, const Pass& p) const override;
  void AttentionProjection(uint32_t l, const Pass& p) const override;
  void FeedForward(uint32_t l, const Pass& p) const override;
  void FinalNorm(const float* x, float* out) const override;
  const WeightMatrix& OutputHead() const override { return model_->classifier(); }

 private:
  // RmsNorm of every token's residual stream (p.x) into p.xb.
  void NormInput(const Pass& p, std::span<const float> weight) const;

  const Model* model_;
};

}  // namespace kvcache::model
