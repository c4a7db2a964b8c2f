// SequenceCache: the K/V cache of one sequence, all layers; LayerCache: a
// handle on one layer of it.
//
// Layouts, chosen at creation:
//   contiguous  per layer, per side, per kv head one private buffer
//               [capacity_h][row_bytes]. A head that never stores a row owns
//               no buffer (no memory). Growable (geometric) or pre-sized
//               with a planned capacity that is either a hint (growth past it
//               allowed, is_within_planned_capacity() turns false) or a hard
//               limit (CapacityExceeded).
//   paged       rows live in BlockPool blocks. ONE block table (logical block
//               -> physical u32) is shared by all layers and heads of the
//               sequence: row r of any head of any layer is in block
//               block_table[r / block_size], slot r % block_size. The table
//               covers max over (layer, head) of head_len rows.
//
// Lengths. num_tokens(layer) counts positions appended to a layer (dead
// heads included); num_tokens() is the max over layers (layers may be
// appended one at a time, e.g. by a model's forward pass). head_len(l, h)
// counts rows actually stored for a head: a head that was dead (alive[h] ==
// 0) at some appends stores fewer rows, compacted; head_positions() maps its
// rows back to positions. In the paged layout a dead head's slots in a block
// are simply unused: blocks are allocated for the longest head, so a head
// dead at every step costs block_size * row_bytes per block it does not use
// (nothing extra if every head of every layer is dead at a position).
//
// Storage is encoded with the K and V RowCodecs of the format pair. Each
// (layer, head, side) gets its RowTransform from RowCodec::Calibrate on the
// rows of the first append call that stores anything for that head; it is
// kept until the head's head_len returns to 0 (truncate) or Clear, copied by
// Fork / Clone, and exposed to attention through the view.
//
// Sharing (paged). Fork() makes a copy that shares every block by refcount;
// a block is written only while held exclusively (refcount 1, no hash), so
// the first write to a shared block after a fork copies that block first
// (copy-on-write; with all heads alive only the partial last block is ever
// copied). Fork of a 32k-token sequence = block-table copy + refcount bumps.
// Clone() is a detached deep copy: by default it is contiguous and holds no
// pool blocks, or, with CloneOptions, paged with its own fresh blocks from
// the same pool (all or nothing).
//
// Reservations (paged, admission control). Reserve(max_tokens) promises, up
// front, every block that appending up to max_tokens rows in every head
// could need (new blocks plus copy-on-write copies of shared ones), all or
// nothing. Appends draw from it first, so within that length they never fail
// for lack of blocks. Truncate / Clear turn the blocks they free back into
// reservation (atomically), so a speculative reject keeps the guarantee;
// blocks still shared with a fork are not freed by dropping them, and for
// those the reservation is topped up best effort (reserved_blocks() and
// is_fully_reserved() tell). Fork of a reserved sequence reserves the one
// extra copy-on-write block the parent now needs, or fails with
// PoolExhausted. The child of a fork starts without a reservation.
//
// Errors. Every failing operation leaves the cache and the pool exactly as
// they were: wrong input sizes, non-finite values (InvalidArgument), a head
// or layer out of range (OutOfRange), past a fixed capacity
// (CapacityExceeded), truncating past the end (OutOfRange), pool exhaustion
// (PoolExhausted: no layer gets a partial append), any use after Release
// (FailedPrecondition). Release is idempotent and also done on destruction;
// blocks go back exactly once (back to front, see pool.h for why).
//
// Implementation: src/cache/cache.cc (with cache_append.cc and
// cache_keep_rows.cc, which also holds DropLeadingBlocks); the two layouts are src/cache/contiguous_store.* and
// src/cache/paged_store.*.
//
// Thread safety: a SequenceCache is mutated by one thread at a time
// (external synchronization); its const methods (View, HeadKeys, ...) may run
// concurrently with each other, e.g. attention threads over its heads.
// Distinct caches may share a pool across threads freely.
// Views, spans and LayerCache handles are invalidated by any mutating call
// and by moving the cache; a moved-from cache may only be destroyed or
// assigned to.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvcache/codec.h"
#include "kvcache/format.h"
#include "kvcache/geometry.h"
#include "kvcache/kv_view.h"
#include "kvcache/pool.h"
#include "kvcache/status.h"

