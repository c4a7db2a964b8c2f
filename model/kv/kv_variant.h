// KvVariant: a K/V storage scheme the naive reference backend can model
// beyond a plain FormatPair -- the candidates for low-bit caches, written
// so that a fused kernel computing the same thing gives the same numbers:
//
//   - sinks: the first S positions kept as bf16 rows;
//   - recent: the last R positions kept as bf16 rows, quantized when they
//     leave the window (in block mode, a whole block of G tokens at a time,
//     so the open block is always bf16);
//   - per-channel keys ("kcB"): a block of G tokens x head_dim keys of one
//     head stored with B-bit codes and one scale (and min) per channel over
//     the block's tokens (KIVI's key quantization on a paged block);
//   - calibration: the per-head RowTransform the cache fits on a head's
//     first stored rows (RowCodec::Calibrate);
//   - Hadamard rotation before a non-rotated codec (rotated q4_0, what
//     llama.cpp applies to a quantized cache);
//   - key outlier channels kept dense (bf16), chosen per head on the first
//     stored rows.
//
// Spelling (ParseKvVariant): KSPEC[:VSPEC][+OPT]... where a SPEC is a format
// name ("turbo4") or, for keys only, "kcB" (B = 2..8 bits); one SPEC means
// both sides. Options: sN (sinks), rN (recent window), ob (open block kept
// bf16), gN (block tokens, default 16), sym (kc: symmetric absmax scale
// instead of scale + min), cal (calibrate), rot (rotate before the codec),
// oN (N key outlier channels dense), eb (encode each row from its bf16
// rounding, as a cache that demotes its stored bf16 rows does). "turbo4+s4+r128", "kc4:turbo4+s4+ob",
// "q4_0+rot".
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "kvcache/format.h"
#include "kvcache/status.h"

namespace kvcache::model {

// Keys quantized per channel over a block of tokens.
struct ChannelQuant {
  uint32_t bits = 0;          // 0 = off (keys use formats.k), else 2..8
  bool asymmetric = true;     // f16 scale and f16 min per channel, else f16 absmax scale
  bool operator==(const ChannelQuant&) const = default;
};

struct KvVariant {
  FormatPair formats;        // formats.k is unused when key_channel.bits != 0
  ChannelQuant key_channel;
  uint32_t sinks = 0;        // first positions kept bf16
  uint32_t recent = 0;       // last positions kept bf16
  bool open_block = false;   // block mode: rows leave bf16 a whole block at a time
  uint32_t block_tokens = 16;
  bool calibrate = false;
  bool rotate = false;
  uint32_t key_outliers = 0;
  bool from_bf16 = false;    // encode the bf16 row (what demoting a stored bf16 row sees)
  bool operator==(const KvVariant&) const = default;

  // Rows move from bf16 to the codec a block at a time (open_block, or
  // per-channel keys, which need a whole block).
  bool block_mode() const { return open_block || key_channel.bits != 0; }
  // True when every row goes straight through formats (no option set).
  bool plain() const { return *this == Of(formats); }
  static KvVariant Of(FormatPair pair) {
    KvVariant v;
    v.formats = pair;
    return v;
  }
};

// InvalidArgument naming the offending part for unknown names or options,
// repeated options, kc on the value side, rot on a rotated (turbo) format,
// bits outside 2..8 or a block of 0 or over 4096 tokens.
Result<KvVariant> ParseKvVariant(std::string_view text);
// The canonical spelling ParseKvVariant reads back to the same variant.
std::string KvVariantName(const KvVariant& variant);

// Storage bits per value of each side with every overhead counted for a
// sequence of `positions`: codes and scales, the bf16 rows (sinks, the
// recent window and, in block mode, up to block_tokens - 1 open rows at
// their worst), dense outlier channels and their indices, the per-head
// calibration vectors.
struct VariantBits {
  double k = 0, v = 0;
  double mean() const { return (k + v) / 2; }
};
VariantBits KvVariantBits(const KvVariant& variant, uint32_t head_dim, uint32_t positions);
// The same for the cache's precision window (cache.h, PrecisionWindow) with
// the variant's sinks and recent count: every position stays in the format
// (with the calibration the cache fits for q8 and turbo formats), and the
// window's sinks + recent bf16 slots come on top.
VariantBits CacheWindowBits(const KvVariant& variant, uint32_t head_dim, uint32_t positions);

// The scalar reference of per-channel block key quantization. rows:
// [n][head_dim] f32 (the block's tokens of one head), decoded: the same
// shape. Per channel c over the n rows: asymmetric: lo, hi = min, max;
// scale = f16((hi - lo) / (2^B - 1)), m = f16(lo); code =
// clamp(round((x - m) / scale), 0, 2^B - 1); x' = m + scale * code.
// Symmetric: d = f16(amax / (2^(B-1) - 1/2)); code = clamp(floor(x / d),
// -2^(B-1), 2^(B-1) - 1); x' = d * (code + 1/2). A zero scale decodes to m
// (asymmetric) or 0. InvalidArgument on sizes or bits outside 2..8.
Status ChannelBlockRoundTrip(const ChannelQuant& quant, uint32_t head_dim,
                             std::span<const float> rows, std::span<float> decoded);

}  // namespace kvcache::model
