// The reference LLaMA decoder: token embedding, then per layer
//   x += Wo * Attention(RoPE(Wq * RMSNorm(x)), RoPE(Wk * RMSNorm(x)), Wv * RMSNorm(x))
//   x += W2 * (SiLU(W1 * RMSNorm(x)) * (W3 * RMSNorm(x)))
// then the final RMSNorm and the classifier. Activations f32; weights in
// their stored types through MatMul (model/decoder/matmul.h), the tokens of a pass
// batched into one product per matrix and the rows split over num_threads.
// RoPE as llama2.c and GGUF's llama layout (pairs (2i, 2i+1) of each head
// rotated by pos * theta^(-2i/head_dim), theta = config().rope_theta).
// Attention is delegated to a KvBackend, so the same decoder runs on the naive
// reference storage and on kvcache's caches.
//
// Every per-token computation other than attention is done in a fixed order
// per token (MatMul computes each token's products the same way whatever the
// batch or thread count), so a multi-token pass gives bit-identical results
// to single-token passes wherever the backend's attention does.
//
// Thread safety: a Decoder owns scratch buffers; use one per thread. The
// Model it points to must outlive it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kvcache/status.h"
#include "model/decoder/matmul.h"
#include "model/io/checkpoint.h"
#include "model/kv/kv_backend.h"

namespace kvcache::model {

struct ForwardOptions {
  // Run only layers [0, n_layers) before the final norm and classifier (an
  // early-exit draft model sharing the full model's cache); 0 = all layers.
  uint32_t n_layers = 0;
};

class Decoder {
 public:
  // num_threads: threads for the weight products (the caller's included).
  explicit Decoder(const Model& model, uint32_t num_threads = 1);

  const Model& model() const { return *model_; }
  const ModelConfig& config() const { return model_->config(); }
  AttentionShape attention_shape() const;

  // Runs `tokens` at positions kv.num_tokens() .. + tokens.size() - 1,
  // storing their K/V in `kv`. logits: [tokens.size()][vocab], or
  // [1][vocab] for the last token only. On failure kv is rolled back to
  // where it was. InvalidArgument for a bad token id, a logits size that is
  // neither, or running past max_seq_len.
  Status Forward(std::span<const int32_t> tokens, KvBackend& kv, std::span<float> logits,
                 const ForwardOptions& options = {});

 private:
  // Forward's checks (the errors documented there).
  Status CheckPass(std::span<const int32_t> tokens, const KvBackend& kv,
                   std::span<const float> logits, const ForwardOptions& options) const;
  // Layer l of a pass of n tokens from position start: x_ in, x_ out.
  Status ForwardLayer(uint32_t l, uint32_t n, uint32_t start, KvBackend& kv);

  const Model* model_;
  std::unique_ptr<ThreadPool> pool_;  // null for one thread
  // Scratch, sized for n tokens on demand: [n][dim], [n][q_dim], [n][kv_dim], [n][hidden].
  std::vector<float> x_, xb_, q_, k_, v_, att_, hb_, hb2_;
};

// Plain helpers, shared with tests.
// out = weight * x / sqrt(mean(x^2) + eps).
void RmsNorm(const float* x, std::span<const float> weight, float* out, float eps = 1e-5f);
// Rotates each head's pairs (2i, 2i+1) of vec [n_heads][head_dim] for position pos.
void ApplyRope(float* vec, uint32_t n_heads, uint32_t head_dim, uint32_t pos, float theta = 10000.0f);
// In-place softmax over n values.
void Softmax(float* x, uint32_t n);

}  // namespace kvcache::model
