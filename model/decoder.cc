// The reference decoder's forward pass.
#include "model/decoder.h"

#include <cmath>
#include <string>

namespace kvcache::model {

void MatVec(std::span<const float> w, const float* x, uint32_t rows, uint32_t cols, float* out) {
  for (uint32_t r = 0; r < rows; ++r) {
    const float* row = w.data() + static_cast<size_t>(r) * cols;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    uint32_t c = 0;
    for (; c + 8 <= cols; c += 8) {
      for (int j = 0; j < 8; ++j) acc[j] += row[c + j] * x[c + j];
    }
    for (; c < cols; ++c) acc[c % 8] += row[c] * x[c];
    out[r] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  }
}

void RmsNorm(const float* x, std::span<const float> weight, float* out) {
  const size_t n = weight.size();
  float ss = 0;
  for (size_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(ss / static_cast<float>(n) + 1e-5f);
  for (size_t i = 0; i < n; ++i) out[i] = weight[i] * (scale * x[i]);
}

void ApplyRope(float* vec, uint32_t n_heads, uint32_t head_dim, uint32_t pos) {
  for (uint32_t i = 0; i < head_dim; i += 2) {
    const float freq = 1.0f / std::pow(10000.0f, static_cast<float>(i) / static_cast<float>(head_dim));
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

Decoder::Decoder(const Model& model) : model_(&model) {}

AttentionShape Decoder::attention_shape() const {
  const ModelConfig& c = config();
  return {c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim(), c.max_seq_len};
}

Status Decoder::Forward(std::span<const int32_t> tokens, KvBackend& kv, std::span<float> logits,
                        const ForwardOptions& options) {
  const ModelConfig& c = config();
  const uint32_t n = static_cast<uint32_t>(tokens.size());
  const uint32_t dim = c.dim, kv_dim = c.kv_dim(), hidden = c.hidden_dim, vocab = c.vocab_size;
  const uint32_t hd = c.head_dim();
  if (n == 0) return Status::InvalidArgument("forward: no tokens");
  if (options.n_layers > c.n_layers) {
    return Status::InvalidArgument("forward: n_layers " + std::to_string(options.n_layers) +
                                   " > the model's " + std::to_string(c.n_layers));
  }
  const uint32_t n_layers = options.n_layers ? options.n_layers : c.n_layers;
  const bool all_logits = logits.size() == static_cast<size_t>(n) * vocab;
  if (!all_logits && logits.size() != vocab) {
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
  x_.resize(static_cast<size_t>(n) * dim);
  xb_.resize(static_cast<size_t>(n) * dim);
  q_.resize(static_cast<size_t>(n) * dim);
  att_.resize(static_cast<size_t>(n) * dim);
  k_.resize(static_cast<size_t>(n) * kv_dim);
  v_.resize(static_cast<size_t>(n) * kv_dim);
  hb_.resize(hidden);
  hb2_.resize(hidden);

  const Model& m = *model_;
  for (uint32_t i = 0; i < n; ++i) {
    const float* e = m.embedding().data() + static_cast<size_t>(tokens[i]) * dim;
    std::copy(e, e + dim, x_.data() + static_cast<size_t>(i) * dim);
  }
  KV_RETURN_IF_ERROR(kv.Extend(n));
  auto fail = [&](Status s) {
    (void)kv.Truncate(start);
    return s;
  };
  for (uint32_t l = 0; l < n_layers; ++l) {
    const LayerWeights& w = m.layer(l);
    for (uint32_t i = 0; i < n; ++i) {
      float* xi = x_.data() + static_cast<size_t>(i) * dim;
      float* xb = xb_.data() + static_cast<size_t>(i) * dim;
      float* q = q_.data() + static_cast<size_t>(i) * dim;
      float* k = k_.data() + static_cast<size_t>(i) * kv_dim;
      float* v = v_.data() + static_cast<size_t>(i) * kv_dim;
      RmsNorm(xi, w.rms_att, xb);
      MatVec(w.wq, xb, dim, dim, q);
      MatVec(w.wk, xb, kv_dim, dim, k);
      MatVec(w.wv, xb, kv_dim, dim, v);
      ApplyRope(q, c.n_heads, hd, start + i);
      ApplyRope(k, c.n_kv_heads, hd, start + i);
    }
    Status s = kv.Store(l, k_, v_);
    if (!s.ok()) return fail(std::move(s));
    s = kv.Attend(l, q_, att_);
    if (!s.ok()) return fail(std::move(s));
    for (uint32_t i = 0; i < n; ++i) {
      float* xi = x_.data() + static_cast<size_t>(i) * dim;
      float* xb = xb_.data() + static_cast<size_t>(i) * dim;
      MatVec(w.wo, att_.data() + static_cast<size_t>(i) * dim, dim, dim, xb);
      for (uint32_t j = 0; j < dim; ++j) xi[j] += xb[j];
      RmsNorm(xi, w.rms_ffn, xb);
      MatVec(w.w1, xb, hidden, dim, hb_.data());
      MatVec(w.w3, xb, hidden, dim, hb2_.data());
      for (uint32_t j = 0; j < hidden; ++j) {
        const float a = hb_[j];
        hb_[j] = a / (1.0f + std::exp(-a)) * hb2_[j];
      }
      MatVec(w.w2, hb_.data(), dim, hidden, xb);
      for (uint32_t j = 0; j < dim; ++j) xi[j] += xb[j];
    }
  }
  for (uint32_t i = all_logits ? 0 : n - 1; i < n; ++i) {
    float* xi = x_.data() + static_cast<size_t>(i) * dim;
    float* xb = xb_.data() + static_cast<size_t>(i) * dim;
    RmsNorm(xi, m.rms_final(), xb);
    MatVec(m.classifier(), xb, vocab, dim, logits.data() + (all_logits ? static_cast<size_t>(i) * vocab : 0));
  }
  return Status::Ok();
}

}  // namespace kvcache::model
