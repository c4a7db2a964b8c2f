// The window-block index (engine/window_blocks.h) on a real pool: blocks
// named one by one, a run hits only when every block of it is cached (its
// predecessors may be gone), retained all or nothing, forgotten when the
// pool evicts them, never mixing two publishers' calibrations.
#include "engine/window_blocks.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

namespace kvcache::engine {
namespace {

std::shared_ptr<BlockPool> Pool(uint32_t blocks) {
  auto g = Geometry::Create({1, 1, 16, 4});
  EXPECT_TRUE(g.ok());
  BlockPoolOptions o;
  o.num_blocks = blocks;
  auto p = BlockPool::Create(*g, {Format::kF32, Format::kF32}, o);
  EXPECT_TRUE(p.ok());
  return p.ok() ? *p : nullptr;
}

BlockHash Hash(uint64_t i) { return BlockHash{0x1000 + i, 0x77 * i + 1}; }

// Allocates n blocks and publishes block i under Hash(first + i).
std::vector<uint32_t> PublishRun(BlockPool& pool, WindowBlockIndex& index, uint64_t first, uint32_t n,
                                 std::shared_ptr<const Calibration> calibration = nullptr) {
  std::vector<uint32_t> blocks(n);
  EXPECT_TRUE(pool.Allocate(blocks).ok());
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t b = blocks[i];
    auto named = index.Publish(Hash(first + i), b, calibration,
                               [&pool, b](uint64_t h) { return pool.SetBlockHash(b, h); });
    EXPECT_TRUE(named.ok() && *named) << i;
  }
  return blocks;
}

TEST(WindowBlockIndex, ARunHitsWithoutItsPredecessorsAndIsRetainedWhole) {
  auto pool = Pool(16);
  WindowBlockIndex index(pool);
  std::vector<uint32_t> blocks = PublishRun(*pool, index, 0, 6);
  // The sequence lets go of every block: all stay cached.
  ASSERT_TRUE(pool->Release(blocks).ok());
  EXPECT_EQ(pool->stats().cached_blocks, 6u);
  const std::vector<BlockHash> tail = {Hash(3), Hash(4), Hash(5)};
  EXPECT_TRUE(index.Covers(tail));
  auto m = index.Acquire(tail);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->blocks, std::vector<uint32_t>(blocks.begin() + 3, blocks.end()));
  EXPECT_EQ(pool->stats().used_blocks, 3u);
  // Parked: the run's blocks no sequence holds (Hash(6) names none).
  EXPECT_EQ(index.Parked(tail), 0u);
  EXPECT_EQ(index.Parked(std::vector<BlockHash>{Hash(1), Hash(2), Hash(3), Hash(6)}), 2u);
  EXPECT_EQ(index.Missing(std::vector<BlockHash>{Hash(6), Hash(2), Hash(7)}), (std::vector<size_t>{0, 2}));
  // A run reaching past what was published is not covered, and a failed
  // acquisition holds nothing.
  const std::vector<BlockHash> longer = {Hash(4), Hash(5), Hash(6)};
  EXPECT_FALSE(index.Covers(longer));
  EXPECT_FALSE(index.Acquire(longer).ok());
  EXPECT_EQ(pool->stats().used_blocks, 3u);
  ASSERT_TRUE(pool->Release(m->blocks).ok());
  EXPECT_EQ(index.stats().hit_blocks, 3u);
  EXPECT_EQ(index.CheckInvariants(), "");
  EXPECT_TRUE(pool->CheckInvariants().ok());
}

TEST(WindowBlockIndex, EvictedBlocksAreForgottenAndTheirRunsMiss) {
  auto pool = Pool(8);
  WindowBlockIndex index(pool);
  std::vector<uint32_t> blocks = PublishRun(*pool, index, 0, 6);
  ASSERT_TRUE(pool->Release(blocks).ok());  // least recently released: block 0 first
  // Taking 4 blocks evicts the two least recently released cached ones.
  std::vector<uint32_t> fresh(4);
  ASSERT_TRUE(pool->Allocate(fresh).ok());
  EXPECT_EQ(index.size(), 4u);
  EXPECT_EQ(index.stats().evictions, 2u);
  EXPECT_FALSE(index.Covers(std::vector<BlockHash>{Hash(0), Hash(1)}));
  EXPECT_TRUE(index.Covers(std::vector<BlockHash>{Hash(2), Hash(3), Hash(4), Hash(5)}));
  EXPECT_EQ(index.CheckInvariants(), "");
  ASSERT_TRUE(pool->Release(fresh).ok());
}

TEST(WindowBlockIndex, DuplicatesStayPrivateAndCalibrationsDoNotMix) {
  auto pool = Pool(16);
  WindowBlockIndex index(pool);
  auto a = std::make_shared<Calibration>();
  auto b = std::make_shared<Calibration>();
  std::vector<uint32_t> first = PublishRun(*pool, index, 0, 2, a);
  // The same hash again from another block: not named, stays private.
  std::vector<uint32_t> dup(1);
  ASSERT_TRUE(pool->Allocate(dup).ok());
  auto named = index.Publish(Hash(1), dup[0], b, [&](uint64_t h) { return pool->SetBlockHash(dup[0], h); });
  ASSERT_TRUE(named.ok());
  EXPECT_FALSE(*named);
  EXPECT_FALSE(pool->block_hash(dup[0]).has_value());
  // Hash(2) from a publisher with other transforms: a run over 1..2 mixes
  // them and is no hit.
  std::vector<uint32_t> other = PublishRun(*pool, index, 2, 1, b);
  EXPECT_TRUE(index.Covers(std::vector<BlockHash>{Hash(0), Hash(1)}));
  EXPECT_FALSE(index.Covers(std::vector<BlockHash>{Hash(1), Hash(2)}));
  EXPECT_FALSE(index.Acquire(std::vector<BlockHash>{Hash(1), Hash(2)}).ok());
  for (auto* v : {&first, &dup, &other}) ASSERT_TRUE(pool->Release(*v).ok());
  EXPECT_EQ(pool->stats().used_blocks, 0u);
  EXPECT_EQ(index.CheckInvariants(), "");
}

}  // namespace
}  // namespace kvcache::engine
