// Format names, parsing, head_dim checks and row sizes, read from the
// format table (format/traits.h).
#include "kvcache/format.h"

#include <fmt/format.h>

#include <string>

#include "format/traits.h"

namespace kvcache {

namespace fi = format_internal;

std::string_view FormatName(Format f) {
  return fi::IsKnownFormat(f) ? fi::TraitsOf(f).name : "unknown";
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

uint32_t GroupSize(Format f) { return fi::IsKnownFormat(f) ? fi::TraitsOf(f).group_size : 1; }

bool IsRotated(Format f) { return fi::IsKnownFormat(f) && fi::TraitsOf(f).rotated; }

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

size_t RowBytes(Format f, uint32_t d) { return fi::IsKnownFormat(f) ? fi::RowBytesOf(f, d) : 0; }

size_t BytesFor(Format f, uint32_t head_dim, size_t n_values) {
  return n_values / head_dim * RowBytes(f, head_dim);
}

double BitsPerValue(Format f, uint32_t head_dim) {
  return 8.0 * static_cast<double>(RowBytes(f, head_dim)) / head_dim;
}

}  // namespace kvcache
