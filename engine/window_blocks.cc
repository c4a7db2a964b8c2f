// WindowBlockIndex (window_blocks.h).
#include "engine/window_blocks.h"

#include <algorithm>

#include "kvcache/serving/forwarding_backend.h"

namespace kvcache::engine {

WindowBlockIndex::WindowBlockIndex(std::shared_ptr<BlockPool> pool) : pool_(std::move(pool)) {
  pool_->SetEvictionListener([this](std::span<const EvictedBlock> evicted) { OnEvicted(evicted); });
}

WindowBlockIndex::~WindowBlockIndex() { pool_->SetEvictionListener(nullptr); }

void WindowBlockIndex::OnEvicted(std::span<const EvictedBlock> evicted) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const EvictedBlock& e : evicted) {
    auto it = by_block_.find(e.block);
    if (it == by_block_.end() || it->second.lo != e.hash) continue;
    by_hash_.erase(it->second);
    by_lo_.erase(it->second.lo);
    by_block_.erase(it);
    ++stats_.evictions;
  }
}

Result<bool> WindowBlockIndex::Publish(const BlockHash& hash, uint32_t block,
                                       std::shared_ptr<const Calibration> calibration,
                                       const std::function<Status(uint64_t)>& set_hash) {
  std::lock_guard<std::mutex> lock(mu_);
  if (by_hash_.contains(hash)) return false;
  if (by_block_.contains(block)) {
    return Status::FailedPrecondition("window index: block " + std::to_string(block) +
                                      " is already named by another hash");
  }
  // The pool's lock is taken inside set_hash; the pool never calls back
  // into the index while holding it (the listener runs after it drops).
  KV_RETURN_IF_ERROR(set_hash(hash.lo));
  by_hash_.emplace(hash, Entry{block, std::move(calibration)});
  by_block_.emplace(block, hash);
  by_lo_.emplace(hash.lo, hash);
  ++stats_.published_blocks;
  return true;
}

bool WindowBlockIndex::Covers(std::span<const BlockHash> hashes) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Calibration* calibration = nullptr;
  for (size_t i = 0; i < hashes.size(); ++i) {
    auto it = by_hash_.find(hashes[i]);
    if (it == by_hash_.end()) return false;
    if (i == 0) calibration = it->second.calibration.get();
    if (it->second.calibration.get() != calibration) return false;
  }
  return true;
}

size_t WindowBlockIndex::Parked(std::span<const BlockHash> hashes) const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const BlockHash& h : hashes) {
    auto it = by_hash_.find(h);
    if (it != by_hash_.end() && pool_->state(it->second.block) == BlockState::kCached) ++n;
  }
  return n;
}

std::vector<size_t> WindowBlockIndex::Missing(std::span<const BlockHash> hashes) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<size_t> out;
  for (size_t i = 0; i < hashes.size(); ++i) {
    if (by_hash_.count(hashes[i]) == 0) out.push_back(i);
  }
  return out;
}

Result<WindowMatch> WindowBlockIndex::Acquire(std::span<const BlockHash> hashes) {
  WindowMatch m;
  std::vector<BlockHash> named;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const BlockHash& h : hashes) {
      auto it = by_hash_.find(h);
      if (it == by_hash_.end()) break;
      if (m.blocks.empty()) m.calibration = it->second.calibration;
      if (it->second.calibration != m.calibration) break;
      m.blocks.push_back(it->second.block);
      named.push_back(h);
    }
  }
  // Retained outside the index's lock: a retain cannot evict, but keep the
  // lock order simple (the pool's lock is never taken under ours here).
  size_t held = 0;
  if (m.blocks.size() == hashes.size()) {
    for (; held < m.blocks.size(); ++held) {
      if (!pool_->RetainCached(m.blocks[held], named[held].lo)) break;
    }
  }
  if (held < hashes.size()) {
    std::vector<uint32_t> back(m.blocks.begin(), m.blocks.begin() + static_cast<std::ptrdiff_t>(held));
    std::reverse(back.begin(), back.end());
    (void)pool_->Release(back);  // references this call took: cannot fail
    return Status::NotFound("window index: " + std::to_string(hashes.size() - held) + " of " +
                            std::to_string(hashes.size()) + " window blocks are not cached");
  }
  std::lock_guard<std::mutex> lock(mu_);
  stats_.hit_blocks += m.blocks.size();
  return m;
}

void WindowBlockIndex::ForgetChain(uint64_t hash_lo) {
  uint32_t block = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto lo = by_lo_.find(hash_lo);
    if (lo == by_lo_.end()) return;
    auto it = by_hash_.find(lo->second);
    block = it->second.block;
    by_block_.erase(block);
    by_hash_.erase(it);
    by_lo_.erase(lo);
    ++stats_.unreachable;
  }
  // A parked block goes to the free list; one in use keeps its name until
  // the pool evicts it (the listener then finds no entry).
  if (pool_->state(block) == BlockState::kCached) (void)pool_->ClearBlockHash(block);
}

namespace {

// Passes every call on; reports each block the prefix cache loses.
class ChainWatch final : public ForwardingPrefixBackend<std::unique_ptr<PrefixCacheBackend>> {
 public:
  ChainWatch(std::unique_ptr<PrefixCacheBackend> full, WindowBlockIndex* index)
      : ForwardingPrefixBackend(std::move(full)), index_(index) {}
  Status ClearBlockHash(uint32_t block) override {
    const std::optional<uint64_t> hash = target_->block_hash(block);
    KV_RETURN_IF_ERROR(target_->ClearBlockHash(block));
    if (hash) index_->ForgetChain(*hash);
    return Status::Ok();
  }
  void SetEvictionListener(EvictionListener listener) override {
    if (!listener) {
      target_->SetEvictionListener(nullptr);
      return;
    }
    target_->SetEvictionListener([listener = std::move(listener), index = index_](std::span<const EvictedBlock> evicted) {
      listener(evicted);
      for (const EvictedBlock& e : evicted) index->ForgetChain(e.hash);
    });
  }

 private:
  WindowBlockIndex* index_;
};

}  // namespace

std::unique_ptr<PrefixCacheBackend> WindowBlockIndex::WatchChain(std::unique_ptr<PrefixCacheBackend> full,
                                                                 WindowBlockIndex* index) {
  return std::make_unique<ChainWatch>(std::move(full), index);
}

size_t WindowBlockIndex::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return by_hash_.size();
}

WindowIndexStats WindowBlockIndex::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

std::string WindowBlockIndex::CheckInvariants() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (by_hash_.size() != by_block_.size() || by_hash_.size() != by_lo_.size()) {
    return "window index: the maps differ in size";
  }
  for (const auto& [hash, e] : by_hash_) {
    const std::optional<uint64_t> h = pool_->block_hash(e.block);
    if (!h || *h != hash.lo) return "window index: block " + std::to_string(e.block) + " lost its hash";
    auto it = by_block_.find(e.block);
    if (it == by_block_.end() || !(it->second == hash)) return "window index: maps disagree on a block";
  }
  return "";
}

}  // namespace kvcache::engine
