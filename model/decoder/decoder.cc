// The reference decoder's forward pass.
#include "model/decoder/decoder.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

namespace kvcache::model {

void RmsNorm(const float* x, std::span<const float> weight, float* out, float eps) {
  const size_t n = weight.size();
  float ss = 0;
  for (size_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (size_t i = 0; i < n; ++i) out[i] = weight[i] * (scale * x[i]);
}

namespace {

// cs[i] = cos, cs[i + 1] = sin of pair i's angle at pos (i even, < head_dim).
void RopeAngles(uint32_t head_dim, uint32_t pos, float theta, float* cs) {
  for (uint32_t i = 0; i < head_dim; i += 2) {
    const float freq = 1.0f / std::pow(theta, static_cast<float>(i) / static_cast<float>(head_dim));
    const float angle = static_cast<float>(pos) * freq;
    cs[i] = std::cos(angle);
    cs[i + 1] = std::sin(angle);
  }
}

void RotatePairs(float* vec, uint32_t n_heads, uint32_t head_dim, const float* cs) {
  for (uint32_t i = 0; i < head_dim; i += 2) {
    const float c = cs[i], s = cs[i + 1];
    for (uint32_t h = 0; h < n_heads; ++h) {
      float* p = vec + static_cast<size_t>(h) * head_dim + i;
      const float a = p[0], b = p[1];
      p[0] = a * c - b * s;
      p[1] = a * s + b * c;
    }
  }
}

}  // namespace

void ApplyRope(float* vec, uint32_t n_heads, uint32_t head_dim, uint32_t pos, float theta) {
  std::vector<float> cs(head_dim + 1);
  RopeAngles(head_dim, pos, theta, cs.data());
  RotatePairs(vec, n_heads, head_dim, cs.data());
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

// Adds the wall time between Start and Stop to *acc (nothing when acc is null).
class PhaseTimer {
 public:
  explicit PhaseTimer(double* acc) : acc_(acc) {}
  void Start() {
    if (acc_ != nullptr) t0_ = std::chrono::steady_clock::now();
  }
  void Stop() {
    if (acc_ != nullptr) *acc_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  double* acc_;
  std::chrono::steady_clock::time_point t0_;
};

// f(t0, t1) over tokens [0, n), split over the pool's threads when there are
// enough tokens to pay for the hand-off. Every token's values are computed
// by the same code whatever the split, so the split changes no bit.
template <class F>
void ForTokens(ThreadPool* pool, uint32_t n, const F& f) {
  constexpr uint32_t kMinTokensToSplit = 8;
  if (pool == nullptr || n < kMinTokensToSplit) {
    f(0u, n);
    return;
  }
  const uint32_t parts = std::min(pool->num_threads(), n);
  pool->ParallelFor(parts, [&](uint32_t p, uint32_t) {
    f(static_cast<uint32_t>(uint64_t{n} * p / parts), static_cast<uint32_t>(uint64_t{n} * (p + 1) / parts));
  });
}

// RmsNorm of each of n rows of `dim` values.
void RmsNormRows(const float* x, std::span<const float> weight, float* out, uint32_t n,
                 uint32_t dim, float eps) {
  for (uint32_t i = 0; i < n; ++i) {
    RmsNorm(x + static_cast<size_t>(i) * dim, weight, out + static_cast<size_t>(i) * dim, eps);
  }
}

}  // namespace

Status Decoder::CheckBatch(std::span<const BatchItem> items, std::span<const float> logits,
                           const ForwardOptions& options, size_t* total) const {
  const ModelConfig& c = config();
  const uint32_t vocab = c.vocab_size;
  if (items.empty()) return Status::InvalidArgument("forward: no items");
  if (options.n_layers > c.n_layers) {
    return Status::InvalidArgument("forward: n_layers " + std::to_string(options.n_layers) +
                                   " > the model's " + std::to_string(c.n_layers));
  }
  std::vector<const KvBackend*> seen;
  size_t tokens = 0, rows = 0;
  for (const BatchItem& item : items) {
    if (item.kv == nullptr) return Status::InvalidArgument("forward: an item without a kv backend");
    if (std::find(seen.begin(), seen.end(), item.kv) != seen.end()) {
      return Status::InvalidArgument("forward: two items share one kv backend");
    }
    seen.push_back(item.kv);
    const uint32_t n = static_cast<uint32_t>(item.tokens.size());
    if (n == 0) return Status::InvalidArgument("forward: no tokens");
    for (int32_t t : item.tokens) {
      if (t < 0 || static_cast<uint32_t>(t) >= vocab) {
        return Status::InvalidArgument("forward: token " + std::to_string(t) +
                                       " is outside the vocabulary");
      }
    }
    const uint32_t start = item.kv->num_tokens();
    if (uint64_t{start} + n > c.max_seq_len) {
      return Status::OutOfRange("forward: positions up to " + std::to_string(uint64_t{start} + n) +
                                " exceed max_seq_len " + std::to_string(c.max_seq_len));
    }
    tokens += n;
    rows += item.all_logits ? n : 1;
  }
  if (logits.size() != rows * vocab) {
    return Status::InvalidArgument("forward: logits has " + std::to_string(logits.size()) +
                                   " floats, want " + std::to_string(rows) + " x vocab " +
                                   std::to_string(vocab));
  }
  *total = tokens;
  return Status::Ok();
}

Status Decoder::ForwardLayer(uint32_t l, std::span<const BatchItem> items,
                             std::span<const uint32_t> starts, std::span<const size_t> offs,
                             uint32_t n, PassProfile* profile) {
  const ModelConfig& c = config();
  const uint32_t dim = c.dim, kv_dim = c.kv_dim(), hd = c.head_dim();
  const LayerWeights& w = model_->layer(l);
  ThreadPool* pool = pool_.get();
  PhaseTimer products(profile ? &profile->products_s : nullptr);
  PhaseTimer attention(profile ? &profile->attention_s : nullptr);
  // The per-token work outside the products and attention (norms, residual
  // adds, SwiGLU) over the pool's threads, a share of the tokens each.
  auto add_into_x = [&] {
    ForTokens(pool, n, [&](uint32_t t0, uint32_t t1) {
      for (size_t j = size_t{t0} * dim; j < size_t{t1} * dim; ++j) x_[j] += xb_[j];
    });
  };
  auto norm_rows = [&](std::span<const float> weight) {
    ForTokens(pool, n, [&](uint32_t t0, uint32_t t1) {
      RmsNormRows(x_.data() + size_t{t0} * dim, weight, xb_.data() + size_t{t0} * dim, t1 - t0, dim, c.rms_eps);
    });
  };
  // Attention: the projections over every token, the rest per item.
  norm_rows(w.rms_att);
  products.Start();
  MatMul(w.wq, xb_.data(), n, q_.data(), pool);
  MatMul(w.wk, xb_.data(), n, k_.data(), pool);
  MatMul(w.wv, xb_.data(), n, v_.data(), pool);
  products.Stop();
  // Each item's RoPE, Store and Attend touch only its own rows and its own
  // backend, so the items run as parallel tasks (a sequence's bits do not
  // depend on which thread runs it); the first failure in item order wins.
  std::vector<Status>& status = item_status_;
  status.assign(items.size(), Status::Ok());
  auto attend_item = [&](uint32_t it, uint32_t) {
    const size_t off = offs[it], ni = items[it].tokens.size();
    // One position's angles serve its q and k heads (ApplyRope's values).
    thread_local std::vector<float> cs;
    cs.resize(hd + 1);
    for (size_t i = 0; i < ni; ++i) {
      const uint32_t pos = starts[it] + static_cast<uint32_t>(i);
      RopeAngles(hd, pos, c.rope_theta, cs.data());
      RotatePairs(q_.data() + (off + i) * dim, c.n_heads, hd, cs.data());
      RotatePairs(k_.data() + (off + i) * kv_dim, c.n_kv_heads, hd, cs.data());
    }
    KvBackend& kv = *items[it].kv;
    status[it] = kv.Store(l, std::span<const float>(k_).subspan(off * kv_dim, ni * kv_dim),
                          std::span<const float>(v_).subspan(off * kv_dim, ni * kv_dim));
    if (!status[it].ok()) return;
    status[it] = kv.Attend(l, std::span<const float>(q_).subspan(off * dim, ni * dim),
                           std::span<float>(att_).subspan(off * dim, ni * dim));
  };
  const uint32_t num_items = static_cast<uint32_t>(items.size());
  attention.Start();
  if (pool != nullptr && num_items > 1) {
    pool->ParallelFor(num_items, attend_item);
  } else {
    for (uint32_t it = 0; it < num_items; ++it) attend_item(it, 0);
  }
  attention.Stop();
  for (const Status& st : status) KV_RETURN_IF_ERROR(st);
  products.Start();
  MatMul(w.wo, att_.data(), n, xb_.data(), pool);
  products.Stop();
  add_into_x();
  // SwiGLU feed-forward.
  norm_rows(w.rms_ffn);
  products.Start();
  MatMul(w.w1, xb_.data(), n, hb_.data(), pool);
  MatMul(w.w3, xb_.data(), n, hb2_.data(), pool);
  products.Stop();
  ForTokens(pool, n, [&](uint32_t t0, uint32_t t1) {
    for (size_t j = size_t{t0} * c.hidden_dim; j < size_t{t1} * c.hidden_dim; ++j) {
      const float a = hb_[j];
      hb_[j] = a / (1.0f + std::exp(-a)) * hb2_[j];
    }
  });
  products.Start();
  MatMul(w.w2, hb_.data(), n, xb_.data(), pool);
  products.Stop();
  add_into_x();
  return Status::Ok();
}

void Decoder::Resize(uint32_t n) {
  const ModelConfig& c = config();
  const size_t nd = static_cast<size_t>(n) * c.dim, nkv = static_cast<size_t>(n) * c.kv_dim();
  x_.resize(nd);
  xb_.resize(nd);
  q_.resize(nd);
  att_.resize(nd);
  k_.resize(nkv);
  v_.resize(nkv);
  hb_.resize(static_cast<size_t>(n) * c.hidden_dim);
  hb2_.resize(static_cast<size_t>(n) * c.hidden_dim);
}

void Decoder::Classify(std::span<const BatchItem> items, std::span<float> logits, PassProfile* profile) {
  const ModelConfig& c = config();
  const Model& m = *model_;
  const uint32_t dim = c.dim;
  uint32_t rows = 0;
  size_t off = 0;
  for (const BatchItem& item : items) {
    const size_t ni = item.tokens.size();
    for (size_t i = item.all_logits ? 0 : ni - 1; i < ni; ++i, ++rows) {
      RmsNorm(x_.data() + (off + i) * dim, m.rms_final(), xb_.data() + size_t{rows} * dim, c.rms_eps);
    }
    off += ni;
  }
  PhaseTimer products(profile ? &profile->products_s : nullptr);
  products.Start();
  MatMul(m.classifier(), xb_.data(), rows, logits.data(), pool_.get());
  products.Stop();
}

Status Decoder::Forward(std::span<const int32_t> tokens, KvBackend& kv, std::span<float> logits,
                        const ForwardOptions& options) {
  const size_t n = tokens.size(), vocab = config().vocab_size;
  if (n > 0 && logits.size() != n * vocab && logits.size() != vocab) {
    return Status::InvalidArgument("forward: logits has " + std::to_string(logits.size()) +
                                   " floats, want " + std::to_string(n) + " or 1 x vocab " +
                                   std::to_string(vocab));
  }
  const BatchItem item{tokens, &kv, n > 1 && logits.size() == n * vocab};
  return ForwardBatch(std::span<const BatchItem>(&item, 1), logits, options);
}

Status Decoder::ForwardBatch(std::span<const BatchItem> items, std::span<float> logits,
                             const ForwardOptions& options) {
  size_t total = 0;
  KV_RETURN_IF_ERROR(CheckBatch(items, logits, options, &total));
  PhaseTimer whole(options.profile ? &options.profile->total_s : nullptr);
  whole.Start();
  const ModelConfig& c = config();
  const uint32_t n = static_cast<uint32_t>(total);
  const uint32_t n_layers = options.n_layers ? options.n_layers : c.n_layers;
  Resize(n);
  const Model& m = *model_;
  std::vector<uint32_t> starts(items.size());
  std::vector<size_t> offs(items.size() + 1, 0);
  for (size_t it = 0; it < items.size(); ++it) {
    size_t off = offs[it];
    for (int32_t t : items[it].tokens) {
      m.embedding().DecodeRows(static_cast<uint32_t>(t), 1, x_.data() + off++ * c.dim);
    }
    offs[it + 1] = off;
    starts[it] = items[it].kv->num_tokens();
  }
  auto roll_back = [&](size_t count) {
    for (size_t it = 0; it < count; ++it) (void)items[it].kv->Truncate(starts[it]);
  };
  for (size_t it = 0; it < items.size(); ++it) {
    Status s = items[it].kv->Extend(static_cast<uint32_t>(items[it].tokens.size()));
    if (!s.ok()) {
      roll_back(it);
      return s;
    }
  }
  for (uint32_t l = 0; l < n_layers; ++l) {
    Status s = ForwardLayer(l, items, starts, offs, n, options.profile);
    if (!s.ok()) {
      roll_back(items.size());
      return s;
    }
  }
  Classify(items, logits, options.profile);
  whole.Stop();
  if (options.profile != nullptr) ++options.profile->passes;
  return Status::Ok();
}

}  // namespace kvcache::model
