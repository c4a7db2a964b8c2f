// The engine on stories260K (f32 K/V, so chunked prefill is bit-exact and a
// greedy request must give exactly model::Generate's tokens):
//   16 concurrent greedy requests == each prompt alone through Generate;
//   a tiny pool forces preemptions, outputs unchanged, the pool back to its
//     baseline afterwards; cancellation (Cancel and dropping the stream)
//     frees the blocks; prefix reuse reports cached tokens; bad params and
//     options give their errors and change nothing; a full queue says so;
//     Shutdown drains, and past its deadline cancels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>

#include "engine_fixture.h"
#include "kvcache/geometry.h"
#include "kvcache/pool.h"

namespace kvcache::engine {
namespace {

using namespace testing;  // the fixture (engine_fixture.h)

// Polls until pred() or 10 s.
template <class Pred>
bool Eventually(Pred pred) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return pred();
}

size_t BlockBytes(const model::LoadedModel& m, FormatPair formats, uint32_t block_size) {
  const model::ModelConfig& c = m.model().config();
  auto g = Geometry::Create({c.n_layers, c.n_kv_heads, c.head_dim(), block_size});
  EXPECT_TRUE(g.ok());
  return BlockPool::BlockBytes(*g, formats);
}

TEST(Engine, ConcurrentGreedyRequestsEqualGenerateAlone) {
  const model::LoadedModel* m = Stories();
  ASSERT_NE(m, nullptr);
  auto e = MakeEngine(SmallEngine());
  ASSERT_NE(e, nullptr);
  std::vector<RequestParams> params;
  for (int i = 0; i < 16; ++i) params.push_back(Greedy(Prompt(*m, i), 20 + i % 5));
  const std::vector<Outcome> out = RunAll(*e, params);
  ASSERT_EQ(out.size(), 16u);
  for (int i = 0; i < 16; ++i) {
    SCOPED_TRACE(i);
    const std::vector<int32_t> want = GenerateAlone(*m, params[i].prompt, params[i].max_tokens, false);
    EXPECT_EQ(out[i].tokens, want);
    auto text = m->Decode(want);
    ASSERT_TRUE(text.ok());
    // The pieces after the prompt's last token spell the generated text.
    std::string pieces;
    int32_t prev = params[i].prompt.back();
    for (int32_t t : want) {
      pieces += *m->DecodePiece(prev, t);
      prev = t;
    }
    EXPECT_EQ(out[i].text, pieces);
    EXPECT_EQ(out[i].last.usage.prompt_tokens, params[i].prompt.size());
    EXPECT_EQ(out[i].last.usage.completion_tokens, want.size());
    EXPECT_EQ(out[i].last.finish_reason,
              want.size() == params[i].max_tokens ? FinishReason::kLength : FinishReason::kStop);
  }
  size_t generated = 0;
  for (const Outcome& o : out) generated += o.tokens.size();
  EXPECT_GT(generated, 16u * 10);  // real generations, not instant stops
  const EngineMetrics mt = e->Metrics();
  EXPECT_EQ(mt.generated_tokens, generated);
  EXPECT_EQ(mt.requests_finished, 16u);
  EXPECT_GT(mt.steps, 0u);
  EXPECT_EQ(mt.pool_blocks_used, 0u);
  EXPECT_EQ(mt.step_seconds_counts.size(), mt.step_seconds_bounds.size());
  EXPECT_LE(mt.step_seconds_counts.back(), mt.steps);
}

// A precision window in the engine: each request's greedy tokens equal
// model::Generate on a paged cache with the same window, alone. The slack
// covers the longest pass, so chunked prefill (the engine) and one-pass
// prefill (Generate) read the same rows; without the prefix cache nothing
// is adopted (adopted blocks bring their sinks' bf16 rows, not the recent
// ones).
TEST(Engine, PrecisionWindowRequestsEqualGenerateAlone) {
  const model::LoadedModel* m = Stories();
  ASSERT_NE(m, nullptr);
  EngineOptions o = SmallEngine();
  o.formats = {Format::kFp8E4M3, Format::kFp8E4M3};
  o.window = {.sinks = 4, .recent = 8, .slack = 64};
  o.prefix_cache = false;
  auto e = MakeEngine(o);
  ASSERT_NE(e, nullptr);
  std::vector<RequestParams> params;
  for (int i = 0; i < 6; ++i) params.push_back(Greedy(Prompt(*m, i), 24));
  const std::vector<Outcome> out = RunAll(*e, params);
  ASSERT_EQ(out.size(), params.size());
  model::Decoder d(m->model(), 1);
  model::KvBackendOptions b;
  b.formats = o.formats;
  b.layout = CacheLayout::kPaged;
  b.window = o.window;
  for (size_t i = 0; i < params.size(); ++i) {
    auto kv = model::CreateKvBackend(d.attention_shape(), b);
    ASSERT_TRUE(kv.ok()) << kv.status().ToString();
    model::GenerateOptions g;
    g.max_new_tokens = params[i].max_tokens;
    g.stop_tokens = m->stop_tokens();
    auto want = model::Generate(d, **kv, params[i].prompt, g);
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    EXPECT_EQ(out[i].tokens, want->tokens) << i;
  }
  EXPECT_EQ(e->Metrics().pool_blocks_used, 0u);
}

// A precision window's sinks travel with a cached prefix: a request whose
// prompt prefix another request published reads the publisher's bf16 sink
// rows, so it answers exactly (greedy tokens and their logprobs) what it
// answers with the prefix cache off. fp8 e4m3: stories260K's head_dim 8
// takes no turbo format. Sinks only (no recent positions): the recent
// positions inside adopted blocks stay in the format, so with recent
// positions the cached answer may differ (docs/cache.md).
TEST(Engine, PrecisionWindowSinksTravelWithACachedPrefix) {
  const model::LoadedModel* m = Stories();
  ASSERT_NE(m, nullptr);
  EngineOptions o = SmallEngine();
  o.formats = {Format::kFp8E4M3, Format::kFp8E4M3};
  o.window = {.sinks = 4};
  auto cached = MakeEngine(o);
  EngineOptions off = o;
  off.prefix_cache = false;
  auto uncached = MakeEngine(off);
  ASSERT_TRUE(cached != nullptr && uncached != nullptr);
  const std::vector<int32_t> leader = Prompt(*m, 0), follower = Prompt(*m, 3);
  ASSERT_GE(std::mismatch(leader.begin(), leader.end(), follower.begin(), follower.end()).first -
                leader.begin(),
            static_cast<ptrdiff_t>(2 * o.block_size));
  ASSERT_EQ(RunAll(*cached, {Greedy(leader, 8)}).size(), 1u);  // publishes the shared blocks
  RequestParams p = Greedy(follower, 24);
  p.logprobs = true;
  const std::vector<Outcome> with = RunAll(*cached, {p});
  const std::vector<Outcome> without = RunAll(*uncached, {p});
  ASSERT_EQ(with.size(), 1u);
  ASSERT_EQ(without.size(), 1u);
  EXPECT_GE(with[0].last.usage.cached_tokens, 2 * o.block_size);
  EXPECT_EQ(without[0].last.usage.cached_tokens, 0u);
  EXPECT_EQ(with[0].tokens, without[0].tokens);
  ASSERT_EQ(with[0].outs.size(), without[0].outs.size());
  for (size_t i = 0; i < with[0].outs.size(); ++i) {
    EXPECT_EQ(with[0].outs[i].logprob, without[0].outs[i].logprob) << i;
  }
  EXPECT_EQ(cached->Metrics().pool_blocks_used, 0u);
}

TEST(Engine, TinyPoolPreemptsAndLosesNothing) {
  const model::LoadedModel* m = Stories();
  ASSERT_NE(m, nullptr);
  EngineOptions o = SmallEngine();
  const uint32_t per_seq = (m->model().config().max_seq_len + o.block_size - 1) / o.block_size;
  // One max-length sequence and two blocks: 8 requests of ~140 positions cannot run at once.
  o.pool_bytes = (per_seq + 2) * BlockBytes(*m, o.formats, o.block_size);
  auto e = MakeEngine(o);
  ASSERT_NE(e, nullptr);
  std::vector<RequestParams> params;
  for (int i = 0; i < 8; ++i) params.push_back(Greedy(Prompt(*m, i), 120, /*ignore_eos=*/true));
  // And one seeded sampled request: its random stream survives preemption.
  RequestParams sampled = Greedy(Prompt(*m, 5), 120, true);
  sampled.sampling.temperature = 0.7f;
  sampled.sampling.seed = 99;
  auto calm = MakeEngine(SmallEngine());
  ASSERT_NE(calm, nullptr);
  const std::vector<int32_t> sampled_alone = RunAll(*calm, {sampled})[0].tokens;
  params.push_back(sampled);
  const std::vector<Outcome> out = RunAll(*e, params);
  EXPECT_EQ(out[8].tokens, sampled_alone);
  for (int i = 0; i < 8; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(out[i].tokens, GenerateAlone(*m, params[i].prompt, 120, true));
    EXPECT_EQ(out[i].last.finish_reason, FinishReason::kLength);
  }
  const EngineMetrics mt = e->Metrics();
  EXPECT_GT(mt.preemptions, 0u);
  std::printf("preemptions: %llu in %llu steps\n", static_cast<unsigned long long>(mt.preemptions),
              static_cast<unsigned long long>(mt.steps));
  EXPECT_EQ(mt.requests_finished, 9u);
  // Only the prefix cache's blocks remain, all reclaimable.
  EXPECT_EQ(mt.pool_blocks_used, 0u);
  EXPECT_EQ(mt.pool_blocks_free + mt.pool_blocks_cached, mt.pool_blocks_total);
}

TEST(Engine, AStepBudgetBelowTheRunningCountStarvesNoOne) {
  const model::LoadedModel* m = Stories();
  ASSERT_NE(m, nullptr);
  EngineOptions o = SmallEngine();
  o.max_batch_tokens = 3;  // 8 running, 3 tokens a step
  o.max_running = 8;
  auto e = MakeEngine(o);
  ASSERT_NE(e, nullptr);
  std::vector<RequestParams> params;
  for (int i = 0; i < 8; ++i) params.push_back(Greedy(Prompt(*m, i), 15, true));
  const std::vector<Outcome> out = RunAll(*e, params);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(out[i].tokens, GenerateAlone(*m, params[i].prompt, 15, true)) << i;
  }
}

