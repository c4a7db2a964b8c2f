// HybridKv: a KvBackend on kvcache's HybridSequence (kvcache/hybrid.h), for
// models with sliding-window layers and for bounded memory by eviction.
//
// Layers. A layer the model gives a window W (AttentionShape::windows) is a
// kWindow layer (no sinks, window W): its heads keep the last W positions
// plus the slack and lookback, and in the paged layout its blocks go back
// to its group's pool as the window moves. The other layers are full, or
// carry the eviction policy:
//   streaming (StreamingLLM): every full layer a kWindow layer keeping the
//     first `sinks` positions and the last `window`; attention applies the
//     exact window (hybrid.h).
//   h2o (Heavy-Hitter Oracle): every kv head of a full layer keeps the last
//     `recent` positions plus the budget - recent others with the largest
//     attention mass accumulated so far; the mass of each pass is added
//     after its attention and the cache is evicted at the start of the next
//     pass.
// A chunk of n <= max_chunk_tokens tokens sees what the cache held before it
// plus the chunk itself (for windows exactly the window, via a lookback of
// max_chunk_tokens - 1), so chunk 1 gives the policies their decode-time
// behaviour; a longer pass is refused.
//
// Groups and formats: the full layers form HybridModel's full group, the
// window (and evicted) layers its bounded group; each group has its own
// format pair (`formats`, `bounded_formats`) and, paged, its own pool. A
// precision window applies to the full group.
//
// Thread safety: one sequence, one thread at a time; paged sequences may
// share pools across threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <optional>

#include "kvcache/format.h"
#include "kvcache/hybrid.h"
#include "kvcache/thread_pool.h"
#include "model/kv/kv_backend.h"
#include "model/kv/sequence_kv.h"

namespace kvcache::model {

struct EvictionSpec {
  enum class Kind : uint8_t { kNone, kStreaming, kH2o };
  Kind kind = Kind::kNone;
  uint32_t sinks = 0, window = 0;   // kStreaming
  uint32_t budget = 0, recent = 0;  // kH2o: recent >= 1, budget > recent

  bool enabled() const { return kind != Kind::kNone; }
  // Positions a bounded layer keeps at most: sinks + window, or the budget.
  uint32_t kept() const { return kind == Kind::kStreaming ? sinks + window : budget; }
  // "none", "streaming:4,1024", "h2o:256,32".
  std::string ToString() const;
};
// "streaming:SINKS,WINDOW" | "h2o:BUDGET,RECENT" | "none" (or "").
Result<EvictionSpec> ParseEvictionSpec(std::string_view text);

struct HybridKvOptions {
  FormatPair formats;                       // the full group's (and the bounded one's by default)
  std::optional<FormatPair> bounded_formats;  // the window / evicted layers' group, if different
  CacheLayout layout = CacheLayout::kContiguous;
  uint32_t block_size = 16;
  // Paged: the two groups' pools (HybridModel::CreatePools of a model this
  // shape and these options make: HybridKv::MakeModel), or empty to create
  // them with pool_blocks[g] blocks (0 = four sequences' worth).
  std::vector<std::shared_ptr<BlockPool>> pools;
  uint32_t pool_blocks[2] = {0, 0};
  // Threads for attention (AttentionOptions::pool); null: the caller's.
  ThreadPool* attention_pool = nullptr;
  PrecisionWindow window;  // the full group's bf16 sinks and recent rows
  EvictionSpec eviction;   // on the full layers
  // Largest pass (chunk) served with exact windows.
  uint32_t max_chunk_tokens = 512;
  // Window slack: a window head drops its oldest rows this many at a time
  // (HybridModelOptions). The default, attention's 512-row summation
  // segment (attention.h), keeps a window head's first stored position a
  // multiple of 512, so every query sums its window in the same segments
  // whatever the chunking: chunked prefill stays bit-identical to token by
  // token. A smaller slack (a multiple of block_size) saves memory
  // (up to 511 rows per window layer) and gives up that exactness.
  uint32_t window_slack_tokens = 512;
};

class HybridKv final : public SequenceKv<HybridSequence> {
 public:
  // InvalidArgument for a shape or options the hybrid cache cannot build
  // (the message names it: pools of the wrong geometry or formats, a
  // precision window with eviction, ...).
  static Result<std::unique_ptr<HybridKv>> Create(const AttentionShape& shape,
                                                  const HybridKvOptions& options);
  // The HybridModel a shape and options give (its groups, pools' geometry).
  static Result<std::shared_ptr<const HybridModel>> MakeModel(const AttentionShape& shape,
                                                              const HybridKvOptions& options);
  // Blocks one sequence holds in group g's pool once it has `tokens`
  // positions (the full group: every position; the bounded group: its
  // sinks and the window's rows that compaction kept; heavy hitters
  // approximately), and the most it holds at any length up to `tokens`
  // (for sizing pools).
  static uint64_t BlocksAt(const HybridModel& model, int group, uint64_t tokens);
  static uint64_t BlocksPerSequence(const HybridModel& model, int group, uint64_t tokens);

