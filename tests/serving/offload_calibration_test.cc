// Calibrated formats (q8, turbo*) through the tiers: a sequence's blocks and
// its calibration written by one process are adopted by another and decode
// bit-identically (disk folder, shared host tier; Redis is in
// tier_redis_test.cc); the calibration object (encode, verify, each
// rejection's reason); every way a calibration can be missing, bad or
// disagree is a counted miss that adopts and changes nothing; unflagged
// objects still carry the compatibility digest's calibration; a calibration
// object is not evicted while a block names it; threads publishing and
// adopting calibrated chains at once through one OffloadCache.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>
#include <utility>

#include "serving/calibrated_test_util.h"

namespace kvcache {
namespace {

using namespace caltest;
using namespace tiertest;

constexpr FormatPair kTurbo4{Format::kTurbo4, Format::kTurbo4};

size_t Misses(const OffloadCache& off, TierMiss why, size_t tier = 0) {
  return off.stats().tiers[tier].misses[static_cast<size_t>(why)];
}

std::string TempDir(const std::string& name) {
  const std::string dir = "/tmp/kvc_cal_" + name + "_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  return dir;
}

// The calibration of a turbo4 sequence of `n` rows from `seed` (a real one:
// what the codecs computed).
std::shared_ptr<const Calibration> RealCalibration(uint64_t seed) {
  Process p({}, kTurbo4);
  SequenceCache s = SequenceCache::CreatePaged(p.pool).value();
  EXPECT_TRUE(AppendCalibratedRows(s, 40, seed).ok());
  return s.calibration();
}

TEST(OffloadCalibration, EveryCalibratedFormatRoundTripsThroughOneDiskFolder) {
  for (const FormatPair f : CalibratedFormats()) {
    const std::string dir = TempDir("disk");
    // Two processes: each opens the folder itself (the second rebuilds its
    // index from the files, calibration object included).
    ExpectRoundTrip(f, [&](int) {
      return std::vector<std::shared_ptr<Tier>>{std::move(OpenDiskTier({.path = dir})).value()};
    });
    std::shared_ptr<Tier> reopened = std::move(OpenDiskTier({.path = dir})).value();
    EXPECT_EQ(reopened->usage().recovered_objects, 5u) << FormatName(f.k);  // 4 blocks + 1 calibration
    EXPECT_EQ(reopened->usage().discarded_files, 0u);
    std::filesystem::remove_all(dir);
  }
}

TEST(OffloadCalibration, EveryCalibratedFormatRoundTripsThroughASharedHostTier) {
  for (const FormatPair f : CalibratedFormats()) {
    std::shared_ptr<Tier> host = NewHostTier({});
    ExpectRoundTrip(f, [&](int) { return std::vector<std::shared_ptr<Tier>>{host}; });
    EXPECT_EQ(host->usage().objects, 5u);
  }
}

TEST(OffloadCalibration, ObjectEncodesVerifiesAndRejectsWithReasons) {
  const std::shared_ptr<const Calibration> cal = RealCalibration(3);
  ASSERT_TRUE(Calibrated(cal.get()));
  const BlockHash compat{5, 6}, digest = CalibrationDigest(*cal);
  const std::vector<uint8_t> good = EncodeCalibrationObject(*cal, kCalGeo, compat).value();
  auto decode = [&](const std::vector<uint8_t>& b, const BlockHash& c = {5, 6},
                    GeometryOptions g = kCalGeo) { return DecodeCalibrationObject(b, c, digest, g); };
  const CalibrationLoad ok = decode(good);
  ASSERT_NE(ok.calibration, nullptr);
  EXPECT_TRUE(ok.calibration->transforms == cal->transforms);
  EXPECT_EQ(ParseStoredObjectHeader(good, good.size()).value().key, CalibrationKey(compat, digest));
  EXPECT_EQ(CalibrationKey(compat, digest).rfind("kvcal1:", 0), 0u);
  // A flipped bit anywhere (header, lengths, floats), truncation, growth.
  for (size_t at : {size_t{0}, size_t{13}, size_t{45}, size_t{130}, good.size() / 2, good.size() - 1}) {
    std::vector<uint8_t> b = good;
    b[at] ^= 0x08;
    EXPECT_EQ(decode(b).calibration, nullptr) << at;
    EXPECT_EQ(decode(b).miss, TierMiss::kCorrupt) << at;
  }
  EXPECT_EQ(decode(std::vector<uint8_t>(good.begin(), good.end() - 4)).miss, TierMiss::kCorrupt);
  std::vector<uint8_t> grown = good;
  grown.insert(grown.end(), 4, 0);
  EXPECT_EQ(decode(grown).miss, TierMiss::kCorrupt);
  // Another compat digest, another geometry: incompatible.
  EXPECT_EQ(decode(good, {7, 8}).miss, TierMiss::kIncompatible);
  EXPECT_EQ(decode(good, {5, 6}, {2, 2, 32, 16}).miss, TierMiss::kIncompatible);
  // Another calibration under this digest's key: corrupt.
  const std::shared_ptr<const Calibration> other = RealCalibration(4);
  EXPECT_EQ(decode(EncodeCalibrationObject(*other, kCalGeo, compat).value()).miss, TierMiss::kCorrupt);
  // Another version, resealed: incompatible; a float changed and the header
  // resealed: the recomputed digest refuses it.
  auto resealed = [&](size_t at, uint8_t value) { return Resealed(good, at, value); };
  EXPECT_NE(decode(resealed(0, 'K')).calibration, nullptr);  // the reseal itself is sound
  EXPECT_EQ(decode(resealed(4, 2)).miss, TierMiss::kIncompatible);
  EXPECT_EQ(decode(resealed(80, 1)).miss, TierMiss::kCorrupt);
  std::vector<uint8_t> b = good;
  b[b.size() - 2] ^= 0x01;
  EXPECT_EQ(decode(b).miss, TierMiss::kCorrupt);
  // What cannot be stored is refused with InvalidArgument.
  Calibration wrong = *cal;
  wrong.transforms.pop_back();
  EXPECT_EQ(EncodeCalibrationObject(wrong, kCalGeo, compat).status().code(), StatusCode::kInvalidArgument);
  wrong = *cal;
  wrong.transforms[0].col_scale.assign(kCalGeo.head_dim, 0.0f);
  EXPECT_EQ(CheckCalibration(wrong, kCalGeo).code(), StatusCode::kInvalidArgument);
  wrong = *cal;
  wrong.transforms[1].mean.assign(3, 1.0f);
  EXPECT_EQ(CheckCalibration(wrong, kCalGeo).code(), StatusCode::kInvalidArgument);
}

// A stored calibrated chain, then one thing wrong with its calibration
// object in the tier: a fresh process adopts nothing, counts the reason,
// leaves the sequence and the pool as they were, and erases what failed.
class CalibrationFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    host_ = NewHostTier({});
    t_ = Tokens(16 * 3 + 2, 500);
    Process a({host_}, kTurbo4);
    SequenceCache sa = SequenceCache::CreatePaged(a.pool).value();
    ASSERT_TRUE(AppendCalibratedRows(sa, t_.size(), 11).ok());
    ASSERT_EQ(a.off->PublishSequence(&sa, t_, "").value(), 3u);
    a.off->Flush();
    compat_ = a.off->compat_digest();
    cal_digest_ = CalibrationDigest(*sa.calibration());
    cal_key_ = CalibrationKey(compat_, cal_digest_);
    const std::vector<BlockHash> h = HashFullBlocks(t_, 16, "");
    for (const BlockHash& x : h) block_keys_.push_back(BlockKey(compat_, x));
    ASSERT_EQ(host_->usage().objects, 4u);
    ASSERT_FALSE(host_->Exists(std::vector<std::string>{cal_key_})[0].has_value());
    sa.Release();
  }
  // A fresh process's adoption: nothing adopted, nothing changed.
  void ExpectNothingAdopted(Process& b) {
    SequenceCache sb = SequenceCache::CreatePaged(b.pool).value();
    EXPECT_EQ(b.off->AdoptInto(&sb, t_, "").value(), 0u);
    EXPECT_EQ(sb.num_tokens(), 0u);
    EXPECT_EQ(sb.calibration(), nullptr);
    EXPECT_EQ(b.pool->stats().used_blocks, 0u);
    EXPECT_EQ(b.pool->stats().cached_blocks, 0u);
    EXPECT_EQ(b.off->stats().tiers[0].hit_blocks, 0u);
    EXPECT_TRUE(b.pool->CheckInvariants().ok());
  }
  void Replace(const std::string& key, std::vector<uint8_t> bytes) {
    host_->Store(std::vector<TierPut>{{key, "", std::make_shared<const std::vector<uint8_t>>(std::move(bytes))}});
  }
  bool Held(const std::string& key) { return !host_->Exists(std::vector<std::string>{key})[0].has_value(); }

