// The block object (round trip, fixed key vectors, every verification
// failure) and the host and disk tiers (budget, tail-first LRU, restart,
// corrupt and torn files, a writer killed mid-store).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "kvcache/cache.h"
#include "kvcache/serving/tier_object.h"
#include "kvcache/serving/tier_store.h"
#include "serving/tier_test_util.h"

namespace kvcache {
namespace {

using namespace tiertest;

BlockCompat Compat(std::string model = "m") {
  BlockCompat c;
  c.model = std::move(model);
  c.geometry = {2, 2, 32, 16};
  c.formats = {Format::kBF16, Format::kBF16};
  return c;
}

// Fixed vectors: keys must be the same in every process, build and machine.
TEST(TierObject, KeysAreFixedVectors) {
  BlockCompat c;
  c.model = "llama3-8b@test";
  c.geometry = {32, 8, 128, 16};
  c.formats = {Format::kBF16, Format::kBF16};
  // Recorded once (this test's first run); a change means every stored
  // object would silently stop hitting: bump kBlockObjectVersion instead.
  EXPECT_EQ(HashHex(CompatDigest(c)), "d3b5333666c572f28317bf56b8299cb0");
  const std::vector<TokenId> t = Tokens(16);
  const BlockHash chain = ChainHash(ChainRoot(""), t);
  EXPECT_EQ(BlockKey(CompatDigest(c), chain),
            "kvc1:d3b5333666c572f28317bf56b8299cb0:a2cb463757413304e4a9852f2e6f0836");
  c.model = "other";
  EXPECT_NE(HashHex(CompatDigest(c)), "d3b5333666c572f28317bf56b8299cb0");
}

TEST(TierObject, CompatDigestChangesWithEveryField) {
  const BlockHash base = CompatDigest(Compat());
  std::vector<BlockCompat> changed(6, Compat());
  changed[0].model = "m2";
  changed[1].geometry.n_kv_heads = 4;
  changed[2].geometry.block_size = 32;
  changed[3].formats.v = Format::kQ8_0;
  changed[4].rotation = 7;
  changed[5].calibration = {1, 2};
  for (const BlockCompat& c : changed) EXPECT_FALSE(CompatDigest(c) == base) << CompatManifest(c);
  EXPECT_TRUE(CompatDigest(Compat()) == base);
}

// Every format, odd geometries, the chain's tail block: bit-exact.
TEST(TierObject, RoundTripBitExactPerFormat) {
  const GeometryOptions geos[] = {{1, 1, 32, 16}, {3, 5, 64, 8}, {2, 3, 128, 7}};
  for (Format f : kAllFormats) {
    for (const GeometryOptions& g : geos) {
      auto src = NewPool(g, {f, Format::kF16}, 4);
      auto dst = NewPool(g, {f, Format::kF16}, 4);
      const std::vector<TokenId> t = Tokens(3 * g.block_size + 1);  // tail: block 2
      FillBlock(*src, 2, 99 + static_cast<uint64_t>(f));
      const BlockHash compat{5, 6};
      TierBytes obj = Object(*src, 2, compat, t, 2);
      const std::vector<BlockHash> h = HashFullBlocks(t, g.block_size, "");
      ASSERT_EQ(VerifyBlockObject(*obj, compat, h[2], h[1], std::span(t).subspan(2 * g.block_size, g.block_size)),
                std::nullopt);
      ASSERT_TRUE(DecodeBlockObjectInto(*obj, *dst, 3).ok());
      EXPECT_TRUE(SameBlock(*src, 2, *dst, 3)) << FormatName(f);
      // The load path's one pass: the same block.
      ASSERT_EQ(VerifyAndDecodeBlockObject(*obj, compat, h[2], h[1],
                                           std::span(t).subspan(2 * g.block_size, g.block_size), *dst, 0),
                std::nullopt);
      EXPECT_TRUE(SameBlock(*src, 2, *dst, 0)) << FormatName(f);
      // A pool of another geometry refuses it and stays untouched.
      auto other = NewPool({g.n_layers, g.n_kv_heads + 1, g.head_dim, g.block_size}, {f, Format::kF16}, 1);
      EXPECT_FALSE(DecodeBlockObjectInto(*obj, *other, 0).ok());
      EXPECT_EQ(VerifyAndDecodeBlockObject(*obj, compat, h[2], h[1],
                                           std::span(t).subspan(2 * g.block_size, g.block_size), *other, 0),
                TierMiss::kIncompatible);
    }
  }
}

TEST(TierObject, EveryMismatchIsRejectedWithItsReason) {
  auto pool = NewPool({2, 2, 32, 16}, {Format::kBF16, Format::kBF16}, 2);
  FillBlock(*pool, 0, 1);
  const std::vector<TokenId> t = Tokens(32);
  const std::vector<BlockHash> h = HashFullBlocks(t, 16, "");
  const BlockHash compat = CompatDigest(Compat());
  const std::vector<uint8_t> good = *Object(*pool, 0, compat, t, 1);
  const auto block_tokens = std::span(t).subspan(16, 16);
  // VerifyBlockObject, checked against the load path's fused verify+copy
  // (into staging block 1): both give the same answer for every input.
  auto verify = [&](const std::vector<uint8_t>& b) {
    const std::optional<TierMiss> why = VerifyBlockObject(b, compat, h[1], h[0], block_tokens);
    EXPECT_EQ(VerifyAndDecodeBlockObject(b, compat, h[1], h[0], block_tokens, *pool, 1), why);
    return why;
  };
  EXPECT_EQ(verify(good), std::nullopt);
  // Flip one bit anywhere: magic, header fields, tokens, section table, payload.
  for (size_t at : {size_t{0}, size_t{13}, size_t{30}, size_t{130}, size_t{200}, good.size() / 2,
                    good.size() - 1}) {
    std::vector<uint8_t> b = good;
    b[at] ^= 0x10;
    const std::optional<TierMiss> why = verify(b);
    ASSERT_TRUE(why.has_value()) << at;
    EXPECT_EQ(*why, TierMiss::kCorrupt) << at;
  }
  std::vector<uint8_t> truncated(good.begin(), good.end() - 1);
  EXPECT_EQ(verify(truncated), TierMiss::kCorrupt);
  std::vector<uint8_t> grown = good;
  grown.push_back(0);
  EXPECT_EQ(verify(grown), TierMiss::kCorrupt);
  EXPECT_EQ(verify(std::vector<uint8_t>(10, 0)), TierMiss::kCorrupt);
  // Another version: incompatible.
  std::vector<uint8_t> v2 = good;
  v2[4] = 2;
  EXPECT_EQ(verify(v2), TierMiss::kIncompatible);
  // Another compat digest under this key (well-formed): incompatible.
  EXPECT_EQ(VerifyBlockObject(*Object(*pool, 0, {1, 1}, t, 1), compat, h[1], h[0], block_tokens),
            TierMiss::kIncompatible);
  // Poisoning: a well-formed object of the right chain hash that claims other
  // tokens or another parent (a forced collision) is refused.
  std::vector<TokenId> other = t;
  other[20] = 777;
  EXPECT_EQ(VerifyBlockObject(EncodeBlockObject(*pool, 0, compat, h[1], h[0], std::span(other).subspan(16, 16)).value(),
                              compat, h[1], h[0], block_tokens),
            TierMiss::kTokenMismatch);
  EXPECT_EQ(VerifyBlockObject(EncodeBlockObject(*pool, 0, compat, h[1], BlockHash{3, 4}, block_tokens).value(),
                              compat, h[1], h[0], block_tokens),
            TierMiss::kTokenMismatch);
  // Another block's object under this key: corrupt.
  EXPECT_EQ(VerifyBlockObject(*Object(*pool, 0, compat, t, 0), compat, h[1], h[0], block_tokens),
            TierMiss::kCorrupt);
  // Header fields changed and the header checksum recomputed (a writer's bug,
  // not a flipped bit): unknown flags are incompatible; reserved bytes that
  // are not zero and row sizes that are not the formats' own are corrupt.
  auto resealed = [&](size_t at, uint8_t value) { return Resealed(good, at, value); };
  EXPECT_EQ(verify(resealed(0, 'K')), std::nullopt);  // the reseal itself is sound
  EXPECT_EQ(verify(resealed(6, 4)), TierMiss::kIncompatible);
  // The calibration flag without the digest it announces, the sinks flag
  // without its fields and section: sizes disagree.
  EXPECT_EQ(verify(resealed(6, kBlockFlagCalibrated)), TierMiss::kCorrupt);
  EXPECT_EQ(verify(resealed(6, kBlockFlagSinks)), TierMiss::kCorrupt);
  EXPECT_EQ(verify(resealed(90, 1)), TierMiss::kCorrupt);
  EXPECT_EQ(verify(resealed(121, 1)), TierMiss::kCorrupt);
  EXPECT_EQ(verify(resealed(96, good[96] + 2)), TierMiss::kCorrupt);
  EXPECT_EQ(verify(resealed(100, good[100] ^ 0x40)), TierMiss::kCorrupt);
}

// A layer group's block: named in the manifest (so another group, or a
// model without groups, has another digest), in the header (flag and
// fields), verified against the group asked for, and indexed by the tiers
// without a parent when it is a sliding window's (its run needs none).
TEST(TierObject, LayerGroupsAreNamed) {
  BlockCompat plain = Compat(), full = Compat(), window = Compat();
  full.group = LayerGroupTag{LayerGroupKind::kFullAttention, 0};
  window.group = LayerGroupTag{LayerGroupKind::kSlidingWindow, 512};
  EXPECT_EQ(CompatManifest(plain).find("layer_group"), std::string::npos);
  EXPECT_NE(CompatManifest(window).find("layer_group=window:512\n"), std::string::npos);
  EXPECT_NE(CompatManifest(full).find("layer_group=full\n"), std::string::npos);
  EXPECT_FALSE(CompatDigest(plain) == CompatDigest(full));
  EXPECT_FALSE(CompatDigest(full) == CompatDigest(window));
  BlockCompat narrower = window;
  narrower.group->window = 256;
  EXPECT_FALSE(CompatDigest(narrower) == CompatDigest(window));

  auto pool = NewPool({2, 2, 32, 16}, {Format::kBF16, Format::kBF16}, 2);
  FillBlock(*pool, 0, 3);
  const std::vector<TokenId> t = Tokens(32);
  const std::vector<BlockHash> h = HashFullBlocks(t, 16, "");
  const auto block_tokens = std::span(t).subspan(16, 16);
  const BlockHash compat = CompatDigest(window);
  const std::vector<uint8_t> obj =
      EncodeBlockObject(*pool, 0, compat, h[1], h[0], block_tokens, std::nullopt, nullptr, window.group).value();
  Result<BlockObjectInfo> info = ParseBlockObjectHeader(obj, obj.size());
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  ASSERT_TRUE(info->group.has_value());
  EXPECT_EQ(*info->group, *window.group);
  EXPECT_EQ(VerifyBlockObject(obj, compat, h[1], h[0], block_tokens, window.group), std::nullopt);
  EXPECT_EQ(VerifyBlockObject(obj, compat, h[1], h[0], block_tokens), TierMiss::kIncompatible);
  EXPECT_EQ(VerifyBlockObject(obj, compat, h[1], h[0], block_tokens, narrower.group), TierMiss::kIncompatible);
  EXPECT_EQ(VerifyBlockObject(obj, compat, h[1], h[0], block_tokens, full.group), TierMiss::kIncompatible);
  auto dst = NewPool({2, 2, 32, 16}, {Format::kBF16, Format::kBF16}, 1);
  EXPECT_EQ(VerifyAndDecodeBlockObject(obj, compat, h[1], h[0], block_tokens, *dst, 0, nullptr, window.group),
            std::nullopt);
  EXPECT_TRUE(SameBlock(*pool, 0, *dst, 0));
  // The tiers' index: a window block has no parent link, a full group's has.
  Result<StoredObjectHeader> stored = ParseStoredObjectHeader(obj, obj.size());
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->parent_key, "");
  const std::vector<uint8_t> full_obj =
      EncodeBlockObject(*pool, 0, CompatDigest(full), h[1], h[0], block_tokens, std::nullopt, nullptr, full.group)
          .value();
  stored = ParseStoredObjectHeader(full_obj, full_obj.size());
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->parent_key, BlockKey(CompatDigest(full), h[0]));
  // A group that is not whole: refused when encoding, corrupt when read.
  EXPECT_FALSE(EncodeBlockObject(*pool, 0, compat, h[1], h[0], block_tokens, std::nullopt, nullptr,
                                 LayerGroupTag{LayerGroupKind::kSlidingWindow, 0})
                   .ok());
  EXPECT_FALSE(EncodeBlockObject(*pool, 0, compat, h[1], h[0], block_tokens, std::nullopt, nullptr,
                                 LayerGroupTag{LayerGroupKind::kFullAttention, 4})
                   .ok());
  EXPECT_EQ(VerifyBlockObject(Resealed(Resealed(obj, 124, 0), 125, 0), compat, h[1], h[0], block_tokens, window.group),
            TierMiss::kCorrupt);  // a window of 0 positions
  EXPECT_EQ(VerifyBlockObject(Resealed(obj, 120, 7), compat, h[1], h[0], block_tokens, window.group),
            TierMiss::kCorrupt);  // an unknown kind
}

