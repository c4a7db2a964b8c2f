// Speculative decoding (n-gram or early-exit drafts verified by one
// multi-token pass) gives
// token for token the output of plain decoding, greedy and seeded sampling,
// on every backend; and the n-gram draft itself.
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "backend_params.h"
#include "model/decoder/decoder.h"
#include "model/generate/generate.h"
#include "model_fixture.h"

namespace kvcache::model {
namespace {

using testing::AllBackends;
using testing::BackendParam;
using testing::Stories260K;

TEST(NgramDraft, ProposesWhatFollowedTheLatestMatch) {
  const std::vector<int32_t> ctx = {1, 5, 6, 7, 8, 9, 5, 6, 7, 4, 5, 6};
  // Suffix "5 6" last occurred at index 6 (followed by 7 4 5 6); ngram 3
  // "4 5 6" never occurred before, so the 2-gram decides.
  EXPECT_EQ(NgramDraft(ctx, 3, 3), (std::vector<int32_t>{7, 4, 5}));
  EXPECT_EQ(NgramDraft(ctx, 3, 10), (std::vector<int32_t>{7, 4, 5, 6}));
  EXPECT_TRUE(NgramDraft(ctx, 3, 0).empty());
  EXPECT_TRUE(NgramDraft(std::vector<int32_t>{1, 2, 3}, 3, 4).empty());
  EXPECT_TRUE(NgramDraft(std::vector<int32_t>{}, 3, 4).empty());
  // The 1-gram fallback.
  EXPECT_EQ(NgramDraft(std::vector<int32_t>{2, 9, 3, 2}, 3, 2), (std::vector<int32_t>{9, 3}));
}

class SpeculativeOnBackend : public ::testing::TestWithParam<BackendParam> {};

TEST_P(SpeculativeOnBackend, EqualsPlainDecodingTokenForToken) {
  const auto* s = Stories260K();
  ASSERT_NE(s, nullptr);
  Decoder d(s->model);
  const auto prompt = s->tokenizer.Encode("Once upon a time, there was a little girl");
  for (float temperature : {0.0f, 0.8f}) {
    GenerateOptions plain;
    plain.max_new_tokens = 64;
    plain.sampling = {temperature, 1234};
    KV_CREATE_OR_SKIP(kv, d.attention_shape(), GetParam().options);
    auto want = Generate(d, *kv, prompt, plain);
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    ASSERT_GT(want->tokens.size(), 20u);
    for (auto [kind, draft] : {std::pair{DraftKind::kNgram, 1u}, std::pair{DraftKind::kNgram, 4u},
                               std::pair{DraftKind::kEarlyExit, 3u}}) {
      GenerateOptions spec = plain;
      spec.draft_tokens = draft;
      spec.draft_kind = kind;
      spec.draft_layers = 4;
      KV_CREATE_OR_SKIP(kv2, d.attention_shape(), GetParam().options);
      auto got = Generate(d, *kv2, prompt, spec);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_EQ(got->tokens, want->tokens) << "temperature " << temperature << " draft " << draft
                                           << " kind " << static_cast<int>(kind);
      EXPECT_GT(got->drafted_tokens, 0u);
      EXPECT_LE(got->accepted_tokens, got->drafted_tokens);
      // Every verify pass emits at least one token, accepted drafts add more.
      EXPECT_EQ(got->tokens.size(), 1 + got->forward_passes + got->accepted_tokens)
          << "temperature " << temperature << " draft " << draft;
      // The cache holds exactly the committed positions.
      EXPECT_EQ(kv2->num_tokens(), prompt.size() + got->tokens.size() - 1);
    }
  }
}

TEST(Speculative, EarlyExitOptionsAndPartialDepthPasses) {
  const auto* s = Stories260K();
  ASSERT_NE(s, nullptr);
  Decoder d(s->model);
  const auto prompt = s->tokenizer.Encode("Once upon a time");
  GenerateOptions g;
  g.max_new_tokens = 12;
  g.draft_tokens = 3;
  g.draft_kind = DraftKind::kEarlyExit;
  for (uint32_t bad_layers : {0u, 5u}) {
    g.draft_layers = bad_layers;
    KV_CREATE_OR_SKIP(kv, d.attention_shape(), KvBackendOptions{});
    EXPECT_EQ(Generate(d, *kv, prompt, g).status().code(), StatusCode::kInvalidArgument);
  }
  // A partial-depth pass stores only its layers; the next full pass needs
  // them all, so it fails until a Truncate evens the layers out.
  KV_CREATE_OR_SKIP(kv, d.attention_shape(), KvBackendOptions{});
  std::vector<float> logits(d.config().vocab_size);
  ASSERT_TRUE(d.Forward(prompt, *kv, logits).ok());
  ForwardOptions partial;
  partial.n_layers = 2;
  const int32_t x[] = {300};
  ASSERT_TRUE(d.Forward(x, *kv, logits, partial).ok());
  EXPECT_EQ(kv->num_tokens(), prompt.size() + 1);
  EXPECT_EQ(d.Forward(x, *kv, logits).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(kv->num_tokens(), prompt.size() + 1);
  ASSERT_TRUE(kv->Truncate(static_cast<uint32_t>(prompt.size())).ok());
  EXPECT_TRUE(d.Forward(x, *kv, logits).ok());
}

INSTANTIATE_TEST_SUITE_P(Backends, SpeculativeOnBackend, ::testing::ValuesIn(AllBackends()),
                         testing::BackendName);

// A precision window whose slack covers the longest draft: a reject leaves
// the window as plain decoding has it, so the tokens are the same.
std::vector<BackendParam> WindowBackends() {
  std::vector<BackendParam> out;
  KvBackendOptions o;
  o.kind = BackendKind::kCache;
  o.formats = {Format::kFp8E4M3, Format::kFp8E4M3};
  o.window = {.sinks = 4, .recent = 16, .slack = 4};
  o.layout = CacheLayout::kContiguous;
  out.push_back({"contiguous_fp8_window", o});
  o.layout = CacheLayout::kPaged;
  o.block_size = 4;
  out.push_back({"paged4_fp8_window", o});
  return out;
}
INSTANTIATE_TEST_SUITE_P(Windows, SpeculativeOnBackend, ::testing::ValuesIn(WindowBackends()),
                         testing::BackendName);

}  // namespace
}  // namespace kvcache::model
