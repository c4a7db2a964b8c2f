// The Gemma 3 architecture's per-layer math.
#include "model/arch/gemma3.h"

#include <cmath>

#include "model/tensor/activations.h"
#include "model/tensor/ops.h"

namespace kvcache::model {

Gemma3Architecture::Gemma3Architecture(const Model& model)
    : model_(&model), embed_scale_(std::sqrt(static_cast<float>(model.config().dim))) {}

void Gemma3Architecture::Embed(int32_t token, float* out) const {
  const uint32_t dim = config().dim;
  model_->embedding().DecodeRows(static_cast<uint32_t>(token), 1, out);
  for (uint32_t i = 0; i < dim; ++i) out[i] *= embed_scale_;
}

LayerAttention Gemma3Architecture::Layer(uint32_t l) const {
  const ModelConfig& c = config();
  LayerAttention a;
  a.rope.dims = c.head_dim();
  a.rope.pairs = RopePairs::kHalves;
  if (c.is_sliding(l)) {
    a.kind = AttentionKind::kSlidingWindow;
    a.window = c.sliding_window;
    a.rope.base = c.rope_theta_local;
  } else {
    a.rope.base = c.rope_theta;
    a.rope.scaling = c.rope_scaling;
  }
  return a;
}

void Gemma3Architecture::NormHeads(const Pass& p, float* rows, uint32_t heads,
                                   std::span<const float> weight) const {
  const uint32_t hd = config().head_dim();
  const float eps = config().rms_eps;
  p.ForTokens([&](uint32_t t0, uint32_t t1) {
    for (size_t r = size_t{t0} * heads; r < size_t{t1} * heads; ++r) {
      RmsNorm(rows + r * hd, weight, rows + r * hd, eps);
    }
  });
}

void Gemma3Architecture::AttentionInputs(uint32_t l, const Pass& p) const {
  const LayerWeights& w = model_->layer(l);
  const ModelConfig& c = config();
  p.NormRows(p.x, w.rms_att, p.xb, c.dim, c.rms_eps);
  p.Product(w.wq, p.xb, p.q);
  p.Product(w.wk, p.xb, p.k);
  p.Product(w.wv, p.xb, p.v);
  NormHeads(p, p.q, c.n_heads, w.q_norm);
  NormHeads(p, p.k, c.n_kv_heads, w.k_norm);
}

void Gemma3Architecture::AttentionProjection(uint32_t l, const Pass& p) const {
  const LayerWeights& w = model_->layer(l);
  p.Product(w.wo, p.att, p.xb);
  p.NormRows(p.xb, w.post_att_norm, p.xb, config().dim, config().rms_eps);
}

void Gemma3Architecture::FeedForward(uint32_t l, const Pass& p) const {
  const ModelConfig& c = config();
  const LayerWeights& w = model_->layer(l);
  p.NormRows(p.x, w.rms_ffn, p.xb, c.dim, c.rms_eps);
  p.GatedFeedForward(w, c.hidden_dim, &GeGluTanh);  // gelu_tanh(gate) * up
  p.NormRows(p.xb, w.post_ffn_norm, p.xb, c.dim, c.rms_eps);
}

void Gemma3Architecture::FinalNorm(const float* x, float* out) const {
  RmsNorm(x, model_->rms_final(), out, config().rms_eps);
}

}  // namespace kvcache::model
