// A KvBackend with bounded memory: kvcache's HybridSequence with an eviction
// policy on every layer, for measuring eviction on a real model.
//   streaming (StreamingLLM): every layer a kWindow layer keeping the first
//     `sinks` positions and the last `window`; attention applies the exact
//     window (hybrid.h).
//   h2o (Heavy-Hitter Oracle): every kv head keeps the last `recent`
//     positions plus the budget - recent others with the largest attention
//     mass accumulated so far; the mass of each pass is added after its
//     attention and the cache is evicted at the start of the next pass.
// A chunk of n tokens sees what the cache held before it plus the chunk
// itself (for streaming exactly the window, via a lookback of the largest
// chunk), so chunk 1 gives the policies their decode-time behaviour.
//
// Thread safety: one sequence, one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kvcache/format.h"
#include "kvcache/hybrid.h"
#include "model/kv/kv_backend.h"
#include "model/kv/sequence_kv.h"

namespace kvcache::model {

struct EvictionSpec {
  enum class Kind : uint8_t { kNone, kStreaming, kH2o };
  Kind kind = Kind::kNone;
  uint32_t sinks = 0, window = 0;   // kStreaming
  uint32_t budget = 0, recent = 0;  // kH2o: recent >= 1, budget > recent
  // Largest pass (chunk) the backend must serve with exact windows.
  uint32_t max_chunk_tokens = 64;

  bool enabled() const { return kind != Kind::kNone; }
  // "none", "streaming:4,1024", "h2o:256,32".
  std::string ToString() const;
};
// "streaming:SINKS,WINDOW" | "h2o:BUDGET,RECENT" | "none" (or "").
Result<EvictionSpec> ParseEvictionSpec(std::string_view text);

class EvictKv final : public SequenceKv<HybridSequence> {
 public:
  static Result<std::unique_ptr<EvictKv>> Create(const AttentionShape& shape, FormatPair formats,
                                                 const EvictionSpec& spec);

  Status Store(uint32_t layer, std::span<const float> k, std::span<const float> v) override;
  Status Attend(uint32_t layer, std::span<const float> q, std::span<float> out) override;

  const HybridSequence& sequence() const { return seq_; }

 private:
  EvictKv(const AttentionShape& shape, const EvictionSpec& spec, HybridSequence seq)
      : SequenceKv("evict kv", shape, std::move(seq)), spec_(spec) {}
  std::unique_ptr<SequenceKv> WithSequence(HybridSequence seq) const override {
    return std::unique_ptr<SequenceKv>(new EvictKv(shape_, spec_, std::move(seq)));
  }
  // Streaming: a pass no larger than max_chunk_tokens. H2O: evicts first.
  Status BeforePass(uint32_t len, uint32_t n) override;

  EvictionSpec spec_;
  std::vector<float> kv_probs_;  // [n_kv_heads][stored rows] scratch (h2o)
};

}  // namespace kvcache::model