  std::shared_ptr<Tier> host_;
  std::vector<TokenId> t_;
  BlockHash compat_, cal_digest_;
  std::string cal_key_;
  std::vector<std::string> block_keys_;
};

TEST_F(CalibrationFaults, AMissingCalibrationObjectIsAnIncompatibleMiss) {
  host_->Erase(std::vector<std::string>{cal_key_});
  Process b({host_}, kTurbo4);
  ExpectNothingAdopted(b);
  EXPECT_EQ(Misses(*b.off, TierMiss::kIncompatible), 3u);  // each block that names it
  for (const std::string& k : block_keys_) EXPECT_FALSE(Held(k)) << k;  // undecodable: erased
}

TEST_F(CalibrationFaults, ACorruptCalibrationObjectIsACorruptMiss) {
  auto got = host_->Load(std::vector<std::string>{cal_key_});
  std::vector<uint8_t> bad(got[0].bytes->begin(), got[0].bytes->end());
  bad[bad.size() - 3] ^= 0x40;  // a float: the recomputed digest differs
  Replace(cal_key_, bad);
  Process b({host_}, kTurbo4);
  ExpectNothingAdopted(b);
  EXPECT_EQ(Misses(*b.off, TierMiss::kCorrupt), 1u + 3u);  // the object, then each block
  EXPECT_FALSE(Held(cal_key_));
}