namespace kvcache {

enum class CacheLayout : uint8_t {
  kContiguous,  // per head [capacity][row_bytes] buffers
  kPaged,       // pool blocks [block][head][block_size][row_bytes] + block table
};

enum class CapacityPolicy : uint8_t {
  kGrow,   // planned capacity is a hint; appends past it grow the buffers
  kFixed,  // planned capacity is a hard limit; appends past it fail (CapacityExceeded)
};

// A precision window for low-bit formats: the first `sinks` positions and
// the last `recent` positions of every layer and kv head are kept a second
// time, as bf16 rows, beside the cache's own rows, and attention reads those
// bf16 rows instead of the quantized ones (the positions that carry most of
// every query's softmax mass: docs/compression.md). Every row still goes
// into the cache's format at append, so blocks, forks, prefix reuse and tiers
// see exactly the rows a cache without the window holds; the window is
// per-sequence memory outside the pool ((sinks + recent + slack) bf16 rows
// per layer, side and kv head, counted in allocated_bytes()).
//
// Which positions are held. Position p < sinks is held when it was appended
// to a cache holding every position before it, or when AdoptPrefix was given
// the sinks' rows (WindowSinks below: they travel with a published prefix
// through the prefix cache and the tiers). Of
// the rest, the window keeps the bf16 rows of the last recent + slack
// appended positions and attention reads the last `recent` of them. So a
// Truncate of up to `slack` positions (a speculative reject of that many
// draft tokens) leaves the window exactly as if the dropped positions had
// never been appended: speculative decoding with drafts of up to slack
// tokens gives plain decoding's results. A deeper truncation keeps what it
// can: a position whose row was overwritten is attended in the cache's
// format, so after Truncate(n) the window holds [max(p0, n - recent), n),
// p0 being its first kept position before, until appends refill it.
//
// Requirements: every head stores every position (no AppendOptions::alive
// with a dead head, no KeepRows): FailedPrecondition otherwise. A window is
// for quantized formats: InvalidArgument when both K and V are f32, f16 or
// bf16, or for more than kMaxSinks sinks / kMaxRecent recent positions /
// kMaxSlack slack rows, or slack without recent.
struct PrecisionWindow {
  static constexpr uint32_t kMaxSinks = 1024;
  static constexpr uint32_t kMaxRecent = 1u << 16;
  static constexpr uint32_t kMaxSlack = 1024;
  uint32_t sinks = 0;
  uint32_t recent = 0;
  uint32_t slack = 0;  // extra rows kept for truncations (see above); needs recent > 0
  bool enabled() const { return sinks > 0 || recent > 0; }
  bool operator==(const PrecisionWindow&) const = default;
};

// The bf16 rows of a precision window's sinks: positions [0, sinks) of
// every layer, side and kv head, exactly as the window holds them.
// SequenceCache::window_sinks() copies them out of a sequence that computed
// its sinks; AdoptPrefix takes them in, so a sequence that adopts a prefix
// covering the sinks reads the very bf16 rows the sequence that computed
// them reads. A prefix cache keeps them beside the block that completes the
// sinks (logical block (sinks - 1) / block_size, prefix_cache.h) and a tier
// in that block's object (serving/tier_object.h). Only the sinks travel: the recent
// positions inside adopted blocks are read in the cache's format.
//
// They fit a sequence whose window has the same `sinks`, geometry and
// formats; AdoptPrefix adopts the blocks without them (as if none were
// given) when `sinks` or `formats` differ, and refuses rows whose size or
// geometry is wrong (InvalidArgument, Check()).
struct WindowSinks {
  uint32_t sinks = 0;  // S, the window's sinks they were taken with
  uint32_t n_layers = 0;
  uint32_t n_kv_heads = 0;
  uint32_t head_dim = 0;
  FormatPair formats;  // the formats of the cache they were kept beside
  // [n_layers][2 (K, V)][n_kv_heads][sinks][RowBytes(kBF16, head_dim)]
  std::vector<uint8_t> rows;

