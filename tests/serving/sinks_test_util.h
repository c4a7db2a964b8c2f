// Helpers shared by the tests of precision-window sinks that travel with a
// prefix (window_sinks_test.cc, tier_redis_test.cc): a "process" (pool,
// prefix cache, offload over given tiers), sequences with a window that
// compute a prompt, and the round trip of their sinks through the tiers.
// Deterministic seeds; single-threaded helpers.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "kvcache/attention.h"
#include "kvcache/cache.h"
#include "kvcache/serving/offload.h"
#include "serving/tier_test_util.h"

namespace kvcache::sinkstest {

inline constexpr GeometryOptions kGeo{2, 2, 64, 8};
inline constexpr FormatPair kTurbo4{Format::kTurbo4, Format::kTurbo4};
inline constexpr PrecisionWindow kWindow{.sinks = 4};

struct Process {
  std::shared_ptr<BlockPool> pool;
  std::unique_ptr<PrefixCache> cache;
  std::unique_ptr<OffloadCache> off;
  explicit Process(std::vector<std::shared_ptr<Tier>> tiers, uint32_t blocks = 32) {
    pool = tiertest::NewPool(kGeo, kTurbo4, blocks);
    cache = std::move(PrefixCache::Create(pool)).value();
    OffloadOptions o;
    o.model = "sinks-test";
    off = std::move(OffloadCache::Create(pool, cache.get(), std::move(tiers), o)).value();
  }
  SequenceCache Sequence(PrecisionWindow w = kWindow) {
    return SequenceCache::CreatePaged(pool, {.window = w}).value();
  }
};

// Random K/V rows (seeded) for positions [0, n) of every layer.
inline Status AppendRandom(SequenceCache& s, uint32_t n, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> k(size_t{kGeo.n_layers} * n * kGeo.n_kv_heads * kGeo.head_dim), v(k.size());
  for (float& x : k) x = nd(rng);
  for (float& x : v) x = nd(rng);
  return s.Append(k, v);
}

inline bool SameFloats(const std::vector<float>& a, const std::vector<float>& b, size_t n) {
  return a.size() >= n && b.size() >= n && std::memcmp(a.data(), b.data(), n * sizeof(float)) == 0;
}

// Decoded rows of positions [0, n) of every layer, head and side, bit for bit.
inline void ExpectSameRows(const SequenceCache& a, const SequenceCache& b, uint32_t n) {
  const size_t D = kGeo.head_dim;
  for (uint32_t l = 0; l < kGeo.n_layers; ++l) {
    for (uint32_t h = 0; h < kGeo.n_kv_heads; ++h) {
      EXPECT_TRUE(SameFloats(a.HeadKeys(l, h).value(), b.HeadKeys(l, h).value(), n * D)) << l << " " << h;
      EXPECT_TRUE(SameFloats(a.HeadValues(l, h).value(), b.HeadValues(l, h).value(), n * D)) << l << " " << h;
    }
  }
}

// AttendDecode of the same query on every layer of a and b: equal outputs.
inline void ExpectSameAttention(const SequenceCache& a, const SequenceCache& b, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  constexpr uint32_t kQHeads = 4;
  std::vector<float> q(size_t{kQHeads} * kGeo.head_dim);
  for (float& x : q) x = nd(rng);
  AttentionOptions o;
  o.n_q_heads = kQHeads;
  for (uint32_t l = 0; l < kGeo.n_layers; ++l) {
    std::vector<float> oa(q.size()), ob(q.size());
    ASSERT_TRUE(AttendDecode(a.View(l).value(), q, o, {oa, {}, {}, {}}).ok());
    ASSERT_TRUE(AttendDecode(b.View(l).value(), q, o, {ob, {}, {}, {}}).ok());
    EXPECT_EQ(oa, ob) << "layer " << l;
  }
}

// A window sequence of process 0 computes and publishes 24 positions (3
// blocks) of `tokens`; process 1, over the tiers make_tiers(1) gives, adopts
// them from its tiers with their sinks: the same sink rows, the same decoded
// rows and attention as the computing sequence. A second adoption in
// process 1 is served by its pool, sinks included.
inline void ExpectSinksRoundTrip(const std::function<std::vector<std::shared_ptr<Tier>>(int)>& make_tiers) {
  const std::vector<TokenId> tokens = tiertest::Tokens(24, 7);
  Process p0(make_tiers(0));
  SequenceCache a = p0.Sequence();
  ASSERT_TRUE(AppendRandom(a, 24, 77).ok());
  ASSERT_EQ(p0.off->PublishSequence(&a, tokens, "").value(), 3u);
  p0.off->Flush();
  auto sinks = a.window_sinks();
  ASSERT_NE(sinks, nullptr);

  Process p1(make_tiers(1));
  SequenceCache b = p1.Sequence();
  std::vector<uint64_t> served;
  ASSERT_EQ(p1.off->AdoptInto(&b, tokens, "", &served).value(), 24u);
  ASSERT_EQ(served.size(), 2u);
  EXPECT_EQ(served[1], 24u);  // from the tier
  auto got = b.window_sinks();
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->sinks, sinks->sinks);
  EXPECT_EQ(got->rows, sinks->rows);
  EXPECT_TRUE(b.CheckInvariants().ok());
  ExpectSameRows(a, b, 24);
  ExpectSameAttention(a, b, 78);

  SequenceCache c = p1.Sequence();
  ASSERT_EQ(p1.off->AdoptInto(&c, tokens, "", &served).value(), 24u);
  EXPECT_EQ(served[0], 24u);  // from the pool, where the load named them
  ASSERT_NE(c.window_sinks(), nullptr);
  EXPECT_EQ(c.window_sinks()->rows, sinks->rows);
  // Another window gets the blocks without them.
  SequenceCache other = p1.Sequence({.sinks = 2});
  ASSERT_EQ(p1.off->AdoptInto(&other, tokens, "").value(), 24u);
  EXPECT_EQ(other.window_sinks(), nullptr);
  EXPECT_TRUE(p1.pool->CheckInvariants().ok());
}

}  // namespace kvcache::sinkstest
