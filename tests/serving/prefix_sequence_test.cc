// PrefixCache with real SequenceCaches: adopted blocks hold the publisher's
// rows, forks and speculative drafts, exhaustion, and several threads.
#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <thread>

#include "kvcache/cache.h"
#include "kvcache/pool.h"
#include "kvcache/serving/prefix_cache.h"

namespace kvcache {
namespace {

constexpr uint32_t kL = 2, kH = 2, kD = 16, kB = 16;

std::shared_ptr<BlockPool> NewPool(uint32_t num_blocks) {
  BlockPoolOptions o;
  o.num_blocks = num_blocks;
  return BlockPool::Create(Geometry::Create({kL, kH, kD, kB}).value(), {Format::kF32, Format::kF32}, o)
      .value();
}

// Appends n tokens of K/V rows derived from the token ids (so equal prefixes
// store equal rows, as a model would compute).
Status AppendTokens(SequenceCache& seq, std::span<const TokenId> tokens) {
  const size_t n = tokens.size();
  std::vector<float> k(size_t{kL} * n * kH * kD), v(k.size());
  for (uint32_t l = 0; l < kL; ++l) {
    for (size_t t = 0; t < n; ++t) {
      for (uint32_t i = 0; i < kH * kD; ++i) {
        const size_t at = (size_t{l} * n + t) * kH * kD + i;
        k[at] = static_cast<float>(tokens[t] % 97) + 0.01f * i + l;
        v[at] = -k[at];
      }
    }
  }
  return seq.Append(k, v);
}

std::vector<TokenId> Iota(size_t n, TokenId start = 0) {
  std::vector<TokenId> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

TEST(PrefixSequence, AdoptedBlocksHoldThePublishersRows) {
  auto pool = NewPool(32);
  auto cache = std::move(PrefixCache::Create(pool)).value();
  const std::vector<TokenId> a_tokens = Iota(40);
  SequenceCache a = SequenceCache::CreatePaged(pool).value();
  ASSERT_TRUE(AppendTokens(a, a_tokens).ok());
  ASSERT_EQ(cache->PublishSequence(&a, a_tokens, "").value(), 2u);
  const std::vector<float> a_keys = a.HeadKeys(1, 1).value();
  a.Release();
  EXPECT_EQ(pool->num_cached_blocks(), 2u);

  std::vector<TokenId> b_tokens = Iota(36);
  b_tokens[35] = 1000;
  SequenceCache b = SequenceCache::CreatePaged(pool).value();
  ASSERT_EQ(cache->AdoptInto(&b, b_tokens, "").value(), 32u);
  EXPECT_EQ(b.num_tokens(), 32u);
  ASSERT_TRUE(AppendTokens(b, std::span<const TokenId>(b_tokens).subspan(32)).ok());
  const std::vector<float> b_keys = b.HeadKeys(1, 1).value();
  ASSERT_EQ(b_keys.size(), 36u * kD);
  EXPECT_TRUE(std::equal(b_keys.begin(), b_keys.begin() + 32 * kD, a_keys.begin()));
  EXPECT_TRUE(b.CheckInvariants().ok()) << b.CheckInvariants().ToString();

  // A fork shares everything; a speculative draft is never published.
  SequenceCache c = b.Fork().value();
  const std::vector<TokenId> drafts = {7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7};
  ASSERT_TRUE(AppendTokens(c, drafts).ok());  // 48 rows: block 2 is full of drafts
  ASSERT_EQ(cache->PublishSequence(&c, b_tokens, "").value(), 0u);  // committed: 36 tokens
  EXPECT_EQ(cache->num_cached_blocks(), 2u);
  ASSERT_TRUE(c.TruncateLast(12).ok());
  std::vector<TokenId> committed = b_tokens;
  for (TokenId t : {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}) committed.push_back(t);
  ASSERT_TRUE(AppendTokens(c, std::span<const TokenId>(committed).subspan(36)).ok());
  ASSERT_EQ(cache->PublishSequence(&c, committed, "").value(), 1u);
  EXPECT_EQ(cache->Peek(committed, "").num_tokens, 48u);
  EXPECT_EQ(cache->CheckInvariants(), "");
  b.Release();
  c.Release();
  EXPECT_TRUE(pool->CheckInvariants().ok());
  EXPECT_EQ(pool->num_used_blocks(), 0u);
  EXPECT_EQ(pool->num_cached_blocks(), 3u);
}

TEST(PrefixSequence, CachedBlocksBackingReservationsAreNotTaken) {
  auto pool = NewPool(4);
  auto cache = std::move(PrefixCache::Create(pool)).value();
  const std::vector<TokenId> t = Iota(32);
  {
    SequenceCache a = SequenceCache::CreatePaged(pool).value();
    ASSERT_TRUE(AppendTokens(a, t).ok());
    ASSERT_EQ(cache->PublishSequence(&a, t, "").value(), 2u);
  }
  ASSERT_TRUE(pool->Reserve(4).ok());  // promises every block, cached ones included
  SequenceCache b = SequenceCache::CreatePaged(pool).value();
  EXPECT_EQ(cache->AdoptInto(&b, t, "").value(), 0u);  // all or nothing: no hit, nothing taken
  EXPECT_EQ(b.num_tokens(), 0u);
  pool->Unreserve(4);
  EXPECT_EQ(cache->AdoptInto(&b, t, "").value(), 32u);
  b.Release();
  EXPECT_TRUE(pool->CheckInvariants().ok());
  // Exhaustion evicts cached blocks, and the prefix cache forgets them.
  std::vector<uint32_t> all(4);
  ASSERT_TRUE(pool->Allocate(all).ok());
  EXPECT_EQ(cache->num_cached_blocks(), 0u);
  EXPECT_EQ(cache->stats().evictions, 2u);
  ASSERT_TRUE(pool->Release(all).ok());
  EXPECT_EQ(cache->CheckInvariants(), "");
}

TEST(PrefixSequence, ThreadsShareOnePrefixCache) {
  auto pool = NewPool(48);
  auto cache = std::move(PrefixCache::Create(pool)).value();
  std::vector<std::vector<TokenId>> families(3);
  for (size_t f = 0; f < families.size(); ++f) families[f] = Iota(96, TokenId(f * 1000));
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      std::mt19937 rng(w);
      for (int i = 0; i < 150; ++i) {
        const auto& fam = families[rng() % families.size()];
        std::vector<TokenId> tokens(fam.begin(), fam.begin() + 1 + rng() % fam.size());
        const std::string salt = rng() % 4 == 0 ? "t" : "";
        Result<SequenceCache> seq = SequenceCache::CreatePaged(pool);
        ASSERT_TRUE(seq.ok());
        Result<size_t> adopted = cache->AdoptInto(&*seq, tokens, salt);
        ASSERT_TRUE(adopted.ok()) << adopted.status().ToString();
        Status st;
        if (*adopted < tokens.size()) {
          st = AppendTokens(*seq, std::span<const TokenId>(tokens).subspan(*adopted));
        }
        if (st.ok()) {
          ASSERT_TRUE(cache->PublishSequence(&*seq, tokens, salt).ok());
        } else {
          ASSERT_TRUE(st.IsPoolExhausted()) << st.ToString();
        }
        seq->Release();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(pool->CheckInvariants().ok()) << pool->CheckInvariants().ToString();
  EXPECT_EQ(pool->num_used_blocks(), 0u);
  EXPECT_EQ(cache->CheckInvariants(), "");
  EXPECT_GT(cache->stats().hit_tokens, 0u);
}

}  // namespace
}  // namespace kvcache
