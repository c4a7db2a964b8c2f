// llama2.c v1 checkpoint parsing: header validation, then views into one
// float buffer in file order.
#include "model/io/checkpoint.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

namespace kvcache::model {
namespace {

constexpr uint32_t kMaxDim = 1 << 16;
constexpr uint32_t kMaxLayers = 1024;
constexpr uint32_t kMaxVocab = 1 << 20;
constexpr uint32_t kMaxSeqLen = 1 << 20;

int32_t ReadI32(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

std::string Num(size_t v) { return std::to_string(v); }

}  // namespace

size_t ModelConfig::NumWeights() const {
  const size_t d = dim, h = hidden_dim, l = n_layers, v = vocab_size, kv = kv_dim();
  size_t n = 2 * l * d + d + v * d;       // norms + embedding
  n += l * (d * d + 2 * kv * d + d * d);  // wq wk wv wo
  n += l * 3 * h * d;                     // w1 w2 w3
  if (!shared_classifier) n += v * d;
  return n;
}

Status ModelConfig::Validate() const {
  if (dim == 0 || hidden_dim == 0 || n_layers == 0 || n_heads == 0 || n_kv_heads == 0 ||
      vocab_size == 0 || max_seq_len == 0) {
    return Status::Corruption("checkpoint config has a zero or negative size: " + ToString());
  }
  if (dim > kMaxDim || hidden_dim > kMaxDim * 4 || n_layers > kMaxLayers || n_heads > dim ||
      vocab_size > kMaxVocab || max_seq_len > kMaxSeqLen) {
    return Status::Corruption("checkpoint config is implausibly large: " + ToString());
  }
  if (head_dim_override == 0 && dim % n_heads != 0) {
    return Status::Corruption("checkpoint dim " + Num(dim) + " is not a multiple of n_heads " +
                              Num(n_heads));
  }
  if (n_kv_heads > n_heads || n_heads % n_kv_heads != 0) {
    return Status::Corruption("checkpoint n_heads " + Num(n_heads) +
                              " is not a multiple of n_kv_heads " + Num(n_kv_heads));
  }
  if (head_dim() % 2 != 0 || head_dim() > kMaxDim) {
    return Status::Corruption("checkpoint head_dim " + Num(head_dim()) +
                              " is odd or implausibly large; RoPE needs pairs");
  }
  if (sliding_window > 0 && (sliding_window_pattern == 0 || sliding_window > kMaxSeqLen)) {
    return Status::Corruption("sliding window " + Num(sliding_window) + " (pattern " +
                              Num(sliding_window_pattern) + ") is implausible");
  }
  return Status::Ok();
}

const char* ModelFamilyName(ModelFamily family) {
  return family == ModelFamily::kGemma3 ? "gemma3" : "llama";
}

std::string ModelConfig::ToString() const {
  std::string s = std::string(family == ModelFamily::kLlama ? "" : ModelFamilyName(family)) +
                  (family == ModelFamily::kLlama ? "" : " ") + "dim=" + Num(dim) + " hidden=" + Num(hidden_dim) +
                  " layers=" + Num(n_layers) + " heads=" + Num(n_heads) + " kv_heads=" + Num(n_kv_heads) +
                  " vocab=" + Num(vocab_size) + " seq=" + Num(max_seq_len);
  if (head_dim_override != 0) s += " head_dim=" + Num(head_dim_override);
  if (sliding_window != 0) s += " window=" + Num(sliding_window) + "/" + Num(sliding_window_pattern);
  return s;
}

namespace {

// The llama2.c v1 header: magic, version, seven positive fields and the
// shared-classifier byte, validated.
Result<ModelConfig> ParseHeader(std::span<const uint8_t> bytes) {
  if (bytes.size() < kCheckpointHeaderBytes) {
    return Status::Corruption("checkpoint truncated: " + Num(bytes.size()) +
                              " bytes, the header alone is " + Num(kCheckpointHeaderBytes));
  }
  const uint8_t* h = bytes.data();
  uint32_t magic;
  std::memcpy(&magic, h, sizeof magic);
  if (magic != kCheckpointMagic) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "checkpoint has bad magic 0x%08x (want 0x%08x \"ak42\")", magic,
                  kCheckpointMagic);
    return Status::Corruption(buf);
  }
  const int32_t version = ReadI32(h + 4);
  if (version != 1) {
    return Status::Corruption("checkpoint version " + std::to_string(version) +
                              " is not supported (only llama2.c version 1)");
  }
  int32_t fields[7];
  for (int i = 0; i < 7; ++i) {
    fields[i] = ReadI32(h + 8 + 4 * i);
    if (fields[i] <= 0) {
      return Status::Corruption("checkpoint header field " + std::to_string(i) + " is " +
                                std::to_string(fields[i]) + ", must be positive");
    }
  }
  ModelConfig c;
  c.dim = fields[0];
  c.hidden_dim = fields[1];
  c.n_layers = fields[2];
  c.n_heads = fields[3];
  c.n_kv_heads = fields[4];
  c.vocab_size = fields[5];
  c.max_seq_len = fields[6];
  const uint8_t shared = h[36];
  if (shared > 1) {
    return Status::Corruption("checkpoint shared_classifier byte is " + Num(shared) +
                              ", must be 0 or 1");
  }
  c.shared_classifier = shared == 1;
  KV_RETURN_IF_ERROR(c.Validate());
  return c;
}

}  // namespace

