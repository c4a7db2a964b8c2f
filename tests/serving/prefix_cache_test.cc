// PrefixCache: hits, misses and their reasons, publication rules, eviction
// order, and a randomized run against a brute-force model.
#include <gtest/gtest.h>

#include <algorithm>
#include <list>
#include <map>
#include <numeric>
#include <random>

#include "kvcache/geometry.h"
#include "kvcache/pool.h"
#include "testing/block_source.h"
#include "kvcache/serving/prefix_cache.h"
#include "kvcache/serving/forwarding_backend.h"
#include "testing/model_block_source.h"

namespace kvcache {
namespace {

using serving::BlockSource;

constexpr uint32_t kB = 4;  // block size in these tests

std::vector<TokenId> Iota(size_t n, TokenId start = 0) {
  std::vector<TokenId> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

// The blocks under test: the reference model or the real BlockPool.
enum class Backing { kModel, kPool };

std::unique_ptr<BlockSource> NewSource(Backing backing, uint32_t num_blocks) {
  if (backing == Backing::kModel) return serving::NewModelBlockSource(num_blocks, kB);
  const Geometry g = Geometry::Create({2, 1, 16, kB}).value();
  BlockPoolOptions o;
  o.num_blocks = num_blocks;
  return serving::NewPoolBlockSource(
      BlockPool::Create(g, {Format::kF32, Format::kF32}, o).value());
}

struct Fixture {
  explicit Fixture(uint32_t num_blocks, Backing backing = Backing::kModel)
      : src(NewSource(backing, num_blocks)) {
    cache = std::move(PrefixCache::Create(src->NewPrefixBackend())).value();
  }
  // A sequence holding `tokens`: acquires the cached prefix, allocates the rest,
  // publishes. Returns its block table.
  std::vector<uint32_t> Admit(const std::vector<TokenId>& tokens, std::string_view salt = "") {
    PrefixMatch m = cache->Acquire(tokens, salt);
    std::vector<uint32_t> table = m.blocks;
    std::vector<uint32_t> fresh((tokens.size() + kB - 1) / kB - table.size());
    EXPECT_TRUE(src->Allocate(fresh, 0).ok());
    table.insert(table.end(), fresh.begin(), fresh.end());
    EXPECT_TRUE(cache->Publish(tokens, table, salt).ok());
    return table;
  }
  void ReleaseTailFirst(std::vector<uint32_t> table) {
    std::reverse(table.begin(), table.end());
    ASSERT_TRUE(src->Release(table).ok());
  }
  void Check() {
    ASSERT_TRUE(src->CheckInvariants().ok()) << src->CheckInvariants().ToString();
    ASSERT_EQ(cache->CheckInvariants(), "");
  }
  std::unique_ptr<BlockSource> src;
  std::unique_ptr<PrefixCache> cache;
};

TEST(PrefixCache, HitAfterPublishAndAfterRelease) {
  Fixture f(16);
  const std::vector<TokenId> t = Iota(10);  // 2 full blocks + 2 tokens
  const std::vector<uint32_t> table = f.Admit(t);
  EXPECT_EQ(f.cache->num_cached_blocks(), 2u);
  f.ReleaseTailFirst(table);
  EXPECT_EQ(f.src->stats().cached_blocks, 2u);  // kept, unreferenced
  f.cache->ResetStats();
  PrefixMatch m = f.cache->Acquire(Iota(13), "");
  EXPECT_EQ(m.num_tokens, 8u);
  EXPECT_EQ(m.blocks, std::vector<uint32_t>(table.begin(), table.begin() + 2));
  const PrefixCacheStats s = f.cache->stats();
  EXPECT_EQ(s.lookups, 1u);
  EXPECT_EQ(s.lookup_tokens, 13u);
  EXPECT_EQ(s.hit_tokens, 8u);
  EXPECT_EQ(s.miss_tokens[size_t(MissReason::kPartialBlock)], 1u);
  EXPECT_EQ(s.miss_tokens[size_t(MissReason::kNotCached)], 4u);
  ASSERT_TRUE(f.src->Release(m.blocks).ok());
  f.Check();
}

TEST(PrefixCache, MissReasons) {
  Fixture f(4);
  const std::vector<TokenId> a = Iota(8), b = Iota(8, 100);
  f.ReleaseTailFirst(f.Admit(a, "tenant"));
  f.cache->ResetStats();
  // Same tokens, shared namespace: a salt miss.
  PrefixMatch m = f.cache->Acquire(a, "");
  EXPECT_EQ(m.num_tokens, 0u);
  EXPECT_EQ(f.cache->stats().miss_lookups[size_t(MissReason::kSalt)], 1u);
  EXPECT_EQ(f.cache->stats().miss_tokens[size_t(MissReason::kSalt)], 8u);
  // Fill the pool with another chain: evicts a's blocks (4 blocks, 2 cached).
  std::vector<uint32_t> big(4);
  ASSERT_TRUE(f.src->Allocate(big, 0).ok());
  EXPECT_EQ(f.cache->num_cached_blocks(), 0u);
  EXPECT_EQ(f.cache->stats().evictions, 2u);
  m = f.cache->Acquire(a, "tenant");
  EXPECT_EQ(m.num_tokens, 0u);
  EXPECT_EQ(f.cache->stats().miss_lookups[size_t(MissReason::kEvicted)], 1u);
  m = f.cache->Acquire(b, "tenant");
  EXPECT_EQ(f.cache->stats().miss_lookups[size_t(MissReason::kNotCached)], 1u);
  ASSERT_TRUE(f.src->Release(big).ok());
  f.Check();
}

TEST(PrefixCache, EvictsLeastRecentlyReleasedTailFirst) {
  Fixture f(6);
  const std::vector<uint32_t> x = f.Admit(Iota(8));        // chain X: x0, x1
  const std::vector<uint32_t> y = f.Admit(Iota(8, 50));    // chain Y: y0, y1
  f.ReleaseTailFirst(x);  // LRU: x1, x0
  f.ReleaseTailFirst(y);  // LRU: x1, x0, y1, y0
  std::vector<uint32_t> one(3);  // 2 free, then evicts x1
  ASSERT_TRUE(f.src->Allocate(one, 0).ok());
  EXPECT_FALSE(f.cache->IsCached(x[1]));
  EXPECT_TRUE(f.cache->IsCached(x[0]));
  EXPECT_EQ(f.cache->Peek(Iota(8), "").num_tokens, 4u);  // the prefix survives its tail
  std::vector<uint32_t> two(2);  // evicts x0, then y1
  ASSERT_TRUE(f.src->Allocate(two, 0).ok());
  EXPECT_EQ(f.cache->Peek(Iota(8), "").num_tokens, 0u);
  EXPECT_EQ(f.cache->Peek(Iota(8, 50), "").num_tokens, 4u);
  f.Check();
}

TEST(PrefixCache, SuffixNeverOutlivesItsPrefix) {
  Fixture f(4);
  std::vector<uint32_t> t = f.Admit(Iota(12));  // 3 blocks
  ASSERT_TRUE(f.src->Release(t).ok());  // front to back: the prefix is LRU-oldest
  std::vector<uint32_t> one(2);  // 1 free, then evicts block 0 of the chain
  ASSERT_TRUE(f.src->Allocate(one, 0).ok());
  EXPECT_EQ(f.cache->num_cached_blocks(), 0u);  // its descendants went with it
  EXPECT_EQ(f.cache->stats().orphans_dropped, 2u);
  EXPECT_EQ(f.src->stats().cached_blocks, 0u);
  EXPECT_EQ(f.src->stats().free_blocks, 2u);
  f.Check();
}

TEST(PrefixCache, PublishSkipsPartialAndStopsAtDuplicates) {
  Fixture f(16);
  const std::vector<TokenId> t = Iota(10);
  // Two sequences compute the same prompt concurrently: both miss.
  std::vector<uint32_t> a(3), b(3);
  ASSERT_TRUE(f.src->Allocate(a, 0).ok());
  ASSERT_TRUE(f.src->Allocate(b, 0).ok());
  EXPECT_EQ(f.cache->Publish(t, a, "").value(), 2u);  // the partial block is not named
  EXPECT_EQ(f.cache->Publish(t, b, "").value(), 0u);  // b's copies stay private
  EXPECT_EQ(f.cache->Publish(t, a, "").value(), 0u);  // idempotent
  EXPECT_FALSE(f.cache->IsCached(b[0]));
  EXPECT_FALSE(f.cache->IsCached(a[2]));
  ASSERT_TRUE(f.src->Release(a).ok());
  ASSERT_TRUE(f.src->Release(b).ok());
  EXPECT_EQ(f.src->stats().cached_blocks, 2u);
  EXPECT_EQ(f.src->stats().free_blocks, 14u);
  f.Check();
}

TEST(PrefixCache, PublishHashedIsIncremental) {
  Fixture f(16);
  const std::vector<TokenId> t = Iota(12);
  const std::vector<BlockHash> h = HashFullBlocks(t, kB, "");
  std::vector<uint32_t> a(3), b(3);
  ASSERT_TRUE(f.src->Allocate(a, 0).ok());
  ASSERT_TRUE(f.src->Allocate(b, 0).ok());
  const std::span<const TokenId> first(t.data(), kB);
  EXPECT_EQ(f.cache->PublishHashed(std::span(h).first(1), a, 0, first, "").value(), 1u);
  EXPECT_EQ(f.cache->PublishHashed(h, a, 1, first, "").value(), 3u);  // only blocks 1, 2 examined
  EXPECT_EQ(f.cache->stats().published_blocks, 3u);
  // b duplicates a's chain: nothing of it is published, from any start.
  EXPECT_EQ(f.cache->PublishHashed(h, b, 0, first, "").value(), 0u);
  EXPECT_EQ(f.cache->PublishHashed(h, b, 2, first, "").value(), 0u);
  EXPECT_EQ(f.cache->num_cached_blocks(), 3u);
  EXPECT_FALSE(f.cache->PublishHashed(h, b, 4, first, "").ok());  // start past the end
  ASSERT_TRUE(f.src->Release(a).ok());
  ASSERT_TRUE(f.src->Release(b).ok());
  f.Check();
}

TEST(PrefixCache, PublishRejectsBadInput) {
  Fixture f(4);
  std::vector<uint32_t> a(1);
  ASSERT_TRUE(f.src->Allocate(a, 0).ok());
  EXPECT_FALSE(f.cache->Publish(Iota(8), a, "").ok());  // 2 full blocks, 1 id
  const uint32_t bad[2] = {a[0], 99};
  EXPECT_FALSE(f.cache->Publish(Iota(8), bad, "").ok());
  EXPECT_EQ(f.cache->num_cached_blocks(), 0u);
  ASSERT_TRUE(f.src->Release(a).ok());
  f.Check();
}

// A backend that fails SetBlockHash on the n-th call.
class FailingBackend final : public ForwardingPrefixBackend<std::unique_ptr<PrefixCacheBackend>> {
 public:
  FailingBackend(std::unique_ptr<PrefixCacheBackend> inner, int fail_at)
      : ForwardingPrefixBackend(std::move(inner)), fail_at_(fail_at) {}
  Status SetBlockHash(uint32_t b, uint64_t h) override {
    if (++calls_ == fail_at_) return Status::FailedPrecondition("injected");
    return target_->SetBlockHash(b, h);
  }

 private:
  int fail_at_, calls_ = 0;
};

// Holds the pool's eviction reports until Deliver(), as when the listener
// runs late on another thread.
class LateListenerBackend final : public ForwardingPrefixBackend<std::unique_ptr<PrefixCacheBackend>> {
 public:
  explicit LateListenerBackend(std::unique_ptr<PrefixCacheBackend> inner)
      : ForwardingPrefixBackend(std::move(inner)) {}
  void SetEvictionListener(EvictionListener l) override {
    listener_ = std::move(l);
    target_->SetEvictionListener([this](std::span<const EvictedBlock> ev) {
      held_->insert(held_->end(), ev.begin(), ev.end());
    });
  }
  void Deliver() {
    if (listener_) listener_(*held_);
    held_->clear();
  }

 private:
  EvictionListener listener_;
  std::shared_ptr<std::vector<EvictedBlock>> held_ = std::make_shared<std::vector<EvictedBlock>>();
};

TEST(PrefixCache, LateEvictionReportsAreHarmless) {
  auto src = serving::NewModelBlockSource(2, kB);
  auto backend = std::make_unique<LateListenerBackend>(src->NewPrefixBackend());
  LateListenerBackend* late = backend.get();
  auto cache = std::move(PrefixCache::Create(std::move(backend))).value();
  std::vector<uint32_t> a(1);
  ASSERT_TRUE(src->Allocate(a, 0).ok());
  ASSERT_EQ(cache->Publish(Iota(4), a, "").value(), 1u);
  ASSERT_TRUE(src->Release(a).ok());
  std::vector<uint32_t> all(2);  // evicts a[0]; the report is held back
  ASSERT_TRUE(src->Allocate(all, 0).ok());
  EXPECT_TRUE(cache->IsCached(a[0]));  // stale for now
  EXPECT_EQ(cache->Acquire(Iota(4), "").num_tokens, 0u);  // RetainCached fails: a miss
  EXPECT_EQ(cache->stats().miss_lookups[size_t(MissReason::kEvicted)], 1u);
  // The reused block is published with new tokens: the stale name goes.
  ASSERT_EQ(cache->Publish(Iota(8, 100), all, "").value(), 2u);
  EXPECT_EQ(cache->Peek(Iota(8, 100), "").num_tokens, 8u);
  late->Deliver();  // the old report no longer matches anything
  EXPECT_EQ(cache->Peek(Iota(8, 100), "").num_tokens, 8u);
  EXPECT_EQ(cache->stats().evictions, 1u);
  EXPECT_EQ(cache->CheckInvariants(), "");
  ASSERT_TRUE(src->Release(all).ok());
  EXPECT_TRUE(src->CheckInvariants().ok());
}

TEST(PrefixCache, FailedPublishChangesNothing) {
  auto src = serving::NewModelBlockSource(8, kB);
  auto cache = std::move(PrefixCache::Create(
      std::make_unique<FailingBackend>(src->NewPrefixBackend(), 3))).value();
  std::vector<uint32_t> t(4);
  ASSERT_TRUE(src->Allocate(t, 0).ok());
  EXPECT_FALSE(cache->Publish(Iota(16), t, "").ok());
  EXPECT_EQ(cache->num_cached_blocks(), 0u);
  EXPECT_EQ(cache->stats().published_blocks, 0u);
  ASSERT_TRUE(src->Release(t).ok());
  EXPECT_EQ(src->stats().free_blocks, 8u);  // no block kept a hash
  EXPECT_EQ(cache->CheckInvariants(), "");
}

// ---------------------------------------------------------------------------
// Randomized: every lookup and every eviction against a brute-force model
// that names blocks by (salt, whole token prefix) and keeps an explicit LRU
// list of unreferenced named blocks.

using Key = std::pair<std::string, std::vector<TokenId>>;

struct Brute {
  explicit Brute(uint32_t n) : refs(n, 0) {}
  std::map<Key, uint32_t> named;  // (salt, prefix of whole blocks) -> block
  std::map<uint32_t, Key> key_of;
  std::vector<uint32_t> refs;     // [num_blocks]
  std::list<uint32_t> lru;        // unreferenced named blocks, least recent first

  static Key KeyFor(std::string_view salt, const std::vector<TokenId>& t, size_t blocks) {
    return {std::string(salt), std::vector<TokenId>(t.begin(), t.begin() + blocks * kB)};
  }
  std::vector<uint32_t> Lookup(const std::vector<TokenId>& t, std::string_view salt) const {
    std::vector<uint32_t> out;
    for (size_t i = 1; i <= t.size() / kB; ++i) {
      auto it = named.find(KeyFor(salt, t, i));
      if (it == named.end()) break;
      out.push_back(it->second);
    }
    return out;
  }
  void Ref(uint32_t b) {
    if (refs[b]++ == 0) lru.remove(b);
  }
  void Unref(uint32_t b) {
    if (--refs[b] == 0 && key_of.count(b)) lru.push_back(b);
  }
  uint32_t Free() const {
    uint32_t used = 0;
    for (uint32_t r : refs) used += r > 0;
    return static_cast<uint32_t>(refs.size()) - used - static_cast<uint32_t>(lru.size());
  }
  void Unname(uint32_t b) {
    const Key k = key_of[b];
    // Descendants first: a suffix never outlives its prefix.
    std::vector<uint32_t> desc;
    for (const auto& [key, blk] : named) {
      if (key.first == k.first && key.second.size() > k.second.size() &&
          std::equal(k.second.begin(), k.second.end(), key.second.begin())) {
        desc.push_back(blk);
      }
    }
    for (uint32_t d : desc) {
      named.erase(key_of[d]);
      key_of.erase(d);
      lru.remove(d);
    }
    named.erase(k);
    key_of.erase(b);
    lru.remove(b);
  }
  // An allocation of n blocks evicts the oldest unreferenced named blocks.
  void Allocate(uint32_t n) {
    uint32_t free = Free();
    while (free < n) {
      const uint32_t victim = lru.front();
      const size_t before = lru.size();
      Unname(victim);
      free += static_cast<uint32_t>(before - lru.size());
    }
  }
  void Publish(const std::vector<TokenId>& t, const std::vector<uint32_t>& table, std::string_view salt) {
    for (size_t i = 1; i <= t.size() / kB; ++i) {
      Key k = KeyFor(salt, t, i);
      auto it = named.find(k);
      if (it != named.end()) {
        if (it->second != table[i - 1]) return;
        continue;
      }
      named.emplace(k, table[i - 1]);
      key_of[table[i - 1]] = k;
    }
  }
};

struct TSeq {
  std::vector<TokenId> tokens;
  std::vector<uint32_t> table;
  std::string salt;
};

void RandomRun(Backing backing, uint64_t seed, uint32_t num_blocks, int steps) {
  Fixture f(num_blocks, backing);
  Brute brute(num_blocks);
  std::mt19937_64 rng(seed);
  auto uni = [&](uint32_t lo, uint32_t hi) { return std::uniform_int_distribution<uint32_t>(lo, hi)(rng); };
  std::vector<std::vector<TokenId>> families(3);
  for (auto& fam : families) {
    fam.resize(64);
    for (auto& t : fam) t = uni(0, 5);
  }
  std::vector<TSeq> seqs;
  auto release = [&](TSeq& s) {
    std::vector<uint32_t> back(s.table.rbegin(), s.table.rend());
    ASSERT_TRUE(f.src->Release(back).ok());
    for (uint32_t b : back) brute.Unref(b);
    s.table.clear();
  };
  auto compare = [&]() {
    f.Check();
    ASSERT_EQ(f.cache->num_cached_blocks(), brute.named.size());
    for (const auto& [key, blk] : brute.named) {
      const PrefixMatch m = f.cache->Peek(key.second, key.first);
      ASSERT_EQ(m.num_tokens, key.second.size());
      ASSERT_EQ(m.blocks.back(), blk);
    }
    for (uint32_t b = 0; b < num_blocks; ++b) {
      ASSERT_EQ(f.src->IsExclusive(b), brute.refs[b] == 1 && !brute.key_of.count(b)) << b;
    }
  };
  for (int step = 0; step < steps; ++step) {
    const uint32_t op = uni(0, 99);
    if (op < 40 || seqs.empty()) {  // a new sequence
      TSeq s;
      const auto& fam = families[uni(0, 2)];
      s.tokens.assign(fam.begin(), fam.begin() + uni(1, 5 * kB + 3));
      if (uni(0, 2) == 0) s.tokens[uni(0, static_cast<uint32_t>(s.tokens.size()) - 1)] = uni(6, 9);
      s.salt = uni(0, 3) == 0 ? "t1" : "";
      const std::vector<uint32_t> expect = brute.Lookup(s.tokens, s.salt);
      PrefixMatch m = f.cache->Acquire(s.tokens, s.salt);
      ASSERT_EQ(m.blocks, expect) << "step " << step;
      for (uint32_t b : m.blocks) brute.Ref(b);
      s.table = m.blocks;
      std::vector<uint32_t> fresh((s.tokens.size() + kB - 1) / kB - s.table.size());
      Status st = f.src->Allocate(fresh, 0);
      if (!st.ok()) {
        ASSERT_TRUE(st.IsPoolExhausted());
        release(s);
      } else {
        brute.Allocate(static_cast<uint32_t>(fresh.size()));
        for (uint32_t b : fresh) brute.Ref(b);
        s.table.insert(s.table.end(), fresh.begin(), fresh.end());
        ASSERT_TRUE(f.cache->Publish(s.tokens, s.table, s.salt).ok());
        brute.Publish(s.tokens, s.table, s.salt);
        seqs.push_back(std::move(s));
      }
    } else if (op < 65) {  // extend: the family's continuation or noise
      TSeq& s = seqs[uni(0, static_cast<uint32_t>(seqs.size()) - 1)];
      const uint32_t n = uni(1, 2 * kB);
      const uint32_t len = static_cast<uint32_t>(s.tokens.size());
      const bool cow = len % kB != 0 && !f.src->IsExclusive(s.table.back());
      const uint32_t need = (len + n + kB - 1) / kB - static_cast<uint32_t>(s.table.size()) + cow;
      std::vector<uint32_t> fresh(need);
      if (!f.src->Allocate(fresh, 0).ok()) continue;
      brute.Allocate(need);
      for (uint32_t b : fresh) brute.Ref(b);
      size_t next = 0;
      if (cow) {
        const uint32_t old = s.table.back();
        s.table.back() = fresh[next++];
        ASSERT_TRUE(f.src->Release(std::span<const uint32_t>(&old, 1)).ok());
        brute.Unref(old);
      }
      s.table.insert(s.table.end(), fresh.begin() + next, fresh.end());
      for (uint32_t i = 0; i < n; ++i) s.tokens.push_back(uni(0, 5));
      ASSERT_TRUE(f.cache->Publish(s.tokens, s.table, s.salt).ok());
      brute.Publish(s.tokens, s.table, s.salt);
    } else if (op < 75) {  // fork
      TSeq copy = seqs[uni(0, static_cast<uint32_t>(seqs.size()) - 1)];
      ASSERT_TRUE(f.src->Retain(copy.table).ok());
      for (uint32_t b : copy.table) brute.Ref(b);
      seqs.push_back(std::move(copy));
    } else {  // release, tail first
      const uint32_t i = uni(0, static_cast<uint32_t>(seqs.size()) - 1);
      release(seqs[i]);
      seqs.erase(seqs.begin() + i);
    }
    compare();
    if (testing::Test::HasFatalFailure()) return;
  }
  for (TSeq& s : seqs) release(s);
  compare();
  EXPECT_EQ(f.src->stats().used_blocks, 0u);
  const PrefixCacheStats st = f.cache->stats();
  uint64_t missed = 0;
  for (uint64_t m : st.miss_tokens) missed += m;
  EXPECT_EQ(st.hit_tokens + missed, st.lookup_tokens);
  EXPECT_GT(st.hit_tokens, 0u);
  EXPECT_GT(st.evictions, 0u);
  EXPECT_EQ(st.orphans_dropped, 0u);  // tail-first release never orphans
}

TEST(PrefixCache, RandomAgainstBruteForce) {
  for (Backing backing : {Backing::kModel, Backing::kPool}) {
    for (uint64_t seed : {1, 2, 3}) {
      SCOPED_TRACE(testing::Message() << "pool=" << (backing == Backing::kPool) << " seed=" << seed);
      RandomRun(backing, seed, 24, 1500);
      if (HasFatalFailure()) return;
    }
  }
}

// The same scenarios on the real pool.
TEST(PrefixCache, RealPoolEvictionOrderAndOrphans) {
  {
    Fixture f(6, Backing::kPool);
    const std::vector<uint32_t> x = f.Admit(Iota(8));
    const std::vector<uint32_t> y = f.Admit(Iota(8, 50));
    f.ReleaseTailFirst(x);
    f.ReleaseTailFirst(y);
    std::vector<uint32_t> three(3);
    ASSERT_TRUE(f.src->Allocate(three, 0).ok());
    EXPECT_FALSE(f.cache->IsCached(x[1]));
    EXPECT_EQ(f.cache->Peek(Iota(8), "").num_tokens, 4u);
    f.Check();
  }
  {
    Fixture f(4, Backing::kPool);
    std::vector<uint32_t> t = f.Admit(Iota(12));
    ASSERT_TRUE(f.src->Release(t).ok());  // front to back
    std::vector<uint32_t> two(2);
    ASSERT_TRUE(f.src->Allocate(two, 0).ok());
    EXPECT_EQ(f.cache->num_cached_blocks(), 0u);
    EXPECT_EQ(f.cache->stats().orphans_dropped, 2u);
    EXPECT_EQ(f.src->stats().free_blocks, 2u);
    f.Check();
  }
}

}  // namespace
}  // namespace kvcache
