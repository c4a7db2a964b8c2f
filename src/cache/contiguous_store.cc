// ContiguousStore (contiguous_store.h): per-head buffers, grown on append.
//
// An append replaces the buffers it grows at once (rows copied over), so
// that it encodes through Rows() like any other write; the old buffers wait
// in replaced_ and come back on undo, or are freed on commit.
//
// Thread safety: one mutator at a time, as SequenceCache.
#include "cache/contiguous_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace kvcache {
namespace {
constexpr uint32_t kZeroBlock = 0;
}  // namespace

ContiguousStore::ContiguousStore(uint32_t n_layers, uint32_t n_kv_heads,
                                 const size_t row_bytes[kSides], const ContiguousOptions& options)
    : n_heads_(n_kv_heads), row_bytes_{row_bytes[0], row_bytes[1]}, options_(options) {
  const size_t n = size_t{n_layers} * n_heads_;
  for (int side = 0; side < kSides; ++side) {
    buffers_[side].resize(n);
    bases_[side].assign(n, nullptr);
  }
}

ContiguousStore::HeadBuffer ContiguousStore::Swap(int side, size_t i, HeadBuffer b) {
  std::swap(buffers_[side][i], b);
  bases_[side][i] = buffers_[side][i].data.get();
  return b;
}

RowAddressing<uint8_t> ContiguousStore::Rows(uint32_t layer, int side) const {
  uint32_t cap = 1;
  for (uint32_t h = 0; h < n_heads_; ++h) cap = std::max(cap, buffers_[side][index(layer, h)].cap);
  RowAddressing<uint8_t> a;
  a.head_base = bases_[side].data() + index(layer, 0);
  a.block_table = &kZeroBlock;
  a.block_size = cap;
  a.row_bytes = row_bytes_[side];
  return a;
}

uint32_t ContiguousStore::capacity_tokens() const {
  uint32_t m = UINT32_MAX;
  for (int side = 0; side < kSides; ++side)
    for (const HeadBuffer& b : buffers_[side]) m = std::min(m, b.data ? b.cap : options_.capacity_tokens);
  return m == UINT32_MAX ? 0 : m;
}

size_t ContiguousStore::allocated_bytes() const {
  size_t total = 0;
  for (int side = 0; side < kSides; ++side)
    for (const HeadBuffer& b : buffers_[side]) total += size_t{b.cap} * row_bytes_[side];
  return total;
}

size_t ContiguousStore::allocated_bytes(uint32_t layer) const {
  if (index(layer, 0) >= buffers_[0].size()) return 0;
  size_t total = 0;
  for (int side = 0; side < kSides; ++side)
    for (uint32_t h = 0; h < n_heads_; ++h) total += size_t{buffers_[side][index(layer, h)].cap} * row_bytes_[side];
  return total;
}

bool ContiguousStore::is_within_planned_capacity(std::span<const LayerMeta>) const {
  return options_.capacity_tokens > 0 && !grew_past_plan_;
}

uint32_t ContiguousStore::GrownCapacity(uint32_t want, uint32_t cap) const {
  const uint32_t plan = options_.capacity_tokens;
  if (options_.policy == CapacityPolicy::kFixed) return plan;
  const uint32_t grown = std::max({want, plan, cap * 2});
  return plan == 0 ? std::max(grown, 16u) : grown;
}

