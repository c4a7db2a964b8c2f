// The KV manager: everything a request's K/V needs from the block pools, the
// prefix cache and the offload tiers, in one place. The engine's scheduler
// asks it whether a request can be admitted or grow, and never sees a block;
// the decoder writes a request's rows through its KvSequence, which is the
// model's KV interface (model::KvBackend, model/kv/kv_backend.h). No other
// code of the engine touches the pool or the prefix cache for a request; the
// engine reads pool figures from Metrics().
//
// Groups. A model's layers fall into groups whose K/V live differently:
// every position (full attention), the last W positions (a sliding window),
// a fixed-size state (linear attention); see HybridModel in kvcache/hybrid.h.
// Each group has its own pool, so the blocks one group frees serve only that
// group, and a reservation is a block count per group (KvDemand). A
// full-attention model has one group; a model with sliding-window layers
// (AttentionShape::windows: Gemma 3) has two, its full layers and its window
// layers (HybridModel's full and bounded groups), and each of its sequences
// is a paged model::HybridKv over both pools. A window group's demand stops
// growing at its window: it holds at most window + slack + one chunk of
// positions (HybridKv::BlocksPerSequence), never the whole context, and the
// blocks that slide out of the window go back to its pool.
//
// A request's life: HashPrompt (when it is submitted), CanAdmit / Admit
// (adopting the longest cached prefix -- the prefix cache, then the tiers --
// of every token but the last, so one token always runs, then reserving the
// context plus one block), Publish after each pass (hashes the blocks that
// filled and names them in the prefix cache and the tiers), and the
// KvSequence's destruction (free or preemption: its published blocks stay
// cached).
//
// Reservations. What an admission reserves is the caller's choice
// (KvReservation): the engine's (the context plus one block) or the serving
// simulator's two policies (the uncached prompt; the worst case of every
// sample). Parallel samples are forks made by the manager (Fork): they share
// the prompt's blocks copy-on-write and each publishes its own blocks.
//
// Rows. A manager with rows (the engine) gives each request a paged
// model::CacheKv the decoder stores and attends through. A manager without
// rows (KvManagerOptions::rows false: the serving simulator, which computes
// no K/V) gives each request a block table alone: Extend and Truncate
// allocate and free the blocks rows would take (copy-on-write of a shared
// partial block included), so the pool's accounting -- blocks, references,
// reservations, the prefix cache's names and evictions -- is what the rows
// would make it, at the cost of a few integers per block. Store and Attend
// fail on such a sequence.
//
// Thread safety: one thread (the engine's step thread) for everything but
// Metrics, which any thread may call.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/window_blocks.h"
#include "kvcache/cache.h"
#include "kvcache/format.h"
#include "kvcache/pool.h"
#include "kvcache/serving/offload.h"
#include "kvcache/serving/prefix_cache.h"
#include "kvcache/status.h"
#include "kvcache/thread_pool.h"
#include "model/kv/cache_kv.h"
#include "model/kv/hybrid_kv.h"

