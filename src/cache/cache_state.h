// Private state of a SequenceCache (see include/kvcache/cache.h for the contracts).
//
// Per layer metadata (LayerMeta) is small and cheap to copy so that Fork costs
// O(layers * heads + table) bookkeeping, never K/V bytes. Contiguous storage
// lives apart (ContiguousLayer) because it is deep-copied by Clone only.
//
// Invariants (SequenceCache::CheckInvariants checks them):
//  - head_len[h] <= num_tokens for every layer and head.
//  - positions empty  => every head of the layer stores rows 0..num_tokens-1
//    (head_len[h] == num_tokens); otherwise positions[h] has head_len[h]
//    strictly increasing entries < num_tokens.
//  - head_len[h] == 0 => no transform for (layer, side, h).
//  - importance empty or head_imp[h].size() == head_len[h] and
//    pos_imp.size() == num_tokens.
//  - paged: table.size() == ceil(max over (layer, head) head_len / block_size);
//    maybe_shared.size() == table.size(); this sequence holds one reference on
//    every table entry; an entry with maybe_shared == 0 is held exclusively.
//  - contiguous: head_len[h] <= cap of the head's buffer.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kvcache/cache.h"

namespace kvcache {

struct LayerMeta {
  uint32_t num_tokens = 0;
  std::vector<uint32_t> head_len;                 // [n_kv_heads]
  std::vector<std::vector<uint32_t>> positions;   // empty or [n_kv_heads][head_len]
  // [n_kv_heads] per side; null = no head has a transform.
  std::shared_ptr<const std::vector<RowTransform>> transforms[2];
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

// One head's contiguous buffer: [cap][row_bytes].
struct HeadBuffer {
  std::unique_ptr<uint8_t[]> data;
  uint32_t cap = 0;
};

struct ContiguousLayer {
  std::vector<HeadBuffer> heads[2];     // [side][n_kv_heads]
  std::vector<const uint8_t*> bases[2];  // [side][n_kv_heads] heads[s][h].data, for View()
};

struct SequenceCache::State {
  Geometry geometry;
  FormatPair formats;
  CacheLayout layout = CacheLayout::kContiguous;
  std::shared_ptr<const RowCodec> codec[2];
  size_t row_bytes[2] = {0, 0};
  bool released = false;
  std::vector<LayerMeta> layers;
  uint32_t context_len[1] = {0};

  // Contiguous.
  ContiguousOptions contiguous;
  bool grew_past_plan = false;
  std::vector<ContiguousLayer> store;  // [n_layers]

  // Paged.
  std::shared_ptr<BlockPool> pool;
  std::vector<uint32_t> table;         // [num_blocks] logical -> physical
  std::vector<uint8_t> maybe_shared;   // [num_blocks]
  uint32_t reserved = 0;               // blocks reserved in the pool for us
  uint32_t reserve_target = 0;         // tokens Reserve() was asked to cover

  // Scratch (not state): gathered input rows.
  std::vector<float> scratch;

  explicit State(const Geometry& g) : geometry(g) {}
  uint32_t bs() const { return geometry.block_size(); }
  uint32_t num_tokens() const {
    uint32_t m = 0;
    for (const LayerMeta& l : layers) m = l.num_tokens > m ? l.num_tokens : m;
    return m;
  }
  uint32_t max_rows() const {
    uint32_t m = 0;
    for (const LayerMeta& l : layers) {
      const uint32_t x = l.max_head_len();
      m = x > m ? x : m;
    }
    return m;
  }
  uint32_t min_rows() const {
    uint32_t m = UINT32_MAX;
    for (const LayerMeta& l : layers)
      for (uint32_t x : l.head_len) m = x < m ? x : m;
    return m == UINT32_MAX ? 0 : m;
  }
  // Called at the end of every mutation: refreshes the derived fields
  // (context length, pointer arrays the views hand out).
  void Touch() {
    context_len[0] = num_tokens();
    for (LayerMeta& l : layers) {
      l.position_ptrs.resize(l.positions.size());
      for (size_t h = 0; h < l.positions.size(); ++h) l.position_ptrs[h] = l.positions[h].data();
    }
    for (ContiguousLayer& c : store) {
      for (int s = 0; s < 2; ++s) {
        c.bases[s].resize(c.heads[s].size());
        for (size_t h = 0; h < c.heads[s].size(); ++h) c.bases[s][h] = c.heads[s][h].data.get();
      }
    }
  }
};

// Shared by sequence_cache.cc and keep_rows.cc (defined in sequence_cache.cc).
//
// Blocks that appending until every head holds `target` rows could allocate:
// new blocks past the table plus copies of possibly shared blocks written
// (every block from min_rows on counted as shared if assume_all_shared).
uint32_t BlocksNeeded(const SequenceCache::State& s, uint32_t target, bool assume_all_shared);
// Gives back reserved blocks the reservation target no longer needs.
void TrimReservation(SequenceCache::State& s);
// Releases `dropped` and tops the reservation up to the current need: first
// with the released blocks (atomically), then best effort from the pool.
Status ReleaseKeepingReservation(SequenceCache::State& s, std::vector<uint32_t> dropped);
// Allocates fresh.size() blocks all or nothing, drawing on the reservation
// first; *from_reserved gets how many came from it.
Status AllocateDrawingReservation(SequenceCache::State& s, std::span<uint32_t> fresh,
                                  uint32_t* from_reserved);
// Copy-on-write: table[cow_idx[j]] is copied into fresh[j], which replaces
// it; the replaced ids are appended to *cow_old (still referenced).
void SwapInCopies(SequenceCache::State& s, std::span<const uint32_t> cow_idx,
                  std::span<const uint32_t> fresh, std::vector<uint32_t>* cow_old);

}  // namespace kvcache
