// BlockPool: all-or-nothing allocation, refcounts, reservations, the cached
// (hashed) state with LRU eviction, storage addressing, and a random-op
// model test of the counters.
#include "kvcache/pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <vector>

namespace kvcache {
namespace {

std::shared_ptr<BlockPool> MakePool(uint32_t num_blocks, GeometryOptions g = {2, 2, 16, 4},
                                    FormatPair f = {Format::kF32, Format::kF32}) {
  auto geo = Geometry::Create(g);
  EXPECT_TRUE(geo.ok());
  auto pool = BlockPool::Create(*geo, f, {.num_blocks = num_blocks});
  EXPECT_TRUE(pool.ok()) << pool.status().ToString();
  return *pool;
}

void ExpectStats(const BlockPool& pool, uint32_t free, uint32_t cached, uint32_t used,
                 uint32_t reserved) {
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.free_blocks, free);
  EXPECT_EQ(s.cached_blocks, cached);
  EXPECT_EQ(s.used_blocks, used);
  EXPECT_EQ(s.reserved_blocks, reserved);
  EXPECT_EQ(s.available_blocks, free + cached - reserved);
  EXPECT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants().ToString();
}

TEST(BlockPoolTest, CreateRejectsBadInput) {
  auto geo = Geometry::Create({2, 2, 16, 4});
  ASSERT_TRUE(geo.ok());
  EXPECT_EQ(BlockPool::Create(*geo, {}, {.num_blocks = 0}).status().code(),
            StatusCode::kInvalidArgument);
  // turbo formats need head_dim % 16: 16 is fine, 24 is not.
  auto geo24 = Geometry::Create({2, 2, 24, 4});
  ASSERT_TRUE(geo24.ok());
  EXPECT_EQ(BlockPool::Create(*geo24, {Format::kTurbo4, Format::kF32}, {.num_blocks = 4})
                .status()
                .code(),
            StatusCode::kInvalidArgument);
}

TEST(BlockPoolTest, StorageShape) {
  auto pool = MakePool(5, {3, 2, 16, 4}, {Format::kF32, Format::kF16});
  EXPECT_EQ(pool->row_bytes(Side::kKey), 64u);
  EXPECT_EQ(pool->row_bytes(Side::kValue), 32u);
  EXPECT_EQ(pool->head_stride(Side::kKey), 4u * 64);
  EXPECT_EQ(pool->block_stride(Side::kKey), 2u * 4 * 64);
  EXPECT_EQ(pool->block_bytes(), 3u * (2 * 4 * 64 + 2 * 4 * 32));
  EXPECT_EQ(BlockPool::BlockBytes(pool->geometry(), pool->formats()), pool->block_bytes());
  EXPECT_EQ(BlockPool::BlocksForBytes(pool->geometry(), pool->formats(), pool->block_bytes() * 7 + 1),
            7u);
  for (uint32_t l = 0; l < 3; ++l) {
    EXPECT_EQ(pool->block_data(l, Side::kKey, 3), pool->arena(l, Side::kKey) + 3 * 512);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(pool->arena(l, Side::kValue)) % 64, 0u);
  }
  // CopyBlock copies every layer and side.
  uint32_t b[2];
  ASSERT_TRUE(pool->Allocate(b).ok());
  for (uint32_t l = 0; l < 3; ++l) {
    for (Side s : {Side::kKey, Side::kValue}) {
      uint8_t* p = pool->block_data(l, s, b[0]);
      for (size_t i = 0; i < pool->block_stride(s); ++i) p[i] = static_cast<uint8_t>(i * 7 + l);
    }
  }
  pool->CopyBlock(b[0], b[1]);
  for (uint32_t l = 0; l < 3; ++l) {
    for (Side s : {Side::kKey, Side::kValue}) {
      EXPECT_EQ(0, std::memcmp(pool->block_data(l, s, b[0]), pool->block_data(l, s, b[1]),
                               pool->block_stride(s)));
    }
  }
}

