// Contract edge cases of the caches, one per test: importance refuses
// non-finite probabilities (sequence and hybrid, changing nothing);
// reservations see exclusivity regained once a fork's child is gone; a block
// holding compacted rows cannot be named by content; reserve_tokens 0
// reserves nothing while 1 promises a block; Release is idempotent and gives
// everything back; attention's per-row probabilities are those of the stored
// rows padded with zeros; turbo formats need head_dim (not kv_dim) a
// multiple of 16.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "kvcache/attention.h"
#include "kvcache/cache.h"
#include "kvcache/codec.h"
#include "kvcache/hybrid.h"

namespace kvcache {
namespace {

Geometry Geo(uint32_t layers, uint32_t heads, uint32_t dim, uint32_t block) {
  auto g = Geometry::Create({layers, heads, dim, block});
  EXPECT_TRUE(g.ok());
  return *g;
}

std::vector<float> Rows(const Geometry& g, uint32_t layers, uint32_t first, uint32_t T) {
  std::vector<float> out;
  for (uint32_t l = 0; l < layers; ++l)
    for (uint32_t t = first; t < first + T; ++t)
      for (uint32_t h = 0; h < g.n_kv_heads(); ++h)
        for (uint32_t i = 0; i < g.head_dim(); ++i)
          out.push_back(0.01f * static_cast<float>((t * 7 + l * 5 + h * 3 + i) % 23) - 0.1f);
  return out;
}

const float kBad[] = {std::numeric_limits<float>::quiet_NaN(),
                      std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()};

// --- AccumulateImportance refuses non-finite probabilities, changing nothing.

TEST(CacheContractsTest, SequenceImportanceRejectsNonFinite) {
  const Geometry g = Geo(2, 2, 8, 4);
  for (bool paged : {false, true}) {
    auto pool = BlockPool::Create(g, {}, {.num_blocks = 8});
    ASSERT_TRUE(pool.ok());
    auto c = paged ? SequenceCache::CreatePaged(*pool) : SequenceCache::CreateContiguous(g, {});
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE(c->Append(Rows(g, 2, 0, 3), Rows(g, 2, 0, 3)).ok());
    // A first call with a bad value must not even create the accumulators.
    for (float bad : kBad) {
      const std::vector<float> probs = {0.25f, bad, 0.5f};
      Status s = c->AccumulateImportance(1, 0, probs);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
      EXPECT_EQ(c->HeadImportance(1, 0), std::vector<float>(3, 0.0f));
      EXPECT_EQ(c->Importance(1), std::vector<float>(3, 0.0f));
      Status ls = c->layer(1).AccumulateImportance(0, probs);
      EXPECT_EQ(ls.code(), StatusCode::kInvalidArgument);
    }
    const std::vector<float> good = {0.25f, 0.25f, 0.5f};
    ASSERT_TRUE(c->AccumulateImportance(1, 0, good).ok());
    ASSERT_TRUE(c->AccumulateImportance(1, 1, good).ok());
    for (float bad : kBad) {
      const std::vector<float> probs = {bad, 0.0f, 0.0f};
      EXPECT_EQ(c->AccumulateImportance(1, 1, probs).code(), StatusCode::kInvalidArgument);
    }
    EXPECT_EQ(c->HeadImportance(1, 1), good);
    EXPECT_EQ(c->Importance(1), (std::vector<float>{0.5f, 0.5f, 1.0f}));
    EXPECT_TRUE(c->CheckInvariants().ok());
  }
}

TEST(CacheContractsTest, HybridImportanceRejectsNonFiniteAndEvictStillWorks) {
  const Geometry g = Geo(1, 1, 8, 4);
  auto model = HybridModel::Create(
      g, {}, {LayerSpec::FullWithPolicies({EvictionPolicy::HeavyHitter(2, 1)})});
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto seq = HybridSequence::CreateContiguous(*model);
  ASSERT_TRUE(seq.ok());
  ASSERT_TRUE(seq->Append(Rows(g, 1, 0, 6), Rows(g, 1, 0, 6)).ok());
  for (float bad : kBad) {
    std::vector<float> probs(6, 0.1f);
    probs[2] = bad;
    EXPECT_EQ(seq->AccumulateImportance(0, 0, probs).code(), StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(seq->HeadImportance(0, 0), std::vector<float>(6, 0.0f));
  const std::vector<float> probs = {0.0f, 0.5f, 0.0f, 0.3f, 0.1f, 0.1f};
  ASSERT_TRUE(seq->AccumulateImportance(0, 0, probs).ok());
  // The heavy-hitter head can still be evicted to its budget (heavy 2 + window 1).
  ASSERT_TRUE(seq->Evict().ok());
  EXPECT_EQ(seq->HeadPositions(0, 0), (std::vector<uint32_t>{1, 3, 5}));
  EXPECT_TRUE(seq->CheckInvariants().ok());
}

// --- Reserve after a fork's child is gone.

TEST(CacheContractsTest, ReserveSeesExclusivityRegainedAfterChildIsGone) {
  const Geometry g = Geo(1, 1, 8, 4);
  auto pool = BlockPool::Create(g, {}, {.num_blocks = 2});
  ASSERT_TRUE(pool.ok());
  auto c = SequenceCache::CreatePaged(*pool);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c->Append(Rows(g, 1, 0, 6), Rows(g, 1, 0, 6)).ok());
  {
    auto child = c->Fork();
    ASSERT_TRUE(child.ok());
    // While the child lives, rows 6-7 need a copy of the shared last block.
    EXPECT_EQ(c->Reserve(8).code(), StatusCode::kPoolExhausted);
  }
  EXPECT_EQ((*pool)->num_free_blocks(), 0u);
  Status s = c->Reserve(8);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(c->reserved_blocks(), 0u);
  EXPECT_TRUE(c->is_fully_reserved());
  ASSERT_TRUE(c->Append(Rows(g, 1, 6, 2), Rows(g, 1, 6, 2)).ok());
  EXPECT_EQ(c->num_tokens(), 8u);
  EXPECT_TRUE(c->CheckInvariants().ok());
}

TEST(CacheContractsTest, ReservationWithheldForAForkIsReturnedByReserve) {
  const Geometry g = Geo(1, 1, 8, 4);
  auto pool = BlockPool::Create(g, {}, {.num_blocks = 3});
  ASSERT_TRUE(pool.ok());
  auto c = SequenceCache::CreatePaged(*pool);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c->Append(Rows(g, 1, 0, 6), Rows(g, 1, 0, 6)).ok());
  ASSERT_TRUE(c->Reserve(8).ok());
  EXPECT_EQ(c->reserved_blocks(), 0u);
  {
    auto child = c->Fork();  // the parent now reserves its copy-on-write block
    ASSERT_TRUE(child.ok());
    EXPECT_EQ(c->reserved_blocks(), 1u);
    EXPECT_EQ((*pool)->num_available_blocks(), 0u);
  }
  EXPECT_TRUE(c->is_fully_reserved());
  // Re-asserting the same target gives the now-needless block back.
  ASSERT_TRUE(c->Reserve(8).ok());
  EXPECT_EQ(c->reserved_blocks(), 0u);
  EXPECT_EQ((*pool)->num_available_blocks(), 1u);
  ASSERT_TRUE(c->Append(Rows(g, 1, 6, 2), Rows(g, 1, 6, 2)).ok());
  EXPECT_EQ((*pool)->num_used_blocks(), 2u);
  EXPECT_TRUE(c->CheckInvariants().ok());
}

// --- A block whose rows were compacted cannot be named by the hash of
// positions it does not hold.

TEST(CacheContractsTest, CompactedBlockCannotBeNamedByContent) {
  const Geometry g = Geo(1, 2, 8, 4);
  auto pool = BlockPool::Create(g, {}, {.num_blocks = 8});
  ASSERT_TRUE(pool.ok());
  auto c = SequenceCache::CreatePaged(*pool);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c->Append(Rows(g, 1, 0, 9), Rows(g, 1, 0, 9)).ok());
  ASSERT_TRUE(c->SetBlockHash(0, 77).ok());  // untouched: positions 0-3
  // Head 1 drops position 5: its block 1 slots now hold positions 4, 6, 7, 8.
  const std::vector<uint32_t> keep = {0, 1, 2, 3, 4, 6, 7, 8};
  ASSERT_TRUE(c->KeepRows(0, 1, keep).ok());
  ASSERT_EQ(c->head_len(0, 1), 8u);
  Status st = c->SetBlockHash(1, 78);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  EXPECT_FALSE((*pool)->block_hash(c->block_table()[1]).has_value());
  // Dead at a position has the same effect.
  auto d = SequenceCache::CreatePaged(*pool);
  ASSERT_TRUE(d.ok());
  for (uint32_t t = 0; t < 5; ++t) {
    const std::vector<uint8_t> alive = {1, static_cast<uint8_t>(t == 2 ? 0 : 1)};
    ASSERT_TRUE(d->Append(Rows(g, 1, t, 1), Rows(g, 1, t, 1), {alive}).ok());
  }
  EXPECT_EQ(d->SetBlockHash(0, 79).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(c->CheckInvariants().ok());
  EXPECT_TRUE(d->CheckInvariants().ok());
}

// --- Creation-time reservations and Release.

TEST(CacheContractsTest, ReserveTokensZeroReservesNothingOneReservesABlock) {
  const Geometry g = Geo(1, 1, 8, 4);
  auto pool = BlockPool::Create(g, {}, {.num_blocks = 2});
  ASSERT_TRUE(pool.ok());
  auto lazy = SequenceCache::CreatePaged(*pool, {.reserve_tokens = 0});
  ASSERT_TRUE(lazy.ok());
  EXPECT_EQ(lazy->reserved_blocks(), 0u);
  EXPECT_EQ((*pool)->num_available_blocks(), 2u);
  // An empty plan with the first block promised: reserve_tokens = max(0, 1).
  auto eager = SequenceCache::CreatePaged(*pool, {.reserve_tokens = 1});
  ASSERT_TRUE(eager.ok());
  EXPECT_EQ(eager->reserved_blocks(), 1u);
  EXPECT_EQ((*pool)->num_available_blocks(), 1u);
  // That block is a promise: the first append cannot fail.
  auto other = SequenceCache::CreatePaged(*pool, {.reserve_tokens = 4});
  ASSERT_TRUE(other.ok());
  EXPECT_EQ((*pool)->num_available_blocks(), 0u);
  EXPECT_EQ(lazy->Append(Rows(g, 1, 0, 1), Rows(g, 1, 0, 1)).code(), StatusCode::kPoolExhausted);
  EXPECT_TRUE(eager->Append(Rows(g, 1, 0, 1), Rows(g, 1, 0, 1)).ok());
}

TEST(CacheContractsTest, ReleaseIsIdempotentAndGivesEverythingBack) {
  const Geometry g = Geo(1, 1, 8, 4);
  auto c = SequenceCache::CreateContiguous(g, {});
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c->Append(Rows(g, 1, 0, 3), Rows(g, 1, 0, 3)).ok());
  c->Release();
  c->Release();  // idempotent
  EXPECT_TRUE(c->released());
  EXPECT_EQ(c->num_tokens(), 0u);
  EXPECT_EQ(c->allocated_bytes(), 0u);  // a contiguous cache frees its buffers too
  EXPECT_EQ(c->Append(Rows(g, 1, 3, 1), Rows(g, 1, 3, 1)).code(), StatusCode::kFailedPrecondition);

