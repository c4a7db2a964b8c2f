// Gemma 3 270M (scripts/fetch_model.sh gemma3; ./run.sh test fetches it) on
// the hybrid cache, kept short for CI: a 2k-token text whose last positions
// give bit-identical logits however the prefill is chunked and whichever
// layout holds the K/V; a text past the 512-position window agreeing with
// the naive reference that masks every row; and the perplexity of a text
// llama.cpp scores at 8.089 (llama-perplexity b11434, f16 cache, -c 1024,
// the second half of the chunk). A test that cannot get the model fails.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "kvcache/simd.h"
#include "loaded_models.h"
#include "model_gemma/apache_text.h"
#include "model/decoder/decoder.h"
#include "model/decoder/loaded_model.h"
#include "model/generate/perplexity.h"
#include "model/io/model_store.h"
#include "model/kv/kv_factory.h"
#include "model/tensor/matmul_bf16.h"

namespace kvcache::model {
namespace {

constexpr uint32_t kSeqLen = 2304;

// Gemma 3 loaded once per product kind: bf16 for the fast 2k prefills
// (the proofs hold for every product), f32 for the comparisons with
// references computed another way (bf16 products would amplify their
// rounding differences).
const LoadedModel* Gemma3(MatMulInputs inputs) {
  return testing::LoadOnce(Gemma3Path(), kSeqLen, inputs, "fetch it with scripts/fetch_model.sh gemma3");
}

std::vector<int32_t> Text(const LoadedModel& m, size_t n) { return testing::ApacheText(m, n); }

// The largest pass of every backend here: the window layers' lookback, so
// every backend stores the same rows (compaction is a function of length).
constexpr uint32_t kMaxChunk = 512;

// The logits of the last prefill token and of `decode` more tokens fed one
// at a time, after prefilling tokens[0, size - decode) in chunks of `chunk`.
std::vector<float> LastLogits(Decoder& d, const KvBackendOptions& o, std::span<const int32_t> tokens,
                              uint32_t chunk, uint32_t decode) {
  KvBackendOptions with_chunk = o;
  with_chunk.max_chunk_tokens = kMaxChunk;
  auto kv = CreateKvBackend(d.attention_shape(), with_chunk);
  EXPECT_TRUE(kv.ok()) << kv.status().ToString();
  if (!kv.ok()) return {};
  const uint32_t vocab = d.config().vocab_size;
  std::vector<float> out, logits(vocab);
  const size_t prefill = tokens.size() - decode;
  for (size_t i = 0; i < prefill; i += chunk) {
    const size_t n = std::min<size_t>(chunk, prefill - i);
    const Status s = d.Forward(tokens.subspan(i, n), **kv, logits);
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (!s.ok()) return {};
  }
  out.insert(out.end(), logits.begin(), logits.end());
  for (size_t i = prefill; i < tokens.size(); ++i) {
    const Status s = d.Forward(tokens.subspan(i, 1), **kv, logits);
    EXPECT_TRUE(s.ok()) << s.ToString();
    out.insert(out.end(), logits.begin(), logits.end());
  }
  return out;
}

TEST(Gemma3Model, TwoThousandTokensAreBitExactAcrossChunksAndLayouts) {
  const LoadedModel* m = Gemma3(MatMulInputs::kBf16);
  ASSERT_NE(m, nullptr);
  Decoder d(m->model(), 2);
  const std::vector<int32_t> tokens = Text(*m, 2052);
  ASSERT_EQ(tokens.size(), 2052u);
  KvBackendOptions contiguous;
  const std::vector<float> a = LastLogits(d, contiguous, tokens, 256, 4);
  KvBackendOptions paged;
  paged.layout = CacheLayout::kPaged;
  const std::vector<float> b = LastLogits(d, paged, tokens, 100, 4);
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
  // The 4 decoded positions fed as one chunk give the same bits as one by one.
  KvBackendOptions o = paged;
  o.max_chunk_tokens = kMaxChunk;
  auto kv = CreateKvBackend(d.attention_shape(), o);
  ASSERT_TRUE(kv.ok());
  const uint32_t vocab = d.config().vocab_size;
  std::vector<float> last(vocab), chunk4(4 * vocab);
  for (size_t i = 0; i < 2048; i += 512) {
    ASSERT_TRUE(d.Forward(std::span<const int32_t>(tokens).subspan(i, 512), **kv, last).ok());
  }
  EXPECT_EQ(0, std::memcmp(last.data(), a.data(), vocab * sizeof(float)));
  ASSERT_TRUE(d.Forward(std::span<const int32_t>(tokens).subspan(2048, 4), **kv, chunk4).ok());
  // chunk4's row i predicts after token 2048 + i, as a's row 1 + i does.
  EXPECT_EQ(0, std::memcmp(chunk4.data(), a.data() + vocab, 3 * vocab * sizeof(float)));
}

TEST(Gemma3Model, SlidingLayersAgreeWithTheMaskingReferencePastTheWindow) {
  const LoadedModel* m = Gemma3(MatMulInputs::kF32);
  ASSERT_NE(m, nullptr);
  Decoder d(m->model(), 2);
  const std::vector<int32_t> tokens = Text(*m, 700);
  KvBackendOptions cache;
  const std::vector<float> a = LastLogits(d, cache, tokens, 64, 2);
  KvBackendOptions naive;
  naive.kind = BackendKind::kNaive;
  const std::vector<float> b = LastLogits(d, naive, tokens, 64, 2);
  ASSERT_EQ(a.size(), b.size());
  double kl = 0;
  const uint32_t vocab = d.config().vocab_size;
  for (size_t r = 0; r < a.size() / vocab; ++r) {
    kl = std::max(kl, KlDivergence(std::span<const float>(b).subspan(r * vocab, vocab),
                                   std::span<const float>(a).subspan(r * vocab, vocab)));
  }
  EXPECT_LT(kl, 1e-6);
}

TEST(Gemma3Model, PerplexityMatchesLlamaCpp) {
  const LoadedModel* m = Gemma3(MatMulInputs::kF32);
  ASSERT_NE(m, nullptr);
  Decoder d(m->model(), 2);
  // The same text llama-perplexity scored: Debian's license texts in this order.
  std::string text;
  for (const char* name : {"Apache-2.0", "Artistic", "BSD", "CC0-1.0", "GFDL-1.2", "GFDL-1.3", "GPL-1", "GPL-2"}) {
    std::ifstream in(std::string("/usr/share/common-licenses/") + name);
    std::stringstream ss;
    ss << in.rdbuf();
    text += ss.str();
  }
  auto ids = m->Encode(text);
  ASSERT_TRUE(ids.ok());
  ASSERT_GE(ids->size(), 1024u);
  std::vector<int32_t> tokens(ids->begin(), ids->begin() + 1024);
  KvBackendOptions o;
  o.layout = CacheLayout::kPaged;
  o.max_chunk_tokens = 256;
  auto kv = CreateKvBackend(d.attention_shape(), o);
  ASSERT_TRUE(kv.ok());
  PerplexityOptions p;
  p.chunk_tokens = 256;
  p.score_from = 512;
  KvBackend* none[1] = {nullptr};
  std::vector<Status> failed;
  auto r = ScoreInLockstep(d, none, d, **kv, tokens, p, &failed);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // llama.cpp: 8.0889 (f16 cache, int8-rounded inputs); exact f32 here.
  EXPECT_NEAR((*r)[0].perplexity, 8.0889, 0.1);
  EXPECT_EQ((*r)[0].num_predictions, 511u);
}

}  // namespace
}  // namespace kvcache::model

namespace kvcache::model {
namespace {

// kvcache passkey: the base model finds a key stated once in the middle of
// 1,024 tokens of filler (both trials, f32 cache, bf16 products); each
// answer names the SIMD target and the bf16 kernel that computed it.
TEST(Gemma3Model, PasskeyIsRetrievedFromTheMiddleOfTheContext) {
  const kvcache::testing::CliRun run = kvcache::testing::RunCli("passkey --model " + Gemma3Path() +
                                              " --context 1024 --depths 0.5 --trials 2 --matmul bf16 --json");
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const auto j = nlohmann::json::parse(run.out);
  ASSERT_EQ(j["results"].size(), 1u);
  EXPECT_EQ(j["results"][0]["found"].get<int>(), 2) << run.out;
  for (const auto& a : j["results"][0]["answers"]) {
    EXPECT_EQ(a.value("simd_target", std::string()), SimdTarget());
    EXPECT_EQ(a.value("bf16_kernel", std::string()), Bf16KernelName(PreferredBf16Kernel()));
  }
}

}  // namespace
}  // namespace kvcache::model
