// Fuzz target `llama2c_checkpoint`: model::ParseModel on arbitrary bytes
// (model/io/checkpoint.cc). An accepted checkpoint has a valid config, fills
// the file exactly, and every weight span lies inside the model (each is
// read in full here, so ASan sees an overrun). Thread safety: fuzz_target.h.
#include <span>

#include "fuzz/fuzz_target.h"
#include "model/tensor/matmul.h"
#include "model/io/checkpoint.h"

namespace {
float Sum(std::span<const float> s) {
  float acc = 0;
  for (float x : s) acc += x;
  return acc;
}
// An f32 matrix view of rows x cols, read in full.
bool IsF32(const kvcache::model::WeightMatrix& w, size_t rows, size_t cols) {
  return w.type == kvcache::model::GgmlType::kF32 && w.rows == rows && w.cols == cols &&
         w.row_bytes == cols * sizeof(float) && w.data != nullptr;
}
float Sum(const kvcache::model::WeightMatrix& w) {
  return Sum(std::span<const float>(reinterpret_cast<const float*>(w.data),
                                    size_t{w.rows} * w.cols));
}
}  // namespace

KVCACHE_FUZZ_TARGET(llama2c_checkpoint) {
  using namespace kvcache;
  auto m = model::ParseModel(std::span<const uint8_t>(data, size));
  if (!m.ok()) {
    FUZZ_CHECK(m.status().code() == StatusCode::kCorruption ||
               m.status().code() == StatusCode::kInvalidArgument);
    return 0;
  }
  const model::ModelConfig& c = m->config();
  FUZZ_CHECK(c.Validate().ok());
  FUZZ_CHECK(model::kCheckpointHeaderBytes + c.NumWeights() * sizeof(float) == size);
  const size_t d = c.dim, kv = c.kv_dim(), hid = c.hidden_dim, v = c.vocab_size;
  volatile float sink = 0;
  for (uint32_t l = 0; l < c.n_layers; ++l) {
    const model::LayerWeights& w = m->layer(l);
    FUZZ_CHECK(w.rms_att.size() == d && w.rms_ffn.size() == d);
    FUZZ_CHECK(IsF32(w.wq, d, d) && IsF32(w.wo, d, d));
    FUZZ_CHECK(IsF32(w.wk, kv, d) && IsF32(w.wv, kv, d));
    FUZZ_CHECK(IsF32(w.w1, hid, d) && IsF32(w.w2, d, hid) && IsF32(w.w3, hid, d));
    sink = sink + Sum(w.rms_att) + Sum(w.rms_ffn) + Sum(w.wq) + Sum(w.wk) + Sum(w.wv) +
           Sum(w.wo) + Sum(w.w1) + Sum(w.w2) + Sum(w.w3);
  }
  FUZZ_CHECK(IsF32(m->embedding(), v, d) && IsF32(m->classifier(), v, d));
  FUZZ_CHECK(m->rms_final().size() == d);
  sink = sink + Sum(m->embedding()) + Sum(m->classifier()) + Sum(m->rms_final());
  (void)sink;
  return 0;
}
