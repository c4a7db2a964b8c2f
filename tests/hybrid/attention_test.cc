// Attention through HybridSequence::Attend, exact for f32 against the
// attention reference: over bounded windows (vs the full history with the
// same window), over heavy-hitter-compacted heads (vs the kept subset of the
// original rows and positions), and per head in DuoAttention layers during a
// speculative verify.
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "hybrid/test_util.h"
#include "kvcache/attention.h"
#include "kvcache/hybrid.h"

namespace kvcache {
namespace {

using testing_hybrid::TokenRows;

constexpr uint32_t kH = 2, kD = 16, kQHeads = 4;

Geometry Geo(uint32_t layers) {
  return *Geometry::Create({.n_layers = layers, .n_kv_heads = kH, .head_dim = kD, .block_size = 4});
}

void AppendOne(HybridSequence& s, uint32_t pos) {
  for (uint32_t l = 0; l < s.model().n_layers(); ++l) {
    const auto k = TokenRows(21, l, pos, 0, kH * kD), v = TokenRows(21, l, pos, 1, kH * kD);
    ASSERT_TRUE(s.AppendLayer(l, {.k = k, .v = v}).ok());
  }
}

AttentionOutput Out(std::span<float> out, std::span<float> lse = {},
                    std::span<float> probs = {}, std::span<float> kv_probs = {}) {
  AttentionOutput o;
  o.out = out;
  o.lse = lse;
  o.probs = probs;
  o.kv_probs = kv_probs;
  return o;
}

std::vector<float> RandomQ(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> q(n);
  for (float& x : q) x = std::normal_distribution<float>()(rng);
  return q;
}

// Reference heads over rows `rows[h]` (indices into the full decoded history).
struct RefData {
  std::vector<std::vector<float>> k, v;
  std::vector<std::vector<uint32_t>> pos;
  std::vector<ReferenceHead> heads;
};
RefData Subset(const HybridSequence& full, uint32_t layer,
               const std::vector<std::vector<uint32_t>>& rows) {
  RefData d;
  d.k.resize(kH), d.v.resize(kH), d.pos.resize(kH);
  for (uint32_t h = 0; h < kH; ++h) {
    const auto K = *full.HeadKeys(layer, h), V = *full.HeadValues(layer, h);
    const auto P = full.HeadPositions(layer, h);
    for (uint32_t r : rows[h]) {
      d.k[h].insert(d.k[h].end(), K.begin() + r * kD, K.begin() + (r + 1) * kD);
      d.v[h].insert(d.v[h].end(), V.begin() + r * kD, V.begin() + (r + 1) * kD);
      d.pos[h].push_back(P[r]);
    }
  }
  for (uint32_t h = 0; h < kH; ++h) d.heads.push_back({d.k[h], d.v[h], d.pos[h]});
  return d;
}

std::vector<std::vector<uint32_t>> AllRows(const HybridSequence& s, uint32_t layer) {
  std::vector<std::vector<uint32_t>> rows(kH);
  for (uint32_t h = 0; h < kH; ++h)
    for (uint32_t r = 0; r < s.head_len(layer, h); ++r) rows[h].push_back(r);
  return rows;
}

TEST(HybridAttend, WindowEqualsFullHistoryWithWindow) {
  const FormatPair f32{Format::kF32, Format::kF32};
  auto wmodel = HybridModel::Create(Geo(1), f32, {LayerSpec::Window(2, 6)},
                                    {.window_slack_tokens = 4, .window_lookback_tokens = 2});
  auto fmodel = HybridModel::Create(Geo(1), f32, {LayerSpec::Full()});
  ASSERT_TRUE(wmodel.ok() && fmodel.ok());
  auto pools = (*wmodel)->CreatePools(std::vector<uint32_t>{0, 8});
  auto win = HybridSequence::CreatePaged(*wmodel, *pools);
  auto full = HybridSequence::CreateContiguous(*fmodel);
  ASSERT_TRUE(win.ok() && full.ok());
  for (uint32_t pos = 0; pos < 45; ++pos) {
    AppendOne(*win, pos);
    AppendOne(*full, pos);
    for (uint32_t T : {1u, 3u}) {
      if (T > pos + 1) continue;
      const auto q = RandomQ(T * kQHeads * kD, pos);
      std::vector<float> got(q.size()), want(q.size());
      ASSERT_TRUE(win->Attend(0, T, q, {.n_q_heads = kQHeads}, Out(got)).ok());
      RefData ref = Subset(*full, 0, AllRows(*full, 0));
      AttentionOptions o{.n_q_heads = kQHeads};
      if (pos + 1 > 6) o.window = 6, o.n_sink = 2;
      ASSERT_TRUE(AttendReference(ref.heads, kD, pos + 1, T, q, o, Out(want)).ok());
      ASSERT_EQ(got, want) << "pos " << pos << " T " << T;
    }
  }
}

// Without lookback, a chunk's earlier queries would miss evicted rows:
// Attend says so instead of computing a wrong window.
TEST(HybridAttend, RefusesMultiQueryWhoseWindowWasEvicted) {
  auto model = HybridModel::Create(Geo(1), {Format::kF32, Format::kF32}, {LayerSpec::Window(2, 6)},
                                   {.window_slack_tokens = 4});
  ASSERT_TRUE(model.ok());
  auto seq = HybridSequence::CreateContiguous(*model);
  ASSERT_TRUE(seq.ok());
  for (uint32_t pos = 0; pos < 12; ++pos) AppendOne(*seq, pos);  // stores 0, 1, 6..11
  const auto q = RandomQ(3 * kQHeads * kD, 1);
  std::vector<float> out(q.size());
  EXPECT_EQ(seq->Attend(0, 3, q, {.n_q_heads = kQHeads}, Out(out)).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_TRUE(seq->Attend(0, 1, std::span<const float>(q).first(kQHeads * kD), {.n_q_heads = kQHeads},
                          Out(std::span<float>(out).first(kQHeads * kD)))
                  .ok());
}

TEST(HybridAttend, HeavyHitterCompactionEqualsKeptSubset) {
  for (CacheLayout layout : {CacheLayout::kContiguous, CacheLayout::kPaged}) {
    const EvictionPolicy h2o = EvictionPolicy::HeavyHitter(5, 4, 1);
    auto model = HybridModel::Create(Geo(1), {Format::kF32, Format::kF32},
                                     {LayerSpec::FullWithPolicies({h2o, h2o})});
    ASSERT_TRUE(model.ok());
    auto pools = (*model)->CreatePools(std::vector<uint32_t>{0, 16});
    auto made = layout == CacheLayout::kPaged ? HybridSequence::CreatePaged(*model, *pools)
                                              : HybridSequence::CreateContiguous(*model);
    ASSERT_TRUE(made.ok());
    HybridSequence seq = std::move(made).value();
    std::vector<std::vector<uint32_t>> kept(kH);
    std::optional<HybridSequence> original;
    for (uint32_t pos = 0; pos < 40; ++pos) {
      AppendOne(seq, pos);
      // Decode attention with importance from its probabilities, evicting
      // every 8 steps; compare each step against the kept subset.
      const auto q = RandomQ(kQHeads * kD, 100 + pos);
      std::vector<float> out(q.size()), kvp(kH * seq.num_tokens());
      ASSERT_TRUE(seq.Attend(0, 1, q, {.n_q_heads = kQHeads}, Out(out, {}, {}, kvp)).ok());
      for (uint32_t h = 0; h < kH; ++h) {
        std::span<const float> p(kvp.data() + h * seq.num_tokens(), seq.head_len(0, h));
        ASSERT_TRUE(seq.AccumulateImportance(0, h, p).ok());
      }
      if (pos % 8 == 7) {
        auto c = seq.Clone();
        ASSERT_TRUE(c.ok());
        original.emplace(std::move(c).value());
        for (uint32_t h = 0; h < kH; ++h) {
          kept[h] = *SelectRows(h2o, seq.head_len(0, h), seq.HeadImportance(0, h));
        }
        ASSERT_TRUE(seq.Evict().ok());
        const auto q2 = RandomQ(kQHeads * kD, 500 + pos);
        std::vector<float> got(q2.size()), want(q2.size());
        ASSERT_TRUE(seq.Attend(0, 1, q2, {.n_q_heads = kQHeads}, Out(got)).ok());
        RefData ref = Subset(*original, 0, kept);
        ASSERT_TRUE(
            AttendReference(ref.heads, kD, pos + 1, 1, q2, {.n_q_heads = kQHeads}, Out(want)).ok());
        ASSERT_EQ(got, want) << "pos " << pos;
        for (uint32_t h = 0; h < kH; ++h) ASSERT_EQ(seq.head_len(0, h), std::min(pos + 1, 10u));
      }
    }
    seq.Release();
    original.reset();
    EXPECT_EQ((*pools)[1]->num_used_blocks(), 0u);
  }
}

// A DuoAttention layer (head 0 full, head 1 window) verifying 3 drafted
// tokens at once: each head gets its own window.
TEST(HybridAttend, DuoLayerPerHeadWindowsDuringVerify) {
  auto model = HybridModel::Create(
      Geo(1), {Format::kF32, Format::kF32},
      {LayerSpec::FullWithPolicies({EvictionPolicy::KeepAll(), EvictionPolicy::Window(1, 3)})});
  auto fmodel = HybridModel::Create(Geo(1), {Format::kF32, Format::kF32}, {LayerSpec::Full()});
  ASSERT_TRUE(model.ok() && fmodel.ok());
  auto seq = HybridSequence::CreateContiguous(*model);
  auto full = HybridSequence::CreateContiguous(*fmodel);
  ASSERT_TRUE(seq.ok() && full.ok());
  for (uint32_t pos = 0; pos < 12; ++pos) AppendOne(*seq, pos), AppendOne(*full, pos);
  EXPECT_EQ(seq->head_len(0, 1), 4u);  // G = 1: exactly S + W
  ASSERT_TRUE(seq->BeginDraft().ok());
  for (uint32_t pos = 12; pos < 15; ++pos) AppendOne(*seq, pos), AppendOne(*full, pos);
  const uint32_t T = 3, n = 15;
  const auto q = RandomQ(T * kQHeads * kD, 9);
  std::vector<float> got(q.size()), lse(T * kQHeads), probs(T * kQHeads * n);
  ASSERT_TRUE(seq->Attend(0, T, q, {.n_q_heads = kQHeads}, Out(got, lse, probs)).ok());
  RefData ref = Subset(*full, 0, AllRows(*full, 0));
  // Per head: q heads 2h, 2h+1 read kv head h.
  for (uint32_t h = 0; h < kH; ++h) {
    std::vector<float> qh, want(T * 2 * kD), want_lse(T * 2);
    for (uint32_t t = 0; t < T; ++t)
      qh.insert(qh.end(), q.begin() + (t * kQHeads + 2 * h) * kD, q.begin() + (t * kQHeads + 2 * h + 2) * kD);
    AttentionOptions o{.n_q_heads = 2};
    if (h == 1) o.window = 3, o.n_sink = 1;
    ASSERT_TRUE(AttendReference({&ref.heads[h], 1}, kD, n, T, qh, o, Out(want, want_lse)).ok());
    for (uint32_t t = 0; t < T; ++t) {
      for (uint32_t j = 0; j < 2 * kD; ++j) {
        ASSERT_EQ(got[(t * kQHeads + 2 * h) * kD + j], want[t * 2 * kD + j]) << "h " << h << " t " << t;
      }
      ASSERT_EQ(lse[t * kQHeads + 2 * h], want_lse[t * 2]);
    }
  }
  ASSERT_TRUE(seq->Commit(2).ok());
  EXPECT_EQ(seq->head_len(0, 1), 4u);
}

}  // namespace
}  // namespace kvcache
