// Hybrid models: one sequence cache over layers of different kinds, with
// speculative decoding as a transaction and per-head eviction.
//
// Layer kinds (HybridModel, one LayerSpec per layer):
//   kFull    attention over every stored position. Per-head eviction
//            policies (eviction.h) may bound some heads: DuoAttention-style
//            windows, H2O heavy hitters, dead heads.
//   kWindow  sliding window: every head keeps `sink_tokens` first positions
//            plus the last `window_tokens`; memory stays bounded.
//   kLinear  no K/V: a LinearState (linear_state.h) per layer, f64
//            [n_kv_heads][head_dim][head_dim], rule plain / decay / delta.
//
// Storage groups. Attention layers whose every head is bounded (window,
// heavy-hitter or dead) form the "bounded" group, the others the "full"
// group; each group is one SequenceCache (cache.h). In the paged layout each
// group draws from its own BlockPool (HybridModel::CreatePools), so the
// blocks a bounded layer's window leaves behind really go back to a pool:
// a paged SequenceCache shares one block table across its layers, and a
// block can only be freed once no layer of its group needs it.
//
// Window enforcement is a pure function of the layer's length n, so a
// sequence that drafted and committed holds exactly what one that appended
// the same tokens one at a time holds. A window head (sink S, window W,
// slack G, lookback L) stores positions p < S and p >= lo(n), where
//   lo(n) = S + G * floor((n - S - W - L) / G)  if n > S + W + L, else 0 (all).
// It thus stores between W + L and W + L + G - 1 recent positions (L lets
// the queries of a chunk appended at once see their whole windows; Attend
// refuses a multi-token query whose window was evicted): compaction (a row
// move, see SequenceCache::KeepRows) happens once every G tokens, not every
// token. Attention applies the exact window: Attend() (or the options from
// AttentionOptionsFor) sets window = W and n_sink = S. A DuoAttention window
// head inside a kFull layer uses G = 1, so it stores exactly S + W positions
// outside drafts, and Attend() gives every head its own window in one call.
// G defaults to the block size.
//
// Window blocks (paged layout). When the bounded group is made of kWindow
// layers only, all with sink_tokens 0 and one window W, and G is a multiple
// of the block size (HybridModel::window_blocks_aligned()), lo(n) is a
// multiple of the block size and every head of the group keeps the same
// run [lo(n), n): block j of the group then holds positions [j * B, (j + 1)
// * B) - j counted from position 0 - like a full layer's block j, and can
// be named by the same hash chain (SetBlockHash, BlockFirstPosition). The
// group is then compacted by SequenceCache::DropLeadingBlocks: the blocks
// that slid out of the window are released to their pool (a named block
// stays cached there, as any released named block) instead of rows being
// moved, once every layer of the group has the same length (after the last
// layer of the group was appended in a pass; the layers before it keep
// their older rows until then, which attention does not read: it applies
// the exact window by position). A drop only releases blocks, so it needs
// no copy-on-write block and cannot fail: window_compaction_pending() never
// turns on for such a group. Rows, positions and attention outputs equal
// the contiguous layout's (which moves rows) whenever every layer has the
// same length. A fresh sequence starts from a cached prefix through
// AdoptPrefix (below). Every other bounded group (sinks, DuoAttention or
// heavy-hitter heads, mixed windows, unaligned G) and the contiguous layout
// compact by KeepRows as above.
//
// Precision window (cache.h, PrecisionWindow; ContiguousOptions::window,
// PagedOptions::window at creation): held by the full group alone, so the
// full layers keep their sinks and recent positions as bf16 rows and attend
// exactly as a SequenceCache with that window over the same rows; window
// and linear layers are unchanged. Every head of the full group must keep
// every row (no eviction policy in a full layer that stays in the full
// group) and the model needs a full layer: InvalidArgument otherwise. A
// draft of up to `slack` tokens leaves the window as plain decoding has it.
//
// Heavy-hitter heads are compacted only by Evict() (their choice depends on
// accumulated importance, so the caller decides when). Dead heads never
// store anything (their appends pass alive = 0).
//
// Speculative decoding. BeginDraft() marks the current length n0 (every
// layer must have the same length, at least 1: the prefill calibrated the
// formats). Appends then add draft tokens: attention layers store them
// (windows are not enforced while a draft is open, so nothing a rollback
// needs is evicted), linear layers apply them to their scratch lane.
// Commit(a) keeps the first a drafted tokens: attention groups truncate to
// n0 + a, linear layers replay the a tokens on the committed state, windows
// are enforced for the new length. Abort() truncates to n0 and drops the
// scratch lanes. Either way the sequence is bit for bit what appending only
// the kept tokens would have made (rows, positions, lengths, linear states,
// calibration), for every layer kind, layout and format, forks included
// (a fork's shared blocks are copied before any write).
// While a draft is open, Evict, Truncate, Fork, Clone and
// AccumulateImportance fail with FailedPrecondition (importance of verified
// tokens is accumulated after Commit, with the accepted queries' probabilities,
// which causal attention makes identical to a never-drafted sequence's).
//
// Errors: a failing call changes nothing, with two documented exceptions:
// an Append of several layers that fails on a later layer has still
// appended the earlier ones (as a model's forward pass would; the Status
// says which layer failed), and a window compaction or Evict that needs a
// copy-on-write block the pool cannot give (possible only while a fork
// shares the blocks) returns PoolExhausted after the append or the heads
// before it were done; the sequence stays valid and window compaction is
// retried by the next append, Commit or Abort (window_compaction_pending()
// says so meanwhile; CheckInvariants accepts such a head as long as it keeps
// its sinks and every position its window needs).
//
// Thread safety: one thread at a time per HybridSequence; sequences on the
// same pools may be used from different threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "kvcache/attention.h"
#include "kvcache/cache.h"
#include "kvcache/eviction.h"
#include "kvcache/format.h"
#include "kvcache/geometry.h"
#include "kvcache/kv_view.h"
#include "kvcache/linear_state.h"
#include "kvcache/pool.h"
#include "kvcache/status.h"

