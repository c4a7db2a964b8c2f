// NaiveKv: the reference KvBackend. K/V rows live in plain f32 vectors and
// attention is written out in scalar loops (scores, max-subtracted softmax,
// weighted sum of values), one query head at a time.
//
// With a non-f32 FormatPair every stored row is first round-tripped through
// kvcache's RowCodec (encode, then decode) -- no calibration transform -- so
// it shows what a format's rounding alone does, independently of the cache and
// attention kernels.
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

  uint32_t num_tokens() const override { return num_tokens_; }
  Status Extend(uint32_t n) override;
  Status Store(uint32_t layer, std::span<const float> k, std::span<const float> v) override;
  Status Attend(uint32_t layer, std::span<const float> q, std::span<float> out) override;
  Status Truncate(uint32_t num_tokens) override;
  Result<std::unique_ptr<KvBackend>> Fork() override;

 private:
  NaiveKv() = default;
  Status RoundTrip(const std::optional<RowCodec>& codec, std::span<float> rows);

  Status AttendWithReference(uint32_t layer, std::span<const float> q, std::span<float> out);

  AttentionShape shape_;
  NaiveAttention attention_ = NaiveAttention::kScalar;
  std::optional<RowCodec> k_codec_, v_codec_;  // absent for f32
  uint32_t num_tokens_ = 0;  // positions, the last pass_ of them added by the latest Extend
  uint32_t pass_ = 0;
  // [n_layers][stored_[l]][kv_dim]
  std::vector<std::vector<float>> k_, v_;
  std::vector<float> scratch_;  // [positions] scores, [row_bytes] encoded rows
  std::vector<uint8_t> encoded_;
  std::vector<uint32_t> stored_;  // [n_layers] positions stored per layer
};

}  // namespace kvcache::model
