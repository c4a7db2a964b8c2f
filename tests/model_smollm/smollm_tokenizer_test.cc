// SmolLM2's byte-level BPE tokenizer, built from the real GGUF file, against
// token ids and text recorded once from Hugging Face `tokenizers` and
// transformers (tests/model/smollm2_tokenizer_fixtures.json, made by
// scripts/make_tokenizer_fixtures.py). Needs the model file
// (scripts/fetch_model.sh; $KVCACHE_MODEL_DIR, else ~/.cache/kvcache/models):
// every test here FAILS (never skips), saying so, when it is absent.
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/io/gguf.h"
#include "model/tokenizer/bpe_tokenizer.h"
#include "model/tokenizer/chat_template.h"
#include "model/tokenizer/unicode_classes.h"
#include "model_smollm/smollm_fixture.h"

namespace kvcache::model {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

struct Loaded {
  const GgufFile* file;
  std::unique_ptr<BpeTokenizer> tok;
  nlohmann::json fixture;
};

// The tokenizer and the fixture, loaded once; every caller's test fails
// with the reason when either is unavailable.
const Loaded* Smollm() {
  const GgufFile* file = testing::SmolLm2Gguf();  // fails the test when absent
  if (file == nullptr) return nullptr;
  static std::string error;
  static const std::unique_ptr<Loaded> loaded = [&]() -> std::unique_ptr<Loaded> {
    auto tok = BpeTokenizer::FromGguf(*file);
    if (!tok.ok()) {
      error = tok.status().ToString();
      return nullptr;
    }
    auto l = std::make_unique<Loaded>();
    l->file = file;
    l->tok = std::make_unique<BpeTokenizer>(std::move(tok).value());
    const std::string fx =
        std::string(KVCACHE_SOURCE_DIR) + "/tests/model/smollm2_tokenizer_fixtures.json";
    l->fixture = nlohmann::json::parse(ReadFile(fx), nullptr, /*allow_exceptions=*/false);
    if (l->fixture.is_discarded()) {
      error = "cannot read or parse " + fx;
      return nullptr;
    }
    return l;
  }();
  EXPECT_NE(loaded, nullptr) << error;
  return loaded.get();
}

// A fixture case's text: inline, or a prefix of a system file.
std::string CaseText(const nlohmann::json& c) {
  if (c.contains("text")) return c["text"].get<std::string>();
  std::string all = ReadFile(c["text_file"].get<std::string>());
  const size_t n = c["text_bytes"].get<size_t>();
  EXPECT_GE(all.size(), n) << c["text_file"];
  all.resize(std::min(all.size(), n));
  return all;
}

TEST(SmollmTokenizer, ReadsTheFile) {
  const Loaded* m = Smollm();
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->tok->vocab_size(), 49152u);
  EXPECT_EQ(m->tok->pre_tokenizer(), PreTokenizer::kSmollm);
  EXPECT_EQ(m->tok->bos_id(), 1);
  EXPECT_EQ(m->tok->eos_id(), 2);
  EXPECT_FALSE(m->tok->add_bos());
  EXPECT_EQ(*m->tok->SpecialId("<|im_start|>"), 1);
  EXPECT_EQ(*m->tok->SpecialId("<|im_end|>"), 2);
  EXPECT_EQ(*m->tok->SpecialId("<|endoftext|>"), 0);
}

TEST(SmollmTokenizer, EncodeEqualsReference) {
  const Loaded* m = Smollm();
  ASSERT_NE(m, nullptr);
  size_t cases = 0;
  for (const auto& c : m->fixture["encode"]) {
    const std::string text = CaseText(c);
    auto ids = m->tok->Encode(text, {.parse_special = true});
    ASSERT_TRUE(ids.ok()) << c["name"] << ": " << ids.status().ToString();
    EXPECT_EQ(*ids, c["ids"].get<std::vector<int32_t>>()) << c["name"];
    if (c.contains("ids_plain")) {
      auto plain = m->tok->Encode(text);
      ASSERT_TRUE(plain.ok()) << c["name"];
      EXPECT_EQ(*plain, c["ids_plain"].get<std::vector<int32_t>>()) << c["name"] << " (plain)";
    }
    ++cases;
  }
  EXPECT_GE(cases, 25u);
}

TEST(SmollmTokenizer, DecodeEqualsReference) {
  const Loaded* m = Smollm();
  ASSERT_NE(m, nullptr);
  for (const auto& c : m->fixture["decode"]) {
    auto bytes = m->tok->Decode(c["ids"].get<std::vector<int32_t>>());
    ASSERT_TRUE(bytes.ok()) << c["ids"].dump();
    EXPECT_EQ(SanitizeUtf8(*bytes), c["text"].get<std::string>()) << c["ids"].dump();
  }
}

