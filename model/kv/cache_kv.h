// CacheKv: the decoder's K/V in a kvcache::SequenceCache, attention by
// kvcache's kernels (AttendDecode for one token, AttendMulti for a block of
// tokens -- a prefill or a speculative verify).
//
// A pass maps onto the public API as: Extend(n) checks room; Store(layer)
// is SequenceCache::AppendLayer (one layer's n positions; the cache allows
// layers to be appended one at a time); Attend(layer) takes
// SequenceCache::View(layer) and runs attention with the model's q heads;
// Truncate is SequenceCache::Truncate; Fork is SequenceCache::Fork (paged:
// blocks shared copy-on-write; contiguous: a deep copy).
//
// Thread safety: one thread at a time. Paged caches may share one BlockPool
// (forks do), which is itself thread-safe.
#pragma once

#include <memory>

#include "kvcache/cache.h"
#include "kvcache/format.h"
#include "kvcache/pool.h"
#include "kvcache/thread_pool.h"
#include "model/kv/kv_backend.h"
#include "model/kv/sequence_kv.h"

namespace kvcache::model {

struct CacheKvOptions {
  FormatPair formats;
  CacheLayout layout = CacheLayout::kContiguous;
  uint32_t block_size = 16;  // paged only
  // Paged: the pool to draw from, or null to create one with pool_blocks
  // blocks (0 = enough for four sequences of max_seq_len).
  std::shared_ptr<BlockPool> pool;
  uint32_t pool_blocks = 0;
  // Threads for attention (AttentionOptions::pool; bit-identical to one
  // thread); null: the calling thread. Must outlive the CacheKv and its forks.
  ThreadPool* attention_pool = nullptr;
  // Sinks and recent positions kept as bf16 rows beside the quantized ones
  // (cache.h, PrecisionWindow); none by default.
  PrecisionWindow window;
};

class CacheKv final : public SequenceKv<SequenceCache> {
 public:
  // InvalidArgument if a format cannot take shape.head_dim (the cache's
  // message names format and head_dim).
  static Result<std::unique_ptr<CacheKv>> Create(const AttentionShape& shape,
                                                 const CacheKvOptions& options);

  Status Store(uint32_t layer, std::span<const float> k, std::span<const float> v) override;
  Status Attend(uint32_t layer, std::span<const float> q, std::span<float> out) override;

  // Prefix reuse (paged only): starts an empty sequence with `blocks`, full
  // blocks of positions [0, blocks.size() * block_size) found in a prefix
  // cache or loaded from a tier (PrefixCache / OffloadCache::Acquire); takes
  // over the one reference per block the caller holds (SequenceCache::
  // AdoptPrefix). The next Forward runs from the position after them.
  // `sinks`: the prefix's precision-window sink rows, if it has them
  // (SequenceCache::AdoptPrefix says when they are taken).
  // FailedPrecondition unless empty and paged, or past max_seq_len; nothing
  // changes (the caller still owns the references) on failure.
  Status AdoptPrefix(std::span<const uint32_t> blocks,
                     std::shared_ptr<const Calibration> calibration,
                     std::shared_ptr<const WindowSinks> sinks = nullptr);
  // Names logical block `logical_block` in the pool (SequenceCache::
  // SetBlockHash): the set_hash callback of PrefixCache / OffloadCache::Publish.
  Status SetBlockHash(uint32_t logical_block, uint64_t hash) {
    return seq_.SetBlockHash(logical_block, hash);
  }

  // Admission control (paged): SequenceCache::Reserve -- promises every
  // block appends up to max_tokens positions need, all or nothing
  // (PoolExhausted, nothing reserved); the blocks go back with the cache.
  Status Reserve(uint32_t max_tokens) { return seq_.Reserve(max_tokens); }

  const SequenceCache& cache() const { return seq_; }

 private:
  CacheKv(const AttentionShape& shape, SequenceCache cache, ThreadPool* attention_pool)
      : SequenceKv("cache kv", shape, std::move(cache)), attention_pool_(attention_pool) {}
  std::unique_ptr<SequenceKv> WithSequence(SequenceCache cache) const override {
    return std::unique_ptr<SequenceKv>(new CacheKv(shape_, std::move(cache), attention_pool_));
  }
  ThreadPool* attention_pool_;
};

}  // namespace kvcache::model
