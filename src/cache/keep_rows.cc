// SequenceCache::KeepRows: per-head compaction for eviction (contract in
// include/kvcache/cache.h; used by the hybrid layer, src/hybrid/).
//
// Kept in its own file so the eviction path stays apart from the append and
// rollback paths of sequence_cache.cc. The few helpers it shares with that
// file (row addressing, reservation need) are restated here in the same
// terms; the invariants are those of cache_state.h.
//
// Order of work: validate, acquire copy-on-write blocks (the only step that
// can fail), then move rows, then metadata, then give back blocks that no
// head covers any more.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "cache/cache_state.h"
#include "kvcache/cache.h"

namespace kvcache {
namespace {

constexpr Side kSides[2] = {Side::kKey, Side::kValue};

uint32_t CeilDiv(uint32_t a, uint32_t b) { return (a + b - 1) / b; }

// Start of row `row` of (layer, side, head); writable (caller holds it exclusively).
uint8_t* MutableRow(SequenceCache::State& s, uint32_t l, int side, uint32_t h, uint32_t row) {
  const size_t rb = s.row_bytes[side];
  if (s.layout == CacheLayout::kContiguous) {
    return s.store[l].heads[side][h].data.get() + size_t{row} * rb;
  }
  return s.pool->block_data(l, kSides[side], s.table[row / s.bs()]) +
         size_t{h} * s.pool->head_stride(kSides[side]) + size_t{row % s.bs()} * rb;
}

}  // namespace

Status SequenceCache::KeepRows(uint32_t layer, uint32_t head, std::span<const uint32_t> rows) {
  State& s = *s_;
  if (s.released) return Status::FailedPrecondition("cache: used after Release()");
  const uint32_t H = s.geometry.n_kv_heads();
  if (layer >= s.geometry.n_layers() || head >= H) {
    return Status::OutOfRange(fmt::format("cache: layer {} head {} out of range ({} x {})", layer,
                                          head, s.geometry.n_layers(), H));
  }
  LayerMeta& lm = s.layers[layer];
  const uint32_t n = lm.head_len[head];
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] >= n || (i > 0 && rows[i] <= rows[i - 1])) {
      return Status::InvalidArgument(fmt::format(
          "cache: KeepRows wants strictly ascending rows < {} (layer {} head {}); entry {} is {}",
          n, layer, head, i, rows[i]));
    }
  }
  const uint32_t k = static_cast<uint32_t>(rows.size());
  if (k == n) return Status::Ok();  // ascending, distinct, < n: every row
  // First row that moves; rows before it stay in place.
  uint32_t first_move = 0;
  while (first_move < k && rows[first_move] == first_move) ++first_move;

  // 1. Paged: rows [first_move, k) are written; their blocks must be ours alone.
  const bool paged = s.layout == CacheLayout::kPaged;
  std::vector<uint32_t> cow_idx, fresh, cow_old;
  if (paged && first_move < k) {
    for (uint32_t b = first_move / s.bs(); b <= (k - 1) / s.bs(); ++b) {
      if (!s.maybe_shared[b]) continue;
      if (s.pool->IsExclusive(s.table[b])) {
        s.maybe_shared[b] = 0;  // a cached fact, not state
      } else {
        cow_idx.push_back(b);
      }
    }
    if (!cow_idx.empty()) {
      fresh.resize(cow_idx.size());
      uint32_t from_reserved = 0;
      KV_RETURN_IF_ERROR(AllocateDrawingReservation(s, fresh, &from_reserved));
      SwapInCopies(s, cow_idx, fresh, &cow_old);
      Status st = s.pool->Release(cow_old);
      assert(st.ok());
      (void)st;
    }
  }

  // 2. Move rows down, ascending: the source rows[i] >= i was not yet
  // overwritten. Runs of consecutive rows move as one memmove per stretch
  // that stays inside one source and one destination block (they may
  // overlap inside a block, hence memmove).
  const uint32_t seg = paged ? s.bs() : UINT32_MAX;
  for (uint32_t i = first_move; i < k;) {
    uint32_t run = 1;
    while (i + run < k && rows[i + run] == rows[i] + run) ++run;
    run = std::min({run, seg - i % seg, seg - rows[i] % seg});
    for (int side = 0; side < 2; ++side) {
      std::memmove(MutableRow(s, layer, side, head, i), MutableRow(s, layer, side, head, rows[i]),
                   size_t{run} * s.row_bytes[side]);
    }
    i += run;
  }

  // 3. Metadata.
  if (!lm.has_positions()) {
    lm.positions.resize(H);
    for (uint32_t h = 0; h < H; ++h) {
      lm.positions[h].resize(lm.head_len[h]);
      std::iota(lm.positions[h].begin(), lm.positions[h].end(), 0u);
    }
  }
  auto& pos = lm.positions[head];
  for (uint32_t i = 0; i < k; ++i) pos[i] = pos[rows[i]];
  pos.resize(k);
  if (lm.has_importance()) {
    auto& imp = lm.head_imp[head];
    for (uint32_t i = 0; i < k; ++i) imp[i] = imp[rows[i]];
    imp.resize(k);
  }
  lm.head_len[head] = k;
  if (k == 0) {
    for (auto& tfv : lm.transforms) {
      if (!tfv || (*tfv)[head].empty()) continue;
      auto copy = std::make_shared<std::vector<RowTransform>>(*tfv);
      (*copy)[head] = RowTransform{};
      bool any = false;
      for (const RowTransform& t : *copy) any |= !t.empty();
      tfv = any ? std::shared_ptr<const std::vector<RowTransform>>(std::move(copy)) : nullptr;
    }
  }

  // 4. Paged: blocks past every head's rows go back, keeping the reservation whole.
  if (paged) {
    const uint32_t keep = CeilDiv(s.max_rows(), s.bs());
    std::vector<uint32_t> dropped(s.table.rbegin(), s.table.rend() - keep);
    s.table.resize(keep);
    s.maybe_shared.resize(keep);
    // Releasing blocks this sequence holds cannot fail.
    Status st = ReleaseKeepingReservation(s, std::move(dropped));
    assert(st.ok());
    (void)st;
  }
  s.Touch();
  return Status::Ok();
}

}  // namespace kvcache
