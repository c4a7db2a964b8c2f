// PrefixCache: hash-chain lookup and publication over a PrefixCacheBackend.
//
// State (under one mutex): by_hash maps a cached chain hash to its block id;
// entries[block] holds the block's hash, chain parent and children, whether it
// starts a chain (then its unsalted first-block hash, to report salt misses)
// and the calibration it was encoded with (and, for the block completing a
// publisher's precision-window sinks, those sinks). evicted remembers recently evicted
// hashes (to report evicted misses). Invariants (CheckInvariants): by_hash and
// entries agree; a cached block's parent is cached and lists it as a child.
#include "kvcache/serving/prefix_cache.h"

#include <algorithm>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>
#include <xxhash.h>

#include "kvcache/cache.h"

namespace kvcache {
namespace {

constexpr uint64_t kSaltSeed = 0x6b76636163686531ull;
constexpr uint32_t kNoParent = UINT32_MAX;

void PutLe64(uint64_t v, unsigned char* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));
}

}  // namespace

BlockHash ChainRoot(std::string_view salt) {
  if (salt.empty()) return BlockHash{};
  const XXH128_hash_t h = XXH3_128bits_withSeed(salt.data(), salt.size(), kSaltSeed);
  return BlockHash{h.low64, h.high64};
}

BlockHash ChainHash(const BlockHash& parent, std::span<const TokenId> tokens) {
  constexpr size_t kStackTokens = 256;
  unsigned char stack[16 + 4 * kStackTokens];
  std::vector<unsigned char> heap;
  unsigned char* buf = stack;
  const size_t bytes = 16 + 4 * tokens.size();
  if (tokens.size() > kStackTokens) {
    heap.resize(bytes);
    buf = heap.data();
  }
  PutLe64(parent.lo, buf);
  PutLe64(parent.hi, buf + 8);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const TokenId t = tokens[i];
    unsigned char* p = buf + 16 + 4 * i;
    p[0] = static_cast<unsigned char>(t);
    p[1] = static_cast<unsigned char>(t >> 8);
    p[2] = static_cast<unsigned char>(t >> 16);
    p[3] = static_cast<unsigned char>(t >> 24);
  }
  const XXH128_hash_t h = XXH3_128bits(buf, bytes);
  return BlockHash{h.low64, h.high64};
}

std::vector<BlockHash> HashFullBlocks(std::span<const TokenId> tokens, uint32_t block_size,
                                      std::string_view salt) {
  std::vector<BlockHash> out;
  if (block_size == 0) return out;
  const size_t n = tokens.size() / block_size;
  out.reserve(n);
  BlockHash h = ChainRoot(salt);
  for (size_t i = 0; i < n; ++i) {
    h = ChainHash(h, tokens.subspan(i * block_size, block_size));
    out.push_back(h);
  }
  return out;
}

std::string_view MissReasonName(MissReason reason) {
  switch (reason) {
    case MissReason::kNotCached: return "not_cached";
    case MissReason::kEvicted: return "evicted";
    case MissReason::kSalt: return "salt";
    case MissReason::kPartialBlock: return "partial_block";
  }
  return "unknown";
}

struct PrefixCache::State {
  struct Entry {
    bool cached = false;
    bool first = false;  // starts a chain
    BlockHash hash;
    BlockHash first_unsalted;  // valid iff first
    uint32_t parent = kNoParent;
    std::vector<uint32_t> children;
    std::shared_ptr<const Calibration> calibration;
    std::shared_ptr<const WindowSinks> sinks;  // the window sinks it completes, or null
  };

  State(uint32_t num_blocks, uint32_t bs, const PrefixCacheOptions& o)
      : options(o), block_size(bs), entries(num_blocks) {}

  PrefixCacheOptions options;
  uint32_t block_size;
  mutable std::mutex mu;
  std::vector<Entry> entries;  // [num_blocks]
  std::unordered_map<BlockHash, uint32_t, BlockHashHasher> by_hash;
  std::unordered_map<BlockHash, uint32_t, BlockHashHasher> first_blocks;  // unsalted -> count
  std::deque<BlockHash> evicted_fifo;
  std::unordered_set<BlockHash, BlockHashHasher> evicted;
  PrefixCacheStats stats;