TEST_F(CalibrationFaults, ACalibrationOfAnotherGeometryIsAnIncompatibleMiss) {
  // Well-formed, of another geometry, under this key.
  const std::shared_ptr<const Calibration> cal = RealCalibration(11);
  Calibration narrow;
  for (const RowTransform& x : cal->transforms) {
    RowTransform y;
    if (!x.mean.empty()) y.mean.assign(x.mean.begin(), x.mean.begin() + 32);
    narrow.transforms.push_back(y);
  }
  std::vector<uint8_t> obj = EncodeCalibrationObject(narrow, {2, 2, 32, 16}, compat_).value();
  // The header names this key's digest (resealed): only the geometry differs.
  const BlockHash want = cal_digest_;
  std::memcpy(obj.data() + 40, &want.lo, 8);
  std::memcpy(obj.data() + 48, &want.hi, 8);
  obj = Resealed(std::move(obj), 0, 'K');
  ASSERT_EQ(CalibrationKey(compat_, want), cal_key_);
  Replace(cal_key_, obj);
  Process b({host_}, kTurbo4);
  ExpectNothingAdopted(b);
  EXPECT_EQ(Misses(*b.off, TierMiss::kIncompatible), 1u + 3u);
}

TEST_F(CalibrationFaults, ABlockNamingAnotherCalibrationThanItsPrefixEndsThePrefix) {
  // Block 2 replaced by the same block of a sequence with other rows (another
  // calibration, stored too): blocks 0 and 1 are adopted, with theirs.
  Process c({host_}, kTurbo4);
  SequenceCache sc = SequenceCache::CreatePaged(c.pool).value();
  ASSERT_TRUE(AppendCalibratedRows(sc, t_.size(), 12).ok());
  ASSERT_EQ(c.off->PublishSequence(&sc, t_, "").value(), 3u);
  c.off->Flush();  // stores only its calibration: the tier holds its blocks' keys
  const std::string other_cal = CalibrationKey(compat_, CalibrationDigest(*sc.calibration()));
  ASSERT_TRUE(Held(other_cal));
  const std::vector<BlockHash> h = HashFullBlocks(t_, 16, "");
  Replace(block_keys_[2], EncodeBlockObject(*c.pool, sc.block_table()[2], compat_, h[2], h[1],
                                            std::span(t_).subspan(32, 16), CalibrationDigest(*sc.calibration()))
                              .value());
  Process b({host_}, kTurbo4);
  SequenceCache sb = SequenceCache::CreatePaged(b.pool).value();
  EXPECT_EQ(b.off->AdoptInto(&sb, t_, "").value(), 32u);
  ASSERT_NE(sb.calibration(), nullptr);
  EXPECT_EQ(CalibrationKey(compat_, CalibrationDigest(*sb.calibration())), cal_key_);
  EXPECT_EQ(Misses(*b.off, TierMiss::kIncompatible), 1u);
  EXPECT_TRUE(Held(block_keys_[2]));  // a disagreement, not a bad object: kept
  // The pool now holds blocks 0, 1 with their calibration: a lookup that
  // continues from them into block 2 (other calibration) stops there too.
  sb.Release();
  SequenceCache again = SequenceCache::CreatePaged(b.pool).value();
  std::vector<uint64_t> served;
  EXPECT_EQ(b.off->AdoptInto(&again, t_, "", &served).value(), 32u);
  EXPECT_EQ(served, (std::vector<uint64_t>{32, 0}));
  EXPECT_EQ(Misses(*b.off, TierMiss::kIncompatible), 2u);
  again.Release();
  sc.Release();
  EXPECT_TRUE(b.pool->CheckInvariants().ok());
}

