// BlockSource: the block-pool operations the prefix-cache tests use, so that
// they can run on the real BlockPool (PoolBlockSource) or on a deliberately
// simple reference model of the pool's block accounting
// (testing/model_block_source.h). Both follow the contracts in kvcache/pool.h.
//
// Thread safety: as the implementation (the pool is thread-safe; the model
// is not and is used from one thread).
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "kvcache/pool.h"
#include "kvcache/serving/prefix_cache.h"
#include "kvcache/status.h"

namespace kvcache::serving {

class BlockSource {
 public:
  virtual ~BlockSource() = default;
  virtual uint32_t num_blocks() const = 0;
  virtual uint32_t block_size() const = 0;
  virtual Status Allocate(std::span<uint32_t> out, uint32_t from_reserved) = 0;
  virtual Status Retain(std::span<const uint32_t> blocks) = 0;
  virtual Status Release(std::span<const uint32_t> blocks) = 0;
  virtual Result<uint32_t> ReleaseAndReserve(std::span<const uint32_t> blocks,
                                             uint32_t max_reserve) = 0;
  virtual Status Reserve(uint32_t n) = 0;
  virtual void Unreserve(uint32_t n) = 0;
  virtual bool IsExclusive(uint32_t block) const = 0;
  virtual PoolStats stats() const = 0;
  virtual Status CheckInvariants() const = 0;
  // A prefix-cache backend over the same blocks. REQUIRES: *this outlives it.
  virtual std::unique_ptr<PrefixCacheBackend> NewPrefixBackend() = 0;
};

// Over a real pool (kept alive by the source).
std::unique_ptr<BlockSource> NewPoolBlockSource(std::shared_ptr<BlockPool> pool);


}  // namespace kvcache::serving
