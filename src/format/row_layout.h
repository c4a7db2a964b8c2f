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

// REQUIRES: CheckHeadDim(format, d) ok.
inline RowLayout LayoutOf(Format format, uint32_t d) {
  RowLayout l;
  l.group_size = GroupSize(format);
  switch (format) {
    case Format::kF32: l.codes_bytes = 4ull * d; break;
    case Format::kF16:
    case Format::kBF16: l.codes_bytes = 2ull * d; break;
    case Format::kFp8E4M3: l.codes_bytes = d; break;
    case Format::kQ8:
      l.group_size = d;
      l.codes_bytes = d;
      l.scale_bytes = 4;
      l.group_code_bytes = d;
      break;
    case Format::kTurbo8: l.codes_bytes = d; l.scale_bytes = 2; l.group_code_bytes = 16; break;
    case Format::kTurbo4:
    case Format::kTurbo4I: l.codes_bytes = d / 2; l.scale_bytes = 1; l.group_code_bytes = 8; break;
    case Format::kTurbo3: l.codes_bytes = 6ull * (d / 16); l.scale_bytes = 1; l.group_code_bytes = 6; break;
    case Format::kTurbo2:
    case Format::kTurbo2I: l.codes_bytes = d / 4; l.scale_bytes = 1; l.group_code_bytes = 4; break;
    // turbo3i: a group's 6 code bytes are 4 in the low-bit plane and 2 in the
    // bit-2 plane (turbo.h), not adjacent.
    case Format::kTurbo3I: l.codes_bytes = 6ull * (d / 16); l.scale_bytes = 1; l.group_code_bytes = 6; break;
    case Format::kQ8_0: l.codes_bytes = 34ull * (d / 32); l.group_code_bytes = 34; break;
    case Format::kQ4_0: l.codes_bytes = 18ull * (d / 32); l.group_code_bytes = 18; break;
  }
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
