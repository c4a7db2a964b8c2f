// Sampling, stop strings, logprobs and tiers through the engine on
// stories260K, and the sampler and stop-text pieces on their own:
//   seeded sampling gives the same tokens alone and under load (and another
//     seed other tokens), plain temperature sampling those of Generate; top_k 1 and a tiny top_p are greedy; draws follow
//     softmax(logits / T) restricted to top_k;
//   a stop string cuts the text before its first occurrence (never emitted,
//     also when it spans tokens), held-back text and partial UTF-8 characters
//     come out later or at the end;
//   logprobs are the log-softmax of the logits Forward gives alone, top
//     entries sorted with the chosen token first when greedy;
//   a host tier serves a prompt's blocks after the pool evicted them.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "engine/sampler.h"
#include "engine/stop_text.h"
#include "engine_fixture.h"
#include "kvcache/geometry.h"
#include "kvcache/pool.h"

namespace kvcache::engine {
namespace {

using namespace testing;  // the fixture (engine_fixture.h)

RequestParams Sampled(std::vector<int32_t> prompt, uint64_t seed) {
  RequestParams p = Greedy(std::move(prompt), 30, true);
  p.sampling.temperature = 0.9f;
  p.sampling.top_k = 20;
  p.sampling.top_p = 0.95f;
  p.sampling.seed = seed;
  return p;
}

TEST(EngineSampling, SeededRequestsGiveTheSameTokensAloneAndUnderLoad) {
  const model::LoadedModel* m = Stories();
  ASSERT_NE(m, nullptr);
  const RequestParams a = Sampled(Prompt(*m, 1), 42), b = Sampled(Prompt(*m, 2), 7);
  auto alone = MakeEngine(SmallEngine());
  ASSERT_NE(alone, nullptr);
  const std::vector<int32_t> a_alone = RunAll(*alone, {a})[0].tokens;
  const std::vector<int32_t> b_alone = RunAll(*alone, {b})[0].tokens;
  ASSERT_EQ(a_alone.size(), 30u);

  auto busy = MakeEngine(SmallEngine());
  ASSERT_NE(busy, nullptr);
  std::vector<RequestParams> load;
  for (int i = 0; i < 12; ++i) {
    load.push_back(i % 2 ? Sampled(Prompt(*m, i), 1000 + i) : Greedy(Prompt(*m, i), 25, true));
  }
  load.insert(load.begin() + 5, a);
  load.push_back(b);
  const std::vector<Outcome> out = RunAll(*busy, load);
  EXPECT_EQ(out[5].tokens, a_alone);
  EXPECT_EQ(out.back().tokens, b_alone);

  RequestParams other = a;
  other.sampling.seed = 43;
  EXPECT_NE(RunAll(*alone, {other})[0].tokens, a_alone);
  // top_k 1 and a tiny top_p leave only the most likely token: greedy.
  RequestParams k1 = a, p0 = a;
  k1.sampling.top_k = 1;
  p0.sampling.top_p = 1e-6f;
  const std::vector<int32_t> greedy = RunAll(*alone, {Greedy(a.prompt, 30, true)})[0].tokens;
  EXPECT_EQ(RunAll(*alone, {k1})[0].tokens, greedy);
  EXPECT_EQ(RunAll(*alone, {p0})[0].tokens, greedy);
}

TEST(EngineSampling, PlainTemperatureSamplingIsGeneratesSampling) {
  const model::LoadedModel* m = Stories();
  ASSERT_NE(m, nullptr);
  auto e = MakeEngine(SmallEngine());
  ASSERT_NE(e, nullptr);
  for (uint64_t seed : {5u, 6u}) {
    RequestParams p = Greedy(Prompt(*m, 3), 40, true);
    p.sampling.temperature = 0.8f;
    p.sampling.seed = seed;
    EXPECT_EQ(RunAll(*e, {p})[0].tokens,
              testing::GenerateAlone(*m, p.prompt, 40, true, model::SamplingOptions{0.8f, seed}));
  }
}

TEST(EngineSampling, DrawsFollowTheTemperedSoftmaxWithinTopK) {
  const std::vector<float> logits = {1.0f, 3.0f, 0.0f, 2.0f, 2.0f, -1.0f};
  SamplingParams s;
  s.temperature = 2.0f;
  s.top_k = 3;  // ids 1, 3, 4 (3 before 4 on the tie, both kept)
  std::vector<double> want(logits.size(), 0.0);
  double z = 0;
  for (int id : {1, 3, 4}) z += std::exp(logits[id] / 2.0);
  for (int id : {1, 3, 4}) want[id] = std::exp(logits[id] / 2.0) / z;
  std::vector<int> seen(logits.size(), 0);
  const int kDraws = 20000;
  TokenSampler sampler(s, 12345);
  for (int i = 0; i < kDraws; ++i) ++seen[sampler.Sample(logits)];
  for (size_t id = 0; id < logits.size(); ++id) {
    EXPECT_NEAR(static_cast<double>(seen[id]) / kDraws, want[id], 0.015) << "id " << id;
  }
  // top_p 0.5 of the three: only id 1 (mass 0.45) and 3 (next) remain.
  s.top_p = 0.5f;
  TokenSampler p(s, 9);
  for (int i = 0; i < 2000; ++i) {
    const int32_t t = p.Sample(logits);
    EXPECT_TRUE(t == 1 || t == 3) << t;
  }
  // Greedy: lowest id on ties.
  SamplingParams g;
  TokenSampler greedy(g, 1);
  EXPECT_EQ(greedy.Sample(std::vector<float>{0.0f, 5.0f, 5.0f}), 1);
}

TEST(EngineSampling, LogprobsAreTheLogSoftmaxOfTheLogits) {
  const model::LoadedModel* m = Stories();
  ASSERT_NE(m, nullptr);
  auto e = MakeEngine(SmallEngine());
  ASSERT_NE(e, nullptr);
  RequestParams p = Greedy(Prompt(*m, 4), 6, true);
  p.logprobs = true;
  p.top_logprobs = 5;
  const Outcome out = RunAll(*e, {p})[0];
  ASSERT_EQ(out.outs.size(), 6u);
  for (const TokenOut& t : out.outs) {
    ASSERT_EQ(t.top.size(), 5u);
    EXPECT_EQ(t.top[0].token, t.token);
    EXPECT_EQ(t.top[0].logprob, t.logprob);
    EXPECT_LE(t.logprob, 0.0f);
    for (size_t i = 1; i < t.top.size(); ++i) EXPECT_LE(t.top[i].logprob, t.top[i - 1].logprob);
  }
  // The first token's distribution from the decoder alone.
  model::Decoder d(m->model(), 1);
  auto kv = model::CreateKvBackend(d.attention_shape(), {});
  ASSERT_TRUE(kv.ok());
  std::vector<float> logits(d.config().vocab_size);
  ASSERT_TRUE(d.Forward(p.prompt, **kv, logits).ok());
  double mx = logits[0], z = 0;
  for (float x : logits) mx = std::max<double>(mx, x);
  for (float x : logits) z += std::exp(x - mx);
  for (const TokenLogprob& t : out.outs[0].top) {
    EXPECT_NEAR(t.logprob, logits[t.token] - mx - std::log(z), 1e-5);
  }
  // Without logprobs, none.
  const Outcome plain = RunAll(*e, {Greedy(Prompt(*m, 4), 2, true)})[0];
  EXPECT_TRUE(plain.outs[0].top.empty());
}

TEST(EngineStop, StopStringsCutTheText) {
  const model::LoadedModel* m = Stories();
  ASSERT_NE(m, nullptr);
  auto e = MakeEngine(SmallEngine());
  ASSERT_NE(e, nullptr);
  const RequestParams base = Greedy(Prompt(*m, 0), 60, true);
  const Outcome full = RunAll(*e, {base})[0];
  ASSERT_GT(full.text.size(), 40u);
  for (size_t at : {size_t{5}, size_t{17}, size_t{30}}) {
    SCOPED_TRACE(at);
    const std::string stop = full.text.substr(at, 5);
    RequestParams p = base;
    p.stop = {"never in this story", stop};
    const Outcome cut = RunAll(*e, {p})[0];
    EXPECT_EQ(cut.text, full.text.substr(0, full.text.find(stop)));
    EXPECT_EQ(cut.last.finish_reason, FinishReason::kStop);
    EXPECT_EQ(cut.last.text_tail, "");
    EXPECT_LT(cut.tokens.size(), full.tokens.size());
  }
  // A stop string that never comes: the whole text, at max_tokens.
  RequestParams p = base;
  p.stop = {"zqzqzq"};
  const Outcome whole = RunAll(*e, {p})[0];
  EXPECT_EQ(whole.text, full.text);
  EXPECT_EQ(whole.last.finish_reason, FinishReason::kLength);
}

TEST(StopText, HoldsBackPrefixesAndPartialCharacters) {
  StopText t({"<end>", "xyz"});
  bool stopped = false;
  EXPECT_EQ(t.Add("hello <e", &stopped), "hello ");  // "<e" may begin "<end>"
  EXPECT_FALSE(stopped);
  EXPECT_EQ(t.Add("nx", &stopped), "<en");  // not "<end>"; but "x" may begin "xyz"
  EXPECT_EQ(t.Add(" x", &stopped), "x ");
  EXPECT_EQ(t.Add("y", &stopped), "");
  EXPECT_EQ(t.Add("z tail", &stopped), "");  // "xyz" completed: nothing after it
  EXPECT_TRUE(stopped);
  EXPECT_EQ(t.TakeHeld(), "");

  StopText u({});
  EXPECT_EQ(u.Add("caf\xC3", &stopped), "caf");  // half of e-acute held
  EXPECT_EQ(u.Add("\xA9!", &stopped), "\xC3\xA9!");
  EXPECT_EQ(u.Add("\xE2\x82", &stopped), "");  // two bytes of a euro sign
  EXPECT_EQ(u.TakeHeld(), "\xE2\x82");         // released at the end as they are
  EXPECT_EQ(IncompleteUtf8Tail("a\xF0\x9F\x98"), 3u);
  EXPECT_EQ(IncompleteUtf8Tail("a\xF0\x9F\x98\x80"), 0u);
  EXPECT_EQ(IncompleteUtf8Tail(""), 0u);
}

TEST(EngineTiers, HostTierServesEvictedPrefixBlocks) {
  const model::LoadedModel* m = Stories();
  ASSERT_NE(m, nullptr);
  EngineOptions o = SmallEngine();
  const model::ModelConfig& c = m->model().config();
  auto g = Geometry::Create({c.n_layers, c.n_kv_heads, c.head_dim(), o.block_size});
  ASSERT_TRUE(g.ok());
  const uint32_t per_seq = (c.max_seq_len + o.block_size - 1) / o.block_size;
  o.pool_bytes = (per_seq + 2) * BlockPool::BlockBytes(*g, o.formats);
  o.tiers = "host:16MiB";
  o.model_id = "stories260K-test";
  auto e = MakeEngine(o);
  ASSERT_NE(e, nullptr);
  std::vector<int32_t> prompt = Prompt(*m, 0);
  const std::vector<int32_t> more = Prompt(*m, 6);
  prompt.insert(prompt.end(), more.begin(), more.end());
  const Outcome first = RunAll(*e, {Greedy(prompt, 4, true)})[0];
  std::this_thread::sleep_for(std::chrono::seconds(1));  // the tier writer runs behind
  // Others fill the pool: the prompt's cached blocks are evicted.
  std::vector<RequestParams> churn;
  for (int i = 1; i <= 4; ++i) churn.push_back(Greedy(Prompt(*m, 3 * i + 1), 160, true));
  RunAll(*e, churn);
  const Outcome again = RunAll(*e, {Greedy(prompt, 4, true)})[0];
  EXPECT_EQ(again.tokens, first.tokens);
  EXPECT_EQ(again.last.usage.cached_tokens, (prompt.size() - 1) / 16 * 16);
  EXPECT_GT(e->Metrics().tier_hit_blocks, 0u);
}

}  // namespace
}  // namespace kvcache::engine
