// HybridKv's eviction on stories260K: spec parsing; a policy whose budget covers the
// whole text equals the full cache; a streaming window agrees with the full
// cache exactly until the first eviction and differs after it; H2O keeps
// its per-head budget; passes larger than the lookback are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "model/decoder/decoder.h"
#include "model/generate/perplexity.h"
#include "model/kv/hybrid_kv.h"
#include "model/kv/kv_factory.h"
#include "model/kv_logits.h"
#include "model_fixture.h"

namespace kvcache::model {
namespace {

using testing::Stories260K;

std::vector<int32_t> Tokens() {
  auto t = Stories260K()->tokenizer.Encode(testing::kStoryText);
  t.resize(std::min<size_t>(t.size(), 120));
  return t;
}

std::vector<float> Logits(Decoder& d, const EvictionSpec& e, std::span<const int32_t> tokens, uint32_t chunk,
                          uint32_t max_chunk = 64) {
  KvBackendOptions o;
  o.eviction = e;
  o.max_chunk_tokens = max_chunk;
  return testing::KvLogits(d, o, tokens, chunk);
}

float MaxDiff(const float* a, const float* b, size_t n) {
  float m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

TEST(EvictionSpec, Parses) {
  EXPECT_FALSE(ParseEvictionSpec("").value().enabled());
  EXPECT_FALSE(ParseEvictionSpec("none").value().enabled());
  const EvictionSpec s = *ParseEvictionSpec("streaming:4,1024");
  EXPECT_EQ(s.kind, EvictionSpec::Kind::kStreaming);
  EXPECT_EQ(s.sinks, 4u);
  EXPECT_EQ(s.window, 1024u);
  EXPECT_EQ(s.ToString(), "streaming:4,1024");
  const EvictionSpec h = *ParseEvictionSpec("h2o:256,32");
  EXPECT_EQ(h.kind, EvictionSpec::Kind::kH2o);
  EXPECT_EQ(h.ToString(), "h2o:256,32");
  for (const char* bad : {"streaming", "streaming:4", "streaming:4,0", "h2o:32,32", "h2o:8,0", "lru:1,2",
                          "streaming:a,b", "streaming:4,5,6"}) {
    EXPECT_EQ(ParseEvictionSpec(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

TEST(HybridKv, EvictionAgreesWithTheFullCacheUntilItEvicts) {
  const auto* s = Stories260K();
  ASSERT_NE(s, nullptr);
  Decoder d(s->model);
  const auto tokens = Tokens();
  const uint32_t vocab = d.config().vocab_size;
  const std::vector<float> full = Logits(d, {}, tokens, 1);
  ASSERT_FALSE(full.empty());
  // Budgets covering every position: the same logits as the full cache.
  EvictionSpec wide = *ParseEvictionSpec("streaming:4,500");
  EXPECT_LE(MaxDiff(Logits(d, wide, tokens, 1).data(), full.data(), full.size()), 1e-5f);
  EvictionSpec wide_h2o = *ParseEvictionSpec("h2o:500,16");
  EXPECT_LE(MaxDiff(Logits(d, wide_h2o, tokens, 1).data(), full.data(), full.size()), 1e-5f);
  // sinks 2 + window 30: position p sees everything while p < 32.
  for (uint32_t chunk : {1u, 8u}) {
    EvictionSpec w = *ParseEvictionSpec("streaming:2,30");
    const std::vector<float> l = Logits(d, w, tokens, chunk, chunk);
    ASSERT_EQ(l.size(), full.size());
    EXPECT_LE(MaxDiff(l.data(), full.data(), 32 * vocab), 1e-5f) << "chunk " << chunk;
    float later = 0;
    for (size_t p = 40; p + 1 < tokens.size(); ++p) {
      later = std::max(later, MaxDiff(l.data() + p * vocab, full.data() + p * vocab, vocab));
    }
    EXPECT_GT(later, 1e-3f) << "chunk " << chunk;
  }
  // A chunk larger than the lookback the backend was made for is refused.
  KvBackendOptions o;
  o.eviction = *ParseEvictionSpec("streaming:2,30");
  o.max_chunk_tokens = 4;
  auto kv = CreateKvBackend(d.attention_shape(), o);
  ASSERT_TRUE(kv.ok());
  std::vector<float> logits(vocab);
  EXPECT_EQ(d.Forward(std::span<const int32_t>(tokens).first(5), **kv, logits).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*kv)->num_tokens(), 0u);
}

TEST(HybridKv, H2oKeepsItsBudgetPerHead) {
  const auto* s = Stories260K();
  ASSERT_NE(s, nullptr);
  Decoder d(s->model);
  const auto tokens = Tokens();
  HybridKvOptions o;
  o.eviction = *ParseEvictionSpec("h2o:24,8");
  auto kv = HybridKv::Create(d.attention_shape(), o);
  ASSERT_TRUE(kv.ok()) << kv.status().ToString();
  std::vector<float> logits(d.config().vocab_size);
  for (size_t i = 0; i < 60; ++i) {
    ASSERT_TRUE(d.Forward(std::span<const int32_t>(tokens).subspan(i, 1), **kv, logits).ok()) << i;
  }
  EXPECT_EQ((*kv)->num_tokens(), 60u);
  // Evicted at the start of each pass: at most budget + the newest pass.
  for (uint32_t l = 0; l < d.config().n_layers; ++l) {
    for (uint32_t h = 0; h < d.config().n_kv_heads; ++h) {
      EXPECT_LE((*kv)->sequence().head_len(l, h), 25u) << l << "/" << h;
      EXPECT_GE((*kv)->sequence().head_len(l, h), 24u) << l << "/" << h;
    }
  }
  // Fork and truncate work on the bounded sequence.
  auto f = (*kv)->Fork();
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->num_tokens(), 60u);
}

}  // namespace
}  // namespace kvcache::model
