// NaiveKv: f32 vectors and scalar attention, optionally with codec rounding.
#include "model/kv/naive_kv.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "kvcache/attention.h"

namespace kvcache::model {

Result<std::unique_ptr<NaiveKv>> NaiveKv::Create(const AttentionShape& shape, FormatPair formats,
                                                 NaiveAttention attention) {
  if (shape.n_layers == 0 || shape.n_kv_heads == 0 || shape.head_dim == 0 ||
      shape.n_heads % shape.n_kv_heads != 0) {
    return Status::InvalidArgument("naive kv: bad attention shape");
  }
  std::unique_ptr<NaiveKv> kv(new NaiveKv());
  kv->shape_ = shape;
  kv->attention_ = attention;
  if (formats.k != Format::kF32) {
    KV_ASSIGN_OR_RETURN(RowCodec c, RowCodec::Create(formats.k, shape.head_dim, Side::kKey));
    kv->k_codec_ = std::move(c);
  }
  if (formats.v != Format::kF32) {
    KV_ASSIGN_OR_RETURN(RowCodec c, RowCodec::Create(formats.v, shape.head_dim, Side::kValue));
    kv->v_codec_ = std::move(c);
  }
  kv->k_.resize(shape.n_layers);
  kv->v_.resize(shape.n_layers);
  kv->stored_.assign(shape.n_layers, 0);
  return kv;
}

Status NaiveKv::Extend(uint32_t n) {
  if (static_cast<uint64_t>(num_tokens_) + n > shape_.max_seq_len) {
    return Status::CapacityExceeded("naive kv: " + std::to_string(num_tokens_ + n) +
                                    " positions exceed max_seq_len " +
                                    std::to_string(shape_.max_seq_len));
  }
  num_tokens_ += n;
  pass_ = n;
  return Status::Ok();
}

Status NaiveKv::RoundTrip(const std::optional<RowCodec>& codec, std::span<float> rows) {
  if (!codec) return Status::Ok();
  encoded_.resize(rows.size() / shape_.head_dim * codec->row_bytes());
  KV_RETURN_IF_ERROR(codec->Encode(rows, encoded_));
  return codec->Decode(encoded_, rows);
}

Status NaiveKv::Store(uint32_t layer, std::span<const float> k, std::span<const float> v) {
  const size_t want = static_cast<size_t>(pass_) * shape_.kv_dim();
  if (layer >= shape_.n_layers || k.size() != want || v.size() != want) {
    return Status::InvalidArgument("naive kv: store with wrong layer or sizes");
  }
  const uint32_t base = num_tokens_ - pass_;
  if (stored_[layer] != base) {
    return Status::FailedPrecondition("naive kv: layer " + std::to_string(layer) + " holds " +
                                      std::to_string(stored_[layer]) +
                                      " positions, the pass starts at " + std::to_string(base));
  }
  std::vector<float> kr(k.begin(), k.end()), vr(v.begin(), v.end());
  KV_RETURN_IF_ERROR(RoundTrip(k_codec_, kr));
  KV_RETURN_IF_ERROR(RoundTrip(v_codec_, vr));
  k_[layer].resize(static_cast<size_t>(base) * shape_.kv_dim());
  v_[layer].resize(static_cast<size_t>(base) * shape_.kv_dim());
  k_[layer].insert(k_[layer].end(), kr.begin(), kr.end());
  v_[layer].insert(v_[layer].end(), vr.begin(), vr.end());
  stored_[layer] = num_tokens_;
  return Status::Ok();
}

Status NaiveKv::Attend(uint32_t layer, std::span<const float> q, std::span<float> out) {
  const uint32_t hd = shape_.head_dim, kv_dim = shape_.kv_dim(), q_dim = shape_.q_dim();
  const size_t want = static_cast<size_t>(pass_) * q_dim;
  if (layer >= shape_.n_layers || q.size() != want || out.size() != want) {
    return Status::InvalidArgument("naive kv: attend with wrong layer or sizes");
  }
  if (stored_[layer] != num_tokens_) {
    return Status::FailedPrecondition("naive kv: attend before store");
  }
  if (attention_ == NaiveAttention::kKvcacheReference) return AttendWithReference(layer, q, out);
  const uint32_t base = num_tokens_ - pass_;
  const uint32_t group = shape_.n_heads / shape_.n_kv_heads;
  const float inv_sqrt = 1.0f / std::sqrt(static_cast<float>(hd));
  const float* keys = k_[layer].data();
  const float* values = v_[layer].data();
  scratch_.resize(num_tokens_);
  for (uint32_t i = 0; i < pass_; ++i) {
    const uint32_t len = base + i + 1;  // positions 0 ..= this query's
    for (uint32_t h = 0; h < shape_.n_heads; ++h) {
      const float* qh = q.data() + static_cast<size_t>(i) * q_dim + h * hd;
      const uint32_t kvh = h / group;
      float* att = scratch_.data();
      for (uint32_t t = 0; t < len; ++t) {
        const float* kt = keys + static_cast<size_t>(t) * kv_dim + kvh * hd;
        float s = 0;
        for (uint32_t d = 0; d < hd; ++d) s += qh[d] * kt[d];
        att[t] = s * inv_sqrt;
      }
      float mx = att[0];
      for (uint32_t t = 1; t < len; ++t) mx = std::max(mx, att[t]);
      float sum = 0;
      for (uint32_t t = 0; t < len; ++t) {
        att[t] = std::exp(att[t] - mx);
        sum += att[t];
      }
      float* oh = out.data() + static_cast<size_t>(i) * q_dim + h * hd;
      for (uint32_t d = 0; d < hd; ++d) oh[d] = 0;
      for (uint32_t t = 0; t < len; ++t) {
        const float* vt = values + static_cast<size_t>(t) * kv_dim + kvh * hd;
        const float w = att[t] / sum;
        for (uint32_t d = 0; d < hd; ++d) oh[d] += w * vt[d];
      }
    }
  }
  return Status::Ok();
}

Status NaiveKv::AttendWithReference(uint32_t layer, std::span<const float> q,
                                    std::span<float> out) {
  // Per kv head, contiguous [num_tokens][head_dim] copies of the rows.
  const uint32_t hd = shape_.head_dim, kv_dim = shape_.kv_dim();
  std::vector<std::vector<float>> keys(shape_.n_kv_heads), values(shape_.n_kv_heads);
  std::vector<ReferenceHead> heads(shape_.n_kv_heads);
  for (uint32_t h = 0; h < shape_.n_kv_heads; ++h) {
    keys[h].resize(static_cast<size_t>(num_tokens_) * hd);
    values[h].resize(static_cast<size_t>(num_tokens_) * hd);
    for (uint32_t t = 0; t < num_tokens_; ++t) {
      const size_t src = static_cast<size_t>(t) * kv_dim + h * hd;
      std::copy_n(k_[layer].data() + src, hd, keys[h].data() + static_cast<size_t>(t) * hd);
      std::copy_n(v_[layer].data() + src, hd, values[h].data() + static_cast<size_t>(t) * hd);
    }
    heads[h].keys = keys[h];
    heads[h].values = values[h];
  }
  AttentionOptions options;
  options.n_q_heads = shape_.n_heads;
  AttentionOutput output;
  output.out = out;
  return AttendReference(heads, hd, num_tokens_, pass_, q, options, output);
}

Status NaiveKv::Truncate(uint32_t num_tokens) {
  if (num_tokens > num_tokens_) {
    return Status::OutOfRange("naive kv: truncate to " + std::to_string(num_tokens) +
                              " past the end " + std::to_string(num_tokens_));
  }
  num_tokens_ = num_tokens;
  pass_ = 0;
  for (uint32_t l = 0; l < shape_.n_layers; ++l) {
    k_[l].resize(static_cast<size_t>(num_tokens) * shape_.kv_dim());
    v_[l].resize(static_cast<size_t>(num_tokens) * shape_.kv_dim());
    stored_[l] = std::min(stored_[l], num_tokens);
  }
  return Status::Ok();
}

Result<std::unique_ptr<KvBackend>> NaiveKv::Fork() {
  for (uint32_t s : stored_) {
    if (s != num_tokens_) return Status::FailedPrecondition("naive kv: fork inside a pass");
  }
  std::unique_ptr<NaiveKv> copy(new NaiveKv(*this));
  return std::unique_ptr<KvBackend>(std::move(copy));
}

}  // namespace kvcache::model
