// OffloadCache: a PrefixCache whose blocks outlive the pool, through tiers
// (tier_store.h): host memory, a disk folder, a shared Redis.
//
// Store (write-through at publication). Publish names a sequence's new full
// blocks in the prefix cache, then queues each of them for the tiers: the
// queue entry holds one pool reference on the block (a hashed block is never
// written again, and the reference keeps the pool from reusing it), so no
// bytes are copied on the caller's thread. A background thread encodes the
// queued blocks (tier_object.h), drops its references, and stores each
// object in every tier that does not already hold it, in tier order. A full
// queue drops the store and counts it: Publish never waits on a tier.
// (Writing at pool eviction instead would need the bytes copied under the
// pool's lock: by the time the eviction listener runs, the block already
// belongs to the allocating caller.)
//
// Load. Acquire asks the pool's prefix cache first; if full blocks remain it
// asks the tiers, in order, which of the next blocks they hold (one batched
// Exists per tier), takes the contiguous run that some tier holds, loads it
// (one batched Load per tier), then allocates staging pool blocks for the
// fetched run (all or nothing) and verifies each object while copying it
// into its staging block (VerifyAndDecodeBlockObject: magic, version,
// compatibility digest, checksums, chain, parent, tokens). The first block
// that is missing or fails ends the prefix; its staging block and the later
// ones go back unnamed, and a failed object is erased from its tier and its
// reason counted. Only the verified blocks are named in the prefix cache and
// returned with the pool's hits: nobody else can read a staging block, and
// a caller never sees unverified bytes. If the answer is still short of the
// tokens' full blocks and the pool now holds more of the chain (a publish
// that landed during the lookup), the pool's longer answer is taken instead
// (the pool counts a second lookup; the tiers count no hit).
//
// Calibration: every chain is offloaded, whatever calibration it was
// published with. A block encoded with another calibration than
// options.calibration (whose digest is part of the compatibility digest; none
// if null) names its calibration's digest, and the calibration is stored
// once per tier as its own object, before the blocks that name it (tier_object.h).
// A load hands out the calibration the blocks were encoded with: the run of
// tier blocks ends where their calibrations disagree (with each other or
// with the pool's hit before them), and a run whose calibration object is
// missing or fails verification is not used (a counted miss, docs/tiers.md).
//
// Precision-window sinks: a publisher's WindowSinks (cache.h) go with the
// block that completes them, in the prefix cache and in that block's object
// (tier_object.h, kBlockFlagSinks), and come back with any match that includes it
// (PrefixMatch::sinks, AcquireInto's `adopt` argument, AdoptInto), from the
// pool or a tier, in this process or another. A sink section that fails its
// checksum, or names sinks that end outside its block, makes the block a
// corrupt miss. Only the sinks travel: the adopter reads the recent
// positions inside adopted blocks in the format.
//
// Layer groups: a model whose layers keep their positions differently (a
// sliding-window model) keeps one pool per group and one OffloadCache per
// pool, each naming its group (OffloadOptions::group: in the compatibility
// digest and in every object). The full group's works as above. A sliding-
// window group's blocks are not a chain a hit walks from the root: a hit
// needs only the run of blocks the last window holds, so that group's
// OffloadCache has no prefix cache (its holder names blocks itself:
// engine/window_blocks.h); its holder queues each block it names
// (OffloadBlock) and loads the blocks a run lacks by chain index, all or
// nothing (LoadBlocks), each verified against its chain hash, parent hash
// and tokens like a chain's.
//
// Thread safety: all methods are thread-safe. Destroy the OffloadCache before
// its pool's last user goes: the destructor stops the writer (queued stores
// are given up and their references released).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvcache/pool.h"
#include "kvcache/serving/prefix_cache.h"
#include "kvcache/serving/tier_object.h"
#include "kvcache/serving/tier_store.h"
#include "kvcache/status.h"

