// The decoder's forward pass: the loop over layers, RoPE, K/V storage and
// attention; the per-model math is the Architecture's.
#include "model/decoder/decoder.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace kvcache::model {

namespace {

// cs[2i] = cos, cs[2i + 1] = sin of pair i's angle at pos (2i < rope.dims).
void RopeAngles(const RopeParams& rope, uint32_t pos, float* cs) {
  const float p = static_cast<float>(pos) / rope.scaling;
  for (uint32_t i = 0; i < rope.dims; i += 2) {
    const float freq = 1.0f / std::pow(rope.base, static_cast<float>(i) / static_cast<float>(rope.dims));
    const float angle = p * freq;
    cs[i] = std::cos(angle);
    cs[i + 1] = std::sin(angle);
  }
}

// The first `dims` values of each head of vec [n_heads][head_dim], pair i
// being (2i, 2i+1) or (i, i + dims/2).
void RotatePairs(float* vec, uint32_t n_heads, uint32_t head_dim, uint32_t dims, RopePairs pairs,
                 const float* cs) {
  const uint32_t half = dims / 2;
  for (uint32_t i = 0; i < dims; i += 2) {
    const float c = cs[i], s = cs[i + 1];
    // The pair's two values: adjacent, or one in each half.
    const uint32_t first = pairs == RopePairs::kAdjacent ? i : i / 2;
    const uint32_t second = pairs == RopePairs::kAdjacent ? i + 1 : i / 2 + half;
    for (uint32_t h = 0; h < n_heads; ++h) {
      float* p = vec + static_cast<size_t>(h) * head_dim;
      const float a = p[first], b = p[second];
      p[first] = a * c - b * s;
      p[second] = a * s + b * c;
    }
  }
}

}  // namespace

void ApplyRope(float* vec, uint32_t n_heads, uint32_t head_dim, uint32_t pos, float theta) {
  const RopeParams rope{theta, head_dim, 1.0f};
  std::vector<float> cs(head_dim + 1);
  RopeAngles(rope, pos, cs.data());
  RotatePairs(vec, n_heads, head_dim, head_dim, RopePairs::kAdjacent, cs.data());
}

Decoder::Decoder(const Model& model, uint32_t num_threads)
    : model_(&model),
      arch_(MakeArchitecture(model)),
      pool_(num_threads > 1 ? std::make_unique<ThreadPool>(num_threads) : nullptr) {
  layers_.resize(config().n_layers);
  for (uint32_t l = 0; l < config().n_layers; ++l) layers_[l] = arch_->Layer(l);
}

AttentionShape Decoder::attention_shape() const {
  const ModelConfig& c = config();
  AttentionShape shape{c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim(), c.max_seq_len, {}};
  for (uint32_t l = 0; l < c.n_layers; ++l) {
    if (layers_[l].kind == AttentionKind::kSlidingWindow) {
      shape.windows.resize(c.n_layers, 0);
      shape.windows[l] = layers_[l].window;
    }
  }
  return shape;
}

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
    for (uint32_t l = 0; l < c.n_layers; ++l) {
      const uint32_t want = layers_[l].kind == AttentionKind::kSlidingWindow ? layers_[l].window : 0;
      if (item.kv->window(l) != want) {
        return Status::InvalidArgument(
            "forward: the kv backend attends layer " + std::to_string(l) + " over " +
            (item.kv->window(l) ? "a window of " + std::to_string(item.kv->window(l)) : std::string("every")) +
            " positions, the model's layer over " + (want ? "a window of " + std::to_string(want) : std::string("every")) +
            " (create the backend from Decoder::attention_shape())");
      }
    }
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

Pass Decoder::MakePass(uint32_t n, PassProfile* profile) {
  Pass p;
  p.n = n;
  p.x = x_.data();
  p.xb = xb_.data();
  p.q = q_.data();
  p.k = k_.data();
  p.v = v_.data();
  p.att = att_.data();
  p.hb = hb_.data();
  p.hb2 = hb2_.data();
  p.pool = pool_.get();
  p.products_s = profile ? &profile->products_s : nullptr;
  return p;
}

