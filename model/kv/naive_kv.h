// NaiveKv: the reference KvBackend. K/V rows live in plain f32 vectors and
// attention is written out in scalar loops (scores, max-subtracted softmax,
// weighted sum of values), one query head at a time. A sliding-window layer
// (AttentionShape::windows) keeps every row and masks: each query reads only
// the last W positions up to its own.
//
// With a non-f32 FormatPair every stored row is first round-tripped through
// kvcache's RowCodec (encode, then decode) -- no calibration transform -- so
// it shows what a format's rounding alone does, independently of the cache and
// attention kernels. A KvVariant (model/kv/kv_variant.h) adds the low-bit
// candidates: bf16 sinks and recent window, per-channel block keys, the
// cache's per-head calibration, rotation before the codec, dense key outlier
// channels. The backend keeps every row as given (f32) and the row attention
// reads: bf16 of it while the row is a sink or in the window (or open block),
// its codec round trip from the moment it leaves -- exactly what a cache that
// re-encodes a row when it leaves the bf16 window stores.
//
// NaiveAttention::kKvcacheReference instead runs kvcache::AttendReference
// over the same f32 rows: the documented summation order that kvcache's f32
// kernels reproduce bit for bit, so full recomputation on it must equal
// cached decoding exactly (the scalar loops agree only to float rounding).
//
// Thread safety: one thread at a time.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "kvcache/codec.h"
#include "kvcache/format.h"
#include "model/kv/kv_backend.h"
#include "model/kv/kv_variant.h"

namespace kvcache::model {

enum class NaiveAttention : uint8_t {
  kScalar,             // the loops in naive_kv.cc
  kKvcacheReference,   // kvcache::AttendReference (attention.h)
};

class NaiveKv final : public KvBackend {
 public:
  // InvalidArgument if a format cannot take shape.head_dim.
  static Result<std::unique_ptr<NaiveKv>> Create(
      const AttentionShape& shape, FormatPair formats = {},
      NaiveAttention attention = NaiveAttention::kScalar);
  // InvalidArgument also when sinks + recent exceed shape.max_seq_len, or
  // key_outliers is not below head_dim, or rotation cannot take head_dim.
  static Result<std::unique_ptr<NaiveKv>> CreateVariant(const AttentionShape& shape,
                                                        const KvVariant& variant,
                                                        NaiveAttention attention = NaiveAttention::kScalar);

  uint32_t num_tokens() const override { return num_tokens_; }
  Status Extend(uint32_t n) override;
  Status Store(uint32_t layer, std::span<const float> k, std::span<const float> v) override;
  Status Attend(uint32_t layer, std::span<const float> q, std::span<float> out) override;
  Status Truncate(uint32_t num_tokens) override;
  Result<std::unique_ptr<KvBackend>> Fork() override;
  uint32_t window(uint32_t layer) const override { return shape_.window(layer); }

  // The rows attention reads now for one layer, [positions stored][kv_dim]
  // (heads side by side): for tests that check what a variant stores.
  std::span<const float> AttendedKeys(uint32_t layer) const { return k_.at(layer); }
  std::span<const float> AttendedValues(uint32_t layer) const { return v_.at(layer); }

 private:
  NaiveKv() = default;
  // End of the quantized positions [sinks, end) when n are stored.
  uint32_t QuantizedEnd(uint32_t n) const;
  // Per-head transforms and outlier channels from a layer's first rows.
  void Calibrate(uint32_t layer, uint32_t n);
  // Rows [t0, t1) of one side of a layer: the codec round trip of the
  // stored f32 rows into the attended rows.
  Status Quantize(uint32_t layer, bool key, uint32_t t0, uint32_t t1);
  Status QuantizeHead(uint32_t layer, bool key, uint32_t head, uint32_t t0, std::span<float> rows);
  // Rows [t0, t1) of both sides attended as bf16 of the stored rows.
  void SetExact(uint32_t layer, uint32_t t0, uint32_t t1);

  Status AttendWithReference(uint32_t layer, std::span<const float> q, std::span<float> out);

  AttentionShape shape_;
  KvVariant variant_;
  NaiveAttention attention_ = NaiveAttention::kScalar;
  std::optional<RowCodec> k_codec_, v_codec_;  // absent for f32 (and kc keys)
  std::optional<RowCodec> rotation_;           // variant_.rotate only
  uint32_t num_tokens_ = 0;  // positions, the last pass_ of them added by the latest Extend
  uint32_t pass_ = 0;
  // [n_layers][stored_[l]][kv_dim]: the rows attention reads, and as given
  std::vector<std::vector<float>> k_, v_, raw_k_, raw_v_;
  std::vector<float> scratch_;  // [positions] scores
  std::vector<float> keys_t_;   // [n_kv_heads][head_dim][positions] keys, transposed
  std::vector<uint8_t> encoded_;
  std::vector<uint32_t> stored_;  // [n_layers] positions stored per layer
  std::vector<uint32_t> q_end_;   // [n_layers] QuantizedEnd of the rows attended now
  // [n_layers][n_kv_heads]: calibration (cal) and dense key channels.
  std::vector<std::vector<RowTransform>> k_tf_, v_tf_;
  std::vector<std::vector<std::vector<uint32_t>>> outliers_;
};

}  // namespace kvcache::model