namespace kvcache {

enum class LayerKind : uint8_t { kFull, kWindow, kLinear };
// "full", "window", "linear".
std::string_view LayerKindName(LayerKind kind);

struct LayerSpec {
  LayerKind kind = LayerKind::kFull;
  // kWindow: attention sinks and window (>= 1) in positions.
  uint32_t sink_tokens = 0;
  uint32_t window_tokens = 0;
  // kFull: [n_kv_heads] per-head policies, or empty for keep-all.
  std::vector<EvictionPolicy> head_policies = {};
  // kLinear: update rule and per-head default gates (see linear_state.h).
  LinearRule rule = LinearRule::kPlain;
  std::vector<float> head_gate = {};

  static LayerSpec Full() { return {}; }
  static LayerSpec FullWithPolicies(std::vector<EvictionPolicy> policies) {
    LayerSpec s;
    s.head_policies = std::move(policies);
    return s;
  }
  static LayerSpec Window(uint32_t sink, uint32_t window) {
    LayerSpec s;
    s.kind = LayerKind::kWindow;
    s.sink_tokens = sink;
    s.window_tokens = window;
    return s;
  }
  static LayerSpec Linear(LinearRule rule, std::vector<float> head_gate = {}) {
    LayerSpec s;
    s.kind = LayerKind::kLinear;
    s.rule = rule;
    s.head_gate = std::move(head_gate);
    return s;
  }
};

struct HybridModelOptions {
  // Window slack G in tokens (see the file comment); 0 = the block size.
  uint32_t window_slack_tokens = 0;
  // Window lookback L: window heads keep L more positions, so that a chunk
  // of up to L + 1 tokens appended at once (chunked prefill) can be attended
  // with every query seeing its full window. Drafts need none (compaction
  // waits for Commit / Abort).
  uint32_t window_lookback_tokens = 0;
  // Most tokens one draft may hold (linear layers keep their inputs).
  uint32_t max_draft_tokens = 256;
  // The bounded group's format pair when it differs from the model's (which
  // the full group uses): e.g. a wider format for the few global layers of
  // a sliding-window model and a narrower one for its many window layers.
  std::optional<FormatPair> bounded_formats = std::nullopt;
};

// The immutable description of a model's layers; shared by its sequences.
class HybridModel {
 public:
  static constexpr int kFullGroup = 0;
  static constexpr int kBoundedGroup = 1;

