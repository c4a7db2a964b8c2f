// A plain, non-owning view of one layer's stored K and V for one sequence:
// what attention kernels read. Ownership lives in the caches (cache.h); a view
// is valid until the next mutating call on the cache it came from.
//
// Addressing. Logical row r (0 <= r < head_len[h]) of kv head h on one side:
//
//   side.base + block_table[r / block_size] * side.block_stride
//             + h * side.head_stride + (r % block_size) * side.row_bytes
//
// Paged layout: base is the pool's arena for this layer and side, shaped
// [num_pool_blocks][n_kv_heads][block_size][row_bytes]; block_table maps
// logical blocks to physical pool blocks (u32).
// Contiguous layout: the special case of a single block of `capacity` rows:
// block_size = capacity, block_table = {0}, storage [n_kv_heads][capacity][row_bytes].
//
// Per-head contiguous storage (what SequenceCache's contiguous layout hands
// out, so that a dead head owns no memory): side.head_base is set, [n_kv_heads]
// pointers to each head's own [capacity_h][row_bytes] buffer (nullptr for a
// head with no rows); row r of head h is at head_base[h] + r * row_bytes, and
// base / block_stride / head_stride are unused (0). block_size is then the
// largest head capacity, block_table = {0}, num_blocks = 1, so code that walks
// "blocks" sees one block per head.
//
// RowAddressing below is this rule, written once: row_ptr() reads through it
// and SequenceCache writes its rows through it.
//
// Thread safety: plain data; concurrent reads are safe.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvcache/codec.h"
#include "kvcache/format.h"

namespace kvcache {

// Where the rows of one side of one layer live, in either form (the rule of
// the file comment). Byte is const uint8_t for readers and uint8_t for the
// cache, which writes rows through the same rule attention reads them with.
template <typename Byte>
struct RowAddressing {
  Byte* base = nullptr;              // block form: the arena
  Byte* const* head_base = nullptr;  // per-head form: [n_kv_heads] buffers, else nullptr
  const uint32_t* block_table = nullptr;
  uint32_t block_size = 0;
  size_t block_stride = 0;
  size_t head_stride = 0;
  size_t row_bytes = 0;

  // Offset of row `row` from the start of a head's storage: the same for
  // every head, so heads of equal length can share one lookup.
  size_t offset(uint32_t row) const {
    if (head_base) return static_cast<size_t>(row) * row_bytes;
    return static_cast<size_t>(block_table[row / block_size]) * block_stride +
           static_cast<size_t>(row % block_size) * row_bytes;
  }
  // The row at `offset` (from offset()) of kv head `head`.
  Byte* at(uint32_t head, size_t offset) const {
    return (head_base ? head_base[head] : base + static_cast<size_t>(head) * head_stride) + offset;
  }
  Byte* row(uint32_t head, uint32_t row) const { return at(head, offset(row)); }
  // How many rows from `row` on lie back to back in memory (to the end of
  // its block; unbounded in the per-head form).
  uint32_t run(uint32_t row) const {
    return head_base ? UINT32_MAX - row : block_size - row % block_size;
  }
};

struct KvSideView {
  Format format = Format::kF32;
  uint32_t row_bytes = 0;
  const uint8_t* base = nullptr;
  size_t block_stride = 0;  // bytes between consecutive physical blocks
  size_t head_stride = 0;   // bytes between kv heads inside one block
  // The codec rows were encoded with (rotation signs for turbo formats).
  const RowCodec* codec = nullptr;
  // [n_kv_heads] per-head calibration (mean / column scales), or nullptr
  // when no head has one. An empty RowTransform means none for that head.
  const RowTransform* transforms = nullptr;
  // [n_kv_heads] per-head row buffers (per-head contiguous storage, see
  // above), or nullptr for the block-addressed form.
  const uint8_t* const* head_base = nullptr;
};

struct LayerKvView {
  uint32_t n_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t block_size = 0;
  uint32_t num_tokens = 0;  // the sequence's length (positions appended so far)
  // [n_kv_heads] rows stored per head; nullptr means every head stores
  // num_tokens rows (no dead heads, no eviction).
  const uint32_t* head_len = nullptr;
  // [n_kv_heads] pointers to [head_len[h]] original position indices of the
  // stored rows; nullptr means row r holds position r.
  const uint32_t* const* positions = nullptr;
  const uint32_t* block_table = nullptr;  // [num_blocks] logical -> physical
  uint32_t num_blocks = 0;
  KvSideView k, v;
  // A precision window (cache.h, PrecisionWindow): the bf16 rows of this
  // layer that attention reads together with this view's rows, under one
  // softmax; nullptr for none. Same n_kv_heads, head_dim and num_tokens; its
  // rows are slots in no particular position order (positions always set),
  // a slot holding nothing at position UINT32_MAX (never visible).
  // Who reads what, for a query at position q (each position exactly once):
  //   this view: positions p >= first_position with p < recent_from or
  //              p + recent <= q (no stored positions here);
  //   hot:       its positions p <= q with p < first_position (the sinks)
  //              or p + recent > q (the query's last `recent` positions).
  // Without a window: first_position 0, recent 0 (no such rule), hot null.
  const LayerKvView* hot = nullptr;
  uint32_t first_position = 0;
  uint32_t recent = 0;
  uint32_t recent_from = 0;

  uint32_t rows(uint32_t head) const { return head_len ? head_len[head] : num_tokens; }
  uint32_t position(uint32_t head, uint32_t row) const {
    return positions ? positions[head][row] : row;
  }
  RowAddressing<const uint8_t> addressing(const KvSideView& side) const {
    return {side.base,        side.head_base,  block_table, block_size,
            side.block_stride, side.head_stride, side.row_bytes};
  }
  // Start of stored row `row` of kv head `head` on one side.
  const uint8_t* row_ptr(const KvSideView& side, uint32_t head, uint32_t row) const {
    return addressing(side).row(head, row);
  }
};

}  // namespace kvcache