Status Decoder::ForwardLayer(uint32_t l, std::span<const BatchItem> items,
                             std::span<const uint32_t> starts, std::span<const size_t> offs,
                             uint32_t n, PassProfile* profile) {
  const ModelConfig& c = config();
  const uint32_t dim = c.dim, kv_dim = c.kv_dim(), hd = c.head_dim(), q_dim = c.n_heads * hd;
  const RopeParams& rope = layers_[l].rope;
  ThreadPool* pool = pool_.get();
  const Pass p = MakePass(n, profile);
  PhaseTimer attention(profile ? &profile->attention_s : nullptr);
  // The block's output (xb) into the residual stream, a share of the tokens
  // per thread.
  auto add_into_x = [&] {
    p.ForTokens([&](uint32_t t0, uint32_t t1) {
      for (size_t j = size_t{t0} * dim; j < size_t{t1} * dim; ++j) x_[j] += xb_[j];
    });
  };
  // Attention: the projections over every token, the rest per item.
  arch_->AttentionInputs(l, p);
  // Each item's RoPE, Store and Attend touch only its own rows and its own
  // backend, so the items run as parallel tasks (a sequence's bits do not
  // depend on which thread runs it); the first failure in item order wins.
  std::vector<Status>& status = item_status_;
  status.assign(items.size(), Status::Ok());
  auto attend_item = [&](uint32_t it, uint32_t) {
    const size_t off = offs[it], ni = items[it].tokens.size();
    // One position's angles serve its q and k heads (ApplyRope's values).
    thread_local std::vector<float> cs;
    cs.resize(rope.dims + 1);
    for (size_t i = 0; i < ni; ++i) {
      const uint32_t pos = starts[it] + static_cast<uint32_t>(i);
      RopeAngles(rope, pos, cs.data());
      RotatePairs(q_.data() + (off + i) * q_dim, c.n_heads, hd, rope.dims, rope.pairs, cs.data());
      RotatePairs(k_.data() + (off + i) * kv_dim, c.n_kv_heads, hd, rope.dims, rope.pairs, cs.data());
    }
    KvBackend& kv = *items[it].kv;
    status[it] = kv.Store(l, std::span<const float>(k_).subspan(off * kv_dim, ni * kv_dim),
                          std::span<const float>(v_).subspan(off * kv_dim, ni * kv_dim));
    if (!status[it].ok()) return;
    status[it] = kv.Attend(l, std::span<const float>(q_).subspan(off * q_dim, ni * q_dim),
                           std::span<float>(att_).subspan(off * q_dim, ni * q_dim));
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
  arch_->AttentionProjection(l, p);
  add_into_x();
  arch_->FeedForward(l, p);
  add_into_x();
  return Status::Ok();
}

void Decoder::Resize(uint32_t n) {
  const ModelConfig& c = config();
  const size_t nd = static_cast<size_t>(n) * c.dim, nkv = static_cast<size_t>(n) * c.kv_dim();
  const size_t nq = static_cast<size_t>(n) * c.n_heads * c.head_dim();
  x_.resize(nd);
  xb_.resize(nd);
  q_.resize(nq);
  att_.resize(nq);
  k_.resize(nkv);
  v_.resize(nkv);
  hb_.resize(static_cast<size_t>(n) * c.hidden_dim);
  hb2_.resize(static_cast<size_t>(n) * c.hidden_dim);
}

void Decoder::Classify(std::span<const BatchItem> items, std::span<float> logits, PassProfile* profile) {
  const uint32_t dim = config().dim;
  uint32_t rows = 0;
  size_t off = 0;
  for (const BatchItem& item : items) {
    const size_t ni = item.tokens.size();
    for (size_t i = item.all_logits ? 0 : ni - 1; i < ni; ++i, ++rows) {
      arch_->FinalNorm(x_.data() + (off + i) * dim, xb_.data() + size_t{rows} * dim);
    }
    off += ni;
  }
  MakePass(rows, profile).Product(arch_->OutputHead(), xb_.data(), logits.data());
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
  std::vector<uint32_t> starts(items.size());
  std::vector<size_t> offs(items.size() + 1, 0);
  for (size_t it = 0; it < items.size(); ++it) {
    size_t off = offs[it];
    for (int32_t t : items[it].tokens) {
      arch_->Embed(t, x_.data() + off++ * c.dim);
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