TEST_F(CalibrationFaults, AnUnreachableCalibrationKeepsTheBlocks) {
  // Only the calibration is in a tier that answers nothing: a transport
  // miss, counted once; no block is erased.
  class Down final : public Tier {
   public:
    std::string name() const override { return "down"; }
    std::vector<std::optional<TierMiss>> Exists(std::span<const std::string> k) override {
      return std::vector<std::optional<TierMiss>>(k.size(), TierMiss::kUnavailable);
    }
    std::vector<TierGet> Load(std::span<const std::string> k) override {
      return std::vector<TierGet>(k.size(), TierGet{nullptr, TierMiss::kUnavailable});
    }
    size_t Store(std::span<const TierPut>) override { return 0; }
    void Erase(std::span<const std::string>) override {}
    TierUsage usage() const override { return {}; }
  };
  host_->Erase(std::vector<std::string>{cal_key_});
  Process b({host_, std::make_shared<Down>()}, kTurbo4);
  ExpectNothingAdopted(b);
  EXPECT_EQ(Misses(*b.off, TierMiss::kUnavailable), 1u);
  for (const std::string& k : block_keys_) EXPECT_TRUE(Held(k)) << k;
}

// With OffloadOptions::calibration, a chain carrying that calibration is
// stored in the unflagged layout (what this library wrote before blocks
// named their calibration), and loads with it; another chain names its own.
TEST(OffloadCalibration, UnflaggedObjectsCarryTheCompatibilityDigestsCalibration) {
  std::shared_ptr<Tier> host = NewHostTier({});
  const std::vector<TokenId> t = Tokens(16 * 2, 900);
  Process first({}, kTurbo4);
  SequenceCache s0 = SequenceCache::CreatePaged(first.pool).value();
  ASSERT_TRUE(AppendCalibratedRows(s0, t.size(), 21).ok());
  const std::shared_ptr<const Calibration> common = s0.calibration();
  Process a({host}, kTurbo4, common);
  SequenceCache sa = SequenceCache::CreatePaged(a.pool).value();
  ASSERT_TRUE(AppendCalibratedRows(sa, t.size(), 21).ok());
  ASSERT_TRUE(sa.calibration()->transforms == common->transforms);
  ASSERT_EQ(a.off->PublishSequence(&sa, t, "").value(), 2u);
  a.off->Flush();
  const BlockHash compat = a.off->compat_digest();
  const std::vector<BlockHash> h = HashFullBlocks(t, 16, "");
  auto got = host->Load(std::vector<std::string>{BlockKey(compat, h[0])});
  ASSERT_NE(got[0].bytes, nullptr);
  const BlockObjectInfo info = ParseBlockObjectHeader(std::span(got[0].bytes->data(), got[0].bytes->size()),
                                                      got[0].bytes->size())
                                   .value();
  EXPECT_FALSE(info.calibrated);
  EXPECT_EQ(got[0].bytes->data()[6], 0);  // flags
  EXPECT_EQ(info.header_bytes, 128u + 4 * 16 + 32 * kCalGeo.n_layers);
  EXPECT_EQ(host->usage().objects, 2u);  // no calibration object
  Process b({host}, kTurbo4, common);
  SequenceCache sb = SequenceCache::CreatePaged(b.pool).value();
  EXPECT_EQ(b.off->AdoptInto(&sb, t, "").value(), 32u);
  ASSERT_NE(sb.calibration(), nullptr);
  EXPECT_TRUE(sb.calibration()->transforms == common->transforms);
  ExpectBitIdenticalRows(sa, sb, 32);
  // A process without that calibration has another compat digest: absent.
  Process other({host}, kTurbo4);
  SequenceCache so = SequenceCache::CreatePaged(other.pool).value();
  EXPECT_EQ(other.off->AdoptInto(&so, t, "").value(), 0u);
  sb.Release();
  sa.Release();
}

