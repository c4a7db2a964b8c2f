// Private state of a SequenceCache (contracts in include/kvcache/cache.h):
// per-layer metadata, the RowStore interface its two layouts implement
// (contiguous_store.h, paged_store.h), and the State that joins them.
//
// Split of work. LayerMeta (lengths, positions, calibration, importance) is
// the same for both layouts and is handled by cache.cc alone; a RowStore
// holds the bytes and answers "where is row r of head h" through one
// RowAddressing per (layer, side) (kv_view.h), plus the few steps that
// differ by layout: acquiring room for an append, giving room back,
// copies, release, and the paged-only hooks (reservations, block table).
// LayerMeta is small and cheap to copy, so that Fork costs O(layers * heads
// + table) bookkeeping, never K/V bytes.
//
// Thread safety: as SequenceCache: one mutator at a time; const methods may
// run concurrently with each other.
//
// Invariants (SequenceCache::CheckInvariants checks them, the store its own):
//  - head_len[h] <= num_tokens for every layer and head.
//  - positions empty  => every head of the layer stores rows 0..num_tokens-1
//    (head_len[h] == num_tokens); otherwise positions[h] has head_len[h]
//    strictly increasing entries < num_tokens.
//  - head_len[h] == 0 => no transform for (layer, side, h).
//  - importance empty or head_imp[h].size() == head_len[h] and
//    pos_imp.size() == num_tokens.
//  - the store has room for head_len[h] rows of every head (see each store).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cache/window_store.h"
#include "kvcache/cache.h"

namespace kvcache {

constexpr uint32_t kMaxCacheTokens = 1u << 30;
constexpr int kSides = 2;  // index 0 = K, 1 = V
constexpr Side kSideOf[kSides] = {Side::kKey, Side::kValue};

inline uint32_t CeilDiv(uint32_t a, uint32_t b) { return (a + b - 1) / b; }

using Transforms = std::shared_ptr<const std::vector<RowTransform>>;

struct LayerMeta {
  uint32_t num_tokens = 0;
  std::vector<uint32_t> head_len;                 // [n_kv_heads]
  std::vector<std::vector<uint32_t>> positions;   // empty or [n_kv_heads][head_len]
  Transforms transforms[kSides];                  // [n_kv_heads] each; null = none
  std::vector<std::vector<float>> head_imp;       // empty or [n_kv_heads][head_len]
  std::vector<float> pos_imp;                     // empty or [num_tokens]
  // [n_kv_heads] pointers into positions for View(), or empty; refreshed by
  // State::Touch after every mutation so that View() only reads.
  std::vector<const uint32_t*> position_ptrs;

  bool has_positions() const { return !positions.empty(); }
  bool has_importance() const { return !head_imp.empty(); }
  uint32_t max_head_len() const {
    uint32_t m = 0;
    for (uint32_t x : head_len) m = x > m ? x : m;
    return m;
  }
};

// Longest and shortest head over all layers (0 for no heads).
inline uint32_t MaxRows(std::span<const LayerMeta> layers) {
  uint32_t m = 0;
  for (const LayerMeta& l : layers) m = std::max(m, l.max_head_len());
  return m;
}
inline uint32_t MinRows(std::span<const LayerMeta> layers) {
  uint32_t m = UINT32_MAX;
  for (const LayerMeta& l : layers)
    for (uint32_t x : l.head_len) m = x < m ? x : m;
  return m == UINT32_MAX ? 0 : m;
}

// The heads one append stores rows for: layers [first_layer, first_layer +
// n_layers), n_tokens rows each, alive as in AppendOptions (already checked).
struct AppendPlan {
  uint32_t first_layer = 0;
  uint32_t n_layers = 0;
  uint32_t n_tokens = 0;
  uint32_t n_kv_heads = 0;
  std::span<const uint8_t> alive;  // empty, [n_kv_heads] or [n_layers][n_kv_heads]

  bool is_alive(uint32_t li, uint32_t h) const {
    if (alive.empty()) return true;
    return alive.size() == n_kv_heads ? alive[h] != 0 : alive[size_t{li} * n_kv_heads + h] != 0;
  }
};

// The bytes of one cache in one layout. Row r of head h of (layer, side) is
// Rows(layer, side).row(h, r) for every r < head_len: no caller computes an
// address any other way. `layers` arguments are the cache's metadata, as it
// is when the call is made.
class RowStore {
 public:
  virtual ~RowStore() = default;

  virtual CacheLayout layout() const = 0;
  // Writable addressing of (layer, side); the cache writes through it only
  // in its mutating calls, and only rows the store made writable.
  virtual RowAddressing<uint8_t> Rows(uint32_t layer, int side) const = 0;
  virtual uint32_t num_blocks() const = 0;  // for the view: 1 for per-head buffers
  virtual uint32_t block_size() const = 0;  // cache.h's block_size(): 0 for contiguous
  virtual uint32_t capacity_tokens() const = 0;
  virtual size_t allocated_bytes() const = 0;
  virtual size_t allocated_bytes(uint32_t layer) const = 0;
  virtual bool is_within_planned_capacity(std::span<const LayerMeta> layers) const = 0;

  // Appends, in three steps (AppendGuard in cache_append.cc drives them):
  // AcquireForAppend makes room for plan's rows, all or nothing (on failure
  // nothing is left acquired); then exactly one of CommitAppend (with the
  // metadata already committed) or UndoAppend, which restores the store
  // exactly as it was before AcquireForAppend.
  virtual Status AcquireForAppend(const AppendPlan& plan, std::span<const LayerMeta> layers) = 0;
  virtual void CommitAppend(std::span<const LayerMeta> layers) = 0;
  virtual void UndoAppend() = 0;

