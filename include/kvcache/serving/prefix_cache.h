// Prefix reuse: content-addressed full blocks, longest-prefix lookup, LRU reuse.
//
// A full block (block_size committed tokens) is named by a hash chain:
//   hash(block i) = XXH3-128(hash(block i-1) || token ids of block i)
// with hash(block -1) = ChainRoot(salt). Two sequences share a block only if
// their whole token prefixes up to and including that block are identical and
// they use the same salt (namespace: a tenant, a LoRA adapter, ...). Partially
// filled blocks and speculative draft tokens are never published: callers
// publish committed tokens only, and only full blocks are named.
//
// Lifecycle of a cached block (the BlockPool holds refcounts and the LRU):
//   Publish         -> in use and named: the pool's block carries the low 64
//                      bits of the chain hash (BlockPool::SetBlockHash)
//   last reference  -> the pool keeps it as kCached on its LRU list; lookups
//                      still find it
//   Acquire (a hit) -> RetainCached takes it back: no K/V recomputed or copied
//   pool needs room -> the pool evicts least recently released first and
//                      tells us (eviction listener); we forget it
// Sequences release their block tables back to front, so a chain's tail is
// released, and so evicted, before its prefix. As a safety net for callers
// that release in another order, evicting a block also drops every cached
// descendant of it (they could never be found again): a cached suffix never
// outlives its prefix (counted in stats().orphans_dropped).
//
// Publish stops at the first block whose hash is already cached under a
// different physical block (a duplicate computed concurrently), so a sequence
// that references a cached block references all of its cached ancestors.
//
// Calibration: formats that calibrate per sequence (see cache.h) encode rows
// with the first sequence's transforms; a chain stores the Calibration it was
// published with and hands it out with the blocks.
//
// Precision-window sinks: a publisher with a window passes its WindowSinks
// (cache.h; SequenceCache::window_sinks). They are kept with the block that
// completes them (logical block (sinks - 1) / block_size) when this
// publication names that block, dropped with it when it is evicted or
// forgotten, and handed out (PrefixMatch::sinks) with any match that
// includes it. They are outside the pool's blocks: a few bf16 rows per chain.
//
// Thread safety: all methods are thread-safe (one internal mutex). The pool's
// eviction listener runs after the pool's lock is dropped, and the prefix
// cache calls the pool while holding its own lock (lock order: prefix cache,
// then pool), so they never deadlock. Between an eviction and its listener
// call the cache may still name the block: Acquire then fails RetainCached
// and stops, and Publish sees the pool's hash has changed and forgets it.
// Destroy the prefix cache only while no other thread uses the pool (its
// destructor removes the eviction listener).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvcache/pool.h"
#include "kvcache/status.h"

namespace kvcache {

class SequenceCache;
struct Calibration;
struct WindowSinks;

using TokenId = uint32_t;

// A 128-bit chain hash (XXH3-128). Collisions are treated as impossible.
struct BlockHash {
  uint64_t lo = 0;
  uint64_t hi = 0;
  bool operator==(const BlockHash&) const = default;
};
struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const {
    return static_cast<size_t>(h.lo ^ (h.hi * 0x9E3779B97F4A7C15ull));
  }
};

// The hash every chain of namespace `salt` starts from; the empty salt is the
// shared namespace. Deterministic across runs and machines.
BlockHash ChainRoot(std::string_view salt);
// The hash of a block holding `tokens` whose predecessor hashes to `parent`:
// XXH3-128 of parent.lo, parent.hi (8 bytes LE each), then each id (4 bytes LE).
BlockHash ChainHash(const BlockHash& parent, std::span<const TokenId> tokens);
// Hashes of the full blocks of `tokens` (tokens.size() / block_size of them).
std::vector<BlockHash> HashFullBlocks(std::span<const TokenId> tokens, uint32_t block_size,
                                      std::string_view salt);

// Why a lookup stopped short of the whole sequence.
enum class MissReason : uint8_t {
  kNotCached,     // the next full block was never cached (or history forgot it)
  kEvicted,       // the next full block was cached once and evicted since
  kSalt,          // the first block is cached, but only under another salt
  kPartialBlock,  // the tokens after the last full block: never cacheable
};
inline constexpr size_t kNumMissReasons = 4;
// "not_cached", "evicted", "salt", "partial_block".
std::string_view MissReasonName(MissReason reason);

struct PrefixCacheStats {
  uint64_t lookups = 0;
  uint64_t lookup_tokens = 0;  // tokens offered to Acquire
  uint64_t hit_tokens = 0;     // of those, served from cached blocks
  uint64_t published_blocks = 0;
  uint64_t evictions = 0;       // cached blocks the pool reclaimed
  uint64_t orphans_dropped = 0; // descendants dropped with an evicted prefix
  // Per reason: lookups that stopped for it, and the tokens it cost. The full
  // blocks after the hit count for one of the first three reasons, the
  // trailing partial block for kPartialBlock, so for every lookup
  // hit_tokens + sum(miss_tokens) == its tokens.
  std::array<uint64_t, kNumMissReasons> miss_lookups{};
  std::array<uint64_t, kNumMissReasons> miss_tokens{};
  double hit_rate() const {
    return lookup_tokens ? double(hit_tokens) / double(lookup_tokens) : 0.0;
  }
};

