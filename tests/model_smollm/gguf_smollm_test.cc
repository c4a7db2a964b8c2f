// The GGUF reader on the real SmolLM2-135M-Instruct Q4_1 file: its metadata,
// the tensor types it holds (F32 norms, Q4_1 matrices, a Q8_0 embedding),
// and every SIMD target's dequantization of sampled rows of every tensor
// against the scalar reference.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include "model_smollm/smollm_fixture.h"
#include "model/tensor/gguf_dequant.h"

namespace kvcache::model {
namespace {

TEST(GgufSmolLm2, Metadata) {
  const GgufFile* g = testing::SmolLm2Gguf();
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->version(), 3u);
  EXPECT_EQ(*g->GetString("general.architecture"), "llama");
  EXPECT_EQ(*g->GetU32("llama.block_count"), 30u);
  EXPECT_EQ(*g->GetU32("llama.embedding_length"), 576u);
  EXPECT_EQ(*g->GetU32("llama.feed_forward_length"), 1536u);
  EXPECT_EQ(*g->GetU32("llama.attention.head_count"), 9u);
  EXPECT_EQ(*g->GetU32("llama.attention.head_count_kv"), 3u);
  EXPECT_EQ(*g->GetU32("llama.context_length"), 8192u);
  EXPECT_EQ(*g->GetF32("llama.rope.freq_base"), 100000.0f);
  EXPECT_EQ(*g->GetString("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(*g->GetString("tokenizer.ggml.pre"), "smollm");
  const std::vector<std::string> tokens = *g->GetStringArray("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), 49152u);
  EXPECT_EQ(tokens[1], "<|im_start|>");
  EXPECT_EQ(g->GetStringArray("tokenizer.ggml.merges")->size(), 48900u);
  EXPECT_EQ(g->GetI32Array("tokenizer.ggml.token_type")->size(), 49152u);
  EXPECT_EQ(*g->GetU32("tokenizer.ggml.bos_token_id"), 1u);
  EXPECT_EQ(*g->GetU32("tokenizer.ggml.eos_token_id"), 2u);
  EXPECT_NE(g->GetString("tokenizer.chat_template")->find("<|im_start|>"), std::string::npos);
}

TEST(GgufSmolLm2, TensorTypesAndShapes) {
  const GgufFile* g = testing::SmolLm2Gguf();
  ASSERT_NE(g, nullptr);
  std::map<GgmlType, int> count;
  for (const GgufTensor& t : g->tensors()) ++count[t.type];
  EXPECT_EQ(g->tensors().size(), 272u);
  EXPECT_EQ(count[GgmlType::kF32], 61);
  EXPECT_EQ(count[GgmlType::kQ4_1], 210);
  EXPECT_EQ(count[GgmlType::kQ8_0], 1);
  EXPECT_TRUE(g->FindTensor("token_embd.weight", {576, 49152}).ok());
  EXPECT_TRUE(g->FindTensor("blk.29.attn_k.weight", {576, 192}).ok());
  EXPECT_TRUE(g->FindTensor("blk.0.ffn_down.weight", {1536, 576}).ok());
  EXPECT_FALSE(g->FindTensor("output.weight").ok());  // tied to token_embd
  const std::vector<float> norm = *g->ReadF32("output_norm.weight", {576});
  for (float x : norm) ASSERT_TRUE(std::isfinite(x));
}

TEST(GgufSmolLm2, EverySimdTargetDequantizesEveryTensorLikeScalar) {
  const GgufFile* g = testing::SmolLm2Gguf();
  ASSERT_NE(g, nullptr);
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    for (const GgufTensor& t : g->tensors()) {
      const uint64_t rows = t.rows(), cols = t.cols();
      std::vector<float> want(cols), got(cols);
      for (uint64_t r : {uint64_t{0}, rows / 2, rows - 1}) {
        const uint8_t* src = t.bytes.data() + r * t.row_bytes();
        ASSERT_TRUE(DequantizeRowScalar(t.type, src, cols, want.data()).ok());
        ASSERT_TRUE(DequantizeRow(t.type, src, cols, got.data()).ok());
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), cols * 4)) << t.name << " row " << r;
        for (float x : want) ASSERT_TRUE(std::isfinite(x)) << t.name;
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

}  // namespace
}  // namespace kvcache::model
