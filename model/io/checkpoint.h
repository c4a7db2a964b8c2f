// Loading a llama2.c "version 1" checkpoint into memory.
//
// File layout (little-endian): a 256-byte header -- uint32 magic 0x616b3432
// ("ak42"), int32 version = 1, int32 dim, hidden_dim, n_layers, n_heads,
// n_kv_heads, vocab_size, max_seq_len, one byte shared_classifier, zero
// padding -- then float32 weights in this order (matrices row-major, out x in):
//
//   rms_att   [n_layers][dim]          rms_ffn [n_layers][dim]   rms_final [dim]
//   embedding [vocab][dim]
//   wq [n_layers][dim][dim]            wk [n_layers][kv_dim][dim]
//   wv [n_layers][kv_dim][dim]         wo [n_layers][dim][dim]
//   w1 [n_layers][hidden][dim]         w2 [n_layers][dim][hidden]
//   w3 [n_layers][hidden][dim]
//   classifier [vocab][dim]            only when shared_classifier == 0
//
// with kv_dim = dim * n_kv_heads / n_heads. The weights must fill the file
// exactly: a short or long file is Corruption, naming expected and actual
// sizes.
//
// A Model is also what model/decoder/gguf_model.h loads from a GGUF file: then its
// matrices are views into the file's mapping (kept alive by the Model) in
// the file's types, and rope_theta / rms_eps come from the metadata.
//
// Thread safety: a Model is immutable after loading; share it freely.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvcache/status.h"
#include "model/io/gguf.h"
#include "model/tensor/matmul.h"

namespace kvcache::model {

// The model families the decoder runs (model/arch/): their per-layer math
// differs, their shapes are this ModelConfig.
enum class ModelFamily : uint8_t {
  kLlama,   // llama2.c checkpoints, GGUF "llama" (SmolLM2, TinyLlama, ...)
  kGemma3,  // GGUF "gemma3": sliding-window and global layers, Q/K norms, GeGLU
};
// "llama", "gemma3".
const char* ModelFamilyName(ModelFamily family);

struct ModelConfig {
  ModelFamily family = ModelFamily::kLlama;
  uint32_t dim = 0;
  uint32_t hidden_dim = 0;
  uint32_t n_layers = 0;
  uint32_t n_heads = 0;
  uint32_t n_kv_heads = 0;
  uint32_t vocab_size = 0;
  uint32_t max_seq_len = 0;
  bool shared_classifier = true;
  float rope_theta = 10000.0f;  // RoPE base (llama2.c: 10000)
  float rms_eps = 1e-5f;        // RMSNorm epsilon (llama2.c: 1e-5)
  // The width of a head when the file states it (Gemma 3: 256 with dim 640
  // and 4 heads); 0: dim / n_heads.
  uint32_t head_dim_override = 0;
  // Sliding-window layers: every layer l with (l + 1) % sliding_window_pattern
  // != 0 attends to its last sliding_window positions (its own included)
  // with RoPE base rope_theta_local; the others are global. 0: none.
  uint32_t sliding_window = 0;
  uint32_t sliding_window_pattern = 0;
  float rope_theta_local = 10000.0f;
  // Linear RoPE position scaling of the global layers (1: none).
  float rope_scaling = 1.0f;

  uint32_t head_dim() const { return head_dim_override ? head_dim_override : dim / n_heads; }
  uint32_t q_dim() const { return head_dim() * n_heads; }
  // True iff layer l is a sliding-window layer.
  bool is_sliding(uint32_t l) const {
    return sliding_window > 0 && sliding_window_pattern > 0 && (l + 1) % sliding_window_pattern != 0;
  }
  uint32_t kv_dim() const { return head_dim() * n_kv_heads; }
  // Number of float32 weights the checkpoint holds after the header.
  size_t NumWeights() const;
  // OK iff the sizes are positive, dim % n_heads == 0 (unless head_dim is
  // stated), n_heads % n_kv_heads == 0, head_dim is even (RoPE rotates pairs),
  // a sliding window has a pattern and nothing is absurdly large (the GGUF
  // loader checks the window against the file's context, before a shorter
  // max_seq_len is applied).
  Status Validate() const;
  // "dim=64 hidden=172 layers=5 heads=8 kv_heads=4 vocab=512 seq=512"; other
  // families lead with their name and add head_dim and window when set.
  std::string ToString() const;
};

// Views into one layer's weights (matrices row-major, out x in).
struct LayerWeights {
  std::span<const float> rms_att;  // [dim]
  std::span<const float> rms_ffn;  // [dim]
  WeightMatrix wq;                 // [q_dim][dim]
  WeightMatrix wk;                 // [kv_dim][dim]
  WeightMatrix wv;                 // [kv_dim][dim]
  WeightMatrix wo;                 // [dim][q_dim]
  WeightMatrix w1;                 // [hidden][dim]  (GGUF ffn_gate)
  WeightMatrix w2;                 // [dim][hidden]  (GGUF ffn_down)
  WeightMatrix w3;                 // [hidden][dim]  (GGUF ffn_up)
  // Gemma 3 only (empty otherwise): per-head RMSNorm of Q and K before RoPE,
  // and the norms of the attention and FFN blocks' outputs.
  std::span<const float> q_norm;         // [head_dim]
  std::span<const float> k_norm;         // [head_dim]
  std::span<const float> post_att_norm;  // [dim]
  std::span<const float> post_ffn_norm;  // [dim]
};

class Model {
 public:
  const ModelConfig& config() const { return config_; }
  const LayerWeights& layer(uint32_t l) const { return layers_[l]; }
  const WeightMatrix& embedding() const { return embedding_; }    // [vocab][dim]
  std::span<const float> rms_final() const { return rms_final_; }  // [dim]
  const WeightMatrix& classifier() const { return classifier_; }  // [vocab][dim]
  // The GGUF file the views point into (null for a llama2.c checkpoint).
  const GgufFile* gguf() const { return gguf_.get(); }

  // Models are movable (the views point into the heap buffer) but not copyable.
  Model(Model&&) = default;
  Model& operator=(Model&&) = default;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

 private:
  friend Result<Model> ParseModel(std::span<const uint8_t> bytes);
  friend class GgufModelLoader;
  Model() = default;
  ModelConfig config_;
  // llama2.c: [NumWeights] in file order. GGUF: the norms (and, when
  // dequantized at load, every matrix).
  std::vector<float> weights_;
  std::shared_ptr<const GgufFile> gguf_;
  std::vector<LayerWeights> layers_;
  WeightMatrix embedding_, classifier_;
  std::span<const float> rms_final_;
};

inline constexpr uint32_t kCheckpointMagic = 0x616b3432;  // "ak42"
inline constexpr size_t kCheckpointHeaderBytes = 256;

// Parses a whole checkpoint file held in memory. Corruption on a bad magic,
// version, config or size; nothing is kept on failure.
Result<Model> ParseModel(std::span<const uint8_t> bytes);
// Reads and parses `path`. IoError if it cannot be read.
Result<Model> LoadModel(const std::string& path);

// Reads a whole file (shared by the loaders). IoError naming the path.
Result<std::vector<uint8_t>> ReadFileBytes(const std::string& path);

}  // namespace kvcache::model
