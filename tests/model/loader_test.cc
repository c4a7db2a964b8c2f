// Checkpoint and tokenizer loading: the real stories260K files, and the error
// paths (truncated, bad magic, bad version, size mismatch, malformed
// tokenizer), plus encode/decode round trips.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "model/io/checkpoint.h"
#include "model/tokenizer/tokenizer.h"

namespace kvcache::model {
namespace {

const std::string kModelDir = std::string(KVCACHE_TESTDATA_DIR) + "/stories260K/";
const std::string kModelPath = kModelDir + "stories260K_v1.bin";
const std::string kTokenizerPath = kModelDir + "tokenizer.bin";

std::vector<uint8_t> ReadOrDie(const std::string& path) {
  auto bytes = ReadFileBytes(path);
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  return bytes.ok() ? *bytes : std::vector<uint8_t>{};
}

TEST(Checkpoint, LoadsStories260K) {
  auto m = LoadModel(kModelPath);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.dim, 64u);
  EXPECT_EQ(c.hidden_dim, 172u);
  EXPECT_EQ(c.n_layers, 5u);
  EXPECT_EQ(c.n_heads, 8u);
  EXPECT_EQ(c.n_kv_heads, 4u);
  EXPECT_EQ(c.vocab_size, 512u);
  EXPECT_EQ(c.max_seq_len, 512u);
  EXPECT_TRUE(c.shared_classifier);
  EXPECT_EQ(c.head_dim(), 8u);
  EXPECT_EQ(c.kv_dim(), 32u);
  EXPECT_EQ(m->classifier().data, m->embedding().data);
  // The last weight is the last float of the file.
  auto bytes = ReadOrDie(kModelPath);
  float last;
  std::memcpy(&last, bytes.data() + bytes.size() - 4, 4);
  const WeightMatrix& w3 = m->layer(4).w3;
  ASSERT_EQ(w3.type, GgmlType::kF32);
  float got;
  std::memcpy(&got, w3.data + w3.rows * w3.row_bytes - 4, 4);
  EXPECT_EQ(got, last);
}

TEST(Checkpoint, MissingFileIsIoError) {
  auto m = LoadModel(kModelDir + "no_such_file.bin");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kIoError);
}

TEST(Checkpoint, TruncatedFiles) {
  auto bytes = ReadOrDie(kModelPath);
  for (size_t keep : {size_t{0}, size_t{10}, size_t{255}, size_t{256}, bytes.size() - 4,
                      bytes.size() - 1}) {
    auto m = ParseModel(std::span<const uint8_t>(bytes.data(), keep));
    ASSERT_FALSE(m.ok()) << keep;
    EXPECT_EQ(m.status().code(), StatusCode::kCorruption) << keep;
    EXPECT_NE(m.status().message().find("truncated"), std::string::npos)
        << m.status().message();
  }
}

TEST(Checkpoint, TrailingBytesAreASizeMismatch) {
  auto bytes = ReadOrDie(kModelPath);
  bytes.resize(bytes.size() + 4);
  auto m = ParseModel(bytes);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kCorruption);
  EXPECT_NE(m.status().message().find("size mismatch"), std::string::npos);
}

TEST(Checkpoint, BadMagicVersionAndConfig) {
  const auto good = ReadOrDie(kModelPath);
  auto patched = [&](size_t off, int32_t value) {
    auto b = good;
    std::memcpy(b.data() + off, &value, 4);
    return ParseModel(b);
  };
  auto bad_magic = patched(0, 0x12345678);
  ASSERT_FALSE(bad_magic.ok());
  EXPECT_NE(bad_magic.status().message().find("magic"), std::string::npos);
  auto bad_version = patched(4, 2);
  ASSERT_FALSE(bad_version.ok());
  EXPECT_NE(bad_version.status().message().find("version"), std::string::npos);
  // A config that does not match the weights that follow.
  auto bad_dim = patched(8, 32);
  ASSERT_FALSE(bad_dim.ok());
  EXPECT_NE(bad_dim.status().message().find("size mismatch"), std::string::npos);
  auto bad_heads = patched(20, 3);  // n_heads 3 does not divide dim 64
  ASSERT_FALSE(bad_heads.ok());
  EXPECT_EQ(bad_heads.status().code(), StatusCode::kCorruption);
  auto negative = patched(32, -1);  // max_seq_len
  ASSERT_FALSE(negative.ok());
  EXPECT_EQ(negative.status().code(), StatusCode::kCorruption);
}

class TokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = Tokenizer::Load(kTokenizerPath, 512);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    tok_.emplace(std::move(t).value());
  }
  std::optional<Tokenizer> tok_;
};

TEST_F(TokenizerTest, EncodeStartsWithBosAndMerges) {
  const auto ids = tok_->Encode("Once upon a time");
  ASSERT_GE(ids.size(), 2u);
  EXPECT_EQ(ids[0], kBosToken);
  // Merging leaves fewer tokens than characters + dummy prefix.
  EXPECT_LT(ids.size(), std::string("Once upon a time").size());
  EXPECT_EQ(tok_->Encode("").size(), 1u);
  EXPECT_EQ(tok_->Encode("", {.bos = false}).size(), 0u);
  const auto with_eos = tok_->Encode("hi", {.bos = true, .eos = true});
  EXPECT_EQ(with_eos.back(), kEosToken);
}

TEST_F(TokenizerTest, NoBetterMergeIsLeft) {
  // After encoding, no adjacent pair concatenates to a vocabulary piece
  // (otherwise greedy merging would have continued).
  const auto ids = tok_->Encode("The little dog ran to the park and played with a red ball.",
                                {.bos = false});
  std::vector<std::string> pieces;
  for (uint32_t i = 0; i < tok_->vocab_size(); ++i) pieces.push_back(tok_->piece(i));
  for (size_t i = 0; i + 1 < ids.size(); ++i) {
    const std::string pair = tok_->piece(ids[i]) + tok_->piece(ids[i + 1]);
    for (const auto& p : pieces) EXPECT_NE(p, pair) << i;
  }
}

TEST_F(TokenizerTest, RoundTrips) {
  for (const std::string text :
       {"Once upon a time, there was a little girl named Lily.", "a", "  two leading spaces",
        "Numbers 0123456789 and punctuation!?;:", "Bytes: caf\xc3\xa9 \xe2\x9c\x93 \x01\x7f",
        "line one\nline two\n"}) {
    const auto ids = tok_->Encode(text);
    auto back = tok_->Decode(ids);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, text);
  }
}

TEST_F(TokenizerTest, DecodeRejectsBadIds) {
  const int32_t bad[] = {kBosToken, 512};
  EXPECT_EQ(tok_->Decode(bad).status().code(), StatusCode::kInvalidArgument);
  const int32_t neg[] = {-1};
  EXPECT_FALSE(tok_->Decode(neg).ok());
}

TEST(TokenizerErrors, TruncatedAndMismatched) {
  const auto good = ReadOrDie(kTokenizerPath);
  ASSERT_TRUE(Tokenizer::Parse(good, 512).ok());
  for (size_t keep : {size_t{0}, size_t{3}, size_t{4}, size_t{100}, good.size() - 1}) {
    auto t = Tokenizer::Parse(std::span<const uint8_t>(good.data(), keep), 512);
    ASSERT_FALSE(t.ok()) << keep;
    EXPECT_EQ(t.status().code(), StatusCode::kCorruption) << keep;
    EXPECT_NE(t.status().message().find("truncated"), std::string::npos)
        << t.status().message();
  }
  // Vocab size mismatch: the file holds 512 tokens.
  auto fewer = Tokenizer::Parse(good, 400);
  ASSERT_FALSE(fewer.ok());
  EXPECT_NE(fewer.status().message().find("trailing"), std::string::npos);
  EXPECT_FALSE(Tokenizer::Parse(good, 600).ok());
  EXPECT_EQ(Tokenizer::Parse(good, 100).status().code(), StatusCode::kInvalidArgument);
  // A negative token length.
  auto bad = good;
  const int32_t neg = -5;
  std::memcpy(bad.data() + 8, &neg, 4);  // token 0's length
  EXPECT_EQ(Tokenizer::Parse(bad, 512).status().code(), StatusCode::kCorruption);
  EXPECT_EQ(Tokenizer::Load("/nonexistent/tokenizer.bin", 512).status().code(),
            StatusCode::kIoError);
}

}  // namespace
}  // namespace kvcache::model
