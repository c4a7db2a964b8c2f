// OffloadCache: blocks published in one pool come back bit-exact into
// another pool (a restart) from each tier; isolation; poisoned and corrupt
// objects are refused and counted; several threads sharing one chain; the
// sequence-level AdoptInto / PublishSequence (what is adopted, refcounts,
// refusals that change nothing).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <thread>

#include "kvcache/cache.h"
#include "kvcache/serving/offload.h"
#include "serving/tier_test_util.h"

namespace kvcache {
namespace {

using namespace tiertest;

constexpr GeometryOptions kGeo{2, 2, 32, 16};

struct Node {  // one "process": a pool, its prefix cache, the offload layer
  std::shared_ptr<BlockPool> pool;
  std::unique_ptr<PrefixCache> cache;
  std::unique_ptr<OffloadCache> off;
  Node(std::vector<std::shared_ptr<Tier>> tiers, FormatPair f = {Format::kBF16, Format::kQ8_0},
       GeometryOptions g = kGeo, std::string model = "m", uint64_t seed = RowCodec::kDefaultRotationSeed,
       uint32_t blocks = 32) {
    pool = NewPool(g, f, blocks, seed);
    cache = std::move(PrefixCache::Create(pool)).value();
    OffloadOptions o;
    o.model = std::move(model);
    off = std::move(OffloadCache::Create(pool, cache.get(), std::move(tiers), o)).value();
  }
  // "Computes" a prompt: fresh blocks with contents derived from the tokens,
  // published; returns the block ids (released by the caller).
  std::vector<uint32_t> Compute(std::span<const TokenId> t, std::string_view salt = "") {
    const uint32_t B = pool->block_size();
    std::vector<uint32_t> blocks(t.size() / B);
    EXPECT_TRUE(pool->Allocate(blocks).ok());
    for (size_t i = 0; i < blocks.size(); ++i) FillBlock(*pool, blocks[i], t[i * B] * 31 + i);
    const std::vector<BlockHash> h = HashFullBlocks(t, B, salt);
    EXPECT_EQ(off->Publish(h, blocks, 0, t, salt).value(), blocks.size());
    return blocks;
  }
  void Release(std::vector<uint32_t> blocks) {
    std::reverse(blocks.begin(), blocks.end());
    EXPECT_TRUE(pool->Release(blocks).ok());
  }
};

// K/V rows of `tokens` at positions [0, n): a function of token and
// position, stored exactly (f32).
Status AppendRows(SequenceCache& seq, std::span<const TokenId> tokens) {
  const uint32_t L = kGeo.n_layers, H = kGeo.n_kv_heads, D = kGeo.head_dim;
  const size_t n = tokens.size();
  std::vector<float> k(size_t{L} * n * H * D), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    const size_t t = i / (size_t{H} * D) % n;
    k[i] = static_cast<float>(tokens[t] % 89) + 0.001f * static_cast<float>(i % 997);
    v[i] = -k[i] - static_cast<float>(t);
  }
  return seq.Append(k, v);
}

// Every layer's and head's rows of positions [0, n) equal in a and b.
void ExpectSameRows(const SequenceCache& a, const SequenceCache& b, uint32_t n) {
  const size_t D = kGeo.head_dim;
  for (uint32_t l = 0; l < kGeo.n_layers; ++l) {
    for (uint32_t h = 0; h < kGeo.n_kv_heads; ++h) {
      const std::vector<float> ka = a.HeadKeys(l, h).value(), kb = b.HeadKeys(l, h).value();
      const std::vector<float> va = a.HeadValues(l, h).value(), vb = b.HeadValues(l, h).value();
      ASSERT_GE(ka.size(), n * D);
      ASSERT_EQ(kb.size(), n * D);
      EXPECT_TRUE(std::equal(kb.begin(), kb.end(), ka.begin())) << l << " " << h;
      EXPECT_TRUE(std::equal(vb.begin(), vb.end(), va.begin())) << l << " " << h;
    }
  }
}

constexpr FormatPair kExact{Format::kF32, Format::kF32};

// A sequence published in pool a, in two steps (start = the blocks already
// offered), is adopted whole into an empty sequence of pool b from the tier,
// row for row; b's sequence then holds the only reference on each adopted
// block, which stays named: released, it serves the next adoption from b's
// pool.
TEST(Offload, AdoptIntoAndPublishSequenceRoundTripThroughATier) {
  std::shared_ptr<Tier> host = NewHostTier({});
  const std::vector<TokenId> t = Tokens(16 * 5 + 3);
  Node a({host}, kExact);
  SequenceCache sa = SequenceCache::CreatePaged(a.pool).value();
  ASSERT_TRUE(AppendRows(sa, t).ok());
  EXPECT_EQ(a.off->PublishSequence(&sa, std::span(t).first(16 * 2 + 5), "").value(), 2u);
  EXPECT_EQ(a.off->PublishSequence(&sa, t, "", 2).value(), 5u);
  a.off->Flush();
  EXPECT_EQ(a.off->stats().queued_blocks, 5u);
  EXPECT_EQ(a.off->stats().tiers[0].stored_blocks, 5u);
  EXPECT_EQ(a.cache->num_cached_blocks(), 5u);

  Node b({host}, kExact);
  SequenceCache sb = SequenceCache::CreatePaged(b.pool).value();
  std::vector<uint64_t> served;
  EXPECT_EQ(b.off->AdoptInto(&sb, t, "", &served).value(), 80u);
  EXPECT_EQ(served, (std::vector<uint64_t>{0, 80}));
  ASSERT_EQ(sb.num_tokens(), 80u);
  ASSERT_EQ(sb.block_table().size(), 5u);
  ExpectSameRows(sa, sb, 80);
  for (uint32_t block : sb.block_table()) {
    EXPECT_EQ(b.pool->refcount(block), 1u) << block;
    EXPECT_TRUE(b.cache->IsCached(block)) << block;
  }
  EXPECT_EQ(b.pool->stats().used_blocks, 5u);
  EXPECT_EQ(b.off->stats().tiers[0].hit_blocks, 5u);
  sb.Release();
  EXPECT_EQ(b.pool->stats().used_blocks, 0u);
  EXPECT_EQ(b.pool->stats().cached_blocks, 5u);
  // A lookup of a shorter prompt adopts only its full blocks, from the pool.
  SequenceCache again = SequenceCache::CreatePaged(b.pool).value();
  EXPECT_EQ(b.off->AdoptInto(&again, std::span(t).first(16 * 3 + 15), "", &served).value(), 48u);
  EXPECT_EQ(served, (std::vector<uint64_t>{48, 0}));
  ExpectSameRows(sa, again, 48);
  EXPECT_EQ(b.off->stats().tiers[0].hit_blocks, 5u);
  // Under another salt nothing is cached: 0 tokens, the sequence untouched.
  SequenceCache salted = SequenceCache::CreatePaged(b.pool).value();
  EXPECT_EQ(b.off->AdoptInto(&salted, t, "tenant-b").value(), 0u);
  EXPECT_EQ(salted.num_tokens(), 0u);
  again.Release();
  sa.Release();
  EXPECT_TRUE(a.pool->CheckInvariants().ok());
  EXPECT_TRUE(b.pool->CheckInvariants().ok());
}

// Refusals: each returns its status and changes nothing (no lookup counted,
// no reference taken, nothing published or queued). A failing adoption
// gives its references back; the loaded blocks stay cached in the pool.
TEST(Offload, SequenceCallsRefuseWithoutChangingAnything) {
  std::shared_ptr<Tier> host = NewHostTier({});
  const std::vector<TokenId> t = Tokens(16 * 3);
  {
    Node a({host}, kExact);
    SequenceCache sa = SequenceCache::CreatePaged(a.pool).value();
    ASSERT_TRUE(AppendRows(sa, t).ok());
    // More committed tokens than the sequence holds; a contiguous sequence;
    // a block table shorter than the tokens' full blocks.
    const std::vector<TokenId> longer = Tokens(16 * 4);
    EXPECT_EQ(a.off->PublishSequence(&sa, longer, "").status().code(), StatusCode::kInvalidArgument);
    SequenceCache flat = SequenceCache::CreateContiguous(sa.geometry(), kExact).value();
    EXPECT_EQ(a.off->PublishSequence(&flat, {}, "").status().code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(a.off->PublishBlocks(t, sa.block_table().first(2), 0, "", nullptr, nullptr).status().code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(a.cache->num_cached_blocks(), 0u);
    EXPECT_EQ(a.off->stats().queued_blocks, 0u);
    EXPECT_EQ(a.off->PublishSequence(&sa, t, "").value(), 3u);
    a.off->Flush();
  }
  Node b({host}, kExact);
  SequenceCache held = SequenceCache::CreatePaged(b.pool).value();
  ASSERT_TRUE(AppendRows(held, std::span(t).first(3)).ok());
  const PoolStats before = b.pool->stats();
  EXPECT_EQ(b.off->AdoptInto(&held, t, "").status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(b.off->AdoptInto(nullptr, t, "").status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(b.off->stats().tiers[0].lookups, 0u);
  EXPECT_EQ(b.pool->stats().used_blocks, before.used_blocks);
  EXPECT_EQ(held.num_tokens(), 3u);
  // An adoption that fails: its status comes back, the references go back.
  std::vector<uint32_t> offered;
  auto refused = b.off->AcquireInto(t, "", [&](std::span<const uint32_t> blocks,
                                                std::shared_ptr<const Calibration>,
                                                std::shared_ptr<const WindowSinks>) {
    offered.assign(blocks.begin(), blocks.end());
    return Status::FailedPrecondition("not now");
  });
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  ASSERT_EQ(offered.size(), 3u);
  for (uint32_t block : offered) {
    EXPECT_EQ(b.pool->refcount(block), 0u) << block;
    EXPECT_EQ(b.pool->state(block), BlockState::kCached) << block;
  }
  EXPECT_EQ(b.pool->stats().used_blocks, before.used_blocks);
  // Nothing to adopt: the function is not called.
  bool called = false;
  EXPECT_EQ(b.off->AcquireInto(Tokens(15), "", [&](std::span<const uint32_t>,
                                                    std::shared_ptr<const Calibration>,
                                                    std::shared_ptr<const WindowSinks>) {
                 called = true;
                 return Status::Ok();
               }).value(),
            0u);
  EXPECT_FALSE(called);
  held.Release();
  EXPECT_TRUE(b.pool->CheckInvariants().ok());
}

TEST(Offload, EachTierServesABitExactPrefixToAFreshPool) {
  const std::string dir = "/tmp/kvc_offload_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::shared_ptr<Tier> host = NewHostTier({});
  std::shared_ptr<Tier> disk = std::move(OpenDiskTier({.path = dir})).value();
  const std::vector<TokenId> t = Tokens(16 * 5 + 3);
  for (int which = 0; which < 2; ++which) {
    std::shared_ptr<Tier> tier = which == 0 ? host : disk;
    Node a({tier});
    std::vector<uint32_t> blocks = a.Compute(t);
    a.off->Flush();
    EXPECT_EQ(a.off->stats().tiers[0].stored_blocks, 5u);
    Node b({tier});  // another pool: nothing cached there
    std::vector<uint64_t> served;
    PrefixMatch m = b.off->Acquire(t, "", &served);
    ASSERT_EQ(m.blocks.size(), 5u);
    EXPECT_EQ(served[0], 0u);
    EXPECT_EQ(served[1], 80u);
    for (size_t i = 0; i < 5; ++i) EXPECT_TRUE(SameBlock(*a.pool, blocks[i], *b.pool, m.blocks[i])) << i;
    const TierStats s = b.off->stats().tiers[0];
    EXPECT_EQ(s.hit_blocks, 5u);
    EXPECT_EQ(s.hit_tokens, 80u);
    EXPECT_GT(s.bytes_loaded, 0u);
    // The loaded blocks are named in b's pool: the next lookup hits there.
    b.Release(m.blocks);
    PrefixMatch again = b.off->Acquire(t, "", &served);
    EXPECT_EQ(served[0], 80u);
    b.Release(again.blocks);
    a.Release(blocks);
  }
  std::filesystem::remove_all(dir);
}

TEST(Offload, ChangingAnyCompatibilityInputMisses) {
  std::shared_ptr<Tier> host = NewHostTier({});
  const std::vector<TokenId> t = Tokens(48);
  const FormatPair turbo{Format::kTurbo4, Format::kTurbo4};
  {
    Node a({host}, turbo);
    a.Release(a.Compute(t));
    a.off->Flush();
  }
  auto hits = [&](Node& n, std::string_view salt = "") {
    PrefixMatch m = n.off->Acquire(t, salt);
    const size_t got = m.blocks.size();
    n.Release(m.blocks);
    return got;
  };
  Node same({host}, turbo);
  EXPECT_EQ(hits(same), 3u);
  Node model({host}, turbo, kGeo, "other-model");
  EXPECT_EQ(hits(model), 0u);
  Node geo({host}, turbo, {2, 4, 32, 16});
  EXPECT_EQ(hits(geo), 0u);
  Node bs({host}, turbo, {2, 2, 32, 8});
  EXPECT_EQ(hits(bs), 0u);
  Node fmt({host}, {Format::kTurbo4, Format::kTurbo3});
  EXPECT_EQ(hits(fmt), 0u);
  Node seed({host}, turbo, kGeo, "m", 12345);
  EXPECT_EQ(hits(seed), 0u);
  Node salted({host}, turbo);
  EXPECT_EQ(hits(salted, "tenant-b"), 0u);
  EXPECT_EQ(salted.off->stats().tiers[0].misses[static_cast<size_t>(TierMiss::kAbsent)], 1u);
}

// A poisoned host tier: right keys, wrong contents. Each is refused with its
// reason, erased, and the rest of the prompt is recomputed.
TEST(Offload, PoisonedAndCorruptObjectsAreRefusedAndCounted) {
  std::shared_ptr<Tier> host = NewHostTier({});
  const std::vector<TokenId> t = Tokens(64);
  Node a({host});
  a.Release(a.Compute(t));
  a.off->Flush();
  const std::vector<BlockHash> h = HashFullBlocks(t, 16, "");
  const BlockHash compat = a.off->compat_digest();
  // Block 2: a right key whose object claims other tokens (a forced collision).
  std::vector<TokenId> other = t;
  other[40] = 999;
  uint32_t tmp;
  ASSERT_TRUE(a.pool->Allocate(std::span(&tmp, 1)).ok());
  auto poison = std::make_shared<const std::vector<uint8_t>>(
      EncodeBlockObject(*a.pool, tmp, compat, h[2], h[1], std::span(other).subspan(32, 16)).value());
  host->Store(std::vector<TierPut>{{BlockKey(compat, h[2]), "", poison}});
  Node b({host});
  PrefixMatch m = b.off->Acquire(t, "");
  EXPECT_EQ(m.blocks.size(), 2u);  // blocks 0, 1 only
  b.Release(m.blocks);
  TierStats s = b.off->stats().tiers[0];
  EXPECT_EQ(s.misses[static_cast<size_t>(TierMiss::kTokenMismatch)], 1u);
  EXPECT_EQ(host->Exists(std::vector<std::string>{BlockKey(compat, h[2])})[0], TierMiss::kAbsent);
  // Block 0 truncated: nothing loads.
  auto got = host->Load(std::vector<std::string>{BlockKey(compat, h[0])});
  auto cut = std::make_shared<const std::vector<uint8_t>>(got[0].bytes->begin(), got[0].bytes->end() - 1);
  host->Store(std::vector<TierPut>{{BlockKey(compat, h[0]), "", cut}});
  Node c({host});
  EXPECT_EQ(c.off->Acquire(t, "").blocks.size(), 0u);
  s = c.off->stats().tiers[0];
  EXPECT_EQ(s.misses[static_cast<size_t>(TierMiss::kCorrupt)], 1u);
  EXPECT_EQ(s.hit_blocks, 0u);
  ASSERT_TRUE(a.pool->Release(std::span(&tmp, 1)).ok());
}

// A tier whose stores wait until the test opens the gate, so the writer
// holds its first batch while the publisher queues the rest: a queue of one
// fills whatever the two threads' timing.
class GatedStores final : public Tier {
 public:
  explicit GatedStores(std::shared_ptr<Tier> inner) : inner_(std::move(inner)) {}
  void Open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  std::string name() const override { return "gated"; }
  std::vector<std::optional<TierMiss>> Exists(std::span<const std::string> k) override { return inner_->Exists(k); }
  std::vector<TierGet> Load(std::span<const std::string> k) override { return inner_->Load(k); }
  size_t Store(std::span<const TierPut> p) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return open_; });
    }
    return inner_->Store(p);
  }
  void Erase(std::span<const std::string> k) override { inner_->Erase(k); }
  TierUsage usage() const override { return inner_->usage(); }

 private:
  std::shared_ptr<Tier> inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

TEST(Offload, AFullQueueDropsAndCountsWithoutBlocking) {
  auto pool = NewPool(kGeo, {Format::kBF16, Format::kBF16}, 64);
  auto cache = std::move(PrefixCache::Create(pool)).value();
  OffloadOptions o;
  o.queue_blocks = 1;
  o.store_batch = 1;
  auto gated = std::make_shared<GatedStores>(NewHostTier({}));
  auto off = std::move(OffloadCache::Create(pool, cache.get(), {gated}, o)).value();
  // Opened before `off` joins its writer, even when an assertion returns early.
  struct OpenAtExit {
    GatedStores* g;
    ~OpenAtExit() { g->Open(); }
  } open_at_exit{gated.get()};
  const std::vector<TokenId> t = Tokens(16 * 40);
  std::vector<uint32_t> blocks(40);
  ASSERT_TRUE(pool->Allocate(blocks).ok());
  ASSERT_EQ(off->Publish(HashFullBlocks(t, 16, ""), blocks, 0, t, "").value(), 40u);
  gated->Open();
  off->Flush();
  const OffloadStats s = off->stats();
  EXPECT_EQ(s.queued_blocks + s.dropped_queue_full, 40u);
  EXPECT_GT(s.dropped_queue_full, 0u);
  EXPECT_EQ(s.tiers[0].dropped_stores, s.dropped_queue_full);
  EXPECT_EQ(s.tiers[0].stored_blocks, s.queued_blocks);
  std::reverse(blocks.begin(), blocks.end());
  ASSERT_TRUE(pool->Release(blocks).ok());
  EXPECT_TRUE(pool->CheckInvariants().ok());
}

// Several threads, one pool, one shared chain, a pool too small to keep it:
// every prefix returned is contiguous and holds the chain's bytes; the pool
// stays consistent. (Runs under TSan: the serving label.)
TEST(Offload, ThreadsSharingAChainSeeWholePrefixes) {
  std::shared_ptr<Tier> host = NewHostTier({});
  Node n({host}, {Format::kBF16, Format::kBF16}, kGeo, "m", RowCodec::kDefaultRotationSeed, 48);
  const std::vector<TokenId> t = Tokens(16 * 6);
  Node ref({}, {Format::kBF16, Format::kBF16}, kGeo, "m", RowCodec::kDefaultRotationSeed, 8);
  std::vector<uint32_t> ref_blocks(6);
  ASSERT_TRUE(ref.pool->Allocate(ref_blocks).ok());
  for (size_t i = 0; i < 6; ++i) FillBlock(*ref.pool, ref_blocks[i], t[i * 16] * 31 + i);
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < 3; ++w) {
    threads.emplace_back([&, w] {
      for (int round = 0; round < 30; ++round) {
        PrefixMatch m = n.off->Acquire(t, "");
        std::vector<uint32_t> blocks = m.blocks;
        for (size_t i = 0; i < blocks.size(); ++i) {
          if (!SameBlock(*ref.pool, ref_blocks[i], *n.pool, blocks[i])) ++bad;
        }
        // Compute the rest (as a model would) and publish it.
        const size_t have = blocks.size();
        std::vector<uint32_t> fresh(6 - have);
        if (!fresh.empty() && n.pool->Allocate(fresh).ok()) {
          for (size_t i = 0; i < fresh.size(); ++i) {
            FillBlock(*n.pool, fresh[i], t[(have + i) * 16] * 31 + have + i);
            blocks.push_back(fresh[i]);
          }
          (void)n.off->Publish(HashFullBlocks(t, 16, ""), blocks, have, t, "");
          n.off->Flush();
        }
        std::reverse(blocks.begin(), blocks.end());
        if (!n.pool->Release(blocks).ok()) ++bad;
        // Push the chain out of the pool now and then.
        if ((round + w) % 5 == 0) {
          for (int tries = 0; tries < 3; ++tries) {  // all that is available: evicts cached blocks
            std::vector<uint32_t> filler(n.pool->num_available_blocks());
            if (n.pool->Allocate(filler).ok()) {
              (void)n.pool->Release(filler);
              break;
            }
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  n.off->Flush();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_TRUE(n.pool->CheckInvariants().ok());
  EXPECT_EQ(n.cache->CheckInvariants(), "");
  // Alone now: push the chain out of the pool; it comes back whole from the tier.
  std::vector<uint32_t> filler(n.pool->num_available_blocks());
  ASSERT_TRUE(n.pool->Allocate(filler).ok());
  ASSERT_TRUE(n.pool->Release(filler).ok());
  const uint64_t before = n.off->stats().tiers[0].hit_blocks;
  PrefixMatch m = n.off->Acquire(t, "");
  ASSERT_EQ(m.blocks.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_TRUE(SameBlock(*ref.pool, ref_blocks[i], *n.pool, m.blocks[i]));
  EXPECT_EQ(n.off->stats().tiers[0].hit_blocks, before + 6);
  n.Release(m.blocks);
}

}  // namespace
}  // namespace kvcache
