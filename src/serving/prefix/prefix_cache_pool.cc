// The parts of PrefixCache that touch the real BlockPool and SequenceCache:
// PoolPrefixBackend and the sequence-level helpers. Kept apart so that tests
// of the prefix cache over a model pool link without them.
#include <fmt/format.h>

#include "kvcache/cache.h"
#include "kvcache/serving/prefix_cache.h"
#include "kvcache/serving/forwarding_backend.h"

namespace kvcache {

std::unique_ptr<PrefixCacheBackend> PoolPrefixBackend(std::shared_ptr<BlockPool> pool) {
  return std::make_unique<ForwardingPrefixBackend<std::shared_ptr<BlockPool>>>(std::move(pool));
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
