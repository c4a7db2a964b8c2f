// Requests sharing a prompt prefix that arrive together, on stories260K (f32
// K/V: an adopted prefix gives bit-identical logits, so greedy outputs must
// equal model::Generate's on each prompt alone):
//   the first one prefills the shared blocks, the others wait for it to
//     publish them and adopt them (cached_tokens = their shared full blocks);
//   a leader cancelled mid-prefill does not stall its followers, nor does
//     one whose prefill gets no tokens (decodes take the step budget);
//   a request waiting for blocks is looked up once per admission, not once
//     per step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <thread>

#include "engine_fixture.h"
#include "kvcache/geometry.h"
#include "kvcache/pool.h"

namespace kvcache::engine {
namespace {

using namespace testing;  // the fixture (engine_fixture.h)

template <class Pred>
bool Soon(Pred pred, std::chrono::seconds limit = std::chrono::seconds(20)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return pred();
}

// A system prompt of about `sentences` * 20 tokens, then request i's question.
std::vector<int32_t> SharedPrompt(const model::LoadedModel& m, int sentences, int i) {
  static const char* const kQuestions[] = {
      "Tom had a red car.",
      "The dog ran to the park and found a big stick near the tree.",
      "Lily wanted a cake.",
      "A bird sang on the roof every morning, and the cat listened.",
      "Ben lost his hat in the wind.",
      "The sun was hot, so Mia went to swim in the cool blue lake with her mom.",
  };
  std::string text;
  for (int k = 0; k < sentences; ++k) text += "Once upon a time, in a small town by the sea, there lived a kind old man. ";
  text += kQuestions[i % 6];
  auto ids = m.Encode(text);
  EXPECT_TRUE(ids.ok());
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

size_t CommonPrefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  return static_cast<size_t>(std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first - a.begin());
}

// The full blocks `b` can adopt from `a`: shared, and before b's last token.
size_t SharedBlocks(const std::vector<int32_t>& a, const std::vector<int32_t>& b, uint32_t block_size) {
  return std::min(CommonPrefix(a, b), b.size() - 1) / block_size;
}

TEST(EngineSharedPrefix, FollowersWaitForTheLeadersBlocksAndAdoptThem) {
  const model::LoadedModel* m = Stories();
  ASSERT_NE(m, nullptr);
  EngineOptions o = SmallEngine();
  o.max_batch_tokens = 8;  // the leader's shared prefix takes many steps to prefill
  auto e = MakeEngine(o);
  ASSERT_NE(e, nullptr);
  constexpr int kN = 6;
  std::vector<RequestParams> params;
  for (int i = 0; i < kN; ++i) params.push_back(Greedy(SharedPrompt(*m, 6, i), 12 + i));
  const size_t shared = SharedBlocks(params[0].prompt, params[1].prompt, o.block_size);
  ASSERT_GE(shared, 5u);
  const std::vector<Outcome> out = RunAll(*e, params);
  ASSERT_EQ(out.size(), static_cast<size_t>(kN));
  EXPECT_EQ(out[0].last.usage.cached_tokens, 0u);
  uint64_t cached = 0;
  for (int i = 0; i < kN; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(out[i].tokens, GenerateAlone(*m, params[i].prompt, params[i].max_tokens, false));
    if (i > 0) {
      // At least what it shares with the first; more where an earlier
      // follower shares more (none here: the questions differ at once).
      size_t want = 0;
      for (int j = 0; j < i; ++j) want = std::max(want, SharedBlocks(params[j].prompt, params[i].prompt, 16));
      EXPECT_EQ(out[i].last.usage.cached_tokens, want * o.block_size);
    }
    cached += out[i].last.usage.cached_tokens;
  }
  const EngineMetrics mt = e->Metrics();
  EXPECT_EQ(mt.cached_prompt_tokens, cached);
  EXPECT_EQ(mt.prefix_lookups, static_cast<uint64_t>(kN));  // one per admission
  EXPECT_EQ(mt.preemptions, 0u);
  // Held, unless a submission came after the leader's blocks were out.
  EXPECT_GE(mt.prefix_holds, 1u);
  EXPECT_LE(mt.prefix_holds, static_cast<uint64_t>(kN - 1));
  EXPECT_EQ(mt.requests_held, 0u);
  EXPECT_EQ(mt.pool_blocks_used, 0u);
  EXPECT_EQ(mt.pool_blocks_free + mt.pool_blocks_cached, mt.pool_blocks_total);
  std::printf("holds %llu, cached tokens %llu of %llu prompt tokens\n",
              static_cast<unsigned long long>(mt.prefix_holds), static_cast<unsigned long long>(cached),
              static_cast<unsigned long long>(mt.prompt_tokens));
}

TEST(EngineSharedPrefix, RequestsWithoutASharedBlockAreNotHeld) {
  const model::LoadedModel* m = Stories();
  ASSERT_NE(m, nullptr);
  EngineOptions o = SmallEngine();
  o.max_batch_tokens = 8;
  auto e = MakeEngine(o);
  ASSERT_NE(e, nullptr);
  // Different openings (Prompt 1, 2, 4, 5 share no full block).
  std::vector<RequestParams> params;
  for (int i : {1, 2, 4, 5}) params.push_back(Greedy(Prompt(*m, i), 10));
  for (size_t i = 1; i < params.size(); ++i) ASSERT_EQ(SharedBlocks(params[0].prompt, params[i].prompt, 16), 0u);
  const std::vector<Outcome> out = RunAll(*e, params);
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(out[i].tokens, GenerateAlone(*m, params[i].prompt, 10, false)) << i;
    EXPECT_EQ(out[i].last.usage.cached_tokens, 0u);
  }
  EXPECT_EQ(e->Metrics().prefix_holds, 0u);

