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
//
// Sequences without rows (KvManagerOptions::rows false) keep the block
// table a paged cache would keep, with the same pool calls in the same
// order: appends draw from the sequence's reservation first and copy a
// shared partial last block before writing it; truncations give blocks
// back tail first; forks retain every block.
#include "engine/kv_manager.h"

#include <algorithm>
#include <string>

#include "kvcache/geometry.h"

namespace kvcache::engine {
namespace {

uint32_t CeilDiv(uint64_t a, uint32_t b) { return static_cast<uint32_t>((a + b - 1) / b); }

// The engine's token ids as the prefix cache's (the same bits).
std::span<const TokenId> AsTokenIds(std::span<const int32_t> tokens) {
  static_assert(sizeof(TokenId) == sizeof(int32_t));
  return {reinterpret_cast<const TokenId*>(tokens.data()), tokens.size()};
}

}  // namespace

std::string_view KvGroupKindName(KvGroupKind kind) {
  switch (kind) {
    case KvGroupKind::kFullAttention: return "full";
    case KvGroupKind::kSlidingWindow: return "window";
    case KvGroupKind::kLinearState: return "linear";
  }
  return "?";
}

void ExtendChainHashes(std::span<const TokenId> tokens, uint32_t block_size, std::string_view salt,
                       size_t full, std::vector<BlockHash>* hashes) {
  while (hashes->size() < full) {
    const size_t b = hashes->size();
    const BlockHash parent = b == 0 ? ChainRoot(salt) : hashes->back();
    hashes->push_back(ChainHash(parent, tokens.subspan(b * block_size, block_size)));
  }
}

// --- KvSequence --------------------------------------------------------------

KvSequence::~KvSequence() {
  if (!pool_) return;
  const uint64_t reserved = reserved_blocks();
  if (reserved > 0) pool_->Unreserve(static_cast<uint32_t>(reserved));
  if (!table_.empty()) {
    const std::vector<uint32_t> back_to_front(table_.rbegin(), table_.rend());
    (void)pool_->Release(back_to_front);  // the table's own references: cannot fail
  }
}

std::span<const uint32_t> KvSequence::block_table() const {
  if (cache_) return cache_->cache().block_table();
  if (hybrid_) return hybrid_->sequence().group_cache(HybridModel::kFullGroup)->block_table();
  return table_;
}

Status KvSequence::NoRows() {
  return Status::FailedPrecondition("kv manager: a sequence without rows stores and attends nothing");
}

Result<std::unique_ptr<model::KvBackend>> KvSequence::Fork() {
  if (kv_ == nullptr) return NoRows();
  return kv_->Fork();
}

uint64_t KvSequence::reserved_blocks() const {
  uint64_t n = reserved_;
  for (uint32_t share : fork_shares_) n += share;
  return n;
}

Status KvSequence::CheckBlocks() const {
  if (kv_ != nullptr) return Status::Ok();
  if (table_.size() != CeilDiv(length_, pool_->block_size())) {
    return Status::Internal("kv manager: " + std::to_string(table_.size()) + " blocks hold " +
                            std::to_string(length_) + " rows");
  }
  return Status::Ok();
}

Status KvSequence::ExtendBlocks(uint32_t n) {
  const uint32_t B = pool_->block_size();
  const uint32_t new_blocks = CeilDiv(uint64_t{length_} + n, B) - static_cast<uint32_t>(table_.size());
  // Writing into a shared partial last block copies it first (copy on write).
  const bool cow = length_ % B != 0 && !pool_->IsExclusive(table_.back());
  const uint32_t total = new_blocks + (cow ? 1 : 0);
  if (total > 0) {
    std::vector<uint32_t> fresh(total);
    const uint32_t from_reserved = std::min(total, reserved_);
    KV_RETURN_IF_ERROR(pool_->Allocate(fresh, from_reserved));
    reserved_ -= from_reserved;
    size_t next = 0;
    if (cow) {
      const uint32_t old = table_.back();
      table_.back() = fresh[next++];
      KV_RETURN_IF_ERROR(pool_->Release(std::span<const uint32_t>(&old, 1)));
    }
    for (; next < fresh.size(); ++next) table_.push_back(fresh[next]);
  }
  length_ += n;
  return Status::Ok();
}

Status KvSequence::TruncateBlocks(uint32_t num_tokens) {
  if (num_tokens > length_) {
    return Status::OutOfRange("kv manager: truncate to " + std::to_string(num_tokens) + " of " +
                              std::to_string(length_) + " rows");
  }
  const uint32_t keep = CeilDiv(num_tokens, pool_->block_size());
  length_ = num_tokens;
  if (keep >= table_.size()) return Status::Ok();
  std::vector<uint32_t> drop(table_.rbegin(), table_.rend() - keep);  // tail first
  table_.resize(keep);
  if (truncate_reserves_) {
    KV_ASSIGN_OR_RETURN(const uint32_t got,
                        pool_->ReleaseAndReserve(drop, static_cast<uint32_t>(drop.size())));
    reserved_ += got;
    return Status::Ok();
  }
  return pool_->Release(drop);
}

// --- KvManager ---------------------------------------------------------------

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
  if (options.local_formats && !shape.has_windows()) {
    return Status::InvalidArgument(
        "engine: per-group formats (global=...,local=...) need a model with sliding-window layers; this one has "
        "none: give one format");
  }
  std::unique_ptr<KvManager> m(new KvManager(shape, attention_pool, options));
  KV_RETURN_IF_ERROR(m->Init());
  return m;
}

