// LoadedModel::EncodeChat over a message list, as /v1/chat/completions uses
// it: on SmolLM2 the ids decode back to the ChatML text of every turn plus
// the generation prompt (and a single user turn equals the one-message
// form `generate --chat` uses); a llama2.c model without a template says
// Unimplemented.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/decoder/loaded_model.h"
#include "model/io/model_store.h"

namespace kvcache::model {
namespace {

TEST(ChatEncode, ConversationRendersEveryTurn) {
  GgufLoadOptions o;
  o.max_seq_len = 256;
  auto m = LoadedModel::Load(SmolLm2Path(), "", o);
  ASSERT_TRUE(m.ok()) << m.status().ToString() << " (scripts/fetch_model.sh fetches SmolLM2)";
  const ChatMessage conversation[] = {
      {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Name a colour."}};
  auto ids = (*m)->EncodeChat(conversation);
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  auto text = (*m)->Decode(*ids);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nName a colour.<|im_end|>\n"
            "<|im_start|>assistant\n");
  // The special tokens are single ids, not their spelling.
  auto plain = (*m)->Encode(*text);
  ASSERT_TRUE(plain.ok());
  EXPECT_LT(ids->size(), plain->size());

  const ChatMessage one[] = {{"user", "Tell me about the moon."}};
  auto list_form = (*m)->EncodeChat(one);
  auto string_form = (*m)->EncodeChat(std::string_view("Tell me about the moon."));
  ASSERT_TRUE(list_form.ok() && string_form.ok());
  EXPECT_EQ(*list_form, *string_form);
}

TEST(ChatEncode, Llama2cModelHasNoTemplate) {
  const std::string dir = KVCACHE_TESTDATA_DIR "/stories260K/";
  auto m = LoadedModel::Load(dir + "stories260K_v1.bin", dir + "tokenizer.bin");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const ChatMessage one[] = {{"user", "hi"}};
  auto ids = (*m)->EncodeChat(one);
  ASSERT_FALSE(ids.ok());
  EXPECT_EQ(ids.status().code(), StatusCode::kUnimplemented);
  auto plain = (*m)->Encode("Once upon a time");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->empty());
}

}  // namespace
}  // namespace kvcache::model