  void RememberEvicted(const BlockHash& h) {
    if (options.evicted_history == 0) return;
    if (evicted.insert(h).second) evicted_fifo.push_back(h);
    while (evicted_fifo.size() > options.evicted_history) {
      evicted.erase(evicted_fifo.front());
      evicted_fifo.pop_front();
    }
  }

  void Insert(uint32_t block, const BlockHash& h, uint32_t parent, const BlockHash* unsalted,
              std::shared_ptr<const Calibration> calibration) {
    Entry& e = entries[block];
    e = Entry{};
    e.cached = true;
    e.hash = h;
    e.parent = parent;
    e.calibration = std::move(calibration);
    if (parent != kNoParent) entries[parent].children.push_back(block);
    if (unsalted != nullptr) {
      e.first = true;
      e.first_unsalted = *unsalted;
      ++first_blocks[*unsalted];
    }
    by_hash.emplace(h, block);
    evicted.erase(h);  // its FIFO slot goes stale; erasing it again later is harmless
  }

  // Undoes Insert(block, ...) when `block` is the newest of its chain (its
  // parent's last child, no children of its own): un-named in the pool,
  // and not remembered as evicted.
  void Uninsert(uint32_t block, PrefixCacheBackend* backend) {
    (void)backend->ClearBlockHash(block);
    Entry& e = entries[block];
    if (e.parent != kNoParent) entries[e.parent].children.pop_back();
    if (e.first) {
      auto it = first_blocks.find(e.first_unsalted);
      if (--it->second == 0) first_blocks.erase(it);
    }
    by_hash.erase(e.hash);
    e = Entry{};
  }

  // Forgets `block` and, first, every cached descendant; descendants are also
  // un-named in the pool (they can never be found again). Appends nothing.
  void Forget(uint32_t block, PrefixCacheBackend* backend, bool is_orphan) {
    Entry& e = entries[block];
    while (!e.children.empty()) {
      const uint32_t child = e.children.back();
      Forget(child, backend, /*is_orphan=*/true);
    }
    if (is_orphan) {
      (void)backend->ClearBlockHash(block);
      ++stats.orphans_dropped;
    }
    if (e.parent != kNoParent) {
      auto& siblings = entries[e.parent].children;
      siblings.erase(std::find(siblings.begin(), siblings.end(), block));
    }
    if (e.first) {
      auto it = first_blocks.find(e.first_unsalted);
      if (--it->second == 0) first_blocks.erase(it);
    }
    by_hash.erase(e.hash);
    RememberEvicted(e.hash);
    e = Entry{};
  }
};

PrefixCache::PrefixCache(std::unique_ptr<PrefixCacheBackend> backend,
                         const PrefixCacheOptions& options)
    : backend_(std::move(backend)),
      state_(std::make_unique<State>(backend_->num_blocks(), backend_->block_size(), options)) {}

PrefixCache::~PrefixCache() { backend_->SetEvictionListener(nullptr); }

Result<std::unique_ptr<PrefixCache>> PrefixCache::Create(
    std::unique_ptr<PrefixCacheBackend> backend, const PrefixCacheOptions& options) {
  if (backend == nullptr) return Status::InvalidArgument("prefix cache: backend is null");
  if (backend->block_size() == 0) return Status::InvalidArgument("prefix cache: block_size is 0");
  std::unique_ptr<PrefixCache> cache(new PrefixCache(std::move(backend), options));
  PrefixCache* raw = cache.get();
  raw->backend_->SetEvictionListener(
      [raw](std::span<const EvictedBlock> evicted) { raw->OnEvicted(evicted); });
  return cache;
}

uint32_t PrefixCache::block_size() const { return state_->block_size; }

PrefixMatch PrefixCache::Peek(std::span<const TokenId> tokens, std::string_view salt) const {
  const std::vector<BlockHash> hashes = HashFullBlocks(tokens, block_size(), salt);
  const State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  PrefixMatch m;
  for (const BlockHash& h : hashes) {
    auto it = s.by_hash.find(h);
    if (it == s.by_hash.end()) break;
    m.blocks.push_back(it->second);
    m.calibration = s.entries[it->second].calibration;
    if (!m.sinks) m.sinks = s.entries[it->second].sinks;
  }
  m.num_tokens = m.blocks.size() * s.block_size;
  return m;
}

