// Encoding and decoding rows of one side (K or V) of one kv head.
//
// RowCodec turns f32 rows [n][head_dim] into stored rows [n][RowBytes] and
// back. A RowTransform is the fixed per-head calibration some formats use:
// a per-channel mean subtracted before encoding (keys: softmax ignores it;
// values: added back once to the attention output) and, for q8 keys, the
// per-channel column scales the row is divided by. Decode undoes every
// transform, so decoded rows are in the caller's original space.
//
// Turbo formats rotate each row with a randomized Walsh-Hadamard transform
// (fixed +-1 signs from the codec's rotation seed, then H/sqrt(d) per
// power-of-two block) after the mean is subtracted; Rotate/InverseRotate
// expose it so attention can rotate the query and un-rotate the output.
//
// Thread safety: a RowCodec is immutable after Create; share it freely.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kvcache/format.h"
#include "kvcache/status.h"

namespace kvcache {

// Per-head fixed calibration; empty vectors mean "none".
struct RowTransform {
  std::vector<float> mean;       // [head_dim] subtracted before encoding
  std::vector<float> col_scale;  // [head_dim] divided out before encoding (q8 keys), > 0
  bool empty() const { return mean.empty() && col_scale.empty(); }
  bool operator==(const RowTransform&) const = default;
};

class RowCodec {
 public:
  static constexpr uint64_t kDefaultRotationSeed = 0x6b76636163686531ull;

  // InvalidArgument if the format cannot take head_dim.
  static Result<RowCodec> Create(Format format, uint32_t head_dim, Side side,
                                 uint64_t rotation_seed = kDefaultRotationSeed);

  Format format() const { return format_; }
  Side side() const { return side_; }
  uint32_t head_dim() const { return head_dim_; }
  size_t row_bytes() const { return row_bytes_; }

  // The calibration this codec would use for a head whose first stored rows
  // are `rows` ([n][head_dim]). q8 and turbo formats, n >= 8 finite rows:
  // `mean` = per-channel median where it is significant (> 4 robust standard
  // errors; empty if no channel is); q8 keys also get `col_scale` = each
  // channel's RMS around the mean (floored at 1% of the largest). Every other
  // case returns an empty transform (q8_0/q4_0 never calibrate, so their bytes
  // stay llama.cpp's).
  RowTransform Calibrate(std::span<const float> rows) const;

  // rows [n][head_dim] f32 -> out [n][row_bytes]: each row becomes
  // (x - mean) / col_scale (for the parts of `transform` present), is rotated
  // (turbo), then quantized. InvalidArgument on a size mismatch, a transform
  // of the wrong size or with non-finite / non-positive entries, a NaN/Inf
  // input value (the message names row and index), or a value that overflows
  // after the transform; `out` is untouched then. Finite values beyond a
  // format's range saturate (fp8, turbo scales) or become +-inf (f16/bf16).
  Status Encode(std::span<const float> rows, std::span<uint8_t> out,
                const RowTransform* transform = nullptr) const;
  // in [n][row_bytes] -> rows [n][head_dim], in the original (unrotated,
  // mean added back, column scales multiplied back) space.
  Status Decode(std::span<const uint8_t> in, std::span<float> rows,
                const RowTransform* transform = nullptr) const;

  // The quantizer alone: rows [n][head_dim] already in storage space (any
  // transform applied, and rotated for turbo formats, e.g. by RotateRows)
  // -> out [n][row_bytes]; the bytes Encode writes for rows it would have
  // prepared the same way. Only the sizes are checked (InvalidArgument, `out`
  // untouched): a NaN/Inf value gives unspecified bytes where Encode refuses
  // it. For callers that prepare rows themselves, and benchmarks.
  Status EncodePrepared(std::span<const float> rows, std::span<uint8_t> out) const;

  // In-place rotation of one [head_dim] vector; identity for unrotated formats.
  void Rotate(float* x) const;
  void InverseRotate(float* x) const;
  // Rotate on each row of rows [n][head_dim], in place, in one call;
  // InvalidArgument (rows untouched) unless rows is whole rows.
  Status RotateRows(std::span<float> rows) const;
  // The +-1 signs of the rotation ([head_dim]); empty for unrotated formats.
  const std::vector<float>& rotation_signs() const { return signs_; }

 private:
  RowCodec() = default;
  Format format_ = Format::kF32;
  Side side_ = Side::kKey;
  uint32_t head_dim_ = 0;
  size_t row_bytes_ = 0;
  std::vector<float> signs_;
};

}  // namespace kvcache
