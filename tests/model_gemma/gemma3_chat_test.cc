// Gemma 3 270M's chat turns (the file has no chat template: LoadedModel
// gives it Gemma's turn format): a user turn's ids are the ones
// llama-tokenize gives for the rendered text, <start_of_turn> and
// <end_of_turn> single tokens (105, 106); a whole conversation decodes back
// to the exact turn text; <end_of_turn> is a stop token. A test that
// cannot get the model fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "loaded_models.h"
#include "model/decoder/loaded_model.h"
#include "model/io/model_store.h"

namespace kvcache::model {
namespace {

constexpr int32_t kBos = 2, kEos = 1, kStartOfTurn = 105, kEndOfTurn = 106;

// The same load as the other Gemma tests of this binary (path, product kind
// and sequence capacity), so it is loaded once.
const LoadedModel* Gemma3() {
  return testing::LoadOnce(Gemma3Path(), 2304, MatMulInputs::kF32, "fetch it with scripts/fetch_model.sh gemma3");
}

TEST(Gemma3Chat, OneUserTurnIsLlamaCppsTokens) {
  const LoadedModel* m = Gemma3();
  ASSERT_NE(m, nullptr);
  auto ids = m->EncodeChat(std::string_view("Hi"));
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  // llama-tokenize (b11434) of "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
  // BOS added: "user" 2364, "\n" 107, "Hi" 10979, "model" 4368.
  EXPECT_EQ(*ids, (std::vector<int32_t>{kBos, kStartOfTurn, 2364, 107, 10979, kEndOfTurn, 107, kStartOfTurn, 4368,
                                        107}));
}

TEST(Gemma3Chat, ConversationRendersEveryTurn) {
  const LoadedModel* m = Gemma3();
  ASSERT_NE(m, nullptr);
  const ChatMessage conversation[] = {
      {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Name a colour."}};
  auto ids = m->EncodeChat(conversation);
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  auto text = m->Decode(*ids);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text,
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
            "<start_of_turn>model\nHello!<end_of_turn>\n"
            "<start_of_turn>user\nName a colour.<end_of_turn>\n"
            "<start_of_turn>model\n");
  // One BOS; the turn markers are single tokens: three turns and the generation prompt.
  EXPECT_EQ(std::count(ids->begin(), ids->end(), kBos), 1);
  EXPECT_EQ(ids->front(), kBos);
  EXPECT_EQ(std::count(ids->begin(), ids->end(), kStartOfTurn), 4);
  EXPECT_EQ(std::count(ids->begin(), ids->end(), kEndOfTurn), 3);
  // Between the markers, the text is encoded as plain text is.
  auto plain = m->Encode("Name a colour.");
  ASSERT_TRUE(plain.ok());
  ASSERT_EQ(plain->front(), kBos);
  const std::vector<int32_t> body(plain->begin() + 1, plain->end());
  EXPECT_NE(std::search(ids->begin(), ids->end(), body.begin(), body.end()), ids->end());

  // Turns that do not alternate are refused, not rendered.
  const ChatMessage twice[] = {{"user", "a"}, {"user", "b"}};
  EXPECT_EQ(m->EncodeChat(twice).status().code(), StatusCode::kInvalidArgument);
}

TEST(Gemma3Chat, EndOfTurnIsAStopToken) {
  const LoadedModel* m = Gemma3();
  ASSERT_NE(m, nullptr);
  // What llama.cpp ends a generation at for this file: EOS and <end_of_turn>
  // (and BOS, as for every GGUF model here). generate and the engine stop at
  // any token of this list (not emitted). The base model itself never ends
  // a turn: after one, <end_of_turn> scores below hundreds of thousands of
  // tokens, so no greedy run on it reaches the stop.
  EXPECT_EQ(m->stop_tokens(), (std::vector<int32_t>{kEos, kBos, kEndOfTurn}));
}

}  // namespace
}  // namespace kvcache::model