  // Makes rows [first, end) of every head of every layer writable (paged:
  // copies shared blocks first). All or nothing.
  virtual Status MakeWritable(uint32_t first, uint32_t end) = 0;
  // After rows were dropped: gives back room no head covers any more.
  virtual Status Shrink(std::span<const LayerMeta> layers) = 0;
  // Gives everything back; the store is then empty. Idempotent.
  virtual void Release() = 0;

  // A deep copy of the same layout with its own storage.
  virtual Result<std::unique_ptr<RowStore>> Clone(std::span<const LayerMeta> layers) const = 0;
  // A detached copy: contiguous, holding no pool blocks.
  virtual Result<std::unique_ptr<RowStore>> CloneContiguous(
      std::span<const LayerMeta> layers) const = 0;
  // Fork's storage: shares what can be shared (paged), else Clone.
  virtual Result<std::unique_ptr<RowStore>> Fork(std::span<const LayerMeta> layers) = 0;

  virtual Status CheckInvariants(std::span<const LayerMeta> layers, bool released) const = 0;
  virtual std::string DebugString() const = 0;

  // Paged-only hooks; the contiguous store keeps these defaults (cache.h:
  // reservations are no-ops returning OK, exports are empty).
  virtual Status Reserve(uint32_t /*max_tokens*/, std::span<const LayerMeta> /*layers*/) {
    return Status::Ok();
  }
  virtual uint32_t reserved_blocks() const { return 0; }
  virtual uint32_t reservation_target_tokens() const { return 0; }
  virtual bool is_fully_reserved(std::span<const LayerMeta> /*layers*/) const { return true; }
  // Gives back reserved blocks the reservation target no longer needs.
  virtual void TrimReservation(std::span<const LayerMeta> /*layers*/) {}
  virtual std::span<const uint32_t> block_table() const { return {}; }
  virtual const std::shared_ptr<BlockPool>& pool() const {
    static const std::shared_ptr<BlockPool> kNone;
    return kNone;
  }
  virtual Status SetBlockHash(uint32_t /*logical_block*/, uint64_t /*hash*/,
                              std::span<const LayerMeta> /*layers*/) {
    return Status::FailedPrecondition("cache: block hashes need the paged layout");
  }
  // Takes over `blocks` (one reference each, held by the caller) as the
  // whole table. REQUIRES: empty store, paged.
  virtual Status AdoptBlocks(std::span<const uint32_t> /*blocks*/) {
    return Status::FailedPrecondition("cache: AdoptPrefix needs an empty paged cache");
  }
  // After the metadata dropped the first n_blocks * block_size rows of every
  // head: gives the table's first n_blocks entries back (into the
  // reservation first, as Shrink). Cannot fail for a paged store.
  virtual Status DropLeadingBlocks(uint32_t /*n_blocks*/, std::span<const LayerMeta> /*layers*/) {
    return Status::FailedPrecondition("cache: DropLeadingBlocks needs the paged layout");
  }
};

struct SequenceCache::State {
  Geometry geometry;
  FormatPair formats;
  std::shared_ptr<const RowCodec> codec[kSides];
  size_t row_bytes[kSides] = {0, 0};
  bool released = false;
  std::vector<LayerMeta> layers;
  std::unique_ptr<RowStore> store;
  uint32_t context_len[1] = {0};
  // The precision window's rows (null without one, and after Release).
  PrecisionWindow window_spec;
  std::unique_ptr<WindowStore> window;

  // Scratch (not state): gathered input rows.
  std::vector<float> scratch;

  explicit State(const Geometry& g) : geometry(g) {}
  uint32_t num_tokens() const {
    uint32_t m = 0;
    for (const LayerMeta& l : layers) m = l.num_tokens > m ? l.num_tokens : m;
    return m;
  }
  // Called at the end of every mutation: refreshes the derived fields
  // (context length, pointer arrays the views hand out).
  void Touch() {
    context_len[0] = num_tokens();
    for (LayerMeta& l : layers) {
      l.position_ptrs.resize(l.positions.size());
      for (size_t h = 0; h < l.positions.size(); ++h) l.position_ptrs[h] = l.positions[h].data();
    }
    if (window) {
      for (uint32_t l = 0; l < layers.size(); ++l) window->Refresh(l, layers[l].num_tokens);
    }
  }
};

// Shared by the cache's sources (defined in cache.cc).
//
// `v` (or n empty transforms) with entry h replaced; null if none is left.
Transforms WithTransform(const Transforms& v, uint32_t n, uint32_t h, RowTransform t);
// FailedPrecondition: the cache was used after Release().
Status UsedAfterRelease();
// OK, or why (layer, head) cannot be used: released, or out of range.
Status CheckLayerHead(const SequenceCache::State& s, uint32_t layer, uint32_t head);
// Gives every head of `lm` explicit positions (rows 0..head_len-1) if it has none.
void MaterializePositions(LayerMeta& lm);
// The first position of rows [b * block_size, (b + 1) * block_size) when
// they are block_size consecutive positions from a multiple of block_size,
// the same in every layer and head (what a content hash may name);
// FailedPrecondition otherwise (a head shorter than that included).
Result<uint32_t> AlignedBlockFirst(std::span<const LayerMeta> layers, uint32_t b,
                                   uint32_t block_size);

}  // namespace kvcache
