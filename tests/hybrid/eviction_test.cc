// Eviction through the caches: window layers stay bounded and give blocks
// back, heavy-hitter and per-layer eviction keep exactly SelectRows' choice,
// attention over the compacted cache equals attention over the kept subset
// of the original, and the pools never leak.
#include <algorithm>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "hybrid/test_util.h"
#include "kvcache/cache.h"
#include "kvcache/hybrid.h"

namespace kvcache {
namespace {

using testing_hybrid::PlainAttention;
using testing_hybrid::Take;
using testing_hybrid::TokenRows;

constexpr uint32_t kH = 3, kD = 16, kBlock = 4;

Geometry Geo(uint32_t layers) {
  return *Geometry::Create({.n_layers = layers, .n_kv_heads = kH, .head_dim = kD, .block_size = kBlock});
}

void AppendOne(HybridSequence& s, uint64_t seed, uint32_t pos) {
  const HybridModel& m = s.model();
  for (uint32_t l = 0; l < m.n_layers(); ++l) {
    const auto k = TokenRows(seed, l, pos, 0, m.geometry().kv_dim());
    const auto v = TokenRows(seed, l, pos, 1, m.geometry().kv_dim());
    ASSERT_TRUE(s.AppendLayer(l, {.k = k, .v = v}).ok());
  }
}

// A window-only model in the paged layout: rows per head and blocks held
// stay bounded, blocks that leave the window go back to the pool.
TEST(HybridWindow, BoundedMemoryAndBlocksReturned) {
  const uint32_t S = 2, W = 6, G = 4;
  auto model = HybridModel::Create(Geo(2), {Format::kF32, Format::kF32},
                                   {LayerSpec::Window(S, W), LayerSpec::Window(S, W)},
                                   {.window_slack_tokens = G});
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_EQ((*model)->group_size(HybridModel::kBoundedGroup), 2u);
  EXPECT_EQ((*model)->group_size(HybridModel::kFullGroup), 0u);
  auto pools = (*model)->CreatePools(std::vector<uint32_t>{0, 16});
  ASSERT_TRUE(pools.ok());
  const auto& pool = (*pools)[HybridModel::kBoundedGroup];
  auto seq = HybridSequence::CreatePaged(*model, *pools);
  ASSERT_TRUE(seq.ok());
  const uint32_t max_rows = S + W + G - 1;
  const uint32_t max_blocks = (max_rows + kBlock - 1) / kBlock;
  uint32_t peak_blocks = 0;
  for (uint32_t pos = 0; pos < 200; ++pos) {
    AppendOne(*seq, 7, pos);
    for (uint32_t h = 0; h < kH; ++h) {
      const auto p = seq->HeadPositions(0, h);
      ASSERT_LE(p.size(), max_rows);
      // Sinks, then a contiguous run ending at the newest position covering the window.
      for (uint32_t i = 0; i < std::min<uint32_t>(S, pos + 1); ++i) ASSERT_EQ(p[i], i);
      ASSERT_EQ(p.back(), pos);
      if (pos + 1 > S + W) {
        ASSERT_LE(p[S], pos + 1 - W);
        for (size_t i = S + 1; i < p.size(); ++i) ASSERT_EQ(p[i], p[i - 1] + 1);
      }
    }
    peak_blocks = std::max(peak_blocks, pool->num_used_blocks());
    ASSERT_LE(pool->num_used_blocks(), max_blocks);
    ASSERT_TRUE(seq->CheckInvariants().ok());
  }
  EXPECT_EQ(peak_blocks, max_blocks);
  EXPECT_LE(seq->allocated_bytes(), max_blocks * pool->block_bytes());
  // Window attention over the bounded cache equals attention over the full
  // history with the same window (f32: the same rows in the same order).
  auto full_model = HybridModel::Create(Geo(2), {Format::kF32, Format::kF32},
                                        {LayerSpec::Full(), LayerSpec::Full()});
  auto full = HybridSequence::CreateContiguous(*full_model);
  ASSERT_TRUE(full.ok());
  for (uint32_t pos = 0; pos < 200; ++pos) AppendOne(*full, 7, pos);
  std::vector<float> q(kH * kD);
  std::mt19937 rng(3);
  for (float& x : q) x = std::normal_distribution<float>()(rng);
  const AttentionOptions o = seq->AttentionOptionsFor(0, {.n_q_heads = kH});
  EXPECT_EQ(o.window, W);
  EXPECT_EQ(o.n_sink, S);
  EXPECT_EQ(PlainAttention(*seq->View(0), q, o.window, o.n_sink),
            PlainAttention(*full->View(0), q, W, S));
  seq->Release();
  EXPECT_EQ(pool->num_used_blocks(), 0u);
  EXPECT_TRUE(pool->CheckInvariants().ok());
}

// Heavy hitters: Evict keeps SelectRows' choice per head; the compacted rows
// hold the original positions; attention over them equals attention over
// the same subset of a never-evicted copy.
TEST(HybridEviction, HeavyHittersMatchSelectionAndAttention) {
  for (CacheLayout layout : {CacheLayout::kContiguous, CacheLayout::kPaged}) {
    SCOPED_TRACE(layout == CacheLayout::kPaged ? "paged" : "contiguous");
    const EvictionPolicy h2o = EvictionPolicy::HeavyHitter(4, 3, 1);
    auto model = HybridModel::Create(
        Geo(1), {Format::kF32, Format::kF32},
        {LayerSpec::FullWithPolicies({h2o, EvictionPolicy::KeepAll(), h2o})});
    ASSERT_TRUE(model.ok());
    auto pools = (*model)->CreatePools(std::vector<uint32_t>{32, 32});
    ASSERT_TRUE(pools.ok());
    auto made = layout == CacheLayout::kPaged ? HybridSequence::CreatePaged(*model, *pools)
                                              : HybridSequence::CreateContiguous(*model);
    ASSERT_TRUE(made.ok());
    HybridSequence seq = std::move(made).value();
    std::mt19937 rng(11);
    for (uint32_t pos = 0; pos < 30; ++pos) AppendOne(seq, 5, pos);
    for (uint32_t h = 0; h < kH; ++h) {
      std::vector<float> probs(seq.head_len(0, h));
      for (float& p : probs) p = static_cast<float>(rng() % 8) / 8.0f;  // ties on purpose
      ASSERT_TRUE(seq.AccumulateImportance(0, h, probs).ok());
    }
    auto original = seq.Clone();
    ASSERT_TRUE(original.ok());
    std::vector<std::vector<uint32_t>> want(kH);
    for (uint32_t h = 0; h < kH; ++h) {
      const EvictionPolicy& p = (*model)->head_policies(0)[h];
      want[h] = *SelectRows(p, seq.head_len(0, h), seq.HeadImportance(0, h));
    }
    const auto imp_before = std::vector<std::vector<float>>{
        seq.HeadImportance(0, 0), seq.HeadImportance(0, 1), seq.HeadImportance(0, 2)};
    ASSERT_TRUE(seq.Evict().ok());
    ASSERT_TRUE(seq.CheckInvariants().ok());
    for (uint32_t h = 0; h < kH; ++h) {
      EXPECT_EQ(seq.HeadPositions(0, h), want[h]) << "head " << h;  // rows were positions
      const auto keys = *seq.HeadKeys(0, h), all_keys = *original->HeadKeys(0, h);
      const auto imp = seq.HeadImportance(0, h);
      for (size_t i = 0; i < want[h].size(); ++i) {
        EXPECT_TRUE(std::equal(keys.begin() + i * kD, keys.begin() + (i + 1) * kD,
                               all_keys.begin() + want[h][i] * kD));
        EXPECT_EQ(imp[i], imp_before[h][want[h][i]]);
      }
    }
    if (layout == CacheLayout::kPaged) {
      // Head 1 keeps all 30 rows, so the table still covers 30 rows (8
      // blocks); the clone is contiguous and holds none.
      EXPECT_EQ((*pools)[HybridModel::kFullGroup]->num_used_blocks(), 8u);
    }
    // Attention over the compacted cache == over the kept subset of the
    // original: build the subset as its own f32 cache with those positions.
    std::vector<float> q(kH * kD);
    for (float& x : q) x = std::normal_distribution<float>()(rng);
    LayerKvView orig_view = *original->View(0);
    std::vector<uint32_t> sub_len(kH);
    std::vector<std::vector<uint32_t>> sub_pos(kH);
    std::vector<const uint32_t*> sub_pos_ptr(kH);
    std::vector<std::vector<uint8_t>> kb(kH), vb(kH);
    std::vector<const uint8_t*> kbase(kH), vbase(kH);
    for (uint32_t h = 0; h < kH; ++h) {
      for (uint32_t r : want[h]) {
        const uint8_t* kp = orig_view.row_ptr(orig_view.k, h, r);
        const uint8_t* vp = orig_view.row_ptr(orig_view.v, h, r);
        kb[h].insert(kb[h].end(), kp, kp + orig_view.k.row_bytes);
        vb[h].insert(vb[h].end(), vp, vp + orig_view.v.row_bytes);
        sub_pos[h].push_back(orig_view.position(h, r));
      }
      sub_len[h] = static_cast<uint32_t>(want[h].size());
      sub_pos_ptr[h] = sub_pos[h].data();
      kbase[h] = kb[h].data();
      vbase[h] = vb[h].data();
    }
    LayerKvView sub = orig_view;
    sub.head_len = sub_len.data();
    sub.positions = sub_pos_ptr.data();
    sub.k.head_base = kbase.data();
    sub.v.head_base = vbase.data();
    EXPECT_EQ(PlainAttention(*seq.View(0), q), PlainAttention(sub, q));
    original->Release();
    seq.Release();
    for (const auto& p : *pools) {
      if (p) {
        EXPECT_EQ(p->num_used_blocks(), 0u);
        EXPECT_TRUE(p->CheckInvariants().ok());
      }
    }
  }
}

// EvictLayer with a DuoAttention table on a forked paged sequence: the
// compaction copies shared blocks first, the fork keeps its rows, blocks no
// head covers go back, and releasing everything leaves the pool empty.
TEST(HybridEviction, DuoTableOnForkCopiesSharedBlocks) {
  auto model = HybridModel::Create(Geo(2), {Format::kBF16, Format::kQ8},
                                   {LayerSpec::Full(), LayerSpec::Full()});
  ASSERT_TRUE(model.ok());
  auto pools = (*model)->CreatePools(std::vector<uint32_t>{40, 0});
  ASSERT_TRUE(pools.ok());
  const auto& pool = (*pools)[0];
  auto seq = HybridSequence::CreatePaged(*model, *pools);
  ASSERT_TRUE(seq.ok());
  for (uint32_t pos = 0; pos < 21; ++pos) AppendOne(*seq, 9, pos);
  EXPECT_EQ(pool->num_used_blocks(), 6u);
  auto fork = seq->Fork();
  ASSERT_TRUE(fork.ok());
  const auto fork_snap = Take(*fork);
  const auto duo = *PolicyTable::Duo({false, true, false}, EvictionPolicy::Window(2, 3));
  ASSERT_TRUE(seq->EvictLayer(0, duo).ok());
  EXPECT_EQ(seq->HeadPositions(0, 0), (std::vector<uint32_t>{0, 1, 18, 19, 20}));
  EXPECT_EQ(seq->HeadPositions(0, 1).size(), 21u);
  EXPECT_EQ(Take(*fork), fork_snap);
  ASSERT_TRUE(seq->CheckInvariants().ok());
  ASSERT_TRUE(fork->CheckInvariants().ok());
  // Evict every head of both layers to 5 rows: 2 blocks per sequence remain.
  const auto win = *PolicyTable::Uniform(kH, EvictionPolicy::Window(2, 3));
  ASSERT_TRUE(seq->EvictLayer(0, win).ok());
  ASSERT_TRUE(seq->EvictLayer(1, win).ok());
  EXPECT_EQ(seq->group_cache(0)->block_table().size(), 2u);
  EXPECT_EQ(Take(*fork), fork_snap);
  // The fork still holds its 6 blocks; seq holds 2 (copied, since shared).
  EXPECT_EQ(pool->num_used_blocks(), 8u);
  // Decoded rows of the compacted heads equal the fork's rows at those positions.
  for (uint32_t h = 0; h < kH; ++h) {
    const auto mine = *seq->HeadValues(1, h), theirs = *fork->HeadValues(1, h);
    const auto pos = seq->HeadPositions(1, h);
    for (size_t i = 0; i < pos.size(); ++i) {
      EXPECT_TRUE(std::equal(mine.begin() + i * kD, mine.begin() + (i + 1) * kD,
                             theirs.begin() + pos[i] * kD));
    }
  }
  // Appending after eviction continues positions.
  AppendOne(*seq, 9, 21);
  EXPECT_EQ(seq->HeadPositions(1, 2), (std::vector<uint32_t>{0, 1, 18, 19, 20, 21}));
  fork->Release();
  seq->Release();
  EXPECT_EQ(pool->num_used_blocks(), 0u);
  EXPECT_TRUE(pool->CheckInvariants().ok());
}

// KeepRows directly on a SequenceCache: bad row lists change nothing.
TEST(KeepRows, RejectsBadRowsAndKeepsReservations) {
  auto pool = BlockPool::Create(Geo(1), {Format::kF32, Format::kF32}, {.num_blocks = 16});
  ASSERT_TRUE(pool.ok());
  auto cache = SequenceCache::CreatePaged(*pool, {.reserve_tokens = 24});
  ASSERT_TRUE(cache.ok());
  std::vector<float> kv(10 * kH * kD, 0.5f);
  ASSERT_TRUE(cache->AppendLayer(0, kv, kv).ok());
  const uint32_t used = (*pool)->num_used_blocks(), reserved = cache->reserved_blocks();
  const std::vector<uint32_t> unsorted = {3, 1}, dup = {2, 2}, past = {9, 10};
  EXPECT_EQ(cache->KeepRows(0, 0, unsorted).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->KeepRows(0, 0, dup).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->KeepRows(0, 0, past).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->KeepRows(1, 0, {}).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(cache->head_len(0, 0), 10u);
  EXPECT_EQ((*pool)->num_used_blocks(), used);
  // Keep 2 rows in every head: the table shrinks to 1 block, freed blocks
  // go back into the reservation (target 24 tokens = 6 blocks).
  const std::vector<uint32_t> two = {0, 9};
  for (uint32_t h = 0; h < kH; ++h) ASSERT_TRUE(cache->KeepRows(0, h, two).ok());
  EXPECT_EQ(cache->block_table().size(), 1u);
  EXPECT_EQ(cache->reserved_blocks() + cache->block_table().size(), reserved + used);
  EXPECT_TRUE(cache->is_fully_reserved());
  EXPECT_EQ(cache->HeadPositions(0, 1), (std::vector<uint32_t>{0, 9}));
  ASSERT_TRUE(cache->CheckInvariants().ok());
  // Keeping nothing empties the head; truncation still works by position.
  ASSERT_TRUE(cache->KeepRows(0, 2, {}).ok());
  EXPECT_EQ(cache->head_len(0, 2), 0u);
  ASSERT_TRUE(cache->Truncate(5).ok());
  EXPECT_EQ(cache->HeadPositions(0, 0), (std::vector<uint32_t>{0}));
  ASSERT_TRUE(cache->CheckInvariants().ok());
  cache->Release();
  EXPECT_EQ((*pool)->num_used_blocks(), 0u);
  EXPECT_EQ((*pool)->num_reserved_blocks(), 0u);
}

}  // namespace
}  // namespace kvcache