namespace kvcache::engine {

// How a group's layers keep their positions (the kinds of HybridModel).
enum class KvGroupKind : uint8_t { kFullAttention, kSlidingWindow, kLinearState };
// "full", "window", "linear".
std::string_view KvGroupKindName(KvGroupKind kind);

struct KvManagerOptions {
  FormatPair formats;        // the K:V format of every sequence (the full layers')
  // The sliding-window layers' K:V format when it differs (window models only).
  std::optional<FormatPair> local_formats;
  PrecisionWindow window;    // bf16 sinks and recent rows (engine.h, EngineOptions::window)
  uint32_t block_size = 16;  // tokens per block
  uint64_t pool_bytes = 256ull << 20;  // all groups' pools together, bytes
  uint32_t pool_blocks = 0;  // > 0: blocks per group's pool instead of pool_bytes' share
  bool prefix_cache = true;  // adopt and publish full blocks
  std::string tiers;         // offload tiers (MakeTiers' spec); empty: none
  std::string model_id;      // the model's fingerprint, for the tiers
  // Tiers already built (instead of the `tiers` spec; needs the prefix cache).
  std::vector<std::shared_ptr<Tier>> tier_objects = {};
  // False: sequences hold block tables without K/V rows (see the file comment).
  bool rows = true;
  // Window models: the longest pass (prefill chunk) a sequence takes, and
  // the window slack (HybridKvOptions: the default keeps chunked prefill
  // bit-identical to token by token).
  uint32_t max_chunk_tokens = 256;
  uint32_t window_slack_tokens = 512;
  // Window models: pool_bytes is split so that both groups' pools hold the
  // same number of sequences of this length (0: max_seq_len; capped at it).
  // A sequence's window group stops growing at its window, so balancing at
  // the whole context would leave the window pool room for only as many
  // sequences as fit at full context, however short the real ones are.
  uint32_t pool_balance_tokens = 4096;
};

// What an admission reserves, beside the cached prefix it adopts.
enum class KvReservation : uint8_t {
  // The engine's: the context plus one block, capped at max_seq_len (with
  // rows, the only one). Appends past it take free blocks; when none are
  // left the caller preempts.
  kContextPlusBlock,
  // The uncached prompt blocks, plus one block per extra sample (its first
  // copy-on-write copy or new block). Decode grows from the free blocks;
  // when none are left the caller preempts.
  kPrompt,
  // The worst case: prompt + max_new_tokens + draft_tokens rows for every
  // sample (the extra samples share the prompt's full blocks). Appends
  // never fail, and blocks a truncation (rejected drafts) frees go back
  // into the reservation.
  kWorstCase,
};

struct KvAdmitOptions {
  KvReservation reservation = KvReservation::kContextPlusBlock;
  uint32_t samples = 1;         // this sequence and samples - 1 forks (KvManager::Fork)
  uint32_t max_new_tokens = 0;  // kWorstCase: the outputs still to come, per sample
  uint32_t draft_tokens = 0;    // kWorstCase: draft rows appended per step
  std::string salt;             // the prefix cache's namespace ("" = shared)
};

// Extends `hashes`, the chain hashes of the first full blocks of `tokens`
// under `salt`, to its first `full` blocks (tokens holds at least full *
// block_size tokens); a chain already that long is left as it is.
void ExtendChainHashes(std::span<const TokenId> tokens, uint32_t block_size, std::string_view salt,
                       size_t full, std::vector<BlockHash>* hashes);

// Blocks per group (KvManager::groups() order).
struct KvDemand {
  std::vector<uint64_t> blocks;
};

struct KvGroupMetrics {
  KvGroupKind kind = KvGroupKind::kFullAttention;
  uint64_t blocks_total = 0, blocks_free = 0, blocks_used = 0, blocks_cached = 0;
  uint64_t blocks_reserved = 0;  // promised to sequences, not yet drawn
  uint64_t evictions = 0;        // cached blocks the pool reclaimed, ever
};

// What an admission's prefix lookup found.
struct KvAdmission {
  // Prompt tokens adopted: [0] from the pool, [1 + t] from tier t.
  std::vector<uint64_t> served;
  // A lookup or adoption that failed (the prefix is then recomputed).
  Status adopt_error;
};

struct KvMetrics {
  std::vector<KvGroupMetrics> groups;
  uint64_t prefix_lookups = 0;  // counted lookups (one per admission)
  uint64_t tier_hit_blocks = 0, tier_miss_blocks = 0;
  PrefixCacheStats prefix;      // the prefix cache's counters (zero without it)
  WindowIndexStats window;      // a window model's window-block index (zero without it)
};

// One request's K/V: the model's KvBackend over the manager's pools (what
// the decoder stores and attends through; at present one group, a paged
// model::CacheKv, or a block table without rows) and what the manager knows
// of its publication. Its blocks and undrawn reservation go back to the pool
// when it is destroyed (its published blocks stay cached).
class KvSequence final : public model::KvBackend {
 public:
  ~KvSequence() override;
  // Positions computed (stored in every group).
  uint32_t num_tokens() const override { return kv_ ? kv_->num_tokens() : length_; }
  uint32_t window(uint32_t layer) const override { return kv_ ? kv_->window(layer) : 0; }
  // Without rows: takes the blocks n more rows need (copying a shared
  // partial last block first), from the reservation first; PoolExhausted
  // changes nothing.
  Status Extend(uint32_t n) override { return kv_ ? kv_->Extend(n) : ExtendBlocks(n); }
  Status Store(uint32_t layer, std::span<const float> k, std::span<const float> v) override {
    return kv_ ? kv_->Store(layer, k, v) : NoRows();
  }
  Status Attend(uint32_t layer, std::span<const float> q, std::span<float> out) override {
    return kv_ ? kv_->Attend(layer, q, out) : NoRows();
  }
  // Without rows: the blocks past num_tokens go back, tail first (into the
  // reservation under KvReservation::kWorstCase).
  Status Truncate(uint32_t num_tokens) override {
    return kv_ ? kv_->Truncate(num_tokens) : TruncateBlocks(num_tokens);
  }
  // A copy outside the manager (copy-on-write blocks of the same pool):
  // never published. KvManager::Fork makes a managed one.
  Result<std::unique_ptr<model::KvBackend>> Fork() override;