  // InvalidArgument: specs.size() != n_layers, a window of 0, policies of
  // the wrong count or invalid, a format that cannot take head_dim, ...
  static Result<std::shared_ptr<const HybridModel>> Create(
      const Geometry& geometry, FormatPair formats, std::vector<LayerSpec> layers,
      const HybridModelOptions& options = {});

  const Geometry& geometry() const { return geometry_; }
  // The full group's format pair (and the bounded group's unless
  // options().bounded_formats sets its own).
  FormatPair formats() const { return formats_; }
  // Group g's format pair.
  FormatPair group_formats(int group) const {
    return group == kBoundedGroup && options_.bounded_formats ? *options_.bounded_formats : formats_;
  }
  uint32_t n_layers() const { return geometry_.n_layers(); }
  const LayerSpec& spec(uint32_t layer) const { return layers_[layer]; }
  LayerKind kind(uint32_t layer) const { return layers_[layer].kind; }
  // The effective policy of every head of an attention layer ([n_kv_heads]).
  const std::vector<EvictionPolicy>& head_policies(uint32_t layer) const {
    return policies_[layer];
  }
  // Window slack of a head (1 for window heads of kFull layers).
  uint32_t window_slack(uint32_t layer) const;
  // Storage group of an attention layer (kFullGroup / kBoundedGroup), -1 for
  // a linear layer; its layer index inside the group's SequenceCache.
  int group(uint32_t layer) const { return group_[layer]; }
  uint32_t group_layer(uint32_t layer) const { return group_layer_[layer]; }
  // Layers in a group (0 if the group is empty) and the geometry of its
  // SequenceCache / pool (REQUIRES a non-empty group).
  uint32_t group_size(int group) const { return group_size_[group]; }
  Geometry group_geometry(int group) const;
  const HybridModelOptions& options() const { return options_; }

  // True iff the bounded group compacts by whole blocks in the paged layout
  // (file comment, "Window blocks"): it is non-empty and made of kWindow
  // layers only, every one with sink_tokens 0 and the same window_tokens,
  // and the window slack is a multiple of the block size.
  bool window_blocks_aligned() const { return window_blocks_aligned_; }
  // With window_blocks_aligned(): the first position the bounded group keeps
  // at length n, lo(n) (0 while it keeps every position); a multiple of the
  // block size. 0 for any other model.
  uint32_t WindowKeepFrom(uint32_t n) const;

  // One pool per non-empty group, blocks_per_group[g] blocks each
  // (entries of empty groups are ignored; the result has nullptr there).
  Result<std::vector<std::shared_ptr<BlockPool>>> CreatePools(
      std::span<const uint32_t> blocks_per_group, const BlockPoolOptions& options = {}) const;

 private:
  HybridModel(const Geometry& g) : geometry_(g) {}
  uint32_t first_bounded_layer() const;  // 0 if the group is empty
  Geometry geometry_;
  FormatPair formats_;
  HybridModelOptions options_;
  std::vector<LayerSpec> layers_;
  std::vector<std::vector<EvictionPolicy>> policies_;  // [n_layers][n_kv_heads]; empty for linear
  std::vector<int> group_;
  std::vector<uint32_t> group_layer_;
  uint32_t group_size_[2] = {0, 0};
  bool window_blocks_aligned_ = false;
};

// Inputs of n tokens for one layer. Shapes (n = k.size() / (n_kv_heads * head_dim)):
//   k, v  [n][n_kv_heads][head_dim]
//   gate  [n][n_kv_heads]              linear layers only (see LinearInputs)
//   q     [n][n_kv_heads][head_dim]    linear layers only: outputs wanted
struct HybridLayerInputs {
  std::span<const float> k = {};
  std::span<const float> v = {};
  std::span<const float> gate = {};
  std::span<const float> q = {};
};

class HybridSequence {
 public:
  static Result<HybridSequence> CreateContiguous(std::shared_ptr<const HybridModel> model,
                                                 const ContiguousOptions& options = {});
  // pools: [2] as made by HybridModel::CreatePools (nullptr for empty groups).
  static Result<HybridSequence> CreatePaged(std::shared_ptr<const HybridModel> model,
                                            std::span<const std::shared_ptr<BlockPool>> pools,
                                            const PagedOptions& options = {});

