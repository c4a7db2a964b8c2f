// The decoder on every KV backend: greedy text is a coherent story, cached
// decoding equals full recomputation, a multi-token pass equals single-token
// passes, paged equals contiguous, fork == fresh runs, and errors leave the
// cache as it was.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "backend_params.h"
#include "model/decoder/decoder.h"
#include "model/generate/generate.h"
#include "model/kv/cache_kv.h"
#include "model/kv/naive_kv.h"
#include "model_fixture.h"

namespace kvcache::model {
namespace {

using testing::AllBackends;
using testing::BackendParam;
using testing::Stories260K;

constexpr float kLogitTol = 1e-5f;

// Two attention orders through the model differ by a few ULP of the
// logits: kLogitTol, or 2e-6 of the largest logit (about 16 ULP) where the
// logits are large.
float LogitTol(std::span<const float> ref) {
  float m = 0;
  for (float v : ref) m = std::max(m, std::fabs(v));
  return std::max(kLogitTol, 2e-6f * m);
}

// Logits of the last token of `tokens` by full recomputation: a fresh naive
// backend, all tokens in one pass (no state kept between steps).
std::vector<float> Recompute(Decoder& d, std::span<const int32_t> tokens,
                             NaiveAttention attention = NaiveAttention::kScalar) {
  auto kv = NaiveKv::Create(d.attention_shape(), {}, attention);
  EXPECT_TRUE(kv.ok());
  std::vector<float> logits(d.config().vocab_size);
  EXPECT_TRUE(d.Forward(tokens, **kv, logits).ok());
  return logits;
}

float MaxAbsDiff(std::span<const float> a, std::span<const float> b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

class DecoderOnBackend : public ::testing::TestWithParam<BackendParam> {};

TEST_P(DecoderOnBackend, GreedyStoryIsTheKnownOne) {
  const auto* s = Stories260K();
  ASSERT_NE(s, nullptr);
  Decoder d(s->model);
  KV_CREATE_OR_SKIP(kv, d.attention_shape(), GetParam().options);
  const auto prompt = s->tokenizer.Encode("Once upon a time");
  GenerateOptions g;
  g.max_new_tokens = 40;
  auto r = Generate(d, *kv, prompt, g);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::vector<int32_t> all(prompt);
  all.insert(all.end(), r->tokens.begin(), r->tokens.end());
  auto text = s->tokenizer.Decode(all);
  ASSERT_TRUE(text.ok());
  // stories260K's greedy continuation, as llama2.c's run.c prints it.
  EXPECT_EQ(*text,
            "Once upon a time, there was a little girl named Lily. She loved to play outside "
            "in the park. One day, she saw a big, red ball.");
}

// Cached decoding == full recomputation: greedy, one token per step, the
// logits of every step compared with recomputing the whole prefix.
TEST_P(DecoderOnBackend, CachedDecodingEqualsFullRecomputation) {
  const auto* s = Stories260K();
  ASSERT_NE(s, nullptr);
  Decoder d(s->model);
  Decoder ref_decoder(s->model);
  KV_CREATE_OR_SKIP(kv, d.attention_shape(), GetParam().options);
  std::vector<int32_t> tokens = s->tokenizer.Encode("The cat sat");
  const uint32_t vocab = d.config().vocab_size;
  std::vector<float> logits(vocab);
  std::vector<float> prefill(vocab);
  ASSERT_TRUE(
      d.Forward(std::span<const int32_t>(tokens).first(tokens.size() - 1), *kv, prefill).ok());
  float worst = 0, tol = kLogitTol;
  for (int step = 0; step < 32; ++step) {
    ASSERT_TRUE(d.Forward(std::span<const int32_t>(tokens).last(1), *kv, logits).ok());
    const auto ref = Recompute(ref_decoder, tokens);
    worst = std::max(worst, MaxAbsDiff(logits, ref));
    tol = std::max(tol, LogitTol(ref));
    ASSERT_EQ(Argmax(logits), Argmax(ref)) << "step " << step;
    if (GetParam().options.kind == BackendKind::kCache) {
      // Recomputed with kvcache's reference attention order: bit-identical.
      EXPECT_EQ(logits, Recompute(ref_decoder, tokens, NaiveAttention::kKvcacheReference))
          << "step " << step;
    }
    tokens.push_back(Argmax(logits));
  }
  EXPECT_LE(worst, tol);
  EXPECT_EQ(kv->num_tokens(), tokens.size() - 1);
}

// A multi-token pass (prefill / verify) == the same tokens one at a time.
TEST_P(DecoderOnBackend, MultiTokenPassEqualsSingleTokenPasses) {
  const auto* s = Stories260K();
  ASSERT_NE(s, nullptr);
  Decoder d(s->model);
  KV_CREATE_OR_SKIP(one, d.attention_shape(), GetParam().options);
  KV_CREATE_OR_SKIP(many, d.attention_shape(), GetParam().options);
  const auto tokens = s->tokenizer.Encode(testing::kStoryText);
  const uint32_t vocab = d.config().vocab_size;
  const size_t n = 40;
  std::vector<float> all(n * vocab), step(vocab);
  // Two chunks, so the second pass also reads rows of an earlier pass.
  ASSERT_TRUE(d.Forward(std::span<const int32_t>(tokens).first(13), *many,
                        std::span<float>(all).first(13 * vocab))
                  .ok());
  ASSERT_TRUE(d.Forward(std::span<const int32_t>(tokens).subspan(13, n - 13), *many,
                        std::span<float>(all).subspan(13 * vocab))
                  .ok());
  for (size_t i = 0; i < n; ++i) {
    ASSERT_TRUE(d.Forward(std::span<const int32_t>(tokens).subspan(i, 1), *one, step).ok());
    EXPECT_LE(MaxAbsDiff(step, std::span<const float>(all).subspan(i * vocab, vocab)), kLogitTol)
        << "position " << i;
  }
}

// Fork after a shared prompt, continue both: each equals a fresh run on its
// own full prompt (and the parent is not disturbed by the child's writes).
TEST_P(DecoderOnBackend, ForkEqualsFreshRuns) {
  const auto* s = Stories260K();
  ASSERT_NE(s, nullptr);
  Decoder d(s->model);
  const uint32_t vocab = d.config().vocab_size;
  const auto shared = s->tokenizer.Encode("Once upon a time, there was a little dog");
  const auto a_suffix = s->tokenizer.Encode(" named Spot. He liked to run", {.bos = false});
  const auto b_suffix = s->tokenizer.Encode(" who was very sad. One day", {.bos = false});
  KV_CREATE_OR_SKIP(parent, d.attention_shape(), GetParam().options);
  std::vector<float> logits(vocab);
  ASSERT_TRUE(d.Forward(shared, *parent, logits).ok());
  auto child = parent->Fork();
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  EXPECT_EQ((*child)->num_tokens(), shared.size());

  auto continue_and_compare = [&](KvBackend& kv, const std::vector<int32_t>& suffix) {
    std::vector<float> forked(suffix.size() * vocab), fresh_logits(suffix.size() * vocab);
    ASSERT_TRUE(d.Forward(suffix, kv, forked).ok());
    // Then greedy for a few steps on the forked sequence.
    std::vector<int32_t> full(shared);
    full.insert(full.end(), suffix.begin(), suffix.end());
    std::vector<float> step(vocab);
    std::copy(forked.end() - vocab, forked.end(), step.begin());
    for (int i = 0; i < 8; ++i) {
      full.push_back(Argmax(step));
      ASSERT_TRUE(d.Forward(std::span<const int32_t>(full).last(1), kv, step).ok());
    }
    KV_CREATE_OR_SKIP(fresh, d.attention_shape(), GetParam().options);
    std::vector<float> fresh_all(full.size() * vocab);
    ASSERT_TRUE(d.Forward(full, *fresh, fresh_all).ok());
    EXPECT_LE(MaxAbsDiff(forked, std::span<const float>(fresh_all)
                                     .subspan(shared.size() * vocab, suffix.size() * vocab)),
              kLogitTol);
    EXPECT_LE(MaxAbsDiff(step, std::span<const float>(fresh_all).last(vocab)), kLogitTol);
  };
  continue_and_compare(**child, b_suffix);  // the child writes first
  continue_and_compare(*parent, a_suffix);
}

TEST_P(DecoderOnBackend, ErrorsLeaveTheCacheAsItWas) {
  const auto* s = Stories260K();
  ASSERT_NE(s, nullptr);
  Decoder d(s->model);
  KV_CREATE_OR_SKIP(kv, d.attention_shape(), GetParam().options);
  const uint32_t vocab = d.config().vocab_size;
  std::vector<float> logits(vocab);
  const auto tokens = s->tokenizer.Encode("Tom had a red hat");
  ASSERT_TRUE(d.Forward(tokens, *kv, logits).ok());
  const std::vector<float> before = logits;
  const uint32_t n = kv->num_tokens();

  const int32_t bad_token[] = {3, 512};
  std::vector<float> two(2 * vocab), seven(7);
  EXPECT_EQ(d.Forward(bad_token, *kv, two).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(d.Forward(tokens, *kv, seven).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(kv->Truncate(n + 1).code(), StatusCode::kOutOfRange);
  std::vector<int32_t> too_long(d.config().max_seq_len, 5);
  EXPECT_FALSE(d.Forward(too_long, *kv, logits).ok());
  EXPECT_EQ(kv->num_tokens(), n);

  // The cache still continues exactly like a fresh one.
  ASSERT_TRUE(kv->Truncate(n - 1).ok());
  ASSERT_TRUE(d.Forward(std::span<const int32_t>(tokens).last(1), *kv, logits).ok());
  EXPECT_EQ(MaxAbsDiff(logits, before), 0.0f);
}

INSTANTIATE_TEST_SUITE_P(Backends, DecoderOnBackend, ::testing::ValuesIn(AllBackends()),
                         testing::BackendName);

TEST(Decoder, RopeRotatesPairsByPosition) {
  // Position 0 is the identity; pair i of a head rotates by pos * 10000^(-2i/d).
  std::vector<float> v = {1, 0, 1, 0, 0, 1, 0, 1};
  std::vector<float> w = v;
  ApplyRope(w.data(), 1, 8, 0);
  EXPECT_EQ(w, v);
  ApplyRope(w.data(), 1, 8, 3);
  const float a0 = 3.0f, a1 = 3.0f * std::pow(10000.0f, -2.0f / 8);
  EXPECT_NEAR(w[0], std::cos(a0), 1e-6);
  EXPECT_NEAR(w[1], std::sin(a0), 1e-6);
  EXPECT_NEAR(w[2], std::cos(a1), 1e-6);
  EXPECT_NEAR(w[3], std::sin(a1), 1e-6);
  // Rotations preserve each pair's length.
  for (int i = 0; i < 8; i += 2) EXPECT_NEAR(w[i] * w[i] + w[i + 1] * w[i + 1], 1.0f, 1e-6);
}

// A paged cache whose pool runs dry: the pass fails with PoolExhausted (at
// layer 0's append: all layers share one block table, so later layers never
// allocate), nothing is left behind, and the sequence continues exactly as if
// the failed pass never happened.
TEST(CacheKv, PoolExhaustionLeavesTheSequenceAsItWas) {
  const auto* s = Stories260K();
  ASSERT_NE(s, nullptr);
  Decoder d(s->model);
  const uint32_t vocab = d.config().vocab_size;
  CacheKvOptions o;
  o.layout = CacheLayout::kPaged;
  o.block_size = 4;
  o.pool_blocks = 2;  // 8 positions
  auto kv = CacheKv::Create(d.attention_shape(), o);
  ASSERT_TRUE(kv.ok()) << kv.status().ToString();
  const auto tokens = s->tokenizer.Encode("Sam and Ann saw a big fish in the pond");
  ASSERT_GE(tokens.size(), 10u);
  std::vector<float> logits(vocab);
  ASSERT_TRUE(d.Forward(std::span<const int32_t>(tokens).first(6), **kv, logits).ok());
  const Status full = d.Forward(std::span<const int32_t>(tokens).subspan(6, 4), **kv, logits);
  EXPECT_EQ(full.code(), StatusCode::kPoolExhausted) << full.ToString();
  EXPECT_EQ((*kv)->num_tokens(), 6u);
  for (uint32_t l = 0; l < d.config().n_layers; ++l) EXPECT_EQ((*kv)->cache().num_tokens(l), 6u);
  EXPECT_TRUE((*kv)->cache().CheckInvariants().ok());
  ASSERT_TRUE(d.Forward(std::span<const int32_t>(tokens).subspan(6, 2), **kv, logits).ok());
  auto fresh = NaiveKv::Create(d.attention_shape(), {}, NaiveAttention::kKvcacheReference);
  std::vector<float> want(vocab);
  ASSERT_TRUE(d.Forward(std::span<const int32_t>(tokens).first(8), **fresh, want).ok());
  EXPECT_EQ(logits, want);
}

}  // namespace
}  // namespace kvcache::model