PrefixMatch PrefixCache::Acquire(std::span<const TokenId> tokens, std::string_view salt) {
  const uint32_t bs = block_size();
  const std::vector<BlockHash> hashes = HashFullBlocks(tokens, bs, salt);
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  PrefixMatch m;
  for (const BlockHash& h : hashes) {
    auto it = s.by_hash.find(h);
    if (it == s.by_hash.end()) break;
    // False if the pool evicted it and its listener has not told us yet.
    if (!backend_->RetainCached(it->second, h.lo)) break;
    m.blocks.push_back(it->second);
    m.calibration = s.entries[it->second].calibration;
    if (!m.sinks) m.sinks = s.entries[it->second].sinks;
  }
  m.num_tokens = m.blocks.size() * bs;

  PrefixCacheStats& st = s.stats;
  ++st.lookups;
  st.lookup_tokens += tokens.size();
  st.hit_tokens += m.num_tokens;
  if (m.blocks.size() < hashes.size()) {
    const BlockHash& missing = hashes[m.blocks.size()];
    MissReason reason = MissReason::kNotCached;
    if (s.evicted.count(missing) || s.by_hash.count(missing)) {
      reason = MissReason::kEvicted;  // (by_hash: evicted, listener pending)
    } else if (m.blocks.empty()) {
      const BlockHash unsalted = salt.empty() ? missing : ChainHash(BlockHash{}, tokens.first(bs));
      // Our own namespace missed, so any cached copy is under another salt.
      if (s.first_blocks.count(unsalted)) reason = MissReason::kSalt;
    }
    ++st.miss_lookups[static_cast<size_t>(reason)];
    st.miss_tokens[static_cast<size_t>(reason)] += (hashes.size() - m.blocks.size()) * bs;
  }
  if (const size_t partial = tokens.size() % bs; partial > 0) {
    ++st.miss_lookups[static_cast<size_t>(MissReason::kPartialBlock)];
    st.miss_tokens[static_cast<size_t>(MissReason::kPartialBlock)] += partial;
  }
  return m;
}

Result<size_t> PrefixCache::Publish(std::span<const TokenId> tokens,
                                    std::span<const uint32_t> blocks, std::string_view salt,
                                    std::shared_ptr<const Calibration> calibration,
                                    const SetHashFn& set_hash,
                                    std::shared_ptr<const WindowSinks> sinks) {
  const uint32_t bs = block_size();
  const size_t n_full = tokens.size() / bs;
  if (blocks.size() < n_full) {
    return Status::InvalidArgument(fmt::format(
        "prefix cache: publish of {} full blocks given {} block ids", n_full, blocks.size()));
  }
  const std::vector<BlockHash> hashes = HashFullBlocks(tokens, bs, salt);
  const uint64_t before = stats().published_blocks;
  KV_RETURN_IF_ERROR(PublishHashed(hashes, blocks, 0, tokens.first(std::min<size_t>(bs, tokens.size())),
                                   salt, std::move(calibration), set_hash, std::move(sinks))
                         .status());
  return static_cast<size_t>(stats().published_blocks - before);
}