std::vector<std::string> Keys(std::initializer_list<std::string> k) { return k; }

TierPut PutOf(const std::string& key, const std::string& parent, size_t bytes, uint8_t fill = 1) {
  return {key, parent, std::make_shared<const std::vector<uint8_t>>(bytes, fill)};
}

TEST(HostTier, BudgetEvictsTailBeforePrefix) {
  auto tier = NewHostTier({.capacity_bytes = 300});
  // Chain a <- b <- c, stored prefix first (so LRU alone would evict a).
  ASSERT_EQ(tier->Store(std::vector<TierPut>{PutOf("a", "", 100), PutOf("b", "a", 100), PutOf("c", "b", 100)}), 3u);
  ASSERT_EQ(tier->Store(std::vector<TierPut>{PutOf("x", "", 100)}), 1u);
  const auto ex = tier->Exists(Keys({"a", "b", "c", "x"}));
  EXPECT_EQ(ex[0], std::nullopt);
  EXPECT_EQ(ex[1], std::nullopt);
  EXPECT_EQ(ex[2], TierMiss::kEvicted);  // the tail went first
  EXPECT_EQ(ex[3], std::nullopt);
  const auto got = tier->Load(Keys({"a", "zz"}));
  ASSERT_NE(got[0].bytes, nullptr);
  EXPECT_EQ(got[0].bytes->size(), 100u);
  EXPECT_EQ(got[1].miss, TierMiss::kAbsent);
  EXPECT_EQ(tier->Store(std::vector<TierPut>{PutOf("huge", "", 301)}), 0u);
  const TierUsage u = tier->usage();
  EXPECT_EQ(u.bytes, 300u);
  EXPECT_EQ(u.evictions, 1u);
  EXPECT_EQ(u.store_failures, 1u);
}

class DiskTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("kvc_disk_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    pool_ = NewPool({2, 2, 32, 16}, {Format::kBF16, Format::kQ8_0}, 8);
    tokens_ = Tokens(64);
    hashes_ = HashFullBlocks(tokens_, 16, "");
    for (uint32_t b = 0; b < 4; ++b) FillBlock(*pool_, b, 10 + b);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  Result<std::unique_ptr<Tier>> Open(uint64_t cap = 1 << 30) {
    return OpenDiskTier({.path = dir_.string(), .capacity_bytes = cap});
  }
  TierPut Put(size_t i) {
    return {BlockKey(compat_, hashes_[i]), i ? BlockKey(compat_, hashes_[i - 1]) : "",
            Object(*pool_, static_cast<uint32_t>(i), compat_, tokens_, i)};
  }
  std::string Key(size_t i) { return BlockKey(compat_, hashes_[i]); }
  std::filesystem::path FileOf(size_t i) {
    std::error_code ec;
    for (auto it = std::filesystem::recursive_directory_iterator(dir_ / "objects", ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
      if (it->path().filename().string().find(HashHex(hashes_[i])) != std::string::npos) return it->path();
    }
    return {};
  }

  std::filesystem::path dir_;
  std::shared_ptr<BlockPool> pool_;
  std::vector<TokenId> tokens_;
  std::vector<BlockHash> hashes_;
  BlockHash compat_{11, 12};
};

TEST_F(DiskTierTest, StoreLoadAndRestartRebuildsTheIndex) {
  {
    auto tier = std::move(Open()).value();
    std::vector<TierPut> puts = {Put(0), Put(1), Put(2)};
    ASSERT_EQ(tier->Store(puts), 3u);
    const auto got = tier->Load(std::vector<std::string>{Key(1)});
    ASSERT_NE(got[0].bytes, nullptr);
    EXPECT_EQ(*got[0].bytes, *puts[1].bytes);
  }
  auto tier = std::move(Open()).value();
  EXPECT_EQ(tier->usage().recovered_objects, 3u);
  EXPECT_EQ(tier->usage().objects, 3u);
  const auto got = tier->Load(std::vector<std::string>{Key(0), Key(1), Key(2), Key(3)});
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_NE(got[i].bytes, nullptr);
    EXPECT_EQ(VerifyBlockObject(*got[i].bytes, compat_, hashes_[i], i ? hashes_[i - 1] : ChainRoot(""),
                                std::span(tokens_).subspan(i * 16, 16)),
              std::nullopt);
  }
  EXPECT_EQ(got[3].miss, TierMiss::kAbsent);
}

