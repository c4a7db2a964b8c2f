// The one table of storage-format facts: per Format, its name, family, row
// size, scale group, codebook, rotation, kernel value order and which
// integer kernels the fused attention passes have for it. Every place that
// asks "which family / how many bytes / rotated?" reads this table; a new
// format is one row here plus its family's folder (docs/formats.md, "Adding
// a format").
//
// Thread safety: constant data.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <utility>

#include "kvcache/format.h"

namespace kvcache {
namespace format_internal {

// The families, one folder each under src/format/.
enum class Family : uint8_t {
  kPlain,  // format/plain/   f32, f16, bf16
  kFp8Q8,  // format/fp8_q8/  fp8_e4m3, q8
  kTurbo,  // format/turbo/   turbo8/4/3/2, turbo4i/3i/2i
  kGgml,   // format/ggml/    q8_0, q4_0
};
inline constexpr size_t kNumFamilies = 4;

// The value levels a format's codes index (format/turbo/turbo.h).
enum class Codebook : uint8_t {
  kNone,     // the codes are the values (floats, E4M3, int8 times a scale)
  kTurbo4,   // 16 float levels
  kTurbo4I,  // 16 int8 levels / 128
  kTurbo3,   // 8 float levels
  kTurbo3I,  // 8 int8 levels / 128
  kTurbo2,   // 4 float levels
  kTurbo2I,  // 4 int8 levels / 128
};

// The integer K pass a format's keys may take (x86 SIMD targets; the float
// pass runs elsewhere and where the path does not fit head_dim).
enum class IntKeyPath : uint8_t {
  kNone,    // decoded keys, f32 FMAs only
  kInt16,   // int8 codes x int16 query (q8, q8_0; q4_0 widened nibbles)
  kNibble,  // 4-bit codebook indices, int16 or int8 query (turbo4i)
  kPlanes,  // 2-bit planes (+ bit-2 plane), int8 query (turbo3i, turbo2i)
};

struct FormatTraits {
  Format format;
  std::string_view name;        // FormatName
  Family family;
  uint32_t group_size;          // values per scale group (GroupSize; 1: no groups)
  uint32_t group_code_bytes;    // code bytes per group (q8_0/q4_0: the whole block)
  uint32_t scale_bytes;         // bytes of one scale, stored after all codes (0: none)
  bool row_scale;               // one scale per row (q8), not one per group
  Codebook codebook;
  bool rotated;                 // rows are rotated before encoding (IsRotated)
  bool nibble_order;            // kernels consume each 16 values even-then-odd
  IntKeyPath int_keys;          // integer K pass
  bool int8_query_keys;         // also an int8-query K pass (AttentionOptions)
  bool int_values;              // integer V pass
};

// Row i describes kAllFormats[i]; the enum values index the table.
inline constexpr std::array<FormatTraits, 14> kFormatTraits = {{
    // format          name        family          grp code sc  row    codebook            rot    nib    int_keys             i8q    int_v
    {Format::kF32,     "f32",      Family::kPlain, 1,  4,   0,  false, Codebook::kNone,    false, false, IntKeyPath::kNone,   false, false},
    {Format::kF16,     "f16",      Family::kPlain, 1,  2,   0,  false, Codebook::kNone,    false, false, IntKeyPath::kNone,   false, false},
    {Format::kBF16,    "bf16",     Family::kPlain, 1,  2,   0,  false, Codebook::kNone,    false, true,  IntKeyPath::kNone,   false, false},
    {Format::kFp8E4M3, "fp8_e4m3", Family::kFp8Q8, 1,  1,   0,  false, Codebook::kNone,    false, false, IntKeyPath::kNone,   false, false},
    {Format::kQ8,      "q8",       Family::kFp8Q8, 1,  1,   4,  true,  Codebook::kNone,    false, false, IntKeyPath::kInt16,  false, false},
    {Format::kTurbo8,  "turbo8",   Family::kTurbo, 16, 16,  2,  false, Codebook::kNone,    true,  false, IntKeyPath::kNone,   false, false},
    {Format::kTurbo4,  "turbo4",   Family::kTurbo, 16, 8,   1,  false, Codebook::kTurbo4,  true,  true,  IntKeyPath::kNone,   false, false},
    {Format::kTurbo3,  "turbo3",   Family::kTurbo, 16, 6,   1,  false, Codebook::kTurbo3,  true,  false, IntKeyPath::kNone,   false, false},
    {Format::kTurbo2,  "turbo2",   Family::kTurbo, 16, 4,   1,  false, Codebook::kTurbo2,  true,  false, IntKeyPath::kNone,   false, false},
    {Format::kQ8_0,    "q8_0",     Family::kGgml,  32, 34,  0,  false, Codebook::kNone,    false, false, IntKeyPath::kInt16,  true,  false},
    {Format::kQ4_0,    "q4_0",     Family::kGgml,  32, 18,  0,  false, Codebook::kNone,    false, false, IntKeyPath::kInt16,  true,  false},
    {Format::kTurbo4I, "turbo4i",  Family::kTurbo, 16, 8,   1,  false, Codebook::kTurbo4I, true,  true,  IntKeyPath::kNibble, false, true},
    {Format::kTurbo3I, "turbo3i",  Family::kTurbo, 16, 6,   1,  false, Codebook::kTurbo3I, true,  false, IntKeyPath::kPlanes, false, false},
    {Format::kTurbo2I, "turbo2i",  Family::kTurbo, 16, 4,   1,  false, Codebook::kTurbo2I, true,  false, IntKeyPath::kPlanes, false, false},
}};

constexpr bool TraitsTableInOrder() {
  for (size_t i = 0; i < kFormatTraits.size(); ++i) {
    if (kFormatTraits[i].format != kAllFormats[i] || static_cast<size_t>(kFormatTraits[i].format) != i) {
      return false;
    }
  }
  return kFormatTraits.size() == kAllFormats.size();
}
static_assert(TraitsTableInOrder(), "kFormatTraits must list every Format in enum order");

// REQUIRES: f is a Format enumerator.
constexpr const FormatTraits& TraitsOf(Format f) { return kFormatTraits[static_cast<size_t>(f)]; }
constexpr Family FamilyOf(Format f) { return TraitsOf(f).family; }
constexpr bool IsKnownFormat(Format f) { return static_cast<size_t>(f) < kFormatTraits.size(); }

// RowBytes for rows of d values (d a multiple of the group size).
constexpr size_t RowBytesOf(Format f, uint32_t d) {
  const FormatTraits& t = TraitsOf(f);
  const size_t groups = size_t{d} / t.group_size;
  return groups * t.group_code_bytes + (t.row_scale ? 1 : groups) * t.scale_bytes;
}

// fn.template operator()<F>() for the Format F == f: a runtime format to a
// template argument, without a switch per caller. Returns what fn returns
// (the default value of that type for a value that is no Format).
template <class Fn>
constexpr decltype(auto) VisitFormat(Format f, Fn&& fn) {
  return [&]<size_t... I>(std::index_sequence<I...>) -> decltype(auto) {
    using R = decltype(fn.template operator()<kAllFormats[0]>());
    if constexpr (std::is_void_v<R>) {
      ((f == kAllFormats[I] ? (fn.template operator()<kAllFormats[I]>(), true) : false) || ...);
    } else {
      R r{};
      ((f == kAllFormats[I] ? (r = fn.template operator()<kAllFormats[I]>(), true) : false) || ...);
      return r;
    }
  }(std::make_index_sequence<kAllFormats.size()>());
}

}  // namespace format_internal
}  // namespace kvcache