TEST(SmollmTokenizer, EveryTokenDecodesToItsVocabularyEntry) {
  const Loaded* m = Smollm();
  ASSERT_NE(m, nullptr);
  auto tokens = m->file->GetStringArray("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok());
  // GPT-2's alphabet, the plain way, to map decoded bytes back to token text.
  std::vector<char32_t> alphabet(256);
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool self = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    alphabet[b] = self ? b : next++;
  }
  for (int32_t id = 0; id < static_cast<int32_t>(m->tok->vocab_size()); ++id) {
    auto bytes = m->tok->DecodeToken(id);
    ASSERT_TRUE(bytes.ok()) << id;
    std::string text;
    if (m->tok->is_special(id)) {
      text = *bytes;
    } else {
      for (unsigned char b : *bytes) AppendUtf8(alphabet[b], &text);
    }
    ASSERT_EQ(text, (*tokens)[id]) << id;
    // Its bytes encode (every byte of every token has a token) and the
    // encoding decodes back to them (BPE need not give the token itself).
    if (!m->tok->is_special(id)) {
      auto again = m->tok->Encode(*bytes);
      ASSERT_TRUE(again.ok()) << id << ": " << again.status().ToString();
      ASSERT_EQ(*m->tok->Decode(*again), *bytes) << id;
    }
  }
}

TEST(SmollmTokenizer, RoundTripsTextAndInvalidUtf8) {
  const Loaded* m = Smollm();
  ASSERT_NE(m, nullptr);
  std::vector<std::string> texts;
  for (const auto& c : m->fixture["encode"]) texts.push_back(CaseText(c));
  texts.push_back("bad \xC3( \xE2\x82 \x80\x81 ok \xED\xA0\x80 end\xF0\x9F\x98");
  texts.push_back(std::string("nul \0 inside", 12));
  for (const auto& text : texts) {
    for (bool special : {false, true}) {
      auto ids = m->tok->Encode(text, {.parse_special = special});
      ASSERT_TRUE(ids.ok()) << ids.status().ToString();
      EXPECT_EQ(*m->tok->Decode(*ids), text);
    }
  }
}

TEST(SmollmTokenizer, BadInputIsAnErrorNotACrash) {
  const Loaded* m = Smollm();
  ASSERT_NE(m, nullptr);
  const BpeTokenizer& t = *m->tok;
  EXPECT_TRUE(t.Encode("")->empty());
  EXPECT_EQ(*t.Decode(std::vector<int32_t>{}), "");
  for (int32_t bad : {-1, 49152, INT32_MAX}) {
    EXPECT_EQ(t.DecodeToken(bad).status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(t.Decode(std::vector<int32_t>{1, bad}).status().code(), StatusCode::kInvalidArgument);
  }
  // SmolLM2 has no token for byte 0x04 (nor 0xC0, 0xF5..0xFF): Encode says
  // so (the reference drops such bytes silently).
  for (const char* text : {"a\x04"
                           "b",
                           "\xFF", "x\xC0"}) {
    auto r = t.Encode(text);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  }
}

TEST(SmollmTokenizer, ChatTemplateEqualsReference) {
  const Loaded* m = Smollm();
  ASSERT_NE(m, nullptr);
  auto from_file = ChatTemplate::FromJinja(m->tok->chat_template());
  ASSERT_TRUE(from_file.ok()) << from_file.status().ToString();
  EXPECT_EQ(from_file->default_system(),
            "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  auto plain = ChatTemplate::FromJinja(m->fixture["chatml_plain_template"].get<std::string>());
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  size_t cases = 0;
  for (const auto& c : m->fixture["chat"]) {
    std::vector<ChatMessage> messages;
    for (const auto& msg : c["messages"]) {
      messages.push_back({msg["role"].get<std::string>(), msg["content"].get<std::string>()});
    }
    const ChatTemplate& tmpl = c["template"] == "gguf" ? *from_file : *plain;
    const std::string text = tmpl.Render(messages, c["add_generation_prompt"].get<bool>());
    EXPECT_EQ(text, c["text"].get<std::string>()) << c.dump();
    auto ids = m->tok->Encode(text, {.parse_special = true});
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, c["ids"].get<std::vector<int32_t>>()) << c.dump();
    ++cases;
  }
  EXPECT_EQ(cases, 12u);
}

}  // namespace
}  // namespace kvcache::model