  HybridSequence(HybridSequence&&) noexcept;
  HybridSequence& operator=(HybridSequence&&) noexcept;
  ~HybridSequence();

  const HybridModel& model() const { return *model_; }
  CacheLayout layout() const { return layout_; }
  // Positions appended to a layer (drafted ones included) / max over layers.
  uint32_t num_tokens(uint32_t layer) const;
  uint32_t num_tokens() const;
  bool released() const { return released_; }
  // True while a window compaction that returned PoolExhausted (see the
  // file comment) waits for its retry: some window head of some layer holds
  // older positions than its length calls for. CheckInvariants accepts that.
  bool window_compaction_pending() const;

  // --- appends -------------------------------------------------------------
  // One layer; linear layers write out [n][n_kv_heads][head_dim] when q is given.
  Status AppendLayer(uint32_t layer, const HybridLayerInputs& inputs, std::span<float> out = {});
  // Every layer: k, v [n_layers][n][n_kv_heads][head_dim] (no gates, no
  // outputs: linear layers use their default gates).
  Status Append(std::span<const float> k, std::span<const float> v);

  // --- speculative decoding ------------------------------------------------
  Status BeginDraft();
  // Keeps the first num_accepted drafted tokens. OutOfRange if a layer has
  // fewer drafted tokens than that.
  Status Commit(uint32_t num_accepted);
  Status Abort();
  bool in_draft() const { return in_draft_; }
  uint32_t draft_base() const { return draft_base_; }

  // Keeps positions [0, n): attention-only sequences (FailedPrecondition
  // with a linear layer, unless n == num_tokens()). Windows are enforced
  // for the new length.
  Status Truncate(uint32_t num_tokens);

  // --- eviction --------------------------------------------------------------
  // Applies every heavy-hitter head policy of the model (heads over budget
  // keep SelectRows' choice).
  Status Evict();
  // Applies `table` ([n_kv_heads] policies) to one attention layer now, once.
  Status EvictLayer(uint32_t layer, const PolicyTable& table);

  // --- reads ---------------------------------------------------------------
  // Attention layers: the view (positions set after eviction) and per-head data.
  Result<LayerKvView> View(uint32_t layer) const;
  Result<std::vector<float>> HeadKeys(uint32_t layer, uint32_t head) const;
  Result<std::vector<float>> HeadValues(uint32_t layer, uint32_t head) const;
  std::vector<uint32_t> HeadPositions(uint32_t layer, uint32_t head) const;
  uint32_t head_len(uint32_t layer, uint32_t head) const;
  Status AccumulateImportance(uint32_t layer, uint32_t head, std::span<const float> probs);
  std::vector<float> HeadImportance(uint32_t layer, uint32_t head) const;
  // Attention of the layer's last n_queries positions (shapes, checks and
  // results as AttendMulti's, attention.h) with each kv head's window taken
  // from its policy (window = W and n_sink = S, none while W covers the
  // whole length; DuoAttention layers mix window and full heads): equal to
  // attending each kv head alone with its window. options.window / n_sink
  // are ignored. FailedPrecondition if a multi-token query's window was
  // evicted (see window_lookback_tokens).
  Status Attend(uint32_t layer, uint32_t n_queries, std::span<const float> q,
                const AttentionOptions& options, const AttentionOutput& output) const;
  // The attention options a kWindow layer needs at its current length
  // (window = W and n_sink = S, or no window while W covers the whole
  // length); `base` otherwise unchanged.
  AttentionOptions AttentionOptionsFor(uint32_t layer, AttentionOptions base) const;
  // Linear layers: the state (committed lane and scratch) and Sᵀq.
  Result<const LinearState*> Linear(uint32_t layer) const;
  Status LinearRead(uint32_t layer, std::span<const float> q, std::span<float> out) const;

