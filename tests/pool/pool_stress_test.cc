// Concurrency stress of the BlockPool: threads allocate, share, reserve and
// release blocks of one pool at once. Meant to run clean under ThreadSanitizer
// (the tsan preset); correctness is checked by the counters at the end and by
// each thread's exclusive blocks keeping the bytes it wrote.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "kvcache/pool.h"

namespace kvcache {
namespace {

TEST(PoolStressTest, ManyThreadsShareOnePool) {
  auto geo = Geometry::Create({2, 2, 16, 4});
  ASSERT_TRUE(geo.ok());
  auto made = BlockPool::Create(*geo, {}, {.num_blocks = 64});
  ASSERT_TRUE(made.ok());
  std::shared_ptr<BlockPool> pool = *made;
  constexpr int kThreads = 4;
  constexpr int kIters = 4000;
  std::atomic<int> failures{0};
  // Blocks published for other threads to retain: a slot holds a block id
  // with one reference owned by the slot, or UINT32_MAX.
  std::vector<std::atomic<uint32_t>> shared(8);
  for (auto& s : shared) s = UINT32_MAX;
  auto worker = [&](int t) {
    std::mt19937 rng(1000 + t);
    std::vector<uint32_t> mine;  // exclusively held; first byte of layer 0 K = tag
    std::vector<uint32_t> borrowed;
    const uint8_t tag = static_cast<uint8_t>(t + 1);
    for (int i = 0; i < kIters; ++i) {
      switch (rng() % 6) {
        case 0:
        case 1: {
          std::vector<uint32_t> out(rng() % 3 + 1);
          if (pool->Allocate(out).ok()) {
            for (uint32_t b : out) *pool->block_data(0, Side::kKey, b) = tag;
            mine.insert(mine.end(), out.begin(), out.end());
          }
          break;
        }
        case 2:
          if (!mine.empty()) {
            const uint32_t b = mine.back();
            mine.pop_back();
            if (*pool->block_data(0, Side::kKey, b) != tag) ++failures;
            if (!pool->Release({&b, 1}).ok()) ++failures;
          }
          break;
        case 3: {  // publish one of mine, or take a reference on a published block
          auto& slot = shared[rng() % shared.size()];
          if (!mine.empty() && rng() % 2) {
            uint32_t expected = UINT32_MAX;
            const uint32_t b = mine.back();
            if (slot.compare_exchange_strong(expected, b)) mine.pop_back();
          } else {
            const uint32_t b = slot.exchange(UINT32_MAX);
            if (b != UINT32_MAX) {
              if (!pool->Retain({&b, 1}).ok()) ++failures;
              borrowed.push_back(b);
              borrowed.push_back(b);  // two references: the slot's and ours
            }
          }
          break;
        }
        case 4:
          if (!borrowed.empty()) {
            const uint32_t b = borrowed.back();
            borrowed.pop_back();
            if (!pool->Release({&b, 1}).ok()) ++failures;
          }
          break;
        case 5: {
          const uint32_t n = rng() % 4;
          if (pool->Reserve(n).ok()) {
            std::vector<uint32_t> out(n);
            if (n > 0 && !pool->Allocate(out, n).ok()) ++failures;  // reserved: cannot fail
            for (uint32_t b : out) *pool->block_data(0, Side::kKey, b) = tag;
            mine.insert(mine.end(), out.begin(), out.end());
          }
          break;
        }
      }
      if (i % 512 == 0) (void)pool->stats();
    }
    for (uint32_t b : mine) {
      if (*pool->block_data(0, Side::kKey, b) != tag) ++failures;
    }
    if (!pool->Release(mine).ok()) ++failures;
    if (!pool->Release(borrowed).ok()) ++failures;
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();
  for (auto& s : shared) {
    const uint32_t b = s.exchange(UINT32_MAX);
    if (b != UINT32_MAX) {
      ASSERT_TRUE(pool->Release({&b, 1}).ok());
    }
  }
  EXPECT_EQ(failures.load(), 0);
  EXPECT_TRUE(pool->CheckInvariants().ok()) << pool->CheckInvariants().ToString();
  const PoolStats st = pool->stats();
  EXPECT_EQ(st.free_blocks, 64u);
  EXPECT_EQ(st.used_blocks, 0u);
  EXPECT_EQ(st.reserved_blocks, 0u);
}

}  // namespace
}  // namespace kvcache
