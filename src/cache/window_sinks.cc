// WindowSinks (cache.h): the sink rows a precision window hands to an
// adopting sequence, and their checks. Apart from cache.cc so that the tier
// object code (which carries them) links without the cache.
#include <fmt/format.h>

#include "kvcache/cache.h"
#include "kvcache/format.h"

namespace kvcache {
namespace {
constexpr size_t kSides = 2;  // K and V
}  // namespace

size_t WindowSinks::expected_bytes() const {
  if (sinks > PrecisionWindow::kMaxSinks || n_layers > Geometry::kMaxLayers ||
      n_kv_heads > Geometry::kMaxKvHeads || head_dim > Geometry::kMaxHeadDim) {
    return 0;
  }
  return size_t{n_layers} * kSides * n_kv_heads * sinks * RowBytes(Format::kBF16, head_dim);
}

Status WindowSinks::Check() const {
  if (sinks == 0 || sinks > PrecisionWindow::kMaxSinks || n_layers == 0 || n_kv_heads == 0 ||
      head_dim == 0 || expected_bytes() == 0) {
    return Status::InvalidArgument(fmt::format(
        "cache: window sinks of {} positions over {} layers x {} kv heads x head_dim {} are out "
        "of range",
        sinks, n_layers, n_kv_heads, head_dim));
  }
  if (rows.size() != expected_bytes()) {
    return Status::InvalidArgument(fmt::format(
        "cache: window sinks hold {} bytes, {} sinks x {} layers x 2 x {} kv heads x head_dim {} "
        "in bf16 are {}",
        rows.size(), sinks, n_layers, n_kv_heads, head_dim, expected_bytes()));
  }
  return Status::Ok();
}

Status WindowSinks::CheckFits(const Geometry& g) const {
  KV_RETURN_IF_ERROR(Check());
  if (n_layers != g.n_layers() || n_kv_heads != g.n_kv_heads() || head_dim != g.head_dim()) {
    return Status::InvalidArgument(fmt::format(
        "cache: window sinks of {} layers x {} kv heads x head_dim {} for a cache of {}",
        n_layers, n_kv_heads, head_dim, g.ToString()));
  }
  return Status::Ok();
}

}  // namespace kvcache