  Status Store(uint32_t layer, std::span<const float> k, std::span<const float> v) override;
  Status Attend(uint32_t layer, std::span<const float> q, std::span<float> out) override;

  const HybridSequence& sequence() const { return seq_; }
  // Admission control, paged: HybridSequence::Reserve (group g's most rows).
  // From then on every pass (Extend) first reserves what it will append
  // beyond that: a window group holds its kept rows plus the whole pass
  // until the pass's last layer has appended and the window drops what it
  // left, up to one pass more than the rows kept between passes. So a pass
  // that cannot have its blocks fails at Extend (PoolExhausted, nothing
  // stored: the caller preempts) rather than part way, where the window
  // layers that already appended would have dropped rows a rollback needs.
  Status Reserve(int group, uint32_t max_rows) {
    KV_RETURN_IF_ERROR(seq_.Reserve(group, max_rows));
    reserve_rows_[group] = max_rows;
    return Status::Ok();
  }

  // Prefix reuse (paged, HybridModel::window_blocks_aligned()): starts an
  // empty sequence from the full group's blocks of a prefix of P positions
  // and the window group's blocks of [WindowKeepFrom(P), P)
  // (HybridSequence::AdoptPrefix: takes over the caller's references; on
  // failure nothing changes and the caller keeps them). The next pass runs
  // from position P.
  Status AdoptPrefix(std::span<const uint32_t> full_blocks, std::shared_ptr<const Calibration> full_calibration,
                     std::span<const uint32_t> window_blocks,
                     std::shared_ptr<const Calibration> window_calibration);
  // What a prefix cache names: group g's block table, its logical blocks'
  // first positions and hashes, and the calibration its rows are encoded with.
  std::span<const uint32_t> block_table(int group) const { return seq_.group_cache(group)->block_table(); }
  Result<uint32_t> BlockFirstPosition(int group, uint32_t logical_block) const {
    return seq_.BlockFirstPosition(group, logical_block);
  }
  Status SetBlockHash(int group, uint32_t logical_block, uint64_t hash) {
    return seq_.SetBlockHash(group, logical_block, hash);
  }
  std::shared_ptr<const Calibration> calibration(int group) const { return seq_.group_cache(group)->calibration(); }

 private:
  HybridKv(const AttentionShape& shape, const HybridKvOptions& options, HybridSequence seq)
      : SequenceKv("hybrid kv", shape, std::move(seq)), options_(options) {}
  std::unique_ptr<SequenceKv> WithSequence(HybridSequence seq) const override {
    return std::unique_ptr<SequenceKv>(new HybridKv(shape_, options_, std::move(seq)));
  }
  // A pass no larger than max_chunk_tokens. H2O: evicts first.
  Status BeforePass(uint32_t len, uint32_t n) override;

  HybridKvOptions options_;
  uint32_t reserve_rows_[2] = {0, 0};  // Reserve's rows per group (0: never reserved)
  std::vector<float> kv_probs_;  // [n_kv_heads][stored rows] scratch (h2o)
};

}  // namespace kvcache::model
