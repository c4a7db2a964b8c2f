// Eviction policy selection against brute force: a step-by-step simulation
// for the window policy, exhaustive subset search for heavy hitters, and the
// documented tie rule.
#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "kvcache/eviction.h"

namespace kvcache {
namespace {

std::vector<uint32_t> All(uint32_t n) {
  std::vector<uint32_t> v(n);
  for (uint32_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

TEST(Eviction, KeepAllAndDeadHead) {
  EXPECT_EQ(*SelectRows(EvictionPolicy::KeepAll(), 7), All(7));
  EXPECT_TRUE(SelectRows(EvictionPolicy::DeadHead(), 7)->empty());
  EXPECT_TRUE(SelectRows(EvictionPolicy::KeepAll(), 0)->empty());
  EXPECT_EQ(EvictionPolicy::DeadHead().budget(), 0u);
}

// StreamingLLM selection equals appending rows one at a time and, whenever
// more than sink + window are held, dropping the oldest non-sink row.
TEST(Eviction, WindowEqualsStepByStepSimulation) {
  for (uint32_t sink = 0; sink <= 4; ++sink) {
    for (uint32_t window = 1; window <= 6; ++window) {
      std::vector<uint32_t> held;
      for (uint32_t n = 1; n <= 40; ++n) {
        held.push_back(n - 1);
        if (held.size() > sink + window) held.erase(held.begin() + sink);
        auto got = SelectRows(EvictionPolicy::Window(sink, window), n);
        ASSERT_TRUE(got.ok());
        ASSERT_EQ(*got, held) << "sink=" << sink << " window=" << window << " n=" << n;
      }
    }
  }
}

// Brute force for heavy hitters: among rows outside the sinks and the recent
// window, every subset of size `heavy` is tried; the chosen one must have the
// largest total mass, and when masses tie it must be the documented choice
// (row r is kept iff fewer than `heavy` candidates beat it, where a beats b
// if it has more mass, or equal mass and is more recent).
TEST(Eviction, HeavyHitterMatchesExhaustiveSearch) {
  std::mt19937 rng(99);
  for (int trial = 0; trial < 300; ++trial) {
    const uint32_t n = 1 + rng() % 14;
    const uint32_t sink = rng() % 3, window = 1 + rng() % 3, heavy = rng() % 5;
    std::vector<float> imp(n);
    const bool ties = trial % 2 == 0;  // small integer masses force ties
    for (float& x : imp) {
      x = ties ? static_cast<float>(rng() % 3) : std::uniform_real_distribution<float>(0, 4)(rng);
    }
    const EvictionPolicy p = EvictionPolicy::HeavyHitter(heavy, window, sink);
    auto got = SelectRows(p, n, imp);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_TRUE(std::is_sorted(got->begin(), got->end()));
    if (n <= sink + window + heavy) {
      EXPECT_EQ(*got, All(n));
      continue;
    }
    std::vector<uint32_t> middle;
    for (uint32_t r = sink; r < n - window; ++r) middle.push_back(r);
    // Expected by the tie rule.
    std::vector<uint32_t> want;
    for (uint32_t r = 0; r < sink; ++r) want.push_back(r);
    for (uint32_t r : middle) {
      uint32_t better = 0;
      for (uint32_t o : middle) {
        if (imp[o] > imp[r] || (imp[o] == imp[r] && o > r)) ++better;
      }
      if (better < heavy) want.push_back(r);
    }
    for (uint32_t r = n - window; r < n; ++r) want.push_back(r);
    EXPECT_EQ(*got, want);
    // Exhaustive: no subset of the middle of size `heavy` has more mass.
    double best = -1;
    const uint32_t m = static_cast<uint32_t>(middle.size());
    for (uint32_t mask = 0; mask < (1u << m); ++mask) {
      if (static_cast<uint32_t>(__builtin_popcount(mask)) != heavy) continue;
      double sum = 0;
      for (uint32_t i = 0; i < m; ++i)
        if (mask >> i & 1) sum += imp[middle[i]];
      best = std::max(best, sum);
    }
    double chosen = 0;
    for (uint32_t r : *got)
      if (r >= sink && r < n - window) chosen += imp[r];
    EXPECT_DOUBLE_EQ(chosen, best);
    EXPECT_EQ(got->size(), sink + window + heavy);
  }
}

TEST(Eviction, TieBreaksTowardRecentRow) {
  const std::vector<float> imp = {5, 1, 1, 1, 0};
  // Rows 1..3 tie for the one heavy slot; the most recent (3) wins.
  EXPECT_EQ(*SelectRows(EvictionPolicy::HeavyHitter(1, 1, 0), 5, imp),
            (std::vector<uint32_t>{0, 4}));
  EXPECT_EQ(*SelectRows(EvictionPolicy::HeavyHitter(2, 1, 0), 5, imp),
            (std::vector<uint32_t>{0, 3, 4}));
}

TEST(Eviction, BadInput) {
  EXPECT_EQ(EvictionPolicy::Window(4, 0).Validate().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SelectRows(EvictionPolicy::Window(4, 0), 10).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(EvictionPolicy::HeavyHitter(4, 0).Validate().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(SelectRows(EvictionPolicy::HeavyHitter(2, 2), 10).ok());  // no importance
  const std::vector<float> nan = {0, 1, NAN};
  EXPECT_FALSE(SelectRows(EvictionPolicy::HeavyHitter(1, 1), 3, nan).ok());
  EvictionPolicy odd = EvictionPolicy::KeepAll();
  odd.window_tokens = 3;
  EXPECT_FALSE(odd.Validate().ok());
  EXPECT_FALSE(PolicyTable::PerHead({}).ok());
  EXPECT_FALSE(PolicyTable::Uniform(2, EvictionPolicy::Window(0, 0)).ok());
}

TEST(Eviction, PolicyTables) {
  auto duo = PolicyTable::Duo({true, false, true, false}, EvictionPolicy::Window(2, 8));
  ASSERT_TRUE(duo.ok());
  EXPECT_EQ(duo->n_kv_heads(), 4u);
  EXPECT_EQ(duo->head(0), EvictionPolicy::KeepAll());
  EXPECT_EQ(duo->head(1), EvictionPolicy::Window(2, 8));
  EXPECT_FALSE(duo->all_keep_all());
  EXPECT_TRUE(PolicyTable::Uniform(3, EvictionPolicy::KeepAll())->all_keep_all());
  EXPECT_EQ(EvictionPolicy::Window(2, 8).ToString(), "window(sink=2,window=8)");
  EXPECT_EQ(EvictionPolicy::HeavyHitter(3, 4, 1).budget(), 8u);
}

}  // namespace
}  // namespace kvcache
