// Geometry validation.
#include "kvcache/geometry.h"

#include <fmt/format.h>

namespace kvcache {
namespace {

Status CheckRange(const char* name, uint32_t value, uint32_t max) {
  if (value == 0 || value > max) {
    return Status::InvalidArgument(
        fmt::format("geometry: {} must be in [1, {}], got {}", name, max, value));
  }
  return Status::Ok();
}

}  // namespace

Result<Geometry> Geometry::Create(const GeometryOptions& o) {
  KV_RETURN_IF_ERROR(CheckRange("n_layers", o.n_layers, kMaxLayers));
  KV_RETURN_IF_ERROR(CheckRange("n_kv_heads", o.n_kv_heads, kMaxKvHeads));
  KV_RETURN_IF_ERROR(CheckRange("head_dim", o.head_dim, kMaxHeadDim));
  KV_RETURN_IF_ERROR(CheckRange("block_size", o.block_size, kMaxBlockSize));
  Geometry g;
  g.n_layers_ = o.n_layers;
  g.n_kv_heads_ = o.n_kv_heads;
  g.head_dim_ = o.head_dim;
  g.block_size_ = o.block_size;
  return g;
}

std::string Geometry::ToString() const {
  return fmt::format("L={} KVH={} D={} B={}", n_layers_, n_kv_heads_, head_dim_, block_size_);
}

}  // namespace kvcache