// Arenas of 2 MiB or more start on a 2 MiB boundary when huge pages are on
// (the default); every byte of every block stays addressable and zeroed
// either way, and a small pool works with the option too.
TEST(BlockPoolTest, HugePageArenas) {
  // 1 layer, 8 kv heads, head_dim 128, block 16, f32: 64 KiB per block side.
  auto geo = Geometry::Create({1, 8, 128, 16});
  ASSERT_TRUE(geo.ok());
  constexpr size_t kHuge = size_t{2} << 20;
  for (bool huge : {true, false}) {
    auto pool = BlockPool::Create(*geo, {Format::kF32, Format::kF32},
                                  {.num_blocks = 40, .huge_pages = huge});
    ASSERT_TRUE(pool.ok()) << pool.status().ToString();
    for (Side side : {Side::kKey, Side::kValue}) {
      const uintptr_t base = reinterpret_cast<uintptr_t>((*pool)->arena(0, side));
      if (huge) {
        EXPECT_EQ(base % kHuge, 0u);
      }
      for (uint32_t b : {0u, 39u}) {
        uint8_t* p = (*pool)->block_data(0, side, b);
        const size_t n = (*pool)->block_stride(side);
        EXPECT_EQ(p[0], 0);
        EXPECT_EQ(p[n - 1], 0);
        p[0] = 0xA5;
        p[n - 1] = 0x5A;
        EXPECT_EQ((*pool)->block_data(0, side, b)[0], 0xA5);
        EXPECT_EQ((*pool)->block_data(0, side, b)[n - 1], 0x5A);
      }
    }
  }
  auto small = BlockPool::Create(*geo, {Format::kF32, Format::kF32}, {.num_blocks = 2});
  ASSERT_TRUE(small.ok());
  (*small)->block_data(0, Side::kKey, 1)[0] = 1;
  EXPECT_EQ((*small)->block_data(0, Side::kKey, 1)[0], 1);
}

TEST(BlockPoolTest, AllocateIsAllOrNothing) {
  auto pool = MakePool(4);
  std::vector<uint32_t> a(3);
  ASSERT_TRUE(pool->Allocate(a).ok());
  EXPECT_EQ(a, (std::vector<uint32_t>{0, 1, 2}));  // fresh pools hand out ids in order
  ExpectStats(*pool, 1, 0, 3, 0);
  std::vector<uint32_t> b(2, 99);
  Status s = pool->Allocate(b);
  EXPECT_TRUE(s.IsPoolExhausted()) << s.ToString();
  EXPECT_EQ(b, (std::vector<uint32_t>{99, 99}));
  ExpectStats(*pool, 1, 0, 3, 0);
  ASSERT_TRUE(pool->Release(a).ok());
  ExpectStats(*pool, 4, 0, 0, 0);
  // LIFO: the most recently freed block comes back first.
  uint32_t one;
  ASSERT_TRUE(pool->Allocate({&one, 1}).ok());
  EXPECT_EQ(one, 2u);
}

TEST(BlockPoolTest, RefcountsAndBadReleases) {
  auto pool = MakePool(3);
  uint32_t b[1];
  ASSERT_TRUE(pool->Allocate(b).ok());
  ASSERT_TRUE(pool->Retain(b).ok());
  EXPECT_EQ(pool->refcount(b[0]), 2u);
  EXPECT_FALSE(pool->IsExclusive(b[0]));
  ASSERT_TRUE(pool->Release(b).ok());
  EXPECT_TRUE(pool->IsExclusive(b[0]));
  ASSERT_TRUE(pool->Release(b).ok());
  ExpectStats(*pool, 3, 0, 0, 0);
  // Double release, release of a free block, duplicates beyond the refcount,
  // an id out of range: errors that change nothing.
  EXPECT_FALSE(pool->Release(b).ok());
  ASSERT_TRUE(pool->Allocate(b).ok());
  const uint32_t dup[2] = {b[0], b[0]};
  EXPECT_FALSE(pool->Release(dup).ok());
  EXPECT_EQ(pool->refcount(b[0]), 1u);
  const uint32_t mixed[2] = {b[0], 77};
  EXPECT_FALSE(pool->Release(mixed).ok());
  EXPECT_EQ(pool->refcount(b[0]), 1u);
  EXPECT_FALSE(pool->Retain(mixed).ok());
  EXPECT_EQ(pool->refcount(b[0]), 1u);
  ExpectStats(*pool, 2, 0, 1, 0);
  // Duplicates within the refcount are fine and retire the block once.
  ASSERT_TRUE(pool->Retain(b).ok());
  ASSERT_TRUE(pool->Release(dup).ok());
  ExpectStats(*pool, 3, 0, 0, 0);
}