Result<Model> ParseModel(std::span<const uint8_t> bytes) {
  KV_ASSIGN_OR_RETURN(const ModelConfig c, ParseHeader(bytes));
  const uint8_t* h = bytes.data();
  const size_t want = kCheckpointHeaderBytes + c.NumWeights() * sizeof(float);
  if (bytes.size() != want) {
    return Status::Corruption("checkpoint size mismatch: " + c.ToString() + " needs " + Num(want) +
                              " bytes, the file has " + Num(bytes.size()) +
                              (bytes.size() < want ? " (truncated)" : " (trailing bytes)"));
  }

  Model m;
  m.config_ = c;
  m.weights_.resize(c.NumWeights());
  std::memcpy(m.weights_.data(), h + kCheckpointHeaderBytes, m.weights_.size() * sizeof(float));

  const size_t d = c.dim, hid = c.hidden_dim, kv = c.kv_dim(), v = c.vocab_size;
  size_t off = 0;
  auto take = [&](size_t n) {
    std::span<const float> s(m.weights_.data() + off, n);
    off += n;
    return s;
  };
  m.layers_.resize(c.n_layers);
  for (auto& l : m.layers_) l.rms_att = take(d);
  for (auto& l : m.layers_) l.rms_ffn = take(d);
  auto matrix = [&](size_t rows, size_t cols) {
    return WeightMatrix::F32(take(rows * cols), static_cast<uint32_t>(rows), static_cast<uint32_t>(cols));
  };
  m.rms_final_ = take(d);
  m.embedding_ = matrix(v, d);
  for (auto& l : m.layers_) l.wq = matrix(d, d);
  for (auto& l : m.layers_) l.wk = matrix(kv, d);
  for (auto& l : m.layers_) l.wv = matrix(kv, d);
  for (auto& l : m.layers_) l.wo = matrix(d, d);
  for (auto& l : m.layers_) l.w1 = matrix(hid, d);
  for (auto& l : m.layers_) l.w2 = matrix(d, hid);
  for (auto& l : m.layers_) l.w3 = matrix(hid, d);
  m.classifier_ = c.shared_classifier ? m.embedding_ : matrix(v, d);
  if (off != m.weights_.size()) return Status::Internal("checkpoint weight offsets do not add up");
  return m;
}

Result<std::vector<uint8_t>> ReadFileBytes(const std::string& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) return Status::IoError("cannot open " + path + ": " + std::strerror(errno));
  std::vector<uint8_t> out;
  uint8_t buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f.get())) > 0) out.insert(out.end(), buf, buf + n);
  if (std::ferror(f.get())) return Status::IoError("cannot read " + path);
  return out;
}

Result<Model> LoadModel(const std::string& path) {
  KV_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFileBytes(path));
  auto model = ParseModel(bytes);
  if (!model.ok()) {
    return Status(model.status().code(), path + ": " + model.status().message());
  }
  return model;
}

}  // namespace kvcache::model