Status KvManager::Init() {
  const KvManagerOptions& o = options_;
  const bool tiered = !o.tiers.empty() || !o.tier_objects.empty();
  if (tiered && !o.prefix_cache) {
    return Status::InvalidArgument("engine: tiers need the prefix cache");
  }
  if (tiered && o.model_id.empty()) {
    return Status::InvalidArgument("engine: tiers need model_id (the model's fingerprint)");
  }
  const model::AttentionShape& s = shape_;
  if (s.has_windows()) return InitHybrid();
  KV_ASSIGN_OR_RETURN(Geometry geometry,
                      Geometry::Create({s.n_layers, s.n_kv_heads, s.head_dim, o.block_size}));
  const uint32_t blocks =
      o.pool_blocks > 0 ? o.pool_blocks : BlockPool::BlocksForBytes(geometry, o.formats, o.pool_bytes);
  BlockPoolOptions p;
  p.num_blocks = std::max(blocks, 1u);
  KV_ASSIGN_OR_RETURN(pool_, BlockPool::Create(geometry, o.formats, p));
  pools_ = {pool_};
  const uint32_t per_seq = (s.max_seq_len + o.block_size - 1) / o.block_size;
  if (blocks < per_seq) {
    return Status::InvalidArgument("engine: pool_bytes " + std::to_string(o.pool_bytes) + " hold " +
                                   std::to_string(blocks) + " blocks of " +
                                   std::to_string(pool_->block_bytes()) + " bytes, one " +
                                   std::to_string(s.max_seq_len) + "-token sequence needs " +
                                   std::to_string(per_seq));
  }
  if (!o.prefix_cache) return Status::Ok();
  std::vector<std::shared_ptr<Tier>> tiers = o.tier_objects;
  if (!o.tiers.empty()) {
    KV_ASSIGN_OR_RETURN(tiers, MakeTiers(o.tiers));
  }
  KV_ASSIGN_OR_RETURN(prefix_, PrefixCache::Create(pool_));
  OffloadOptions off;
  off.model = o.model_id;
  KV_ASSIGN_OR_RETURN(offload_, OffloadCache::Create(pool_, prefix_.get(), std::move(tiers), off));
  return Status::Ok();
}