TEST(Engine, SubmitsAndCancelsFromManyThreads) {
  const model::LoadedModel* m = Stories();
  ASSERT_NE(m, nullptr);
  auto e = MakeEngine(SmallEngine());
  ASSERT_NE(e, nullptr);
  std::vector<std::vector<Outcome>> results(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::shared_ptr<RequestStream>> streams;
      for (int i = 0; i < 5; ++i) {
        auto s = e->Submit(Greedy(Prompt(*m, 5 * t + i), 30, true));
        if (s.ok()) streams.push_back(*s);
      }
      streams[0]->Cancel();  // at once: it may not have run at all
      results[t] = Drain(streams);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < 4; ++t) {
    ASSERT_EQ(results[t].size(), 5u);
    EXPECT_EQ(results[t][0].last.finish_reason, FinishReason::kCancelled);
    for (int i = 1; i < 5; ++i) {
      EXPECT_EQ(results[t][i].tokens, GenerateAlone(*m, Prompt(*m, 5 * t + i), 30, true)) << t << " " << i;
    }
  }
  const EngineMetrics mt = e->Metrics();
  EXPECT_EQ(mt.requests_cancelled, 4u);
  EXPECT_EQ(mt.requests_finished, 16u);
  EXPECT_EQ(mt.pool_blocks_used, 0u);
}

