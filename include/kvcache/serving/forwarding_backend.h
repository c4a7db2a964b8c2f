// ForwardingPrefixBackend: a PrefixCacheBackend that passes every call on to
// a target (a BlockPool, or another backend), through a pointer-like `Ptr`
// that owns or borrows it. Derive from it to change some of the calls.
//
// Thread safety: that of the target.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <utility>

#include "kvcache/serving/prefix_cache.h"

namespace kvcache {

template <typename Ptr>
class ForwardingPrefixBackend : public PrefixCacheBackend {
 public:
  explicit ForwardingPrefixBackend(Ptr target) : target_(std::move(target)) {}
  uint32_t num_blocks() const override { return target_->num_blocks(); }
  uint32_t block_size() const override { return target_->block_size(); }
  bool RetainCached(uint32_t block, uint64_t hash) override { return target_->RetainCached(block, hash); }
  Status SetBlockHash(uint32_t block, uint64_t hash) override { return target_->SetBlockHash(block, hash); }
  Status ClearBlockHash(uint32_t block) override { return target_->ClearBlockHash(block); }
  Status Release(std::span<const uint32_t> blocks) override { return target_->Release(blocks); }
  void SetEvictionListener(EvictionListener listener) override {
    target_->SetEvictionListener(std::move(listener));
  }
  std::optional<uint64_t> block_hash(uint32_t block) const override { return target_->block_hash(block); }

 protected:
  Ptr target_;
};

}  // namespace kvcache
