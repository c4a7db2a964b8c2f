// Gemma 3 270M through the serving engine: its sequences hold two groups
// (the 3 global layers and the 15 sliding-window layers) in two pools.
// Requests prefilled in the engine's chunks beside each other give the
// tokens `kvcache generate` gives for each prompt alone (f32 K/V: exact),
// the window pool holds no more than its window's blocks per sequence
// while the prompts run past the window, and both pools are back at their
// baseline when the requests end.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_fixture.h"
#include "loaded_models.h"
#include "model_gemma/apache_text.h"
#include "model/decoder/decoder.h"
#include "model/generate/generate.h"
#include "model/io/model_store.h"
#include "model/kv/kv_factory.h"

namespace kvcache::engine {
namespace {

constexpr uint32_t kSeqLen = 2048;
constexpr uint32_t kChunk = 128;  // the engine's step budget: its largest prefill chunk

const model::LoadedModel* Gemma3() {
  return model::testing::LoadOnce(model::Gemma3Path(), kSeqLen, model::MatMulInputs::kBf16,
                                  "fetch it with scripts/fetch_model.sh gemma3");
}

std::vector<int32_t> Text(const model::LoadedModel& m, size_t n, size_t skip) {
  return model::testing::ApacheText(m, n, skip);
}

// `kvcache generate` on the prompt alone: a contiguous f32 hybrid cache
// taking the prompt in the engine's chunk size.
std::vector<int32_t> Alone(const model::LoadedModel& m, const std::vector<int32_t>& prompt, uint32_t n) {
  model::Decoder d(m.model(), 2);
  model::KvBackendOptions o;
  o.max_chunk_tokens = kChunk;
  auto kv = model::CreateKvBackend(d.attention_shape(), o);
  EXPECT_TRUE(kv.ok()) << kv.status().ToString();
  if (!kv.ok()) return {};
  const Status pre = model::PrefillInChunks(d, **kv, std::span<const int32_t>(prompt).first(prompt.size() - 1), kChunk);
  EXPECT_TRUE(pre.ok()) << pre.ToString();
  if (!pre.ok()) return {};
  model::GenerateOptions g;
  g.max_new_tokens = n;
  g.stop_at_eos = false;
  auto r = model::Generate(d, **kv, prompt, g);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? r->tokens : std::vector<int32_t>{};
}

// An engine on an f32 cache (exact: its answers equal generate's) taking
// prefill chunks of kChunk.
Result<std::unique_ptr<Engine>> MakeEngine(const model::LoadedModel& m, uint64_t pool_mib, bool prefix_cache) {
  EngineOptions o;
  o.formats = {Format::kF32, Format::kF32};
  o.pool_bytes = pool_mib << 20;
  o.max_batch_tokens = kChunk;
  o.threads = 2;
  o.prefix_cache = prefix_cache;
  return Engine::Create(m, o);
}

TEST(Gemma3Engine, RequestsPastTheWindowMatchGenerateAndGiveTheirBlocksBack) {
  const model::LoadedModel* m = Gemma3();
  ASSERT_NE(m, nullptr);
  auto made = MakeEngine(*m, 96, /*prefix_cache=*/false);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  Engine& e = **made;
  const EngineMetrics idle = e.Metrics();
  ASSERT_EQ(idle.pool_groups.size(), 2u);
  EXPECT_EQ(idle.pool_groups[0].kind, "full");
  EXPECT_EQ(idle.pool_groups[1].kind, "window");

  const std::vector<std::vector<int32_t>> prompts = {Text(*m, 700, 0), Text(*m, 300, 50), Text(*m, 1100, 120)};
  constexpr uint32_t kNew = 12;
  std::vector<RequestParams> params;
  for (const auto& p : prompts) {
    ASSERT_FALSE(p.empty());
    params.push_back(testing::Greedy(p, kNew, /*ignore_eos=*/true));
  }
  const std::vector<testing::Outcome> got = testing::RunAll(e, params);
  ASSERT_EQ(got.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(got[i].tokens, Alone(*m, prompts[i], kNew)) << "request " << i;
  }
  // Back at the baseline: nothing used or reserved in either pool.
  const EngineMetrics after = e.Metrics();
  for (size_t g = 0; g < 2; ++g) {
    EXPECT_EQ(after.pool_groups[g].used, 0u) << g;
    EXPECT_EQ(after.pool_groups[g].free + after.pool_groups[g].cached, after.pool_groups[g].total) << g;
  }
  e.Shutdown(std::chrono::milliseconds(0));
}

// Prefix reuse through the window group. A conversation's second turn (the
// first turn's prompt, its answer and a new user turn) adopts everything
// up to the last full block before its last token; a second conversation
// on the same system prompt adopts the system prompt's blocks though the
// first conversation's window slid far past them (its window blocks there
// were parked, not dropped). Each answer is the one generate gives for the
// whole prompt computed alone, so reuse changes no token.
TEST(Gemma3Engine, ConversationsReuseTheirPrefixesPastTheWindow) {
  const model::LoadedModel* m = Gemma3();
  ASSERT_NE(m, nullptr);
  auto made = MakeEngine(*m, 160, /*prefix_cache=*/true);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  Engine& e = **made;
  constexpr uint32_t kNew = 8;
  const std::vector<int32_t> system = Text(*m, 560, 0);
  std::vector<int32_t> first = system;
  const std::vector<int32_t> user1 = Text(*m, 1100, 400);
  first.insert(first.end(), user1.begin(), user1.end());
  auto run = [&](const std::vector<int32_t>& prompt) {
    const std::vector<testing::Outcome> got = testing::RunAll(e, {testing::Greedy(prompt, kNew, true)});
    EXPECT_EQ(got.size(), 1u);
    return got.empty() ? testing::Outcome{} : got[0];
  };
  const testing::Outcome a = run(first);
  EXPECT_EQ(a.last.usage.cached_tokens, 0u);
  // Turn 2 of the same conversation.
  std::vector<int32_t> second = first;
  second.insert(second.end(), a.tokens.begin(), a.tokens.end());
  const std::vector<int32_t> user2 = Text(*m, 40, 900);
  second.insert(second.end(), user2.begin(), user2.end());
  const testing::Outcome b = run(second);
  EXPECT_EQ(b.last.usage.cached_tokens, (first.size() + kNew - 1) / 16 * 16);
  EXPECT_EQ(b.tokens, Alone(*m, second, kNew));
  // Another conversation on the same system prompt.
  std::vector<int32_t> other = system;
  const std::vector<int32_t> user3 = Text(*m, 30, 1500);
  other.insert(other.end(), user3.begin(), user3.end());
  const testing::Outcome c = run(other);
  EXPECT_EQ(c.last.usage.cached_tokens, system.size() / 16 * 16);
  EXPECT_EQ(c.tokens, Alone(*m, other, kNew));
  const EngineMetrics after = e.Metrics();
  for (size_t g = 0; g < 2; ++g) EXPECT_EQ(after.pool_groups[g].used, 0u) << g;
  EXPECT_GT(after.pool_groups[1].cached, 0u);
  e.Shutdown(std::chrono::milliseconds(0));
}

}  // namespace
}  // namespace kvcache::engine
