// NaiveKv: f32 vectors and scalar attention, optionally with codec rounding.
#include "model/kv/naive_kv.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "kvcache/attention.h"
#include "kvcache/float16.h"
#include "model/tensor/ops.h"

namespace kvcache::model {

Result<std::unique_ptr<NaiveKv>> NaiveKv::Create(const AttentionShape& shape, FormatPair formats,
                                                 NaiveAttention attention) {
  return CreateVariant(shape, KvVariant::Of(formats), attention);
}

Result<std::unique_ptr<NaiveKv>> NaiveKv::CreateVariant(const AttentionShape& shape,
                                                        const KvVariant& variant,
                                                        NaiveAttention attention) {
  if (shape.n_layers == 0 || shape.n_kv_heads == 0 || shape.head_dim == 0 ||
      shape.n_heads % shape.n_kv_heads != 0) {
    return Status::InvalidArgument("naive kv: bad attention shape");
  }
  const std::string name = KvVariantName(variant);
  if (static_cast<uint64_t>(variant.sinks) + variant.recent > shape.max_seq_len) {
    return Status::InvalidArgument("naive kv " + name + ": sinks + recent (" +
                                   std::to_string(variant.sinks + variant.recent) +
                                   ") exceed max_seq_len " + std::to_string(shape.max_seq_len));
  }
  if (variant.key_outliers >= shape.head_dim) {
    return Status::InvalidArgument("naive kv " + name + ": " + std::to_string(variant.key_outliers) +
                                   " outlier channels, head_dim is " + std::to_string(shape.head_dim));
  }
  if (variant.block_tokens == 0) return Status::InvalidArgument("naive kv " + name + ": block of 0 tokens");
  std::unique_ptr<NaiveKv> kv(new NaiveKv());
  kv->shape_ = shape;
  kv->variant_ = variant;
  kv->attention_ = attention;
  if (variant.formats.k != Format::kF32 && variant.key_channel.bits == 0) {
    KV_ASSIGN_OR_RETURN(RowCodec c, RowCodec::Create(variant.formats.k, shape.head_dim, Side::kKey));
    kv->k_codec_ = std::move(c);
  }
  if (variant.formats.v != Format::kF32) {
    KV_ASSIGN_OR_RETURN(RowCodec c, RowCodec::Create(variant.formats.v, shape.head_dim, Side::kValue));
    kv->v_codec_ = std::move(c);
  }
  if (variant.rotate) {
    KV_ASSIGN_OR_RETURN(RowCodec c, RowCodec::Create(Format::kTurbo4, shape.head_dim, Side::kKey));
    kv->rotation_ = std::move(c);
  }
  for (auto* rows : {&kv->k_, &kv->v_, &kv->raw_k_, &kv->raw_v_}) rows->resize(shape.n_layers);
  kv->stored_.assign(shape.n_layers, 0);
  kv->q_end_.assign(shape.n_layers, 0);
  kv->k_tf_.assign(shape.n_layers, std::vector<RowTransform>(shape.n_kv_heads));
  kv->v_tf_ = kv->k_tf_;
  kv->outliers_.assign(shape.n_layers, std::vector<std::vector<uint32_t>>(shape.n_kv_heads));
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

uint32_t NaiveKv::QuantizedEnd(uint32_t n) const {
  uint32_t end = n > variant_.recent ? n - variant_.recent : 0;
  if (variant_.block_mode()) end = end / variant_.block_tokens * variant_.block_tokens;
  return std::max(end, std::min(variant_.sinks, n));
}

void NaiveKv::Calibrate(uint32_t layer, uint32_t n) {
  const uint32_t hd = shape_.head_dim, kv_dim = shape_.kv_dim();
  std::vector<float> rows(static_cast<size_t>(n) * hd);
  for (uint32_t h = 0; h < shape_.n_kv_heads; ++h) {
    for (bool key : {true, false}) {
      const std::vector<float>& raw = key ? raw_k_[layer] : raw_v_[layer];
      for (uint32_t t = 0; t < n; ++t) {
        std::copy_n(raw.data() + static_cast<size_t>(t) * kv_dim + h * hd, hd, rows.data() + size_t{t} * hd);
      }
      const std::optional<RowCodec>& codec = key ? k_codec_ : v_codec_;
      if (variant_.calibrate && codec) (key ? k_tf_ : v_tf_)[layer][h] = codec->Calibrate(rows);
      if (!key || variant_.key_outliers == 0) continue;
      // The channels with the largest |x - mean| over these rows.
      const std::vector<float>& mean = k_tf_[layer][h].mean;
      std::vector<std::pair<float, uint32_t>> peak(hd);
      for (uint32_t c = 0; c < hd; ++c) {
        float m = 0;
        for (uint32_t t = 0; t < n; ++t) {
          m = std::max(m, std::fabs(rows[size_t{t} * hd + c] - (mean.empty() ? 0.0f : mean[c])));
        }
        peak[c] = {-m, c};
      }
      std::sort(peak.begin(), peak.end());
      std::vector<uint32_t>& out = outliers_[layer][h];
      out.clear();
      for (uint32_t i = 0; i < variant_.key_outliers; ++i) out.push_back(peak[i].second);
      std::sort(out.begin(), out.end());
    }
  }
}

Status NaiveKv::QuantizeHead(uint32_t layer, bool key, uint32_t head, uint32_t t0,
                             std::span<float> rows) {
  const uint32_t hd = shape_.head_dim;
  const size_t n = rows.size() / hd;
  const std::vector<uint32_t>& dense = key ? outliers_[layer][head] : std::vector<uint32_t>{};
  const RowTransform& tf = (key ? k_tf_ : v_tf_)[layer][head];
  std::vector<float> kept(n * dense.size());
  for (size_t t = 0; t < n; ++t) {
    for (size_t i = 0; i < dense.size(); ++i) {
      float& x = rows[t * hd + dense[i]];
      kept[t * dense.size() + i] = BF16ToFloat(FloatToBF16(x));
      x = tf.mean.empty() ? 0.0f : tf.mean[dense[i]];  // zero after the mean is taken out
    }
  }
  if (key && variant_.key_channel.bits != 0) {
    // Blocks of block_tokens positions, the first one without its sinks.
    const uint32_t g = variant_.block_tokens;
    for (size_t a = 0; a < n;) {
      const size_t b = std::min<size_t>(n, (t0 + a) / g * g + g - t0);
      auto block = rows.subspan(a * hd, (b - a) * hd);
      KV_RETURN_IF_ERROR(ChannelBlockRoundTrip(variant_.key_channel, hd, block, block));
      a = b;
    }
  } else if (const std::optional<RowCodec>& codec = key ? k_codec_ : v_codec_; codec) {
    encoded_.resize(n * codec->row_bytes());
    if (rotation_) {
      // x -> H((x - mean) / col_scale) -> codec -> back, all in f32.
      for (size_t t = 0; t < n; ++t) {
        for (uint32_t c = 0; c < hd; ++c) {
          float& x = rows[t * hd + c];
          if (!tf.mean.empty()) x -= tf.mean[c];
          if (!tf.col_scale.empty()) x /= tf.col_scale[c];
        }
      }
      KV_RETURN_IF_ERROR(rotation_->RotateRows(rows));
      KV_RETURN_IF_ERROR(codec->Encode(rows, encoded_));
      KV_RETURN_IF_ERROR(codec->Decode(encoded_, rows));
      for (size_t t = 0; t < n; ++t) {
        rotation_->InverseRotate(rows.data() + t * hd);
        for (uint32_t c = 0; c < hd; ++c) {
          float& x = rows[t * hd + c];
          if (!tf.col_scale.empty()) x *= tf.col_scale[c];
          if (!tf.mean.empty()) x += tf.mean[c];
        }
      }
    } else {
      const RowTransform* t = tf.empty() ? nullptr : &tf;
      KV_RETURN_IF_ERROR(codec->Encode(rows, encoded_, t));
      KV_RETURN_IF_ERROR(codec->Decode(encoded_, rows, t));
    }
  }
  for (size_t t = 0; t < n; ++t) {
    for (size_t i = 0; i < dense.size(); ++i) rows[t * hd + dense[i]] = kept[t * dense.size() + i];
  }
  return Status::Ok();
}

Status NaiveKv::Quantize(uint32_t layer, bool key, uint32_t t0, uint32_t t1) {
  if (t1 <= t0) return Status::Ok();
  const uint32_t hd = shape_.head_dim, kv_dim = shape_.kv_dim();
  const std::vector<float>& raw = key ? raw_k_[layer] : raw_v_[layer];
  std::vector<float>& out = key ? k_[layer] : v_[layer];
  std::vector<float> rows(static_cast<size_t>(t1 - t0) * hd);
  for (uint32_t h = 0; h < shape_.n_kv_heads; ++h) {
    for (uint32_t t = t0; t < t1; ++t) {
      std::copy_n(raw.data() + static_cast<size_t>(t) * kv_dim + h * hd, hd,
                  rows.data() + static_cast<size_t>(t - t0) * hd);
    }
    if (variant_.from_bf16) {
      for (float& x : rows) x = BF16ToFloat(FloatToBF16(x));
    }
    KV_RETURN_IF_ERROR(QuantizeHead(layer, key, h, t0, rows));
    for (uint32_t t = t0; t < t1; ++t) {
      std::copy_n(rows.data() + static_cast<size_t>(t - t0) * hd, hd,
                  out.data() + static_cast<size_t>(t) * kv_dim + h * hd);
    }
  }
  return Status::Ok();
}

void NaiveKv::SetExact(uint32_t layer, uint32_t t0, uint32_t t1) {
  const size_t a = static_cast<size_t>(t0) * shape_.kv_dim(), b = static_cast<size_t>(t1) * shape_.kv_dim();
  for (size_t i = a; i < b; ++i) {
    k_[layer][i] = BF16ToFloat(FloatToBF16(raw_k_[layer][i]));
    v_[layer][i] = BF16ToFloat(FloatToBF16(raw_v_[layer][i]));
  }
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
  const size_t size = static_cast<size_t>(num_tokens_) * shape_.kv_dim();
  raw_k_[layer].resize(static_cast<size_t>(base) * shape_.kv_dim());
  raw_v_[layer].resize(raw_k_[layer].size());
  raw_k_[layer].insert(raw_k_[layer].end(), k.begin(), k.end());
  raw_v_[layer].insert(raw_v_[layer].end(), v.begin(), v.end());
  k_[layer].resize(size);
  v_[layer].resize(size);
  if (base == 0 && num_tokens_ > 0) Calibrate(layer, num_tokens_);
  // Rows [q_end, end) leave the bf16 window now; the new rows outside
  // [sinks, end) enter it.
  const uint32_t end = QuantizedEnd(num_tokens_);
  const uint32_t from = std::max(q_end_[layer], std::min(variant_.sinks, num_tokens_));
  KV_RETURN_IF_ERROR(Quantize(layer, true, from, end));
  KV_RETURN_IF_ERROR(Quantize(layer, false, from, end));
  SetExact(layer, base, std::max(base, std::min(variant_.sinks, num_tokens_)));
  SetExact(layer, std::max(base, end), num_tokens_);
  q_end_[layer] = end;
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
  // Keys transposed per head, [n_kv_heads][head_dim][num_tokens], so each
  // score still sums q[d] * k[d] in order d = 0, 1, ... but the loop runs
  // over positions (vectorizable without reordering any sum).
  const size_t n = num_tokens_;
  keys_t_.resize(static_cast<size_t>(shape_.n_kv_heads) * hd * n);
  for (uint32_t t = 0; t < n; ++t) {
    for (uint32_t c = 0; c < kv_dim; ++c) keys_t_[c * n + t] = keys[static_cast<size_t>(t) * kv_dim + c];
  }
  const uint32_t window = shape_.window(layer);
  for (uint32_t i = 0; i < pass_; ++i) {
    const uint32_t end = base + i + 1;  // positions first ..= this query's
    const uint32_t first = window != 0 && end > window ? end - window : 0;
    const uint32_t len = end - first;
    for (uint32_t h = 0; h < shape_.n_heads; ++h) {
      const float* qh = q.data() + static_cast<size_t>(i) * q_dim + h * hd;
      const uint32_t kvh = h / group;
      float* att = scratch_.data();
      std::fill_n(att, len, 0.0f);
      for (uint32_t d = 0; d < hd; ++d) {
        const float qd = qh[d];
        const float* kd = keys_t_.data() + (static_cast<size_t>(kvh) * hd + d) * n + first;
        for (uint32_t t = 0; t < len; ++t) att[t] += qd * kd[t];
      }
      for (uint32_t t = 0; t < len; ++t) att[t] *= inv_sqrt;
      Softmax(att, len);
      float* oh = out.data() + static_cast<size_t>(i) * q_dim + h * hd;
      for (uint32_t d = 0; d < hd; ++d) oh[d] = 0;
      for (uint32_t t = 0; t < len; ++t) {
        const float* vt = values + static_cast<size_t>(first + t) * kv_dim + kvh * hd;
        const float w = att[t];
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
  if (shape_.window(layer) < num_tokens_) options.window = shape_.window(layer);
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
    for (auto* rows : {&k_[l], &v_[l], &raw_k_[l], &raw_v_[l]}) {
      rows->resize(std::min(rows->size(), static_cast<size_t>(num_tokens) * shape_.kv_dim()));
    }
    stored_[l] = std::min(stored_[l], num_tokens);
    // Rows that were quantized but are back in the window (or an open
    // block) are attended as bf16 again.
    const uint32_t end = std::min(q_end_[l], QuantizedEnd(stored_[l]));
    SetExact(l, std::max(end, std::min(variant_.sinks, stored_[l])), std::min(q_end_[l], stored_[l]));
    q_end_[l] = end;
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
