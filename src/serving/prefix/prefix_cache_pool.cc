// The parts of PrefixCache that touch the real BlockPool and SequenceCache:
// PoolPrefixBackend and the sequence-level helpers. Kept apart so that tests
// of the prefix cache over a model pool link without them.
#include <fmt/format.h>

#include "kvcache/cache.h"
#include "kvcache/serving/prefix_cache.h"

namespace kvcache {
namespace {

class PoolBackend final : public PrefixCacheBackend {
 public:
  explicit PoolBackend(std::shared_ptr<BlockPool> pool) : pool_(std::move(pool)) {}
  uint32_t num_blocks() const override { return pool_->num_blocks(); }
  uint32_t block_size() const override { return pool_->block_size(); }
  bool RetainCached(uint32_t block, uint64_t hash) override { return pool_->RetainCached(block, hash); }
  Status SetBlockHash(uint32_t block, uint64_t hash) override { return pool_->SetBlockHash(block, hash); }
  Status ClearBlockHash(uint32_t block) override { return pool_->ClearBlockHash(block); }
  Status Release(std::span<const uint32_t> blocks) override { return pool_->Release(blocks); }
  void SetEvictionListener(EvictionListener listener) override {
    pool_->SetEvictionListener(std::move(listener));
  }
  std::optional<uint64_t> block_hash(uint32_t block) const override { return pool_->block_hash(block); }

 private:
  std::shared_ptr<BlockPool> pool_;
};

}  // namespace

std::unique_ptr<PrefixCacheBackend> PoolPrefixBackend(std::shared_ptr<BlockPool> pool) {
  return std::make_unique<PoolBackend>(std::move(pool));
}

Result<std::unique_ptr<PrefixCache>> PrefixCache::Create(std::shared_ptr<BlockPool> pool,
                                                         const PrefixCacheOptions& options) {
  if (pool == nullptr) return Status::InvalidArgument("prefix cache: pool is null");
  return Create(PoolPrefixBackend(std::move(pool)), options);
}

Result<size_t> PrefixCache::AdoptInto(SequenceCache* seq, std::span<const TokenId> tokens,
                                      std::string_view salt) {
  if (seq == nullptr || seq->layout() != CacheLayout::kPaged || seq->num_tokens() != 0) {
    return Status::FailedPrecondition("prefix cache: AdoptInto needs an empty paged sequence");
  }
  PrefixMatch m = Acquire(tokens, salt);
  if (m.blocks.empty()) return size_t{0};
  Status status = seq->AdoptPrefix(m.blocks, m.calibration, m.sinks);
  if (!status.ok()) {
    (void)backend_->Release(m.blocks);
    return status;
  }
  return m.num_tokens;
}

Result<size_t> PrefixCache::PublishSequence(SequenceCache* seq, std::span<const TokenId> tokens,
                                            std::string_view salt) {
  if (seq == nullptr || seq->layout() != CacheLayout::kPaged) {
    return Status::FailedPrecondition("prefix cache: PublishSequence needs a paged sequence");
  }
  if (tokens.size() > seq->num_tokens()) {
    return Status::InvalidArgument(fmt::format(
        "prefix cache: {} committed tokens but the sequence holds {}", tokens.size(),
        seq->num_tokens()));
  }
  return Publish(tokens, seq->block_table(), salt, seq->calibration(),
                 [seq](size_t logical, uint64_t hash) {
                   return seq->SetBlockHash(static_cast<uint32_t>(logical), hash);
                 },
                 seq->window_sinks());
}

}  // namespace kvcache
