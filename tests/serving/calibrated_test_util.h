// Helpers for the tests of calibrated formats through the tiers: a
// "process" (its own pool, prefix cache and OffloadCache over given tiers),
// K/V rows whose channels have offsets (so that q8 and turbo formats
// calibrate a mean, and q8 keys column scales), and the round trip every
// tier test runs: a paged sequence published in one process is adopted in
// another and decodes bit-identically, with the same calibration.
// Single-threaded helpers; fixed seeds.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kvcache/cache.h"
#include "kvcache/serving/offload.h"
#include "serving/tier_test_util.h"

namespace kvcache::caltest {

inline constexpr GeometryOptions kCalGeo{2, 2, 64, 16};

struct Process {
  std::shared_ptr<BlockPool> pool;
  std::unique_ptr<PrefixCache> cache;
  std::unique_ptr<OffloadCache> off;
  Process(std::vector<std::shared_ptr<Tier>> tiers, FormatPair f,
          std::shared_ptr<const Calibration> calibration = nullptr) {
    pool = tiertest::NewPool(kCalGeo, f, 40);
    cache = std::move(PrefixCache::Create(pool)).value();
    OffloadOptions o;
    o.model = "calibrated";
    o.calibration = std::move(calibration);
    off = std::move(OffloadCache::Create(pool, cache.get(), std::move(tiers), o)).value();
  }
};

// Rows of `n` positions: channel c of head h carries an offset (a function
// of c, h, the layer and `seed`) plus noise from `seed`.
inline Status AppendCalibratedRows(SequenceCache& seq, size_t n, uint64_t seed) {
  const uint32_t L = kCalGeo.n_layers, H = kCalGeo.n_kv_heads, D = kCalGeo.head_dim;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> noise(0.0f, 0.3f);
  std::vector<float> k(size_t{L} * n * H * D), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    const size_t c = i % D, h = i / D % H, l = i / (n * H * D);
    const float offset = static_cast<float>((c * 7 + h * 3 + l + seed) % 11) * 0.4f - 2.0f;
    k[i] = offset + noise(rng) * (1.0f + static_cast<float>(c % 5));
    v[i] = -0.5f * offset + noise(rng);
  }
  return seq.Append(k, v);
}

// Some transform of `c` is not empty (the formats did calibrate).
inline bool Calibrated(const Calibration* c) {
  return c != nullptr && std::any_of(c->transforms.begin(), c->transforms.end(),
                                     [](const RowTransform& t) { return !t.empty(); });
}

// Every layer's and head's decoded rows of positions [0, n) are the same
// floats, bit for bit, in a and b.
inline void ExpectBitIdenticalRows(const SequenceCache& a, const SequenceCache& b, uint32_t n) {
  const size_t D = kCalGeo.head_dim;
  for (uint32_t l = 0; l < kCalGeo.n_layers; ++l) {
    for (uint32_t h = 0; h < kCalGeo.n_kv_heads; ++h) {
      for (int side = 0; side < 2; ++side) {
        const std::vector<float> ra = side ? a.HeadValues(l, h).value() : a.HeadKeys(l, h).value();
        const std::vector<float> rb = side ? b.HeadValues(l, h).value() : b.HeadKeys(l, h).value();
        ASSERT_GE(ra.size(), n * D);
        ASSERT_GE(rb.size(), n * D);
        EXPECT_EQ(std::memcmp(ra.data(), rb.data(), n * D * sizeof(float)), 0)
            << "layer " << l << " head " << h << " side " << side;
      }
    }
  }
}

// A paged sequence of 4 full blocks + 5 tokens in `format` is published in a
// process over tiers_for(0), flushed, then adopted in a fresh process over
// tiers_for(1): 64 tokens from the tiers, the same calibration (digest and
// values), the same pool bytes per block, bit-identical decoded rows.
inline void ExpectRoundTrip(FormatPair format,
                            const std::function<std::vector<std::shared_ptr<Tier>>(int)>& tiers_for,
                            uint64_t seed = 7) {
  const std::vector<TokenId> t = tiertest::Tokens(16 * 4 + 5, 100 + static_cast<TokenId>(seed));
  Process a(tiers_for(0), format);
  SequenceCache sa = SequenceCache::CreatePaged(a.pool).value();
  ASSERT_TRUE(AppendCalibratedRows(sa, t.size(), seed).ok());
  ASSERT_TRUE(Calibrated(sa.calibration().get())) << FormatName(format.k);
  ASSERT_EQ(a.off->PublishSequence(&sa, t, "").value(), 4u);
  a.off->Flush();
  EXPECT_EQ(a.off->stats().tiers[0].stored_blocks, 4u);

  Process b(tiers_for(1), format);
  SequenceCache sb = SequenceCache::CreatePaged(b.pool).value();
  std::vector<uint64_t> served;
  ASSERT_EQ(b.off->AdoptInto(&sb, t, "", &served).value(), 64u) << FormatName(format.k);
  EXPECT_EQ(served[0], 0u);
  ASSERT_NE(sb.calibration(), nullptr);
  EXPECT_EQ(CalibrationDigest(*sb.calibration()), CalibrationDigest(*sa.calibration()));
  EXPECT_TRUE(sb.calibration()->transforms == sa.calibration()->transforms);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(tiertest::SameBlock(*a.pool, sa.block_table()[i], *b.pool, sb.block_table()[i])) << i;
  }
  ExpectBitIdenticalRows(sa, sb, 64);
  const TierStats s = b.off->stats().tiers[0];
  EXPECT_EQ(s.hit_blocks, 4u);
  EXPECT_EQ(s.misses[static_cast<size_t>(TierMiss::kCorrupt)], 0u);
  EXPECT_EQ(s.misses[static_cast<size_t>(TierMiss::kIncompatible)], 0u);
  sb.Release();
  sa.Release();
  EXPECT_TRUE(a.pool->CheckInvariants().ok());
  EXPECT_TRUE(b.pool->CheckInvariants().ok());
}

inline std::vector<FormatPair> CalibratedFormats() {
  return {{Format::kTurbo4, Format::kTurbo4},
          {Format::kTurbo3, Format::kTurbo3},
          {Format::kQ8, Format::kQ8},
          {Format::kTurbo8, Format::kTurbo8},
          {Format::kQ8, Format::kTurbo4}};
}

}  // namespace kvcache::caltest
