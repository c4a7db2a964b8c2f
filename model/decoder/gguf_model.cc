// Building a Model from GGUF metadata and tensors.
#include "model/decoder/gguf_model.h"

#include <cstdio>
#include <algorithm>
#include <cstdint>
#include <cstring>

namespace kvcache::model {

class GgufModelLoader {
 public:
  static Result<Model> Load(std::shared_ptr<const GgufFile> file, const GgufLoadOptions& options);
};

namespace {

std::string Num(uint64_t v) { return std::to_string(v); }

// The hyperparameters from the <arch>.* metadata (the keys and defaults in
// gguf_model.h), validated.
Result<ModelConfig> ReadConfig(const GgufFile& g, const GgufLoadOptions& options) {
  KV_ASSIGN_OR_RETURN(std::string arch, g.GetString("general.architecture"));
  ModelConfig c;
  if (arch == "llama") {
    c.family = ModelFamily::kLlama;
  } else if (arch == "gemma3") {
    c.family = ModelFamily::kGemma3;
  } else {
    return Status::Unimplemented("GGUF " + g.path() + ": architecture '" + arch +
                                 "' is not supported (llama, gemma3)");
  }
  const std::string a = arch + ".";
  KV_ASSIGN_OR_RETURN(c.n_layers, g.GetU32(a + "block_count"));
  KV_ASSIGN_OR_RETURN(c.dim, g.GetU32(a + "embedding_length"));
  KV_ASSIGN_OR_RETURN(c.hidden_dim, g.GetU32(a + "feed_forward_length"));
  KV_ASSIGN_OR_RETURN(c.n_heads, g.GetU32(a + "attention.head_count"));
  c.n_kv_heads = c.n_heads;
  if (g.Find(a + "attention.head_count_kv")) {
    KV_ASSIGN_OR_RETURN(c.n_kv_heads, g.GetU32(a + "attention.head_count_kv"));
  }
  KV_ASSIGN_OR_RETURN(c.max_seq_len, g.GetU32(a + "context_length"));
  if (c.family == ModelFamily::kGemma3) c.rms_eps = 1e-6f;
  if (g.Find(a + "rope.freq_base")) {
    KV_ASSIGN_OR_RETURN(c.rope_theta, g.GetF32(a + "rope.freq_base"));
  }
  if (g.Find(a + "attention.layer_norm_rms_epsilon")) {
    KV_ASSIGN_OR_RETURN(c.rms_eps, g.GetF32(a + "attention.layer_norm_rms_epsilon"));
  }
  if (g.Find(a + "attention.key_length")) {
    uint32_t key_length = 0, value_length = 0;
    KV_ASSIGN_OR_RETURN(key_length, g.GetU32(a + "attention.key_length"));
    value_length = key_length;
    if (g.Find(a + "attention.value_length")) {
      KV_ASSIGN_OR_RETURN(value_length, g.GetU32(a + "attention.value_length"));
    }
    if (value_length != key_length) {
      return Status::Unimplemented("GGUF " + g.path() + ": key_length " + Num(key_length) + " != value_length " +
                                   Num(value_length));
    }
    if (key_length != c.dim / std::max(c.n_heads, 1u) || c.dim % std::max(c.n_heads, 1u) != 0) {
      c.head_dim_override = key_length;
    }
  }
  if (c.family == ModelFamily::kGemma3) {
    // llama.cpp's gemma3: every 6th layer global, the others a sliding
    // window with RoPE base 10,000 (neither is in the file).
    KV_ASSIGN_OR_RETURN(c.sliding_window, g.GetU32(a + "attention.sliding_window"));
    if (c.sliding_window == 0 || c.sliding_window > c.max_seq_len) {
      return Status::Corruption("GGUF " + g.path() + ": " + a + "attention.sliding_window " +
                                Num(c.sliding_window) + " does not fit the context of " + Num(c.max_seq_len) +
                                " positions");
    }
    c.sliding_window_pattern = 6;
    c.rope_theta_local = 10000.0f;
    if (g.Find(a + "rope.scaling.type")) {
      KV_ASSIGN_OR_RETURN(std::string type, g.GetString(a + "rope.scaling.type"));
      if (type == "linear" && g.Find(a + "rope.scaling.factor")) {
        KV_ASSIGN_OR_RETURN(float factor, g.GetF32(a + "rope.scaling.factor"));
        if (!(factor >= 1.0f && factor <= 1024.0f)) {
          return Status::Corruption("GGUF " + g.path() + ": rope scaling factor " + std::to_string(factor));
        }
        c.rope_scaling = factor;
      } else if (type != "none") {
        return Status::Unimplemented("GGUF " + g.path() + ": rope scaling '" + type + "' is not supported");
      }
    }
  }
  if (options.max_seq_len != 0) {
    if (options.max_seq_len > c.max_seq_len) {
      return Status::InvalidArgument("GGUF " + g.path() + ": a context of " + Num(options.max_seq_len) +
                                     " positions is longer than the model's " + Num(c.max_seq_len));
    }
    c.max_seq_len = options.max_seq_len;
  }
  KV_ASSIGN_OR_RETURN(const GgufTensor* embd, g.FindTensor("token_embd.weight"));
  if (embd->dims.size() != 2) {
    return Status::Corruption("GGUF " + g.path() + ": token_embd.weight has shape " + embd->DimsString() +
                              ", want [dim, vocab]");
  }
  c.vocab_size = static_cast<uint32_t>(std::min<uint64_t>(embd->dims[1], UINT32_MAX));
  if (g.Find(a + "vocab_size")) {
    KV_ASSIGN_OR_RETURN(c.vocab_size, g.GetU32(a + "vocab_size"));
  }
  c.shared_classifier = !g.FindTensor("output.weight").ok();
  {
    Status v = c.Validate();
    if (!v.ok()) return Status(v.code(), "GGUF " + g.path() + ": " + v.message());
  }
  if (g.Find(a + "rope.dimension_count")) {
    KV_ASSIGN_OR_RETURN(uint32_t rope_dims, g.GetU32(a + "rope.dimension_count"));
    if (rope_dims != c.head_dim()) {
      return Status::Unimplemented("GGUF " + g.path() + ": " + a + "rope.dimension_count " + Num(rope_dims) +
                                   " != head_dim " + Num(c.head_dim()) + " (partial RoPE is not supported)");
    }
  }
  return c;
}

}  // namespace

Result<Model> GgufModelLoader::Load(std::shared_ptr<const GgufFile> file, const GgufLoadOptions& options) {
  const GgufFile& g = *file;
  KV_ASSIGN_OR_RETURN(const ModelConfig c, ReadConfig(g, options));
  Model m;
  m.config_ = c;
  const uint64_t d = c.dim, hid = c.hidden_dim, kv = c.kv_dim(), v = c.vocab_size, qd = c.q_dim();
  const uint64_t hd = c.head_dim();
  const bool gemma = c.family == ModelFamily::kGemma3;
  // Norms first, then (when dequantizing at load) every matrix, so the f32
  // buffer is sized once and the views never move.
  uint64_t f32_values = (2 * c.n_layers + 1) * d;
  if (gemma) f32_values += c.n_layers * (2 * d + 2 * hd);
  if (options.dequantize_at_load) {
    f32_values += c.n_layers * (2 * qd * d + 2 * kv * d + 3 * hid * d) + v * d * (c.shared_classifier ? 1 : 2);
  }
  m.weights_.resize(f32_values);
  uint64_t used = 0;
  auto norm = [&](const std::string& name, uint64_t size) -> Result<std::span<const float>> {
    KV_ASSIGN_OR_RETURN(std::vector<float> w, g.ReadF32(name, {size}));
    float* dst = m.weights_.data() + used;
    std::memcpy(dst, w.data(), size * 4);
    used += size;
    return std::span<const float>(dst, size);
  };
  auto matrix = [&](const std::string& name, uint64_t rows, uint64_t cols) -> Result<WeightMatrix> {
    KV_ASSIGN_OR_RETURN(const GgufTensor* t, g.FindTensor(name, {cols, rows}));
    if (!CanDequantize(t->type)) {
      return Status::Unimplemented("GGUF " + g.path() + ": tensor '" + name + "' has type " +
                                   GgmlTypeName(t->type) + ", which this reader does not decode (" + DequantizableTypeNames() + ")");
    }
    // A 2-D tensor [cols, rows] in GGUF order: `rows` rows of whole blocks.
    WeightMatrix w{t->type, t->bytes.data(), static_cast<uint32_t>(t->rows()),
                   static_cast<uint32_t>(t->cols()), static_cast<size_t>(t->row_bytes())};
    w.inputs = options.matmul_inputs;
    if (!options.dequantize_at_load || t->type == GgmlType::kF32) return w;
    float* dst = m.weights_.data() + used;
    w.DecodeRows(0, w.rows, dst);
    used += rows * cols;
    return WeightMatrix::F32(std::span<const float>(dst, rows * cols), w.rows, w.cols);
  };
  m.layers_.resize(c.n_layers);
  for (uint32_t l = 0; l < c.n_layers; ++l) {
    LayerWeights& w = m.layers_[l];
    const std::string p = "blk." + Num(l) + ".";
    KV_ASSIGN_OR_RETURN(w.rms_att, norm(p + "attn_norm.weight", d));
    KV_ASSIGN_OR_RETURN(w.rms_ffn, norm(p + "ffn_norm.weight", d));
    if (gemma) {
      KV_ASSIGN_OR_RETURN(w.q_norm, norm(p + "attn_q_norm.weight", hd));
      KV_ASSIGN_OR_RETURN(w.k_norm, norm(p + "attn_k_norm.weight", hd));
      KV_ASSIGN_OR_RETURN(w.post_att_norm, norm(p + "post_attention_norm.weight", d));
      KV_ASSIGN_OR_RETURN(w.post_ffn_norm, norm(p + "post_ffw_norm.weight", d));
    }
    KV_ASSIGN_OR_RETURN(w.wq, matrix(p + "attn_q.weight", qd, d));
    KV_ASSIGN_OR_RETURN(w.wk, matrix(p + "attn_k.weight", kv, d));
    KV_ASSIGN_OR_RETURN(w.wv, matrix(p + "attn_v.weight", kv, d));
    KV_ASSIGN_OR_RETURN(w.wo, matrix(p + "attn_output.weight", d, qd));
    KV_ASSIGN_OR_RETURN(w.w1, matrix(p + "ffn_gate.weight", hid, d));
    KV_ASSIGN_OR_RETURN(w.w3, matrix(p + "ffn_up.weight", hid, d));
    KV_ASSIGN_OR_RETURN(w.w2, matrix(p + "ffn_down.weight", d, hid));
  }
  KV_ASSIGN_OR_RETURN(m.rms_final_, norm("output_norm.weight", d));
  KV_ASSIGN_OR_RETURN(m.embedding_, matrix("token_embd.weight", v, d));
  if (c.shared_classifier) {
    m.classifier_ = m.embedding_;
  } else {
    KV_ASSIGN_OR_RETURN(m.classifier_, matrix("output.weight", v, d));
  }
  if (used > m.weights_.size()) return Status::Internal("GGUF model: f32 buffer overrun");
  m.gguf_ = std::move(file);
  return m;
}

Result<Model> ModelFromGguf(std::shared_ptr<const GgufFile> file, const GgufLoadOptions& options) {
  return GgufModelLoader::Load(std::move(file), options);
}

Result<Model> LoadGgufModel(const std::string& path, const GgufLoadOptions& options) {
  KV_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> f, GgufFile::Open(path));
  return GgufModelLoader::Load(std::shared_ptr<const GgufFile>(std::move(f)), options);
}

bool IsGgufFile(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  char magic[4] = {0, 0, 0, 0};
  const size_t n = std::fread(magic, 1, 4, f);
  std::fclose(f);
  return n == 4 && std::memcmp(magic, "GGUF", 4) == 0;
}

}  // namespace kvcache::model