  // The size `rows` must have (0 for out-of-range dimensions).
  size_t expected_bytes() const;
  // InvalidArgument unless 1 <= sinks <= PrecisionWindow::kMaxSinks, the
  // dimensions are within Geometry's limits and rows has expected_bytes().
  Status Check() const;
  // Also InvalidArgument unless n_layers, n_kv_heads and head_dim are
  // `geometry`'s.
  Status CheckFits(const Geometry& geometry) const;
  // The logical block holding the last sink position.
  uint32_t block(uint32_t block_size) const {
    return block_size == 0 || sinks == 0 ? 0 : (sinks - 1) / block_size;
  }
};

struct ContiguousOptions {
  // Planned capacity per head, in tokens (0 = start empty and grow). A
  // head's buffer is allocated at this size when it first stores a row.
  uint32_t capacity_tokens = 0;
  CapacityPolicy policy = CapacityPolicy::kGrow;
  uint64_t rotation_seed = RowCodec::kDefaultRotationSeed;
  PrecisionWindow window{};  // none by default
};

struct PagedOptions {
  // If > 0, Reserve(reserve_tokens) at creation (admission control: fails
  // with PoolExhausted, creating nothing, if the pool cannot promise it).
  // 0 reserves nothing: blocks are taken as appends need them, so that an
  // idle sequence (a prefix-cache probe, a fork that only reads) withholds
  // no block from the pool. A caller that wants the first block promised
  // even for an empty plan passes max(planned_tokens, 1).
  uint32_t reserve_tokens = 0;
  PrecisionWindow window{};  // none by default
};

struct AppendOptions {
  // Which kv heads store this append: empty = all; [n_kv_heads] = the same
  // mask for every layer of the call; [n_layers][n_kv_heads] (sequence-level
  // Append only) = per layer. Nonzero = alive. Applies to every token of a
  // chunk.
  std::span<const uint8_t> alive;
};

enum class CloneLayout : uint8_t {
  kContiguous,  // detached: holds no pool blocks (default)
  kSame,        // same layout as the source; a paged clone draws its own blocks
};
struct CloneOptions {
  CloneLayout layout = CloneLayout::kContiguous;
};

class SequenceCache;

// Per-sequence calibration: the RowTransform of every (layer, side, head).
// Immutable once built; shared between forks. A prefix cache that hands out
// blocks must hand out the calibration they were encoded with.
struct Calibration {
  // [n_layers][2 (K, V)][n_kv_heads]; an empty RowTransform means none.
  std::vector<RowTransform> transforms;
};

// A handle on one layer of a SequenceCache; each method is the
// SequenceCache method of the same name for this layer.
// Cheap to copy; invalidated when its SequenceCache is moved or destroyed.
// Thread safety: that of the SequenceCache it came from.
class LayerCache {
 public:
  uint32_t layer() const { return layer_; }
  uint32_t n_kv_heads() const;
  uint32_t head_dim() const;
  uint32_t num_tokens() const;  // positions appended to this layer

  // k, v: [n_tokens][n_kv_heads][head_dim]. One token or a chunk.
  Status Append(std::span<const float> k, std::span<const float> v,
                const AppendOptions& options = {});
  uint32_t head_len(uint32_t head) const;  // 0 for an out-of-range head
  // Decoded rows of one head: [head_len][head_dim], original (unrotated,
  // un-calibrated) space.
  Result<std::vector<float>> HeadKeys(uint32_t head) const;
  Result<std::vector<float>> HeadValues(uint32_t head) const;
  // [head_len] position index of each stored row.
  std::vector<uint32_t> HeadPositions(uint32_t head) const;
  // Adds probs ([head_len(head)], e.g. the attention probabilities one
  // query put on each stored row) to the head's per-row accumulator and to
  // the layer's per-position sum over heads.
  Status AccumulateImportance(uint32_t head, std::span<const float> probs);
  // [head_len] accumulated mass per stored row of one head (zeros if none).
  std::vector<float> HeadImportance(uint32_t head) const;
  // [num_tokens] accumulated mass per position, summed over heads.
  std::vector<float> Importance() const;
  // The view attention reads. FailedPrecondition after Release.
  Result<LayerKvView> View() const;
  // Bytes resident for this layer: contiguous: its buffers; paged: the
  // table's blocks * this layer's share of a block (K + V).
  size_t allocated_bytes() const;
  size_t used_bytes() const;       // stored rows * row bytes, K + V

