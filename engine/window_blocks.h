// WindowBlockIndex: the prefix cache of a sliding-window group's pool.
//
// A model with sliding-window layers keeps two pools (kv_manager.h): the
// full layers' blocks are named by the prefix cache's hash chain
// (kvcache/serving/prefix_cache.h), and the window layers' blocks by the
// same chain: window block j holds positions [j*B, (j+1)*B) of the window
// layers, exactly as full block j holds them of the full layers, and
// carries the same chain hash. What differs is what a hit needs. A prompt
// reused up to position P needs every full block before P but only the
// window blocks a sequence of length P holds (the last window before P,
// HybridModel::WindowKeepFrom): the older window blocks are never read
// again by that request. So the window index is not a chain: each hash
// names one block independently, an entry outlives its predecessors, and a
// lookup asks for a run of hashes [first, end) all at once.
//
// Lifecycle: a sequence publishes each window block once it is full
// (Publish names it in the pool); when the window slides past it the
// sequence drops its reference and the pool parks it as a cached block
// (evictable, least recently released first); a hit retains it again
// (Acquire); when the pool evicts it the index forgets it (the pool's
// eviction listener). A hash already named by another block is not named
// again (the caller's copy stays private and is freed with it).
//
// What no hit can use goes first. A hit ending at P needs the full chain's
// blocks before P, so once the prefix cache forgets a full block (the pool
// evicted it, or it was dropped with an evicted ancestor) the window block
// with the same hash can never be part of a hit again: the index forgets it
// and, if it is parked, frees it at once (ForgetChain), before the pool has
// to evict a window block some hit could still use. WatchChain wraps the
// prefix cache's backend so that every such loss reaches ForgetChain.
//
// Calibration: formats that calibrate per sequence encode a block with its
// publisher's transforms; an entry keeps them, and a run whose blocks do
// not all share one calibration is not a hit (Covers is false).
//
// Thread safety: all methods are thread-safe (one mutex); the eviction
// listener runs on the allocating thread after the pool's lock is dropped.
// Destroy the index only while no other thread uses the pool.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvcache/cache.h"
#include "kvcache/pool.h"
#include "kvcache/serving/prefix_cache.h"
#include "kvcache/status.h"

namespace kvcache::engine {

struct WindowMatch {
  std::vector<uint32_t> blocks;  // one reference each, for the caller
  std::shared_ptr<const Calibration> calibration;
};

struct WindowIndexStats {
  uint64_t published_blocks = 0;  // blocks named, ever
  uint64_t hit_blocks = 0;        // blocks handed out by Acquire, ever
  uint64_t evictions = 0;         // entries the pool reclaimed
  uint64_t unreachable = 0;       // entries forgotten with their full chain block (ForgetChain)
};

class WindowBlockIndex {
 public:
  // Installs itself as the pool's eviction listener (removed on destruction).
  explicit WindowBlockIndex(std::shared_ptr<BlockPool> pool);
  ~WindowBlockIndex();
  WindowBlockIndex(const WindowBlockIndex&) = delete;
  WindowBlockIndex& operator=(const WindowBlockIndex&) = delete;

  // Names `block` (full, held by the caller) by `hash`: set_hash(hash.lo)
  // names it in the pool (the sequence's SetBlockHash, so the sequence
  // treats it as shared), then the index records it with `calibration`.
  // False (nothing done) when the hash already names a block; an error of
  // set_hash is returned and nothing is recorded.
  Result<bool> Publish(const BlockHash& hash, uint32_t block, std::shared_ptr<const Calibration> calibration,
                       const std::function<Status(uint64_t)>& set_hash);
  // True iff every hash names a block and they share one calibration
  // (no references taken, nothing counted). An empty run is covered.
  bool Covers(std::span<const BlockHash> hashes) const;
  // How many of the blocks `hashes` name are parked (cached, unreferenced):
  // what adopting them takes out of the pool's available blocks.
  size_t Parked(std::span<const BlockHash> hashes) const;
  // The positions in `hashes` that name no block (ascending).
  std::vector<size_t> Missing(std::span<const BlockHash> hashes) const;
  // One reference on each block of the run for the caller, all or nothing:
  // NotFound (nothing held) when one is missing or the pool reclaimed it.
  Result<WindowMatch> Acquire(std::span<const BlockHash> hashes);

  // The full chain block named `hash_lo` (the pool's 64 bits) is gone:
  // forgets the window block of that hash, freeing it if parked (one in use
  // keeps its name in the pool and is freed when evicted).
  void ForgetChain(uint64_t hash_lo);
  // A prefix-cache backend over `full` that passes every call on and tells
  // `index` of each full block the prefix cache loses (evicted by the pool,
  // or un-named by the cache). `index` must outlive it.
  static std::unique_ptr<PrefixCacheBackend> WatchChain(std::unique_ptr<PrefixCacheBackend> full,
                                                        WindowBlockIndex* index);

  size_t size() const;
  WindowIndexStats stats() const;
  // "" when every entry's block carries its hash in the pool, else the
  // first one that does not.
  std::string CheckInvariants() const;

 private:
  struct Entry {
    uint32_t block = 0;
    std::shared_ptr<const Calibration> calibration;
  };
  void OnEvicted(std::span<const EvictedBlock> evicted);

  std::shared_ptr<BlockPool> pool_;
  mutable std::mutex mu_;
  std::unordered_map<BlockHash, Entry, BlockHashHasher> by_hash_;
  std::unordered_map<uint32_t, BlockHash> by_block_;
  std::unordered_map<uint64_t, BlockHash> by_lo_;  // the pool's 64-bit names
  WindowIndexStats stats_;
};

}  // namespace kvcache::engine
