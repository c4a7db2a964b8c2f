// Where the parts of one stored row sit (RowLayout, for every format) and the
// byte and bit helpers every format family shares. Each family's header
// (format/<family>/<family>.h) documents its formats' bytes in full.
//
// Thread safety: pure functions.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

#include "kvcache/float16.h"
#include "format/traits.h"
#include "kvcache/format.h"

namespace kvcache {
namespace format_internal {

struct RowLayout {
  uint32_t group_size = 1;     // values per scale (1: no scale / one per row for q8)
  size_t codes_offset = 0;     // where the codes start (0 for every format)
  size_t codes_bytes = 0;      // bytes of codes per row (q8_0/q4_0: whole row)
  size_t scales_offset = 0;    // where the per-group scales start (== codes_bytes)
  size_t scale_bytes = 0;      // bytes of one scale (0: none; q8: 4; turbo8: 2; turbo4/3/2: 1)
  size_t group_code_bytes = 0; // bytes of codes per group (turbo8 16, turbo4 8, turbo3 6,
                               // turbo2 4, q8_0 34 and q4_0 18 for a whole block incl. d)
};

// REQUIRES: CheckHeadDim(format, d) ok. From the format table (traits.h).
// turbo3i: a group's 6 code bytes are 4 in the low-bit plane and 2 in the
// bit-2 plane (turbo.h), not adjacent.
inline RowLayout LayoutOf(Format format, uint32_t d) {
  const FormatTraits& t = TraitsOf(format);
  RowLayout l;
  l.group_size = t.row_scale ? d : t.group_size;
  l.codes_bytes = size_t{d} / t.group_size * t.group_code_bytes;
  l.scale_bytes = t.scale_bytes;
  // Unscaled formats of one value per group have no groups to speak of.
  l.group_code_bytes = t.row_scale ? d : (t.group_size == 1 && t.scale_bytes == 0) ? 0 : t.group_code_bytes;
  l.scales_offset = l.codes_bytes;
  return l;
}

inline uint32_t FloatBits(float f) { return std::bit_cast<uint32_t>(f); }
inline float BitsFloat(uint32_t u) { return std::bit_cast<float>(u); }

// The f16/bf16 conversions (kvcache/float16.h), under the names the format
// code and its tests use.
using ::kvcache::BF16ToFloat;
using ::kvcache::F16ToFloat;
using ::kvcache::FloatToBF16;
using ::kvcache::FloatToF16;

// Little-endian 16-bit loads and stores at any alignment.
inline uint16_t LoadU16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
inline void StoreU16(uint16_t v, uint8_t* p) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}

// One family's scalar reference for one row of d values (prepared: see
// format_internal.h) to or from its RowBytes(format, d) bytes.
using RowEncodeFn = void (*)(Format format, uint32_t d, const float* x, uint8_t* out);
using RowDecodeFn = void (*)(Format format, uint32_t d, const uint8_t* in, float* x);

}  // namespace format_internal
}  // namespace kvcache