 private:
  friend class SequenceCache;
  LayerCache(SequenceCache* seq, uint32_t layer) : seq_(seq), layer_(layer) {}
  SequenceCache* seq_;
  uint32_t layer_;
};

class SequenceCache {
 public:
  // Returns an empty contiguous cache (options: planned capacity, policy,
  // rotation seed of the turbo formats). InvalidArgument if a format cannot
  // take geometry.head_dim() or options.capacity_tokens exceeds 2^30.
  static Result<SequenceCache> CreateContiguous(const Geometry& geometry, FormatPair formats,
                                                const ContiguousOptions& options = {});
  // Returns an empty paged cache on `pool`, with Reserve(reserve_tokens)
  // done when options.reserve_tokens > 0 (PoolExhausted, creating nothing,
  // if the pool cannot promise it). InvalidArgument for a null pool.
  static Result<SequenceCache> CreatePaged(std::shared_ptr<BlockPool> pool,
                                           const PagedOptions& options = {});

  SequenceCache(SequenceCache&& other) noexcept;
  SequenceCache& operator=(SequenceCache&& other) noexcept;  // releases what *this held
  SequenceCache(const SequenceCache&) = delete;  // copies are explicit: Clone / Fork
  SequenceCache& operator=(const SequenceCache&) = delete;
  ~SequenceCache();  // Release()

  // --- shape -------------------------------------------------------------
  const Geometry& geometry() const;
  FormatPair formats() const;
  CacheLayout layout() const;
  uint32_t n_layers() const;
  uint32_t n_kv_heads() const;
  uint32_t head_dim() const;
  // Paged: positions per block; 0 for contiguous.
  uint32_t block_size() const;
  const std::shared_ptr<BlockPool>& pool() const;  // null for contiguous
  const RowCodec& codec(Side side) const;
  // The precision window (none unless created with one; kept by Fork and Clone).
  const PrecisionWindow& precision_window() const;

  // --- lengths and memory ------------------------------------------------
  uint32_t num_tokens() const;                // max over layers
  uint32_t num_tokens(uint32_t layer) const;  // 0 for an out-of-range layer
  uint32_t head_len(uint32_t layer, uint32_t head) const;
  // Rows every head can hold without allocating: contiguous: min over heads
  // of buffer capacity (planned capacity for heads not yet allocated);
  // paged: blocks held * block_size.
  uint32_t capacity_tokens() const;
  // Bytes resident for K and V: contiguous: its buffers; paged: blocks in
  // the table * block bytes (shared blocks counted in full by each holder).
  size_t allocated_bytes() const;
  // Bytes of rows actually stored (sum over layers, heads, sides).
  size_t used_bytes() const;
  // Contiguous: true iff created with a planned capacity and no buffer ever
  // grew past it. Paged: true iff the reservation covers the current need.
  bool is_within_planned_capacity() const;
  bool released() const;

  // --- appends -----------------------------------------------------------
  // k, v: [n_layers][n_tokens][n_kv_heads][head_dim] (n_tokens >= 1): one
  // token or a prefill chunk for every layer. All layers or none.
  Status Append(std::span<const float> k, std::span<const float> v,
                const AppendOptions& options = {});
  // k, v: [n_tokens][n_kv_heads][head_dim] for one layer.
  Status AppendLayer(uint32_t layer, std::span<const float> k, std::span<const float> v,
                     const AppendOptions& options = {});
  // Appends n positions whose K and V rows are all zeros, every head alive,
  // every layer (exactly as Append of zeros would).
  Status AdvanceLen(uint32_t n);