TEST_F(DiskTierTest, BudgetEvictsTailFirstAndSurvivesRestart) {
  const uint64_t obj = Put(0).bytes->size();
  {
    auto tier = std::move(Open(3 * obj)).value();
    std::vector<TierPut> puts = {Put(0), Put(1), Put(2), Put(3)};
    ASSERT_EQ(tier->Store(puts), 4u);
    const auto ex = tier->Exists(std::vector<std::string>{Key(0), Key(1), Key(2), Key(3)});
    // The chain's tail goes first, even though it is the newest object.
    EXPECT_EQ(ex[0], std::nullopt);
    EXPECT_EQ(ex[1], std::nullopt);
    EXPECT_EQ(ex[2], std::nullopt);
    EXPECT_EQ(ex[3], TierMiss::kEvicted);
    EXPECT_EQ(tier->usage().bytes, 3 * obj);
  }
  auto tier = std::move(Open(3 * obj)).value();
  EXPECT_EQ(tier->usage().objects, 3u);
}

TEST_F(DiskTierTest, CorruptTruncatedAndForeignFilesAreDiscardedOnOpen) {
  {
    auto tier = std::move(Open()).value();
    std::vector<TierPut> puts = {Put(0), Put(1), Put(2), Put(3)};
    ASSERT_EQ(tier->Store(puts), 4u);
  }
  // Truncate 1, resize 2; flip a header byte of 3 (a payload flip is only
  // found at load: see the next test).
  std::filesystem::resize_file(FileOf(1), std::filesystem::file_size(FileOf(1)) - 7);
  std::filesystem::resize_file(FileOf(2), std::filesystem::file_size(FileOf(2)) + 5);
  {
    std::fstream f(FileOf(3), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(45);
    f.put('\x7f');
  }
  std::filesystem::create_directories(dir_ / "objects" / "zz");
  std::ofstream(dir_ / "objects" / "zz" / "junk.kvcb") << "not an object";
  auto tier = std::move(Open()).value();
  EXPECT_EQ(tier->usage().recovered_objects, 1u);
  EXPECT_EQ(tier->usage().discarded_files, 4u);
  const auto ex = tier->Exists(std::vector<std::string>{Key(0), Key(1), Key(2), Key(3)});
  EXPECT_EQ(ex[0], std::nullopt);
  for (size_t i = 1; i < 4; ++i) EXPECT_EQ(ex[i], TierMiss::kAbsent) << i;
}

TEST_F(DiskTierTest, PayloadFlipIsFoundByVerification) {
  auto tier = std::move(Open()).value();
  std::vector<TierPut> puts = {Put(0)};
  ASSERT_EQ(tier->Store(puts), 1u);
  {
    std::fstream f(FileOf(0), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(std::filesystem::file_size(FileOf(0)) - 3));
    f.put('\x01');
  }
  const auto got = tier->Load(std::vector<std::string>{Key(0)});
  ASSERT_NE(got[0].bytes, nullptr);
  EXPECT_EQ(VerifyBlockObject(*got[0].bytes, compat_, hashes_[0], ChainRoot(""), std::span(tokens_).first(16)),
            TierMiss::kCorrupt);
}

// A disk that refuses writes (here: the temporary folder replaced by a
// file, as a full or read-only disk fails the open): the put is refused and
// counted, nothing half-written is indexed, and loads are misses.
TEST_F(DiskTierTest, AFailingDiskRefusesPutsAndCountsThem) {
  auto tier = std::move(Open()).value();
  std::filesystem::remove_all(dir_ / "tmp");
  std::ofstream(dir_ / "tmp") << "in the way";
  std::vector<TierPut> puts = {Put(0), Put(1)};
  EXPECT_EQ(tier->Store(puts), 0u);
  EXPECT_EQ(tier->usage().store_failures, 2u);
  EXPECT_EQ(tier->usage().objects, 0u);
  EXPECT_EQ(tier->Load(std::vector<std::string>{Key(0)})[0].miss, TierMiss::kAbsent);
  std::filesystem::remove(dir_ / "tmp");
}

// A writer killed in the middle of its stores leaves temporaries at most:
// the reopened tier deletes them and serves only whole objects.
TEST_F(DiskTierTest, WriterKilledMidStoreLeavesNoTornObject) {
  const uint64_t obj = Put(0).bytes->size();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto tier = OpenDiskTier({.path = dir_.string(), .capacity_bytes = 1 << 30, .fsync = false});
    if (!tier.ok()) _exit(2);
    for (uint64_t round = 0; round < 100000; ++round) {  // bounded; killed long before
      std::vector<TierPut> puts = {Put(round % 4)};
      (*tier)->Store(puts);
    }
    _exit(0);
  }
  // Also plant a torn temporary as a crashed writer would (a dead pid).
  std::filesystem::create_directories(dir_ / "tmp");
  std::ofstream(dir_ / "tmp" / "999999999-0.tmp") << "half";
  for (int i = 0; i < 400 && FileOf(0).empty(); ++i) ::usleep(5000);
  ::usleep(20000);
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  auto tier = std::move(Open()).value();
  EXPECT_GE(tier->usage().recovered_objects, 1u);
  EXPECT_EQ(tier->usage().bytes, tier->usage().objects * obj);
  EXPECT_TRUE(std::filesystem::is_empty(dir_ / "tmp"));
  const auto got = tier->Load(std::vector<std::string>{Key(0), Key(1), Key(2), Key(3)});
  for (size_t i = 0; i < 4; ++i) {
    if (got[i].bytes == nullptr) continue;
    EXPECT_EQ(VerifyBlockObject(*got[i].bytes, compat_, hashes_[i], i ? hashes_[i - 1] : ChainRoot(""),
                                std::span(tokens_).subspan(i * 16, 16)),
              std::nullopt);
  }
}

}  // namespace
}  // namespace kvcache
