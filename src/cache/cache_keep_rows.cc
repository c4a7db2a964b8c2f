// SequenceCache::KeepRows (include/kvcache/cache.h): per-head compaction for
// eviction, used by the hybrid layer (src/hybrid/); and DropLeadingBlocks,
// the same metadata change for leading whole blocks of every head, made by
// dropping table entries instead of moving rows (sliding windows).
//
// Order of work: validate, make the rows that will be written writable
// (RowStore::MakeWritable, copy-on-write: the only step that can fail), move
// rows, update metadata, then give back room no head covers any more
// (RowStore::Shrink). The invariants are those of cache_state.h.
//
// Thread safety: as cache.h (a mutating call).
#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <cstring>
#include <numeric>

#include "cache/cache_state.h"
#include "kvcache/cache.h"

namespace kvcache {
namespace {

Status CheckKeptRows(std::span<const uint32_t> rows, uint32_t n, uint32_t layer, uint32_t head) {
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] >= n || (i > 0 && rows[i] <= rows[i - 1])) {
      return Status::InvalidArgument(fmt::format(
          "cache: KeepRows wants strictly ascending rows < {} (layer {} head {}); entry {} is {}",
          n, layer, head, i, rows[i]));
    }
  }
  return Status::Ok();
}

// Moves row rows[i] to row i for i in [first, rows.size()), ascending: the
// source rows[i] >= i was not yet overwritten. Runs of consecutive rows move
// as one memmove per stretch that stays inside one source and one
// destination run of the store (they may overlap, hence memmove).
void MoveRows(const RowAddressing<uint8_t>& a, uint32_t head, std::span<const uint32_t> rows,
              uint32_t first) {
  const uint32_t k = static_cast<uint32_t>(rows.size());
  for (uint32_t i = first; i < k;) {
    uint32_t run = 1;
    while (i + run < k && rows[i + run] == rows[i] + run) ++run;
    run = std::min({run, a.run(i), a.run(rows[i])});
    std::memmove(a.row(head, i), a.row(head, rows[i]), size_t{run} * a.row_bytes);
    i += run;
  }
}

// Metadata of head `head` after keeping `rows` of it.
void KeepHeadMeta(LayerMeta& lm, uint32_t head, std::span<const uint32_t> rows) {
  const uint32_t k = static_cast<uint32_t>(rows.size());
  MaterializePositions(lm);
  auto& pos = lm.positions[head];
  for (uint32_t i = 0; i < k; ++i) pos[i] = pos[rows[i]];
  pos.resize(k);
  if (lm.has_importance()) {
    auto& imp = lm.head_imp[head];
    for (uint32_t i = 0; i < k; ++i) imp[i] = imp[rows[i]];
    imp.resize(k);
  }
  lm.head_len[head] = k;
  if (k > 0) return;
  for (Transforms& t : lm.transforms) {
    if (t && !(*t)[head].empty()) {
      t = WithTransform(t, static_cast<uint32_t>(lm.head_len.size()), head, {});
    }
  }
}

}  // namespace

Status SequenceCache::KeepRows(uint32_t layer, uint32_t head, std::span<const uint32_t> rows) {
  State& s = *s_;
  KV_RETURN_IF_ERROR(CheckLayerHead(s, layer, head));
  if (s.window) {
    return Status::FailedPrecondition(
        "cache: KeepRows drops rows a precision window needs (every head stores every position)");
  }
  LayerMeta& lm = s.layers[layer];
  KV_RETURN_IF_ERROR(CheckKeptRows(rows, lm.head_len[head], layer, head));
  const uint32_t k = static_cast<uint32_t>(rows.size());
  if (k == lm.head_len[head]) return Status::Ok();  // ascending, distinct, < n: every row
  // First row that moves; rows before it stay in place.
  uint32_t first_move = 0;
  while (first_move < k && rows[first_move] == first_move) ++first_move;
  KV_RETURN_IF_ERROR(s.store->MakeWritable(first_move, k));
  for (int side = 0; side < kSides; ++side) {
    MoveRows(s.store->Rows(layer, side), head, rows, first_move);
  }
  KeepHeadMeta(lm, head, rows);
  // Releasing blocks this sequence holds cannot fail.
  Status st = s.store->Shrink(s.layers);
  assert(st.ok());
  (void)st;
  s.Touch();
  return Status::Ok();
}

Status SequenceCache::DropLeadingBlocks(uint32_t n_blocks) {
  State& s = *s_;
  if (s.released) return UsedAfterRelease();
  if (s.store->layout() != CacheLayout::kPaged) {
    return Status::FailedPrecondition("cache: DropLeadingBlocks needs the paged layout");
  }
  if (s.window) {
    return Status::FailedPrecondition(
        "cache: DropLeadingBlocks drops rows a precision window needs (every head stores every "
        "position)");
  }
  if (n_blocks == 0) return Status::Ok();
  const uint64_t drop = uint64_t{n_blocks} * s.store->block_size();
  for (uint32_t l = 0; l < s.layers.size(); ++l) {
    const LayerMeta& lm = s.layers[l];
    for (uint32_t h = 0; h < lm.head_len.size(); ++h) {
      if (lm.head_len[h] < drop) {
        return Status::FailedPrecondition(
            fmt::format("cache: DropLeadingBlocks({}) but layer {} head {} holds {} rows",
                        n_blocks, l, h, lm.head_len[h]));
      }
      // Strictly increasing positions: a run iff the ends are drop - 1 apart.
      if (lm.has_positions() && lm.positions[h][drop - 1] - lm.positions[h][0] != drop - 1) {
        return Status::FailedPrecondition(fmt::format(
            "cache: DropLeadingBlocks({}): the rows of layer {} head {} in those blocks are not "
            "one run of positions",
            n_blocks, l, h));
      }
    }
  }
  // Exactly KeepRows' metadata for rows [drop, head_len) of every head.
  std::vector<uint32_t> keep;
  for (LayerMeta& lm : s.layers) {
    for (uint32_t h = 0; h < lm.head_len.size(); ++h) {
      keep.resize(lm.head_len[h] - drop);
      std::iota(keep.begin(), keep.end(), static_cast<uint32_t>(drop));
      KeepHeadMeta(lm, h, keep);
    }
  }
  // Releasing blocks this sequence holds cannot fail.
  Status st = s.store->DropLeadingBlocks(n_blocks, s.layers);
  assert(st.ok());
  (void)st;
  s.Touch();
  return Status::Ok();
}

}  // namespace kvcache
