// The serving engine on SmolLM2-135M (f32 K/V): concurrent greedy requests
// over GPL-3 prompts of different lengths, some sharing a prefix, chunked
// prefill under a small step budget, each give exactly the tokens
// model::Generate gives for its prompt alone. And (disabled, run by hand:
// --gtest_also_run_disabled_tests) the step throughput: 16 decodes as one
// ForwardBatch against 16 single-sequence Forward calls.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <vector>

#include "engine/engine.h"
#include "model/decoder/decoder.h"
#include "model/generate/generate.h"
#include "model/kv/kv_factory.h"
#include "model_smollm/smollm_fixture.h"

namespace kvcache::engine {
namespace {

using model::testing::Gpl3Tokens;
using model::testing::SmolLm2;

std::vector<int32_t> Alone(const model::LoadedModel& m, const std::vector<int32_t>& prompt, uint32_t n) {
  model::Decoder d(m.model(), 2);
  auto kv = model::CreateKvBackend(d.attention_shape(), {});
  EXPECT_TRUE(kv.ok());
  model::GenerateOptions g;
  g.max_new_tokens = n;
  g.stop_tokens = m.stop_tokens();
  auto r = model::Generate(d, **kv, prompt, g);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? r->tokens : std::vector<int32_t>{};
}

TEST(SmolLm2Engine, ConcurrentGreedyRequestsEqualGenerateAlone) {
  const model::LoadedModel* m = SmolLm2();
  ASSERT_NE(m, nullptr);
  const std::vector<int32_t> text = Gpl3Tokens(*m, 300);
  ASSERT_EQ(text.size(), 300u);
  EngineOptions o;
  o.pool_bytes = 64ull << 20;
  o.max_batch_tokens = 40;
  o.threads = 2;
  auto e = Engine::Create(*m, o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) {
    // Even ones share the text's first 40 tokens; odd ones start elsewhere.
    const size_t from = i % 2 ? 50 + 20 * i : 0, len = 20 + 9 * i;
    prompts.emplace_back(text.begin() + from, text.begin() + from + len);
  }
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const auto& p : prompts) {
    RequestParams r;
    r.prompt = p;
    r.max_tokens = 10;
    auto s = (*e)->Submit(r);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    streams.push_back(*s);
  }
  for (size_t i = 0; i < streams.size(); ++i) {
    std::vector<int32_t> got;
    StreamEvent ev;
    bool finished = false;
    while (!finished && streams[i]->Next(&ev, std::chrono::seconds(60))) {
      for (const TokenOut& t : ev.tokens) got.push_back(t.token);
      finished = ev.finished;
    }
    ASSERT_TRUE(finished) << "request " << i;
    EXPECT_EQ(got, Alone(*m, prompts[i], 10)) << "request " << i;
  }
  EXPECT_EQ((*e)->Metrics().pool_blocks_used, 0u);
}

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(SmolLm2Engine, DISABLED_StepThroughput) {
  const model::LoadedModel* m = SmolLm2();
  ASSERT_NE(m, nullptr);
  constexpr int kSeqs = 16, kSteps = 8;
  const std::vector<int32_t> text = Gpl3Tokens(*m, 64);
  model::Decoder d(m->model(), 2);
  const uint32_t vocab = d.config().vocab_size;
  model::KvBackendOptions o;
  o.layout = CacheLayout::kPaged;
  std::vector<std::unique_ptr<model::KvBackend>> single, batched;
  std::vector<float> logits(kSeqs * size_t{vocab});
  for (int i = 0; i < kSeqs; ++i) {
    for (auto* set : {&single, &batched}) {
      set->push_back(std::move(*model::CreateKvBackend(d.attention_shape(), o)));
      ASSERT_TRUE(d.Forward(std::span<const int32_t>(text).subspan(i, 32), *set->back(),
                            std::span<float>(logits).first(vocab)).ok());
    }
  }
  auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < kSteps; ++s) {
    for (int i = 0; i < kSeqs; ++i) {
      ASSERT_TRUE(d.Forward(std::span<const int32_t>(text).subspan(40 + s, 1), *single[i],
                            std::span<float>(logits).first(vocab)).ok());
    }
  }
  const double t_single = Seconds(t0);
  t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < kSteps; ++s) {
    std::vector<model::BatchItem> items;
    for (int i = 0; i < kSeqs; ++i) {
      items.push_back({std::span<const int32_t>(text).subspan(40 + s, 1), batched[i].get(), false});
    }
    ASSERT_TRUE(d.ForwardBatch(items, logits).ok());
  }
  const double t_batch = Seconds(t0);
  std::printf("SmolLM2 f32 paged, 2 threads, %d sequences at ~40 positions, %d steps:\n", kSeqs, kSteps);
  std::printf("  16 x Forward: %.1f ms/step, %.1f tokens/s\n", 1e3 * t_single / kSteps,
              kSeqs * kSteps / t_single);
  std::printf("  ForwardBatch: %.1f ms/step, %.1f tokens/s (x%.2f)\n", 1e3 * t_batch / kSteps,
              kSeqs * kSteps / t_batch, t_single / t_batch);
}

// 16 requests (32-token prompts, 32 tokens each) through the engine against
// the same prompts one after another through Generate.
TEST(SmolLm2Engine, DISABLED_EngineThroughput) {
  const model::LoadedModel* m = SmolLm2();
  ASSERT_NE(m, nullptr);
  constexpr int kRequests = 16;
  constexpr uint32_t kTokens = 32;
  const std::vector<int32_t> text = Gpl3Tokens(*m, 400);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < kRequests; ++i) prompts.emplace_back(text.begin() + 20 * i, text.begin() + 20 * i + 32);
  auto t0 = std::chrono::steady_clock::now();
  for (const auto& p : prompts) {
    model::Decoder d(m->model(), 2);
    auto kv = model::CreateKvBackend(d.attention_shape(), {});
    model::GenerateOptions g;
    g.max_new_tokens = kTokens;
    g.stop_at_eos = false;
    ASSERT_TRUE(model::Generate(d, **kv, p, g).ok());
  }
  const double t_seq = Seconds(t0);
  EngineOptions o;
  o.pool_bytes = 128ull << 20;
  o.threads = 2;
  auto e = Engine::Create(*m, o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  t0 = std::chrono::steady_clock::now();
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const auto& p : prompts) {
    RequestParams r;
    r.prompt = p;
    r.max_tokens = kTokens;
    r.ignore_eos = true;
    streams.push_back(*(*e)->Submit(r));
  }
  for (auto& s : streams) {
    StreamEvent ev;
    while (s->Next(&ev, std::chrono::seconds(60)) && !ev.finished) {
    }
  }
  const double t_engine = Seconds(t0);
  const EngineMetrics mt = (*e)->Metrics();
  std::printf("SmolLM2 f32, 2 threads, %d requests x (32 prompt + %u generated) tokens:\n", kRequests, kTokens);
  std::printf("  Generate one after another: %.2f s, %.1f generated tokens/s\n", t_seq,
              kRequests * kTokens / t_seq);
  std::printf("  engine, all at once: %.2f s, %.1f generated tokens/s (x%.2f), %llu steps, %.1f ms/step\n",
              t_engine, kRequests * kTokens / t_engine, t_seq / t_engine,
              static_cast<unsigned long long>(mt.steps), 1e3 * mt.step_seconds_sum / mt.steps);
}

}  // namespace
}  // namespace kvcache::engine