Result<size_t> PrefixCache::PublishHashed(std::span<const BlockHash> hashes,
                                          std::span<const uint32_t> blocks, size_t start,
                                          std::span<const TokenId> first_block,
                                          std::string_view salt,
                                          std::shared_ptr<const Calibration> calibration,
                                          const SetHashFn& set_hash,
                                          std::shared_ptr<const WindowSinks> sinks) {
  const uint32_t bs = block_size();
  State& s = *state_;
  if (sinks) KV_RETURN_IF_ERROR(sinks->Check());
  // The block the sinks are kept with: the one holding their last position.
  const size_t sink_block = sinks ? sinks->block(bs) : SIZE_MAX;
  const size_t n_full = hashes.size();
  if (blocks.size() < n_full || start > n_full) {
    return Status::InvalidArgument(fmt::format(
        "prefix cache: publish of {} hashes from {} given {} block ids", n_full, start, blocks.size()));
  }
  if (n_full > 0 && first_block.size() != bs) {
    return Status::InvalidArgument("prefix cache: publish needs the first block's tokens");
  }
  for (size_t i = start; i < n_full; ++i) {
    if (blocks[i] >= s.entries.size()) {
      return Status::InvalidArgument(
          fmt::format("prefix cache: block id {} out of range", blocks[i]));
    }
  }

  std::lock_guard<std::mutex> lock(s.mu);
  auto cached_as = [&](size_t i) {
    auto it = s.by_hash.find(hashes[i]);
    return it != s.by_hash.end() && it->second == blocks[i];
  };
  if (start > 0 && !cached_as(start - 1)) return size_t{0};
  size_t i = start;
  for (; i < n_full; ++i) {
    auto it = s.by_hash.find(hashes[i]);
    if (it == s.by_hash.end()) break;
    if (it->second != blocks[i]) return i;  // a duplicate chain: leave the rest private
  }
  const size_t first_new = i;
  for (size_t j = first_new; j < n_full; ++j) {
    State::Entry& e = s.entries[blocks[j]];
    if (e.cached && backend_->block_hash(blocks[j]) != e.hash.lo) {
      // Evicted and reused; the pool's listener has not told us yet.
      s.Forget(blocks[j], backend_.get(), /*is_orphan=*/false);
      ++s.stats.evictions;
    }
    if (e.cached) {
      return Status::InvalidArgument(fmt::format(
          "prefix cache: block {} is cached with other tokens (wrong tokens or table?)",
          blocks[j]));
    }
  }
  size_t published = 0;
  Status status;
  for (; i < n_full; ++i) {
    if (s.by_hash.count(hashes[i])) break;  // cached elsewhere: stop here
    status = set_hash ? set_hash(i, hashes[i].lo) : backend_->SetBlockHash(blocks[i], hashes[i].lo);
    if (!status.ok()) break;
    BlockHash unsalted;
    if (i == 0) unsalted = salt.empty() ? hashes[0] : ChainHash(BlockHash{}, first_block);
    s.Insert(blocks[i], hashes[i], i == 0 ? kNoParent : blocks[i - 1], i == 0 ? &unsalted : nullptr,
             calibration);
    if (i == sink_block) s.entries[blocks[i]].sinks = sinks;
    ++published;
  }
  if (!status.ok()) {
    // Undo this call's blocks, tail first, so nothing changed.
    for (size_t j = first_new + published; j-- > first_new;) s.Uninsert(blocks[j], backend_.get());
    return status;
  }
  s.stats.published_blocks += published;
  return first_new + published;
}

void PrefixCache::OnEvicted(std::span<const EvictedBlock> evicted) {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  for (const EvictedBlock& ev : evicted) {
    if (ev.block >= s.entries.size()) continue;
    const State::Entry& e = s.entries[ev.block];
    if (!e.cached || e.hash.lo != ev.hash) continue;  // not ours, or already forgotten
    s.Forget(ev.block, backend_.get(), /*is_orphan=*/false);
    ++s.stats.evictions;
  }
}

size_t PrefixCache::num_cached_blocks() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->by_hash.size();
}

bool PrefixCache::IsCached(uint32_t block) const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return block < state_->entries.size() && state_->entries[block].cached;
}

PrefixCacheStats PrefixCache::stats() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->stats;
}

void PrefixCache::ResetStats() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->stats = PrefixCacheStats{};
}

std::string PrefixCache::CheckInvariants() const {
  const State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  size_t cached = 0;
  std::unordered_map<BlockHash, uint32_t, BlockHashHasher> firsts;
  for (uint32_t b = 0; b < s.entries.size(); ++b) {
    const State::Entry& e = s.entries[b];
    if (!e.cached) {
      if (!e.children.empty()) return fmt::format("uncached block {} has children", b);
      continue;
    }
    ++cached;
    auto it = s.by_hash.find(e.hash);
    if (it == s.by_hash.end() || it->second != b) return fmt::format("block {} not in hash map", b);
    if (e.first != (e.parent == kNoParent)) return fmt::format("block {} first flag wrong", b);
    if (e.first) ++firsts[e.first_unsalted];
    if (e.parent != kNoParent) {
      const State::Entry& p = s.entries[e.parent];
      if (!p.cached) return fmt::format("block {} outlives its prefix block {}", b, e.parent);
      if (std::count(p.children.begin(), p.children.end(), b) != 1) {
        return fmt::format("block {} missing from its parent's children", b);
      }
    }
    for (uint32_t c : e.children) {
      if (!s.entries[c].cached || s.entries[c].parent != b) {
        return fmt::format("block {} lists a wrong child {}", b, c);
      }
    }
  }
  if (cached != s.by_hash.size()) {
    return fmt::format("{} hashes for {} cached blocks", s.by_hash.size(), cached);
  }
  if (firsts != s.first_blocks) return "first-block counts disagree";
  return "";
}

}  // namespace kvcache
