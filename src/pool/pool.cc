// BlockPool: block metadata (refcounts, intrusive free and LRU lists, hashes)
// under one spin lock, and the per-(layer, side) storage arenas.
//
// Metadata array: [num_blocks + 2] entries; the last two are the sentinels of
// two circular doubly linked lists threaded through prev/next:
//   free list  (sentinel kFreeList)  LIFO: allocation pops the front, release
//              pushes the front, so recently used (cache-warm) blocks go first.
//   LRU list   (sentinel kLruList)   cached blocks, least recently released at
//              the front (evicted first), release appends at the back.
// Removal from the middle of either list is O(1) (RetainCached, ClearBlockHash).
//
// Thread safety: everything in Impl is guarded by mu; storage is not (see pool.h).
#include "kvcache/pool.h"

#include <fmt/format.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include "pool/spin_mutex.h"

namespace kvcache {
namespace {

constexpr uint32_t kMaxBlocks = (1u << 31) - 1;

struct Meta {
  uint32_t refcount = 0;
  uint32_t prev = 0;
  uint32_t next = 0;
  BlockState state = BlockState::kFree;
  bool has_hash = false;
  uint64_t hash = 0;
};

// Zero-filled anonymous mapping: pages cost nothing until first touched.
// With huge pages, the usable range starts on a 2 MiB boundary and is
// advised MADV_HUGEPAGE before any touch (the advice is best effort).
struct Arena {
  static constexpr size_t kHuge = size_t{2} << 20;
  uint8_t* data = nullptr;  // usable start
  void* map = nullptr;      // the whole mapping
  size_t map_bytes = 0;
  Arena() = default;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  Arena(Arena&& o) noexcept : data(o.data), map(o.map), map_bytes(o.map_bytes) {
    o.data = nullptr, o.map = nullptr, o.map_bytes = 0;
  }
  ~Arena() {
    if (map) munmap(map, map_bytes);
  }
  bool Map(size_t n, bool huge_pages) {
    const bool huge = huge_pages && n >= kHuge;
    const size_t total = huge ? n + kHuge : n;
    void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return false;
    map = p;
    map_bytes = total;
    uintptr_t start = reinterpret_cast<uintptr_t>(p);
    if (huge) {
      start = (start + kHuge - 1) & ~(kHuge - 1);
      madvise(reinterpret_cast<void*>(start), (n + kHuge - 1) & ~(kHuge - 1), MADV_HUGEPAGE);
    }
    data = reinterpret_cast<uint8_t*>(start);
    return true;
  }
};

}  // namespace

struct BlockPool::Impl {
  mutable internal::SpinMutex mu;
  std::vector<Meta> meta;  // [num_blocks + 2]
  uint32_t free_sentinel = 0, lru_sentinel = 0;
  uint32_t num_free = 0, num_cached = 0, num_used = 0, num_reserved = 0;
  uint64_t evictions = 0;
  EvictionListener listener;
  std::vector<Arena> arenas;  // [n_layers][2]
  size_t row_bytes[2] = {0, 0};
  size_t head_stride[2] = {0, 0};
  size_t block_stride[2] = {0, 0};

  // --- list primitives (REQUIRES mu held) ---
  void Unlink(uint32_t b) {
    Meta& m = meta[b];
    meta[m.prev].next = m.next;
    meta[m.next].prev = m.prev;
    m.prev = m.next = b;
  }
  void InsertAfter(uint32_t pos, uint32_t b) {
    Meta& m = meta[b];
    m.prev = pos;
    m.next = meta[pos].next;
    meta[m.next].prev = b;
    meta[pos].next = b;
  }
  void PushFront(uint32_t sentinel, uint32_t b) { InsertAfter(sentinel, b); }
  void PushBack(uint32_t sentinel, uint32_t b) { InsertAfter(meta[sentinel].prev, b); }
  uint32_t Front(uint32_t sentinel) const { return meta[sentinel].next; }
  uint32_t available() const { return num_free + num_cached - num_reserved; }

