// ModelBlockSource: a reference model of BlockPool's block accounting (no
// storage): refcounts, hashes, a free stack (most recently freed on top), an
// LRU of cached blocks ordered by release tick, and a reservation count.
// Written for clarity, not speed; tests check the simulator and the prefix
// cache against it. Not thread-safe.
#include <map>
#include <optional>
#include <set>
#include <vector>

#include <fmt/format.h>

#include "kvcache/serving/forwarding_backend.h"
#include "testing/model_block_source.h"

namespace kvcache::serving {
namespace {

class ModelBlockSource final : public BlockSource {
 public:
  ModelBlockSource(uint32_t num_blocks, uint32_t block_size)
      : block_size_(block_size), meta_(num_blocks) {
    for (uint32_t b = num_blocks; b-- > 0;) free_.push_back(b);
  }

  uint32_t num_blocks() const override { return static_cast<uint32_t>(meta_.size()); }
  uint32_t block_size() const override { return block_size_; }

  Status Allocate(std::span<uint32_t> out, uint32_t from_reserved) override {
    if (from_reserved > out.size() || from_reserved > reserved_) {
      return Status::FailedPrecondition("model pool: drawing more than is reserved");
    }
    if (out.size() - from_reserved > Available()) {
      return Status::PoolExhausted(fmt::format("model pool: {} blocks wanted, {} available",
                                               out.size() - from_reserved, Available()));
    }
    std::vector<EvictedBlock> evicted;
    for (uint32_t& b : out) {
      if (!free_.empty()) {
        b = free_.back();
        free_.pop_back();
      } else {
        auto lru = lru_.begin();
        b = lru->second;
        lru_.erase(lru);
        evicted.push_back({b, *meta_[b].hash});
        meta_[b].hash.reset();
        ++evictions_;
      }
      meta_[b].refs = 1;
    }
    reserved_ -= from_reserved;
    if (listener_ && !evicted.empty()) listener_(evicted);
    return Status::Ok();
  }

  Status Retain(std::span<const uint32_t> blocks) override {
    for (uint32_t b : blocks) {
      if (b >= meta_.size() || meta_[b].refs == 0) return Status::FailedPrecondition("model pool: retain of a block not in use");
    }
    for (uint32_t b : blocks) ++meta_[b].refs;
    return Status::Ok();
  }

  Status Release(std::span<const uint32_t> blocks) override {
    std::map<uint32_t, uint32_t> count;
    for (uint32_t b : blocks) {
      if (b >= meta_.size() || meta_[b].refs < ++count[b]) {
        return Status::FailedPrecondition(fmt::format("model pool: release of block {} not held", b));
      }
    }
    for (uint32_t b : blocks) {
      Meta& m = meta_[b];
      if (--m.refs > 0) continue;
      if (m.hash) {
        m.tick = ++tick_;
        lru_.emplace(m.tick, b);
      } else {
        free_.push_back(b);
      }
    }
    return Status::Ok();
  }

  Result<uint32_t> ReleaseAndReserve(std::span<const uint32_t> blocks, uint32_t max_reserve) override {
    KV_RETURN_IF_ERROR(Release(blocks));
    const uint32_t n = std::min<uint32_t>(max_reserve, Available());
    reserved_ += n;
    return n;
  }

  Status Reserve(uint32_t n) override {
    if (n > Available()) return Status::PoolExhausted(fmt::format("model pool: reserve {} of {}", n, Available()));
    reserved_ += n;
    return Status::Ok();
  }
  void Unreserve(uint32_t n) override { reserved_ -= std::min(n, reserved_); }

  bool IsExclusive(uint32_t block) const override {
    return block < meta_.size() && meta_[block].refs == 1 && !meta_[block].hash;
  }

  PoolStats stats() const override {
    PoolStats s;
    s.num_blocks = num_blocks();
    s.free_blocks = static_cast<uint32_t>(free_.size());
    s.cached_blocks = static_cast<uint32_t>(lru_.size());
    s.used_blocks = s.num_blocks - s.free_blocks - s.cached_blocks;
    s.reserved_blocks = reserved_;
    s.available_blocks = Available();
    s.evictions = evictions_;
    return s;
  }

  Status CheckInvariants() const override {
    std::vector<int> seen(meta_.size(), 0);
    for (uint32_t b : free_) {
      if (seen[b]++ || meta_[b].refs || meta_[b].hash) return Status::Internal(fmt::format("model pool: bad free block {}", b));
    }
    for (const auto& [tick, b] : lru_) {
      if (seen[b]++ || meta_[b].refs || !meta_[b].hash || meta_[b].tick != tick) {
        return Status::Internal(fmt::format("model pool: bad cached block {}", b));
      }
    }
    for (uint32_t b = 0; b < meta_.size(); ++b) {
      if (!seen[b] && meta_[b].refs == 0) return Status::Internal(fmt::format("model pool: block {} lost", b));
    }
    if (reserved_ > free_.size() + lru_.size()) return Status::Internal("model pool: reservations not backed");
    return Status::Ok();
  }

  std::unique_ptr<PrefixCacheBackend> NewPrefixBackend() override;

  // --- for the prefix backend ---
  bool RetainCached(uint32_t b, uint64_t hash) {
    if (b >= meta_.size() || !meta_[b].hash || *meta_[b].hash != hash) return false;
    Meta& m = meta_[b];
    if (m.refs == 0) {
      if (Available() == 0) return false;  // it backs a reservation
      lru_.erase({m.tick, b});
    }
    ++m.refs;
    return true;
  }
  Status SetBlockHash(uint32_t b, uint64_t hash) {
    if (b >= meta_.size() || meta_[b].refs == 0) return Status::FailedPrecondition("model pool: naming a block not in use");
    meta_[b].hash = hash;
    return Status::Ok();
  }
  Status ClearBlockHash(uint32_t b) {
    if (b >= meta_.size()) return Status::InvalidArgument("model pool: bad block");
    Meta& m = meta_[b];
    if (!m.hash) return Status::Ok();
    m.hash.reset();
    if (m.refs == 0) {
      lru_.erase({m.tick, b});
      free_.push_back(b);
    }
    return Status::Ok();
  }
  std::optional<uint64_t> block_hash(uint32_t b) const {
    return b < meta_.size() ? meta_[b].hash : std::nullopt;
  }
  void SetEvictionListener(EvictionListener listener) { listener_ = std::move(listener); }

 private:
  EvictionListener listener_;
  struct Meta {
    uint32_t refs = 0;
    std::optional<uint64_t> hash;
    uint64_t tick = 0;
  };
  uint32_t Available() const {
    return static_cast<uint32_t>(free_.size() + lru_.size()) - reserved_;
  }

  uint32_t block_size_;
  std::vector<Meta> meta_;                          // [num_blocks]
  std::vector<uint32_t> free_;                      // stack, top = most recently freed
  std::set<std::pair<uint64_t, uint32_t>> lru_;     // (release tick, block), oldest first
  uint32_t reserved_ = 0;
  uint64_t tick_ = 0;
  uint64_t evictions_ = 0;
};

std::unique_ptr<PrefixCacheBackend> ModelBlockSource::NewPrefixBackend() {
  return std::make_unique<ForwardingPrefixBackend<ModelBlockSource*>>(this);
}

}  // namespace

std::unique_ptr<BlockSource> NewModelBlockSource(uint32_t num_blocks, uint32_t block_size) {
  return std::make_unique<ModelBlockSource>(num_blocks, block_size);
}

}  // namespace kvcache::serving
