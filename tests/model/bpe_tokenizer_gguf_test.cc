// BpeTokenizer::FromGguf on small GGUF files written by the test writer: a
// good one, and each required key missing, of the wrong type, or malformed;
// every failure is a Status naming the key (or token, merge) and the file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "model/gguf_writer.h"
#include "model/gpt2_bytes.h"
#include "model/io/gguf.h"
#include "model/tokenizer/bpe_tokenizer.h"
#include "model/tokenizer/unicode_classes.h"

namespace kvcache::model {
namespace {

using testing::MapByte;

struct Keys {
  std::string model = "gpt2";
  std::string pre = "smollm";
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges = {"a b", "Ġ ab"};
  uint32_t bos = 256, eos = 257;
  bool skip_tokens = false, skip_merges = false, skip_pre = false, skip_model = false;
  bool tokens_as_ints = false, bos_as_string = false;

  Keys() {
    for (int b = 0; b < 256; ++b) tokens.push_back(MapByte(static_cast<uint8_t>(b)));
    tokens.insert(tokens.end(), {"<|im_start|>", "<|im_end|>", "ab", "Ġab"});
    types.assign(tokens.size(), kTokenTypeNormal);
    types[256] = types[257] = kTokenTypeControl;
  }
};

Result<BpeTokenizer> Load(const Keys& k, std::string* path_out = nullptr) {
  testing::GgufWriter w;
  if (!k.skip_model) w.KvStr("tokenizer.ggml.model", k.model);
  if (!k.skip_pre) w.KvStr("tokenizer.ggml.pre", k.pre);
  if (!k.skip_tokens) {
    if (k.tokens_as_ints) {
      w.KvI32Array("tokenizer.ggml.tokens", k.types);
    } else {
      w.KvStrArray("tokenizer.ggml.tokens", k.tokens);
    }
  }
  w.KvI32Array("tokenizer.ggml.token_type", k.types);
  if (!k.skip_merges) w.KvStrArray("tokenizer.ggml.merges", k.merges);
  if (k.bos_as_string) {
    w.KvStr("tokenizer.ggml.bos_token_id", "1");
  } else {
    w.KvU32("tokenizer.ggml.bos_token_id", k.bos);
  }
  w.KvU32("tokenizer.ggml.eos_token_id", k.eos);
  w.KvBool("tokenizer.ggml.add_bos_token", true);
  w.KvStr("tokenizer.chat_template", "{{ messages }}");
  // One file per test and process: CTest runs the tests of this binary in
  // parallel processes, and rewriting a file another one has mapped is SIGBUS.
  const std::string path = ::testing::TempDir() + "bpe_gguf_test_" +
                           ::testing::UnitTest::GetInstance()->current_test_info()->name() +
                           "_" + std::to_string(getpid()) + ".gguf";
  if (path_out != nullptr) *path_out = path;
  if (!testing::WriteFile(path, w.Build())) return Status::IoError("cannot write " + path);
  auto file = GgufFile::Open(path);
  std::remove(path.c_str());  // the mapping stays valid until `file` goes
  if (!file.ok()) return file.status();
  return BpeTokenizer::FromGguf(**file);
}

TEST(BpeFromGguf, GoodFile) {
  auto t = Load(Keys{});
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->vocab_size(), 260u);
  EXPECT_EQ(t->bos_id(), 256);
  EXPECT_EQ(t->eos_id(), 257);
  EXPECT_TRUE(t->add_bos());
  EXPECT_EQ(t->pre_tokenizer(), PreTokenizer::kSmollm);
  EXPECT_EQ(t->chat_template(), "{{ messages }}");
  EXPECT_EQ(*t->Encode("ab ab<|im_end|>1", {.bos = true, .parse_special = true}),
            (std::vector<int32_t>{256, 258, 259, 257, '1'}));
}

void ExpectError(const Keys& k, StatusCode code, const std::string& needle) {
  std::string path;
  auto t = Load(k, &path);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), code) << t.status().ToString();
  EXPECT_NE(t.status().message().find(needle), std::string::npos) << t.status().ToString();
  EXPECT_NE(t.status().message().find(path), std::string::npos) << t.status().ToString();
}

TEST(BpeFromGguf, MissingOrWrongKeys) {
  // Each case changes one thing of a good file.
  const struct {
    std::function<void(Keys&)> change;
    StatusCode code;
    const char* needle;
  } cases[] = {
      {[](Keys& k) { k.skip_model = true; }, StatusCode::kNotFound, "tokenizer.ggml.model"},
      {[](Keys& k) { k.model = "llama"; }, StatusCode::kUnimplemented, "'llama'"},
      {[](Keys& k) { k.skip_tokens = true; }, StatusCode::kNotFound, "tokenizer.ggml.tokens"},
      {[](Keys& k) { k.tokens_as_ints = true; }, StatusCode::kInvalidArgument, "tokenizer.ggml.tokens"},
      {[](Keys& k) { k.skip_merges = true; }, StatusCode::kNotFound, "tokenizer.ggml.merges"},
      {[](Keys& k) { k.skip_pre = true; }, StatusCode::kNotFound, "tokenizer.ggml.pre"},
      {[](Keys& k) { k.pre = "qwen2"; }, StatusCode::kUnimplemented, "qwen2"},
      {[](Keys& k) { k.bos = 260; }, StatusCode::kCorruption, "tokenizer.ggml.bos_token_id"},
      {[](Keys& k) { k.bos_as_string = true; }, StatusCode::kInvalidArgument, "tokenizer.ggml.bos_token_id"},
      {[](Keys& k) { k.merges.push_back("b a"); }, StatusCode::kCorruption, "merge 2"},
      {[](Keys& k) { k.tokens[258] = "a b"; }, StatusCode::kCorruption, "token 258"},
      {[](Keys& k) { k.types.pop_back(); }, StatusCode::kCorruption, "token_type"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.needle);
    Keys k;
    c.change(k);
    ExpectError(k, c.code, c.needle);
  }
}

}  // namespace
}  // namespace kvcache::model
