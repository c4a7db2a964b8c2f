// ContiguousStore: the contiguous layout of a SequenceCache (cache.h). Per
// layer, side and kv head one private buffer [cap][row_bytes]; a head that
// never stored a row owns none. Buffers grow geometrically, or stop at a
// fixed planned capacity (CapacityExceeded).
//
// Thread safety: as SequenceCache (one mutator at a time).
// Invariants: head_len[h] <= cap of the head's buffer, K and V alike;
// bases_ always mirrors buffers_ (the views hand bases_ out).
#pragma once

#include <memory>
#include <vector>

#include "cache/cache_state.h"

namespace kvcache {

class ContiguousStore final : public RowStore {
 public:
  ContiguousStore(uint32_t n_layers, uint32_t n_kv_heads, const size_t row_bytes[kSides],
                  const ContiguousOptions& options);

  // A contiguous copy of `src`'s rows, each head's buffer exactly head_len
  // rows (the detached Clone of any layout).
  static std::unique_ptr<ContiguousStore> CopyRows(const RowStore& src, uint32_t n_kv_heads,
                                                   const size_t row_bytes[kSides],
                                                   std::span<const LayerMeta> layers);

  CacheLayout layout() const override { return CacheLayout::kContiguous; }
  RowAddressing<uint8_t> Rows(uint32_t layer, int side) const override;
  uint32_t num_blocks() const override { return 1; }
  uint32_t block_size() const override { return 0; }
  uint32_t capacity_tokens() const override;
  size_t allocated_bytes() const override;
  size_t allocated_bytes(uint32_t layer) const override;
  bool is_within_planned_capacity(std::span<const LayerMeta> layers) const override;

  Status AcquireForAppend(const AppendPlan& plan, std::span<const LayerMeta> layers) override;
  void CommitAppend(std::span<const LayerMeta> layers) override;
  void UndoAppend() override;
  Status MakeWritable(uint32_t, uint32_t) override { return Status::Ok(); }
  Status Shrink(std::span<const LayerMeta>) override { return Status::Ok(); }
  void Release() override;

  Result<std::unique_ptr<RowStore>> Clone(std::span<const LayerMeta> layers) const override;
  Result<std::unique_ptr<RowStore>> CloneContiguous(
      std::span<const LayerMeta> layers) const override {
    return Clone(layers);
  }
  Result<std::unique_ptr<RowStore>> Fork(std::span<const LayerMeta> layers) override {
    return Clone(layers);
  }

  Status CheckInvariants(std::span<const LayerMeta> layers, bool released) const override;
  std::string DebugString() const override { return ""; }

 private:
  struct HeadBuffer {
    std::unique_ptr<uint8_t[]> data;
    uint32_t cap = 0;
  };
  // A buffer an append in flight replaced (kept until commit or undo).
  struct Replaced {
    int side;
    size_t index;
    HeadBuffer old;
  };

  size_t index(uint32_t layer, uint32_t head) const { return size_t{layer} * n_heads_ + head; }
  HeadBuffer Swap(int side, size_t i, HeadBuffer b);  // keeps bases_ in step
  // Fills every head with its head_len rows of `src`, in buffers as large
  // as `caps`' (nullptr: exactly head_len rows).
  void CopyFrom(const RowStore& src, std::span<const LayerMeta> layers, const ContiguousStore* caps);
  // The capacity a buffer holding `cap` rows grows to for `want` rows.
  uint32_t GrownCapacity(uint32_t want, uint32_t cap) const;

  uint32_t n_heads_;
  size_t row_bytes_[kSides];
  ContiguousOptions options_;
  bool grew_past_plan_ = false;
  std::vector<HeadBuffer> buffers_[kSides];  // [side][layer * n_heads + head]
  std::vector<uint8_t*> bases_[kSides];      // [side][layer * n_heads + head]: buffers_' data
  std::vector<Replaced> replaced_;           // by the append in flight
};

}  // namespace kvcache
