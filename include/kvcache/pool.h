// BlockPool: the fixed set of K/V blocks that every paged sequence draws from.
//
// A block holds `block_size` token positions of every kv head, for every layer,
// K and V. Storage is one arena per (layer, side), so that one layer's view of
// the pool is a plain strided array (see kv_view.h):
//
//   arena(layer, side): [num_blocks][n_kv_heads][block_size][row_bytes(side)]
//
// Metadata (refcount, state, free/LRU links, content hash) lives apart from
// the storage in a small array indexed by block id (u32, 0 <= id < num_blocks).
//
// Block states:
//   kFree    refcount 0, on the free list, content meaningless.
//   kInUse   refcount >= 1, held by sequences (several when shared by fork or
//            prefix reuse). A block is only ever written by a holder that
//            holds it exclusively: refcount 1 and no content hash.
//   kCached  refcount 0 but it carries a content hash (SetBlockHash): it stays
//            readable and can be taken again with RetainCached until the pool
//            needs it. Cached blocks sit on an LRU list; when the free list
//            is empty, allocation evicts the least recently released cached
//            block first (its hash is cleared and the EvictionListener, if
//            any, is told after the pool's lock is dropped). Release() puts
//            blocks on the LRU in the order given, so releasing a hash chain
//            tail-first (as SequenceCache does: it releases its block table
//            back to front) makes the tail evict before its prefix.
//
// Accounting (CheckInvariants verifies all of it):
//   free + cached + in_use == num_blocks
//   reserved <= free + cached            (reservations are always backed)
//   available = free + cached - reserved (what Allocate/Reserve can take)
//
// Reservations are admission control: Reserve(n) promises n blocks to a
// caller without choosing them; the caller later draws them with
// Allocate(out, from_reserved) which then cannot fail for those blocks. The
// pool only counts reservations; their owner (e.g. SequenceCache) keeps its
// own count and must Unreserve what it does not draw.
//
// Every operation that fails (PoolExhausted, InvalidArgument) changes
// nothing. Operations on block ids are programming contracts (an id out of
// range, releasing a free block): they return InvalidArgument /
// FailedPrecondition and change nothing rather than corrupt the pool.
//
// Thread safety: all methods are safe to call concurrently (one internal
// lock; alloc+release of one block is a few tens of nanoseconds). Block
// *storage* is not locked: holders read shared blocks freely and write only
// blocks they hold exclusively. The pool must outlive every cache holding
// its blocks (caches keep a shared_ptr to it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "kvcache/codec.h"
#include "kvcache/format.h"
#include "kvcache/geometry.h"
#include "kvcache/status.h"

namespace kvcache {

struct BlockPoolOptions {
  uint32_t num_blocks = 0;  // >= 1, < 2^31
  // Rotation seed of the pool's codecs (turbo formats); every sequence on
  // this pool encodes with the same codecs.
  uint64_t rotation_seed = RowCodec::kDefaultRotationSeed;
  // Back each storage arena of 2 MiB or more with transparent huge pages
  // (2 MiB-aligned, madvise(MADV_HUGEPAGE); a hint the kernel may ignore).
  // Attention walks blocks scattered over the arena, and with 4 KiB pages
  // nearly every block costs a TLB miss (docs/attention.md). Memory is then
  // committed 2 MiB at a time as blocks are first written, not 4 KiB.
  bool huge_pages = true;
};

enum class BlockState : uint8_t { kFree, kInUse, kCached };

// A consistent snapshot of the pool's counters (taken under one lock).
struct PoolStats {
  uint32_t num_blocks = 0;
  uint32_t free_blocks = 0;      // on the free list
  uint32_t cached_blocks = 0;    // refcount 0, hash set, evictable (LRU)
  uint32_t used_blocks = 0;      // refcount >= 1
  uint32_t reserved_blocks = 0;  // promised by Reserve, not yet drawn
  uint32_t available_blocks = 0; // free + cached - reserved
  uint64_t evictions = 0;        // cached blocks reclaimed by allocation, ever
};

// A cached block the pool reclaimed: its id and the hash it carried.
struct EvictedBlock {
  uint32_t block = 0;
  uint64_t hash = 0;
};
// Called after the pool's lock is released, on the allocating thread, with
// the blocks that allocation evicted. It may call back into the pool.
using EvictionListener = std::function<void(std::span<const EvictedBlock>)>;

class BlockPool {
 public:
  // InvalidArgument if a format cannot take geometry.head_dim() or
  // num_blocks is out of range. Arenas are zero-filled, lazily mapped memory.
  static Result<std::shared_ptr<BlockPool>> Create(const Geometry& geometry, FormatPair formats,
                                                   const BlockPoolOptions& options);
  // Bytes one block occupies (all layers, K and V).
  static size_t BlockBytes(const Geometry& geometry, FormatPair formats);
  // Largest block count whose storage fits in `bytes` (0 if none).
  static uint32_t BlocksForBytes(const Geometry& geometry, FormatPair formats, size_t bytes);

  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  const Geometry& geometry() const { return geometry_; }
  FormatPair formats() const { return formats_; }
  uint32_t num_blocks() const { return num_blocks_; }
  uint32_t block_size() const { return geometry_.block_size(); }
  size_t block_bytes() const;  // BlockBytes(geometry(), formats())
  size_t storage_bytes() const { return block_bytes() * num_blocks_; }
  const RowCodec& codec(Side side) const { return side == Side::kKey ? *k_codec_ : *v_codec_; }
  std::shared_ptr<const RowCodec> shared_codec(Side side) const {
    return side == Side::kKey ? k_codec_ : v_codec_;
  }