TEST(BlockPoolTest, Reservations) {
  auto pool = MakePool(5);
  ASSERT_TRUE(pool->Reserve(3).ok());
  ExpectStats(*pool, 5, 0, 0, 3);
  EXPECT_TRUE(pool->Reserve(3).IsPoolExhausted());
  std::vector<uint32_t> a(3);
  EXPECT_TRUE(pool->Allocate(a).IsPoolExhausted());  // only 2 unreserved
  ExpectStats(*pool, 5, 0, 0, 3);
  ASSERT_TRUE(pool->Allocate(a, /*from_reserved=*/2).ok());
  ExpectStats(*pool, 2, 0, 3, 1);
  // Drawing more from reservations than exist is a contract error.
  uint32_t one;
  EXPECT_EQ(pool->Allocate({&one, 1}, 2).code(), StatusCode::kFailedPrecondition);
  // Release two blocks and keep one of them reserved, atomically.
  auto got = pool->ReleaseAndReserve(std::span<const uint32_t>(a).first(2), 1);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, 1u);
  ExpectStats(*pool, 4, 0, 1, 2);
  pool->Unreserve(2);
  ASSERT_TRUE(pool->Release(std::span<const uint32_t>(a).last(1)).ok());
  ExpectStats(*pool, 5, 0, 0, 0);
}

TEST(BlockPoolTest, CachedBlocksEvictLeastRecentlyReleasedFirst) {
  auto pool = MakePool(4);
  std::vector<EvictedBlock> evicted;
  pool->SetEvictionListener([&](std::span<const EvictedBlock> e) {
    evicted.insert(evicted.end(), e.begin(), e.end());
    // The listener runs without the pool's lock: calling back is fine.
    EXPECT_TRUE(pool->CheckInvariants().ok());
  });
  std::vector<uint32_t> a(3);
  ASSERT_TRUE(pool->Allocate(a).ok());
  for (uint32_t i = 0; i < 3; ++i) ASSERT_TRUE(pool->SetBlockHash(a[i], 100 + i).ok());
  EXPECT_FALSE(pool->IsExclusive(a[0]));  // hashed blocks are never written in place
  // A chain released tail first: the tail is the least recently used.
  const std::vector<uint32_t> back(a.rbegin(), a.rend());
  ASSERT_TRUE(pool->Release(back).ok());
  ExpectStats(*pool, 1, 3, 0, 0);
  EXPECT_EQ(pool->state(a[0]), BlockState::kCached);
  // A prefix hit revives block 0 (leaves the LRU).
  EXPECT_TRUE(pool->RetainCached(a[0], 100));
  EXPECT_FALSE(pool->RetainCached(a[1], 999));  // wrong hash
  ExpectStats(*pool, 1, 2, 1, 0);
  // Allocating 3: the free block, then a[2] (released first), then a[1].
  std::vector<uint32_t> c(3);
  ASSERT_TRUE(pool->Allocate(c).ok());
  ASSERT_EQ(evicted.size(), 2u);
  EXPECT_EQ(evicted[0].block, a[2]);
  EXPECT_EQ(evicted[0].hash, 102u);
  EXPECT_EQ(evicted[1].block, a[1]);
  EXPECT_FALSE(pool->RetainCached(a[2], 102));  // gone
  EXPECT_FALSE(pool->block_hash(a[2]).has_value());
  EXPECT_EQ(pool->stats().evictions, 2u);
  ExpectStats(*pool, 0, 0, 4, 0);
  // ClearBlockHash on a cached block frees it.
  ASSERT_TRUE(pool->Release({&a[0], 1}).ok());
  EXPECT_EQ(pool->state(a[0]), BlockState::kCached);
  ASSERT_TRUE(pool->ClearBlockHash(a[0]).ok());
  ExpectStats(*pool, 1, 0, 3, 0);
  // Reserved availability is never handed to a cache hit.
  ASSERT_TRUE(pool->SetBlockHash(c[0], 7).ok());
  ASSERT_TRUE(pool->Release({&c[0], 1}).ok());
  ASSERT_TRUE(pool->Reserve(2).ok());
  EXPECT_FALSE(pool->RetainCached(c[0], 7));
  pool->Unreserve(2);
  EXPECT_TRUE(pool->RetainCached(c[0], 7));
}