Status ContiguousStore::AcquireForAppend(const AppendPlan& plan, std::span<const LayerMeta> layers) {
  const uint32_t T = plan.n_tokens;
  if (options_.policy == CapacityPolicy::kFixed) {
    for (uint32_t li = 0; li < plan.n_layers; ++li) {
      const uint32_t l = plan.first_layer + li;
      for (uint32_t h = 0; h < n_heads_; ++h) {
        const uint32_t want = layers[l].head_len[h] + T;
        if (plan.is_alive(li, h) && want > options_.capacity_tokens) {
          return Status::CapacityExceeded(
              fmt::format("cache: layer {} head {} would hold {} rows, fixed capacity is {}", l, h,
                          want, options_.capacity_tokens));
        }
      }
    }
  }
  for (uint32_t li = 0; li < plan.n_layers; ++li) {
    const uint32_t l = plan.first_layer + li;
    for (uint32_t h = 0; h < n_heads_; ++h) {
      const uint32_t len = layers[l].head_len[h];
      for (int side = 0; side < kSides && plan.is_alive(li, h); ++side) {
        const size_t i = index(l, h);
        if (len + T <= buffers_[side][i].cap) continue;
        HeadBuffer grown;
        grown.cap = GrownCapacity(len + T, buffers_[side][i].cap);
        grown.data.reset(new uint8_t[size_t{grown.cap} * row_bytes_[side]]);
        if (len > 0) std::memcpy(grown.data.get(), bases_[side][i], size_t{len} * row_bytes_[side]);
        replaced_.push_back({side, i, Swap(side, i, std::move(grown))});
      }
    }
  }
  return Status::Ok();
}

void ContiguousStore::CommitAppend(std::span<const LayerMeta>) {
  const uint32_t plan = options_.capacity_tokens;
  for (const Replaced& r : replaced_) {
    if (plan > 0 && buffers_[r.side][r.index].cap > plan) grew_past_plan_ = true;
  }
  replaced_.clear();
}

void ContiguousStore::UndoAppend() {
  for (auto it = replaced_.rbegin(); it != replaced_.rend(); ++it) {
    Swap(it->side, it->index, std::move(it->old));
  }
  replaced_.clear();
}

void ContiguousStore::Release() {
  for (int side = 0; side < kSides; ++side)
    for (size_t i = 0; i < buffers_[side].size(); ++i) Swap(side, i, HeadBuffer{});
}

void ContiguousStore::CopyFrom(const RowStore& src, std::span<const LayerMeta> layers,
                               const ContiguousStore* caps) {
  for (uint32_t l = 0; l < layers.size(); ++l) {
    for (int side = 0; side < kSides; ++side) {
      const RowAddressing<uint8_t> from = src.Rows(l, side);
      const size_t rb = row_bytes_[side];
      for (uint32_t h = 0; h < n_heads_; ++h) {
        const uint32_t n = layers[l].head_len[h];
        HeadBuffer b;
        b.cap = caps ? caps->buffers_[side][index(l, h)].cap : n;
        if (b.cap == 0) continue;
        b.data.reset(new uint8_t[size_t{b.cap} * rb]);
        for (uint32_t r = 0; r < n;) {
          const uint32_t cnt = std::min(from.run(r), n - r);
          std::memcpy(b.data.get() + size_t{r} * rb, from.row(h, r), size_t{cnt} * rb);
          r += cnt;
        }
        Swap(side, index(l, h), std::move(b));
      }
    }
  }
}

std::unique_ptr<ContiguousStore> ContiguousStore::CopyRows(const RowStore& src, uint32_t n_kv_heads,
                                                           const size_t row_bytes[kSides],
                                                           std::span<const LayerMeta> layers) {
  auto out = std::make_unique<ContiguousStore>(static_cast<uint32_t>(layers.size()), n_kv_heads,
                                               row_bytes, ContiguousOptions{});
  out->CopyFrom(src, layers, nullptr);
  return out;
}

Result<std::unique_ptr<RowStore>> ContiguousStore::Clone(std::span<const LayerMeta> layers) const {
  auto out = std::make_unique<ContiguousStore>(static_cast<uint32_t>(layers.size()), n_heads_,
                                               row_bytes_, options_);
  out->grew_past_plan_ = grew_past_plan_;
  out->CopyFrom(*this, layers, this);
  return std::unique_ptr<RowStore>(std::move(out));
}

Status ContiguousStore::CheckInvariants(std::span<const LayerMeta> layers, bool) const {
  for (uint32_t l = 0; l < layers.size(); ++l) {
    for (uint32_t h = 0; h < n_heads_; ++h) {
      for (int side = 0; side < kSides; ++side) {
        if (layers[l].head_len[h] > buffers_[side][index(l, h)].cap) {
          return Status::Internal("cache invariant: rows beyond buffer");
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace kvcache
