// LayerCache: the per-layer handle; every method forwards to its SequenceCache.
#include "kvcache/cache.h"

#include "cache/cache_state.h"

namespace kvcache {

uint32_t LayerCache::n_kv_heads() const { return seq_->n_kv_heads(); }
uint32_t LayerCache::head_dim() const { return seq_->head_dim(); }
uint32_t LayerCache::num_tokens() const { return seq_->num_tokens(layer_); }

Status LayerCache::Append(std::span<const float> k, std::span<const float> v,
                          const AppendOptions& options) {
  return seq_->AppendLayer(layer_, k, v, options);
}
uint32_t LayerCache::head_len(uint32_t head) const { return seq_->head_len(layer_, head); }
Result<std::vector<float>> LayerCache::HeadKeys(uint32_t head) const {
  return seq_->HeadKeys(layer_, head);
}
Result<std::vector<float>> LayerCache::HeadValues(uint32_t head) const {
  return seq_->HeadValues(layer_, head);
}
std::vector<uint32_t> LayerCache::HeadPositions(uint32_t head) const {
  return seq_->HeadPositions(layer_, head);
}
Status LayerCache::AccumulateImportance(uint32_t head, std::span<const float> probs) {
  return seq_->AccumulateImportance(layer_, head, probs);
}
std::vector<float> LayerCache::HeadImportance(uint32_t head) const {
  return seq_->HeadImportance(layer_, head);
}
std::vector<float> LayerCache::Importance() const { return seq_->Importance(layer_); }
Result<LayerKvView> LayerCache::View() const { return seq_->View(layer_); }

size_t LayerCache::allocated_bytes() const {
  const SequenceCache::State& s = *seq_->s_;
  if (s.layout == CacheLayout::kPaged) {
    return s.table.size() * (s.pool->block_stride(Side::kKey) + s.pool->block_stride(Side::kValue));
  }
  size_t total = 0;
  if (s.released || layer_ >= s.store.size()) return 0;
  for (int side = 0; side < 2; ++side)
    for (const HeadBuffer& b : s.store[layer_].heads[side]) total += size_t{b.cap} * s.row_bytes[side];
  return total;
}
size_t LayerCache::used_bytes() const {
  size_t rows = 0;
  for (uint32_t h = 0; h < seq_->n_kv_heads(); ++h) rows += seq_->head_len(layer_, h);
  return rows * (RowBytes(seq_->formats().k, seq_->head_dim()) +
                 RowBytes(seq_->formats().v, seq_->head_dim()));
}

}  // namespace kvcache