// Random operations against a map of refcounts.
TEST(BlockPoolTest, RandomOpsMatchModel) {
  const uint32_t n = 16;
  auto pool = MakePool(n);
  std::mt19937 rng(7);
  std::map<uint32_t, uint32_t> refs;  // held block -> refcount
  std::map<uint32_t, uint64_t> cached;  // cached block -> hash
  std::map<uint32_t, uint64_t> hashed;  // in-use block -> hash
  uint32_t reserved = 0;
  for (int step = 0; step < 5000; ++step) {
    const uint32_t op = rng() % 6;
    if (op == 0) {
      std::vector<uint32_t> out(rng() % 4 + 1);
      const uint32_t from_res = std::min<uint32_t>(reserved, rng() % (out.size() + 1));
      const uint32_t avail = n - static_cast<uint32_t>(refs.size()) - reserved;
      Status s = pool->Allocate(out, from_res);
      ASSERT_EQ(s.ok(), out.size() - from_res <= avail) << s.ToString();
      if (s.ok()) {
        reserved -= from_res;
        for (uint32_t b : out) {
          ASSERT_EQ(refs.count(b), 0u);
          refs[b] = 1;
          cached.erase(b);
        }
      }
    } else if (op == 1 && !refs.empty()) {
      auto it = std::next(refs.begin(), rng() % refs.size());
      if (rng() % 2) {
        ASSERT_TRUE(pool->Retain({&it->first, 1}).ok());
        ++it->second;
      } else {
        const uint32_t b = it->first;
        ASSERT_TRUE(pool->Release({&b, 1}).ok());
        if (--it->second == 0) {
          refs.erase(it);
          if (hashed.count(b)) cached[b] = hashed[b], hashed.erase(b);
        }
      }
    } else if (op == 2) {
      const uint32_t k = rng() % 3;
      const uint32_t avail = n - static_cast<uint32_t>(refs.size()) - reserved;
      ASSERT_EQ(pool->Reserve(k).ok(), k <= avail);
      if (k <= avail) reserved += k;
    } else if (op == 3 && reserved > 0) {
      pool->Unreserve(1);
      --reserved;
    } else if (op == 4 && !refs.empty()) {
      auto it = std::next(refs.begin(), rng() % refs.size());
      const uint64_t h = rng();
      ASSERT_TRUE(pool->SetBlockHash(it->first, h).ok());
      hashed[it->first] = h;
    } else if (op == 5 && !cached.empty()) {
      auto it = std::next(cached.begin(), rng() % cached.size());
      const uint32_t avail = n - static_cast<uint32_t>(refs.size()) - reserved;
      const bool ok = pool->RetainCached(it->first, it->second);
      ASSERT_EQ(ok, avail > 0);
      if (ok) {
        refs[it->first] = 1;
        hashed[it->first] = it->second;
        cached.erase(it);
      }
    }
    // Evicted cached blocks: the pool knows, the model learns from it.
    for (auto it = cached.begin(); it != cached.end();) {
      if (pool->state(it->first) != BlockState::kCached) {
        it = cached.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = hashed.begin(); it != hashed.end();) {
      it = refs.count(it->first) ? std::next(it) : hashed.erase(it);
    }
    const PoolStats s = pool->stats();
    ASSERT_EQ(s.used_blocks, refs.size());
    ASSERT_EQ(s.cached_blocks, cached.size());
    ASSERT_EQ(s.reserved_blocks, reserved);
    for (auto [b, r] : refs) ASSERT_EQ(pool->refcount(b), r);
    ASSERT_TRUE(pool->CheckInvariants().ok());
  }
}

}  // namespace
}  // namespace kvcache
