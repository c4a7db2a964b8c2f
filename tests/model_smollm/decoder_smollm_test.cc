// The decoder on SmolLM2-135M (GQA 9/3 heads, head_dim 64, 30 layers, Q4_1
// weights) through kvcache's caches, over a few hundred tokens of real text:
//   cached decoding == full recomputation (the naive f32 backend, one pass:
//     each position's logits depend on its prefix only), within float rounding;
//   chunked prefill == token by token, paged == contiguous (bit-exact: the
//     f32 cache's attention is exact across layouts and query blocks);
//   fork == fresh run; speculative greedy == plain greedy (n-gram and
//     early-exit drafts); and a sanity check that the model predicts text.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "model/decoder/decoder.h"
#include "model/generate/generate.h"
#include "model/generate/perplexity.h"
#include "model/kv/kv_factory.h"
#include "model/kv/naive_kv.h"
#include "model/kv_logits.h"
#include "model_smollm/smollm_fixture.h"

namespace kvcache::model {
namespace {

using testing::Gpl3Tokens;
using testing::SmolLm2;

constexpr size_t kTokens = 320;
constexpr uint32_t kThreads = 2;

KvBackendOptions Cache(CacheLayout layout, uint32_t block_size = 16) {
  KvBackendOptions o;
  o.kind = BackendKind::kCache;
  o.layout = layout;
  o.block_size = block_size;
  return o;
}

std::vector<float> Logits(Decoder& d, const KvBackendOptions& kv_options, std::span<const int32_t> tokens,
                          uint32_t chunk) {
  return testing::KvLogits(d, kv_options, tokens, chunk);
}

// Shared between the tests: the token-by-token contiguous f32 run.
struct Runs {
  std::vector<int32_t> tokens;
  std::vector<float> step;  // contiguous, chunk 1
};
const Runs& TokenByToken() {
  static Runs r = [] {
    Runs out;
    const LoadedModel* m = SmolLm2();
    if (m == nullptr) return out;
    out.tokens = Gpl3Tokens(*m, kTokens);
    Decoder d(m->model(), kThreads);
    out.step = Logits(d, Cache(CacheLayout::kContiguous), out.tokens, 1);
    return out;
  }();
  return r;
}

TEST(SmolLm2Decoder, CachedDecodingEqualsFullRecomputation) {
  const LoadedModel* m = SmolLm2();
  ASSERT_NE(m, nullptr);
  const Runs& r = TokenByToken();
  ASSERT_EQ(r.tokens.size(), kTokens);
  Decoder d(m->model(), kThreads);
  auto naive = NaiveKv::Create(d.attention_shape(), {}, NaiveAttention::kScalar);
  ASSERT_TRUE(naive.ok());
  const uint32_t vocab = d.config().vocab_size;
  std::vector<float> full((kTokens - 1) * vocab);
  // One pass over every position: no cache reuse between positions.
  ASSERT_TRUE(d.Forward(std::span<const int32_t>(r.tokens).first(kTokens - 1), **naive, full).ok());
  ASSERT_EQ(r.step.size(), full.size());
  double worst = 0, worst_scale = 0;
  size_t argmax_differs = 0;
  for (size_t i = 0; i + 1 < kTokens; ++i) {
    const std::span<const float> a(r.step.data() + i * vocab, vocab), b(full.data() + i * vocab, vocab);
    for (uint32_t v = 0; v < vocab; ++v) {
      worst = std::max(worst, static_cast<double>(std::fabs(a[v] - b[v])));
      worst_scale = std::max(worst_scale, static_cast<double>(std::fabs(b[v])));
    }
    argmax_differs += Argmax(a) != Argmax(b);
  }
  // Float rounding only: summation order in attention, through 30 layers.
  EXPECT_LE(worst, 2e-4 * worst_scale) << "max |logit| " << worst_scale;
  EXPECT_EQ(argmax_differs, 0u);
  const PerplexityResult s = ScoreLogits(r.step, r.tokens, vocab, full);
  EXPECT_LT(s.kl_vs_ref, 1e-7);
  // A real language model on English text: far below uniform (log 49152 = 10.8).
  EXPECT_LT(s.mean_nll, 3.5);
  std::printf("SmolLM2 on %zu GPL-3 tokens: mean NLL %.4f (ppl %.3f), max |cached - recomputed| %.3g of max |logit| %.3g\n",
              kTokens, s.mean_nll, s.perplexity, worst, worst_scale);
}

TEST(SmolLm2Decoder, ChunkedPrefillAndPagedEqualTokenByToken) {
  const LoadedModel* m = SmolLm2();
  ASSERT_NE(m, nullptr);
  const Runs& r = TokenByToken();
  ASSERT_EQ(r.tokens.size(), kTokens);
  Decoder d(m->model(), kThreads);
  EXPECT_EQ(Logits(d, Cache(CacheLayout::kContiguous), r.tokens, 64), r.step) << "contiguous, chunks of 64";
  EXPECT_EQ(Logits(d, Cache(CacheLayout::kPaged, 16), r.tokens, 1), r.step) << "paged16, token by token";
  EXPECT_EQ(Logits(d, Cache(CacheLayout::kPaged, 16), r.tokens, 37), r.step) << "paged16, chunks of 37";
}

TEST(SmolLm2Decoder, ForkEqualsFreshRun) {
  const LoadedModel* m = SmolLm2();
  ASSERT_NE(m, nullptr);
  const Runs& r = TokenByToken();
  ASSERT_EQ(r.tokens.size(), kTokens);
  Decoder d(m->model(), kThreads);
  const uint32_t vocab = d.config().vocab_size;
  const size_t prefix = 160;
  auto parent = CreateKvBackend(d.attention_shape(), Cache(CacheLayout::kPaged, 16));
  ASSERT_TRUE(parent.ok());
  std::vector<float> logits(vocab);
  ASSERT_TRUE(d.Forward(std::span<const int32_t>(r.tokens).first(prefix), **parent, logits).ok());
  auto child = (*parent)->Fork();
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  // The child continues with the real text, the parent with other tokens
  // (the text reversed); each must equal a fresh run of its whole sequence.
  std::vector<int32_t> other(r.tokens.begin(), r.tokens.begin() + prefix);
  other.insert(other.end(), r.tokens.rbegin(), r.tokens.rbegin() + 64);
  for (size_t i = prefix; i < prefix + 64; ++i) {
    ASSERT_TRUE(d.Forward(std::span<const int32_t>(r.tokens).subspan(i, 1), **child, logits).ok());
    ASSERT_EQ(std::vector<float>(logits), std::vector<float>(r.step.begin() + i * vocab,
                                                              r.step.begin() + (i + 1) * vocab))
        << "child at " << i;
  }
  std::vector<float> parent_logits((64) * vocab);
  ASSERT_TRUE(d.Forward(std::span<const int32_t>(other).subspan(prefix, 64), **parent, parent_logits).ok());
  const std::vector<float> fresh = Logits(d, Cache(CacheLayout::kContiguous), other, 1);
  ASSERT_EQ(fresh.size(), (other.size() - 1) * vocab);
  // Positions prefix .. prefix+62 predict the next "other" token.
  for (size_t i = 0; i + 1 < 64; ++i) {
    const float* a = parent_logits.data() + i * vocab;
    const float* b = fresh.data() + (prefix + i) * vocab;
    ASSERT_TRUE(std::equal(a, a + vocab, b)) << "parent at " << prefix + i;
  }
}

TEST(SmolLm2Decoder, SpeculativeGreedyEqualsPlainGreedy) {
  const LoadedModel* m = SmolLm2();
  ASSERT_NE(m, nullptr);
  Decoder d(m->model(), kThreads);
  auto prompt = m->EncodeChat("Write the numbers from one to twenty in words, separated by commas.");
  ASSERT_TRUE(prompt.ok()) << prompt.status().ToString();
  GenerateOptions g;
  g.max_new_tokens = 64;
  // Past the answer's <|im_end|> too, so every run has 64 tokens to agree on.
  g.stop_at_eos = false;
  auto run = [&](uint32_t draft, DraftKind kind) {
    auto kv = CreateKvBackend(d.attention_shape(), Cache(CacheLayout::kPaged, 16));
    EXPECT_TRUE(kv.ok());
    GenerateOptions o = g;
    o.draft_tokens = draft;
    o.draft_kind = kind;
    o.draft_layers = 6;
    auto r = Generate(d, **kv, *prompt, o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(r).value() : GenerateResult{};
  };
  const GenerateResult plain = run(0, DraftKind::kNgram);
  ASSERT_EQ(plain.tokens.size(), 64u);
  auto text = m->Decode(plain.tokens);
  ASSERT_TRUE(text.ok());
  EXPECT_NE(text->find("one"), std::string::npos) << *text;
  const GenerateResult ngram = run(4, DraftKind::kNgram);
  EXPECT_EQ(ngram.tokens, plain.tokens);
  EXPECT_GT(ngram.accepted_tokens, 0u);
  const GenerateResult layers = run(2, DraftKind::kEarlyExit);
  EXPECT_EQ(layers.tokens, plain.tokens);
  std::printf("greedy: %zu tokens; n-gram draft accepted %u/%u; 6-layer draft %u/%u\n", plain.tokens.size(),
              ngram.accepted_tokens, ngram.drafted_tokens, layers.accepted_tokens, layers.drafted_tokens);
}

}  // namespace
}  // namespace kvcache::model