namespace kvcache {

struct OffloadOptions {
  std::string model;  // model fingerprint (BlockCompat::model)
  // The calibration most chains carry, if one (its digest goes into the
  // compatibility digest and its blocks' objects need not name it); any
  // other is stored beside the blocks. InvalidArgument from Create unless it
  // fits the pool's geometry.
  std::shared_ptr<const Calibration> calibration;
  size_t queue_blocks = 256;        // store queue bound (blocks)
  size_t store_batch = 16;          // blocks the writer encodes and stores at once
  uint32_t max_load_blocks = 1024;  // blocks one Acquire asks the tiers for
  // The layer group the pool holds, for a model with several (BlockCompat::
  // group); none for a model whose every layer keeps every position.
  std::optional<LayerGroupTag> group;
};

// Per-tier counters (a consistent snapshot).
struct TierStats {
  std::string name;
  uint64_t lookups = 0;      // Acquire calls that consulted this tier
  uint64_t hit_blocks = 0;   // blocks it supplied, verified and adopted
  uint64_t hit_tokens = 0;
  // Blocks it was asked for and did not supply, by TierMiss: the block that
  // ended a lookup's prefix (once per tier consulted for it), and every
  // object of this tier that failed verification.
  std::array<uint64_t, kNumTierMisses> misses{};
  uint64_t bytes_loaded = 0;  // object bytes received
  uint64_t bytes_stored = 0;  // object bytes written
  uint64_t stored_blocks = 0;
  uint64_t dropped_stores = 0;  // queue full (all tiers) + this tier's failed puts
  double load_p50_us = 0;       // per batched Load call
  double load_p99_us = 0;
  TierUsage usage;
};

struct OffloadStats {
  std::vector<TierStats> tiers;
  uint64_t queued_blocks = 0;
  uint64_t dropped_queue_full = 0;
  uint64_t load_alloc_failures = 0;  // tier hits given up: the pool had no room
};

class OffloadCache {
 public:
  // `cache` must be a PrefixCache over `pool` that outlives this object, or
  // null for a pool whose holder names its blocks (a sliding-window group):
  // then Acquire finds nothing and Publish is FailedPrecondition; use
  // OffloadBlock and LoadBlocks.
  static Result<std::unique_ptr<OffloadCache>> Create(std::shared_ptr<BlockPool> pool,
                                                      PrefixCache* cache,
                                                      std::vector<std::shared_ptr<Tier>> tiers,
                                                      const OffloadOptions& options);
  ~OffloadCache();
  OffloadCache(const OffloadCache&) = delete;
  OffloadCache& operator=(const OffloadCache&) = delete;

  const BlockHash& compat_digest() const;

  // Like PrefixCache::Acquire, then the tiers for the blocks after the pool's
  // hit. The caller owns one reference on each returned block.
  // `served_by_tier`, if given, is resized to tiers+1: [0] tokens from the
  // pool, [1 + t] tokens from tier t.
  PrefixMatch Acquire(std::span<const TokenId> tokens, std::string_view salt,
                      std::vector<uint64_t>* served_by_tier = nullptr);

  // PrefixCache::PublishHashed (tokens: the committed tokens, at least
  // hashes.size() * block_size), then queues blocks [start, end) for the
  // tiers. Returns end as PublishHashed does. With tiers, InvalidArgument
  // (nothing published) if `calibration` is not one of this pool's geometry
  // (CheckCalibration). `sinks`: the publisher's window sinks (null: none);
  // InvalidArgument (nothing published) unless they fit the pool's geometry
  // (WindowSinks::CheckFits).
  Result<size_t> Publish(std::span<const BlockHash> hashes, std::span<const uint32_t> blocks,
                         size_t start, std::span<const TokenId> tokens, std::string_view salt,
                         std::shared_ptr<const Calibration> calibration = nullptr,
                         const PrefixCache::SetHashFn& set_hash = nullptr,
                         std::shared_ptr<const WindowSinks> sinks = nullptr);

  // Sequence-level calls: the tiered counterparts of PrefixCache::AdoptInto
  // and PublishSequence, for a caller that serves requests from paged
  // sequences.
  //
  // AdoptInto: Acquire(tokens, salt, served_by_tier), then the blocks are
  // adopted into the empty paged `seq` (SequenceCache::AdoptPrefix), which
  // takes over the references. Returns the tokens adopted: a multiple of the
  // block size, at most tokens.size() (0: nothing cached; `seq` untouched).
  // FailedPrecondition, before any lookup, unless `seq` is empty and paged.
  // If the adoption fails, its status is returned, the references go back to
  // the pool (tail first) and `seq` is unchanged; blocks loaded from the
  // tiers stay cached in the pool, as after any Acquire.
  Result<size_t> AdoptInto(SequenceCache* seq, std::span<const TokenId> tokens,
                           std::string_view salt, std::vector<uint64_t>* served_by_tier = nullptr);
  // The same for a holder of a paged sequence that adopts through its own
  // call (it wraps SequenceCache::AdoptPrefix): `adopt(blocks, calibration,
  // sinks)` is called once, only if blocks were found, and must take over the
  // references exactly when it returns Ok (sinks: the match's, or null).
  using AdoptFn = std::function<Status(std::span<const uint32_t> blocks,
                                       std::shared_ptr<const Calibration> calibration,
                                       std::shared_ptr<const WindowSinks> sinks)>;
  Result<size_t> AcquireInto(std::span<const TokenId> tokens, std::string_view salt,
                             const AdoptFn& adopt, std::vector<uint64_t>* served_by_tier = nullptr);

