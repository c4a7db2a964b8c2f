// SequenceCache / LayerCache: the contracts the random model test does not
// single out — memory of dead heads, planned capacity, view addressing,
// fork sharing and copy-on-write, clone detachment, reservations under
// pressure, prefix adoption, per-layer appends and importance.
#include "kvcache/cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

namespace kvcache {
namespace {

Geometry Geo(uint32_t layers = 2, uint32_t heads = 2, uint32_t dim = 8, uint32_t block = 4) {
  auto g = Geometry::Create({layers, heads, dim, block});
  EXPECT_TRUE(g.ok());
  return *g;
}

std::shared_ptr<BlockPool> Pool(const Geometry& g, uint32_t blocks) {
  auto p = BlockPool::Create(g, {}, {.num_blocks = blocks});
  EXPECT_TRUE(p.ok());
  return *p;
}

// [n_layers][T][H][D] with value = token * 1000 + layer * 100 + head * 10 + i%10.
std::vector<float> Tokens(const Geometry& g, uint32_t first, uint32_t T, float add = 0) {
  std::vector<float> out;
  for (uint32_t l = 0; l < g.n_layers(); ++l)
    for (uint32_t t = first; t < first + T; ++t)
      for (uint32_t h = 0; h < g.n_kv_heads(); ++h)
        for (uint32_t i = 0; i < g.head_dim(); ++i)
          out.push_back(static_cast<float>(t * 1000 + l * 100 + h * 10 + i % 10) + add);
  return out;
}

// A paged cache on `pool` holding tokens [0, T) of Tokens() in every layer.
Result<SequenceCache> PagedHolding(const std::shared_ptr<BlockPool>& pool, uint32_t T) {
  KV_ASSIGN_OR_RETURN(SequenceCache c, SequenceCache::CreatePaged(pool));
  const Geometry& g = pool->geometry();
  KV_RETURN_IF_ERROR(c.Append(Tokens(g, 0, T), Tokens(g, 0, T)));
  return c;
}

float At(const std::vector<float>& rows, uint32_t row, uint32_t dim, uint32_t i) {
  return rows[size_t{row} * dim + i];
}

TEST(SequenceCacheTest, ContiguousDeadHeadUsesNoMemory) {
  const Geometry g = Geo(1, 3, 8, 4);
  auto c = SequenceCache::CreateContiguous(g, {});
  ASSERT_TRUE(c.ok());
  const std::vector<uint8_t> alive = {1, 0, 1};
  for (uint32_t t = 0; t < 5; ++t) ASSERT_TRUE(c->Append(Tokens(g, t, 1), Tokens(g, t, 1), {alive}).ok());
  EXPECT_EQ(c->num_tokens(), 5u);
  EXPECT_EQ(c->head_len(0, 0), 5u);
  EXPECT_EQ(c->head_len(0, 1), 0u);
  auto keys1 = c->HeadKeys(0, 1);
  ASSERT_TRUE(keys1.ok());
  EXPECT_TRUE(keys1->empty());
  // Two live heads, K and V, f32 rows of 8 values, growable capacity 16.
  EXPECT_EQ(c->allocated_bytes(), 2u * 2 * 16 * 32);
  EXPECT_EQ(c->used_bytes(), 2u * 2 * 5 * 32);
  auto view = c->View(0);
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->k.head_base[1], nullptr);
  EXPECT_EQ(view->rows(1), 0u);
  EXPECT_EQ(view->rows(2), 5u);
  // Row 3 of head 2 holds token 3.
  const float* row = reinterpret_cast<const float*>(view->row_ptr(view->v, 2, 3));
  EXPECT_EQ(row[1], 3000 + 20 + 1);
  // Head 1 comes alive later: its rows are compacted, positions remember.
  ASSERT_TRUE(c->Append(Tokens(g, 5, 2), Tokens(g, 5, 2)).ok());
  EXPECT_EQ(c->HeadPositions(0, 1), (std::vector<uint32_t>{5, 6}));
  auto k1 = c->HeadKeys(0, 1);
  ASSERT_TRUE(k1.ok());
  EXPECT_EQ(At(*k1, 0, 8, 0), 5000 + 10);
  view = c->View(0);
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->position(1, 1), 6u);
  EXPECT_EQ(view->position(0, 6), 6u);
}

