// RowCodec: validation, the per-head transform (mean, column scales), the
// rotation, and dispatch to the SIMD row kernels in codec_simd.cc.
//
// Encode validates everything (sizes, transform, finiteness of the input and
// of the transformed values) before writing a byte, so a failed Encode leaves
// `out` untouched. Values beyond a format's range saturate (f16/bf16 overflow
// to +-inf as IEEE rounding does; the others clamp).
//
// Thread safety: a RowCodec is immutable after Create.
#include "kvcache/codec.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "format/format_internal.h"

namespace kvcache {

namespace fi = format_internal;

namespace {

// Calibration needs this many rows before it estimates a mean or column scales.
constexpr size_t kMinCalibrationRows = 8;
// A channel's median is kept as its mean only if it exceeds this many robust
// standard errors (spread / sqrt(n)): zero-mean data keeps (almost) no mean.
constexpr float kMeanSignificance = 4.0f;

bool UsesMean(Format f) { return f == Format::kQ8 || IsRotated(f); }

float Median(std::vector<float>& v) {
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  float m = v[mid];
  if (v.size() % 2 == 0) {
    const float lo = *std::max_element(v.begin(), v.begin() + mid);
    m = 0.5f * (m + lo);
  }
  return m;
}

}  // namespace

Result<RowCodec> RowCodec::Create(Format format, uint32_t head_dim, Side side, uint64_t seed) {
  KV_RETURN_IF_ERROR(CheckHeadDim(format, head_dim));
  RowCodec c;
  c.format_ = format;
  c.side_ = side;
  c.head_dim_ = head_dim;
  c.row_bytes_ = RowBytes(format, head_dim);
  if (IsRotated(format)) c.signs_ = fi::RotationSigns(seed, head_dim);
  return c;
}

RowTransform RowCodec::Calibrate(std::span<const float> rows) const {
  RowTransform t;
  const size_t d = head_dim_;
  if (!UsesMean(format_) || rows.size() % d != 0) return t;
  const size_t n = rows.size() / d;
  if (n < kMinCalibrationRows) return t;
  for (float v : rows) {
    if (!std::isfinite(v)) return t;
  }
  std::vector<float> col(n), dev(n);
  std::vector<float> mean(d, 0.0f), spread(d, 0.0f);
  bool any_mean = false;
  for (size_t c = 0; c < d; ++c) {
    for (size_t r = 0; r < n; ++r) col[r] = rows[r * d + c];
    const float med = Median(col);
    for (size_t r = 0; r < n; ++r) dev[r] = std::fabs(col[r] - med);
    const float sigma = 1.4826f * Median(dev);  // robust spread (MAD)
    if (std::fabs(med) > kMeanSignificance * sigma / std::sqrt(static_cast<float>(n))) {
      mean[c] = med;
      any_mean = true;
    }
    double ss = 0;
    for (size_t r = 0; r < n; ++r) {
      const double v = col[r] - mean[c];
      ss += v * v;
    }
    spread[c] = static_cast<float>(std::sqrt(ss / static_cast<double>(n)));
  }
  if (any_mean) t.mean = std::move(mean);
  if (format_ == Format::kQ8 && side_ == Side::kKey) {
    const float top = *std::max_element(spread.begin(), spread.end());
    if (top > 0.0f && std::isfinite(top)) {
      // Floor tiny channels so dividing by them cannot blow values up.
      const float floor = 1e-2f * top;
      for (float& s : spread) s = std::max(s, floor);
      t.col_scale = std::move(spread);
    }
  }
  return t;
}

namespace {

Status CheckTransform(const RowTransform* t, uint32_t d) {
  if (t == nullptr) return Status::Ok();
  if (!t->mean.empty()) {
    if (t->mean.size() != d) {
      return Status::InvalidArgument(
          fmt::format("transform mean has {} values, head_dim is {}", t->mean.size(), d));
    }
    for (float m : t->mean) {
      if (!std::isfinite(m)) return Status::InvalidArgument("transform mean is not finite");
    }
  }
  if (!t->col_scale.empty()) {
    if (t->col_scale.size() != d) {
      return Status::InvalidArgument(fmt::format(
          "transform col_scale has {} values, head_dim is {}", t->col_scale.size(), d));
    }
    for (float s : t->col_scale) {
      if (!(std::isfinite(s) && s > 0.0f)) {
        return Status::InvalidArgument("transform col_scale must be finite and > 0");
      }
    }
  }
  return Status::Ok();
}

// This thread's buffer for prepared rows (grows, never shrinks): the encode
// of one row per head on the append path allocates nothing.
std::vector<float>& PrepScratch(size_t n) {
  thread_local std::vector<float> scratch;
  if (scratch.size() < n) scratch.resize(n);
  return scratch;
}

// out[d] = (x - mean) / col_scale for the parts of t present (t may be
// nullptr: a copy); InvalidArgument naming `row` if a value overflows.
Status PrepareRow(Format f, size_t d, const float* x, const RowTransform* t, size_t row, float* out) {
  if (t == nullptr) {
    std::memcpy(out, x, d * sizeof(float));
    return Status::Ok();
  }
  const float* mean = t->mean.empty() ? nullptr : t->mean.data();
  const float* col = t->col_scale.empty() ? nullptr : t->col_scale.data();
  for (size_t c = 0; c < d; ++c) {
    float v = x[c];
    if (mean) v -= mean[c];
    if (col) v /= col[c];
    if (!std::isfinite(v)) {
      return Status::InvalidArgument(fmt::format(
          "encode {}: value at row {}, index {} overflows after the transform", FormatName(f),
          row, c));
    }
    out[c] = v;
  }
  return Status::Ok();
}

// InvalidArgument unless `values` floats are whole rows of d and `bytes` is
// their n * row_bytes; *n = the rows. op: "encode" or "decode".
Status CheckRows(const char* op, Format f, size_t d, size_t row_bytes, size_t values, size_t bytes,
                 size_t* n) {
  if (values % d != 0) {
    return Status::InvalidArgument(fmt::format("{} {}: {} values is not a whole number of rows of {}",
                                               op, FormatName(f), values, d));
  }
  *n = values / d;
  if (bytes != *n * row_bytes) {
    const char* what = op[0] == 'e' ? "output" : "input";
    return Status::InvalidArgument(fmt::format("{} {}: {} has {} bytes, {} rows need {}", op,
                                               FormatName(f), what, bytes, *n, *n * row_bytes));
  }
  return Status::Ok();
}

}  // namespace

Status RowCodec::Encode(std::span<const float> rows, std::span<uint8_t> out,
                        const RowTransform* transform) const {
  const size_t d = head_dim_;
  size_t n = 0;
  KV_RETURN_IF_ERROR(CheckRows("encode", format_, d, row_bytes_, rows.size(), out.size(), &n));
  KV_RETURN_IF_ERROR(CheckTransform(transform, head_dim_));
  if (const size_t i = fi::FirstNonFinite(rows.data(), rows.size()); i != rows.size()) {
    return Status::InvalidArgument(fmt::format("encode {}: non-finite value at row {}, index {}",
                                               FormatName(format_), i / d, i % d));
  }
  const bool has_transform = transform != nullptr && !transform->empty();
  if (!has_transform && !IsRotated(format_)) {
    fi::EncodeRows(format_, head_dim_, n, rows.data(), out.data());
    return Status::Ok();
  }
  // [n][d] prepared rows: (x - mean) / col_scale, then rotated.
  std::vector<float>& prep = PrepScratch(rows.size());
  for (size_t r = 0; r < n; ++r) {
    KV_RETURN_IF_ERROR(PrepareRow(format_, d, rows.data() + r * d, has_transform ? transform : nullptr,
                                  r, prep.data() + r * d));
  }
  if (IsRotated(format_)) fi::RotateRows(signs_.data(), head_dim_, n, prep.data());
  fi::EncodeRows(format_, head_dim_, n, prep.data(), out.data());
  return Status::Ok();
}

Status fi::EncodeHeadRows(const RowCodec& codec, size_t n, const float* x, uint8_t* const* dst,
                          const RowTransform* const* tf) {
  const Format f = codec.format();
  const uint32_t d = codec.head_dim();
  bool any_transform = false;
  for (size_t r = 0; tf != nullptr && r < n && !any_transform; ++r) {
    any_transform = tf[r] != nullptr && !tf[r]->empty();
  }
  if (!any_transform && !IsRotated(f)) {
    fi::EncodeRowsScattered(f, d, n, x, dst);
    return Status::Ok();
  }
  std::vector<float>& prep = PrepScratch(n * d);
  for (size_t r = 0; r < n; ++r) {
    const RowTransform* t = any_transform && tf[r] != nullptr && !tf[r]->empty() ? tf[r] : nullptr;
    KV_RETURN_IF_ERROR(CheckTransform(t, d));
    KV_RETURN_IF_ERROR(PrepareRow(f, d, x + r * d, t, r, prep.data() + r * d));
  }
  if (IsRotated(f)) fi::RotateRows(codec.rotation_signs().data(), d, n, prep.data());
  fi::EncodeRowsScattered(f, d, n, prep.data(), dst);
  return Status::Ok();
}

Status RowCodec::Decode(std::span<const uint8_t> in, std::span<float> rows,
                        const RowTransform* transform) const {
  const size_t d = head_dim_;
  size_t n = 0;
  KV_RETURN_IF_ERROR(CheckRows("decode", format_, d, row_bytes_, rows.size(), in.size(), &n));
  KV_RETURN_IF_ERROR(CheckTransform(transform, head_dim_));
  fi::DecodeRows(format_, head_dim_, n, in.data(), rows.data());
  if (IsRotated(format_)) fi::InverseRotateRows(signs_.data(), head_dim_, n, rows.data());
  if (transform != nullptr && !transform->empty()) {
    const float* mean = transform->mean.empty() ? nullptr : transform->mean.data();
    const float* col = transform->col_scale.empty() ? nullptr : transform->col_scale.data();
    for (size_t r = 0; r < n; ++r) {
      float* x = rows.data() + r * d;
      for (size_t c = 0; c < d; ++c) {
        float v = x[c];
        if (col) v *= col[c];
        if (mean) v += mean[c];
        x[c] = v;
      }
    }
  }
  return Status::Ok();
}

Status RowCodec::EncodePrepared(std::span<const float> rows, std::span<uint8_t> out) const {
  size_t n = 0;
  KV_RETURN_IF_ERROR(CheckRows("encode", format_, head_dim_, row_bytes_, rows.size(), out.size(), &n));
  fi::EncodeRows(format_, head_dim_, n, rows.data(), out.data());
  return Status::Ok();
}

Status RowCodec::RotateRows(std::span<float> rows) const {
  if (rows.size() % head_dim_ != 0) {
    return Status::InvalidArgument(fmt::format("rotate: {} values is not a whole number of rows of {}",
                                               rows.size(), head_dim_));
  }
  if (!signs_.empty()) fi::RotateRows(signs_.data(), head_dim_, rows.size() / head_dim_, rows.data());
  return Status::Ok();
}

void RowCodec::Rotate(float* x) const {
  if (!signs_.empty()) fi::RotateInPlace(signs_.data(), head_dim_, x);
}
void RowCodec::InverseRotate(float* x) const {
  if (!signs_.empty()) fi::InverseRotateInPlace(signs_.data(), head_dim_, x);
}

}  // namespace kvcache
