// Precision-window sinks that travel with a published prefix:
//   - the prefix cache keeps a publisher's WindowSinks with the block that
//     completes them and hands them out with any match that includes it;
//     an adopter with the same window reads the publisher's rows exactly,
//     another window gets the blocks without them;
//   - they are freed with their block (eviction), the pool's accounting
//     exact throughout;
//   - tier objects carry them (kBlockFlagSinks, a checksummed section):
//     host and disk round trips into another pool (a second process), a
//     flipped byte in the section or sinks placed in the wrong block are a
//     corrupt miss, objects without the flag load as before. (Redis:
//     tier_redis_test.cc, RedisTierTest.WindowSinksRoundTripBetweenTwoProcesses.)
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "serving/sinks_test_util.h"

namespace kvcache {
namespace {

using namespace sinkstest;
using tiertest::Tokens;

size_t Misses(const OffloadCache& off, TierMiss why, size_t tier = 0) {
  return off.stats().tiers[tier].misses[static_cast<size_t>(why)];
}

TEST(PrefixSinks, KeptWithTheBlockCompletingThemAndAdoptedWithIt) {
  Process p({});
  const std::vector<TokenId> t = Tokens(24, 1);
  SequenceCache a = p.Sequence();
  ASSERT_TRUE(AppendRandom(a, 24, 1).ok());
  ASSERT_EQ(p.cache->PublishSequence(&a, t, "").value(), 3u);
  auto sinks = a.window_sinks();
  ASSERT_NE(sinks, nullptr);
  const PrefixMatch peek = p.cache->Peek(t, "");
  ASSERT_EQ(peek.blocks.size(), 3u);
  ASSERT_NE(peek.sinks, nullptr);
  EXPECT_EQ(peek.sinks->rows, sinks->rows);
  EXPECT_NE(p.cache->Peek(std::span(t).first(8), "").sinks, nullptr);  // block 0 completes them

  SequenceCache b = p.Sequence();
  ASSERT_EQ(p.cache->AdoptInto(&b, t, "").value(), 24u);
  ASSERT_NE(b.window_sinks(), nullptr);
  EXPECT_EQ(b.window_sinks()->rows, sinks->rows);
  ExpectSameRows(a, b, 24);
  ExpectSameAttention(a, b, 2);
  // Another S: the blocks, no sinks.
  SequenceCache c = p.Sequence({.sinks = 2});
  ASSERT_EQ(p.cache->AdoptInto(&c, t, "").value(), 24u);
  EXPECT_EQ(c.window_sinks(), nullptr);

  // 12 sinks end in block 1: a match of block 0 alone does not carry them.
  const std::vector<TokenId> u = Tokens(24, 500);
  SequenceCache d = p.Sequence({.sinks = 12});
  ASSERT_TRUE(AppendRandom(d, 24, 3).ok());
  ASSERT_EQ(p.cache->PublishSequence(&d, u, "").value(), 3u);
  EXPECT_EQ(p.cache->Peek(std::span(u).first(8), "").sinks, nullptr);
  ASSERT_NE(p.cache->Peek(std::span(u).first(16), "").sinks, nullptr);
  SequenceCache e = p.Sequence({.sinks = 12});
  ASSERT_EQ(p.cache->AdoptInto(&e, std::span(u).first(8), "").value(), 8u);
  EXPECT_EQ(e.window_sinks(), nullptr);  // shorter than the sinks: as without
  SequenceCache f = p.Sequence({.sinks = 12});
  ASSERT_EQ(p.cache->AdoptInto(&f, u, "").value(), 24u);
  ASSERT_NE(f.window_sinks(), nullptr);
  ExpectSameRows(d, f, 24);

  // A publisher without a window publishes no sinks.
  const std::vector<TokenId> w = Tokens(16, 900);
  SequenceCache plain = SequenceCache::CreatePaged(p.pool).value();
  ASSERT_TRUE(AppendRandom(plain, 16, 4).ok());
  ASSERT_EQ(p.cache->PublishSequence(&plain, w, "").value(), 2u);
  EXPECT_EQ(p.cache->Peek(w, "").sinks, nullptr);
  EXPECT_EQ(p.cache->CheckInvariants(), "");
  EXPECT_TRUE(p.pool->CheckInvariants().ok());
}

TEST(PrefixSinks, BadSinksArePublishedNowhere) {
  Process p({NewHostTier({})});
  const std::vector<TokenId> t = Tokens(16, 1);
  SequenceCache a = p.Sequence();
  ASSERT_TRUE(AppendRandom(a, 16, 1).ok());
  auto bad = std::make_shared<WindowSinks>(*a.window_sinks());
  bad->rows.resize(bad->rows.size() - 2);
  const std::vector<BlockHash> h = HashFullBlocks(t, kGeo.block_size, "");
  auto set_hash = [&](size_t logical, uint64_t hash) {
    return a.SetBlockHash(static_cast<uint32_t>(logical), hash);
  };
  EXPECT_EQ(p.cache->PublishHashed(h, a.block_table(), 0, std::span(t).first(8), "", a.calibration(),
                                   set_hash, bad)
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(p.off->Publish(h, a.block_table(), 0, t, "", a.calibration(), set_hash, bad).status().code(),
            StatusCode::kInvalidArgument);
  auto other_geometry = std::make_shared<WindowSinks>(*a.window_sinks());
  other_geometry->n_kv_heads = 1;
  other_geometry->rows.resize(other_geometry->expected_bytes());
  EXPECT_EQ(p.off->Publish(h, a.block_table(), 0, t, "", a.calibration(), set_hash, other_geometry)
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(p.cache->num_cached_blocks(), 0u);
  EXPECT_EQ(p.off->stats().queued_blocks, 0u);
  for (uint32_t b : a.block_table()) EXPECT_FALSE(p.pool->block_hash(b).has_value());
}

// The sinks live as long as their block is cached: eviction frees them, and
// the pool's counters are exact before and after.
TEST(PrefixSinks, FreedWithTheirBlockAndThePoolStaysExact) {
  constexpr uint32_t kBlocks = 8;
  Process p({}, kBlocks);
  const std::vector<TokenId> t = Tokens(24, 1);
  std::weak_ptr<const WindowSinks> kept;
  {
    SequenceCache a = p.Sequence();
    ASSERT_TRUE(AppendRandom(a, 24, 5).ok());
    ASSERT_EQ(p.cache->PublishSequence(&a, t, "").value(), 3u);
    kept = p.cache->Peek(t, "").sinks;
    ASSERT_FALSE(kept.expired());
    SequenceCache b = p.Sequence();
    ASSERT_EQ(p.cache->AdoptInto(&b, t, "").value(), 24u);
    PoolStats s = p.pool->stats();
    EXPECT_EQ(s.used_blocks, 3u);
    EXPECT_EQ(s.free_blocks, kBlocks - 3);
  }
  // Both released: the blocks are cached, the sinks with them.
  PoolStats s = p.pool->stats();
  EXPECT_EQ(s.used_blocks, 0u);
  EXPECT_EQ(s.cached_blocks, 3u);
  EXPECT_EQ(s.free_blocks, kBlocks - 3);
  EXPECT_FALSE(kept.expired());
  ASSERT_TRUE(p.pool->CheckInvariants().ok());
  // The pool takes every block back: the cached ones are evicted, their
  // entries and sinks dropped.
  std::vector<uint32_t> all(kBlocks);
  ASSERT_TRUE(p.pool->Allocate(all).ok());
  EXPECT_EQ(p.pool->stats().evictions, 3u);
  EXPECT_EQ(p.cache->num_cached_blocks(), 0u);
  EXPECT_TRUE(kept.expired());
  EXPECT_EQ(p.cache->Peek(t, "").sinks, nullptr);
  ASSERT_TRUE(p.pool->Release(all).ok());
  s = p.pool->stats();
  EXPECT_EQ(s.free_blocks, kBlocks);
  EXPECT_EQ(s.cached_blocks + s.used_blocks + s.reserved_blocks, 0u);
  EXPECT_TRUE(p.pool->CheckInvariants().ok());
  EXPECT_EQ(p.cache->CheckInvariants(), "");
  // The same blocks published again without a window carry no sinks.
  SequenceCache plain = SequenceCache::CreatePaged(p.pool).value();
  ASSERT_TRUE(AppendRandom(plain, 24, 6).ok());
  ASSERT_EQ(p.cache->PublishSequence(&plain, t, "").value(), 3u);
  EXPECT_EQ(p.cache->Peek(t, "").sinks, nullptr);
}

TEST(TierSinks, ObjectCarriesThemInAChecksummedSection) {
  Process p({});
  const std::vector<TokenId> t = Tokens(8, 1);
  SequenceCache a = p.Sequence();
  ASSERT_TRUE(AppendRandom(a, 8, 1).ok());
  auto sinks = a.window_sinks();
  ASSERT_NE(sinks, nullptr);
  const BlockHash compat{5, 6};
  const std::vector<BlockHash> h = HashFullBlocks(t, 8, "");
  const uint32_t block = a.block_table()[0];
  const std::vector<uint8_t> plain = EncodeBlockObject(*p.pool, block, compat, h[0], ChainRoot(""), t).value();
  const std::vector<uint8_t> obj =
      EncodeBlockObject(*p.pool, block, compat, h[0], ChainRoot(""), t, std::nullopt, sinks.get()).value();
  EXPECT_EQ(obj.size(), plain.size() + 16 + sinks->rows.size());
  const BlockObjectInfo info = ParseBlockObjectHeader(obj, obj.size()).value();
  EXPECT_EQ(info.sinks, 4u);
  EXPECT_EQ(info.sinks_bytes, sinks->rows.size());
  EXPECT_EQ(ParseBlockObjectHeader(plain, plain.size()).value().sinks, 0u);
  EXPECT_EQ(VerifyBlockObject(obj, compat, h[0], ChainRoot(""), t), std::nullopt);
  std::vector<uint32_t> staging(1);
  ASSERT_TRUE(p.pool->Allocate(staging).ok());
  std::shared_ptr<const WindowSinks> got;
  EXPECT_EQ(VerifyAndDecodeBlockObject(obj, compat, h[0], ChainRoot(""), t, *p.pool, staging[0], &got),
            std::nullopt);
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->rows, sinks->rows);
  EXPECT_EQ(got->formats, kTurbo4);
  EXPECT_TRUE(tiertest::SameBlock(*p.pool, block, *p.pool, staging[0]));
  // Unflagged: loads as before, no sinks.
  EXPECT_EQ(VerifyAndDecodeBlockObject(plain, compat, h[0], ChainRoot(""), t, *p.pool, staging[0], &got),
            std::nullopt);
  EXPECT_EQ(got, nullptr);
  // A flipped bit in the section, in its header fields, a truncated section.
  for (size_t at : {obj.size() - 1, obj.size() - sinks->rows.size(), size_t{info.header_bytes - 16},
                    size_t{info.header_bytes - 8}}) {
    std::vector<uint8_t> bad = obj;
    bad[at] ^= 0x04;
    EXPECT_EQ(VerifyBlockObject(bad, compat, h[0], ChainRoot(""), t), TierMiss::kCorrupt) << at;
    EXPECT_EQ(VerifyAndDecodeBlockObject(bad, compat, h[0], ChainRoot(""), t, *p.pool, staging[0], &got),
              TierMiss::kCorrupt)
        << at;
    EXPECT_EQ(got, nullptr);
  }
  std::vector<uint8_t> cut(obj.begin(), obj.end() - 2);
  EXPECT_EQ(VerifyBlockObject(cut, compat, h[0], ChainRoot(""), t), TierMiss::kCorrupt);
  // The disk tier's rebuild reads its key from the header alone.
  const StoredObjectHeader sh = ParseStoredObjectHeader(std::span(obj).first(info.header_bytes), obj.size()).value();
  EXPECT_EQ(sh.key, BlockKey(compat, h[0]));
  // Sinks that do not fit the pool are refused.
  auto wrong = std::make_shared<WindowSinks>(*sinks);
  wrong->head_dim = 32;
  wrong->rows.resize(wrong->expected_bytes());
  EXPECT_EQ(EncodeBlockObject(*p.pool, block, compat, h[0], ChainRoot(""), t, std::nullopt, wrong.get())
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(p.pool->Release(staging).ok());
}

TEST(TierSinks, HostTierSharedByTwoProcesses) {
  std::shared_ptr<Tier> host = NewHostTier({});
  ExpectSinksRoundTrip([&](int) { return std::vector<std::shared_ptr<Tier>>{host}; });
}

TEST(TierSinks, DiskFolderOpenedByTwoProcesses) {
  const std::string dir = "/tmp/kvc_sinks_disk_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  ExpectSinksRoundTrip([&](int) {
    return std::vector<std::shared_ptr<Tier>>{std::move(OpenDiskTier({.path = dir})).value()};
  });
  std::filesystem::remove_all(dir);
}

// Objects the tier holds that fail: the flipped sink section of block 0 (no
// block adopted), sinks placed in block 1 of a chain whose sinks end in
// block 0 (block 0 adopted alone, without them: the publisher's sinks left
// with the corrupt object). Each is a counted corrupt miss, erased.
TEST(TierSinks, CorruptOrMisplacedSinksAreAMiss) {
  std::shared_ptr<Tier> host = NewHostTier({});
  const std::vector<TokenId> t = Tokens(24, 3);
  Process p0({host});
  SequenceCache a = p0.Sequence();
  ASSERT_TRUE(AppendRandom(a, 24, 9).ok());
  ASSERT_EQ(p0.off->PublishSequence(&a, t, "").value(), 3u);
  p0.off->Flush();
  const BlockHash compat = p0.off->compat_digest();
  const std::vector<BlockHash> h = HashFullBlocks(t, 8, "");
  auto replace = [&](size_t i, std::vector<uint8_t> bytes) {
    const std::string key = BlockKey(compat, h[i]);
    host->Erase(std::vector<std::string>{key});
    ASSERT_EQ(host->Store(std::vector<TierPut>{{key, i ? BlockKey(compat, h[i - 1]) : "",
                                                std::make_shared<const std::vector<uint8_t>>(std::move(bytes))}}),
              1u);
  };
  auto load = [&](size_t i) {
    const TierBlobPtr b = host->Load(std::vector<std::string>{BlockKey(compat, h[i])})[0].bytes;
    return b ? std::vector<uint8_t>(b->begin(), b->end()) : std::vector<uint8_t>{};
  };
  const std::vector<uint8_t> block0 = load(0), block1 = load(1);
  const BlockObjectInfo info0 = ParseBlockObjectHeader(block0, block0.size()).value();
  ASSERT_EQ(info0.sinks, 4u);
  EXPECT_EQ(ParseBlockObjectHeader(block1, block1.size()).value().sinks, 0u);  // only block 0 carries them

  {  // A flipped byte in block 0's sink section.
    std::vector<uint8_t> bad = block0;
    bad[bad.size() - 5] ^= 0x01;
    replace(0, bad);
    Process p1({host});
    SequenceCache b = p1.Sequence();
    EXPECT_EQ(p1.off->AdoptInto(&b, t, "").value(), 0u);
    EXPECT_EQ(b.num_tokens(), 0u);
    EXPECT_EQ(Misses(*p1.off, TierMiss::kCorrupt), 1u);
    EXPECT_TRUE(p1.pool->CheckInvariants().ok());
    EXPECT_EQ(p1.pool->stats().used_blocks, 0u);
  }
  {  // Block 0 without its sinks (unflagged, as an older writer stores it),
     // block 1 with sinks that end in block 0.
    const uint32_t b0 = a.block_table()[0], b1 = a.block_table()[1];
    const std::optional<BlockHash> cal = info0.calibrated ? std::optional<BlockHash>(info0.calibration) : std::nullopt;
    replace(0, EncodeBlockObject(*p0.pool, b0, compat, h[0], ChainRoot(""), std::span(t).first(8), cal).value());
    replace(1, EncodeBlockObject(*p0.pool, b1, compat, h[1], h[0], std::span(t).subspan(8, 8), cal,
                                 a.window_sinks().get())
                   .value());
    Process p1({host});
    SequenceCache b = p1.Sequence();
    EXPECT_EQ(p1.off->AdoptInto(&b, t, "").value(), 8u);
    EXPECT_EQ(b.window_sinks(), nullptr);  // an unflagged block 0: no sinks, as before
    EXPECT_EQ(Misses(*p1.off, TierMiss::kCorrupt), 1u);
    EXPECT_TRUE(b.CheckInvariants().ok());
    // Its rows are the publisher's bytes, read without the window's sinks.
    SequenceCache twin = SequenceCache::CreatePaged(p0.pool).value();
    std::vector<uint32_t> first{b0};
    ASSERT_TRUE(p0.pool->Retain(first).ok());
    ASSERT_TRUE(twin.AdoptPrefix(first, a.calibration()).ok());
    ExpectSameRows(twin, b, 8);
  }
}

}  // namespace
}  // namespace kvcache
