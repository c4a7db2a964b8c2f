// The Gemma 3 architecture (GGUF "gemma3": Gemma 3 270M, 1B, ...): the token
// embedding scaled by sqrt(dim), then per layer
//   q, k, v = Wq h, Wk h, Wv h            h = RMSNorm(x) (attn_norm)
//   q, k    = RoPE(RMSNorm_head(q)), RoPE(RMSNorm_head(k))   (per-head Q/K norms)
//   x      += RMSNorm(Wo Attention(q, k, v))                  (post_attention_norm)
//   x      += RMSNorm(W2 (GELU(W1 h') * (W3 h')))             h' = RMSNorm(x) (ffn_norm),
//                                                              post_ffw_norm after
// then the final RMSNorm and the output head, which is the token embedding
// (tied). GELU is the tanh approximation. RoPE pairs value i with value
// i + head_dim/2 (RopePairs::kHalves). Layers with (l + 1) % 6 != 0 attend
// to a sliding window of config().sliding_window positions with RoPE base
// rope_theta_local (10,000); every 6th layer is global with base rope_theta
// (10^6) and rope_scaling. Attention scales scores by 1/sqrt(head_dim),
// which is Gemma 3's query_pre_attn_scalar for every size but 27B.
//
// The GGUF's norm weights already include Gemma's "1 +" (llama.cpp's
// converter adds it), so every norm here is the plain RmsNorm.
//
// Thread safety: immutable; the Model must outlive it.
#pragma once

#include "model/arch/architecture.h"

namespace kvcache::model {

class Gemma3Architecture final : public Architecture {
 public:
  explicit Gemma3Architecture(const Model& model);

  const ModelConfig& config() const override { return model_->config(); }
  void Embed(int32_t token, float* out) const override;
  LayerAttention Layer(uint32_t l) const override;
  void AttentionInputs(uint32_t l, const Pass& p) const override;
  void AttentionProjection(uint32_t l, const Pass& p) const override;
  void FeedForward(uint32_t l, const Pass& p) const override;
  void FinalNorm(const float* x, float* out) const override;
  const WeightMatrix& OutputHead() const override { return model_->embedding(); }

 private:
  // RmsNorm in place of each of `rows` rows of `width` values per token of p.
  void NormHeads(const Pass& p, float* rows, uint32_t heads, std::span<const float> weight) const;

  const Model* model_;
  float embed_scale_;
};

}  // namespace kvcache::model