  // Moves a block whose refcount just reached 0 to the free or LRU list.
  void Retire(uint32_t b) {
    Meta& m = meta[b];
    --num_used;
    if (m.has_hash) {
      m.state = BlockState::kCached;
      ++num_cached;
      PushBack(lru_sentinel, b);
    } else {
      m.state = BlockState::kFree;
      ++num_free;
      PushFront(free_sentinel, b);
    }
  }

  // Validated decrement of every block in order; returns how many retired
  // (went to free/cached). Nothing changes on error.
  Result<uint32_t> ReleaseLocked(std::span<const uint32_t> blocks, uint32_t num_blocks) {
    size_t i = 0;
    bool bad = false;
    for (; i < blocks.size(); ++i) {
      const uint32_t b = blocks[i];
      if (b >= num_blocks || meta[b].state != BlockState::kInUse || meta[b].refcount == 0) {
        bad = true;
        break;
      }
      --meta[b].refcount;
    }
    if (bad) {
      for (size_t j = 0; j < i; ++j) ++meta[blocks[j]].refcount;
      return Status::FailedPrecondition(
          fmt::format("pool: release of block {} that is not held", blocks[i]));
    }
    uint32_t retired = 0;
    for (uint32_t b : blocks) {
      if (meta[b].refcount == 0 && meta[b].state == BlockState::kInUse) {
        Retire(b);
        ++retired;
      }
    }
    return retired;
  }
};

BlockPool::BlockPool(const Geometry& geometry, FormatPair formats, uint32_t num_blocks)
    : geometry_(geometry), formats_(formats), num_blocks_(num_blocks), impl_(new Impl) {}

BlockPool::~BlockPool() = default;

size_t BlockPool::BlockBytes(const Geometry& g, FormatPair f) {
  const size_t per_layer = (RowBytes(f.k, g.head_dim()) + RowBytes(f.v, g.head_dim())) *
                           g.n_kv_heads() * g.block_size();
  return per_layer * g.n_layers();
}

uint32_t BlockPool::BlocksForBytes(const Geometry& g, FormatPair f, size_t bytes) {
  if (!CheckHeadDim(f.k, g.head_dim()).ok() || !CheckHeadDim(f.v, g.head_dim()).ok()) return 0;
  const size_t n = bytes / BlockBytes(g, f);
  return static_cast<uint32_t>(std::min<size_t>(n, kMaxBlocks));
}

Result<std::shared_ptr<BlockPool>> BlockPool::Create(const Geometry& geometry, FormatPair formats,
                                                     const BlockPoolOptions& options) {
  if (options.num_blocks == 0 || options.num_blocks > kMaxBlocks) {
    return Status::InvalidArgument(
        fmt::format("pool: num_blocks must be in [1, {}], got {}", kMaxBlocks, options.num_blocks));
  }
  KV_ASSIGN_OR_RETURN(RowCodec kc, RowCodec::Create(formats.k, geometry.head_dim(), Side::kKey,
                                                    options.rotation_seed));
  KV_ASSIGN_OR_RETURN(RowCodec vc, RowCodec::Create(formats.v, geometry.head_dim(), Side::kValue,
                                                    options.rotation_seed));
  std::shared_ptr<BlockPool> pool(new BlockPool(geometry, formats, options.num_blocks));
  pool->k_codec_ = std::make_shared<const RowCodec>(std::move(kc));
  pool->v_codec_ = std::make_shared<const RowCodec>(std::move(vc));
  Impl& im = *pool->impl_;
  const uint32_t n = options.num_blocks;
  for (int s = 0; s < 2; ++s) {
    im.row_bytes[s] = RowBytes(s == 0 ? formats.k : formats.v, geometry.head_dim());
    im.head_stride[s] = im.row_bytes[s] * geometry.block_size();
    im.block_stride[s] = im.head_stride[s] * geometry.n_kv_heads();
    if (im.block_stride[s] > SIZE_MAX / n / geometry.n_layers()) {
      return Status::InvalidArgument("pool: storage size overflows");
    }
  }
  im.arenas.resize(size_t{geometry.n_layers()} * 2);
  for (uint32_t l = 0; l < geometry.n_layers(); ++l) {
    for (int s = 0; s < 2; ++s) {
      if (!im.arenas[l * 2 + s].Map(im.block_stride[s] * n, options.huge_pages)) {
        return Status::InvalidArgument(fmt::format(
            "pool: cannot map {} bytes for {} blocks", BlockBytes(geometry, formats) * size_t{n}, n));
      }
    }
  }
  im.meta.resize(size_t{n} + 2);
  im.free_sentinel = n;
  im.lru_sentinel = n + 1;
  for (uint32_t s : {im.free_sentinel, im.lru_sentinel}) im.meta[s].prev = im.meta[s].next = s;
  // Block 0 at the front: fresh pools hand out ids in increasing order.
  for (uint32_t b = n; b-- > 0;) im.PushFront(im.free_sentinel, b);
  im.num_free = n;
  return pool;
}

size_t BlockPool::block_bytes() const { return BlockBytes(geometry_, formats_); }

const uint8_t* BlockPool::arena(uint32_t layer, Side side) const {
  return impl_->arenas[size_t{layer} * 2 + static_cast<int>(side)].data;
}
size_t BlockPool::row_bytes(Side side) const { return impl_->row_bytes[static_cast<int>(side)]; }
size_t BlockPool::head_stride(Side side) const {
  return impl_->head_stride[static_cast<int>(side)];
}
size_t BlockPool::block_stride(Side side) const {
  return impl_->block_stride[static_cast<int>(side)];
}
uint8_t* BlockPool::block_data(uint32_t layer, Side side, uint32_t block) {
  const int s = static_cast<int>(side);
  return impl_->arenas[size_t{layer} * 2 + s].data + size_t{block} * impl_->block_stride[s];
}
const uint8_t* BlockPool::block_data(uint32_t layer, Side side, uint32_t block) const {
  const int s = static_cast<int>(side);
  return impl_->arenas[size_t{layer} * 2 + s].data + size_t{block} * impl_->block_stride[s];
}

void BlockPool::CopyBlock(uint32_t src, uint32_t dst) {
  for (uint32_t l = 0; l < geometry_.n_layers(); ++l) {
    for (Side side : {Side::kKey, Side::kValue}) {
      std::memcpy(block_data(l, side, dst), block_data(l, side, src), block_stride(side));
    }
  }
}

Status BlockPool::Allocate(std::span<uint32_t> out, uint32_t from_reserved) {
  Impl& im = *impl_;
  const uint32_t n = static_cast<uint32_t>(out.size());
  std::vector<EvictedBlock> evicted;
  EvictionListener listener;
  {
    std::lock_guard<internal::SpinMutex> lock(im.mu);
    if (from_reserved > n || from_reserved > im.num_reserved) {
      return Status::FailedPrecondition(fmt::format(
          "pool: allocate {} from reservation, but only {} reserved", from_reserved, im.num_reserved));
    }
    if (out.size() > kMaxBlocks || n - from_reserved > im.available()) {
      return Status::PoolExhausted(
          fmt::format("pool: need {} blocks, {} available ({} of {} free, {} cached, {} reserved)",
                      out.size() - from_reserved, im.available(), im.num_free, num_blocks_,
                      im.num_cached, im.num_reserved));
    }
    im.num_reserved -= from_reserved;
    for (uint32_t i = 0; i < n; ++i) {
      uint32_t b = im.Front(im.free_sentinel);
      if (b != im.free_sentinel) {
        --im.num_free;
      } else {
        b = im.Front(im.lru_sentinel);  // nonempty: available() counted it
        --im.num_cached;
        ++im.evictions;
        if (im.listener) evicted.push_back({b, im.meta[b].hash});
        im.meta[b].has_hash = false;
        im.meta[b].hash = 0;
      }
      im.Unlink(b);
      Meta& m = im.meta[b];
      m.state = BlockState::kInUse;
      m.refcount = 1;
      ++im.num_used;
      out[i] = b;
    }
    if (!evicted.empty()) listener = im.listener;
  }
  if (listener) listener(evicted);
  return Status::Ok();
}

Status BlockPool::Retain(std::span<const uint32_t> blocks) {
  Impl& im = *impl_;
  std::lock_guard<internal::SpinMutex> lock(im.mu);
  for (uint32_t b : blocks) {
    if (b >= num_blocks_ || im.meta[b].state != BlockState::kInUse) {
      return Status::FailedPrecondition(fmt::format("pool: retain of block {} that is not in use", b));
    }
  }
  for (uint32_t b : blocks) ++im.meta[b].refcount;
  return Status::Ok();
}

Status BlockPool::Release(std::span<const uint32_t> blocks) {
  Impl& im = *impl_;
  std::lock_guard<internal::SpinMutex> lock(im.mu);
  Result<uint32_t> r = im.ReleaseLocked(blocks, num_blocks_);
  return r.ok() ? Status::Ok() : r.status();
}

Result<uint32_t> BlockPool::ReleaseAndReserve(std::span<const uint32_t> blocks,
                                              uint32_t max_reserve) {
  Impl& im = *impl_;
  std::lock_guard<internal::SpinMutex> lock(im.mu);
  KV_ASSIGN_OR_RETURN(uint32_t retired, im.ReleaseLocked(blocks, num_blocks_));
  const uint32_t take = std::min(retired, max_reserve);
  im.num_reserved += take;
  return take;
}

uint32_t BlockPool::refcount(uint32_t block) const {
  if (block >= num_blocks_) return 0;
  std::lock_guard<internal::SpinMutex> lock(impl_->mu);
  return impl_->meta[block].refcount;
}

BlockState BlockPool::state(uint32_t block) const {
  if (block >= num_blocks_) return BlockState::kFree;
  std::lock_guard<internal::SpinMutex> lock(impl_->mu);
  return impl_->meta[block].state;
}

bool BlockPool::IsExclusive(uint32_t block) const {
  if (block >= num_blocks_) return false;
  std::lock_guard<internal::SpinMutex> lock(impl_->mu);
  const Meta& m = impl_->meta[block];
  return m.state == BlockState::kInUse && m.refcount == 1 && !m.has_hash;
}

Status BlockPool::Reserve(uint32_t n) {
  Impl& im = *impl_;
  std::lock_guard<internal::SpinMutex> lock(im.mu);
  if (n > im.available()) {
    return Status::PoolExhausted(fmt::format("pool: cannot reserve {} blocks, {} available", n,
                                             im.available()));
  }
  im.num_reserved += n;
  return Status::Ok();
}

void BlockPool::Unreserve(uint32_t n) {
  Impl& im = *impl_;
  std::lock_guard<internal::SpinMutex> lock(im.mu);
  assert(n <= im.num_reserved);
  im.num_reserved -= std::min(n, im.num_reserved);
}

Status BlockPool::SetBlockHash(uint32_t block, uint64_t hash) {
  Impl& im = *impl_;
  std::lock_guard<internal::SpinMutex> lock(im.mu);
  if (block >= num_blocks_ || im.meta[block].state != BlockState::kInUse) {
    return Status::FailedPrecondition(fmt::format("pool: hash of block {} that is not in use", block));
  }
  im.meta[block].has_hash = true;
  im.meta[block].hash = hash;
  return Status::Ok();
}

bool BlockPool::RetainCached(uint32_t block, uint64_t hash) {
  Impl& im = *impl_;
  std::lock_guard<internal::SpinMutex> lock(im.mu);
  if (block >= num_blocks_) return false;
  Meta& m = im.meta[block];
  if (!m.has_hash || m.hash != hash || m.state == BlockState::kFree) return false;
  if (m.state == BlockState::kCached) {
    // Taking a cached block uses up availability; a reservation must stay backed.
    if (im.available() == 0) return false;
    im.Unlink(block);
    --im.num_cached;
    ++im.num_used;
    m.state = BlockState::kInUse;
  }
  ++m.refcount;
  return true;
}

Status BlockPool::ClearBlockHash(uint32_t block) {
  Impl& im = *impl_;
  std::lock_guard<internal::SpinMutex> lock(im.mu);
  if (block >= num_blocks_) return Status::InvalidArgument(fmt::format("pool: no block {}", block));
  Meta& m = im.meta[block];
  if (m.state == BlockState::kCached) {
    im.Unlink(block);
    --im.num_cached;
    ++im.num_free;
    m.state = BlockState::kFree;
    im.PushFront(im.free_sentinel, block);
  }
  m.has_hash = false;
  m.hash = 0;
  return Status::Ok();
}

std::optional<uint64_t> BlockPool::block_hash(uint32_t block) const {
  if (block >= num_blocks_) return std::nullopt;
  std::lock_guard<internal::SpinMutex> lock(impl_->mu);
  const Meta& m = impl_->meta[block];
  if (!m.has_hash) return std::nullopt;
  return m.hash;
}

void BlockPool::SetEvictionListener(EvictionListener listener) {
  std::lock_guard<internal::SpinMutex> lock(impl_->mu);
  impl_->listener = std::move(listener);
}

PoolStats BlockPool::stats() const {
  const Impl& im = *impl_;
  std::lock_guard<internal::SpinMutex> lock(im.mu);
  PoolStats s;
  s.num_blocks = num_blocks_;
  s.free_blocks = im.num_free;
  s.cached_blocks = im.num_cached;
  s.used_blocks = im.num_used;
  s.reserved_blocks = im.num_reserved;
  s.available_blocks = im.available();
  s.evictions = im.evictions;
  return s;
}

Status BlockPool::CheckInvariants() const {
  const Impl& im = *impl_;
  std::lock_guard<internal::SpinMutex> lock(im.mu);
  auto fail = [](std::string m) { return Status::Internal("pool invariant: " + m); };
  // Walk a list, checking links and states; returns the count or -1.
  auto walk = [&](uint32_t sentinel, BlockState want, bool hashed) -> int64_t {
    int64_t count = 0;
    uint32_t prev = sentinel;
    for (uint32_t b = im.meta[sentinel].next; b != sentinel; b = im.meta[b].next) {
      if (b >= num_blocks_ || im.meta[b].prev != prev || im.meta[b].state != want ||
          im.meta[b].refcount != 0 || im.meta[b].has_hash != hashed || ++count > num_blocks_) {
        return -1;
      }
      prev = b;
    }
    if (im.meta[sentinel].prev != prev) return -1;
    return count;
  };
  const int64_t free_len = walk(im.free_sentinel, BlockState::kFree, false);
  if (free_len < 0) return fail("free list corrupt");
  const int64_t lru_len = walk(im.lru_sentinel, BlockState::kCached, true);
  if (lru_len < 0) return fail("LRU list corrupt");
  uint32_t n_free = 0, n_cached = 0, n_used = 0;
  for (uint32_t b = 0; b < num_blocks_; ++b) {
    const Meta& m = im.meta[b];
    switch (m.state) {
      case BlockState::kFree: ++n_free; break;
      case BlockState::kCached: ++n_cached; break;
      case BlockState::kInUse:
        ++n_used;
        if (m.refcount == 0) return fail(fmt::format("block {} in use with refcount 0", b));
        break;
    }
  }
  if (n_free != im.num_free || n_free != free_len) {
    return fail(fmt::format("free count {} / list {} / states {}", im.num_free, free_len, n_free));
  }
  if (n_cached != im.num_cached || n_cached != lru_len) {
    return fail(fmt::format("cached count {} / list {} / states {}", im.num_cached, lru_len,
                            n_cached));
  }
  if (n_used != im.num_used) return fail(fmt::format("used count {} vs {}", im.num_used, n_used));
  if (n_free + n_cached + n_used != num_blocks_) return fail("counts do not add up");
  if (im.num_reserved > n_free + n_cached) return fail("reservations not backed");
  return Status::Ok();
}

std::string BlockPool::DebugString() const {
  const PoolStats s = stats();
  return fmt::format(
      "BlockPool{{{} {} blocks={} free={} cached={} used={} reserved={} block_bytes={}}}",
      geometry_.ToString(), FormatPairName(formats_), s.num_blocks, s.free_blocks,
      s.cached_blocks, s.used_blocks, s.reserved_blocks, block_bytes());
}

}  // namespace kvcache