  auto pool = BlockPool::Create(g, {}, {.num_blocks = 2});
  ASSERT_TRUE(pool.ok());
  auto p = SequenceCache::CreatePaged(*pool, {.reserve_tokens = 8});
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(p->Append(Rows(g, 1, 0, 3), Rows(g, 1, 0, 3)).ok());
  p->Release();
  p->Release();  // idempotent
  EXPECT_TRUE(p->released());
  EXPECT_EQ((*pool)->num_free_blocks(), 2u);
  EXPECT_EQ((*pool)->num_reserved_blocks(), 0u);
  EXPECT_TRUE((*pool)->CheckInvariants().ok());
}

TEST(CacheContractsTest, AttendHeadProbsAreThoseOfStoredRowsPaddedWithZeros) {
  const Geometry g = Geo(1, 2, 16, 4);
  auto c = SequenceCache::CreateContiguous(g, {});
  ASSERT_TRUE(c.ok());
  // Head 1 is dead at positions 1 and 3: it stores 3 rows of 5 positions.
  for (uint32_t t = 0; t < 5; ++t) {
    const std::vector<uint8_t> alive = {1, static_cast<uint8_t>(t == 1 || t == 3 ? 0 : 1)};
    ASSERT_TRUE(c->Append(Rows(g, 1, t, 1), Rows(g, 1, t, 1), {alive}).ok());
  }
  ASSERT_EQ(c->head_len(0, 1), 3u);
  auto view = c->View(0);
  ASSERT_TRUE(view.ok());
  std::vector<float> q(16);
  for (uint32_t i = 0; i < 16; ++i) q[i] = 0.1f * static_cast<float>(i % 5) - 0.2f;
  // Both heads decode; kv head 1 (q head 1) is the one looked at.
  std::vector<float> q2(16, 0.0f);
  q2.insert(q2.end(), q.begin(), q.end());
  std::vector<float> out(32), all_probs(2 * 5, -1.0f), all_kv_probs(2 * 5, -1.0f);
  AttentionOutput o;
  o.out = out;
  o.probs = all_probs;
  o.kv_probs = all_kv_probs;
  ASSERT_TRUE(AttendDecode(*view, q2, {.n_q_heads = 2}, o).ok());
  const std::vector<float> probs(all_probs.begin() + 5, all_probs.end());
  const std::vector<float> kv_probs(all_kv_probs.begin() + 5, all_kv_probs.end());
  // A reference softmax over head 1's own stored rows.
  auto keys = c->HeadKeys(0, 1);
  ASSERT_TRUE(keys.ok());
  std::vector<double> s(3);
  double m = -1e30, l = 0;
  for (uint32_t r = 0; r < 3; ++r) {
    double d = 0;
    for (uint32_t i = 0; i < 16; ++i) d += double{q[i]} * (*keys)[r * 16 + i];
    s[r] = d / 4.0;
    m = std::max(m, s[r]);
  }
  for (double x : s) l += std::exp(x - m);
  for (uint32_t r = 0; r < 3; ++r) EXPECT_NEAR(probs[r], std::exp(s[r] - m) / l, 1e-6);
  EXPECT_EQ(probs[3], 0.0f);
  EXPECT_EQ(probs[4], 0.0f);
  EXPECT_EQ(kv_probs, probs);  // group 1
  // The first head_len probabilities feed the importance counters directly.
  EXPECT_TRUE(c->AccumulateImportance(0, 1, std::span<const float>(kv_probs).first(3)).ok());
  EXPECT_EQ(c->AccumulateImportance(0, 1, kv_probs).code(), StatusCode::kInvalidArgument);
}

TEST(CacheContractsTest, TurboNeedsHeadDimMultipleOf16NotKvDim) {
  // head_dim 8 x 2 heads: kv_dim is 16, but the condition is on head_dim.
  const Geometry g = Geo(1, 2, 8, 4);
  for (Format f : {Format::kTurbo8, Format::kTurbo4, Format::kTurbo3, Format::kTurbo2}) {
    EXPECT_EQ(CheckHeadDim(f, 8).code(), StatusCode::kInvalidArgument);
    auto c = SequenceCache::CreateContiguous(g, {f, f});
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << FormatName(f);
    EXPECT_TRUE(CheckHeadDim(f, 16).ok());
  }
  // The documented alternative for such a model: a group-size-1 format.
  for (Format f : {Format::kF16, Format::kBF16, Format::kFp8E4M3, Format::kQ8}) {
    auto c = SequenceCache::CreateContiguous(g, {f, f});
    EXPECT_TRUE(c.ok()) << FormatName(f);
  }
}

}  // namespace
}  // namespace kvcache