  // --- rollback and lifetime ----------------------------------------------
  // Keeps positions [0, num_tokens) of every layer; blocks no longer needed
  // go back to the pool (into the reservation first). OutOfRange if
  // num_tokens > this->num_tokens().
  Status Truncate(uint32_t num_tokens);
  // Drops the last n_drop positions: Truncate(num_tokens() - n_drop).
  // OutOfRange if n_drop > num_tokens().
  Status TruncateLast(uint32_t n_drop);
  // Back to empty: rows, calibration and importance dropped; paged blocks
  // released (into the reservation while Reserve's target asks for them).
  // Keeps the layout, pool and reservation target.
  Status Clear();
  // Gives everything back (blocks, reservation, contiguous buffers);
  // afterwards every operation but accessors fails with
  // FailedPrecondition. Idempotent; the destructor calls it. The one call
  // that ends any cache's life before its destructor.
  void Release();

  // --- copies ------------------------------------------------------------
  // Paged: shares every block (refcount +1 each) and copies the table and
  // per-head metadata. Contiguous: same as Clone(). PoolExhausted only when
  // the parent is reserved and its extra copy-on-write block cannot be.
  Result<SequenceCache> Fork();
  // Detached deep copy (same rows, lengths, calibration, importance).
  Result<SequenceCache> Clone(const CloneOptions& options = {}) const;

  // --- reservations (paged; no-ops returning OK on contiguous) ------------
  // See the file comment. Setting a smaller target returns surplus blocks.
  Status Reserve(uint32_t max_tokens);
  uint32_t reserved_blocks() const;
  uint32_t reservation_target_tokens() const;
  // True iff appends up to reservation_target_tokens() cannot fail.
  bool is_fully_reserved() const;

  // --- paged exports (empty spans for contiguous) ---------------------------
  // [num_blocks] logical -> physical block ids (what a paged-attention
  // kernel indexes); empty for contiguous.
  std::span<const uint32_t> block_table() const;
  // [1] the sequence length as u32 (a paged-attention kernel's context
  // lengths); empty for contiguous.
  std::span<const uint32_t> context_lens() const;
  // Names logical block `logical_block` (which must be full in every head)
  // by its content hash in the pool (prefix reuse); the block is treated as
  // shared from now on. The hash names the positions the block holds, which
  // must be one aligned block of positions, the same in every layer and head
  // (BlockFirstPosition): [b * block_size, (b + 1) * block_size) in a cache
  // that never dropped rows, [first + b * block_size, ...) after
  // DropLeadingBlocks or AdoptBlocksAt. FailedPrecondition otherwise (rows
  // compacted by KeepRows or by dead positions).
  Status SetBlockHash(uint32_t logical_block, uint64_t hash);
  // The position of the first row of logical block `logical_block`, when
  // the block holds block_size consecutive positions starting at a multiple
  // of block_size, the same in every layer and head. OutOfRange past the
  // table, FailedPrecondition for a block not full in every head or holding
  // other rows, or a contiguous cache.
  Result<uint32_t> BlockFirstPosition(uint32_t logical_block) const;
  // Starts an empty paged cache with prefix blocks found in a prefix cache:
  // takes over one reference per block that the CALLER already holds (e.g.
  // from BlockPool::RetainCached) and sets every layer and head to
  // blocks.size() * block_size rows, encoded with `calibration` (null: none).
  // With a precision window, `sinks` (the prefix's WindowSinks, null: none)
  // fills the window's sink slots when the adopted rows cover them and they
  // fit the window (same sinks and formats); otherwise the adopted positions
  // are all read in the format, sinks included. FailedPrecondition unless
  // empty and paged; InvalidArgument for sinks whose size or geometry is
  // wrong (WindowSinks::CheckFits); nothing changes on failure.
  Status AdoptPrefix(std::span<const uint32_t> blocks,
                     std::shared_ptr<const Calibration> calibration,
                     std::shared_ptr<const WindowSinks> sinks = nullptr);
  // AdoptPrefix of blocks that hold positions [first_position, first_position
  // + blocks.size() * block_size) rather than [0, ...): e.g. the blocks of a
  // sliding window that covered the last window before a prefix's end. Every
  // layer and head gets blocks.size() * block_size rows at those positions
  // and num_tokens() == first_position + blocks.size() * block_size, as if
  // the positions before first_position had been appended and dropped by
  // DropLeadingBlocks. AdoptBlocksAt(0, b, c) is AdoptPrefix(b, c).
  // InvalidArgument if first_position is not a multiple of block_size or the
  // end passes the cache's limit; FailedPrecondition for a precision window
  // and first_position > 0; otherwise AdoptPrefix's contract (nothing
  // changes on failure; the caller keeps its references then).
  Status AdoptBlocksAt(uint32_t first_position, std::span<const uint32_t> blocks,
                       std::shared_ptr<const Calibration> calibration);
  std::shared_ptr<const Calibration> calibration() const;
  // A copy of the window's sink rows, once every layer holds all of them
  // (the sequence appended positions [0, sinks) itself, or adopted them with
  // their WindowSinks); null otherwise, and without a window or sinks.
  std::shared_ptr<const WindowSinks> window_sinks() const;

