// CacheKv: KvBackend on SequenceCache + AttendDecode/AttendMulti.
#include "model/kv/cache_kv.h"

#include <string>

#include "kvcache/attention.h"

namespace kvcache::model {

Result<std::unique_ptr<CacheKv>> CacheKv::Create(const AttentionShape& shape,
                                                 const CacheKvOptions& options) {
  KV_ASSIGN_OR_RETURN(Geometry geometry,
                      Geometry::Create({shape.n_layers, shape.n_kv_heads, shape.head_dim,
                                        options.block_size}));
  if (options.layout == CacheLayout::kContiguous) {
    ContiguousOptions c;
    c.capacity_tokens = shape.max_seq_len;
    KV_ASSIGN_OR_RETURN(SequenceCache cache,
                        SequenceCache::CreateContiguous(geometry, options.formats, c));
    return std::unique_ptr<CacheKv>(new CacheKv(shape, std::move(cache)));
  }
  std::shared_ptr<BlockPool> pool = options.pool;
  if (!pool) {
    const uint32_t per_seq = (shape.max_seq_len + options.block_size - 1) / options.block_size;
    BlockPoolOptions p;
    p.num_blocks = options.pool_blocks ? options.pool_blocks : 4 * per_seq;
    KV_ASSIGN_OR_RETURN(pool, BlockPool::Create(geometry, options.formats, p));
  }
  KV_ASSIGN_OR_RETURN(SequenceCache cache, SequenceCache::CreatePaged(pool));
  return std::unique_ptr<CacheKv>(new CacheKv(shape, std::move(cache)));
}

Status CacheKv::Extend(uint32_t n) {
  const uint32_t len = cache_.num_tokens();
  if (static_cast<uint64_t>(len) + n > shape_.max_seq_len) {
    return Status::CapacityExceeded("cache kv: " + std::to_string(len + n) +
                                    " positions exceed max_seq_len " +
                                    std::to_string(shape_.max_seq_len));
  }
  base_ = len;
  pass_ = n;
  return Status::Ok();
}

Status CacheKv::Store(uint32_t layer, std::span<const float> k, std::span<const float> v) {
  if (cache_.num_tokens(layer) != base_) {
    return Status::FailedPrecondition("cache kv: layer " + std::to_string(layer) + " holds " +
                                      std::to_string(cache_.num_tokens(layer)) +
                                      " positions, the pass starts at " + std::to_string(base_));
  }
  const size_t want = static_cast<size_t>(pass_) * shape_.kv_dim();
  if (k.size() != want || v.size() != want) {
    return Status::InvalidArgument("cache kv: store of " + std::to_string(k.size()) +
                                   " values, the pass needs " + std::to_string(want));
  }
  return cache_.AppendLayer(layer, k, v);
}

Status CacheKv::Attend(uint32_t layer, std::span<const float> q, std::span<float> out) {
  if (cache_.num_tokens(layer) != base_ + pass_) {
    return Status::FailedPrecondition("cache kv: attend before store");
  }
  KV_ASSIGN_OR_RETURN(LayerKvView view, cache_.View(layer));
  AttentionOptions options;
  options.n_q_heads = shape_.n_heads;
  AttentionOutput output;
  output.out = out;
  if (pass_ == 1) return AttendDecode(view, q, options, output);
  return AttendMulti(view, pass_, q, options, output);
}

Status CacheKv::Truncate(uint32_t num_tokens) {
  KV_RETURN_IF_ERROR(cache_.Truncate(num_tokens));
  base_ = num_tokens;
  pass_ = 0;
  return Status::Ok();
}

Status CacheKv::AdoptPrefix(std::span<const uint32_t> blocks,
                            std::shared_ptr<const Calibration> calibration) {
  if (cache_.layout() != CacheLayout::kPaged || num_tokens() != 0) {
    return Status::FailedPrecondition("cache kv: AdoptPrefix needs an empty paged cache");
  }
  const uint64_t rows = uint64_t{blocks.size()} * cache_.block_size();
  if (rows > shape_.max_seq_len) {
    return Status::FailedPrecondition("cache kv: a prefix of " + std::to_string(rows) +
                                      " positions exceeds max_seq_len " +
                                      std::to_string(shape_.max_seq_len));
  }
  KV_RETURN_IF_ERROR(cache_.AdoptPrefix(blocks, std::move(calibration)));
  base_ = cache_.num_tokens();
  pass_ = 0;
  return Status::Ok();
}

Result<std::unique_ptr<KvBackend>> CacheKv::Fork() {
  KV_ASSIGN_OR_RETURN(SequenceCache copy, cache_.Fork());
  std::unique_ptr<CacheKv> kv(new CacheKv(shape_, std::move(copy)));
  kv->base_ = base_;
  kv->pass_ = pass_;
  return std::unique_ptr<KvBackend>(std::move(kv));
}

}  // namespace kvcache::model
