// Format-pair evaluation: see eval.h.
#include "tools/support/eval/eval.h"

#include <fmt/format.h>

#include <algorithm>

#include "kvcache/codec.h"

namespace kvcache::eval {

Status EvalData::Validate() const {
  if (tokens == 0 || kv_heads == 0 || head_dim == 0 || num_queries == 0 || q_heads == 0) {
    return Status::InvalidArgument(fmt::format(
        "eval data: tokens ({}), kv_heads ({}), head_dim ({}), queries ({}) and q_heads ({}) must be > 0",
        tokens, kv_heads, head_dim, num_queries, q_heads));
  }
  if (q_heads % kv_heads != 0) {
    return Status::InvalidArgument(
        fmt::format("eval data: q_heads ({}) must be a multiple of kv_heads ({})", q_heads, kv_heads));
  }
  const size_t kv = static_cast<size_t>(tokens) * kv_heads * head_dim;
  if (keys.size() != kv || values.size() != kv) {
    return Status::InvalidArgument(fmt::format(
        "eval data: keys ({}) and values ({}) must hold tokens*kv_heads*head_dim = {} floats", keys.size(),
        values.size(), kv));
  }
  if (queries.size() != static_cast<size_t>(num_queries) * q_heads * head_dim) {
    return Status::InvalidArgument("eval data: queries must hold num_queries*q_heads*head_dim floats");
  }
  return Status::Ok();
}

Evaluator::Evaluator(const EvalData& data, EvalOptions options) : data_(data), options_(options) {
  const size_t n = static_cast<size_t>(data.num_queries) * data.q_heads;
  const size_t D = data.head_dim, T = data.tokens;
  ref_log_p_.resize(n * T);
  ref_out_.resize(n * D);
  const uint32_t group = data.q_heads / data.kv_heads;
  for (size_t i = 0; i < n; ++i) {
    const size_t h = (i % data.q_heads) / group;
    HeadAttention(std::span<const float>(&data.queries[i * D], D), &data.keys[h * D], &data.values[h * D], T,
                  static_cast<size_t>(data.kv_heads) * D, std::span<double>(&ref_log_p_[i * T], T),
                  std::span<double>(&ref_out_[i * D], D));
  }
}

Result<const std::vector<float>*> Evaluator::Decoded(Format format, Side side) {
  auto it = decoded_.find({format, side});
  if (it != decoded_.end()) return &it->second;
  const uint32_t T = data_.tokens, H = data_.kv_heads, D = data_.head_dim;
  KV_ASSIGN_OR_RETURN(RowCodec codec, RowCodec::Create(format, D, side));
  const std::vector<float>& src = side == Side::kKey ? data_.keys : data_.values;
  std::vector<float> out(src.size());     // [T][H][D]
  std::vector<float> rows(static_cast<size_t>(T) * D);  // [T][D] of one head
  std::vector<float> decoded(rows.size());               // [T][D]
  std::vector<uint8_t> stored(static_cast<size_t>(T) * codec.row_bytes());  // [T][row_bytes]
  for (uint32_t h = 0; h < H; ++h) {
    for (uint32_t t = 0; t < T; ++t) {
      std::copy_n(&src[(static_cast<size_t>(t) * H + h) * D], D, &rows[static_cast<size_t>(t) * D]);
    }
    const size_t calib = std::min<size_t>(T, std::max<uint32_t>(1, options_.calibration_tokens));
    const RowTransform transform = codec.Calibrate(std::span<const float>(rows.data(), calib * D));
    const RowTransform* tp = transform.empty() ? nullptr : &transform;
    KV_RETURN_IF_ERROR(codec.Encode(rows, stored, tp));
    KV_RETURN_IF_ERROR(codec.Decode(stored, decoded, tp));
    for (uint32_t t = 0; t < T; ++t) {
      std::copy_n(&decoded[static_cast<size_t>(t) * D], D, &out[(static_cast<size_t>(t) * H + h) * D]);
    }
  }
  return &decoded_.emplace(std::make_pair(format, side), std::move(out)).first->second;
}

Result<PairResult> Evaluator::Evaluate(FormatPair pair) {
  const uint32_t D = data_.head_dim;
  KV_RETURN_IF_ERROR(CheckHeadDim(pair.k, D));
  KV_RETURN_IF_ERROR(CheckHeadDim(pair.v, D));
  auto k = Decoded(pair.k, Side::kKey);
  if (!k.ok()) {
    return Status(k.status().code(), fmt::format("keys in {}: {}", FormatName(pair.k), k.status().message()));
  }
  auto v = Decoded(pair.v, Side::kValue);
  if (!v.ok()) {
    return Status(v.status().code(), fmt::format("values in {}: {}", FormatName(pair.v), v.status().message()));
  }
  const std::vector<float>& keys = **k;
  const std::vector<float>& values = **v;
  PairResult r;
  r.pair = pair;
  r.k_bits = BitsPerValue(pair.k, D);
  r.v_bits = BitsPerValue(pair.v, D);
  r.k_nmse = Nmse(data_.keys, keys);
  r.v_nmse = Nmse(data_.values, values);
  const size_t n = static_cast<size_t>(data_.num_queries) * data_.q_heads;
  const size_t T = data_.tokens;
  const uint32_t group = data_.q_heads / data_.kv_heads;
  std::vector<double> log_p(T), out(D);
  AttentionStats stats;
  for (size_t i = 0; i < n; ++i) {
    const size_t h = (i % data_.q_heads) / group;
    HeadAttention(std::span<const float>(&data_.queries[i * D], D), &keys[h * D], &values[h * D], T,
                  static_cast<size_t>(data_.kv_heads) * D, log_p, out);
    stats.Add(std::span<const double>(&ref_log_p_[i * T], T), std::span<const double>(&ref_out_[i * D], D),
              log_p, out);
  }
  r.attention = stats.Summary();
  return r;
}

}  // namespace kvcache::eval