  // Prompt tokens adopted at admission (the prefix cache or a tier).
  uint32_t cached_tokens() const { return cached_tokens_; }
  bool has_rows() const { return kv_ != nullptr; }
  // Blocks reserved for it (and, until they are made, for its forks) and
  // not yet drawn; without rows only (0 with rows).
  uint64_t reserved_blocks() const;
  // Without rows: the table covers num_tokens() exactly (Internal if not).
  Status CheckBlocks() const;

 private:
  friend class KvManager;
  Status ExtendBlocks(uint32_t n);
  Status TruncateBlocks(uint32_t num_tokens);
  // The full group's block table (what the prefix cache names).
  std::span<const uint32_t> block_table() const;
  static Status NoRows();

  // With rows: kv_ is cache_ (a full-attention model) or hybrid_ (a model
  // with sliding-window layers).
  model::KvBackend* kv_ = nullptr;
  std::unique_ptr<model::CacheKv> cache_;
  std::unique_ptr<model::HybridKv> hybrid_;
  uint32_t cached_tokens_ = 0;
  size_t published_ = 0;          // blocks [0, published_) named in the prefix cache
  size_t window_published_ = 0;   // window blocks before chain index window_published_ named (or adopted)
  bool publish_stopped_ = false;  // stopped at a duplicate: no further
  std::string salt_;              // its prefix-cache namespace
  // Without rows: the blocks covering length_ rows (one pool reference
  // each), the undrawn reservation, and the shares reserved for the forks
  // still to be made (the next one last).
  std::shared_ptr<BlockPool> pool_;
  std::vector<uint32_t> table_;
  uint32_t length_ = 0;
  uint32_t reserved_ = 0;
  std::vector<uint32_t> fork_shares_;
  bool truncate_reserves_ = false;  // KvReservation::kWorstCase
};

class KvManager {
 public:
  // InvalidArgument for options that do not fit the model (a format its
  // head_dim cannot take, a pool smaller than one max_seq_len sequence, a
  // bad tier spec, tiers without the prefix cache or model_id, per-group
  // formats without window layers). A window model: Unimplemented without
  // rows or without a full-attention layer; InvalidArgument for tiers when
  // its prefix reuse is off (a precision window).
  // `attention_pool` (may be null) must outlive the manager.
  static Result<std::unique_ptr<KvManager>> Create(const model::AttentionShape& shape,
                                                   ThreadPool* attention_pool,
                                                   const KvManagerOptions& options);
  ~KvManager();

  bool prefix_caching() const { return offload_ != nullptr; }
  std::span<const KvGroupKind> groups() const { return kinds_; }

  // The chain hashes of the prompt's full blocks (empty without the prefix
  // cache): the names the prefix cache knows them by. The caller keeps them
  // with the request; Publish extends them.
  std::vector<BlockHash> HashPrompt(std::span<const int32_t> prompt) const;

  // The blocks per group a sequence of `tokens` positions (the context plus
  // one block, capped at max_seq_len) asks for at admission.
  KvDemand AdmissionDemand(size_t tokens) const;

  // Whether a request with this context could be admitted now, adopting
  // what the prefix cache holds (looked up without references or counting):
  // its demand, less the blocks it would adopt, plus the parked blocks
  // adopting takes out of the free ones, fits every group's pool.
  bool CanAdmit(std::span<const int32_t> tokens) const;

  // Adopts the longest cached prefix of tokens[0, size - 1) and reserves the
  // admission demand. PoolExhausted (nothing held) when the pools cannot
  // meet it; a failed adoption only means the prefix is recomputed
  // (`found`, if given, says so, and where the prefix came from).
  Result<std::unique_ptr<KvSequence>> Admit(std::span<const int32_t> tokens, KvAdmission* found = nullptr);
  // The same with a reservation choice and parallel samples (`tokens`: the
  // context; `options.samples` - 1 forks follow through Fork). The whole
  // reservation, the forks' shares included, is taken at once or not at
  // all (PoolExhausted: nothing held, the adopted prefix given back tail
  // first). Every lookup is counted. With rows, only kContextPlusBlock and
  // one sample (InvalidArgument otherwise).
  Result<std::unique_ptr<KvSequence>> Admit(std::span<const TokenId> tokens, const KvAdmitOptions& options,
                                            KvAdmission* found = nullptr);
  // A parallel sample of `parent` (after its prefill): shares every block
  // copy-on-write, takes the next share its admission reserved for forks
  // (none left: no reservation), and publishes its own blocks from where
  // the parent's publication stands.
  Result<std::unique_ptr<KvSequence>> Fork(KvSequence& parent);

  // True while `leader` will publish, and has not yet, a full block a
  // request with `tokens` and prompt chain `hashes` could adopt (the block
  // at the leader's publication point has the same chain hash in both).
  bool WillPublishFor(const KvSequence& leader, std::span<const BlockHash> leader_hashes,
                      std::span<const int32_t> tokens, std::span<const BlockHash> hashes) const;