Status KvManager::InitHybrid() {
  const KvManagerOptions& o = options_;
  if (!o.rows) {
    return Status::Unimplemented(
        "kv manager: sequences without rows (the serving simulator) on a model with sliding-window layers");
  }
  model::HybridKvOptions& h = hybrid_options_;
  h.formats = o.formats;
  h.bounded_formats = o.local_formats;
  h.layout = CacheLayout::kPaged;
  h.block_size = o.block_size;
  h.attention_pool = attention_pool_;
  h.window = o.window;
  h.max_chunk_tokens = o.max_chunk_tokens;
  h.window_slack_tokens = o.window_slack_tokens;
  KV_ASSIGN_OR_RETURN(hybrid_, model::HybridKv::MakeModel(shape_, h));
  if (hybrid_->group_size(HybridModel::kFullGroup) == 0) {
    return Status::Unimplemented("engine: a model whose every layer attends to a sliding window");
  }
  // The pools share pool_bytes so that each holds the same number of
  // sequences of pool_balance_tokens; each must hold one max_seq_len one.
  const uint64_t L = shape_.max_seq_len;
  const uint64_t balance = o.pool_balance_tokens == 0 ? L : std::min<uint64_t>(o.pool_balance_tokens, L);
  uint64_t per_seq[2], balanced[2], block_bytes[2], blocks[2];
  for (int g = 0; g < 2; ++g) {
    per_seq[g] = GroupBlocks(g, L);
    balanced[g] = GroupBlocks(g, balance);
    block_bytes[g] = BlockPool::BlockBytes(hybrid_->group_geometry(g), hybrid_->group_formats(g));
  }
  const double seq_bytes = double(balanced[0]) * double(block_bytes[0]) + double(balanced[1]) * double(block_bytes[1]);
  for (int g = 0; g < 2; ++g) {
    blocks[g] = o.pool_blocks > 0
                    ? o.pool_blocks
                    : static_cast<uint64_t>(double(o.pool_bytes) * double(balanced[g]) / seq_bytes);
    if (blocks[g] < per_seq[g] || blocks[g] > UINT32_MAX) {
      return Status::InvalidArgument(
          "engine: pool_bytes " + std::to_string(o.pool_bytes) + " give the " +
          (g == 0 ? "full-attention" : "sliding-window") + " layers " + std::to_string(blocks[g]) + " blocks of " +
          std::to_string(block_bytes[g]) + " bytes; one " + std::to_string(L) + "-token sequence needs " +
          std::to_string(per_seq[g]));
    }
  }
  const uint32_t counts[2] = {static_cast<uint32_t>(blocks[0]), static_cast<uint32_t>(blocks[1])};
  KV_ASSIGN_OR_RETURN(h.pools, hybrid_->CreatePools(counts));
  pools_ = h.pools;
  pool_ = pools_[0];
  kinds_ = {KvGroupKind::kFullAttention, KvGroupKind::kSlidingWindow};
  // Prefix reuse needs window blocks named like full ones (sinkless windows
  // compacting by whole blocks); the precision window's sinks do not travel
  // with a hybrid prefix, so a model with one computes every prompt.
  const bool tiered = !o.tiers.empty() || !o.tier_objects.empty();
  if (!o.prefix_cache || !hybrid_->window_blocks_aligned() || o.window.enabled()) {
    if (tiered) {
      return Status::InvalidArgument(
          "engine: offload tiers keep reusable prefixes, and a model with sliding-window layers reuses none "
          "with a precision window (+sN+rN) or with window blocks that do not align: drop --tiers or the window");
    }
    return Status::Ok();
  }
  // The window index hears of every full block the prefix cache loses: the
  // window block of that hash can no longer be part of a hit.
  window_index_ = std::make_unique<WindowBlockIndex>(pools_[1]);
  KV_ASSIGN_OR_RETURN(prefix_, PrefixCache::Create(WindowBlockIndex::WatchChain(PoolPrefixBackend(pool_),
                                                                                window_index_.get())));
  std::vector<std::shared_ptr<Tier>> tiers = o.tier_objects;
  if (!o.tiers.empty()) {
    KV_ASSIGN_OR_RETURN(tiers, MakeTiers(o.tiers));
  }
  // Each group's objects name it: a process whose groups differ misses.
  OffloadOptions off;
  off.model = o.model_id;
  off.group = LayerGroupTag{LayerGroupKind::kFullAttention, 0};
  KV_ASSIGN_OR_RETURN(offload_, OffloadCache::Create(pool_, prefix_.get(), tiers, off));
  if (!tiers.empty()) {
    uint32_t window = 0;
    for (uint32_t w : shape_.windows) window = std::max(window, w);
    off.group = LayerGroupTag{LayerGroupKind::kSlidingWindow, window};
    KV_ASSIGN_OR_RETURN(window_offload_, OffloadCache::Create(pools_[1], nullptr, std::move(tiers), off));
  }
  return Status::Ok();
}