TEST(OffloadCalibration, PublishRefusesACalibrationOfAnotherGeometry) {
  Process a({NewHostTier({})}, kTurbo4);
  const std::vector<TokenId> t = Tokens(32);
  std::vector<uint32_t> blocks(2);
  ASSERT_TRUE(a.pool->Allocate(blocks).ok());
  auto bad = std::make_shared<Calibration>();
  bad->transforms.resize(3);
  EXPECT_EQ(a.off->Publish(HashFullBlocks(t, 16, ""), blocks, 0, t, "", bad).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(a.cache->num_cached_blocks(), 0u);
  EXPECT_EQ(a.off->stats().queued_blocks, 0u);
  std::reverse(blocks.begin(), blocks.end());
  ASSERT_TRUE(a.pool->Release(blocks).ok());
}

// Host LRU: the calibration object is the least recently used, but two
// stored blocks name it, so the chain's tail goes first.
TEST(OffloadCalibration, ACalibrationObjectOutlivesTheBlocksThatNameIt) {
  std::shared_ptr<Tier> host = NewHostTier({.capacity_bytes = 300});
  auto bytes = std::make_shared<const std::vector<uint8_t>>(100, 1);
  ASSERT_EQ(host->Store(std::vector<TierPut>{{"cal", "", bytes}}), 1u);
  ASSERT_EQ(host->Store(std::vector<TierPut>{{"a", "", bytes, "cal"}, {"b", "a", bytes, "cal"}}), 2u);
  ASSERT_EQ(host->Store(std::vector<TierPut>{{"x", "", bytes}}), 1u);
  const auto have = host->Exists(std::vector<std::string>{"cal", "a", "b", "x"});
  EXPECT_FALSE(have[0].has_value());
  EXPECT_FALSE(have[1].has_value());
  EXPECT_EQ(have[2], TierMiss::kEvicted);
  EXPECT_FALSE(have[3].has_value());
  // Once no block names it, it is evicted like any other object.
  host->Erase(std::vector<std::string>{"a"});
  ASSERT_EQ(host->Store(std::vector<TierPut>{{"y", "", bytes}, {"z", "", bytes}}), 2u);
  EXPECT_EQ(host->Exists(std::vector<std::string>{"cal"})[0], TierMiss::kEvicted);
}

// A lookup that misses the pool just before a publish lands, then finds the
// tier holding only the chain's first block, takes the pool's whole chain:
// the tier answers Exists and only then the chain is published, as if by
// another thread between the pool's answer and the tier's.
TEST(OffloadCalibration, ALookupThatRacedAPublishTakesThePoolsWholeChain) {
  constexpr size_t kRows = 2 * kCalGeo.block_size;
  const std::vector<TokenId> t = Tokens(kRows, 700);
  std::shared_ptr<Tier> host = NewHostTier({});
  {  // Another process leaves the chain's first block (and its calibration) in the tier.
    Process x({host}, kTurbo4);
    SequenceCache sx = SequenceCache::CreatePaged(x.pool).value();
    ASSERT_TRUE(AppendCalibratedRows(sx, kRows, 60).ok());
    ASSERT_EQ(x.off->PublishSequence(&sx, std::span(t).first(kCalGeo.block_size), "").value(), 1u);
    x.off->Flush();
  }
  ASSERT_EQ(host->usage().objects, 2u);
  class PublishAfterExists final : public Tier {
   public:
    explicit PublishAfterExists(std::shared_ptr<Tier> inner) : inner_(std::move(inner)) {}
    std::function<void()> hook;
    std::string name() const override { return "publish-after-exists"; }
    std::vector<std::optional<TierMiss>> Exists(std::span<const std::string> k) override {
      std::vector<std::optional<TierMiss>> got = inner_->Exists(k);
      if (hook) std::exchange(hook, nullptr)();
      return got;
    }
    std::vector<TierGet> Load(std::span<const std::string> k) override { return inner_->Load(k); }
    size_t Store(std::span<const TierPut> p) override { return inner_->Store(p); }
    void Erase(std::span<const std::string> k) override { inner_->Erase(k); }
    TierUsage usage() const override { return inner_->usage(); }

   private:
    std::shared_ptr<Tier> inner_;
  };
  auto racing = std::make_shared<PublishAfterExists>(host);
  Process p({racing}, kTurbo4);
  SequenceCache owner = SequenceCache::CreatePaged(p.pool).value();
  ASSERT_TRUE(AppendCalibratedRows(owner, kRows, 60).ok());
  racing->hook = [&] { ASSERT_EQ(p.off->PublishSequence(&owner, t, "").value(), 2u); };
  SequenceCache s = SequenceCache::CreatePaged(p.pool).value();
  std::vector<uint64_t> served;
  EXPECT_EQ(p.off->AdoptInto(&s, t, "", &served).value(), kRows);
  EXPECT_FALSE(racing->hook);  // the publish ran inside the lookup
  EXPECT_EQ(served, (std::vector<uint64_t>{kRows, 0}));
  const std::span<const uint32_t> mine = s.block_table(), theirs = owner.block_table();
  EXPECT_TRUE(std::ranges::equal(mine, theirs));  // the pool's blocks, not staged copies
  EXPECT_EQ(p.off->stats().tiers[0].hit_blocks, 0u);
  EXPECT_EQ(p.cache->stats().lookups, 2u);  // asked again
  ExpectBitIdenticalRows(owner, s, static_cast<uint32_t>(kRows));
  p.off->Flush();
  s.Release();
  owner.Release();
  EXPECT_TRUE(p.pool->CheckInvariants().ok());
  EXPECT_EQ(p.pool->num_available_blocks(), p.pool->num_blocks());
}

// Four threads, one OffloadCache over a host tier: each publishes its own
// calibrated chain (its rows, its calibration), then all adopt every chain
// over and over (the pool is the first answer, the tier after the pool lets
// blocks go). Every adoption finds the whole chain or nothing (a lookup
// that missed the pool and then found the tier holding part of the chain
// takes the pool's whole chain, published before any of it reached the
// tier) and decodes to the publisher's rows with the publisher's
// calibration. (Runs under TSan: the serving label.)
TEST(OffloadCalibration, ThreadsPublishingAndAdoptingCalibratedChains) {
  constexpr int kThreads = 4;
  constexpr size_t kRows = 2 * kCalGeo.block_size;  // each chain: 2 blocks
  std::shared_ptr<Tier> host = NewHostTier({});
  Process p({host}, kTurbo4);
  std::vector<std::vector<TokenId>> prompts;
  std::vector<std::unique_ptr<SequenceCache>> owners;
  for (int i = 0; i < kThreads; ++i) {
    prompts.push_back(Tokens(kRows, 1000 * (i + 1)));
    owners.push_back(std::make_unique<SequenceCache>(SequenceCache::CreatePaged(p.pool).value()));
    ASSERT_TRUE(AppendCalibratedRows(*owners[i], kRows, 40 + i).ok());
  }
  std::vector<std::thread> threads;
  std::vector<int> failures(kThreads, 0);
  std::vector<int> found(kThreads, 0);  // adoptions that found blocks
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      if (!p.off->PublishSequence(owners[i].get(), prompts[i], "").ok()) ++failures[i];
      for (int round = 0; round < 6; ++round) {
        const int c = (i + round) % kThreads;
        SequenceCache s = SequenceCache::CreatePaged(p.pool).value();
        const Result<size_t> got = p.off->AdoptInto(&s, prompts[c], "");
        if (!got.ok()) {
          ++failures[i];
          continue;
        }
        if (*got == 0) continue;  // not published yet by its thread
        if (*got != kRows || s.num_tokens() != *got ||
            s.calibration() == nullptr ||
            !(s.calibration()->transforms == owners[c]->calibration()->transforms)) {
          ++failures[i];
          continue;
        }
        ++found[i];
        for (uint32_t l = 0; l < kCalGeo.n_layers; ++l) {
          for (uint32_t h = 0; h < kCalGeo.n_kv_heads; ++h) {
            // The publisher's rows.
            const std::vector<float> want = owners[c]->HeadKeys(l, h).value();
            const std::vector<float> have = s.HeadKeys(l, h).value();
            if (have.size() != *got * kCalGeo.head_dim ||
                !std::equal(have.begin(), have.end(), want.begin())) {
              ++failures[i];
            }
          }
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  p.off->Flush();
  for (int i = 0; i < kThreads; ++i) EXPECT_EQ(failures[i], 0) << i;
  // Each thread adopts its own chain first, after publishing it: found.
  for (int i = 0; i < kThreads; ++i) EXPECT_GE(found[i], 1) << i;
  EXPECT_EQ(host->usage().objects, size_t{kThreads} * (kRows / kCalGeo.block_size + 1));  // + its calibration
  owners.clear();
  EXPECT_TRUE(p.pool->CheckInvariants().ok());
}

}  // namespace
}  // namespace kvcache
