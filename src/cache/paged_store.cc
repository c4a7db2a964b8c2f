// PagedStore (paged_store.h): the block table, copy-on-write and the
// reservation of one sequence.
//
// Copy-on-write. A block is written only while held exclusively (refcount 1,
// no hash). Fork and content hashes mark blocks maybe_shared_; before a
// write the pool is asked, and a block still shared is replaced by a fresh
// copy. Appends install fresh blocks and copies in the table before they
// encode; UndoAppend puts the old entries back and returns the fresh blocks
// to the reservation they came from.
//
// Reservations. Appends draw from the reservation first; blocks freed by
// Shrink go back into it (atomically, ReleaseAndReserve), topped up best
// effort for blocks that stay shared with a fork.
//
// Thread safety: one mutator at a time, as SequenceCache.
#include "cache/paged_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>

#include "cache/contiguous_store.h"

namespace kvcache {

PagedStore::PagedStore(std::shared_ptr<BlockPool> pool)
    : pool_(std::move(pool)), bs_(pool_->block_size()) {}

PagedStore::~PagedStore() { Release(); }

RowAddressing<uint8_t> PagedStore::Rows(uint32_t layer, int side) const {
  RowAddressing<uint8_t> a;
  a.base = pool_->block_data(layer, kSideOf[side], 0);  // the arena
  a.block_table = table_.data();
  a.block_size = bs_;
  a.block_stride = pool_->block_stride(kSideOf[side]);
  a.head_stride = pool_->head_stride(kSideOf[side]);
  a.row_bytes = pool_->row_bytes(kSideOf[side]);
  return a;
}

size_t PagedStore::allocated_bytes() const { return table_.size() * pool_->block_bytes(); }

size_t PagedStore::allocated_bytes(uint32_t) const {
  return table_.size() * (pool_->block_stride(Side::kKey) + pool_->block_stride(Side::kValue));
}

bool PagedStore::is_within_planned_capacity(std::span<const LayerMeta> layers) const {
  uint32_t num_tokens = 0;
  for (const LayerMeta& l : layers) num_tokens = std::max(num_tokens, l.num_tokens);
  return reserve_target_ > 0 && num_tokens <= reserve_target_ && is_fully_reserved(layers);
}

void PagedStore::Release() {
  if (!table_.empty()) {
    std::vector<uint32_t> back(table_.rbegin(), table_.rend());
    Status st = pool_->Release(back);
    assert(st.ok());
    (void)st;
  }
  if (reserved_ > 0) pool_->Unreserve(reserved_);
  table_.clear();
  maybe_shared_.clear();
  reserved_ = 0;
  reserve_target_ = 0;
}

// --- reservations ------------------------------------------------------------

uint32_t PagedStore::BlocksNeeded(uint32_t target, uint32_t min_rows, bool assume_all_shared) const {
  const uint32_t tb = CeilDiv(target, bs_);
  const uint32_t have = num_blocks();
  uint32_t need = tb > have ? tb - have : 0;
  // A block marked maybe-shared may have become exclusive since (the other
  // holder, e.g. a fork's child, is gone): ask the pool, so that a
  // reservation never promises a copy-on-write that no write will need.
  // Exclusivity cannot be lost behind this sequence's back (another holder
  // appears only by Fork or a content hash, both of which mark the block).
  for (uint32_t i = min_rows / bs_; i < std::min(have, tb); ++i) {
    need += (assume_all_shared || (maybe_shared_[i] && !pool_->IsExclusive(table_[i]))) ? 1 : 0;
  }
  return need;
}

void PagedStore::TrimReservation(std::span<const LayerMeta> layers) {
  if (reserved_ == 0) return;
  const uint32_t need = BlocksNeeded(reserve_target_, MinRows(layers), false);
  if (reserved_ > need) {
    pool_->Unreserve(reserved_ - need);
    reserved_ = need;
  }
}

Status PagedStore::Reserve(uint32_t max_tokens, std::span<const LayerMeta> layers) {
  if (max_tokens > kMaxCacheTokens) {
    return Status::InvalidArgument(fmt::format("cache: reserve of {} tokens", max_tokens));
  }
  const uint32_t need = BlocksNeeded(max_tokens, MinRows(layers), false);
  if (need > reserved_) {
    KV_RETURN_IF_ERROR(pool_->Reserve(need - reserved_));
  } else if (need < reserved_) {
    pool_->Unreserve(reserved_ - need);
  }
  reserved_ = need;
  reserve_target_ = max_tokens;
  return Status::Ok();
}

bool PagedStore::is_fully_reserved(std::span<const LayerMeta> layers) const {
  return reserved_ >= BlocksNeeded(reserve_target_, MinRows(layers), false);
}

Result<uint32_t> PagedStore::AllocateDrawingReservation(std::span<uint32_t> fresh) {
  const uint32_t from_reserved = std::min<uint32_t>(static_cast<uint32_t>(fresh.size()), reserved_);
  KV_RETURN_IF_ERROR(pool_->Allocate(fresh, from_reserved));
  reserved_ -= from_reserved;
  return from_reserved;
}

void PagedStore::SwapInCopies(std::span<const uint32_t> cow, std::span<const uint32_t> fresh,
                              std::vector<uint32_t>* old) {
  for (size_t j = 0; j < cow.size(); ++j) {
    const uint32_t i = cow[j];
    old->push_back(table_[i]);
    pool_->CopyBlock(table_[i], fresh[j]);
    table_[i] = fresh[j];
    maybe_shared_[i] = 0;
  }
}

Status PagedStore::Shrink(std::span<const LayerMeta> layers) {
  const uint32_t keep = CeilDiv(MaxRows(layers), bs_);
  std::vector<uint32_t> dropped(table_.rbegin(), table_.rend() - keep);
  table_.resize(keep);
  maybe_shared_.resize(keep);
  return GiveBack(dropped, layers);
}

Status PagedStore::DropLeadingBlocks(uint32_t n_blocks, std::span<const LayerMeta> layers) {
  if (n_blocks > table_.size()) {
    return Status::FailedPrecondition(
        fmt::format("cache: drop of {} blocks, the table has {}", n_blocks, table_.size()));
  }
  // Back to front, as every release of this store (pool.h).
  std::vector<uint32_t> dropped(table_.rend() - n_blocks, table_.rend());
  table_.erase(table_.begin(), table_.begin() + n_blocks);
  maybe_shared_.erase(maybe_shared_.begin(), maybe_shared_.begin() + n_blocks);
  return GiveBack(dropped, layers);
}

Status PagedStore::GiveBack(std::span<const uint32_t> dropped, std::span<const LayerMeta> layers) {
  const uint32_t need = BlocksNeeded(reserve_target_, MinRows(layers), false);
  const uint32_t shortfall = need > reserved_ ? need - reserved_ : 0;
  if (!dropped.empty()) {
    KV_ASSIGN_OR_RETURN(uint32_t got, pool_->ReleaseAndReserve(dropped, shortfall));
    reserved_ += got;
  }
  if (need > reserved_ && pool_->Reserve(need - reserved_).ok()) reserved_ = need;
  return Status::Ok();
}

// --- appends and writes --------------------------------------------------------

uint32_t PagedStore::MarkWrittenBlocks(const AppendPlan& plan, std::span<const LayerMeta> layers,
                                       std::vector<uint8_t>& candidate, size_t* lo,
                                       size_t* hi) const {
  uint32_t new_max = MaxRows(layers);
  for (uint32_t li = 0; li < plan.n_layers; ++li) {
    const LayerMeta& lm = layers[plan.first_layer + li];
    for (uint32_t h = 0; h < plan.n_kv_heads; ++h) {
      if (!plan.is_alive(li, h)) continue;
      const uint32_t a = lm.head_len[h], b = a + plan.n_tokens;
      new_max = std::max(new_max, b);
      const size_t end = std::min<size_t>(table_.size(), CeilDiv(b, bs_));
      for (size_t i = a / bs_; i < end; ++i) {
        if (!maybe_shared_[i]) continue;
        candidate[i] = 1;
        *lo = std::min(*lo, i);
        *hi = std::max(*hi, i + 1);
      }
    }
  }
  return new_max;
}

void PagedStore::SplitShared(std::vector<uint8_t>& candidate, size_t lo, size_t hi) {
  for (size_t i = lo; i < hi; ++i) {
    if (!candidate[i]) continue;
    candidate[i] = 0;
    if (pool_->IsExclusive(table_[i])) {
      maybe_shared_[i] = 0;  // a cached fact, not state: safe to keep on failure
    } else {
      cow_.push_back(static_cast<uint32_t>(i));
    }
  }
}

Status PagedStore::AcquireForAppend(const AppendPlan& plan, std::span<const LayerMeta> layers) {
  old_table_ = table_.size();
  fresh_.clear();
  cow_.clear();
  cow_old_.clear();
  from_reserved_ = 0;
  // Blocks the new rows land in that may be shared, marked in this thread's
  // reusable buffer (all zero between calls); only [lo, hi) is scanned.
  thread_local std::vector<uint8_t> candidate;
  if (candidate.size() < old_table_) candidate.resize(old_table_, 0);
  size_t lo = old_table_, hi = 0;
  const uint32_t new_max = MarkWrittenBlocks(plan, layers, candidate, &lo, &hi);
  SplitShared(candidate, lo, hi);
  const uint32_t want_blocks = CeilDiv(new_max, bs_);
  const size_t n_new = want_blocks > old_table_ ? want_blocks - old_table_ : 0;
  fresh_.resize(n_new + cow_.size());
  if (fresh_.empty()) return Status::Ok();
  Result<uint32_t> got = AllocateDrawingReservation(fresh_);
  if (!got.ok()) {
    fresh_.clear();
    cow_.clear();
    return got.status();
  }
  from_reserved_ = *got;
  SwapInCopies(cow_, std::span<const uint32_t>(fresh_).first(cow_.size()), &cow_old_);
  for (size_t j = cow_.size(); j < fresh_.size(); ++j) {
    table_.push_back(fresh_[j]);
    maybe_shared_.push_back(0);
  }
  return Status::Ok();
}

void PagedStore::CommitAppend(std::span<const LayerMeta> layers) {
  if (!cow_old_.empty()) {
    Status st = pool_->Release(cow_old_);
    assert(st.ok());
    (void)st;
  }
  fresh_.clear();
  cow_.clear();
  cow_old_.clear();
  // Appends past the reservation target leave nothing to keep reserved.
  TrimReservation(layers);
}

void PagedStore::UndoAppend() {
  for (size_t j = 0; j < cow_.size(); ++j) {
    table_[cow_[j]] = cow_old_[j];
    maybe_shared_[cow_[j]] = 1;
  }
  table_.resize(old_table_);
  maybe_shared_.resize(old_table_);
  if (!fresh_.empty()) {
    Result<uint32_t> got = pool_->ReleaseAndReserve(fresh_, from_reserved_);
    assert(got.ok() && *got == from_reserved_);
    reserved_ += got.ok() ? *got : 0;
  }
  fresh_.clear();
  cow_.clear();
  cow_old_.clear();
}

Status PagedStore::MakeWritable(uint32_t first, uint32_t end) {
  if (first >= end) return Status::Ok();
  std::vector<uint32_t> cow, fresh, old;
  for (uint32_t b = first / bs_; b <= (end - 1) / bs_; ++b) {
    if (!maybe_shared_[b]) continue;
    if (pool_->IsExclusive(table_[b])) {
      maybe_shared_[b] = 0;  // a cached fact, not state
    } else {
      cow.push_back(b);
    }
  }
  if (cow.empty()) return Status::Ok();
  fresh.resize(cow.size());
  KV_RETURN_IF_ERROR(AllocateDrawingReservation(fresh).status());
  SwapInCopies(cow, fresh, &old);
  Status st = pool_->Release(old);
  assert(st.ok());
  (void)st;
  return Status::Ok();
}

// --- copies ----------------------------------------------------------------------

Result<std::unique_ptr<RowStore>> PagedStore::Clone(std::span<const LayerMeta>) const {
  auto out = std::make_unique<PagedStore>(pool_);
  std::vector<uint32_t> fresh(table_.size());
  if (!fresh.empty()) KV_RETURN_IF_ERROR(pool_->Allocate(fresh));
  for (size_t i = 0; i < fresh.size(); ++i) pool_->CopyBlock(table_[i], fresh[i]);
  out->table_ = std::move(fresh);
  out->maybe_shared_.assign(out->table_.size(), 0);
  return std::unique_ptr<RowStore>(std::move(out));
}

Result<std::unique_ptr<RowStore>> PagedStore::CloneContiguous(
    std::span<const LayerMeta> layers) const {
  const Geometry& g = pool_->geometry();
  const size_t row_bytes[kSides] = {pool_->row_bytes(Side::kKey), pool_->row_bytes(Side::kValue)};
  return std::unique_ptr<RowStore>(ContiguousStore::CopyRows(*this, g.n_kv_heads(), row_bytes, layers));
}

Result<std::unique_ptr<RowStore>> PagedStore::Fork(std::span<const LayerMeta> layers) {
  // The parent's writes to every block it holds are now copy-on-write:
  // keep its reservation whole first (the only way Fork can fail).
  uint32_t extra = 0;
  if (reserve_target_ > 0) {
    const uint32_t need = BlocksNeeded(reserve_target_, MinRows(layers), true);
    if (need > reserved_) {
      extra = need - reserved_;
      KV_RETURN_IF_ERROR(pool_->Reserve(extra));
    }
  }
  Status st = pool_->Retain(table_);
  if (!st.ok()) {
    if (extra) pool_->Unreserve(extra);
    return st;
  }
  reserved_ += extra;
  std::fill(maybe_shared_.begin(), maybe_shared_.end(), 1);
  auto child = std::make_unique<PagedStore>(pool_);
  child->table_ = table_;
  child->maybe_shared_ = maybe_shared_;
  return std::unique_ptr<RowStore>(std::move(child));
}

// --- prefix hooks ------------------------------------------------------------------

Status PagedStore::SetBlockHash(uint32_t logical_block, uint64_t hash,
                                std::span<const LayerMeta> layers) {
  if (logical_block >= table_.size()) {
    return Status::OutOfRange(
        fmt::format("cache: logical block {} of {}", logical_block, table_.size()));
  }
  if (MinRows(layers) < (logical_block + 1) * bs_) {
    return Status::FailedPrecondition(
        fmt::format("cache: logical block {} is not full in every head", logical_block));
  }
  // A content hash names one aligned block of positions. A head whose rows
  // were compacted (KeepRows, dead at some appends) may hold other positions
  // in those slots: naming them would hand an adopter rows of the wrong
  // positions.
  KV_RETURN_IF_ERROR(AlignedBlockFirst(layers, logical_block, bs_).status());
  KV_RETURN_IF_ERROR(pool_->SetBlockHash(table_[logical_block], hash));
  maybe_shared_[logical_block] = 1;
  return Status::Ok();
}

Status PagedStore::AdoptBlocks(std::span<const uint32_t> blocks) {
  if (blocks.size() * size_t{bs_} > kMaxCacheTokens) {
    return Status::InvalidArgument("cache: prefix too long");
  }
  for (uint32_t b : blocks) {
    if (b >= pool_->num_blocks() || pool_->refcount(b) == 0) {
      return Status::InvalidArgument(fmt::format("cache: prefix block {} is not held", b));
    }
  }
  table_.assign(blocks.begin(), blocks.end());
  maybe_shared_.assign(blocks.size(), 1);
  return Status::Ok();
}

// --- checks ------------------------------------------------------------------------

Status PagedStore::CheckInvariants(std::span<const LayerMeta> layers, bool released) const {
  auto fail = [](std::string m) { return Status::Internal("cache invariant: " + m); };
  if (table_.size() != CeilDiv(MaxRows(layers), bs_)) {
    return fail(fmt::format("table has {} blocks for {} rows", table_.size(), MaxRows(layers)));
  }
  if (maybe_shared_.size() != table_.size()) return fail("maybe_shared size");
  for (size_t i = 0; i < table_.size(); ++i) {
    if (pool_->refcount(table_[i]) == 0) return fail(fmt::format("block {} not held", i));
    if (!maybe_shared_[i] && !pool_->IsExclusive(table_[i])) {
      return fail(fmt::format("block {} shared but not marked", i));
    }
  }
  if (released && (reserved_ || !table_.empty())) return fail("released but holding");
  return pool_->CheckInvariants();
}

std::string PagedStore::DebugString() const {
  return fmt::format(" blocks={} reserved={} target={}", table_.size(), reserved_, reserve_target_);
}

}  // namespace kvcache
