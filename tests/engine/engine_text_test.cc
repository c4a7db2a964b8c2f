// The engine's text side on stories260K (and SmolLM2 where it is fetched):
//   a text prompt gives the tokens, text and usage its ids give, and a chat
//     the tokens of the model's chat template;
//   every generated token and top logprob entry carries the tokenizer's
//     piece for it (DecodePiece after the token before);
//   bad prompts -- none, several forms, a chat without a template, a text
//     longer than the context, a text that tokenizes to nothing -- are
//     refused with their Status and SubmitFault, and nothing is queued;
//   a text prompt's max_tokens past the context ends at the context.
#include <gtest/gtest.h>

#include <filesystem>
#include <limits>

#include "engine/engine_text.h"
#include "engine_fixture.h"
#include "model/io/model_store.h"

namespace kvcache::engine {
namespace {

using namespace testing;  // the fixture (engine_fixture.h)

constexpr const char* kText = "Once upon a time, there was a little girl named Lily. She liked to play.";

RequestParams TextGreedy(std::string text, uint32_t max_tokens) {
  RequestParams p = Greedy({}, max_tokens, true);
  p.prompt_text = std::move(text);
  return p;
}

// stories260K, kText's ids and a small engine on it.
class EngineText : public ::testing::Test {
 protected:
  void SetUp() override {
    m = Stories();
    ASSERT_NE(m, nullptr);
    auto encoded = m->Encode(kText);
    ASSERT_TRUE(encoded.ok());
    ids = *encoded;
    e = MakeEngine(SmallEngine());
    ASSERT_NE(e, nullptr);
  }
  const model::LoadedModel* m = nullptr;
  std::vector<int32_t> ids;
  std::unique_ptr<Engine> e;
};

TEST_F(EngineText, TextPromptGivesWhatItsIdsGive) {
  const std::vector<Outcome> out = RunAll(*e, {Greedy(ids, 24, true), TextGreedy(kText, 24)});
  ASSERT_EQ(out[0].tokens.size(), 24u);
  EXPECT_EQ(out[1].tokens, out[0].tokens);
  EXPECT_EQ(out[1].text, out[0].text);
  EXPECT_EQ(out[1].last.usage.prompt_tokens, ids.size());
  EXPECT_EQ(out[1].last.usage.completion_tokens, 24u);
  EXPECT_EQ(out[1].tokens, GenerateAlone(*m, ids, 24, true));
}

TEST_F(EngineText, TokensAndLogprobsCarryTheTokenizersPieces) {
  RequestParams p = TextGreedy(kText, 12);
  p.logprobs = true;
  p.top_logprobs = 4;
  RequestParams plain = TextGreedy(kText, 12);
  const std::vector<Outcome> out = RunAll(*e, {p, plain});
  ASSERT_EQ(out[0].outs.size(), 12u);
  int32_t prev = ids.back();
  std::string pieces;
  for (const TokenOut& t : out[0].outs) {
    auto piece = m->DecodePiece(prev, t.token);
    ASSERT_TRUE(piece.ok());
    EXPECT_EQ(t.piece, *piece);
    ASSERT_EQ(t.top.size(), 4u);
    for (const TokenLogprob& top : t.top) {
      auto top_piece = m->DecodePiece(prev, top.token);
      ASSERT_TRUE(top_piece.ok());
      EXPECT_EQ(top.piece, *top_piece) << "token " << top.token;
    }
    EXPECT_EQ(t.top[0].piece, t.piece);  // greedy: the chosen token is the most likely
    pieces += t.piece;
    prev = t.token;
  }
  // No stop strings: the released text is the pieces, in order.
  EXPECT_EQ(out[0].text, pieces);
  // Without logprobs the tokens still carry their pieces, and no top entries.
  ASSERT_EQ(out[1].outs.size(), 12u);
  for (size_t i = 0; i < out[1].outs.size(); ++i) {
    EXPECT_EQ(out[1].outs[i].piece, out[0].outs[i].piece);
    EXPECT_TRUE(out[1].outs[i].top.empty());
  }
}

// Submit's refusal: the Status code and the fault; nothing queued.
void ExpectRefused(Engine& e, RequestParams p, StatusCode code, SubmitFault want) {
  SubmitFault fault = SubmitFault::kNone;
  auto s = e.Submit(std::move(p), &fault);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), code) << s.status().ToString();
  EXPECT_FALSE(s.status().message().empty());
  EXPECT_EQ(fault, want) << s.status().ToString();
  EXPECT_EQ(e.Metrics().requests_waiting, 0u);
}

