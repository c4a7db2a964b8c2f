// PoolBlockSource: BlockSource over the real BlockPool (see block_source.h).
#include "testing/block_source.h"

namespace kvcache::serving {
namespace {

class PoolBlockSource final : public BlockSource {
 public:
  explicit PoolBlockSource(std::shared_ptr<BlockPool> pool) : pool_(std::move(pool)) {}
  uint32_t num_blocks() const override { return pool_->num_blocks(); }
  uint32_t block_size() const override { return pool_->block_size(); }
  Status Allocate(std::span<uint32_t> out, uint32_t from_reserved) override {
    return pool_->Allocate(out, from_reserved);
  }
  Status Retain(std::span<const uint32_t> blocks) override { return pool_->Retain(blocks); }
  Status Release(std::span<const uint32_t> blocks) override { return pool_->Release(blocks); }
  Result<uint32_t> ReleaseAndReserve(std::span<const uint32_t> blocks, uint32_t max_reserve) override {
    return pool_->ReleaseAndReserve(blocks, max_reserve);
  }
  Status Reserve(uint32_t n) override { return pool_->Reserve(n); }
  void Unreserve(uint32_t n) override { pool_->Unreserve(n); }
  bool IsExclusive(uint32_t block) const override { return pool_->IsExclusive(block); }
  PoolStats stats() const override { return pool_->stats(); }
  Status CheckInvariants() const override { return pool_->CheckInvariants(); }
  std::unique_ptr<PrefixCacheBackend> NewPrefixBackend() override { return PoolPrefixBackend(pool_); }

 private:
  std::shared_ptr<BlockPool> pool_;
};

}  // namespace

std::unique_ptr<BlockSource> NewPoolBlockSource(std::shared_ptr<BlockPool> pool) {
  return std::make_unique<PoolBlockSource>(std::move(pool));
}

}  // namespace kvcache::serving
