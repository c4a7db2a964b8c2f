// Bad input to hybrid models and sequences: clear errors, nothing changed.
#include <vector>

#include <gtest/gtest.h>

#include "hybrid/test_util.h"
#include "kvcache/hybrid.h"

namespace kvcache {
namespace {

using testing_hybrid::Take;
using testing_hybrid::TokenRows;

constexpr uint32_t kH = 2, kD = 16;

Geometry Geo(uint32_t layers) {
  return *Geometry::Create({.n_layers = layers, .n_kv_heads = kH, .head_dim = kD, .block_size = 4});
}

TEST(HybridModel, RejectsBadSpecs) {
  const FormatPair f32{Format::kF32, Format::kF32};
  // A window of 0.
  auto m = HybridModel::Create(Geo(1), f32, {LayerSpec::Window(4, 0)});
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("window of 0"), std::string::npos) << m.status().message();
  // Spec count, policy count, invalid policy, linear gates, window fields on full.
  EXPECT_FALSE(HybridModel::Create(Geo(2), f32, {LayerSpec::Full()}).ok());
  EXPECT_FALSE(HybridModel::Create(Geo(1), f32,
                                   {LayerSpec::FullWithPolicies({EvictionPolicy::KeepAll()})})
                   .ok());
  EXPECT_FALSE(HybridModel::Create(Geo(1), f32,
                                   {LayerSpec::FullWithPolicies({EvictionPolicy::KeepAll(),
                                                                 EvictionPolicy::Window(1, 0)})})
                   .ok());
  EXPECT_FALSE(
      HybridModel::Create(Geo(1), f32, {LayerSpec::Linear(LinearRule::kDecay, {0.5f, 3.0f})}).ok());
  LayerSpec odd = LayerSpec::Full();
  odd.window_tokens = 3;
  EXPECT_FALSE(HybridModel::Create(Geo(1), f32, {odd}).ok());
  // A format that cannot take head_dim 16.
  EXPECT_FALSE(HybridModel::Create(Geo(1), {Format::kQ4_0, Format::kF32}, {LayerSpec::Full()}).ok());
  // Pools of the wrong geometry.
  auto model = HybridModel::Create(Geo(2), f32, {LayerSpec::Full(), LayerSpec::Window(0, 2)});
  ASSERT_TRUE(model.ok());
  auto wrong = BlockPool::Create(Geo(2), f32, {.num_blocks = 4});
  std::vector<std::shared_ptr<BlockPool>> pools = {*wrong, *wrong};
  EXPECT_EQ(HybridSequence::CreatePaged(*model, pools).status().code(),
            StatusCode::kInvalidArgument);
}

class HybridBadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = HybridModel::Create(
        Geo(3), {Format::kF32, Format::kQ8},
        {LayerSpec::Full(), LayerSpec::Linear(LinearRule::kPlain), LayerSpec::Window(1, 3)});
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    model_ = *m;
    auto pools = model_->CreatePools(std::vector<uint32_t>{8, 8});
    ASSERT_TRUE(pools.ok());
    pools_ = *pools;
    auto s = HybridSequence::CreatePaged(model_, pools_);
    ASSERT_TRUE(s.ok());
    seq_.emplace(std::move(s).value());
  }
  void Append(uint32_t pos) {
    for (uint32_t l = 0; l < 3; ++l) {
      const auto k = TokenRows(1, l, pos, 0, kH * kD), v = TokenRows(1, l, pos, 1, kH * kD);
      ASSERT_TRUE(seq_->AppendLayer(l, {.k = k, .v = v}).ok());
    }
  }
  std::shared_ptr<const HybridModel> model_;
  std::vector<std::shared_ptr<BlockPool>> pools_;
  std::optional<HybridSequence> seq_;
};

