// The decoder: runs a model's forward pass over one or several sequences.
// It drives the pass -- the embedding of every token, the loop over layers,
// the residual adds, RoPE, K/V storage and attention -- and leaves the
// per-model math (norms, projections, MLP, output head) to the model's
// Architecture (model/arch/architecture.h; LLaMA: model/arch/llama.h).
// Activations f32; weights in their stored types through MatMul
// (model/tensor/matmul.h), the tokens of a pass batched into one product
// per matrix and the rows split over num_threads. RoPE rotates pairs
// (adjacent, or one value in each half: RopePairs) of each head's first
// `dims` values by (pos / scaling) * base^(-2i/dims), with each layer's
// parameters.
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
#include "model/arch/architecture.h"
#include "model/io/checkpoint.h"
#include "model/kv/kv_backend.h"
#include "model/tensor/matmul.h"
#include "model/tensor/ops.h"

namespace kvcache::model {

// One sequence's share of a batched pass (Decoder::ForwardBatch).
struct BatchItem {
  std::span<const int32_t> tokens;  // one token (a decode) or a chunk (a prefill)
  // This sequence's storage; distinct per item. With more than one thread
  // the items' Store/Attend calls run at the same time on different
  // threads, so backends may share only thread-safe state (a BlockPool).
  KvBackend* kv = nullptr;
  bool all_logits = false;          // logits for every token, or the last one only
};

// Where a pass spends its wall time (ForwardOptions::profile): the weight
// products (the classifier's included), attention (every item's RoPE, K/V
// store and attention), and the whole pass; the rest is norms, SwiGLU,
// residual adds and the embedding lookup. Added to, never reset.
struct PassProfile {
  double products_s = 0, attention_s = 0, total_s = 0;
  uint64_t passes = 0;
};

struct ForwardOptions {
  // Run only layers [0, n_layers) before the final norm and classifier (an
  // early-exit draft model sharing the full model's cache); 0 = all layers.
  uint32_t n_layers = 0;
  // When set, the pass adds its times here (a few clock reads per layer).
  PassProfile* profile = nullptr;
};

class Decoder {
 public:
  // num_threads: threads for the weight products and for the items of a
  // batched pass (the caller's included).
  explicit Decoder(const Model& model, uint32_t num_threads = 1);

  const Model& model() const { return *model_; }
  const ModelConfig& config() const { return model_->config(); }
  // The attention shape a KV backend for this model is created with (its
  // sliding-window layers' windows included).
  AttentionShape attention_shape() const;
  // The decoder's threads (null for one): a KV backend may run its attention
  // on them (CacheKvOptions::attention_pool) for a pass of a single sequence.
  ThreadPool* thread_pool() const { return pool_.get(); }

  // Runs `tokens` at positions kv.num_tokens() .. + tokens.size() - 1,
  // storing their K/V in `kv`. logits: [tokens.size()][vocab], or
  // [1][vocab] for the last token only. On failure kv is rolled back to
  // where it was. InvalidArgument for a bad token id, a logits size that is
  // neither, or running past max_seq_len.
  Status Forward(std::span<const int32_t> tokens, KvBackend& kv, std::span<float> logits,
                 const ForwardOptions& options = {});

  // One pass over several sequences (continuous batching): item i's tokens
  // run at positions items[i].kv->num_tokens() .. + n_i - 1. Each weight
  // matrix is applied once to all the step's tokens; RoPE, K/V storage and
  // attention are per item on its own slice and backend. logits: item i's
  // rows (n_i with all_logits, else 1) of [vocab] each, concatenated in item
  // order. A sequence's logits are bit-identical whatever else is in the
  // step and whatever the thread count (MatMul's contract; attention sees
  // the item alone), so Forward(tokens, kv) == ForwardBatch({{tokens, &kv}}).
  // Forward is exactly the one-item call. On failure every item's kv is
  // truncated back to where it was. InvalidArgument for no items, a null or
  // repeated kv, a kv whose layer windows differ from the model's
  // (attention_shape()), an item without tokens, a bad token id or a logits size
  // other than the rows' total; OutOfRange past max_seq_len; the backends'
  // errors (e.g. PoolExhausted) as they come.
  Status ForwardBatch(std::span<const BatchItem> items, std::span<float> logits,
                      const ForwardOptions& options = {});

 private:
  // ForwardBatch's checks (the errors documented there); *total = the
  // items' tokens.
  Status CheckBatch(std::span<const BatchItem> items, std::span<const float> logits,
                    const ForwardOptions& options, size_t* total) const;
  // Layer l of a pass over the items' n tokens (item i's from starts[i]):
  // x_ in, x_ out.
  // offs[i]: item i's first token in the step (items.size() + 1 entries).
  Status ForwardLayer(uint32_t l, std::span<const BatchItem> items,
                      std::span<const uint32_t> starts, std::span<const size_t> offs, uint32_t n,
                      PassProfile* profile);
  // The final norm and output head over the rows the items ask for.
  void Classify(std::span<const BatchItem> items, std::span<float> logits, PassProfile* profile);
  void Resize(uint32_t n);
  // The architecture's hooks' view of the scratch for n tokens.
  Pass MakePass(uint32_t n, PassProfile* profile);

  const Model* model_;
  std::unique_ptr<Architecture> arch_;
  std::vector<LayerAttention> layers_;  // arch_->Layer(l) for every layer
  std::unique_ptr<ThreadPool> pool_;  // null for one thread
  // Scratch, sized for n tokens on demand: [n][dim], [n][q_dim], [n][kv_dim], [n][hidden].
  std::vector<float> x_, xb_, q_, k_, v_, att_, hb_, hb2_;
  std::vector<Status> item_status_;  // per item of the step's attention
};

// Rotates each head's pairs (2i, 2i+1) of vec [n_heads][head_dim] for
// position pos (the whole head, no scaling; shared with tests).
void ApplyRope(float* vec, uint32_t n_heads, uint32_t head_dim, uint32_t pos, float theta = 10000.0f);

}  // namespace kvcache::model
