// The decoder's view of one sequence's K/V storage: "store K/V for these
// positions, attend over everything stored so far".
//
// A forward pass over n new tokens calls Extend(n) once -- the n positions
// are part of the sequence from then on -- then for each layer in order
// Store(layer, k, v) for the n positions and Attend(layer, q, out); query i
// (0 <= i < n) sits at position num_tokens_before + i and sees positions
// 0 ..= its own (causal). A pass that fails part-way is undone with
// Truncate(num_tokens_before).
//
// Partial-depth passes (a draft running only layers [0, L')) store only
// those layers; Store(layer) requires the layer to hold every position
// before the pass, so deeper layers cannot be used until Truncate brings all
// layers back to a common length. Truncate rolls the sequence back (speculative
// rejection); Fork makes an independent sequence that shares the prefix.
//
// Implementations: NaiveKv (model/kv/naive_kv.h: plain f32 vectors, or rows
// round-tripped through a RowCodec, attention written out in scalar loops;
// the test reference) and CacheKv (model/kv/cache_kv.h: kvcache's sequence cache
// and attention kernels).
//
// Thread safety: one sequence, one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kvcache/status.h"

namespace kvcache::model {

// The attention shape the decoder asks for (GQA: n_heads query heads share
// n_kv_heads kv heads, query head h reads kv head h / (n_heads / n_kv_heads)).
// A layer with windows[l] = W > 0 is a sliding-window layer: the query at
// position p attends to positions p - W < P <= p (its own and the W - 1
// before it), as Gemma's and llama.cpp's sliding layers do.
struct AttentionShape {
  uint32_t n_layers = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, max_seq_len = 0;
  std::vector<uint32_t> windows = {};  // [n_layers], or empty: every layer full
  uint32_t q_dim() const { return n_heads * head_dim; }
  uint32_t kv_dim() const { return n_kv_heads * head_dim; }
  uint32_t window(uint32_t layer) const { return layer < windows.size() ? windows[layer] : 0; }
  bool has_windows() const {
    for (uint32_t w : windows) {
      if (w != 0) return true;
    }
    return false;
  }
};

class KvBackend {
 public:
  virtual ~KvBackend() = default;

  // The sequence length: the most positions any layer holds (including the
  // positions of an open pass).
  virtual uint32_t num_tokens() const = 0;

  // Makes room for n new positions in every layer. Fails without changing
  // anything (capacity, pool exhausted).
  virtual Status Extend(uint32_t n) = 0;
  // k, v: [n][kv_dim] for the n positions of the current pass, RoPE applied.
  virtual Status Store(uint32_t layer, std::span<const float> k, std::span<const float> v) = 0;
  // q: [n][q_dim] (RoPE applied) -> out: [n][q_dim], softmax(q k^T / sqrt(d)) v
  // per query head over its kv head, causal within the pass.
  virtual Status Attend(uint32_t layer, std::span<const float> q, std::span<float> out) = 0;
  // Drops positions >= num_tokens. OutOfRange past the end.
  virtual Status Truncate(uint32_t num_tokens) = 0;
  // An independent sequence with the same contents.
  virtual Result<std::unique_ptr<KvBackend>> Fork() = 0;
  // The sliding window layer `layer` attends over (AttentionShape), 0 for
  // every position. The decoder refuses a backend whose windows differ from
  // its model's.
  virtual uint32_t window(uint32_t layer) const {
    (void)layer;
    return 0;
  }
};

}  // namespace kvcache::model