  // PublishSequence: Publish for the paged `seq` whose committed tokens are
  // `tokens` (its first tokens.size() positions): its full blocks from block
  // `start` are named and queued for the tiers; blocks [0, start) must be
  // ones this caller published or adopted before (0: the whole sequence).
  // Returns end as Publish does: blocks [0, end) are now cached as seq's, and
  // end < tokens.size() / block_size means publication stopped at a
  // duplicate (later calls get no further). FailedPrecondition unless paged,
  // InvalidArgument if tokens.size() > seq->num_tokens(); on either nothing
  // is published. The sequence's window sinks, if complete, go with it.
  Result<size_t> PublishSequence(SequenceCache* seq, std::span<const TokenId> tokens,
                                 std::string_view salt, size_t start = 0);
  // The same for a holder that names its blocks through its own call:
  // `block_table` holds the committed `tokens` (block i: tokens [i*B,
  // (i+1)*B)), `calibration` is what they were encoded with, `set_hash`
  // names one and `sinks` are the holder's window sinks (Publish).
  // InvalidArgument, publishing nothing, if the table is shorter than the
  // full blocks of `tokens`.
  Result<size_t> PublishBlocks(std::span<const TokenId> tokens, std::span<const uint32_t> block_table,
                               size_t start, std::string_view salt,
                               std::shared_ptr<const Calibration> calibration,
                               const PrefixCache::SetHashFn& set_hash,
                               std::shared_ptr<const WindowSinks> sinks = nullptr);

  // Blocks named by their holder rather than the prefix cache (a sliding-
  // window group's). OffloadBlock queues `block` (held by the caller, named,
  // never written again), chain block `index` of `tokens` under `salt`
  // (`hashes`: the chain hashes of tokens' full blocks, at least index + 1
  // of them), encoded with `calibration`, for the tiers, as Publish queues a
  // chain's blocks. InvalidArgument (nothing queued) for an index past the
  // hashes or tokens, or a calibration the tiers cannot store.
  Status OffloadBlock(std::span<const BlockHash> hashes, size_t index, uint32_t block,
                      std::span<const TokenId> tokens, std::string_view salt,
                      std::shared_ptr<const Calibration> calibration = nullptr);
  // LoadBlocks loads chain blocks `indices` (ascending, each < hashes.size())
  // of `tokens` from the tiers into fresh blocks of the pool, all or none:
  // every block must be held by some tier and verify (magic, version,
  // compatibility digest, checksums, chain, parent, tokens) and all must
  // carry one calibration. On success the blocks, [i] holding indices[i],
  // one reference each for the caller, unnamed, and their calibration; else
  // NotFound (a miss: counted per tier, a failed object erased from its
  // tier), PoolExhausted (no room to stage them) or InvalidArgument, and
  // nothing held.
  struct LoadedBlocks {
    std::vector<uint32_t> blocks;
    std::shared_ptr<const Calibration> calibration;
  };
  Result<LoadedBlocks> LoadBlocks(std::span<const BlockHash> hashes, std::span<const size_t> indices,
                                  std::span<const TokenId> tokens, std::string_view salt);

  // Waits until every queued store has been written (tests, end of a run).
  void Flush();
  OffloadStats stats() const;

 private:
  struct State;
  explicit OffloadCache(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// Builds tiers from a spec list: "host:4GiB", "disk:PATH:20GiB",
// "redis://[:password@]host:port[/db]" (comma-separated). Sizes take B, KiB,
// MiB, GiB, TiB (or none: bytes).
Result<std::vector<std::shared_ptr<Tier>>> MakeTiers(std::string_view specs);
Result<uint64_t> ParseByteSize(std::string_view text);

}  // namespace kvcache
