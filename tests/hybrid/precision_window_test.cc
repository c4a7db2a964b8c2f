// A precision window (cache.h, PrecisionWindow) on a hybrid sequence: the
// full layers keep their sinks and recent positions as bf16 rows and attend
// exactly as a plain SequenceCache with the same window and the same rows;
// the window and linear layers, and every quantized row, are what the same
// sequence without a window holds; speculative drafts (with enough slack)
// and forks keep both true; a model whose full layers evict rows, or that
// has no full layer, is refused.
#include <algorithm>
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "hybrid/test_util.h"
#include "kvcache/attention.h"
#include "kvcache/cache.h"
#include "kvcache/hybrid.h"

namespace kvcache {
namespace {

using testing_hybrid::TokenRows;

constexpr uint32_t kH = 2, kD = 32, kBlock = 4, kQHeads = 4;
constexpr PrecisionWindow kWindow{.sinks = 2, .recent = 5, .slack = 4};
const FormatPair kTurbo4{Format::kTurbo4, Format::kTurbo4};

Geometry Geo(uint32_t layers) {
  return *Geometry::Create({.n_layers = layers, .n_kv_heads = kH, .head_dim = kD, .block_size = kBlock});
}

// Full, window, linear, full: the full group holds layers 0 and 3.
std::shared_ptr<const HybridModel> Model() {
  auto m = HybridModel::Create(Geo(4), kTurbo4,
                               {LayerSpec::Full(), LayerSpec::Window(2, 5),
                                LayerSpec::Linear(LinearRule::kDelta, {1.0f, 0.5f}), LayerSpec::Full()},
                               {.max_draft_tokens = 8});
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return *m;
}

// Token pos's rows of layer l (the same stream for the hybrid sequences and
// the plain reference cache).
std::vector<float> Rows(uint32_t l, uint32_t pos, int side) { return TokenRows(5, l, pos, side, kH * kD); }

void AppendHybrid(HybridSequence& s, uint32_t pos) {
  for (uint32_t l = 0; l < s.model().n_layers(); ++l) {
    const auto k = Rows(l, pos, 0), v = Rows(l, pos, 1);
    std::vector<float> gate(kH, 0.7f);
    HybridLayerInputs in{.k = k, .v = v};
    if (s.model().kind(l) == LayerKind::kLinear) in.gate = gate;
    ASSERT_TRUE(s.AppendLayer(l, in).ok()) << "layer " << l << " pos " << pos;
  }
}

// The reference: the full group's layers (0 and 3) in a plain cache.
void AppendPlain(SequenceCache& c, uint32_t pos) {
  const uint32_t full_layers[] = {0, 3};
  for (uint32_t g = 0; g < 2; ++g) {
    const auto k = Rows(full_layers[g], pos, 0), v = Rows(full_layers[g], pos, 1);
    ASSERT_TRUE(c.AppendLayer(g, k, v).ok());
  }
}

std::vector<float> Query(uint32_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> q(size_t{n} * kQHeads * kD);
  for (float& x : q) x = std::normal_distribution<float>()(rng);
  return q;
}

std::vector<float> AttendHybrid(const HybridSequence& s, uint32_t layer, uint32_t n, const std::vector<float>& q) {
  std::vector<float> out(q.size());
  AttentionOutput o;
  o.out = out;
  const Status st = s.Attend(layer, n, q, s.AttentionOptionsFor(layer, {.n_q_heads = kQHeads}), o);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return out;
}

std::vector<float> AttendPlain(const SequenceCache& c, uint32_t group_layer, uint32_t n, const std::vector<float>& q) {
  std::vector<float> out(q.size());
  AttentionOutput o;
  o.out = out;
  auto view = c.View(group_layer);
  EXPECT_TRUE(view.ok());
  const Status st = AttendMulti(*view, n, q, {.n_q_heads = kQHeads}, o);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return out;
}

struct Sequences {
  std::shared_ptr<const HybridModel> model;
  std::vector<std::shared_ptr<BlockPool>> pools, plain_pools;
  std::shared_ptr<BlockPool> ref_pool;
  std::optional<HybridSequence> win, bare;
  std::optional<SequenceCache> ref;
};

Sequences Make(CacheLayout layout) {
  Sequences s;
  s.model = Model();
  if (layout == CacheLayout::kPaged) {
    s.pools = *s.model->CreatePools(std::vector<uint32_t>{64, 64});
    s.plain_pools = *s.model->CreatePools(std::vector<uint32_t>{64, 64});
    s.ref_pool = *BlockPool::Create(s.model->group_geometry(HybridModel::kFullGroup), kTurbo4, {.num_blocks = 64});
    s.win.emplace(*HybridSequence::CreatePaged(s.model, s.pools, {.window = kWindow}));
    s.bare.emplace(*HybridSequence::CreatePaged(s.model, s.plain_pools));
    s.ref.emplace(*SequenceCache::CreatePaged(s.ref_pool, {.window = kWindow}));
  } else {
    s.win.emplace(*HybridSequence::CreateContiguous(s.model, {.window = kWindow}));
    s.bare.emplace(*HybridSequence::CreateContiguous(s.model));
    s.ref.emplace(*SequenceCache::CreateContiguous(s.model->group_geometry(HybridModel::kFullGroup), kTurbo4,
                                                   {.window = kWindow}));
  }
  return s;
}

// Layer by layer against the plain cache (full layers) and the sequence
// without a window (the others), bit for bit.
void ExpectLikeReferences(const Sequences& s, uint32_t n_queries, uint32_t seed, bool* full_differs) {
  const uint32_t n = s.win->num_tokens(0);
  if (n_queries > n) return;
  const auto q = Query(n_queries, seed);
  for (uint32_t l : {0u, 3u}) {
    const uint32_t gl = s.model->group_layer(l);
    ASSERT_EQ(AttendHybrid(*s.win, l, n_queries, q), AttendPlain(*s.ref, gl, n_queries, q))
        << "full layer " << l << " at " << n;
    for (uint32_t h = 0; h < kH; ++h) {
      ASSERT_EQ(*s.win->HeadKeys(l, h), *s.ref->HeadKeys(gl, h)) << "layer " << l << " head " << h;
      ASSERT_EQ(*s.win->HeadValues(l, h), *s.ref->HeadValues(gl, h)) << "layer " << l << " head " << h;
    }
    if (AttendHybrid(*s.win, l, n_queries, q) != AttendHybrid(*s.bare, l, n_queries, q)) *full_differs = true;
  }
  // The window layer and the linear layer hold what they hold without the
  // window; the full layers the same positions.
  ASSERT_EQ(AttendHybrid(*s.win, 1, 1, Query(1, seed)), AttendHybrid(*s.bare, 1, 1, Query(1, seed)));
  for (uint32_t h = 0; h < kH; ++h) {
    for (uint32_t l : {0u, 1u, 3u}) ASSERT_EQ(s.win->HeadPositions(l, h), s.bare->HeadPositions(l, h));
    ASSERT_EQ(*s.win->HeadKeys(1, h), *s.bare->HeadKeys(1, h));
    ASSERT_EQ(*s.win->HeadValues(1, h), *s.bare->HeadValues(1, h));
  }
  auto lw = s.win->Linear(2), lb = s.bare->Linear(2);
  ASSERT_TRUE(lw.ok() && lb.ok());
  ASSERT_TRUE(std::equal((*lw)->state().begin(), (*lw)->state().end(), (*lb)->state().begin(), (*lb)->state().end()));
  ASSERT_TRUE(s.win->CheckInvariants().ok());
}

class HybridPrecisionWindow : public ::testing::TestWithParam<CacheLayout> {};

TEST_P(HybridPrecisionWindow, FullLayersAttendAsAPlainCacheWithTheWindow) {
  Sequences s = Make(GetParam());
  bool full_differs = false;
  for (uint32_t pos = 0; pos < 30; ++pos) {
    AppendHybrid(*s.win, pos);
    AppendHybrid(*s.bare, pos);
    AppendPlain(*s.ref, pos);
    ExpectLikeReferences(s, 1, pos, &full_differs);
    ExpectLikeReferences(s, 3, 100 + pos, &full_differs);
  }
  // The window's bf16 rows are really read (turbo4 rows differ from them).
  EXPECT_TRUE(full_differs);
  // The window is per-sequence memory on top of the pool's blocks.
  EXPECT_GT(s.win->allocated_bytes(), s.bare->allocated_bytes());
}

TEST_P(HybridPrecisionWindow, DraftsAndForksKeepTheWindow) {
  Sequences s = Make(GetParam());
  for (uint32_t pos = 0; pos < 12; ++pos) {
    AppendHybrid(*s.win, pos);
    AppendHybrid(*s.bare, pos);
    AppendPlain(*s.ref, pos);
  }
  bool differs = false;
  // A draft of 3 other tokens, aborted: as if never drafted.
  ASSERT_TRUE(s.win->BeginDraft().ok());
  ASSERT_TRUE(s.bare->BeginDraft().ok());
  for (uint32_t pos = 40; pos < 43; ++pos) {
    AppendHybrid(*s.win, pos);
    AppendHybrid(*s.bare, pos);
  }
  ASSERT_TRUE(s.win->Abort().ok());
  ASSERT_TRUE(s.bare->Abort().ok());
  ExpectLikeReferences(s, 1, 7, &differs);
  // A draft of 4 tokens (within the slack), 2 kept: as if those 2 were appended.
  ASSERT_TRUE(s.win->BeginDraft().ok());
  ASSERT_TRUE(s.bare->BeginDraft().ok());
  for (uint32_t pos = 12; pos < 16; ++pos) {
    AppendHybrid(*s.win, pos);
    AppendHybrid(*s.bare, pos);
  }
  ASSERT_TRUE(s.win->Commit(2).ok());
  ASSERT_TRUE(s.bare->Commit(2).ok());
  for (uint32_t pos = 12; pos < 14; ++pos) AppendPlain(*s.ref, pos);
  ExpectLikeReferences(s, 1, 8, &differs);
  ExpectLikeReferences(s, 2, 9, &differs);
  // A fork attends as its parent, and both go on on their own.
  auto fork = s.win->Fork();
  ASSERT_TRUE(fork.ok()) << fork.status().ToString();
  const auto q = Query(1, 10);
  for (uint32_t l : {0u, 1u, 3u}) EXPECT_EQ(AttendHybrid(*fork, l, 1, q), AttendHybrid(*s.win, l, 1, q));
  AppendHybrid(*fork, 50);
  for (uint32_t pos = 14; pos < 20; ++pos) {
    AppendHybrid(*s.win, pos);
    AppendHybrid(*s.bare, pos);
    AppendPlain(*s.ref, pos);
    ExpectLikeReferences(s, 1, 11 + pos, &differs);
  }
  EXPECT_TRUE(differs);
}

INSTANTIATE_TEST_SUITE_P(Layouts, HybridPrecisionWindow,
                         ::testing::Values(CacheLayout::kContiguous, CacheLayout::kPaged),
                         [](const auto& info) { return info.param == CacheLayout::kPaged ? "paged" : "contiguous"; });

TEST(HybridPrecisionWindowBadInput, EvictingFullLayersOrNoFullLayerAreRefused) {
  // A full layer with a heavy-hitter head: Evict would drop rows a window keeps.
  auto evicting = HybridModel::Create(
      Geo(2), kTurbo4,
      {LayerSpec::Full(),
       LayerSpec::FullWithPolicies({EvictionPolicy::KeepAll(), EvictionPolicy::HeavyHitter(2, 4, 2)})});
  ASSERT_TRUE(evicting.ok()) << evicting.status().ToString();
  auto c = HybridSequence::CreateContiguous(*evicting, {.window = kWindow});
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("layer 1 head 1"), std::string::npos) << c.status().message();
  auto pools = (*evicting)->CreatePools(std::vector<uint32_t>{16, 16});
  ASSERT_TRUE(pools.ok());
  auto p = HybridSequence::CreatePaged(*evicting, *pools, {.window = kWindow});
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  for (const auto& pool : *pools) {
    if (pool) {
      EXPECT_EQ(pool->num_free_blocks(), pool->num_blocks());  // nothing taken
    }
  }
  // No full layer: nothing for the window to apply to.
  auto bounded = HybridModel::Create(Geo(2), kTurbo4,
                                     {LayerSpec::Window(2, 5), LayerSpec::Linear(LinearRule::kPlain)});
  ASSERT_TRUE(bounded.ok());
  EXPECT_EQ(HybridSequence::CreateContiguous(*bounded, {.window = kWindow}).status().code(),
            StatusCode::kInvalidArgument);
  // The same models without a window are fine.
  EXPECT_TRUE(HybridSequence::CreateContiguous(*evicting).ok());
  EXPECT_TRUE(HybridSequence::CreateContiguous(*bounded).ok());
}

}  // namespace
}  // namespace kvcache
