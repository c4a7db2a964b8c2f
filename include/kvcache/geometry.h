// Model geometry as the cache sees it: layers, kv heads, head_dim, block size.
//
// A Geometry is only ever built through Geometry::Create, which rejects
// nonsense (zeros, absurd sizes) with a message naming the field. n_q_heads is
// not part of it: it is an attention-time parameter (GQA), see attention.h.
#pragma once

#include <cstdint>
#include <string>

#include "kvcache/status.h"

namespace kvcache {

struct GeometryOptions {
  uint32_t n_layers = 0;
  uint32_t n_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t block_size = 16;  // token positions per pool block (paged layout)
};

class Geometry {
 public:
  // Limits; anything outside is an InvalidArgument.
  static constexpr uint32_t kMaxLayers = 1024;
  static constexpr uint32_t kMaxKvHeads = 1024;
  static constexpr uint32_t kMaxHeadDim = 4096;
  static constexpr uint32_t kMaxBlockSize = 65536;

  static Result<Geometry> Create(const GeometryOptions& options);

  uint32_t n_layers() const { return n_layers_; }
  uint32_t n_kv_heads() const { return n_kv_heads_; }
  uint32_t head_dim() const { return head_dim_; }
  uint32_t block_size() const { return block_size_; }
  // Values of one token in one layer for one side: n_kv_heads * head_dim.
  uint32_t kv_dim() const { return n_kv_heads_ * head_dim_; }

  // "L=32 KVH=8 D=128 B=16".
  std::string ToString() const;
  bool operator==(const Geometry&) const = default;

 private:
  Geometry() = default;
  uint32_t n_layers_ = 0, n_kv_heads_ = 0, head_dim_ = 0, block_size_ = 0;
};

}  // namespace kvcache