KvManager::HybridHit KvManager::FindHybridHit(std::span<const int32_t> tokens) const {
  HybridHit hit;
  if (!prefix_ || tokens.size() < 2) return hit;
  const uint32_t B = options_.block_size;
  const std::span<const TokenId> ids = AsTokenIds(tokens).first(tokens.size() - 1);
  const PrefixMatch full = prefix_->Peek(ids, "");
  hit.hashes = HashFullBlocks(ids, B, "");
  // The longest prefix whose window run is cached too (a shorter prefix
  // needs an earlier run, which may still be there).
  for (size_t k = full.blocks.size(); k > 0; --k) {
    const size_t first = hybrid_->WindowKeepFrom(static_cast<uint32_t>(k * B)) / B;
    if (window_index_->Covers(std::span<const BlockHash>(hit.hashes).subspan(first, k - first))) {
      hit.blocks = k;
      hit.window_first = first;
      hit.full_blocks.assign(full.blocks.begin(), full.blocks.begin() + static_cast<std::ptrdiff_t>(k));
      break;
    }
  }
  return hit;
}

bool KvManager::ExtendHitFromTiers(HybridHit& hit, const PrefixMatch& full, std::span<const TokenId> ids) {
  const uint32_t B = options_.block_size;
  const size_t k = full.blocks.size();
  if (k <= hit.blocks || k > hit.hashes.size()) return false;
  const size_t first = hybrid_->WindowKeepFrom(static_cast<uint32_t>(k * B)) / B;
  const std::span<const BlockHash> run = std::span<const BlockHash>(hit.hashes).subspan(first, k - first);
  std::vector<size_t> missing = window_index_->Missing(run);
  if (!missing.empty()) {
    for (size_t& i : missing) i += first;
    Result<OffloadCache::LoadedBlocks> loaded =
        window_offload_->LoadBlocks(std::span<const BlockHash>(hit.hashes).first(k), missing, ids, "");
    if (!loaded.ok()) return false;
    // Named in the index and parked, as blocks that slid out of a window are.
    BlockPool& pool = *pools_[1];
    for (size_t j = 0; j < missing.size(); ++j) {
      const uint32_t b = loaded->blocks[j];
      (void)window_index_->Publish(hit.hashes[missing[j]], b, loaded->calibration,
                                   [&pool, b](uint64_t hash) { return pool.SetBlockHash(b, hash); });
    }
    const std::vector<uint32_t> back(loaded->blocks.rbegin(), loaded->blocks.rend());
    (void)pools_[1]->Release(back);  // the loaded references: cannot fail
  }
  if (!window_index_->Covers(run)) return false;
  hit.blocks = k;
  hit.window_first = first;
  hit.full_blocks = full.blocks;
  return true;
}

size_t KvManager::AdoptHybrid(model::HybridKv& kv, std::span<const int32_t> tokens, KvAdmission* found) {
  HybridHit hit = FindHybridHit(tokens);
  if (found != nullptr) found->served.assign(1, 0);
  if (!prefix_) return 0;
  const uint32_t B = options_.block_size;
  auto give_back = [this](const std::vector<uint32_t>& blocks, int group) {
    const std::vector<uint32_t> back(blocks.rbegin(), blocks.rend());
    (void)pools_[group]->Release(back);  // references this admission took: cannot fail
  };
  PrefixMatch full;
  std::vector<uint64_t> served;
  if (window_offload_) {
    // One counted lookup over the longest chain the pool and the tiers hold;
    // the part past the hit both groups can serve goes back.
    const std::span<const TokenId> ids = AsTokenIds(tokens).first(tokens.size() - 1);
    full = offload_->Acquire(ids, "", &served);
    ExtendHitFromTiers(hit, full, ids);
    if (full.blocks.size() > hit.blocks) {
      give_back(std::vector<uint32_t>(full.blocks.begin() + static_cast<std::ptrdiff_t>(hit.blocks), full.blocks.end()), 0);
      full.blocks.resize(hit.blocks);
    }
  } else {
    // One counted lookup, over the prefix both groups hold: all from the pool.
    full = prefix_->Acquire(AsTokenIds(tokens).first(hit.blocks * B), "");
    served.assign(1, full.num_tokens);
  }
  if (hit.blocks == 0 || full.blocks.size() != hit.blocks) {
    give_back(full.blocks, 0);
    return 0;
  }
  Result<WindowMatch> window = window_index_->Acquire(
      std::span<const BlockHash>(hit.hashes).subspan(hit.window_first, hit.blocks - hit.window_first));
  if (!window.ok()) {
    give_back(full.blocks, 0);
    if (found != nullptr) found->adopt_error = window.status();
    return 0;
  }
  const Status adopted = kv.AdoptPrefix(full.blocks, full.calibration, window->blocks, window->calibration);
  if (!adopted.ok()) {
    give_back(full.blocks, 0);
    give_back(window->blocks, 1);
    if (found != nullptr) found->adopt_error = adopted;
    return 0;
  }
  if (found != nullptr) {
    // The hit's tokens by source: the pool's first, then the tiers' in order.
    uint64_t left = hit.blocks * B;
    found->served.assign(served.size(), 0);
    for (size_t s = 0; s < served.size(); ++s) {
      found->served[s] = std::min(served[s], left);
      left -= found->served[s];
    }
  }
  return hit.blocks * B;
}