  // --- per layer -----------------------------------------------------------
  LayerCache layer(uint32_t layer) { return LayerCache(this, layer); }
  // REQUIRES layer < n_layers(); see LayerCache for the per-layer methods.
  Result<LayerKvView> View(uint32_t layer) const;
  Result<std::vector<float>> HeadKeys(uint32_t layer, uint32_t head) const;
  Result<std::vector<float>> HeadValues(uint32_t layer, uint32_t head) const;
  std::vector<uint32_t> HeadPositions(uint32_t layer, uint32_t head) const;
  Status AccumulateImportance(uint32_t layer, uint32_t head, std::span<const float> probs);
  std::vector<float> HeadImportance(uint32_t layer, uint32_t head) const;
  std::vector<float> Importance(uint32_t layer) const;
  // Eviction (hybrid.h evicts through it): keeps only stored rows `rows` (strictly
  // ascending, each < head_len) of one head, compacted to rows 0..k-1 in that
  // order; each keeps its original position (HeadPositions) and importance.
  // Paged: blocks written are copied first if shared (copy-on-write), blocks
  // no longer covered by any head go back to the pool (into the reservation
  // first, as Truncate does). Keeping no row drops the head's calibration.
  // InvalidArgument on a bad row list, PoolExhausted if a copy-on-write
  // block cannot be had; nothing changes then.
  Status KeepRows(uint32_t layer, uint32_t head, std::span<const uint32_t> rows);
  // Drops the first n_blocks * block_size rows of every head of every layer
  // by giving the table's first n_blocks entries back to the pool: no row
  // moves. The metadata (rows, positions, importance, lengths, calibration)
  // is then what KeepRows(l, h, rows [n_blocks * block_size, head_len)) of
  // every layer and head makes; row r is afterwards in logical block r /
  // block_size as always. A shared block only loses this sequence's
  // reference; a block named by SetBlockHash stays cached in the pool.
  // Released blocks go into the reservation first, as Truncate's do. Needs
  // no block, so it cannot fail for lack of one. FailedPrecondition (nothing
  // changes) for a contiguous cache, a precision window, or a head with fewer
  // than n_blocks * block_size rows or whose rows in those blocks are not
  // one run of consecutive positions.
  Status DropLeadingBlocks(uint32_t n_blocks);

  // Internal consistency (and the pool's, for paged); Internal on failure.
  Status CheckInvariants() const;
  std::string DebugString() const;

  struct State;  // private; public only so that src/cache can name it

 private:
  friend class LayerCache;
  explicit SequenceCache(std::unique_ptr<State> state);
  std::unique_ptr<State> s_;
};

}  // namespace kvcache
