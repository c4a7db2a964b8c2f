// Regression (fuzz/corpus/api_sequence/regression-hybrid-window-compaction-pool-exhausted.bin):
// a window compaction that needs a copy-on-write block the pool cannot give
// returns PoolExhausted after the append (documented in hybrid.h: the
// sequence stays valid, compaction is retried by the next append). The
// sequence then holds more rows than its window, and CheckInvariants used to
// call that state Internal ("window head 0 of layer 1 stores 9 rows, want 5
// at length 9"). The retry must then give exactly the compact rows.
#include <vector>

#include <gtest/gtest.h>

#include "hybrid/test_util.h"
#include "kvcache/hybrid.h"

namespace kvcache {
namespace {

using testing_hybrid::Take;
using testing_hybrid::TokenRows;

constexpr uint32_t kH = 2, kD = 16, kBlock = 4;

// k, v of tokens [from, from + n) of stream 5 for the single layer.
void AppendTokens(HybridSequence& s, uint32_t from, uint32_t n, Status* status) {
  const uint32_t kv = s.model().geometry().kv_dim();
  std::vector<float> k, v;
  for (uint32_t p = from; p < from + n; ++p) {
    const auto kr = TokenRows(5, 0, p, 0, kv), vr = TokenRows(5, 0, p, 1, kv);
    k.insert(k.end(), kr.begin(), kr.end());
    v.insert(v.end(), vr.begin(), vr.end());
  }
  *status = s.AppendLayer(0, {.k = k, .v = v});
}

std::vector<uint32_t> Range(std::vector<uint32_t> head, uint32_t from, uint32_t to) {
  for (uint32_t p = from; p < to; ++p) head.push_back(p);
  return head;
}

TEST(HybridWindow, CompactionPoolExhaustedKeepsInvariantsAndRetries) {
  // Sink 1, window 3, slack = block size 4: lo(n) = 1 + 4 * floor((n - 4) / 4).
  auto geo = Geometry::Create({.n_layers = 1, .n_kv_heads = kH, .head_dim = kD, .block_size = kBlock});
  ASSERT_TRUE(geo.ok());
  auto model = HybridModel::Create(*geo, {Format::kF32, Format::kF32}, {LayerSpec::Window(1, 3)});
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto pools = (*model)->CreatePools(std::vector<uint32_t>{0, 4});
  ASSERT_TRUE(pools.ok());
  const auto& pool = (*pools)[HybridModel::kBoundedGroup];
  auto seq = HybridSequence::CreatePaged(*model, *pools);
  ASSERT_TRUE(seq.ok());
  Status st;
  for (uint32_t p = 0; p < 7; ++p) {
    AppendTokens(*seq, p, 1, &st);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  // lo(7) = 1: nothing evicted yet; 2 blocks, shared with a fork.
  EXPECT_EQ(seq->HeadPositions(0, 0), Range({}, 0, 7));
  auto fork = seq->Fork();
  ASSERT_TRUE(fork.ok());
  const auto fork_snap = Take(*fork);
  EXPECT_EQ(pool->num_available_blocks(), 2u);

  // Two tokens at once: the append takes both free blocks (copy of the
  // shared last block, a new one for position 8); compacting to lo(9) = 5
  // would copy the shared first block too, and the pool is empty.
  AppendTokens(*seq, 7, 2, &st);
  EXPECT_EQ(st.code(), StatusCode::kPoolExhausted) << st.ToString();
  EXPECT_TRUE(seq->window_compaction_pending());
  EXPECT_EQ(seq->num_tokens(), 9u);
  for (uint32_t h = 0; h < kH; ++h) EXPECT_EQ(seq->HeadPositions(0, h), Range({}, 0, 9));
  // The documented state is valid: it failed with Internal before the fix.
  EXPECT_TRUE(seq->CheckInvariants().ok()) << seq->CheckInvariants().ToString();
  EXPECT_EQ(Take(*fork), fork_snap);
  // Copies of the pending state are valid too.
  auto clone = seq->Clone();
  ASSERT_TRUE(clone.ok());
  EXPECT_TRUE(clone->CheckInvariants().ok()) << clone->CheckInvariants().ToString();
  EXPECT_TRUE(clone->window_compaction_pending());
  auto fork2 = seq->Fork();
  ASSERT_TRUE(fork2.ok());
  EXPECT_TRUE(fork2->window_compaction_pending());
  EXPECT_TRUE(fork2->CheckInvariants().ok()) << fork2->CheckInvariants().ToString();
  fork2->Release();

  // Once blocks are back the next append compacts: exactly what a sequence
  // that never hit the pool's limit holds.
  fork->Release();
  AppendTokens(*seq, 9, 1, &st);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_FALSE(seq->window_compaction_pending());
  for (uint32_t h = 0; h < kH; ++h) EXPECT_EQ(seq->HeadPositions(0, h), Range({0}, 5, 10));
  EXPECT_TRUE(seq->CheckInvariants().ok()) << seq->CheckInvariants().ToString();
  EXPECT_TRUE(clone->CheckInvariants().ok());
  auto ref = HybridSequence::CreateContiguous(*model);
  ASSERT_TRUE(ref.ok());
  for (uint32_t p = 0; p < 10; ++p) {
    AppendTokens(*ref, p, 1, &st);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  EXPECT_EQ(Take(*seq), Take(*ref));
  seq->Release();
  clone->Release();
  EXPECT_EQ(pool->num_used_blocks(), 0u);
  EXPECT_TRUE(pool->CheckInvariants().ok());
}

// Two window layers: a Commit whose compaction of layer 0 runs out of blocks
// leaves layer 1 uncompacted too; both are pending and the state is valid.
TEST(HybridWindow, CommitCompactionPoolExhaustedMarksEveryLayer) {
  auto geo = Geometry::Create({.n_layers = 2, .n_kv_heads = kH, .head_dim = kD, .block_size = kBlock});
  ASSERT_TRUE(geo.ok());
  auto model = HybridModel::Create(*geo, {Format::kF32, Format::kF32},
                                   {LayerSpec::Window(1, 3), LayerSpec::Window(1, 3)});
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto pools = (*model)->CreatePools(std::vector<uint32_t>{0, 4});
  ASSERT_TRUE(pools.ok());
  auto seq = HybridSequence::CreatePaged(*model, *pools);
  ASSERT_TRUE(seq.ok());
  const uint32_t kv = (*model)->geometry().kv_dim();
  auto tokens = [&](uint32_t from, uint32_t n) {
    std::vector<float> k, v;
    for (uint32_t l = 0; l < 2; ++l) {
      for (uint32_t p = from; p < from + n; ++p) {
        const auto kr = TokenRows(5, l, p, 0, kv), vr = TokenRows(5, l, p, 1, kv);
        k.insert(k.end(), kr.begin(), kr.end());
        v.insert(v.end(), vr.begin(), vr.end());
      }
    }
    return std::pair(k, v);
  };
  auto [k0, v0] = tokens(0, 7);
  ASSERT_TRUE(seq->Append(k0, v0).ok());
  auto fork = seq->Fork();
  ASSERT_TRUE(fork.ok());
  ASSERT_TRUE(seq->BeginDraft().ok());
  auto [k1, v1] = tokens(7, 2);
  ASSERT_TRUE(seq->Append(k1, v1).ok());
  const Status st = seq->Commit(2);
  EXPECT_EQ(st.code(), StatusCode::kPoolExhausted) << st.ToString();
  EXPECT_TRUE(seq->window_compaction_pending());
  EXPECT_TRUE(seq->CheckInvariants().ok()) << seq->CheckInvariants().ToString();
  fork->Release();
  seq->Release();
}

}  // namespace
}  // namespace kvcache