void KvManager::PublishWindow(KvSequence& seq, size_t full, std::span<const BlockHash> hashes,
                              std::span<const TokenId> tokens) {
  model::HybridKv& kv = *seq.hybrid_;
  const uint32_t B = options_.block_size;
  const std::span<const uint32_t> table = kv.block_table(HybridModel::kBoundedGroup);
  const std::shared_ptr<const Calibration> calibration = kv.calibration(HybridModel::kBoundedGroup);
  for (uint32_t b = 0; b < table.size(); ++b) {
    Result<uint32_t> first = kv.BlockFirstPosition(HybridModel::kBoundedGroup, b);
    if (!first.ok()) break;  // the partial last block
    const size_t j = *first / B;
    if (j < seq.window_published_) continue;
    if (j >= full) break;
    const uint32_t block = table[b];
    auto named = window_index_->Publish(hashes[j], block, calibration, [&kv, b](uint64_t hash) {
      return kv.SetBlockHash(HybridModel::kBoundedGroup, b, hash);
    });
    if (!named.ok()) break;  // the rest stays private
    if (*named && window_offload_) {
      // Every window block can end up in some later hit's run: all go to the tiers.
      (void)window_offload_->OffloadBlock(hashes, j, block, tokens, seq.salt_, calibration);
    }
    seq.window_published_ = j + 1;
  }
}

std::vector<BlockHash> KvManager::HashPrompt(std::span<const int32_t> prompt) const {
  if (!options_.prefix_cache) return {};
  return HashFullBlocks(AsTokenIds(prompt), options_.block_size, "");
}

uint64_t KvManager::AdmissionTokens(size_t tokens) const {
  return std::min<uint64_t>(tokens + options_.block_size, shape_.max_seq_len);
}

uint64_t KvManager::GroupBlocks(int group, uint64_t tokens) const {
  if (hybrid_) return model::HybridKv::BlocksPerSequence(*hybrid_, group, tokens);
  return CeilDiv(tokens, options_.block_size);
}

KvDemand KvManager::AdmissionDemand(size_t tokens) const {
  KvDemand d;
  for (size_t g = 0; g < pools_.size(); ++g) d.blocks.push_back(GroupBlocks(static_cast<int>(g), AdmissionTokens(tokens)));
  return d;
}

