// PagedStore: the paged layout of a SequenceCache (cache.h). Rows live in
// BlockPool blocks; ONE block table (logical block -> physical) serves all
// layers and heads: row r of any head is in block table[r / block_size],
// slot r % block_size. Also keeps the sequence's reservation in the pool.
//
// Thread safety: as SequenceCache (one mutator at a time); the pool is
// thread-safe on its own.
// Invariants: table_.size() == ceil(max head_len / block_size);
// maybe_shared_.size() == table_.size(); this store holds one reference on
// every table entry; an entry with maybe_shared_ == 0 is held exclusively
// (a set entry may be exclusive too: the pool is asked before writing).
#pragma once

#include <memory>
#include <vector>

#include "cache/cache_state.h"

namespace kvcache {

class PagedStore final : public RowStore {
 public:
  explicit PagedStore(std::shared_ptr<BlockPool> pool);
  ~PagedStore() override;

  CacheLayout layout() const override { return CacheLayout::kPaged; }
  RowAddressing<uint8_t> Rows(uint32_t layer, int side) const override;
  uint32_t num_blocks() const override { return static_cast<uint32_t>(table_.size()); }
  uint32_t block_size() const override { return bs_; }
  uint32_t capacity_tokens() const override { return num_blocks() * bs_; }
  size_t allocated_bytes() const override;
  size_t allocated_bytes(uint32_t layer) const override;
  bool is_within_planned_capacity(std::span<const LayerMeta> layers) const override;

  Status AcquireForAppend(const AppendPlan& plan, std::span<const LayerMeta> layers) override;
  void CommitAppend(std::span<const LayerMeta> layers) override;
  void UndoAppend() override;
  Status MakeWritable(uint32_t first, uint32_t end) override;
  Status Shrink(std::span<const LayerMeta> layers) override;
  void Release() override;

  Result<std::unique_ptr<RowStore>> Clone(std::span<const LayerMeta> layers) const override;
  Result<std::unique_ptr<RowStore>> CloneContiguous(
      std::span<const LayerMeta> layers) const override;
  Result<std::unique_ptr<RowStore>> Fork(std::span<const LayerMeta> layers) override;

  Status CheckInvariants(std::span<const LayerMeta> layers, bool released) const override;
  std::string DebugString() const override;

  Status Reserve(uint32_t max_tokens, std::span<const LayerMeta> layers) override;
  uint32_t reserved_blocks() const override { return reserved_; }
  uint32_t reservation_target_tokens() const override { return reserve_target_; }
  bool is_fully_reserved(std::span<const LayerMeta> layers) const override;
  void TrimReservation(std::span<const LayerMeta> layers) override;
  std::span<const uint32_t> block_table() const override { return table_; }
  const std::shared_ptr<BlockPool>& pool() const override { return pool_; }
  Status SetBlockHash(uint32_t logical_block, uint64_t hash,
                      std::span<const LayerMeta> layers) override;
  Status AdoptBlocks(std::span<const uint32_t> blocks) override;
  Status DropLeadingBlocks(uint32_t n_blocks, std::span<const LayerMeta> layers) override;

 private:
  // Blocks that appending until every head holds `target` rows could
  // allocate: new blocks past the table plus copies of possibly shared
  // blocks written (every block from min_rows on counted as shared if
  // assume_all_shared).
  uint32_t BlocksNeeded(uint32_t target, uint32_t min_rows, bool assume_all_shared) const;
  // Releases `dropped` (already out of the table) and tops the reservation
  // up to the current need: first with them (atomically), then best effort.
  Status GiveBack(std::span<const uint32_t> dropped, std::span<const LayerMeta> layers);
  // Allocates fresh.size() blocks all or nothing, drawing on the
  // reservation first; returns how many came from it.
  Result<uint32_t> AllocateDrawingReservation(std::span<uint32_t> fresh);
  // Copy-on-write: table_[cow[j]] is copied into fresh[j], which replaces
  // it; the replaced ids are appended to *old (still referenced).
  void SwapInCopies(std::span<const uint32_t> cow, std::span<const uint32_t> fresh,
                    std::vector<uint32_t>* old);
  // Of the maybe-shared blocks marked in `candidate` ([lo, hi)), those still
  // shared go to cow_; the others are marked exclusive. Clears `candidate`.
  void SplitShared(std::vector<uint8_t>& candidate, size_t lo, size_t hi);
  // The longest head after `plan`; marks the blocks its rows land in that
  // may be shared into `candidate`, widening [*lo, *hi).
  uint32_t MarkWrittenBlocks(const AppendPlan& plan, std::span<const LayerMeta> layers,
                             std::vector<uint8_t>& candidate, size_t* lo, size_t* hi) const;

  std::shared_ptr<BlockPool> pool_;
  uint32_t bs_;
  std::vector<uint32_t> table_;        // [num_blocks] logical -> physical
  std::vector<uint8_t> maybe_shared_;  // [num_blocks]
  uint32_t reserved_ = 0;              // blocks reserved in the pool for us
  uint32_t reserve_target_ = 0;        // tokens Reserve() was asked to cover

  // The append in flight (AcquireForAppend until commit or undo).
  size_t old_table_ = 0;
  std::vector<uint32_t> fresh_;    // copies of cow_ blocks, then new blocks
  std::vector<uint32_t> cow_;      // logical blocks copied on write
  std::vector<uint32_t> cow_old_;  // the physical blocks they replaced
  uint32_t from_reserved_ = 0;
};

}  // namespace kvcache