// What the prefix cache needs from a block pool; BlockPool provides all of it
// (PoolPrefixBackend). Tests substitute a model or a fault-injecting fake.
class PrefixCacheBackend {
 public:
  virtual ~PrefixCacheBackend() = default;
  virtual uint32_t num_blocks() const = 0;
  virtual uint32_t block_size() const = 0;
  // See BlockPool: same contracts.
  virtual bool RetainCached(uint32_t block, uint64_t hash) = 0;
  virtual Status SetBlockHash(uint32_t block, uint64_t hash) = 0;
  virtual Status ClearBlockHash(uint32_t block) = 0;
  virtual Status Release(std::span<const uint32_t> blocks) = 0;
  virtual void SetEvictionListener(EvictionListener listener) = 0;
  virtual std::optional<uint64_t> block_hash(uint32_t block) const = 0;
};

// A backend over a real pool (keeps it alive).
std::unique_ptr<PrefixCacheBackend> PoolPrefixBackend(std::shared_ptr<BlockPool> pool);

struct PrefixCacheOptions {
  // Evicted hashes remembered to tell kEvicted from kNotCached (FIFO).
  size_t evicted_history = 1 << 16;
};

// The longest cached prefix of a sequence, in whole blocks.
struct PrefixMatch {
  std::vector<uint32_t> blocks;  // [num_tokens / block_size] block ids, chain order
  size_t num_tokens = 0;         // blocks.size() * block_size
  std::shared_ptr<const Calibration> calibration;  // what the blocks were encoded with
  // The precision-window sink rows published with one of the blocks (the
  // first such block of the match), or null.
  std::shared_ptr<const WindowSinks> sinks;
};

class PrefixCache {
 public:
  // Installs itself as the backend's eviction listener (removed on destruction).
  static Result<std::unique_ptr<PrefixCache>> Create(std::unique_ptr<PrefixCacheBackend> backend,
                                                     const PrefixCacheOptions& options = {});
  static Result<std::unique_ptr<PrefixCache>> Create(std::shared_ptr<BlockPool> pool,
                                                     const PrefixCacheOptions& options = {});
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  uint32_t block_size() const;

  // Finds the longest cached prefix of `tokens` under `salt` and takes one
  // pool reference on each of its blocks for the caller, who gives them back
  // through the pool (or hands them to SequenceCache::AdoptPrefix). A block
  // the pool evicted meanwhile ends the match. Counts one lookup.
  PrefixMatch Acquire(std::span<const TokenId> tokens, std::string_view salt);
  // Like Acquire, but takes no references and counts nothing.
  PrefixMatch Peek(std::span<const TokenId> tokens, std::string_view salt) const;

  // Publishes the full blocks of committed `tokens`: blocks[i] holds tokens
  // [i*B, (i+1)*B). Walks from the first block: blocks already cached are
  // skipped; it stops at a block whose hash is cached under another physical
  // block. `set_hash(i, hash)` names block i in the pool (default:
  // BlockPool::SetBlockHash; SequenceCache users pass its SetBlockHash).
  // REQUIRES: the caller holds a reference on every block it passes. Returns
  // how many blocks were newly published. `sinks`: the publisher's
  // precision-window sink rows (null: none); InvalidArgument, publishing
  // nothing, if they fail WindowSinks::Check.
  using SetHashFn = std::function<Status(size_t logical_block, uint64_t hash)>;
  Result<size_t> Publish(std::span<const TokenId> tokens, std::span<const uint32_t> blocks,
                         std::string_view salt,
                         std::shared_ptr<const Calibration> calibration = nullptr,
                         const SetHashFn& set_hash = nullptr,
                         std::shared_ptr<const WindowSinks> sinks = nullptr);

  // The same for callers that keep their chain hashes: hashes[i] names block
  // i (HashFullBlocks, or extended one block at a time with ChainHash);
  // first_block = the tokens of block 0 (for salt-miss accounting). Blocks
  // [0, start) must be ones this caller published (or adopted) before; only
  // blocks from `start` are hashed into the cache. Returns `end`: blocks
  // [0, end) are now cached as the caller's blocks; end < hashes.size() means
  // publication stopped at a duplicate and later calls will not get further.
  Result<size_t> PublishHashed(std::span<const BlockHash> hashes, std::span<const uint32_t> blocks,
                               size_t start, std::span<const TokenId> first_block,
                               std::string_view salt,
                               std::shared_ptr<const Calibration> calibration = nullptr,
                               const SetHashFn& set_hash = nullptr,
                               std::shared_ptr<const WindowSinks> sinks = nullptr);

  // Sequence-level helpers. AdoptInto: Acquire + SequenceCache::AdoptPrefix
  // into an empty paged `seq` (on failure the references are given back),
  // with the match's sinks; returns the tokens adopted. PublishSequence:
  // publishes seq's full blocks, `tokens` being its committed tokens
  // (REQUIRES tokens.size() <= its length), with its window's sinks.
  Result<size_t> AdoptInto(SequenceCache* seq, std::span<const TokenId> tokens,
                           std::string_view salt);
  Result<size_t> PublishSequence(SequenceCache* seq, std::span<const TokenId> tokens,
                                 std::string_view salt);

  size_t num_cached_blocks() const;  // named blocks we know (in use or parked)
  bool IsCached(uint32_t block) const;
  PrefixCacheStats stats() const;
  void ResetStats();
  // "" when consistent (every cached block's parent cached, maps agree), else
  // a description of the first broken invariant.
  std::string CheckInvariants() const;

 private:
  struct State;
  PrefixCache(std::unique_ptr<PrefixCacheBackend> backend, const PrefixCacheOptions& options);
  void OnEvicted(std::span<const EvictedBlock> evicted);
  std::unique_ptr<PrefixCacheBackend> backend_;
  std::unique_ptr<State> state_;
};

}  // namespace kvcache
