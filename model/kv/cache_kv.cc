// CacheKv: KvBackend on SequenceCache + AttendDecode/AttendMulti.
#include "model/kv/cache_kv.h"

#include <string>

#include "kvcache/attention.h"

namespace kvcache::model {

Result<std::unique_ptr<CacheKv>> CacheKv::Create(const AttentionShape& shape,
                                                 const CacheKvOptions& options) {
  if (shape.has_windows()) {
    return Status::InvalidArgument(
        "cache kv: the model has sliding-window layers, which a SequenceCache does not bound (HybridKv does)");
  }
  KV_ASSIGN_OR_RETURN(Geometry geometry,
                      Geometry::Create({shape.n_layers, shape.n_kv_heads, shape.head_dim,
                                        options.block_size}));
  if (options.layout == CacheLayout::kContiguous) {
    ContiguousOptions c;
    c.capacity_tokens = shape.max_seq_len;
    c.window = options.window;
    KV_ASSIGN_OR_RETURN(SequenceCache cache,
                        SequenceCache::CreateContiguous(geometry, options.formats, c));
    return std::unique_ptr<CacheKv>(new CacheKv(shape, std::move(cache), options.attention_pool));
  }
  std::shared_ptr<BlockPool> pool = options.pool;
  if (!pool) {
    const uint32_t per_seq = (shape.max_seq_len + options.block_size - 1) / options.block_size;
    BlockPoolOptions p;
    p.num_blocks = options.pool_blocks ? options.pool_blocks : 4 * per_seq;
    KV_ASSIGN_OR_RETURN(pool, BlockPool::Create(geometry, options.formats, p));
  }
  PagedOptions paged;
  paged.window = options.window;
  KV_ASSIGN_OR_RETURN(SequenceCache cache, SequenceCache::CreatePaged(pool, paged));
  return std::unique_ptr<CacheKv>(new CacheKv(shape, std::move(cache), options.attention_pool));
}

Status CacheKv::Store(uint32_t layer, std::span<const float> k, std::span<const float> v) {
  KV_RETURN_IF_ERROR(CheckStore(layer));
  const size_t want = static_cast<size_t>(pass_tokens()) * shape_.kv_dim();
  if (k.size() != want || v.size() != want) {
    return Status::InvalidArgument("cache kv: store of " + std::to_string(k.size()) +
                                   " values, the pass needs " + std::to_string(want));
  }
  return seq_.AppendLayer(layer, k, v);
}

Status CacheKv::Attend(uint32_t layer, std::span<const float> q, std::span<float> out) {
  KV_RETURN_IF_ERROR(CheckAttend(layer));
  KV_ASSIGN_OR_RETURN(LayerKvView view, seq_.View(layer));
  AttentionOptions options;
  options.n_q_heads = shape_.n_heads;
  options.pool = attention_pool_;
  AttentionOutput output;
  output.out = out;
  if (pass_tokens() == 1) return AttendDecode(view, q, options, output);
  return AttendMulti(view, pass_tokens(), q, options, output);
}

Status CacheKv::AdoptPrefix(std::span<const uint32_t> blocks,
                            std::shared_ptr<const Calibration> calibration,
                            std::shared_ptr<const WindowSinks> sinks) {
  if (seq_.layout() != CacheLayout::kPaged || num_tokens() != 0) {
    return Status::FailedPrecondition("cache kv: AdoptPrefix needs an empty paged cache");
  }
  const uint64_t rows = uint64_t{blocks.size()} * seq_.block_size();
  if (rows > shape_.max_seq_len) {
    return Status::FailedPrecondition("cache kv: a prefix of " + std::to_string(rows) +
                                      " positions exceeds max_seq_len " +
                                      std::to_string(shape_.max_seq_len));
  }
  KV_RETURN_IF_ERROR(seq_.AdoptPrefix(blocks, std::move(calibration), std::move(sinks)));
  ClosePass(seq_.num_tokens());
  return Status::Ok();
}

}  // namespace kvcache::model
