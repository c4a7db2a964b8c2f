// `kvcache tokenize` on small GGUF tokenizers written here (SentencePiece
// and byte-level BPE): ids on one line or as JSON, the BOS and
// special-token flags, and its errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "model/gguf_writer.h"
#include "model/gpt2_bytes.h"

namespace kvcache::model {
namespace {

using ::kvcache::testing::RunCli;

// A GGUF file with only tokenizer keys, in the test's temporary folder
// (one per test and process: CTest runs this binary's tests in parallel).
std::string WriteTokenizerFile(const testing::GgufWriter& w) {
  const std::string path = ::testing::TempDir() + "tokenize_cli_" +
                           ::testing::UnitTest::GetInstance()->current_test_info()->name() +
                           "_" + std::to_string(getpid()) + ".gguf";
  EXPECT_TRUE(testing::WriteFile(path, w.Build()));
  return path;
}

// "<unk>" "<s>" "</s>" "a" "b" "ab" "▁" "<turn>"(control); BOS 1 added.
std::string SpmFile() {
  testing::GgufWriter w;
  w.KvStr("tokenizer.ggml.model", "llama");
  w.KvStrArray("tokenizer.ggml.tokens",
               {"<unk>", "<s>", "</s>", "a", "b", "ab", "\xE2\x96\x81", "<turn>"});
  w.KvF32Array("tokenizer.ggml.scores", {0, 0, 0, -1, -2, -0.5f, -3, 0});
  w.KvI32Array("tokenizer.ggml.token_type", {2, 3, 3, 1, 1, 1, 1, 3});
  w.KvBool("tokenizer.ggml.add_space_prefix", false);
  return WriteTokenizerFile(w);
}

TEST(TokenizeCli, SentencePieceIdsAndJson) {
  const std::string model = SpmFile();
  auto r = RunCli("tokenize --model " + model + " --text 'ab a<turn>'");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, "1 5 6 3 7\n");
  r = RunCli("tokenize --model " + model + " --text 'ab a' --no-bos");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, "5 6 3\n");
  // "<turn>" as text: its characters have no pieces and this vocabulary no
  // byte tokens to fall back on.
  EXPECT_EQ(RunCli("tokenize --model " + model + " --text '<turn>' --no-parse-special").exit_code,
            2);
  r = RunCli("tokenize --model " + model + " --text 'ab a' --json");
  ASSERT_EQ(r.exit_code, 0);
  const auto j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["tokenizer"], "llama");
  EXPECT_EQ(j["ids"], (std::vector<int>{1, 5, 6, 3}));
  EXPECT_EQ(j["pieces"], (std::vector<std::string>{"<s>", "ab", " ", "a"}));
  std::filesystem::remove(model);
}

TEST(TokenizeCli, ByteLevelBpe) {
  // The 256 byte tokens, "ab", and "<|end|>" (control).
  testing::GgufWriter w;
  w.KvStr("tokenizer.ggml.model", "gpt2");
  w.KvStr("tokenizer.ggml.pre", "gpt2");
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(testing::MapByte(static_cast<uint8_t>(b)));
    types.push_back(1);
  }
  tokens.push_back("ab");
  types.push_back(1);
  tokens.push_back("<|end|>");
  types.push_back(3);
  w.KvStrArray("tokenizer.ggml.tokens", tokens);
  w.KvI32Array("tokenizer.ggml.token_type", types);
  w.KvStrArray("tokenizer.ggml.merges", {"a b"});
  const std::string model = WriteTokenizerFile(w);
  auto r = RunCli("tokenize --model " + model + " --text 'abc<|end|>'");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, "256 99 257\n");  // no BOS: add_bos_token is absent
  r = RunCli("tokenize --model " + model + " --text 'ab' --json");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("\"tokenizer\":\"gpt2\""), std::string::npos) << r.out;
  std::filesystem::remove(model);
}

TEST(TokenizeCli, ErrorsExitNonZero) {
  EXPECT_NE(RunCli("tokenize --text x").exit_code, 0);  // no --model
  EXPECT_EQ(RunCli("tokenize --model /nonexistent/x.gguf --text x").exit_code, 2);
  const std::string model = SpmFile();
  EXPECT_EQ(RunCli("tokenize --model " + model + " --text-file /nonexistent/t.txt").exit_code, 2);
  // A character without a piece and no byte tokens to fall back on.
  EXPECT_EQ(RunCli("tokenize --model " + model + " --text 'c'").exit_code, 2);
  std::filesystem::remove(model);
  // Not a GGUF file.
  EXPECT_EQ(RunCli(std::string("tokenize --model ") + KVCACHE_TESTDATA_DIR +
                   "/stories260K/tokenizer.bin --text x")
                .exit_code,
            2);
}

}  // namespace
}  // namespace kvcache::model
