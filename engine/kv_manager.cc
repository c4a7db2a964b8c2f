// The KV manager (kv_manager.h).
//
// Blocks. One paged CacheKv per running request on the one pool. Admission
// adopts the longest cached prefix (OffloadCache::AcquireInto over the
// context but its last token, so at least one token runs), then reserves
// the context plus one block (CacheKv::Reserve). Whether the reservation
// can be met is worked out first from a lookup that takes nothing and
// counts nothing (PrefixCache::Peek) and the pool's available blocks, so a
// request waiting for blocks costs no counted lookup per step. Full blocks
// are published as they fill (OffloadCache::Publish with the request's
// chain hashes; without tiers the offload cache only names them in the
// prefix cache).
#include "engine/kv_manager.h"

#include <algorithm>
#include <string>

#include "kvcache/geometry.h"

namespace kvcache::engine {

KvManager::KvManager(const model::AttentionShape& shape, ThreadPool* attention_pool,
                     const KvManagerOptions& options)
    : shape_(shape),
      attention_pool_(attention_pool),
      options_(options),
      kinds_{KvGroupKind::kFullAttention} {}

KvManager::~KvManager() = default;

Result<std::unique_ptr<KvManager>> KvManager::Create(const model::AttentionShape& shape,
                                                     ThreadPool* attention_pool,
                                                     const KvManagerOptions& options) {
  std::unique_ptr<KvManager> m(new KvManager(shape, attention_pool, options));
  KV_RETURN_IF_ERROR(m->Init());
  return m;
}

Status KvManager::Init() {
  const KvManagerOptions& o = options_;
  if (!o.tiers.empty() && !o.prefix_cache) {
    return Status::InvalidArgument("engine: tiers need the prefix cache");
  }
  if (!o.tiers.empty() && o.model_id.empty()) {
    return Status::InvalidArgument("engine: tiers need model_id (the model's fingerprint)");
  }
  const model::AttentionShape& s = shape_;
  KV_ASSIGN_OR_RETURN(Geometry geometry,
                      Geometry::Create({s.n_layers, s.n_kv_heads, s.head_dim, o.block_size}));
  const uint32_t blocks =
      o.pool_blocks > 0 ? o.pool_blocks : BlockPool::BlocksForBytes(geometry, o.formats, o.pool_bytes);
  BlockPoolOptions p;
  p.num_blocks = std::max(blocks, 1u);
  KV_ASSIGN_OR_RETURN(pool_, BlockPool::Create(geometry, o.formats, p));
  const uint32_t per_seq = (s.max_seq_len + o.block_size - 1) / o.block_size;
  if (blocks < per_seq) {
    return Status::InvalidArgument("engine: pool_bytes " + std::to_string(o.pool_bytes) + " hold " +
                                   std::to_string(blocks) + " blocks of " +
                                   std::to_string(pool_->block_bytes()) + " bytes, one " +
                                   std::to_string(s.max_seq_len) + "-token sequence needs " +
                                   std::to_string(per_seq));
  }
  if (!o.prefix_cache) return Status::Ok();
  std::vector<std::shared_ptr<Tier>> tiers;
  if (!o.tiers.empty()) {
    KV_ASSIGN_OR_RETURN(tiers, MakeTiers(o.tiers));
  }
  KV_ASSIGN_OR_RETURN(prefix_, PrefixCache::Create(pool_));
  OffloadOptions off;
  off.model = o.model_id;
  KV_ASSIGN_OR_RETURN(offload_, OffloadCache::Create(pool_, prefix_.get(), std::move(tiers), off));
  return Status::Ok();
}

std::vector<BlockHash> KvManager::HashPrompt(std::span<const int32_t> prompt) const {
  if (!options_.prefix_cache) return {};
  const std::vector<TokenId> ids(prompt.begin(), prompt.end());
  return HashFullBlocks(ids, options_.block_size, "");
}

uint64_t KvManager::AdmissionTokens(size_t tokens) const {
  return std::min<uint64_t>(tokens + options_.block_size, shape_.max_seq_len);
}

KvDemand KvManager::AdmissionDemand(size_t tokens) const {
  const uint32_t B = options_.block_size;
  return KvDemand{{(AdmissionTokens(tokens) + B - 1) / B}};
}

bool KvManager::CanAdmit(std::span<const int32_t> tokens) const {
  const uint64_t blocks = AdmissionDemand(tokens.size()).blocks[0];
  uint64_t hit = 0, parked = 0;
  if (prefix_) {
    const std::vector<TokenId> ids(tokens.begin(), tokens.end() - 1);
    const PrefixMatch m = prefix_->Peek(ids, "");
    hit = m.blocks.size();
    for (uint32_t b : m.blocks) parked += pool_->state(b) == BlockState::kCached ? 1 : 0;
  }
  // Adopting a parked block takes it out of the available ones; the rest
  // of the reservation needs new blocks (a tier's hit takes pool blocks too).
  const uint64_t need = blocks - std::min<uint64_t>(hit, blocks);
  return need + parked <= pool_->stats().available_blocks;
}

size_t KvManager::Adopt(model::CacheKv& kv, std::span<const int32_t> tokens, KvAdmission* found) {
  if (!offload_) return 0;
  // Every cached block but the one holding the last token: a token must run.
  const std::vector<TokenId> ids(tokens.begin(), tokens.end() - 1);
  auto adopted = offload_->AcquireInto(
      ids, "",
      [&kv](std::span<const uint32_t> blocks, std::shared_ptr<const Calibration> calibration,
            std::shared_ptr<const WindowSinks> sinks) {
        return kv.AdoptPrefix(blocks, std::move(calibration), std::move(sinks));
      },
      found != nullptr ? &found->served : nullptr);
  if (!adopted.ok() && found != nullptr) found->adopt_error = adopted.status();
  return adopted.ok() ? *adopted : 0;  // a failed adoption leaves kv empty: recompute
}

Result<std::unique_ptr<KvSequence>> KvManager::Admit(std::span<const int32_t> tokens, KvAdmission* found) {
  model::CacheKvOptions o;
  o.formats = options_.formats;
  o.window = options_.window;
  o.layout = CacheLayout::kPaged;
  o.block_size = options_.block_size;
  o.pool = pool_;
  o.attention_pool = attention_pool_;
  KV_ASSIGN_OR_RETURN(std::unique_ptr<model::CacheKv> kv, model::CacheKv::Create(shape_, o));
  const size_t adopted = Adopt(*kv, tokens, found);
  KV_RETURN_IF_ERROR(kv->Reserve(static_cast<uint32_t>(AdmissionTokens(tokens.size()))));  // kv's blocks go back on failure
  auto seq = std::make_unique<KvSequence>();
  seq->kv_ = std::move(kv);
  seq->cached_tokens_ = static_cast<uint32_t>(adopted);
  seq->published_ = adopted / options_.block_size;
  return seq;
}

bool KvManager::WillPublishFor(const KvSequence& leader, std::span<const BlockHash> leader_hashes,
                               std::span<const int32_t> tokens, std::span<const BlockHash> hashes) const {
  if (!offload_) return false;
  const size_t adoptable = std::min(hashes.size(), (tokens.size() - 1) / options_.block_size);
  const size_t p = leader.published_;
  if (adoptable == 0 || leader.publish_stopped_) return false;
  return p < adoptable && p < leader_hashes.size() && leader_hashes[p] == hashes[p];
}

Result<size_t> KvManager::Publish(KvSequence& seq, std::span<const int32_t> tokens,
                                  std::vector<BlockHash>* hashes) {
  if (!offload_ || seq.publish_stopped_) return seq.published_;
  const uint32_t B = options_.block_size;
  const size_t full = std::min<size_t>(seq.kv_->num_tokens(), tokens.size()) / B;
  if (full <= seq.published_) return seq.published_;
  const std::vector<TokenId> ids(tokens.begin(), tokens.begin() + full * B);
  while (hashes->size() < full) {
    const size_t b = hashes->size();
    const BlockHash parent = b == 0 ? ChainRoot("") : hashes->back();
    hashes->push_back(ChainHash(parent, std::span<const TokenId>(ids).subspan(b * B, B)));
  }
  model::CacheKv* kv = seq.kv_.get();
  // The window's sinks go with the block that completes them, when this
  // publication names it (copied only then).
  std::shared_ptr<const WindowSinks> sinks;
  const uint32_t S = options_.window.sinks;
  if (S > 0 && seq.published_ <= (S - 1) / B && (S - 1) / B < full) sinks = kv->cache().window_sinks();
  auto end = offload_->Publish(
      std::span<const BlockHash>(*hashes).first(full), kv->cache().block_table(), seq.published_, ids, "",
      kv->cache().calibration(),
      [kv](size_t block, uint64_t hash) { return kv->SetBlockHash(static_cast<uint32_t>(block), hash); },
      std::move(sinks));
  if (!end.ok() || *end < full) {
    seq.publish_stopped_ = true;  // a duplicate (or an error): the rest stays private
    if (!end.ok()) return end.status();
  }
  seq.published_ = std::max(seq.published_, *end);
  return seq.published_;
}

OffloadStats KvManager::tier_stats() const { return offload_ ? offload_->stats() : OffloadStats{}; }

void KvManager::FlushTiers() {
  if (offload_) offload_->Flush();
}

KvMetrics KvManager::Metrics() const {
  KvMetrics m;
  const PoolStats ps = pool_->stats();
  KvGroupMetrics g;
  g.kind = kinds_[0];
  g.blocks_total = ps.num_blocks;
  g.blocks_free = ps.free_blocks;
  g.blocks_used = ps.used_blocks;
  g.blocks_cached = ps.cached_blocks;
  m.groups.push_back(g);
  if (prefix_) m.prefix_lookups = prefix_->stats().lookups;
  if (offload_) {
    for (const TierStats& t : offload_->stats().tiers) {
      m.tier_hit_blocks += t.hit_blocks;
      for (uint64_t miss : t.misses) m.tier_miss_blocks += miss;
    }
  }
  return m;
}

}  // namespace kvcache::engine