TEST_F(EngineText, BadPromptsAreRefusedWithTheirFault) {
  ExpectRefused(*e, Greedy({}, 4), StatusCode::kInvalidArgument, SubmitFault::kPromptEmpty);
  RequestParams both = TextGreedy(kText, 4);
  both.prompt = {1, 2, 3};
  ExpectRefused(*e, both, StatusCode::kInvalidArgument, SubmitFault::kPrompt);
  RequestParams text_and_chat = TextGreedy(kText, 4);
  text_and_chat.messages = {{"user", "hi"}};
  ExpectRefused(*e, text_and_chat, StatusCode::kInvalidArgument, SubmitFault::kPrompt);
  // stories260K is a llama2.c model: no chat template.
  RequestParams chat = Greedy({}, 4);
  chat.messages = {{"user", "Tell me a story."}};
  ExpectRefused(*e, chat, StatusCode::kUnimplemented, SubmitFault::kNoChatTemplate);
  std::string long_text;  // a token a word at least: longer than the context
  for (uint32_t i = 0; i < m->model().config().max_seq_len; ++i) long_text += " happy";
  ExpectRefused(*e, TextGreedy(long_text, 4), StatusCode::kInvalidArgument, SubmitFault::kPromptTooLong);
  ExpectRefused(*e, Greedy({-1}, 4), StatusCode::kInvalidArgument, SubmitFault::kPrompt);
  RequestParams zero = TextGreedy(kText, 4);
  zero.max_tokens = 0;
  ExpectRefused(*e, zero, StatusCode::kInvalidArgument, SubmitFault::kParams);
  RequestParams bad_stop = TextGreedy(kText, 4);
  bad_stop.stop = {""};
  ExpectRefused(*e, bad_stop, StatusCode::kInvalidArgument, SubmitFault::kParams);
  // A good one says kNone.
  SubmitFault fault = SubmitFault::kPrompt;
  auto ok = e->Submit(TextGreedy(kText, 2), &fault);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(fault, SubmitFault::kNone);
  e->Shutdown(std::chrono::milliseconds(0));
  ExpectRefused(*e, TextGreedy(kText, 2), StatusCode::kFailedPrecondition, SubmitFault::kEngine);
}

TEST_F(EngineText, EmptyTextIsTheModelsBosAlone) {
  // llama2.c models begin every text with BOS: an empty text is that token.
  auto bos = m->Encode("");
  ASSERT_TRUE(bos.ok());
  ASSERT_EQ(bos->size(), 1u);
  const std::vector<Outcome> out = RunAll(*e, {TextGreedy("", 6), Greedy(*bos, 6, true)});
  EXPECT_EQ(out[0].tokens, out[1].tokens);
  EXPECT_EQ(out[0].last.usage.prompt_tokens, 1u);
}

TEST_F(EngineText, MaxTokensPastTheContextEndsAtTheContext) {
  const uint32_t context = m->model().config().max_seq_len;
  const std::vector<Outcome> out = RunAll(*e, {TextGreedy(kText, std::numeric_limits<uint32_t>::max())});
  EXPECT_EQ(out[0].last.finish_reason, FinishReason::kLength);
  EXPECT_EQ(out[0].last.usage.completion_tokens, context - ids.size());
}

// SmolLM2 (scripts/fetch_model.sh): no BOS, so an empty text is no prompt;
// a chat is tokenized in its ChatML template.
TEST(EngineTextSmolLm2, ChatAndEmptyText) {
  if (!std::filesystem::exists(model::SmolLm2Path())) GTEST_SKIP() << "SmolLM2 not fetched";
  model::GgufLoadOptions lo;
  lo.max_seq_len = 256;
  auto m = model::LoadedModel::Load(model::SmolLm2Path(), "", lo);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EngineOptions o = SmallEngine();
  o.pool_bytes = 16ull << 20;
  auto e = Engine::Create(**m, o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  ExpectRefused(**e, TextGreedy("", 4), StatusCode::kInvalidArgument, SubmitFault::kPromptEmpty);

  const ChatMessage chat[] = {{"system", "Be brief."}, {"user", "Name a colour."}};
  auto ids = (*m)->EncodeChat(chat);
  ASSERT_TRUE(ids.ok());
  RequestParams p = Greedy({}, 4, true);
  p.messages.assign(std::begin(chat), std::end(chat));
  const std::vector<Outcome> out = RunAll(**e, {p, Greedy(*ids, 4, true)});
  EXPECT_EQ(out[0].tokens, out[1].tokens);
  EXPECT_EQ(out[0].text, out[1].text);
  EXPECT_EQ(out[0].last.usage.prompt_tokens, ids->size());
  // A text prompt that writes the chat format out reads its markers as the
  // special tokens, so it is exactly the chat's prompt.
  RequestParams written = Greedy({}, 4, true);
  written.prompt_text = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nName a colour.<|im_end|>\n"
                        "<|im_start|>assistant\n";
  const std::vector<Outcome> same = RunAll(**e, {written});
  EXPECT_EQ(same[0].last.usage.prompt_tokens, ids->size());
  EXPECT_EQ(same[0].tokens, out[1].tokens);
  // The text alone, without reading specials, is longer.
  auto as_text = (*m)->Encode(*written.prompt_text);
  ASSERT_TRUE(as_text.ok());
  EXPECT_GT(as_text->size(), ids->size());
}

}  // namespace
}  // namespace kvcache::engine
