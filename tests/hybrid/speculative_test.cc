// Speculative decoding across mixed layers: randomized drafts, commits and
// aborts compared bit for bit with a sequence that never drafted, for both
// layouts and several format pairs, with forks sharing blocks.
#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "hybrid/test_util.h"
#include "kvcache/hybrid.h"

namespace kvcache {
namespace {

using testing_hybrid::Snapshot;
using testing_hybrid::Take;
using testing_hybrid::TokenRows;

constexpr uint32_t kH = 2, kD = 32, kBlock = 4;

std::shared_ptr<const HybridModel> MixedModel(FormatPair formats, uint32_t slack) {
  auto g = Geometry::Create({.n_layers = 6, .n_kv_heads = kH, .head_dim = kD, .block_size = kBlock});
  EXPECT_TRUE(g.ok());
  std::vector<LayerSpec> layers = {
      LayerSpec::Full(),
      LayerSpec::Window(2, 5),
      LayerSpec::Linear(LinearRule::kDelta, {1.0f, 0.5f}),
      LayerSpec::FullWithPolicies({EvictionPolicy::KeepAll(), EvictionPolicy::Window(1, 3)}),
      LayerSpec::Linear(LinearRule::kDecay),
      LayerSpec::FullWithPolicies({EvictionPolicy::Window(0, 4), EvictionPolicy::DeadHead()}),
  };
  auto m = HybridModel::Create(*g, formats, std::move(layers),
                               {.window_slack_tokens = slack, .max_draft_tokens = 16});
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return *m;
}

// Appends positions [from, from + count) of data stream `seed` to every
// layer, in chunks of `chunk` tokens (linear layers also get per-token gates).
void AppendTokens(HybridSequence& s, uint64_t seed, uint32_t from, uint32_t count, uint32_t chunk) {
  const HybridModel& m = s.model();
  const uint32_t kv = m.geometry().kv_dim();
  for (uint32_t l = 0; l < m.n_layers(); ++l) {
    for (uint32_t t0 = 0; t0 < count; t0 += chunk) {
      const uint32_t n = std::min(chunk, count - t0);
      std::vector<float> k, v, gate;
      for (uint32_t t = t0; t < t0 + n; ++t) {
        const auto kr = TokenRows(seed, l, from + t, 0, kv), vr = TokenRows(seed, l, from + t, 1, kv);
        k.insert(k.end(), kr.begin(), kr.end());
        v.insert(v.end(), vr.begin(), vr.end());
        for (uint32_t h = 0; h < kH; ++h) {
          gate.push_back(0.6f + 0.3f * std::sin(static_cast<float>(seed + from + t + h)));
        }
      }
      HybridLayerInputs in{.k = k, .v = v};
      if (m.kind(l) == LayerKind::kLinear) in.gate = gate;
      ASSERT_TRUE(s.AppendLayer(l, in).ok()) << "layer " << l;
    }
  }
}

struct Setup {
  std::shared_ptr<const HybridModel> model;
  std::vector<std::shared_ptr<BlockPool>> pools;
};

Result<HybridSequence> Make(const Setup& st, CacheLayout layout) {
  if (layout == CacheLayout::kPaged) return HybridSequence::CreatePaged(st.model, st.pools);
  return HybridSequence::CreateContiguous(st.model);
}

void RunRandomDrafts(FormatPair formats, CacheLayout layout, uint32_t slack, uint64_t seed) {
  Setup st;
  st.model = MixedModel(formats, slack);
  const std::vector<uint32_t> blocks = {64, 64};
  if (layout == CacheLayout::kPaged) {
    auto pools = st.model->CreatePools(blocks);
    ASSERT_TRUE(pools.ok()) << pools.status().ToString();
    st.pools = *pools;
  }
  auto a_or = Make(st, layout), b_or = Make(st, layout);
  ASSERT_TRUE(a_or.ok() && b_or.ok());
  HybridSequence a = std::move(a_or).value(), b = std::move(b_or).value();
  std::mt19937 rng(seed);
  AppendTokens(a, 1, 0, 3, 3);  // prefill (calibrates)
  AppendTokens(b, 1, 0, 3, 1);
  ASSERT_EQ(Take(a), Take(b));
  for (int round = 0; round < 24; ++round) {
    SCOPED_TRACE(::testing::Message() << "round " << round);
    const uint32_t base = a.num_tokens();
    if (rng() % 3 == 0) {  // plain decode steps in between
      const uint32_t n = 1 + rng() % 2;
      AppendTokens(a, 500 + round, base, n, n);
      AppendTokens(b, 500 + round, base, n, 1);
      ASSERT_EQ(Take(a), Take(b));
      continue;
    }
    // Sometimes a fork shares a's blocks while a drafts: it must not change.
    std::optional<HybridSequence> fork;
    Snapshot fork_snap;
    if (rng() % 3 == 0) {
      auto f = a.Fork();
      ASSERT_TRUE(f.ok()) << f.status().ToString();
      fork.emplace(std::move(f).value());
      fork_snap = Take(*fork);
    }
    const Snapshot before = Take(a);
    const uint32_t T = 1 + rng() % 5;
    const uint64_t data = 1000 + round;
    ASSERT_TRUE(a.BeginDraft().ok());
    AppendTokens(a, data, base, T, rng() % 2 ? T : 1);
    ASSERT_TRUE(a.CheckInvariants().ok());
    if (rng() % 4 == 0) {
      ASSERT_TRUE(a.Abort().ok());
      EXPECT_EQ(Take(a), before);
    } else {
      const uint32_t acc = rng() % (T + 1);
      ASSERT_TRUE(a.Commit(acc).ok());
      AppendTokens(b, data, base, acc, 1);
      ASSERT_EQ(a.num_tokens(), base + acc);
    }
    ASSERT_EQ(Take(a), Take(b));
    Status inv = a.CheckInvariants();
    ASSERT_TRUE(inv.ok()) << inv.ToString();
    ASSERT_TRUE(b.CheckInvariants().ok());
    if (fork) {
      EXPECT_EQ(Take(*fork), fork_snap);
      ASSERT_TRUE(fork->CheckInvariants().ok());
      fork->Release();
    }
  }
  a.Release();
  b.Release();
  for (const auto& p : st.pools) {
    if (!p) continue;
    EXPECT_TRUE(p->CheckInvariants().ok());
    EXPECT_EQ(p->num_used_blocks(), 0u);
    EXPECT_EQ(p->num_reserved_blocks(), 0u);
  }
}

class SpeculativeTest : public ::testing::TestWithParam<std::tuple<const char*, CacheLayout>> {};

TEST_P(SpeculativeTest, CommitAndAbortEqualNeverDrafted) {
  auto formats = ParseFormatPair(std::get<0>(GetParam()));
  ASSERT_TRUE(formats.ok());
  RunRandomDrafts(*formats, std::get<1>(GetParam()), /*slack=*/3, /*seed=*/42);
  RunRandomDrafts(*formats, std::get<1>(GetParam()), /*slack=*/0, /*seed=*/43);
}

INSTANTIATE_TEST_SUITE_P(
    FormatsAndLayouts, SpeculativeTest,
    ::testing::Combine(::testing::Values("f32", "bf16", "q8", "turbo4", "q4_0", "fp8_e4m3:turbo3",
                                         "f16:q8_0"),
                       ::testing::Values(CacheLayout::kContiguous, CacheLayout::kPaged)),
    [](const auto& info) {
      std::string name = std::get<0>(info.param);
      for (char& c : name)
        if (c == ':') c = '_';
      return name + (std::get<1>(info.param) == CacheLayout::kPaged ? "_paged" : "_contiguous");
    });

}  // namespace
}  // namespace kvcache