TEST(Engine, StopTokensEndARequestUnlessIgnored) {
  const model::LoadedModel* m = Stories();
  ASSERT_NE(m, nullptr);
  auto e = MakeEngine(SmallEngine());
  ASSERT_NE(e, nullptr);
  // A prompt whose story ends (a stop token) within 200 tokens.
  int found = -1;
  std::vector<int32_t> ended;
  for (int i = 0; i < 16 && found < 0; ++i) {
    ended = GenerateAlone(*m, Prompt(*m, i), 200, false);
    if (ended.size() < 200) found = i;
  }
  ASSERT_GE(found, 0) << "no prompt reached a stop token";
  const Outcome stopped = RunAll(*e, {Greedy(Prompt(*m, found), 200)})[0];
  EXPECT_EQ(stopped.tokens, ended);
  EXPECT_EQ(stopped.last.finish_reason, FinishReason::kStop);
  // ignore_eos: the stop token is emitted and generation goes on.
  const Outcome on = RunAll(*e, {Greedy(Prompt(*m, found), 200, true)})[0];
  ASSERT_EQ(on.tokens.size(), 200u);
  EXPECT_TRUE(std::equal(ended.begin(), ended.end(), on.tokens.begin()));
  const std::vector<int32_t> stops = m->stop_tokens();
  EXPECT_NE(std::find(stops.begin(), stops.end(), on.tokens[ended.size()]), stops.end());
  EXPECT_EQ(on.last.finish_reason, FinishReason::kLength);
}