  // Nor with the prefix cache off: nothing could be adopted.
  o.prefix_cache = false;
  auto plain = MakeEngine(o);
  ASSERT_NE(plain, nullptr);
  std::vector<RequestParams> same;
  for (int i = 0; i < 3; ++i) same.push_back(Greedy(SharedPrompt(*m, 6, i), 8));
  const std::vector<Outcome> plain_out = RunAll(*plain, same);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(plain_out[i].tokens, GenerateAlone(*m, same[i].prompt, 8, false)) << i;
    EXPECT_EQ(plain_out[i].last.usage.cached_tokens, 0u);
  }
  EXPECT_EQ(plain->Metrics().prefix_holds, 0u);
}

TEST(EngineSharedPrefix, ALeaderCancelledMidPrefillDoesNotStallItsFollower) {
  const model::LoadedModel* m = Stories();
  ASSERT_NE(m, nullptr);
  EngineOptions o = SmallEngine();
  o.max_batch_tokens = 1;  // one prompt token a step: the prefill is long
  auto e = MakeEngine(o);
  ASSERT_NE(e, nullptr);
  const RequestParams lead = Greedy(SharedPrompt(*m, 12, 0), 20, true);
  const RequestParams follow = Greedy(SharedPrompt(*m, 12, 1), 20, true);
  const size_t shared = SharedBlocks(lead.prompt, follow.prompt, o.block_size);
  ASSERT_GE(shared, 15u);
  auto l = e->Submit(lead);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ASSERT_TRUE(Soon([&] { return e->Metrics().requests_running == 1; }));
  auto f = e->Submit(follow);
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE(Soon([&] { return e->Metrics().requests_held == 1; }));
  (*l)->Cancel();
  std::vector<std::shared_ptr<RequestStream>> streams = {*l, *f};
  const std::vector<Outcome> out = Drain(streams, std::chrono::seconds(60));
  EXPECT_EQ(out[0].last.finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(out[1].last.finish_reason, FinishReason::kLength);
  EXPECT_EQ(out[1].tokens, GenerateAlone(*m, follow.prompt, 20, true));
  // It adopted what the leader had published before it went, and prefilled the rest.
  EXPECT_EQ(out[1].last.usage.cached_tokens % o.block_size, 0u);
  EXPECT_LE(out[1].last.usage.cached_tokens, shared * o.block_size);
  const EngineMetrics mt = e->Metrics();
  EXPECT_EQ(mt.prefix_holds, 1u);
  EXPECT_EQ(mt.requests_held, 0u);
  EXPECT_EQ(mt.pool_blocks_used, 0u);
  std::printf("follower adopted %u of %zu shared tokens\n", out[1].last.usage.cached_tokens,
              shared * o.block_size);
}

TEST(EngineSharedPrefix, AFollowerOfAStalledLeaderIsNotHeldForEver) {
  const model::LoadedModel* m = Stories();
  ASSERT_NE(m, nullptr);
  EngineOptions o = SmallEngine();
  o.max_batch_tokens = 1;  // a decoding request takes every step's budget
  auto e = MakeEngine(o);
  ASSERT_NE(e, nullptr);
  auto d = e->Submit(Greedy(Prompt(*m, 1), 450, true));
  ASSERT_TRUE(d.ok());
  StreamEvent ev;
  ASSERT_TRUE((*d)->Next(&ev, std::chrono::seconds(10)));  // decoding now
  const RequestParams lead = Greedy(SharedPrompt(*m, 12, 0), 6, true);
  const RequestParams follow = Greedy(SharedPrompt(*m, 12, 1), 6, true);
  auto l = e->Submit(lead);
  ASSERT_TRUE(l.ok());
  ASSERT_TRUE(Soon([&] { return e->Metrics().requests_running == 2; }));
  auto f = e->Submit(follow);
  ASSERT_TRUE(f.ok());
  // The leader's prefill gets no tokens while the decode runs: the follower
  // is admitted after a few steps instead of waiting for the decode's end.
  ASSERT_TRUE(Soon([&] { return e->Metrics().requests_running == 3; }));
  EXPECT_EQ(e->Metrics().requests_finished, 0u);  // the decode still runs
  (*d)->Cancel();
  std::vector<std::shared_ptr<RequestStream>> streams = {*d, *l, *f};
  const std::vector<Outcome> out = Drain(streams);
  EXPECT_EQ(out[0].last.finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(out[1].tokens, GenerateAlone(*m, lead.prompt, 6, true));
  EXPECT_EQ(out[2].tokens, GenerateAlone(*m, follow.prompt, 6, true));
  EXPECT_EQ(out[2].last.usage.cached_tokens, 0u);  // admitted before the leader published anything
  const EngineMetrics mt = e->Metrics();
  EXPECT_EQ(mt.prefix_holds, 1u);
  EXPECT_EQ(mt.pool_blocks_used, 0u);
}

TEST(EngineSharedPrefix, ARequestWaitingForBlocksIsLookedUpOncePerAdmission) {
  const model::LoadedModel* m = Stories();
  ASSERT_NE(m, nullptr);
  EngineOptions o = SmallEngine();
  const model::ModelConfig& c = m->model().config();
  const uint32_t per_seq = (c.max_seq_len + o.block_size - 1) / o.block_size;
  auto g = Geometry::Create({c.n_layers, c.n_kv_heads, c.head_dim(), o.block_size});
  ASSERT_TRUE(g.ok());
  // One max-length sequence and two blocks: most requests wait for blocks.
  o.pool_bytes = (per_seq + 2) * BlockPool::BlockBytes(*g, o.formats);
  auto e = MakeEngine(o);
  ASSERT_NE(e, nullptr);
  std::vector<RequestParams> params;
  for (int i = 0; i < 8; ++i) params.push_back(Greedy(Prompt(*m, i), 100, true));
  const std::vector<Outcome> out = RunAll(*e, params);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(out[i].tokens, GenerateAlone(*m, params[i].prompt, 100, true)) << i;
  const EngineMetrics mt = e->Metrics();
  EXPECT_GT(mt.steps, 100u);
  // Each admission looks up once: the first ones and every re-admission of
  // a preempted request; waiting for blocks looks up nothing.
  EXPECT_EQ(mt.prefix_lookups, 8u + mt.preemptions);
  EXPECT_EQ(mt.pool_blocks_used, 0u);
  std::printf("lookups %llu, preemptions %llu, steps %llu\n", static_cast<unsigned long long>(mt.prefix_lookups),
              static_cast<unsigned long long>(mt.preemptions), static_cast<unsigned long long>(mt.steps));
}

}  // namespace
}  // namespace kvcache::engine
