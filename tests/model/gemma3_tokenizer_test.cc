// Gemma 3's SentencePiece tokenizer, built from the real GGUF file, against
// token ids recorded once from llama.cpp's llama-tokenize
// (testdata/gemma3_tokenizer_fixtures.json, which says how). Needs
// gemma-3-270m-q4_k_m.gguf (scripts/fetch_model.sh gemma3;
// $KVCACHE_MODEL_DIR, else ~/.cache/kvcache/models): every test here is
// skipped, saying so, when it is absent.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/io/gguf.h"
#include "model/io/model_store.h"
#include "model/tokenizer/gguf_tokenizer.h"
#include "model/tokenizer/unicode_classes.h"

namespace kvcache::model {
namespace {

constexpr const char* kGemmaFileName = "gemma-3-270m-q4_k_m.gguf";

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

struct Loaded {
  std::unique_ptr<GgufFile> file;
  std::unique_ptr<GgufTokenizer> tok;
  nlohmann::json fixture;
  std::string error;  // why it could not be loaded ("" when it was)
};

// The tokenizer and the fixture, loaded once; nullptr (with the reason in
// *why) when the model file is absent.
const Loaded* Gemma(std::string* why) {
  static const std::unique_ptr<Loaded> loaded = [] {
    auto l = std::make_unique<Loaded>();
    const std::string path = ModelCacheDir() + "/" + kGemmaFileName;
    if (!std::filesystem::exists(path)) {
      l->error = path + " is absent (fetch it with scripts/fetch_model.sh gemma3)";
      return l;
    }
    auto file = GgufFile::Open(path);
    if (!file.ok()) {
      l->error = file.status().ToString();
      return l;
    }
    l->file = std::move(file).value();
    auto tok = GgufTokenizer::FromGguf(*l->file);
    if (!tok.ok()) {
      l->error = tok.status().ToString();
      return l;
    }
    l->tok = std::make_unique<GgufTokenizer>(std::move(tok).value());
    const std::string fx = std::string(KVCACHE_TESTDATA_DIR) + "/gemma3_tokenizer_fixtures.json";
    l->fixture = nlohmann::json::parse(ReadFile(fx), nullptr, /*allow_exceptions=*/false);
    if (l->fixture.is_discarded()) l->error = "cannot read or parse " + fx;
    return l;
  }();
  *why = loaded->error;
  return loaded->file == nullptr ? nullptr : loaded.get();
}

// A missing model skips; anything else that went wrong fails.
#define GEMMA_OR_SKIP(m)                              \
  std::string why;                                    \
  const Loaded* m = Gemma(&why);                      \
  if (m == nullptr) GTEST_SKIP() << why;              \
  ASSERT_TRUE(why.empty()) << why;

// A fixture case's bytes: "text" (UTF-8) or "hex".
std::string CaseBytes(const nlohmann::json& c) {
  if (c.contains("text")) return c["text"].get<std::string>();
  const std::string hex = c["hex"].get<std::string>();
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

// Decode(Encode(s)) == s: valid UTF-8 without a U+2581 of its own (that
// decodes as a space).
bool RoundTrips(std::string_view s) {
  if (s.find("\xE2\x96\x81") != std::string_view::npos) return false;
  for (size_t pos = 0; pos < s.size();) {
    const Utf8Char c = DecodeUtf8(s, pos);
    if (!c.valid) return false;
    pos += c.bytes;
  }
  return true;
}

TEST(Gemma3Tokenizer, ReadsTheFile) {
  GEMMA_OR_SKIP(m);
  const SpmTokenizer* spm = m->tok->spm();
  ASSERT_NE(spm, nullptr);
  EXPECT_EQ(spm->vocab_size(), 262144u);
  EXPECT_EQ(spm->bos_id(), 2);
  EXPECT_EQ(spm->eos_id(), 1);
  EXPECT_TRUE(spm->add_bos());
  EXPECT_FALSE(spm->add_space_prefix());
  EXPECT_EQ(*spm->SpecialId("<start_of_turn>"), 105);
  EXPECT_EQ(*spm->SpecialId("<end_of_turn>"), 106);
  EXPECT_EQ(spm->token_type(3), kTokenTypeControl);  // <unk> is a control token here
  EXPECT_EQ(spm->Find("<0x0A>"), 248);
}

TEST(Gemma3Tokenizer, EncodeEqualsLlamaTokenize) {
  GEMMA_OR_SKIP(m);
  size_t cases = 0;
  for (const auto& c : m->fixture["cases"]) {
    const std::string text = CaseBytes(c);
    auto ids = m->tok->Encode(text, {.bos = true, .parse_special = true});
    ASSERT_TRUE(ids.ok()) << c["name"] << ": " << ids.status().ToString();
    EXPECT_EQ(*ids, c["ids"].get<std::vector<int32_t>>()) << c["name"];
    if (c.contains("ids_no_parse_special")) {
      auto plain = m->tok->Encode(text, {.bos = true, .parse_special = false});
      ASSERT_TRUE(plain.ok()) << c["name"];
      EXPECT_EQ(*plain, c["ids_no_parse_special"].get<std::vector<int32_t>>())
          << c["name"] << " (no parse special)";
    }
    ++cases;
  }
  EXPECT_GE(cases, 30u);
}

TEST(Gemma3Tokenizer, DecodeInvertsEncode) {
  GEMMA_OR_SKIP(m);
  for (const auto& c : m->fixture["cases"]) {
    const std::string text = CaseBytes(c);
    if (!RoundTrips(text)) continue;
    for (bool special : {false, true}) {
      auto ids = m->tok->Encode(text, {.parse_special = special});
      ASSERT_TRUE(ids.ok()) << c["name"];
      auto back = m->tok->Decode(*ids);
      ASSERT_TRUE(back.ok()) << c["name"];
      EXPECT_EQ(*back, text) << c["name"] << (special ? " (parse special)" : "");
    }
  }
}

TEST(Gemma3Tokenizer, InvalidUtf8GoesThroughByteTokens) {
  GEMMA_OR_SKIP(m);
  // (no invalid byte right before a space: see spm_tokenizer.h)
  const std::string text = "ok \xFF\xFE\xFD\xFC\x80x caf\xE9\x80!";
  auto ids = m->tok->Encode(text);
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  auto back = m->tok->Decode(*ids);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, text);
}

// About 32k tokens of the fixture texts, encoded in one call; the time goes
// to the test's output (the property "encode_ms").
TEST(Gemma3Tokenizer, EncodesALongTextQuickly) {
  GEMMA_OR_SKIP(m);
  std::string one;
  for (const auto& c : m->fixture["cases"]) {
    const std::string text = CaseBytes(c);
    if (RoundTrips(text)) one += text + "\n";
  }
  const size_t one_tokens = m->tok->Encode(one)->size();
  std::string text;
  while (text.size() / one.size() * one_tokens < 32768) text += one;
  const auto start = std::chrono::steady_clock::now();
  auto ids = m->tok->Encode(text);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(ids.ok());
  EXPECT_GE(ids->size(), 32768u);
  EXPECT_EQ(*m->tok->Decode(*ids), text);
  RecordProperty("encode_ms", std::to_string(ms));
  std::printf("encoded %zu bytes into %zu tokens in %.1f ms\n", text.size(), ids->size(), ms);
}

}  // namespace
}  // namespace kvcache::model