  // --- copies and lifetime -----------------------------------------------------
  // Paged groups share blocks (copy-on-write); linear states are copied.
  Result<HybridSequence> Fork();
  Result<HybridSequence> Clone(const CloneOptions& options = {}) const;
  // Gives every block and buffer back; later calls fail with
  // FailedPrecondition. Idempotent.
  void Release();

  // --- prefix reuse (paged, HybridModel::window_blocks_aligned()) ----------
  // Starts an empty sequence from cached blocks of a prefix of P =
  // full_blocks.size() * block_size positions: the full group adopts
  // full_blocks (SequenceCache::AdoptPrefix, positions [0, P)), the bounded
  // group adopts window_blocks as positions [WindowKeepFrom(P), P)
  // (SequenceCache::AdoptBlocksAt), which must number (P -
  // WindowKeepFrom(P)) / block_size. The sequence then equals one that
  // appended those P positions itself. Takes over one reference per block
  // that the caller holds (BlockPool::RetainCached), each with the
  // calibration the group's blocks were encoded with (group_cache(g)->
  // calibration() of the sequence that named them; null: none).
  // FailedPrecondition unless the sequence is paged, empty, has no linear
  // layer, has both groups and window_blocks_aligned(); InvalidArgument for
  // a wrong block count, a calibration of the wrong size or a block not
  // held. Nothing changes on failure, and the caller keeps its references.
  Status AdoptPrefix(std::span<const uint32_t> full_blocks,
                     std::shared_ptr<const Calibration> full_calibration,
                     std::span<const uint32_t> window_blocks,
                     std::shared_ptr<const Calibration> window_calibration);
  // SequenceCache::SetBlockHash / BlockFirstPosition of group g's cache
  // (what a prefix cache names: logical block j of the bounded group holds
  // positions [BlockFirstPosition(g, j), + block_size)). InvalidArgument for
  // an empty or unknown group; FailedPrecondition while a draft is open.
  Status SetBlockHash(int group, uint32_t logical_block, uint64_t hash);
  Result<uint32_t> BlockFirstPosition(int group, uint32_t logical_block) const;

  // The group caches (nullptr for an empty group), for accounting and tests.
  const SequenceCache* group_cache(int group) const;
  // Admission control, paged: SequenceCache::Reserve on group g's cache
  // (max_rows: the most rows any of its heads will hold; a bounded group's
  // compaction gives its blocks back into the reservation). InvalidArgument
  // for an empty group, FailedPrecondition in the contiguous layout.
  Status Reserve(int group, uint32_t max_rows);
  // K/V bytes of both groups plus linear states.
  size_t allocated_bytes() const;
  size_t used_bytes() const;
  Status CheckInvariants() const;

 private:
  HybridSequence() = default;
  Status CheckAttention(uint32_t layer) const;
  Status CheckUsable() const;
  std::vector<uint8_t> AliveMask(uint32_t layer) const;
  // Compacts window heads of `layer` to the rows its length calls for;
  // the layer stays marked pending until that succeeds.
  Status EnforceWindows(uint32_t layer);
  Status CompactWindows(uint32_t layer);
  Status EnforceAllWindows();
  // The bounded group compacts by DropLeadingBlocks (file comment).
  bool drops_window_blocks() const {
    return layout_ == CacheLayout::kPaged && model_->window_blocks_aligned();
  }
  // Every layer of the bounded group has the same length.
  bool bounded_group_even() const;
  // Drops the bounded group's blocks before WindowKeepFrom(n) once every
  // layer of it has length n.
  Status DropWindowBlocks();
  Result<SequenceCache*> GroupForBlocks(int group) const;
  SequenceCache& cache_of(uint32_t layer) { return *groups_[model_->group(layer)]; }
  const SequenceCache& cache_of(uint32_t layer) const { return *groups_[model_->group(layer)]; }

  std::shared_ptr<const HybridModel> model_;
  CacheLayout layout_ = CacheLayout::kContiguous;
  std::unique_ptr<SequenceCache> groups_[2];
  std::vector<std::unique_ptr<LinearState>> linear_;  // [n_layers]; null for attention layers
  bool released_ = false;
  bool in_draft_ = false;
  uint32_t draft_base_ = 0;
  std::vector<uint8_t> window_pending_;  // [n_layers]: a failed compaction awaits its retry
};

}  // namespace kvcache