TEST(SequenceCacheTest, PlannedCapacity) {
  const Geometry g = Geo(1, 1, 8, 4);
  auto grow = SequenceCache::CreateContiguous(g, {}, {.capacity_tokens = 4});
  ASSERT_TRUE(grow.ok());
  EXPECT_TRUE(grow->is_within_planned_capacity());
  ASSERT_TRUE(grow->Append(Tokens(g, 0, 4), Tokens(g, 0, 4)).ok());
  EXPECT_TRUE(grow->is_within_planned_capacity());
  EXPECT_EQ(grow->capacity_tokens(), 4u);
  ASSERT_TRUE(grow->Append(Tokens(g, 4, 1), Tokens(g, 4, 1)).ok());
  EXPECT_FALSE(grow->is_within_planned_capacity());
  EXPECT_GE(grow->capacity_tokens(), 5u);

  auto fixed = SequenceCache::CreateContiguous(
      g, {}, {.capacity_tokens = 4, .policy = CapacityPolicy::kFixed});
  ASSERT_TRUE(fixed.ok());
  ASSERT_TRUE(fixed->Append(Tokens(g, 0, 3), Tokens(g, 0, 3)).ok());
  const size_t bytes = fixed->allocated_bytes();
  EXPECT_EQ(fixed->Append(Tokens(g, 3, 2), Tokens(g, 3, 2)).code(), StatusCode::kCapacityExceeded);
  EXPECT_EQ(fixed->num_tokens(), 3u);
  EXPECT_EQ(fixed->allocated_bytes(), bytes);
  ASSERT_TRUE(fixed->Append(Tokens(g, 3, 1), Tokens(g, 3, 1)).ok());
  EXPECT_TRUE(fixed->is_within_planned_capacity());
  EXPECT_EQ(fixed->AdvanceLen(1).code(), StatusCode::kCapacityExceeded);
}

TEST(SequenceCacheTest, PagedViewAndExports) {
  const Geometry g = Geo(2, 2, 8, 4);
  auto pool = Pool(g, 8);
  auto c = SequenceCache::CreatePaged(pool);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->block_size(), 4u);
  ASSERT_TRUE(c->Append(Tokens(g, 0, 6), Tokens(g, 0, 6, 0.5f)).ok());
  ASSERT_EQ(c->block_table().size(), 2u);
  EXPECT_EQ(c->context_lens()[0], 6u);
  EXPECT_EQ(pool->num_used_blocks(), 2u);
  for (uint32_t l = 0; l < 2; ++l) {
    auto view = c->View(l);
    ASSERT_TRUE(view.ok());
    EXPECT_EQ(view->num_blocks, 2u);
    EXPECT_EQ(view->k.base, pool->arena(l, Side::kKey));
    EXPECT_EQ(view->block_table, c->block_table().data());
    for (uint32_t h = 0; h < 2; ++h) {
      for (uint32_t r = 0; r < 6; ++r) {
        const float* k = reinterpret_cast<const float*>(view->row_ptr(view->k, h, r));
        const float* v = reinterpret_cast<const float*>(view->row_ptr(view->v, h, r));
        EXPECT_EQ(k[3], r * 1000 + l * 100 + h * 10 + 3);
        EXPECT_EQ(v[3], r * 1000 + l * 100 + h * 10 + 3 + 0.5f);
      }
    }
  }
  // AdvanceLen stores zero rows.
  ASSERT_TRUE(c->AdvanceLen(3).ok());
  auto v = c->HeadValues(1, 1);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(At(*v, 8, 8, 3), 0.0f);
  EXPECT_EQ(c->block_table().size(), 3u);
  // Truncate releases whole blocks only.
  ASSERT_TRUE(c->Truncate(5).ok());
  EXPECT_EQ(c->block_table().size(), 2u);
  EXPECT_EQ(pool->num_used_blocks(), 2u);
  EXPECT_EQ(c->Truncate(6).code(), StatusCode::kOutOfRange);
  ASSERT_TRUE(c->TruncateLast(5).ok());
  EXPECT_EQ(pool->num_used_blocks(), 0u);
}

TEST(SequenceCacheTest, ForkSharesBlocksAndCopiesOnWrite) {
  const Geometry g = Geo(2, 2, 8, 4);
  auto pool = Pool(g, 16);
  auto parent = PagedHolding(pool, 10);  // 2 full + 1 partial
  ASSERT_TRUE(parent.ok());
  EXPECT_EQ(pool->num_used_blocks(), 3u);
  auto child = parent->Fork();
  ASSERT_TRUE(child.ok());
  EXPECT_EQ(pool->num_used_blocks(), 3u);  // refcount bumps only
  for (uint32_t b : parent->block_table()) EXPECT_EQ(pool->refcount(b), 2u);
  EXPECT_TRUE(std::ranges::equal(parent->block_table(), child->block_table()));
  // The child's first write copies only the partial last block.
  ASSERT_TRUE(child->Append(Tokens(g, 10, 1, 7), Tokens(g, 10, 1, 7)).ok());
  EXPECT_EQ(pool->num_used_blocks(), 4u);
  EXPECT_EQ(parent->block_table()[0], child->block_table()[0]);
  EXPECT_EQ(parent->block_table()[1], child->block_table()[1]);
  EXPECT_NE(parent->block_table()[2], child->block_table()[2]);
  EXPECT_EQ(pool->refcount(parent->block_table()[2]), 1u);
  // The parent now holds its last block alone and writes it in place.
  ASSERT_TRUE(parent->Append(Tokens(g, 10, 1, 9), Tokens(g, 10, 1, 9)).ok());
  EXPECT_EQ(pool->num_used_blocks(), 4u);
  auto pk = parent->HeadKeys(1, 1);
  auto ck = child->HeadKeys(1, 1);
  ASSERT_TRUE(pk.ok() && ck.ok());
  EXPECT_EQ(At(*pk, 10, 8, 0), 10000 + 110 + 9);
  EXPECT_EQ(At(*ck, 10, 8, 0), 10000 + 110 + 7);
  EXPECT_EQ(At(*pk, 9, 8, 0), At(*ck, 9, 8, 0));
  // Releasing both gives every block back exactly once.
  parent->Release();
  EXPECT_EQ(pool->num_used_blocks(), 3u);
  child->Release();
  EXPECT_EQ(pool->num_free_blocks(), 16u);
  EXPECT_TRUE(pool->CheckInvariants().ok());
}

TEST(SequenceCacheTest, CloneIsDetached) {
  const Geometry g = Geo(2, 2, 8, 4);
  auto pool = Pool(g, 8);
  auto c = PagedHolding(pool, 7);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c->AccumulateImportance(0, 1, std::vector<float>(7, 0.25f)).ok());
  auto clone = c->Clone();
  ASSERT_TRUE(clone.ok());
  EXPECT_EQ(clone->layout(), CacheLayout::kContiguous);
  EXPECT_TRUE(clone->block_table().empty());
  EXPECT_EQ(pool->num_used_blocks(), 2u);
  EXPECT_EQ(*clone->HeadKeys(1, 0), *c->HeadKeys(1, 0));
  EXPECT_EQ(clone->Importance(0), c->Importance(0));
  c->Release();
  EXPECT_EQ(pool->num_used_blocks(), 0u);
  EXPECT_EQ(clone->num_tokens(), 7u);
  ASSERT_TRUE(clone->Append(Tokens(g, 7, 1), Tokens(g, 7, 1)).ok());
  EXPECT_EQ(pool->num_used_blocks(), 0u);
  // A paged clone draws its own blocks, all or nothing.
  auto c2 = PagedHolding(pool, 16);  // 4 blocks
  ASSERT_TRUE(c2.ok());
  auto paged = c2->Clone({CloneLayout::kSame});
  ASSERT_TRUE(paged.ok());
  EXPECT_EQ(pool->num_used_blocks(), 8u);
  EXPECT_EQ(*paged->HeadValues(1, 1), *c2->HeadValues(1, 1));
  auto none = c2->Clone({CloneLayout::kSame});
  EXPECT_TRUE(none.status().IsPoolExhausted());
  EXPECT_EQ(pool->num_used_blocks(), 8u);
}

TEST(SequenceCacheTest, ReservationIsAdmissionControl) {
  const Geometry g = Geo(1, 1, 8, 4);
  auto pool = Pool(g, 6);
  // Worst case 5 blocks: admitted. A second request for 4 blocks is not.
  auto a = SequenceCache::CreatePaged(pool, {.reserve_tokens = 20});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->reserved_blocks(), 5u);
  EXPECT_TRUE(a->is_within_planned_capacity());
  auto b = SequenceCache::CreatePaged(pool, {.reserve_tokens = 16});
  EXPECT_TRUE(b.status().IsPoolExhausted());
  EXPECT_EQ(pool->num_reserved_blocks(), 5u);
  // Someone else takes the only unreserved block...
  auto greedy = PagedHolding(pool, 4);
  ASSERT_TRUE(greedy.ok());
  EXPECT_TRUE(greedy->Append(Tokens(g, 4, 1), Tokens(g, 4, 1)).IsPoolExhausted());
  // ...yet the reserved sequence appends all 20 tokens, with speculative
  // rejects in between, without ever failing.
  for (uint32_t t = 0; t < 20;) {
    const uint32_t draft = std::min(3u, 20 - t);
    ASSERT_TRUE(a->Append(Tokens(g, t, draft), Tokens(g, t, draft)).ok()) << t;
    ASSERT_TRUE(a->TruncateLast(draft - 1).ok());  // accept one
    ++t;
    EXPECT_TRUE(a->is_fully_reserved());
  }
  EXPECT_EQ(a->num_tokens(), 20u);
  EXPECT_EQ(a->reserved_blocks(), 0u);
  EXPECT_EQ(pool->num_used_blocks(), 6u);
  EXPECT_TRUE(a->Append(Tokens(g, 20, 1), Tokens(g, 20, 1)).IsPoolExhausted());
  a->Release();
  EXPECT_EQ(pool->num_reserved_blocks(), 0u);
  EXPECT_EQ(pool->num_used_blocks(), 1u);
}

TEST(SequenceCacheTest, ExhaustionMidAppendChangesNothing) {
  const Geometry g = Geo(3, 2, 8, 2);
  auto pool = Pool(g, 3);
  auto c = PagedHolding(pool, 5);  // 3 blocks
  ASSERT_TRUE(c.ok());
  const auto before = *c->HeadKeys(2, 1);
  EXPECT_TRUE(c->Append(Tokens(g, 5, 2), Tokens(g, 5, 2)).IsPoolExhausted());
  // Per-layer too: layer 0 cannot grow past the pool either.
  EXPECT_TRUE(c->layer(0).Append(std::vector<float>(2 * 2 * 8 * 2, 1.0f),
                                 std::vector<float>(2 * 2 * 8 * 2, 1.0f))
                  .IsPoolExhausted());
  for (uint32_t l = 0; l < 3; ++l) EXPECT_EQ(c->num_tokens(l), 5u);
  EXPECT_EQ(*c->HeadKeys(2, 1), before);
  EXPECT_EQ(pool->num_used_blocks(), 3u);
  EXPECT_TRUE(c->CheckInvariants().ok());
}

TEST(SequenceCacheTest, LayerByLayerAppend) {
  const Geometry g = Geo(3, 1, 8, 4);
  auto pool = Pool(g, 4);
  auto c = SequenceCache::CreatePaged(pool);
  ASSERT_TRUE(c.ok());
  std::vector<float> row(8, 1.5f);
  ASSERT_TRUE(c->layer(0).Append(row, row).ok());
  EXPECT_EQ(c->num_tokens(), 1u);
  EXPECT_EQ(c->num_tokens(1), 0u);
  EXPECT_EQ(c->layer(0).num_tokens(), 1u);
  ASSERT_TRUE(c->layer(1).Append(row, row).ok());
  ASSERT_TRUE(c->layer(2).Append(row, row).ok());
  EXPECT_EQ(c->block_table().size(), 1u);
  EXPECT_EQ(c->layer(2).HeadKeys(0)->at(7), 1.5f);
  EXPECT_EQ(c->layer(1).used_bytes(), 2u * 32);
  EXPECT_EQ(c->layer(1).allocated_bytes(), pool->block_bytes() / 3);
  EXPECT_EQ(c->layer(3).Append(row, row).code(), StatusCode::kOutOfRange);
}

TEST(SequenceCacheTest, ImportanceSumsOverHeadsByPosition) {
  const Geometry g = Geo(1, 2, 8, 4);
  auto c = SequenceCache::CreateContiguous(g, {});
  ASSERT_TRUE(c.ok());
  const std::vector<uint8_t> only0 = {1, 0};
  ASSERT_TRUE(c->Append(Tokens(g, 0, 2), Tokens(g, 0, 2), {only0}).ok());
  ASSERT_TRUE(c->Append(Tokens(g, 2, 1), Tokens(g, 2, 1)).ok());
  // head 0 stores positions 0,1,2; head 1 only position 2.
  ASSERT_TRUE(c->AccumulateImportance(0, 0, std::vector<float>{0.5f, 0.25f, 0.25f}).ok());
  ASSERT_TRUE(c->layer(0).AccumulateImportance(1, std::vector<float>{1.0f}).ok());
  EXPECT_EQ(c->Importance(0), (std::vector<float>{0.5f, 0.25f, 1.25f}));
  EXPECT_EQ(c->HeadImportance(0, 1), (std::vector<float>{1.0f}));
  EXPECT_EQ(c->AccumulateImportance(0, 1, std::vector<float>{1, 2}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(c->AccumulateImportance(0, 2, {}).code(), StatusCode::kOutOfRange);
  ASSERT_TRUE(c->Truncate(2).ok());
  EXPECT_EQ(c->Importance(0), (std::vector<float>{0.5f, 0.25f}));
  EXPECT_EQ(c->head_len(0, 1), 0u);
}

TEST(SequenceCacheTest, PublishedPrefixIsAdoptedBySharing) {
  const Geometry g = Geo(2, 1, 8, 4);
  auto pool = Pool(g, 6);
  auto a = PagedHolding(pool, 9);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(a->SetBlockHash(0, 111).ok());
  ASSERT_TRUE(a->SetBlockHash(1, 222).ok());
  EXPECT_EQ(a->SetBlockHash(2, 333).code(), StatusCode::kFailedPrecondition);  // partial
  const std::vector<uint32_t> prefix(a->block_table().begin(), a->block_table().begin() + 2);
  // Writing into a published block copies it, even when held alone.
  ASSERT_TRUE(a->Truncate(7).ok());
  ASSERT_TRUE(a->Append(Tokens(g, 7, 1, 0.5f), Tokens(g, 7, 1, 0.5f)).ok());
  EXPECT_NE(a->block_table()[1], prefix[1]);
  EXPECT_EQ(pool->state(prefix[1]), BlockState::kCached);
  a->Release();
  EXPECT_EQ(pool->num_cached_blocks(), 2u);
  // A new request finds both blocks still cached and adopts them.
  auto b = SequenceCache::CreatePaged(pool);
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(pool->RetainCached(prefix[0], 111));
  ASSERT_TRUE(pool->RetainCached(prefix[1], 222));
  ASSERT_TRUE(b->AdoptPrefix(prefix, nullptr).ok());
  EXPECT_EQ(b->num_tokens(), 8u);
  auto k = b->HeadKeys(1, 0);
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(At(*k, 7, 8, 0), 7000 + 100);
  EXPECT_EQ(b->AdoptPrefix(prefix, nullptr).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(b->Append(Tokens(g, 8, 1), Tokens(g, 8, 1)).ok());
  b->Release();
  EXPECT_EQ(pool->num_cached_blocks(), 2u);
  EXPECT_TRUE(pool->CheckInvariants().ok());
}

TEST(SequenceCacheTest, MovesAndDestructionReleaseOnce) {
  const Geometry g = Geo(1, 1, 8, 4);
  auto pool = Pool(g, 4);
  {
    auto a = PagedHolding(pool, 5);
    ASSERT_TRUE(a.ok());
    SequenceCache moved = std::move(*a);
    EXPECT_EQ(pool->num_used_blocks(), 2u);
    auto b = PagedHolding(pool, 1);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(pool->num_used_blocks(), 3u);
    moved = std::move(*b);  // releases what `moved` held
    EXPECT_EQ(pool->num_used_blocks(), 1u);
  }
  EXPECT_EQ(pool->num_used_blocks(), 0u);
  EXPECT_TRUE(pool->CheckInvariants().ok());
}

TEST(SequenceCacheTest, ReleasedCacheRefusesWork) {
  const Geometry g = Geo(1, 1, 8, 4);
  auto c = SequenceCache::CreateContiguous(g, {});
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c->Append(Tokens(g, 0, 2), Tokens(g, 0, 2)).ok());
  c->Release();
  c->Release();
  EXPECT_EQ(c->allocated_bytes(), 0u);
  EXPECT_EQ(c->Append(Tokens(g, 0, 1), Tokens(g, 0, 1)).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(c->AdvanceLen(1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(c->Clear().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(c->Clone().status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(c->HeadKeys(0, 0).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(c->num_tokens(), 0u);
}

}  // namespace
}  // namespace kvcache
