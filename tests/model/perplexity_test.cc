// Teacher-forced perplexity with the cache in each format: the f32 figure is
// the same on every layout and in any chunking, KL/top-1 against f32 are
// 0/1 for f32 itself, quality is monotone in precision within noise, and
// formats this model's head_dim (8) cannot take are reported, not crashed on.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "backend_params.h"
#include "model/decoder/decoder.h"
#include "model/generate/perplexity.h"
#include "model_fixture.h"

namespace kvcache::model {
namespace {

using testing::AllBackends;
using testing::BackendParam;
using testing::Stories260K;

// The story's first 120 tokens (enough to separate the formats, fast).
std::vector<int32_t> StoryTokens() {
  auto t = Stories260K()->tokenizer.Encode(testing::kStoryText);
  t.resize(std::min<size_t>(t.size(), 120));
  return t;
}

TEST(Perplexity, KlHelpers) {
  const std::vector<float> a = {1, 2, 3}, b = {1, 2, 3}, c = {3, 2, 1};
  EXPECT_EQ(KlDivergence(a, b), 0.0);
  EXPECT_GT(KlDivergence(a, c), 0.1);
  EXPECT_NEAR(LogSumExp(std::vector<float>{0, 0}), std::log(2.0), 1e-12);
}

TEST(Perplexity, F32IsTheSameOnEveryLayoutAndChunking) {
  const auto* s = Stories260K();
  ASSERT_NE(s, nullptr);
  Decoder d(s->model);
  const auto tokens = StoryTokens();
  ASSERT_EQ(tokens.size(), 120u);
  const uint32_t vocab = d.config().vocab_size;
  std::map<std::string, std::vector<float>> logits;
  for (const BackendParam& b : AllBackends()) {
    for (uint32_t chunk : {1u, 7u}) {
      KV_CREATE_OR_SKIP(kv, d.attention_shape(), b.options);
      PerplexityOptions p;
      p.chunk_tokens = chunk;
      auto l = TeacherForcedLogits(d, *kv, tokens, p);
      ASSERT_TRUE(l.ok()) << l.status().ToString();
      logits[b.name + "/" + std::to_string(chunk)] = std::move(l).value();
    }
  }
  const PerplexityResult first = ScoreLogits(logits.begin()->second, tokens, vocab);
  // A trained model on a simple story: well below uniform (log 512 = 6.24).
  EXPECT_LT(first.mean_nll, 2.5);
  EXPECT_GT(first.mean_nll, 0.3);
  for (const auto& [name, l] : logits) {
    const PerplexityResult r = ScoreLogits(l, tokens, vocab, logits.begin()->second);
    EXPECT_NEAR(r.mean_nll, first.mean_nll, 1e-6) << name;
    EXPECT_LT(r.kl_vs_ref, 1e-9) << name;
    EXPECT_EQ(r.top1_agree_vs_ref, 1.0) << name;
  }
  // kvcache's f32 attention is bit-exact across layouts and query blocks.
  ASSERT_TRUE(logits.count("contiguous/1"));
  for (const char* other : {"contiguous/7", "paged16/1", "paged16/7", "paged4/1", "paged4/7"}) {
    EXPECT_EQ(logits[other], logits["contiguous/1"]) << other;
  }
}

class PerplexityOnBackend : public ::testing::TestWithParam<BackendParam> {};

TEST_P(PerplexityOnBackend, MonotoneInPrecision) {
  const auto* s = Stories260K();
  ASSERT_NE(s, nullptr);
  Decoder d(s->model);
  const auto tokens = StoryTokens();
  // Tiers from most to least precise; a tier's worst must not beat the next
  // tier's best by more than the noise allowance.
  const std::vector<std::vector<const char*>> tiers = {
      {"f32"}, {"f16", "bf16"}, {"fp8_e4m3", "q8", "bf16:fp8_e4m3"}};
  // NLL noise: on this text fp8_e4m3 keys move the mean NLL by about -0.02
  // nats (KL 0.014), so NLL is compared with 0.03 nats of slack and the
  // ordering is carried by KL.
  constexpr double kNllNoise = 0.03;
  std::vector<FormatPair> pairs;
  for (const auto& tier : tiers) {
    for (const char* name : tier) pairs.push_back(*ParseFormatPair(name));
  }
  auto evals = EvaluateFormats(d, tokens, GetParam().options, pairs);
  ASSERT_TRUE(evals.ok()) << evals.status().ToString();
  std::vector<std::pair<double, double>> kl_range, nll_range;  // per tier (min, max)
  size_t i = 0;
  for (const auto& tier : tiers) {
    double kl_min = INFINITY, kl_max = -INFINITY, nll_min = INFINITY, nll_max = -INFINITY;
    for (const char* name : tier) {
      const FormatEvaluation& e = (*evals)[i++];
      if (e.state != FormatEvaluation::State::kOk) {
        // Only "not built yet" may skip a format here; these all fit head_dim 8.
        EXPECT_EQ(e.state, FormatEvaluation::State::kUnavailable) << name << e.message;
        continue;
      }
      const PerplexityResult& r = e.result;
      kl_min = std::min(kl_min, r.kl_vs_ref);
      kl_max = std::max(kl_max, r.kl_vs_ref);
      nll_min = std::min(nll_min, r.mean_nll);
      nll_max = std::max(nll_max, r.mean_nll);
      EXPECT_GE(r.top1_agree_vs_ref, 0.8) << name;
      EXPECT_NEAR(r.mean_nll, r.ref_mean_nll, 0.1) << name;
    }
    if (std::isfinite(kl_min)) {
      kl_range.push_back({kl_min, kl_max});
      nll_range.push_back({nll_min, nll_max});
    }
  }
  if (kl_range.size() < 2) GTEST_SKIP() << "fewer than two precision tiers are built";
  for (size_t t = 1; t < kl_range.size(); ++t) {
    EXPECT_LE(kl_range[t - 1].second, kl_range[t].first * 1.5 + 1e-6) << "tier " << t;
    EXPECT_LE(nll_range[t - 1].second, nll_range[t].first + kNllNoise) << "tier " << t;
  }
}

TEST_P(PerplexityOnBackend, FormatsTheHeadDimCannotTakeAreReported) {
  const auto* s = Stories260K();
  ASSERT_NE(s, nullptr);
  Decoder d(s->model);
  const auto tokens = StoryTokens();
  for (const char* name : {"turbo8", "turbo4", "turbo3", "turbo2", "q8_0", "q4_0", "bf16:turbo4",
                           "q4_0:f32"}) {
    KvBackendOptions o = GetParam().options;
    o.formats = *ParseFormatPair(name);
    auto e = EvaluateFormat(d, tokens, o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    EXPECT_EQ(e->state, FormatEvaluation::State::kUnsupported) << name;
    EXPECT_NE(e->message.find("8"), std::string::npos) << e->message;
    // Creating the backend directly is an error value too.
    EXPECT_EQ(CreateKvBackend(d.attention_shape(), o).status().code(),
              StatusCode::kInvalidArgument);
  }
}

std::vector<BackendParam> NaiveAndContiguous() {
  auto all = AllBackends();
  return {all[0], all[1]};
}

INSTANTIATE_TEST_SUITE_P(Backends, PerplexityOnBackend, ::testing::ValuesIn(NaiveAndContiguous()),
                         testing::BackendName);

// The cache's precision window on a real model: the same variant through
// the cache (both layouts) and through the naive reference backend gives
// the same distributions up to float rounding, and the window moves them
// closer to f32 than the format alone. fp8_e4m3 takes head_dim 8 and
// calibrates on neither backend, so the two compute the same thing.
TEST(Perplexity, CacheWindowMatchesTheNaiveVariant) {
  const auto* s = Stories260K();
  ASSERT_NE(s, nullptr);
  Decoder d(s->model);
  const auto tokens = StoryTokens();
  PerplexityOptions p;
  p.chunk_tokens = 8;
  const std::vector<KvVariant> variants = {*ParseKvVariant("fp8_e4m3+s4+r16"),
                                           *ParseKvVariant("fp8_e4m3")};
  auto naive = EvaluateVariants(d, tokens, variants, p);
  ASSERT_TRUE(naive.ok()) << naive.status().ToString();
  for (CacheLayout layout : {CacheLayout::kContiguous, CacheLayout::kPaged}) {
    KvBackendOptions cache;
    cache.layout = layout;
    cache.block_size = 8;
    auto got = EvaluateVariants(d, tokens, variants, p, &cache);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    const double kl_window = (*got)[0].result.kl_vs_ref, kl_plain = (*got)[1].result.kl_vs_ref;
    EXPECT_LT(kl_window, 0.5 * kl_plain);
    for (size_t i = 0; i < variants.size(); ++i) {
      EXPECT_NEAR((*got)[i].result.kl_vs_ref, (*naive)[i].result.kl_vs_ref,
                  0.02 * (*naive)[i].result.kl_vs_ref + 1e-7)
          << KvVariantName(variants[i]);
    }
  }
  // What the cache does not build is refused before anything runs.
  KvBackendOptions cache;
  const std::vector<KvVariant> bad = {*ParseKvVariant("fp8_e4m3+s4+ob")};
  EXPECT_EQ(EvaluateVariants(d, tokens, bad, p, &cache).status().code(),
            StatusCode::kInvalidArgument);
  auto parsed = ParseKvBackendOptions("fp8_e4m3+s2+r8", "paged", "cache", 8);
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->window, (PrecisionWindow{.sinks = 2, .recent = 8}));
  EXPECT_FALSE(ParseKvBackendOptions("fp8_e4m3+s2", "paged", "naive", 8).ok());
}

}  // namespace
}  // namespace kvcache::model
