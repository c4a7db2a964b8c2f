// SequenceCache::DropLeadingBlocks, BlockFirstPosition, SetBlockHash on
// dropped-from blocks and AdoptBlocksAt: dropping leading blocks leaves
// exactly what KeepRows of the same rows leaves (rows, positions,
// importance, lengths, calibration) while giving the blocks back to the
// pool (a named block stays cached, a shared one loses one reference, the
// reservation is topped up as Truncate's); blocks named after a drop can be
// adopted at their positions by a fresh cache, which then continues exactly
// as the sequence they came from. Every refusal changes nothing.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "kvcache/cache.h"

namespace kvcache {
namespace {

constexpr uint32_t kBlock = 4;

Geometry Geo() {
  auto g = Geometry::Create({.n_layers = 2, .n_kv_heads = 2, .head_dim = 32, .block_size = kBlock});
  EXPECT_TRUE(g.ok());
  return *g;
}

// [n_layers][T][n_kv_heads][head_dim] rows for positions [first, first + T).
std::vector<float> Rows(const Geometry& g, uint32_t first, uint32_t T, int side) {
  std::vector<float> out;
  for (uint32_t l = 0; l < g.n_layers(); ++l) {
    for (uint32_t t = first; t < first + T; ++t) {
      std::mt19937 rng(1234u + l * 7919u + t * 31u + static_cast<uint32_t>(side));
      std::normal_distribution<float> n(0.0f, 1.0f);
      for (uint32_t i = 0; i < g.kv_dim(); ++i) out.push_back(n(rng));
    }
  }
  return out;
}

Status AppendRange(SequenceCache& c, uint32_t first, uint32_t T) {
  const Geometry& g = c.geometry();
  return c.Append(Rows(g, first, T, 0), Rows(g, first, T, 1));
}

std::shared_ptr<BlockPool> Pool(FormatPair f, uint32_t blocks = 32) {
  auto p = BlockPool::Create(Geo(), f, {.num_blocks = blocks});
  EXPECT_TRUE(p.ok());
  return *p;
}

// Everything the contract says must match, bit for bit.
void ExpectSame(const SequenceCache& a, const SequenceCache& b) {
  ASSERT_EQ(a.num_tokens(), b.num_tokens());
  for (uint32_t l = 0; l < a.n_layers(); ++l) {
    EXPECT_EQ(a.num_tokens(l), b.num_tokens(l));
    EXPECT_EQ(a.Importance(l), b.Importance(l));
    for (uint32_t h = 0; h < a.n_kv_heads(); ++h) {
      EXPECT_EQ(a.head_len(l, h), b.head_len(l, h));
      EXPECT_EQ(a.HeadPositions(l, h), b.HeadPositions(l, h));
      EXPECT_EQ(a.HeadImportance(l, h), b.HeadImportance(l, h));
      EXPECT_EQ(*a.HeadKeys(l, h), *b.HeadKeys(l, h));
      EXPECT_EQ(*a.HeadValues(l, h), *b.HeadValues(l, h));
    }
    auto va = a.View(l), vb = b.View(l);
    ASSERT_TRUE(va.ok() && vb.ok());
    for (uint32_t h = 0; h < a.n_kv_heads(); ++h) {
      ASSERT_EQ(va->rows(h), vb->rows(h));
      for (uint32_t r = 0; r < va->rows(h); ++r) {
        EXPECT_EQ(va->position(h, r), vb->position(h, r));
        for (int s = 0; s < 2; ++s) {
          const KvSideView& sa = s == 0 ? va->k : va->v;
          const KvSideView& sb = s == 0 ? vb->k : vb->v;
          EXPECT_EQ(0, std::memcmp(va->row_ptr(sa, h, r), vb->row_ptr(sb, h, r), sa.row_bytes));
        }
      }
    }
  }
  auto ca = a.calibration(), cb = b.calibration();
  ASSERT_EQ(ca == nullptr, cb == nullptr);
  if (ca) {
    EXPECT_EQ(ca->transforms, cb->transforms);
  }
  EXPECT_TRUE(a.CheckInvariants().ok()) << a.CheckInvariants().ToString();
  EXPECT_TRUE(b.CheckInvariants().ok()) << b.CheckInvariants().ToString();
}

Status KeepFrom(SequenceCache& c, uint32_t drop_rows) {
  for (uint32_t l = 0; l < c.n_layers(); ++l) {
    for (uint32_t h = 0; h < c.n_kv_heads(); ++h) {
      std::vector<uint32_t> keep(c.head_len(l, h) - drop_rows);
      std::iota(keep.begin(), keep.end(), drop_rows);
      KV_RETURN_IF_ERROR(c.KeepRows(l, h, keep));
    }
  }
  return Status::Ok();
}

TEST(DropLeadingBlocksTest, EqualsKeepRowsOfTheSameRows) {
  for (FormatPair f : {FormatPair{}, FormatPair{Format::kTurbo4, Format::kQ8_0}}) {
    auto pa = Pool(f), pb = Pool(f);
    auto a = SequenceCache::CreatePaged(pa);
    auto b = SequenceCache::CreatePaged(pb);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_TRUE(AppendRange(*a, 0, 23).ok());
    ASSERT_TRUE(AppendRange(*b, 0, 23).ok());
    std::vector<float> probs(23);
    for (uint32_t r = 0; r < 23; ++r) probs[r] = 0.01f * static_cast<float>(r % 7);
    for (SequenceCache* c : {&*a, &*b}) ASSERT_TRUE(c->AccumulateImportance(1, 0, probs).ok());
    ASSERT_EQ(pa->num_used_blocks(), 6u);
    ASSERT_TRUE(a->DropLeadingBlocks(2).ok());
    ASSERT_TRUE(KeepFrom(*b, 2 * kBlock).ok());
    ExpectSame(*a, *b);
    EXPECT_EQ(pa->num_used_blocks(), 4u);  // ceil(15 / 4)
    EXPECT_EQ(a->block_table().size(), 4u);
    EXPECT_EQ(a->HeadPositions(0, 0).front(), 8u);
    // Appends continue identically (the partial last block, then new ones).
    ASSERT_TRUE(AppendRange(*a, 23, 6).ok());
    ASSERT_TRUE(AppendRange(*b, 23, 6).ok());
    ExpectSame(*a, *b);
    // A second drop, and one that empties every head.
    ASSERT_TRUE(a->DropLeadingBlocks(1).ok());
    ASSERT_TRUE(KeepFrom(*b, kBlock).ok());
    ExpectSame(*a, *b);
    const uint32_t all = a->head_len(0, 0) / kBlock;
    ASSERT_EQ(a->head_len(0, 0) % kBlock, 1u);
    ASSERT_TRUE(a->DropLeadingBlocks(all).ok());
    ASSERT_TRUE(KeepFrom(*b, all * kBlock).ok());
    ExpectSame(*a, *b);
    EXPECT_EQ(pa->num_used_blocks(), 1u);
    EXPECT_TRUE(pa->CheckInvariants().ok());
  }
}

TEST(DropLeadingBlocksTest, NamedBlocksStayCachedSharedBlocksLoseOneReference) {
  auto pool = Pool({});
  auto a = SequenceCache::CreatePaged(pool);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(AppendRange(*a, 0, 16).ok());
  const std::vector<uint32_t> table(a->block_table().begin(), a->block_table().end());
  ASSERT_TRUE(a->SetBlockHash(0, 700).ok());
  auto child = a->Fork();
  ASSERT_TRUE(child.ok());
  ASSERT_TRUE(a->DropLeadingBlocks(2).ok());
  // Block 0 is named and held by the child; block 1 is held by the child.
  EXPECT_EQ(pool->refcount(table[0]), 1u);
  EXPECT_EQ(pool->refcount(table[1]), 1u);
  EXPECT_EQ(pool->refcount(table[2]), 2u);
  child->Release();
  EXPECT_EQ(pool->state(table[0]), BlockState::kCached);
  EXPECT_EQ(pool->block_hash(table[0]), std::optional<uint64_t>(700));
  EXPECT_EQ(pool->state(table[1]), BlockState::kFree);
  EXPECT_EQ(pool->num_cached_blocks(), 1u);
  EXPECT_EQ(pool->num_used_blocks(), 2u);
  // The parent goes on from position 8.
  ASSERT_TRUE(AppendRange(*a, 16, 3).ok());
  EXPECT_EQ(a->HeadPositions(1, 1).front(), 8u);
  EXPECT_TRUE(a->CheckInvariants().ok());
  EXPECT_TRUE(pool->CheckInvariants().ok());
}

TEST(DropLeadingBlocksTest, ReservationAsKeepRows) {
  auto pa = Pool({}), pb = Pool({});
  auto a = SequenceCache::CreatePaged(pa, {.reserve_tokens = 32});
  auto b = SequenceCache::CreatePaged(pb, {.reserve_tokens = 32});
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(AppendRange(*a, 0, 12).ok());
  ASSERT_TRUE(AppendRange(*b, 0, 12).ok());
  ASSERT_TRUE(a->DropLeadingBlocks(2).ok());
  ASSERT_TRUE(KeepFrom(*b, 2 * kBlock).ok());
  ExpectSame(*a, *b);
  EXPECT_EQ(a->reserved_blocks(), b->reserved_blocks());
  EXPECT_EQ(a->is_fully_reserved(), b->is_fully_reserved());
  EXPECT_TRUE(a->is_fully_reserved());
  EXPECT_EQ(pa->num_reserved_blocks(), pb->num_reserved_blocks());
  EXPECT_EQ(pa->num_used_blocks(), pb->num_used_blocks());
  EXPECT_TRUE(pa->CheckInvariants().ok());
  // The reservation still carries appends to the target.
  ASSERT_TRUE(AppendRange(*a, 12, 20).ok());
  EXPECT_TRUE(a->CheckInvariants().ok());
}

// What a refused call must leave as it was.
struct Before {
  std::vector<uint32_t> table;
  std::vector<std::vector<uint32_t>> positions;
  uint32_t used = 0, reserved = 0;
  static Before Of(const SequenceCache& c) {
    Before b;
    b.table.assign(c.block_table().begin(), c.block_table().end());
    for (uint32_t l = 0; l < c.n_layers(); ++l)
      for (uint32_t h = 0; h < c.n_kv_heads(); ++h) b.positions.push_back(c.HeadPositions(l, h));
    if (c.pool()) {
      b.used = c.pool()->num_used_blocks();
      b.reserved = c.pool()->num_reserved_blocks();
    }
    return b;
  }
  bool operator==(const Before&) const = default;
};

TEST(DropLeadingBlocksTest, RefusalsChangeNothing) {
  const Geometry g = Geo();
  auto contiguous = SequenceCache::CreateContiguous(g, {});
  ASSERT_TRUE(contiguous.ok());
  ASSERT_TRUE(AppendRange(*contiguous, 0, 8).ok());
  EXPECT_EQ(contiguous->DropLeadingBlocks(1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(contiguous->head_len(0, 0), 8u);

  const FormatPair q{Format::kQ8_0, Format::kQ8_0};
  auto wpool = Pool(q);
  auto windowed = SequenceCache::CreatePaged(wpool, {.window = {.sinks = 2, .recent = 4}});
  ASSERT_TRUE(windowed.ok());
  ASSERT_TRUE(AppendRange(*windowed, 0, 12).ok());
  Before wb = Before::Of(*windowed);
  EXPECT_EQ(windowed->DropLeadingBlocks(1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(Before::Of(*windowed), wb);

  auto pool = Pool({});
  auto c = SequenceCache::CreatePaged(pool);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(AppendRange(*c, 0, 10).ok());
  Before b = Before::Of(*c);
  EXPECT_EQ(c->DropLeadingBlocks(3).code(), StatusCode::kFailedPrecondition);  // 10 rows < 12
  EXPECT_EQ(Before::Of(*c), b);
  ASSERT_TRUE(c->DropLeadingBlocks(0).ok());
  EXPECT_EQ(Before::Of(*c), b);
  // Head 1 of layer 1 drops position 2: block 0 holds positions 0, 1, 3, 4.
  const std::vector<uint32_t> keep = {0, 1, 3, 4, 5, 6, 7, 8, 9};
  ASSERT_TRUE(c->KeepRows(1, 1, keep).ok());
  b = Before::Of(*c);
  EXPECT_EQ(c->DropLeadingBlocks(1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(Before::Of(*c), b);
  // Block 1 holds one run in every head (positions 4..7 / 5..8): droppable,
  // but not nameable (not an aligned block shared by every head).
  EXPECT_EQ(c->BlockFirstPosition(1).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(c->SetBlockHash(1, 5).code(), StatusCode::kFailedPrecondition);
  c->Release();
  EXPECT_EQ(c->DropLeadingBlocks(1).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(pool->CheckInvariants().ok());
}

TEST(DropLeadingBlocksTest, BlocksAfterADropAreNamedByTheirPositions) {
  auto pool = Pool({});
  auto c = SequenceCache::CreatePaged(pool);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(AppendRange(*c, 0, 18).ok());
  EXPECT_EQ(*c->BlockFirstPosition(1), 4u);
  ASSERT_TRUE(c->DropLeadingBlocks(2).ok());
  EXPECT_EQ(*c->BlockFirstPosition(0), 8u);
  EXPECT_EQ(*c->BlockFirstPosition(1), 12u);
  EXPECT_EQ(c->BlockFirstPosition(2).status().code(), StatusCode::kFailedPrecondition);  // partial
  EXPECT_EQ(c->BlockFirstPosition(3).status().code(), StatusCode::kOutOfRange);
  ASSERT_TRUE(c->SetBlockHash(1, 99).ok());
  EXPECT_EQ(pool->block_hash(c->block_table()[1]), std::optional<uint64_t>(99));
  EXPECT_EQ(c->SetBlockHash(2, 98).code(), StatusCode::kFailedPrecondition);
  // A KeepRows that drops a whole aligned block of every head names its
  // blocks the same way.
  auto d = SequenceCache::CreatePaged(pool);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(AppendRange(*d, 0, 12).ok());
  ASSERT_TRUE(KeepFrom(*d, kBlock).ok());
  EXPECT_EQ(*d->BlockFirstPosition(0), 4u);
  auto contiguous = SequenceCache::CreateContiguous(Geo(), {});
  ASSERT_TRUE(contiguous.ok());
  ASSERT_TRUE(AppendRange(*contiguous, 0, 8).ok());
  EXPECT_EQ(contiguous->BlockFirstPosition(0).status().code(), StatusCode::kFailedPrecondition);
}

// A names its blocks after a drop and is released; B adopts them at their
// positions and continues exactly as A' (A made again, never released).
TEST(AdoptBlocksAtTest, ContinuesAsTheSequenceTheBlocksCameFrom) {
  const FormatPair f{Format::kTurbo4, Format::kQ8_0};
  auto pool = Pool(f);
  auto make = [&]() {
    auto a = SequenceCache::CreatePaged(pool);
    EXPECT_TRUE(a.ok());
    EXPECT_TRUE(AppendRange(*a, 0, 24).ok());
    EXPECT_TRUE(a->DropLeadingBlocks(2).ok());
    return std::move(*a);
  };
  SequenceCache a = make();
  std::vector<uint32_t> blocks(a.block_table().begin(), a.block_table().end());
  ASSERT_EQ(blocks.size(), 4u);
  for (uint32_t j = 0; j < 4; ++j) {
    const uint32_t first = *a.BlockFirstPosition(j);
    ASSERT_TRUE(a.SetBlockHash(j, 5000 + first / kBlock).ok());
  }
  const auto calibration = a.calibration();
  a.Release();
  EXPECT_EQ(pool->num_cached_blocks(), 4u);
  SequenceCache a2 = make();  // A': the same rows in blocks of its own

  auto b = SequenceCache::CreatePaged(pool);
  ASSERT_TRUE(b.ok());
  for (uint32_t j = 0; j < 4; ++j) ASSERT_TRUE(pool->RetainCached(blocks[j], 5002 + j));
  const PoolStats held = pool->stats();
  // Refusals: unaligned start, a start past the limit; nothing changes and
  // the caller keeps its references.
  EXPECT_EQ(b->AdoptBlocksAt(6, blocks, calibration).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b->AdoptBlocksAt((1u << 30) - kBlock, blocks, calibration).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(b->num_tokens(), 0u);
  EXPECT_TRUE(b->block_table().empty());
  EXPECT_EQ(pool->stats().used_blocks, held.used_blocks);
  ASSERT_TRUE(b->AdoptBlocksAt(8, blocks, calibration).ok());
  EXPECT_EQ(b->num_tokens(), 24u);
  EXPECT_EQ(b->head_len(1, 1), 16u);
  EXPECT_EQ(*b->BlockFirstPosition(0), 8u);
  ExpectSame(*b, a2);
  // Not empty any more.
  EXPECT_EQ(b->AdoptBlocksAt(0, {}, nullptr).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(AppendRange(*b, 24, 7).ok());
  ASSERT_TRUE(AppendRange(a2, 24, 7).ok());
  ExpectSame(*b, a2);
  ASSERT_TRUE(b->DropLeadingBlocks(1).ok());
  ASSERT_TRUE(a2.DropLeadingBlocks(1).ok());
  ExpectSame(*b, a2);
  EXPECT_TRUE(pool->CheckInvariants().ok());
}

TEST(AdoptBlocksAtTest, AtZeroIsAdoptPrefixAndWindowsRefuseOffsets) {
  const FormatPair f{Format::kQ8_0, Format::kQ8_0};
  auto pool = Pool(f);
  auto a = SequenceCache::CreatePaged(pool);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(AppendRange(*a, 0, 8).ok());
  const std::vector<uint32_t> blocks(a->block_table().begin(), a->block_table().end());
  ASSERT_TRUE(a->SetBlockHash(0, 1).ok());  // shared from now on
  ASSERT_TRUE(a->SetBlockHash(1, 2).ok());
  ASSERT_TRUE(pool->Retain(blocks).ok());
  ASSERT_TRUE(pool->Retain(blocks).ok());
  auto b = SequenceCache::CreatePaged(pool);
  auto c = SequenceCache::CreatePaged(pool);
  ASSERT_TRUE(b.ok() && c.ok());
  ASSERT_TRUE(b->AdoptPrefix(blocks, a->calibration()).ok());
  ASSERT_TRUE(c->AdoptBlocksAt(0, blocks, a->calibration()).ok());
  ExpectSame(*b, *c);
  ExpectSame(*b, *a);
  auto w = SequenceCache::CreatePaged(pool, {.window = {.sinks = 2, .recent = 4}});
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->AdoptBlocksAt(4, std::span<const uint32_t>(blocks).subspan(1), a->calibration())
                .code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(w->num_tokens(), 0u);
  EXPECT_TRUE(pool->CheckInvariants().ok());
}

}  // namespace
}  // namespace kvcache