  // --- storage -----------------------------------------------------------
  // Arena of one layer and side: [num_blocks][n_kv_heads][block_size][row_bytes].
  const uint8_t* arena(uint32_t layer, Side side) const;
  size_t row_bytes(Side side) const;
  size_t head_stride(Side side) const;   // block_size * row_bytes
  size_t block_stride(Side side) const;  // n_kv_heads * head_stride
  // Start of block `block` of (layer, side): [n_kv_heads][block_size][row_bytes].
  // REQUIRES for writing: the caller holds `block` exclusively.
  uint8_t* block_data(uint32_t layer, Side side, uint32_t block);
  const uint8_t* block_data(uint32_t layer, Side side, uint32_t block) const;
  // Copies the whole content of `src` (all layers, K and V) into `dst`.
  // REQUIRES: caller holds both; `dst` exclusively.
  void CopyBlock(uint32_t src, uint32_t dst);

  // --- allocation --------------------------------------------------------
  // Takes out.size() blocks (refcount 1, no hash), all or nothing. The first
  // `from_reserved` of them come out of reservations (REQUIRES the caller
  // owns that many reserved blocks); the rest need available_blocks().
  // Takes free blocks first (most recently freed first), then evicts cached
  // blocks, least recently released first. PoolExhausted changes nothing.
  Status Allocate(std::span<uint32_t> out, uint32_t from_reserved = 0);
  // +1 reference on each block. REQUIRES: each is kInUse.
  Status Retain(std::span<const uint32_t> blocks);
  // -1 reference on each block, in order. A block reaching 0 goes to the
  // free list (no hash) or to the MRU end of the cached list (hash set).
  // Validates every id first; an invalid one changes nothing.
  Status Release(std::span<const uint32_t> blocks);
  // Release, then reserve up to `max_reserve` blocks for the caller out of
  // the availability this release created (atomically, so no other thread
  // can take them in between). Returns how many it reserved. Used by
  // truncate to keep a sequence's reservation whole.
  Result<uint32_t> ReleaseAndReserve(std::span<const uint32_t> blocks, uint32_t max_reserve);
  uint32_t refcount(uint32_t block) const;  // 0 for an invalid id
  BlockState state(uint32_t block) const;
  // True iff the caller (a holder) may write `block` in place: refcount 1
  // and no hash. Taking the pool's lock here also orders the write after
  // the other holders' releases.
  bool IsExclusive(uint32_t block) const;

  // --- reservations (admission control) ----------------------------------
  // Promises n blocks to the caller, all or nothing (PoolExhausted).
  Status Reserve(uint32_t n);
  // Returns n reserved-but-undrawn blocks. REQUIRES: the caller owns them.
  void Unreserve(uint32_t n);

  // --- content hashes (prefix reuse hook) --------------------------------
  // Names an in-use block by its content; it is cached instead of freed when
  // its last reference goes. Writers treat a hashed block as shared (copy on
  // write). Prefer SequenceCache::SetBlockHash, which also tells the cache.
  Status SetBlockHash(uint32_t block, uint64_t hash);
  // Takes a reference on `block` iff it is in use or cached and carries
  // `hash` (a cached block leaves the LRU). False if it was evicted or
  // renamed meanwhile; nothing changes then.
  bool RetainCached(uint32_t block, uint64_t hash);
  // Forgets a block's hash (a cached one goes to the free list).
  Status ClearBlockHash(uint32_t block);
  // The block's hash, if it has one.
  std::optional<uint64_t> block_hash(uint32_t block) const;
  void SetEvictionListener(EvictionListener listener);

  // --- counters ----------------------------------------------------------
  PoolStats stats() const;
  uint32_t num_free_blocks() const { return stats().free_blocks; }
  uint32_t num_cached_blocks() const { return stats().cached_blocks; }
  uint32_t num_used_blocks() const { return stats().used_blocks; }
  uint32_t num_reserved_blocks() const { return stats().reserved_blocks; }
  uint32_t num_available_blocks() const { return stats().available_blocks; }

  // Walks every list and counter; Internal with a description if anything
  // disagrees. For tests.
  Status CheckInvariants() const;
  std::string DebugString() const;

 private:
  struct Impl;
  BlockPool(const Geometry& geometry, FormatPair formats, uint32_t num_blocks);

  Geometry geometry_;
  FormatPair formats_;
  uint32_t num_blocks_ = 0;
  std::shared_ptr<const RowCodec> k_codec_, v_codec_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvcache
