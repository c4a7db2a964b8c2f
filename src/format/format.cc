// Format names, parsing, head_dim checks and row sizes.
#include "kvcache/format.h"

#include <fmt/format.h>

#include <string>

namespace kvcache {

std::string_view FormatName(Format f) {
  switch (f) {
    case Format::kF32: return "f32";
    case Format::kF16: return "f16";
    case Format::kBF16: return "bf16";
    case Format::kFp8E4M3: return "fp8_e4m3";
    case Format::kQ8: return "q8";
    case Format::kTurbo8: return "turbo8";
    case Format::kTurbo4: return "turbo4";
    case Format::kTurbo3: return "turbo3";
    case Format::kTurbo2: return "turbo2";
    case Format::kQ8_0: return "q8_0";
    case Format::kQ4_0: return "q4_0";
    case Format::kTurbo4I: return "turbo4i";
    case Format::kTurbo3I: return "turbo3i";
    case Format::kTurbo2I: return "turbo2i";
  }
  return "unknown";
}

Result<Format> ParseFormat(std::string_view name) {
  for (Format f : kAllFormats) {
    if (FormatName(f) == name) return f;
  }
  std::string known;
  for (Format f : kAllFormats) {
    if (!known.empty()) known += ", ";
    known += FormatName(f);
  }
  return Status::InvalidArgument(
      fmt::format("unknown format '{}' (known: {})", name, known));
}

Result<FormatPair> ParseFormatPair(std::string_view text) {
  const size_t colon = text.find(':');
  if (colon == std::string_view::npos) {
    KV_ASSIGN_OR_RETURN(Format f, ParseFormat(text));
    return FormatPair{f, f};
  }
  FormatPair pair;
  KV_ASSIGN_OR_RETURN(pair.k, ParseFormat(text.substr(0, colon)));
  KV_ASSIGN_OR_RETURN(pair.v, ParseFormat(text.substr(colon + 1)));
  return pair;
}

std::string FormatPairName(FormatPair pair) {
  return fmt::format("{}:{}", FormatName(pair.k), FormatName(pair.v));
}

uint32_t GroupSize(Format f) {
  switch (f) {
    case Format::kTurbo8:
    case Format::kTurbo4:
    case Format::kTurbo4I:
    case Format::kTurbo3:
    case Format::kTurbo2:
    case Format::kTurbo3I:
    case Format::kTurbo2I: return 16;
    case Format::kQ8_0:
    case Format::kQ4_0: return 32;
    default: return 1;
  }
}

bool IsRotated(Format f) {
  return f == Format::kTurbo8 || f == Format::kTurbo4 || f == Format::kTurbo3 ||
         f == Format::kTurbo2 || f == Format::kTurbo4I || f == Format::kTurbo3I ||
         f == Format::kTurbo2I;
}

Status CheckHeadDim(Format f, uint32_t head_dim) {
  if (head_dim == 0) {
    return Status::InvalidArgument(fmt::format("format {}: head_dim must be positive", FormatName(f)));
  }
  const uint32_t g = GroupSize(f);
  if (head_dim % g != 0) {
    return Status::InvalidArgument(
        fmt::format("format {} needs head_dim to be a multiple of {}, got {}", FormatName(f), g,
                    head_dim));
  }
  return Status::Ok();
}

size_t RowBytes(Format f, uint32_t d) {
  const size_t n = d;
  switch (f) {
    case Format::kF32: return 4 * n;
    case Format::kF16:
    case Format::kBF16: return 2 * n;
    case Format::kFp8E4M3: return n;
    case Format::kQ8: return n + 4;              // int8 codes + f32 row scale
    case Format::kTurbo8: return n + 2 * (n / 16);   // E4M3 codes + bf16 group scales
    case Format::kTurbo4:
    case Format::kTurbo4I: return n / 2 + n / 16;    // 4-bit codes + E4M3 scales
    case Format::kTurbo3:
    case Format::kTurbo3I: return 6 * (n / 16) + n / 16;  // 3-bit codes + E4M3 scales
    case Format::kTurbo2:
    case Format::kTurbo2I: return n / 4 + n / 16;         // 2-bit codes + E4M3 scales
    case Format::kQ8_0: return 34 * (n / 32);
    case Format::kQ4_0: return 18 * (n / 32);
  }
  return 0;
}

size_t BytesFor(Format f, uint32_t head_dim, size_t n_values) {
  return n_values / head_dim * RowBytes(f, head_dim);
}

double BitsPerValue(Format f, uint32_t head_dim) {
  return 8.0 * static_cast<double>(RowBytes(f, head_dim)) / head_dim;
}

}  // namespace kvcache
