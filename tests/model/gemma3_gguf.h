// A small random Gemma 3 model as a GGUF file in memory (F32 weights), for
// tests of the gemma3 loader, architecture and sliding-window layers
// without the real file: 6 layers (layers 0-4 sliding, 5 global, as Gemma
// 3's pattern of 6 gives), 4 query heads on 1 kv head of 32 (head_dim
// stated, not dim / n_heads), a window of 8 positions, a context of 1536.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gguf_writer.h"

namespace kvcache::model::testing {

struct TinyGemma3 {
  uint32_t dim = 64, hidden = 96, layers = 6, heads = 4, kv_heads = 1, head_dim = 32, vocab = 97;
  uint32_t context = 1536, window = 8;
  std::string architecture = "gemma3";
};

inline std::vector<uint8_t> TinyGemma3Gguf(const TinyGemma3& m = {}, uint64_t seed = 7) {
  GgufWriter w;
  w.KvStr("general.architecture", m.architecture);
  const std::string a = m.architecture + ".";
  w.KvU32(a + "context_length", m.context);
  w.KvU32(a + "embedding_length", m.dim);
  w.KvU32(a + "block_count", m.layers);
  w.KvU32(a + "feed_forward_length", m.hidden);
  w.KvU32(a + "attention.head_count", m.heads);
  w.KvU32(a + "attention.head_count_kv", m.kv_heads);
  w.KvU32(a + "attention.key_length", m.head_dim);
  w.KvU32(a + "attention.value_length", m.head_dim);
  w.KvF32(a + "attention.layer_norm_rms_epsilon", 1e-6f);
  w.KvF32(a + "rope.freq_base", 1e6f);
  w.KvU32(a + "attention.sliding_window", m.window);
  std::mt19937_64 rng(seed);
  auto tensor = [&](const std::string& name, std::vector<uint64_t> dims, float scale, float offset) {
    uint64_t n = 1;
    for (uint64_t d : dims) n *= d;
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> v(n);
    for (float& x : v) x = offset + scale * nd(rng);
    GgufWriter::Tensor t;
    t.name = name;
    t.dims = std::move(dims);
    t.type = 0;  // F32
    t.data.resize(n * 4);
    std::memcpy(t.data.data(), v.data(), n * 4);
    w.AddTensor(std::move(t));
  };
  const uint64_t d = m.dim, q = uint64_t{m.heads} * m.head_dim, kv = uint64_t{m.kv_heads} * m.head_dim;
  tensor("token_embd.weight", {d, m.vocab}, 0.1f, 0.0f);
  tensor("output_norm.weight", {d}, 0.1f, 1.0f);
  for (uint32_t l = 0; l < m.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    tensor(p + "attn_norm.weight", {d}, 0.1f, 1.0f);
    tensor(p + "attn_q_norm.weight", {m.head_dim}, 0.1f, 1.0f);
    tensor(p + "attn_k_norm.weight", {m.head_dim}, 0.1f, 1.0f);
    tensor(p + "post_attention_norm.weight", {d}, 0.1f, 1.0f);
    tensor(p + "ffn_norm.weight", {d}, 0.1f, 1.0f);
    tensor(p + "post_ffw_norm.weight", {d}, 0.1f, 1.0f);
    tensor(p + "attn_q.weight", {d, q}, 0.12f, 0.0f);
    tensor(p + "attn_k.weight", {d, kv}, 0.12f, 0.0f);
    tensor(p + "attn_v.weight", {d, kv}, 0.12f, 0.0f);
    tensor(p + "attn_output.weight", {q, d}, 0.1f, 0.0f);
    tensor(p + "ffn_gate.weight", {d, m.hidden}, 0.12f, 0.0f);
    tensor(p + "ffn_up.weight", {d, m.hidden}, 0.12f, 0.0f);
    tensor(p + "ffn_down.weight", {m.hidden, d}, 0.1f, 0.0f);
  }
  return w.Build();
}

}  // namespace kvcache::model::testing