bool KvManager::CanAdmit(std::span<const int32_t> tokens) const {
  const KvDemand demand = AdmissionDemand(tokens.size());
  if (hybrid_) {
    // As below, per group: the hit's blocks need no new ones, but adopting
    // a parked block takes it out of the available ones.
    const HybridHit hit = FindHybridHit(tokens);
    uint64_t held[2] = {0, 0}, parked[2] = {0, 0};
    if (hit.blocks > 0) {
      held[0] = hit.full_blocks.size();
      for (uint32_t b : hit.full_blocks) parked[0] += pools_[0]->state(b) == BlockState::kCached ? 1 : 0;
      held[1] = hit.blocks - hit.window_first;  // the window run's blocks
      parked[1] = window_index_->Parked(
          std::span<const BlockHash>(hit.hashes).subspan(hit.window_first, hit.blocks - hit.window_first));
    }
    for (size_t g = 0; g < pools_.size(); ++g) {
      const uint64_t need = demand.blocks[g] - std::min(held[g], demand.blocks[g]);
      if (need + parked[g] > pools_[g]->stats().available_blocks) return false;
    }
    return true;
  }
  const uint64_t blocks = demand.blocks[0];
  uint64_t hit = 0, parked = 0;
  if (prefix_) {
    const PrefixMatch m = prefix_->Peek(AsTokenIds(tokens).first(tokens.size() - 1), "");
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
  auto adopted = offload_->AcquireInto(
      AsTokenIds(tokens).first(tokens.size() - 1), "",
      [&kv](std::span<const uint32_t> blocks, std::shared_ptr<const Calibration> calibration,
            std::shared_ptr<const WindowSinks> sinks) {
        return kv.AdoptPrefix(blocks, std::move(calibration), std::move(sinks));
      },
      found != nullptr ? &found->served : nullptr);
  if (!adopted.ok() && found != nullptr) found->adopt_error = adopted.status();
  return adopted.ok() ? *adopted : 0;  // a failed adoption leaves kv empty: recompute
}

Result<std::unique_ptr<KvSequence>> KvManager::Admit(std::span<const int32_t> tokens, KvAdmission* found) {
  if (!options_.rows) return Admit(AsTokenIds(tokens), KvAdmitOptions{}, found);
  if (tokens.empty()) return Status::InvalidArgument("kv manager: an admission needs a token");
  if (hybrid_) return AdmitHybrid(tokens, found);
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
  seq->cache_ = std::move(kv);
  seq->kv_ = seq->cache_.get();
  seq->cached_tokens_ = static_cast<uint32_t>(adopted);
  seq->published_ = adopted / options_.block_size;
  return seq;
}

Result<std::unique_ptr<KvSequence>> KvManager::AdmitHybrid(std::span<const int32_t> tokens, KvAdmission* found) {
  KV_ASSIGN_OR_RETURN(std::unique_ptr<model::HybridKv> kv, model::HybridKv::Create(shape_, hybrid_options_));
  const size_t adopted = AdoptHybrid(*kv, tokens, found);
  const uint64_t reserve = AdmissionTokens(tokens.size());
  const uint32_t B = options_.block_size;
  for (int g = 0; g < 2; ++g) {
    const uint64_t rows = std::min<uint64_t>(reserve, GroupBlocks(g, reserve) * B);
    KV_RETURN_IF_ERROR(kv->Reserve(g, static_cast<uint32_t>(rows)));  // kv's blocks go back on failure
  }
  auto seq = std::make_unique<KvSequence>();
  seq->hybrid_ = std::move(kv);
  seq->kv_ = seq->hybrid_.get();
  seq->cached_tokens_ = static_cast<uint32_t>(adopted);
  seq->published_ = adopted / B;
  seq->window_published_ = adopted / B;
  return seq;
}

Result<std::unique_ptr<KvSequence>> KvManager::Admit(std::span<const TokenId> tokens,
                                                     const KvAdmitOptions& options, KvAdmission* found) {
  if (tokens.empty() || options.samples == 0) {
    return Status::InvalidArgument("kv manager: an admission needs a token and a sample");
  }
  if (!options_.rows) return AdmitBlocks(tokens, options, found);
  if (options.reservation != KvReservation::kContextPlusBlock || options.samples != 1 ||
      !options.salt.empty()) {
    return Status::InvalidArgument(
        "kv manager: sequences with rows reserve the context plus one block, one sample, no salt");
  }
  static_assert(sizeof(TokenId) == sizeof(int32_t));
  return Admit(std::span<const int32_t>(reinterpret_cast<const int32_t*>(tokens.data()), tokens.size()),
               found);
}

Result<std::unique_ptr<KvSequence>> KvManager::AdmitBlocks(std::span<const TokenId> tokens,
                                                           const KvAdmitOptions& options,
                                                           KvAdmission* found) {
  const uint32_t B = options_.block_size;
  const uint64_t len = tokens.size();
  // Every cached block but the one holding the last token: a token must run.
  PrefixMatch match;
  if (offload_) {
    match = offload_->Acquire(tokens.first(len - 1), options.salt, found != nullptr ? &found->served : nullptr);
  }
  const uint64_t hit = match.blocks.size();
  // The shares: this sequence's, then each fork's.
  uint64_t own = 0, fork = 1;
  switch (options.reservation) {
    case KvReservation::kContextPlusBlock:
      own = AdmissionDemand(len).blocks[0];
      break;
    case KvReservation::kPrompt:
      own = CeilDiv(len, B);
      break;
    case KvReservation::kWorstCase: {
      const uint64_t worst = CeilDiv(len + options.max_new_tokens + options.draft_tokens, B);
      own = worst;
      fork = worst - len / B;  // the prompt's full blocks are shared
      break;
    }
  }
  own -= std::min(own, hit);
  const uint64_t total = own + fork * (options.samples - 1);
  Status reserve = total <= pool_->num_blocks() ? pool_->Reserve(static_cast<uint32_t>(total))
                                                : Status::PoolExhausted("kv manager: a reservation past the pool");
  if (!reserve.ok()) {
    const std::vector<uint32_t> back(match.blocks.rbegin(), match.blocks.rend());
    KV_RETURN_IF_ERROR(pool_->Release(back));
    return reserve;  // PoolExhausted: nothing held
  }
  auto seq = std::make_unique<KvSequence>();
  seq->pool_ = pool_;
  seq->table_ = std::move(match.blocks);
  seq->length_ = static_cast<uint32_t>(match.num_tokens);
  seq->reserved_ = static_cast<uint32_t>(own);
  seq->fork_shares_.assign(options.samples - 1, static_cast<uint32_t>(fork));
  seq->truncate_reserves_ = options.reservation == KvReservation::kWorstCase;
  seq->cached_tokens_ = static_cast<uint32_t>(match.num_tokens);
  seq->published_ = hit;
  seq->salt_ = options.salt;
  return seq;
}

Result<std::unique_ptr<KvSequence>> KvManager::Fork(KvSequence& parent) {
  auto child = std::make_unique<KvSequence>();
  if (parent.kv_ != nullptr) {
    KV_ASSIGN_OR_RETURN(std::unique_ptr<model::KvBackend> copy, parent.kv_->Fork());
    if (parent.cache_) {
      auto* kv = dynamic_cast<model::CacheKv*>(copy.get());
      if (kv == nullptr) return Status::Internal("kv manager: a fork that is not a paged cache");
      copy.release();
      child->cache_.reset(kv);
      child->kv_ = kv;
    } else {
      auto* kv = dynamic_cast<model::HybridKv*>(copy.get());
      if (kv == nullptr) return Status::Internal("kv manager: a fork that is not a hybrid cache");
      copy.release();
      child->hybrid_.reset(kv);
      child->kv_ = kv;
    }
  } else {
    KV_RETURN_IF_ERROR(pool_->Retain(parent.table_));  // share every block
    child->pool_ = pool_;
    child->table_ = parent.table_;
    child->length_ = parent.length_;
    child->truncate_reserves_ = parent.truncate_reserves_;
    if (!parent.fork_shares_.empty()) {
      child->reserved_ = parent.fork_shares_.back();
      parent.fork_shares_.pop_back();
    }
  }
  child->cached_tokens_ = parent.cached_tokens_;
  child->published_ = parent.published_;
  child->publish_stopped_ = parent.publish_stopped_;
  child->salt_ = parent.salt_;
  return child;
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
  return Publish(seq, AsTokenIds(tokens), hashes);
}

Result<size_t> KvManager::Publish(KvSequence& seq, std::span<const TokenId> tokens,
                                  std::vector<BlockHash>* hashes) {
  if (!offload_) return seq.published_;
  const uint32_t B = options_.block_size;
  const size_t full = std::min<size_t>(seq.num_tokens(), tokens.size()) / B;
  if (seq.hybrid_ && full > seq.window_published_) {
    ExtendChainHashes(tokens.first(full * B), B, seq.salt_, full, hashes);
    PublishWindow(seq, full, *hashes, tokens);
  }
  if (seq.publish_stopped_) return seq.published_;
  if (full <= seq.published_) return seq.published_;
  const std::span<const TokenId> ids = tokens.first(full * B);
  ExtendChainHashes(ids, B, seq.salt_, full, hashes);
  std::shared_ptr<const Calibration> calibration;
  PrefixCache::SetHashFn set_hash;
  std::shared_ptr<const WindowSinks> sinks;
  if (model::HybridKv* kv = seq.hybrid_.get()) {
    calibration = kv->calibration(HybridModel::kFullGroup);
    set_hash = [kv](size_t block, uint64_t hash) {
      return kv->SetBlockHash(HybridModel::kFullGroup, static_cast<uint32_t>(block), hash);
    };
  } else if (model::CacheKv* kv = seq.cache_.get()) {
    calibration = kv->cache().calibration();
    set_hash = [kv](size_t block, uint64_t hash) { return kv->SetBlockHash(static_cast<uint32_t>(block), hash); };
    // The window's sinks go with the block that completes them, when this
    // publication names it (copied only then).
    const uint32_t S = options_.window.sinks;
    if (S > 0 && seq.published_ <= (S - 1) / B && (S - 1) / B < full) sinks = kv->cache().window_sinks();
  }
  auto end = offload_->Publish(std::span<const BlockHash>(*hashes).first(full), seq.block_table(),
                               seq.published_, ids, seq.salt_, std::move(calibration), set_hash,
                               std::move(sinks));
  if (!end.ok() || *end < full) {
    seq.publish_stopped_ = true;  // a duplicate (or an error): the rest stays private
    if (!end.ok()) return end.status();
  }
  seq.published_ = std::max(seq.published_, *end);
  return seq.published_;
}

OffloadStats KvManager::tier_stats() const {
  if (!offload_) return OffloadStats{};
  OffloadStats s = offload_->stats();
  if (!window_offload_) return s;
  // Both groups' objects go to the same tiers: one set of counters.
  const OffloadStats w = window_offload_->stats();
  s.queued_blocks += w.queued_blocks;
  s.dropped_queue_full += w.dropped_queue_full;
  s.load_alloc_failures += w.load_alloc_failures;
  for (size_t t = 0; t < s.tiers.size() && t < w.tiers.size(); ++t) {
    TierStats& a = s.tiers[t];
    const TierStats& b = w.tiers[t];
    a.lookups += b.lookups;
    a.hit_blocks += b.hit_blocks;
    for (size_t r = 0; r < a.misses.size(); ++r) a.misses[r] += b.misses[r];
    a.bytes_loaded += b.bytes_loaded;
    a.bytes_stored += b.bytes_stored;
    a.stored_blocks += b.stored_blocks;
    a.dropped_stores += b.dropped_stores;
  }
  return s;
}

void KvManager::FlushTiers() {
  if (offload_) offload_->Flush();
  if (window_offload_) window_offload_->Flush();
}

Status KvManager::CheckInvariants() const {
  for (const auto& pool : pools_) KV_RETURN_IF_ERROR(pool->CheckInvariants());
  if (window_index_) {
    const std::string bad = window_index_->CheckInvariants();
    if (!bad.empty()) return Status::Internal(bad);
  }
  if (prefix_) {
    const std::string bad = prefix_->CheckInvariants();
    if (!bad.empty()) return Status::Internal("prefix cache: " + bad);
  }
  return Status::Ok();
}

std::vector<KvGroupMetrics> KvManager::GroupMetrics() const {
  std::vector<KvGroupMetrics> out;
  for (size_t i = 0; i < pools_.size(); ++i) {
    const PoolStats ps = pools_[i]->stats();
    out.push_back(KvGroupMetrics{kinds_[i], ps.num_blocks, ps.free_blocks, ps.used_blocks, ps.cached_blocks,
                                 ps.reserved_blocks, ps.evictions});
  }
  return out;
}

KvMetrics KvManager::Metrics() const {
  KvMetrics m;
  m.groups = GroupMetrics();
  if (prefix_) {
    m.prefix = prefix_->stats();
    m.prefix_lookups = m.prefix.lookups;
  }
  if (window_index_) m.window = window_index_->stats();
  if (offload_) {
    for (const TierStats& t : tier_stats().tiers) {
      m.tier_hit_blocks += t.hit_blocks;
      for (uint64_t miss : t.misses) m.tier_miss_blocks += miss;
    }
  }
  return m;
}

}  // namespace kvcache::engine