TEST_F(HybridBadInput, DraftStateMachine) {
  // A draft needs a prefilled sequence.
  EXPECT_EQ(seq_->BeginDraft().code(), StatusCode::kFailedPrecondition);
  Append(0);
  Append(1);
  const auto snap = Take(*seq_);
  EXPECT_EQ(seq_->Commit(0).code(), StatusCode::kFailedPrecondition);  // no draft
  EXPECT_EQ(seq_->Abort().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(seq_->BeginDraft().ok());
  EXPECT_EQ(seq_->BeginDraft().code(), StatusCode::kFailedPrecondition);  // nested
  Append(2);
  Append(3);
  // Commit more than drafted: error, draft still open and intact.
  EXPECT_EQ(seq_->Commit(3).code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(seq_->in_draft());
  EXPECT_EQ(seq_->num_tokens(), 4u);
  // Operations that would break the transaction are refused.
  EXPECT_EQ(seq_->Truncate(1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(seq_->Evict().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(seq_->Fork().status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(seq_->Clone().status().code(), StatusCode::kFailedPrecondition);
  std::vector<float> probs(seq_->head_len(0, 0), 0.1f);
  EXPECT_EQ(seq_->AccumulateImportance(0, 0, probs).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(seq_->Abort().ok());
  EXPECT_EQ(Take(*seq_), snap);
  // A draft where one layer got fewer tokens: commit is bounded by it.
  ASSERT_TRUE(seq_->BeginDraft().ok());
  Append(2);
  const auto k = TokenRows(1, 0, 3, 0, kH * kD);
  ASSERT_TRUE(seq_->AppendLayer(0, {.k = k, .v = k}).ok());
  EXPECT_EQ(seq_->Commit(2).code(), StatusCode::kOutOfRange);
  ASSERT_TRUE(seq_->Commit(1).ok());
  EXPECT_EQ(seq_->num_tokens(), 3u);
  // Uneven layers refuse BeginDraft.
  ASSERT_TRUE(seq_->AppendLayer(0, {.k = k, .v = k}).ok());
  EXPECT_EQ(seq_->BeginDraft().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(seq_->CheckInvariants().ok());
}

TEST_F(HybridBadInput, ReleasedSequenceAndWrongInputs) {
  Append(0);
  const auto snap = Take(*seq_);
  std::vector<float> short_k(kD), q(kH * kD), out(kH * kD);
  // Wrong sizes, gates or outputs on attention layers, unknown layers.
  EXPECT_EQ(seq_->AppendLayer(0, {.k = short_k, .v = short_k}).code(), StatusCode::kInvalidArgument);
  const auto k = TokenRows(1, 0, 1, 0, kH * kD);
  EXPECT_EQ(seq_->AppendLayer(0, {.k = k, .v = k, .q = q}, out).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(seq_->AppendLayer(9, {.k = k, .v = k}).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(seq_->View(1).status().code(), StatusCode::kInvalidArgument);  // linear: no K/V
  EXPECT_EQ(seq_->Linear(0).status().code(), StatusCode::kInvalidArgument);
  // A linear layer cannot be truncated.
  EXPECT_EQ(seq_->Truncate(0).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(seq_->Truncate(5).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(Take(*seq_), snap);
  // Released: everything fails with FailedPrecondition; Release is idempotent.
  seq_->Release();
  seq_->Release();
  EXPECT_EQ(seq_->BeginDraft().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(seq_->AppendLayer(0, {.k = k, .v = k}).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(seq_->Commit(0).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(seq_->Fork().status().code(), StatusCode::kFailedPrecondition);
  for (const auto& p : pools_) {
    EXPECT_EQ(p->num_used_blocks(), 0u);
    EXPECT_TRUE(p->CheckInvariants().ok());
  }
}

// Truncate on attention-only sequences, and its refusal once a window has
// evicted positions the shorter length would keep.
TEST(HybridTruncate, AttentionOnlyAndWindowLimits) {
  auto model = HybridModel::Create(Geo(2), {Format::kF32, Format::kF32},
                                   {LayerSpec::Full(), LayerSpec::Window(0, 4)},
                                   {.window_slack_tokens = 2});
  ASSERT_TRUE(model.ok());
  auto seq = HybridSequence::CreateContiguous(*model);
  auto twin = HybridSequence::CreateContiguous(*model);
  ASSERT_TRUE(seq.ok() && twin.ok());
  auto append = [&](HybridSequence& s, uint32_t pos) {
    for (uint32_t l = 0; l < 2; ++l) {
      const auto k = TokenRows(4, l, pos, 0, kH * kD), v = TokenRows(4, l, pos, 1, kH * kD);
      ASSERT_TRUE(s.AppendLayer(l, {.k = k, .v = v}).ok());
    }
  };
  for (uint32_t p = 0; p < 4; ++p) append(*seq, p);
  for (uint32_t p = 0; p < 2; ++p) append(*twin, p);
  ASSERT_TRUE(seq->Truncate(2).ok());  // nothing evicted yet: exact
  EXPECT_EQ(Take(*seq), Take(*twin));
  for (uint32_t p = 2; p < 9; ++p) append(*seq, p);  // window evicted positions < 4
  EXPECT_EQ(seq->HeadPositions(1, 0).front(), 4u);
  EXPECT_EQ(seq->Truncate(5).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(seq->Truncate(8).ok());  // lo(8) == lo(9): exact
  for (uint32_t p = 2; p < 8; ++p) append(*twin, p);
  EXPECT_EQ(Take(*seq), Take(*twin));
}

}  // namespace
}  // namespace kvcache

namespace kvcache {
namespace {

// Append (all layers at once) equals AppendLayer per layer; clones (both
// layouts) and forks hold the same bits; linear layers give outputs.
TEST(HybridSequence, AppendAllLayersClonesAndLinearOutputs) {
  auto model = HybridModel::Create(
      Geo(3), {Format::kBF16, Format::kTurbo4},
      {LayerSpec::Full(), LayerSpec::Linear(LinearRule::kDecay, {0.9f, 0.8f}), LayerSpec::Window(1, 2)});
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto pools = (*model)->CreatePools(std::vector<uint32_t>{16, 16});
  ASSERT_TRUE(pools.ok());
  auto a = HybridSequence::CreatePaged(*model, *pools);
  auto b = HybridSequence::CreateContiguous(*model);
  ASSERT_TRUE(a.ok() && b.ok());
  const uint32_t kv = kH * kD, T = 5;
  std::vector<float> k_all, v_all;
  for (uint32_t l = 0; l < 3; ++l) {
    for (uint32_t t = 0; t < T; ++t) {
      const auto k = TokenRows(2, l, t, 0, kv), v = TokenRows(2, l, t, 1, kv);
      k_all.insert(k_all.end(), k.begin(), k.end());
      v_all.insert(v_all.end(), v.begin(), v.end());
      ASSERT_TRUE(b->AppendLayer(l, {.k = k, .v = v}).ok());
    }
  }
  ASSERT_TRUE(a->Append(k_all, v_all).ok());
  EXPECT_EQ(Take(*a), Take(*b));
  EXPECT_EQ(a->head_len(2, 0), 5u);  // lo(5) = 1 + 4 * floor((5 - 1 - 2) / 4) = 1: all kept
  auto same = a->Clone({.layout = CloneLayout::kSame});
  auto detached = a->Clone();
  auto fork = a->Fork();
  ASSERT_TRUE(same.ok() && detached.ok() && fork.ok());
  EXPECT_EQ(same->layout(), CacheLayout::kPaged);
  EXPECT_EQ(detached->layout(), CacheLayout::kContiguous);
  EXPECT_EQ(Take(*same), Take(*a));
  EXPECT_EQ(Take(*detached), Take(*a));
  EXPECT_EQ(Take(*fork), Take(*a));
  // Linear outputs: AppendLayer with q equals LinearRead after the update.
  const auto k = TokenRows(3, 1, 0, 0, kv), v = TokenRows(3, 1, 0, 1, kv), q = TokenRows(3, 1, 0, 2, kv);
  std::vector<float> out(kv), read(kv);
  ASSERT_TRUE(a->AppendLayer(1, {.k = k, .v = v, .q = q}, out).ok());
  ASSERT_TRUE(a->LinearRead(1, q, read).ok());
  EXPECT_EQ(out, read);
  EXPECT_GT(a->allocated_bytes(), a->used_bytes());
  for (HybridSequence* s : {&*a, &*same, &*fork}) s->Release();
  for (const auto& p : *pools) {
    EXPECT_EQ(p->num_used_blocks(), 0u);
    EXPECT_TRUE(p->CheckInvariants().ok());
  }
}

}  // namespace
}  // namespace kvcache
