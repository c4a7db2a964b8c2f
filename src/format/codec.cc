// RowCodec: dispatch from a format to its row encoder/decoder.
// PLACEHOLDER SKELETON: only f32 is implemented; the formats work replaces this.
#include "kvcache/codec.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

namespace kvcache {

Result<RowCodec> RowCodec::Create(Format format, uint32_t head_dim, Side side, uint64_t seed) {
  KV_RETURN_IF_ERROR(CheckHeadDim(format, head_dim));
  (void)seed;
  RowCodec c;
  c.format_ = format;
  c.side_ = side;
  c.head_dim_ = head_dim;
  c.row_bytes_ = RowBytes(format, head_dim);
  return c;
}

RowTransform RowCodec::Calibrate(std::span<const float>) const { return {}; }

Status RowCodec::Encode(std::span<const float> rows, std::span<uint8_t> out,
                        const RowTransform*) const {
  if (rows.size() % head_dim_ != 0 || out.size() != rows.size() / head_dim_ * row_bytes_) {
    return Status::InvalidArgument("encode: size mismatch");
  }
  if (format_ != Format::kF32) return Status::Unimplemented("format not implemented yet");
  for (float x : rows) {
    if (!std::isfinite(x)) return Status::InvalidArgument("encode: non-finite value");
  }
  std::memcpy(out.data(), rows.data(), rows.size_bytes());
  return Status::Ok();
}

Status RowCodec::Decode(std::span<const uint8_t> in, std::span<float> rows,
                        const RowTransform*) const {
  if (rows.size() % head_dim_ != 0 || in.size() != rows.size() / head_dim_ * row_bytes_) {
    return Status::InvalidArgument("decode: size mismatch");
  }
  if (format_ != Format::kF32) return Status::Unimplemented("format not implemented yet");
  std::memcpy(rows.data(), in.data(), rows.size_bytes());
  return Status::Ok();
}

void RowCodec::Rotate(float*) const {}
void RowCodec::InverseRotate(float*) const {}

}  // namespace kvcache
