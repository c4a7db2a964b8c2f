// Storage formats for one side (K or V) of the cache, and their sizes.
//
// A stored row is head_dim values of one kv head at one position, packed with
// its scales into RowBytes(format, head_dim) bytes; K and V choose formats
// independently. Layouts (all little-endian; "group" = values sharing a scale):
//
//   f32        head_dim x float
//   f16, bf16  head_dim x uint16, round-to-nearest-even from f32
//   fp8_e4m3   head_dim x OCP E4M3 "fn" byte (bias 7, max 448, no inf, NaN 0x7F/0xFF),
//              saturating, no scale
//   q8         head_dim x int8, then one f32 row scale (value = scale * q);
//              keys are first divided by fixed per-channel column scales
//   turbo8     rotated; per 16-value group 16 E4M3 codes, then per-group bf16 scales
//   turbo4     rotated; per group 8 bytes of 4-bit codebook indices (even value in the
//              low nibble), then per-group E4M3 scales
//   turbo3     rotated; per group 6 bytes = one 48-bit LE word, code i at bits 3i..3i+2,
//              then per-group E4M3 scales
//   turbo2     rotated; per group 4 bytes, code i at bits 2(i%4) of byte i/4, then
//              per-group E4M3 scales
//   q8_0       llama.cpp block_q8_0 per 32 values: f16 d = amax/127, 32 x int8
//   q4_0       llama.cpp block_q4_0 per 32 values: f16 d = max/-8, 16 bytes; byte j
//              holds value j (low nibble) and j+16 (high nibble), value = (q-8)*d
//
// The exact per-row byte offsets of codes and scales are in
// src/format/format_internal.h (RowLayout) and docs/formats.md.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kvcache/status.h"

namespace kvcache {

enum class Format : uint8_t {
  kF32,
  kF16,
  kBF16,
  kFp8E4M3,
  kQ8,
  kTurbo8,
  kTurbo4,
  kTurbo3,
  kTurbo2,
  kQ8_0,
  kQ4_0,
  kTurbo4I,  // appended: the stored numbering of the others is unchanged
  kTurbo3I,
  kTurbo2I,
};

inline constexpr std::array<Format, 14> kAllFormats = {
    Format::kF32,     Format::kF16,     Format::kBF16,   Format::kFp8E4M3, Format::kQ8,
    Format::kTurbo8,  Format::kTurbo4,  Format::kTurbo3, Format::kTurbo2,  Format::kQ8_0,
    Format::kQ4_0,    Format::kTurbo4I, Format::kTurbo3I, Format::kTurbo2I};

// Which side of the cache a row belongs to; some formats treat keys specially.
enum class Side : uint8_t { kKey, kValue };

// "f32", "f16", "bf16", "fp8_e4m3", "q8", "turbo8", "turbo4", "turbo3",
// "turbo2", "q8_0", "q4_0", "turbo4i", "turbo3i", "turbo2i".
std::string_view FormatName(Format format);
Result<Format> ParseFormat(std::string_view name);

// A K/V format pair. "K:V" or a single name for both sides ("bf16").
struct FormatPair {
  Format k = Format::kF32;
  Format v = Format::kF32;
  bool operator==(const FormatPair&) const = default;
};
Result<FormatPair> ParseFormatPair(std::string_view text);
std::string FormatPairName(FormatPair pair);  // "k:v"

// Values that share one scale (1 for unscaled formats, 16 turbo, 32 q8_0/q4_0).
uint32_t GroupSize(Format format);
// True for the turbo formats, which store rotated rows.
bool IsRotated(Format format);

// OK iff `format` can store rows of head_dim values (turbo needs a multiple
// of 16, q8_0/q4_0 of 32); otherwise InvalidArgument naming both.
// The condition is on head_dim, not on a layer's n_kv_heads * head_dim: a
// row is one head's head_dim values, and each head is rotated, scaled,
// evicted, dead or alive on its own, so a scale group never spans two heads.
// A model whose head_dim is not a multiple of 16 (head_dim 8, say, even with
// 2 heads) stores its rows in a format with group size 1 (f32, f16, bf16,
// fp8_e4m3, q8) instead.
Status CheckHeadDim(Format format, uint32_t head_dim);

// Bytes of one stored row, scales included. REQUIRES: CheckHeadDim ok.
size_t RowBytes(Format format, uint32_t head_dim);
// Bytes for n values stored as rows of head_dim: n / head_dim * RowBytes.
// REQUIRES: n_values % head_dim == 0 and CheckHeadDim ok.
size_t BytesFor(Format format, uint32_t head_dim, size_t n_values);
// Storage bits per value, scales included, for rows of head_dim values.
double BitsPerValue(Format format, uint32_t head_dim);

}  // namespace kvcache
