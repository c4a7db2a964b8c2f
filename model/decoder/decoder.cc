// The reference decoder's forward pass.
#include "model/decoder/decoder.h"

#include <cmath>
#include <string>

namespace kvcache::model {

void RmsNorm(const float* x, std::span<const float> weight, float* out, float eps) {
  const size_t n = weight.size();
  float ss = 0;
  for (size_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (size_t i = 0; i < n; ++i) out[i] = weight[i] * (scale * x[i]);
}

void ApplyRope(float* vec, uint32_t n_heads, uint32_t head_dim, uint32_t pos, float theta) {
  for (uint32_t i = 0; i < head_dim; i += 2) {
    const float freq = 1.0f / std::pow(theta, static_cast<float>(i) / static_cast<float>(head_dim));
    const float angle = static_cast<float>(pos) * freq;
    const float c = std::cos(angle), s = std::sin(angle);
    for (uint32_t h = 0; h < n_heads; ++h) {
      float* p = vec + static_cast<size_t>(h) * head_dim + i;
      const float a = p[0], b = p[1];
      p[0] = a * c - b * s;
      p[1] = a * s + b * c;
    }
  }
}

void Softmax(float* x, uint32_t n) {
  float mx = x[0];
  for (uint32_t i = 1; i < n; ++i) mx = std::max(mx, x[i]);
  float sum = 0;
  for (uint32_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  for (uint32_t i = 0; i < n; ++i) x[i] /= sum;
}

Decoder::Decoder(const Model& model, uint32_t num_threads)
    : model_(&model), pool_(num_threads > 1 ? std::make_unique<ThreadPool>(num_threads) : nullptr) {}

AttentionShape Decoder::attention_shape() const {
  const ModelConfig& c = config();
  return {c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim(), c.max_seq_len};
}

namespace {

// RmsNorm of each of n rows of `dim` values.
void RmsNormRows(const float* x, std::span<const float> weight, float* out, uint32_t n,
                 uint32_t dim, float eps) {
  for (uint32_t i = 0; i < n; ++i) {
    RmsNorm(x + static_cast<size_t>(i) * dim, weight, out + static_cast<size_t>(i) * dim, eps);
  }
}

}  // namespace

Status Decoder::CheckPass(std::span<const int32_t> tokens, const KvBackend& kv,
                          std::span<const float> logits, const ForwardOptions& options) const {
  const ModelConfig& c = config();
  const uint32_t n = static_cast<uint32_t>(tokens.size());
  const uint32_t vocab = c.vocab_size;
  if (n == 0) return Status::InvalidArgument("forward: no tokens");
  if (options.n_layers > c.n_layers) {
    return Status::InvalidArgument("forward: n_layers " + std::to_string(options.n_layers) +
                                   " > the model's " + std::to_string(c.n_layers));
  }
  if (logits.size() != static_cast<size_t>(n) * vocab && logits.size() != vocab) {
    return Status::InvalidArgument("forward: logits has " + std::to_string(logits.size()) +
                                   " floats, want " + std::to_string(n) + " or 1 x vocab " +
                                   std::to_string(vocab));
  }
  for (int32_t t : tokens) {
    if (t < 0 || static_cast<uint32_t>(t) >= vocab) {
      return Status::InvalidArgument("forward: token " + std::to_string(t) +
                                     " is outside the vocabulary");
    }
  }
  const uint32_t start = kv.num_tokens();
  if (start + n > c.max_seq_len) {
    return Status::OutOfRange("forward: positions up to " + std::to_string(start + n) +
                              " exceed max_seq_len " + std::to_string(c.max_seq_len));
  }
  return Status::Ok();
}

Status Decoder::ForwardLayer(uint32_t l, uint32_t n, uint32_t start, KvBackend& kv) {
  const ModelConfig& c = config();
  const uint32_t dim = c.dim, kv_dim = c.kv_dim(), hd = c.head_dim();
  const LayerWeights& w = model_->layer(l);
  ThreadPool* pool = pool_.get();
  auto add_into_x = [&] {
    for (size_t j = 0; j < static_cast<size_t>(n) * dim; ++j) x_[j] += xb_[j];
  };
  // Attention.
  RmsNormRows(x_.data(), w.rms_att, xb_.data(), n, dim, c.rms_eps);
  MatMul(w.wq, xb_.data(), n, q_.data(), pool);
  MatMul(w.wk, xb_.data(), n, k_.data(), pool);
  MatMul(w.wv, xb_.data(), n, v_.data(), pool);
  for (uint32_t i = 0; i < n; ++i) {
    ApplyRope(q_.data() + static_cast<size_t>(i) * dim, c.n_heads, hd, start + i, c.rope_theta);
    ApplyRope(k_.data() + static_cast<size_t>(i) * kv_dim, c.n_kv_heads, hd, start + i, c.rope_theta);
  }
  KV_RETURN_IF_ERROR(kv.Store(l, k_, v_));
  KV_RETURN_IF_ERROR(kv.Attend(l, q_, att_));
  MatMul(w.wo, att_.data(), n, xb_.data(), pool);
  add_into_x();
  // SwiGLU feed-forward.
  RmsNormRows(x_.data(), w.rms_ffn, xb_.data(), n, dim, c.rms_eps);
  MatMul(w.w1, xb_.data(), n, hb_.data(), pool);
  MatMul(w.w3, xb_.data(), n, hb2_.data(), pool);
  for (size_t j = 0; j < hb_.size(); ++j) {
    const float a = hb_[j];
    hb_[j] = a / (1.0f + std::exp(-a)) * hb2_[j];
  }
  MatMul(w.w2, hb_.data(), n, xb_.data(), pool);
  add_into_x();
  return Status::Ok();
}

Status Decoder::Forward(std::span<const int32_t> tokens, KvBackend& kv, std::span<float> logits,
                        const ForwardOptions& options) {
  KV_RETURN_IF_ERROR(CheckPass(tokens, kv, logits, options));
  const ModelConfig& c = config();
  const uint32_t n = static_cast<uint32_t>(tokens.size());
  const uint32_t dim = c.dim, hidden = c.hidden_dim;
  const uint32_t n_layers = options.n_layers ? options.n_layers : c.n_layers;
  const bool all_logits = logits.size() == static_cast<size_t>(n) * c.vocab_size;
  const size_t nd = static_cast<size_t>(n) * dim, nkv = static_cast<size_t>(n) * c.kv_dim();
  x_.resize(nd);
  xb_.resize(nd);
  q_.resize(nd);
  att_.resize(nd);
  k_.resize(nkv);
  v_.resize(nkv);
  hb_.resize(static_cast<size_t>(n) * hidden);
  hb2_.resize(static_cast<size_t>(n) * hidden);

  const Model& m = *model_;
  for (uint32_t i = 0; i < n; ++i) {
    m.embedding().DecodeRows(static_cast<uint32_t>(tokens[i]), 1, x_.data() + static_cast<size_t>(i) * dim);
  }
  const uint32_t start = kv.num_tokens();
  KV_RETURN_IF_ERROR(kv.Extend(n));
  for (uint32_t l = 0; l < n_layers; ++l) {
    Status s = ForwardLayer(l, n, start, kv);
    if (!s.ok()) {
      (void)kv.Truncate(start);
      return s;
    }
  }
  const uint32_t first = all_logits ? 0 : n - 1;
  RmsNormRows(x_.data() + static_cast<size_t>(first) * dim, m.rms_final(), xb_.data(), n - first, dim,
              c.rms_eps);
  MatMul(m.classifier(), xb_.data(), n - first, logits.data(), pool_.get());
  return Status::Ok();
}

}  // namespace kvcache::model