  // Hashes the full blocks of `seq` whose positions `tokens` (its
  // committed tokens, at least) gives that filled since the last call
  // (extending `hashes`, the chain of `tokens`' full blocks) and publishes
  // them to the prefix cache and the tiers. Returns the blocks [0, end) of
  // seq now published. A duplicate chain (end short of the full blocks) or
  // an error stops publication for the sequence: the rest stays private.
  Result<size_t> Publish(KvSequence& seq, std::span<const int32_t> tokens, std::vector<BlockHash>* hashes);
  Result<size_t> Publish(KvSequence& seq, std::span<const TokenId> tokens, std::vector<BlockHash>* hashes);

  KvMetrics Metrics() const;
  // Metrics' pool figures alone (no prefix-cache or tier counters: cheap).
  std::vector<KvGroupMetrics> GroupMetrics() const;
  // The tiers' counters (none without tiers), and a wait until every
  // queued store has been written (the end of a run).
  OffloadStats tier_stats() const;
  void FlushTiers();
  // The pool's and the prefix cache's own checks (Internal on failure).
  Status CheckInvariants() const;

 private:
  KvManager(const model::AttentionShape& shape, ThreadPool* attention_pool,
            const KvManagerOptions& options);
  Status Init();
  // The positions an admission reserves: the context plus one block, capped
  // at max_seq_len (AdmissionDemand's blocks hold them).
  uint64_t AdmissionTokens(size_t tokens) const;
  // Group g's blocks for a sequence of `tokens` positions.
  uint64_t GroupBlocks(int group, uint64_t tokens) const;
  Status InitHybrid();
  size_t Adopt(model::CacheKv& kv, std::span<const int32_t> tokens, KvAdmission* found);
  Result<std::unique_ptr<KvSequence>> AdmitHybrid(std::span<const int32_t> tokens, KvAdmission* found);
  // Window models: the longest prefix of tokens[0, size - 1) whose full
  // blocks the prefix cache holds and whose window blocks (the run a
  // sequence of that length keeps) the window index holds: its length in
  // blocks, and the window run's first chain index.
  struct HybridHit {
    size_t blocks = 0, window_first = 0;
    std::vector<BlockHash> hashes;  // the prompt's full blocks' chain hashes
    std::vector<uint32_t> full_blocks;  // the full group's blocks of the hit (no references)
  };
  HybridHit FindHybridHit(std::span<const int32_t> tokens) const;
  // Adopts FindHybridHit's prefix into kv (both groups or neither); with
  // tiers, a longer prefix whose full blocks and window run they hold.
  size_t AdoptHybrid(model::HybridKv& kv, std::span<const int32_t> tokens, KvAdmission* found);
  // With tiers: extends `hit` to the longest full-chain prefix the pool and
  // the tiers hold (`full`: its blocks, one reference each, from the
  // offload cache's Acquire) if the window run that prefix needs is in the
  // window index or loads from the tiers (named in the index, parked).
  // Returns whether it did; `full` is unchanged either way.
  bool ExtendHitFromTiers(HybridHit& hit, const PrefixMatch& full, std::span<const TokenId> ids);
  // Names seq's full window blocks before chain index `full` in the window index.
  void PublishWindow(KvSequence& seq, size_t full, std::span<const BlockHash> hashes,
                     std::span<const TokenId> tokens);
  // Admission of a sequence without rows: the adopted prefix, then the
  // reservation `options` asks for.
  Result<std::unique_ptr<KvSequence>> AdmitBlocks(std::span<const TokenId> tokens,
                                                  const KvAdmitOptions& options, KvAdmission* found);

  const model::AttentionShape shape_;
  ThreadPool* const attention_pool_;
  const KvManagerOptions options_;
  std::vector<KvGroupKind> kinds_;  // [groups]
  std::vector<std::shared_ptr<BlockPool>> pools_;  // [groups]
  std::shared_ptr<BlockPool> pool_;  // pools_[0]: the full group's
  // Window models: the layer groups and the options of every sequence.
  std::shared_ptr<const HybridModel> hybrid_;
  model::HybridKvOptions hybrid_options_;
  std::unique_ptr<WindowBlockIndex> window_index_;  // the window group's prefix cache
  std::unique_ptr<PrefixCache> prefix_;
  std::unique_ptr<OffloadCache> offload_;  // over prefix_ (no tiers: names blocks only)
  // Window models with tiers: the window group's blocks to and from the
  // tiers (named by window_index_, not a prefix cache).
  std::unique_ptr<OffloadCache> window_offload_;
};

}  // namespace kvcache::engine