TEST(Engine, CancelFreesTheBlocks) {
  const model::LoadedModel* m = Stories();
  ASSERT_NE(m, nullptr);
  auto e = MakeEngine(SmallEngine());
  ASSERT_NE(e, nullptr);
  auto s = e->Submit(Greedy(Prompt(*m, 1), 400, true));
  ASSERT_TRUE(s.ok());
  StreamEvent ev;
  ASSERT_TRUE((*s)->Next(&ev, std::chrono::seconds(10)));
  EXPECT_FALSE(ev.finished);
  EXPECT_GT(e->Metrics().pool_blocks_used, 0u);
  (*s)->Cancel();
  (*s)->Cancel();  // idempotent
  std::vector<std::shared_ptr<RequestStream>> streams = {*s};
  const std::vector<Outcome> out = Drain(streams);
  EXPECT_EQ(out[0].last.finish_reason, FinishReason::kCancelled);
  EXPECT_LT(out[0].last.usage.completion_tokens, 400u);
  EXPECT_FALSE((*s)->Next(&ev, std::chrono::milliseconds(1)));  // after the final event
  EXPECT_EQ(e->Metrics().pool_blocks_used, 0u);
  EXPECT_EQ(e->Metrics().requests_cancelled, 1u);

  // Dropping the stream cancels too.
  auto s2 = e->Submit(Greedy(Prompt(*m, 2), 400, true));
  ASSERT_TRUE(s2.ok());
  ASSERT_TRUE((*s2)->Next(&ev, std::chrono::seconds(10)));
  s2 = Status::Internal("dropped");
  EXPECT_TRUE(Eventually([&] { return e->Metrics().requests_cancelled == 2; }));
  EXPECT_TRUE(Eventually([&] { return e->Metrics().pool_blocks_used == 0; }));
}

TEST(Engine, SecondRequestReusesThePromptsBlocks) {
  const model::LoadedModel* m = Stories();
  ASSERT_NE(m, nullptr);
  auto e = MakeEngine(SmallEngine());
  ASSERT_NE(e, nullptr);
  std::vector<int32_t> prompt = Prompt(*m, 0);
  const std::vector<int32_t> more = Prompt(*m, 3);
  prompt.insert(prompt.end(), more.begin(), more.end());
  ASSERT_GT(prompt.size(), 40u);
  const std::vector<Outcome> first = RunAll(*e, {Greedy(prompt, 10)});
  EXPECT_EQ(first[0].last.usage.cached_tokens, 0u);
  const std::vector<Outcome> second = RunAll(*e, {Greedy(prompt, 10)});
  // Every full block of the prompt but the one holding its last token.
  EXPECT_EQ(second[0].last.usage.cached_tokens, (prompt.size() - 1) / 16 * 16);
  EXPECT_EQ(second[0].tokens, first[0].tokens);
  EXPECT_EQ(e->Metrics().cached_prompt_tokens, second[0].last.usage.cached_tokens);

  // Without the prefix cache, nothing is reused.
  EngineOptions o = SmallEngine();
  o.prefix_cache = false;
  auto plain = MakeEngine(o);
  ASSERT_NE(plain, nullptr);
  RunAll(*plain, {Greedy(prompt, 10)});
  const std::vector<Outcome> again = RunAll(*plain, {Greedy(prompt, 10)});
  EXPECT_EQ(again[0].last.usage.cached_tokens, 0u);
  EXPECT_EQ(again[0].tokens, first[0].tokens);
}

TEST(Engine, BadParamsAreRejectedAndQueueNothing) {
  const model::LoadedModel* m = Stories();
  ASSERT_NE(m, nullptr);
  auto e = MakeEngine(SmallEngine());
  ASSERT_NE(e, nullptr);
  const uint32_t vocab = m->model().config().vocab_size;
  const uint32_t ctx = m->model().config().max_seq_len;
  const RequestParams good = Greedy(Prompt(*m, 2), 4);
  std::vector<RequestParams> bad(11, good);
  bad[0].prompt.clear();
  bad[1].prompt.push_back(static_cast<int32_t>(vocab));
  bad[2].prompt.push_back(-1);
  bad[3].prompt.assign(ctx, 5);  // no room for one token
  bad[4].max_tokens = 0;
  bad[5].sampling.temperature = std::nanf("");
  bad[6].sampling.top_p = 0.0f;
  bad[7].sampling.top_p = 1.5f;
  bad[8].top_logprobs = 21;
  bad[9].stop.assign(9, "x");
  bad[10].stop = {"ok", ""};
  for (size_t i = 0; i < bad.size(); ++i) {
    auto s = e->Submit(bad[i]);
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << "case " << i;
  }
  const EngineMetrics mt = e->Metrics();
  EXPECT_EQ(mt.requests_waiting + mt.requests_running + mt.requests_finished, 0u);
  EXPECT_EQ(mt.prompt_tokens, 0u);
  // The longest prompt that fits is fine.
  RequestParams edge = good;
  edge.prompt.assign(ctx - 1, 5);
  edge.max_tokens = 3;
  const std::vector<Outcome> out = RunAll(*e, {edge});
  EXPECT_EQ(out[0].last.usage.completion_tokens, 1u);
  EXPECT_EQ(out[0].last.finish_reason, FinishReason::kLength);
}

TEST(Engine, BadOptionsAreRejected) {
  const model::LoadedModel* m = Stories();
  ASSERT_NE(m, nullptr);
  std::vector<EngineOptions> bad(10, SmallEngine());
  bad[0].threads = 0;
  bad[1].max_batch_tokens = 0;
  bad[2].max_running = 0;
  bad[3].max_waiting = 0;
  bad[4].block_size = 0;
  bad[5].pool_bytes = 4096;  // less than one max-length sequence
  bad[6].formats = FormatPair{Format::kQ8_0, Format::kQ8_0};  // head_dim 8: not a multiple of 32
  bad[7].tiers = "bogus:1";
  bad[7].model_id = "stories260K";
  bad[8].tiers = "host:1MiB";  // no model_id
  bad[9].tiers = "host:1MiB";
  bad[9].model_id = "stories260K";
  bad[9].prefix_cache = false;
  for (size_t i = 0; i < bad.size(); ++i) {
    auto e = Engine::Create(*m, bad[i]);
    EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument) << "case " << i << ": " << e.status().ToString();
  }
}

TEST(Engine, FullQueueSaysResourceExhausted) {
  const model::LoadedModel* m = Stories();
  ASSERT_NE(m, nullptr);
  EngineOptions o = SmallEngine();
  o.max_running = 1;
  o.max_waiting = 2;
  auto e = MakeEngine(o);
  ASSERT_NE(e, nullptr);
  auto a = e->Submit(Greedy(Prompt(*m, 1), 400, true));
  ASSERT_TRUE(a.ok());
  StreamEvent ev;
  ASSERT_TRUE((*a)->Next(&ev, std::chrono::seconds(10)));  // running: the queue is empty
  auto b = e->Submit(Greedy(Prompt(*m, 2), 2));
  auto c = e->Submit(Greedy(Prompt(*m, 3), 2));
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(c.ok());
  auto d = e->Submit(Greedy(Prompt(*m, 4), 2));
  EXPECT_EQ(d.status().code(), StatusCode::kCapacityExceeded);
  EXPECT_EQ(e->Metrics().requests_waiting, 2u);
  (*a)->Cancel();
  std::vector<std::shared_ptr<RequestStream>> rest = {*b, *c};
  const std::vector<Outcome> out = Drain(rest);
  EXPECT_EQ(out[0].last.usage.completion_tokens, 2u);
  EXPECT_EQ(out[1].last.usage.completion_tokens, 2u);
}

TEST(Engine, ShutdownDrainsThenCancels) {
  const model::LoadedModel* m = Stories();
  ASSERT_NE(m, nullptr);
  auto e = MakeEngine(SmallEngine());
  ASSERT_NE(e, nullptr);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 4; ++i) streams.push_back(*e->Submit(Greedy(Prompt(*m, i), 12, true)));
  e->Shutdown(std::chrono::seconds(30));
  EXPECT_EQ(e->Submit(Greedy(Prompt(*m, 0), 2)).status().code(), StatusCode::kFailedPrecondition);
  const std::vector<Outcome> out = Drain(streams);
  for (const Outcome& o : out) {
    EXPECT_EQ(o.last.finish_reason, FinishReason::kLength);
    EXPECT_EQ(o.tokens.size(), 12u);
  }
  e->Shutdown(std::chrono::seconds(1));  // idempotent

  // A zero deadline cancels what runs.
  auto f = MakeEngine(SmallEngine());
  ASSERT_NE(f, nullptr);
  std::vector<std::shared_ptr<RequestStream>> longs = {*f->Submit(Greedy(Prompt(*m, 1), 400, true))};
  StreamEvent ev;
  ASSERT_TRUE(longs[0]->Next(&ev, std::chrono::seconds(10)));
  f->Shutdown(std::chrono::milliseconds(0));
  const std::vector<Outcome> cut = Drain(longs);
  EXPECT_EQ(cut[0].last.finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(f->Metrics().pool_blocks_used, 0u);
}

}  // namespace
}  // namespace kvcache::engine
