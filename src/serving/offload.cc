// OffloadCache (offload.h): write-through of published blocks to the tiers
// on a background thread, and verified, all-or-nothing loads of the longest
// contiguous prefix the tiers hold.
//
// Invariants: every queued job holds one pool reference on its block, given
// back by the writer once the block is encoded (or when the writer stops);
// `in_flight` counts jobs taken off the queue and not yet finished, so Flush
// returns only when every accepted store has reached every tier. Loaded
// bytes are written only into staging blocks Allocate just handed to this
// call, verified there (VerifyAndDecodeBlockObject: header checks first,
// then the payload checksummed from its copy), and the blocks are named in
// the prefix cache, i.e. readable by anyone else, only once verified; a
// block whose object failed is given back unnamed.
//
// Calibration: every queued job carries its chain's calibration and the
// digest its object names (unflagged when it is the compatibility digest's,
// `default_cal`). The writer stores a calibration object in a tier before
// any block that names it, and no such block where that store failed. A load
// reads the fetched objects' headers, ends the run where their calibrations
// disagree (with each other or with the pool's hit), and gets the run's
// calibration from `cals` (the recently published or verified ones) or from
// a tier, verified (digest recomputed) before any block of the run is used.
//
// Precision-window sinks: the job of the block that completes a publisher's
// sinks carries them and its object holds them (kBlockFlagSinks). A load
// takes them from the run's verified objects; an object whose sinks are not
// for its own place in the chain (S - 1 outside the block) is corrupt.
//
// Locks: mu_ guards the queue and the counters; it is never held while
// calling a tier, the pool or the prefix cache, except PrefixCache-free
// pool calls that cannot call back (Retain). Tiers have their own locks.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_set>

#include <fmt/format.h>

#include "kvcache/cache.h"
#include "kvcache/serving/offload.h"

namespace kvcache {
namespace {

constexpr size_t kLatencySamples = 8192;
constexpr size_t kKnownStored = 1 << 16;

constexpr size_t kKnownCalibrations = 16;

struct Job {
  uint32_t block;
  BlockHash chain, parent;
  bool first;  // the chain's first block (no parent key)
  std::vector<TokenId> tokens;
  std::shared_ptr<const Calibration> calibration;  // the chain's (null: none)
  bool flagged = false;    // the object names cal_digest (kBlockFlagCalibrated)
  BlockHash cal_digest{};  // CalibrationDigest, or zero for none
  std::shared_ptr<const WindowSinks> sinks;  // the window sinks this block completes, or null
};

struct Counters {
  TierStats s;
  std::vector<float> latency_us;  // ring of the last kLatencySamples Load calls
  size_t next_sample = 0;
  void AddLatency(double us) {
    if (latency_us.size() < kLatencySamples) {
      latency_us.push_back(static_cast<float>(us));
    } else {
      latency_us[next_sample] = static_cast<float>(us);
      next_sample = (next_sample + 1) % kLatencySamples;
    }
  }
};

double Percentile(std::vector<float> v, double q) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(q * double(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(k), v.end());
  return v[k];
}

// One Acquire's lookup in the tiers: chain blocks [i0, i0 + n), the ones
// after the pool's hit (j below counts from i0); or LoadBlocks' chain
// blocks index[0..n).
struct TierLookup {
  size_t i0 = 0, n = 0;
  std::vector<size_t> index;      // [n] chain index of each block; empty: i0 + j
  std::vector<BlockHash> hashes;  // chain hashes of blocks [0, i0 + n)
  BlockHash root;                 // ChainRoot(salt)
  std::vector<std::string> keys;  // [n] object keys
  std::vector<int> src;           // [n] the first tier that holds it, or -1
  std::vector<std::vector<std::optional<TierMiss>>> have;  // [tier][n]; empty: not asked
  std::vector<std::array<uint64_t, kNumTierMisses>> miss;  // [tier] misses to count
  std::vector<TierBlobPtr> objects;                        // [end of the run] fetched
  std::vector<std::vector<std::string>> erase;             // [tier] keys that failed
  size_t rejected = 0;  // blocks [0, rejected) already rejected (their calibration failed)
  bool pool_hit = false;  // the pool supplied blocks before these
  std::shared_ptr<const Calibration> pool_calibration;     // theirs
  std::shared_ptr<const Calibration> calibration;          // what the run's blocks carry
  std::shared_ptr<const WindowSinks> sinks;                // carried by a staged block, or null
  const BlockHash& Parent(size_t i) const { return i == 0 ? root : hashes[i - 1]; }
  size_t Chain(size_t j) const { return index.empty() ? i0 + j : index[j]; }
  // Block j of the run failed for `why`: counted, and erased from its tier.
  void Reject(size_t j, TierMiss why) {
    const size_t t = static_cast<size_t>(src[j]);
    ++miss[t][static_cast<size_t>(why)];
    erase[t].push_back(keys[j]);
  }
};

bool IsTransportMiss(TierMiss m) { return m == TierMiss::kTimeout || m == TierMiss::kUnavailable; }

}  // namespace

struct OffloadCache::State {
  std::shared_ptr<BlockPool> pool;
  PrefixCache* cache = nullptr;
  std::vector<std::shared_ptr<Tier>> tiers;
  OffloadOptions o;
  BlockHash compat;
  GeometryOptions geometry;
  BlockHash default_cal;  // o.calibration's digest (zero: none): what an unflagged block carries

  mutable std::mutex mu;
  std::condition_variable work_cv, idle_cv;
  std::deque<Job> queue;
  size_t in_flight = 0;
  bool stop = false;
  std::vector<Counters> counters;
  OffloadStats totals;  // the non-per-tier fields
  // Chains queued or loaded recently: not queued again (bounded FIFO).
  std::unordered_set<BlockHash, BlockHashHasher> known;
  std::deque<BlockHash> known_fifo;
  // Calibrations published or verified recently, with their digests (FIFO).
  std::deque<std::pair<BlockHash, std::shared_ptr<const Calibration>>> cals;
  std::thread writer;

  void Remember(const BlockHash& h) {  // REQUIRES mu
    if (!known.insert(h).second) return;
    known_fifo.push_back(h);
    while (known_fifo.size() > kKnownStored) {
      known.erase(known_fifo.front());
      known_fifo.pop_front();
    }
  }

  // The digest of `c` (zero for null). With `check`, InvalidArgument unless
  // the tiers can store it (CheckCalibration), and remembered with it.
  Result<BlockHash> DigestOf(const std::shared_ptr<const Calibration>& c, bool check);
  std::shared_ptr<const Calibration> Recall(const BlockHash& digest);
  void Keep(const BlockHash& digest, std::shared_ptr<const Calibration> c);

  void WriterLoop();
  void StoreBatch(std::vector<Job>& jobs);
  void StoreInTier(size_t t, std::span<const TierPut> cal_puts, std::span<const TierPut> puts);
  // The steps of Acquire past the pool's hit, in order (see Acquire).
  void FindHolders(TierLookup& l);
  size_t RunEnd(TierLookup& l);
  void Fetch(TierLookup& l, size_t end);
  size_t ResolveCalibration(TierLookup& l, size_t ok);
  CalibrationLoad FetchCalibration(TierLookup& l, const BlockHash& digest);
  std::vector<uint32_t> Stage(TierLookup& l, std::span<const TokenId> tokens);
  void Account(const TierLookup& l, size_t ok, std::vector<uint64_t>* served_by_tier);
  // Queues chain block i (tokens: its B tokens) for the tiers unless known
  // or the queue is full. REQUIRES the caller holds `block`. True if queued.
  bool Enqueue(const BlockHash& chain, const BlockHash& parent, bool first, uint32_t block,
               std::span<const TokenId> tokens, std::shared_ptr<const Calibration> calibration, bool flagged,
               const BlockHash& cal_digest, std::shared_ptr<const WindowSinks> sinks);
  // Block j of the lookup is missing: a miss for every tier asked for it.
  void CountMissing(TierLookup& l, size_t j) const {
    for (size_t t = 0; t < tiers.size(); ++t) {
      if (!l.have[t].empty() && l.have[t][j].has_value()) ++l.miss[t][static_cast<size_t>(*l.have[t][j])];
    }
  }
  void CountAllocFailure() {
    std::lock_guard<std::mutex> lock(mu);
    ++totals.load_alloc_failures;
  }
  // A sliding-window group's blocks need no parent in a tier's index.
  bool ParentLinked() const { return !o.group.has_value() || o.group->kind != LayerGroupKind::kSlidingWindow; }
};

void OffloadCache::State::WriterLoop() {
  std::unique_lock<std::mutex> lock(mu);
  for (;;) {
    work_cv.wait(lock, [&] { return stop || !queue.empty(); });
    if (stop) break;
    std::vector<Job> jobs;
    while (!queue.empty() && jobs.size() < o.store_batch) {
      jobs.push_back(std::move(queue.front()));
      queue.pop_front();
    }
    in_flight = jobs.size();
    lock.unlock();
    StoreBatch(jobs);
    lock.lock();
    in_flight = 0;
    idle_cv.notify_all();
  }
  // Stopping: give the queued blocks back.
  std::vector<uint32_t> refs;
  for (const Job& j : queue) refs.push_back(j.block);
  queue.clear();
  lock.unlock();
  if (!refs.empty()) (void)pool->Release(refs);
}

Result<BlockHash> OffloadCache::State::DigestOf(const std::shared_ptr<const Calibration>& c,
                                                bool check) {
  if (c == nullptr) return BlockHash{};
  {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& [d, known_cal] : cals) {
      if (known_cal == c) return d;  // checked when it was kept
    }
  }
  if (check) KV_RETURN_IF_ERROR(CheckCalibration(*c, geometry));
  const BlockHash d = CalibrationDigest(*c);
  if (check) Keep(d, c);  // `cals` holds only calibrations the tiers can store
  return d;
}

std::shared_ptr<const Calibration> OffloadCache::State::Recall(const BlockHash& digest) {
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& [d, c] : cals) {
    if (d == digest) return c;
  }
  return nullptr;
}

void OffloadCache::State::Keep(const BlockHash& digest, std::shared_ptr<const Calibration> c) {
  std::lock_guard<std::mutex> lock(mu);
  cals.emplace_back(digest, std::move(c));
  while (cals.size() > kKnownCalibrations) cals.pop_front();
}

// Encodes the batch (each calibration object once), then stores it tier by tier.
void OffloadCache::State::StoreBatch(std::vector<Job>& jobs) {
  std::vector<TierPut> puts, cal_puts;
  for (const Job& j : jobs) {
    std::optional<BlockHash> named;
    if (j.flagged) named = j.cal_digest;
    Result<std::vector<uint8_t>> obj =
        EncodeBlockObject(*pool, j.block, compat, j.chain, j.parent, j.tokens, named, j.sinks.get(), o.group);
    (void)pool->Release(std::span<const uint32_t>(&j.block, 1));
    if (!obj.ok()) continue;  // cannot happen for a block of this pool; nothing to store
    TierPut p;
    p.key = BlockKey(compat, j.chain);
    p.parent_key = j.first || !ParentLinked() ? std::string() : BlockKey(compat, j.parent);
    p.bytes = std::make_shared<const std::vector<uint8_t>>(std::move(*obj));
    if (j.flagged && j.calibration != nullptr) {
      p.calibration_key = CalibrationKey(compat, j.cal_digest);
      const bool have = std::any_of(cal_puts.begin(), cal_puts.end(),
                                    [&](const TierPut& c) { return c.key == p.calibration_key; });
      if (!have) {
        // Publish checked it (CheckCalibration): encoding cannot fail.
        Result<std::vector<uint8_t>> cal = EncodeCalibrationObject(*j.calibration, geometry, compat);
        if (!cal.ok()) continue;
        cal_puts.push_back({p.calibration_key, "", std::make_shared<const std::vector<uint8_t>>(std::move(*cal))});
      }
    }
    puts.push_back(std::move(p));
  }
  if (puts.empty()) return;
  for (size_t t = 0; t < tiers.size(); ++t) StoreInTier(t, cal_puts, puts);
}

// Stores in tier t what it lacks: the calibration objects first (one put
// each, so that a failed one is known), then the blocks, except those that
// name a calibration the tier neither held nor took.
void OffloadCache::State::StoreInTier(size_t t, std::span<const TierPut> cal_puts,
                                      std::span<const TierPut> puts) {
  std::vector<std::string> keys;
  for (const TierPut& c : cal_puts) keys.push_back(c.key);
  for (const TierPut& p : puts) keys.push_back(p.key);
  const std::vector<std::optional<TierMiss>> have = tiers[t]->Exists(keys);
  std::unordered_set<std::string> cal_held;
  uint64_t bytes = 0;
  for (size_t i = 0; i < cal_puts.size(); ++i) {
    if (!have[i].has_value() || tiers[t]->Store(cal_puts.subspan(i, 1)) == 1) {
      cal_held.insert(cal_puts[i].key);
      if (have[i].has_value()) bytes += cal_puts[i].bytes->size();
    }
  }
  std::vector<TierPut> missing;
  uint64_t missing_bytes = 0, dropped = 0;
  for (size_t i = 0; i < puts.size(); ++i) {
    if (!have[cal_puts.size() + i].has_value()) continue;  // held already
    if (!puts[i].calibration_key.empty() && cal_held.count(puts[i].calibration_key) == 0) {
      ++dropped;  // its calibration is not in this tier: the block could not be decoded
      continue;
    }
    missing_bytes += puts[i].bytes->size();
    missing.push_back(puts[i]);
  }
  const size_t stored = missing.empty() ? 0 : tiers[t]->Store(missing);
  // A partial store does not say which: count the average object.
  bytes += stored == missing.size() ? missing_bytes
                                    : stored * (missing_bytes / std::max<size_t>(missing.size(), 1));
  std::lock_guard<std::mutex> lock(mu);
  TierStats& s = counters[t].s;
  s.stored_blocks += stored;
  s.bytes_stored += bytes;
  s.dropped_stores += missing.size() - stored + dropped;
}

OffloadCache::OffloadCache(std::unique_ptr<State> state) : state_(std::move(state)) {}

OffloadCache::~OffloadCache() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
  }
  state_->work_cv.notify_all();
  if (state_->writer.joinable()) state_->writer.join();
}

Result<std::unique_ptr<OffloadCache>> OffloadCache::Create(std::shared_ptr<BlockPool> pool,
                                                           PrefixCache* cache,
                                                           std::vector<std::shared_ptr<Tier>> tiers,
                                                           const OffloadOptions& options) {
  if (pool == nullptr) return Status::InvalidArgument("offload: null pool");
  if (cache != nullptr && cache->block_size() != pool->block_size()) {
    return Status::InvalidArgument("offload: the prefix cache is not over this pool");
  }
  for (const auto& t : tiers) {
    if (t == nullptr) return Status::InvalidArgument("offload: null tier");
  }
  if (options.queue_blocks == 0 || options.store_batch == 0) {
    return Status::InvalidArgument("offload: queue_blocks and store_batch must be > 0");
  }
  if (options.group.has_value() && !options.group->whole()) {
    return Status::InvalidArgument("offload: a layer group's window must be > 0 exactly for a sliding window");
  }
  auto st = std::make_unique<State>();
  st->pool = std::move(pool);
  st->cache = cache;
  st->tiers = std::move(tiers);
  st->o = options;
  BlockCompat c;
  c.model = options.model;
  const Geometry& g = st->pool->geometry();
  c.geometry = {g.n_layers(), g.n_kv_heads(), g.head_dim(), g.block_size()};
  c.formats = st->pool->formats();
  c.rotation = RotationDigest(*st->pool);
  c.group = options.group;
  st->geometry = c.geometry;
  if (options.calibration != nullptr) {
    KV_RETURN_IF_ERROR(CheckCalibration(*options.calibration, c.geometry));
    c.calibration = CalibrationDigest(*options.calibration);
    st->cals.emplace_back(c.calibration, options.calibration);
  }
  st->default_cal = c.calibration;
  st->compat = CompatDigest(c);
  st->counters.resize(st->tiers.size());
  for (size_t t = 0; t < st->tiers.size(); ++t) st->counters[t].s.name = st->tiers[t]->name();
  State* raw = st.get();
  std::unique_ptr<OffloadCache> out(new OffloadCache(std::move(st)));
  if (!raw->tiers.empty()) raw->writer = std::thread([raw] { raw->WriterLoop(); });
  return out;
}

const BlockHash& OffloadCache::compat_digest() const { return state_->compat; }

Result<size_t> OffloadCache::Publish(std::span<const BlockHash> hashes,
                                     std::span<const uint32_t> blocks, size_t start,
                                     std::span<const TokenId> tokens, std::string_view salt,
                                     std::shared_ptr<const Calibration> calibration,
                                     const PrefixCache::SetHashFn& set_hash,
                                     std::shared_ptr<const WindowSinks> sinks) {
  State& st = *state_;
  const uint32_t B = st.pool->block_size();
  if (st.cache == nullptr) {
    return Status::FailedPrecondition("offload: this pool's blocks are named by their holder (OffloadBlock)");
  }
  if (tokens.size() < hashes.size() * B) {
    return Status::InvalidArgument("offload: fewer tokens than the blocks being published");
  }
  if (sinks) KV_RETURN_IF_ERROR(sinks->CheckFits(st.pool->geometry()));
  // A calibration the tiers could not store is refused before anything is
  // published (a sequence's own always fits its pool's geometry).
  BlockHash cal_digest{};
  if (!st.tiers.empty()) {
    KV_ASSIGN_OR_RETURN(cal_digest, st.DigestOf(calibration, /*check=*/true));
  }
  KV_ASSIGN_OR_RETURN(const size_t end,
                      st.cache->PublishHashed(hashes, blocks, start, tokens.first(std::min<size_t>(B, tokens.size())), salt,
                                              calibration, set_hash, sinks));
  if (st.tiers.empty() || end <= start) return end;
  const size_t sink_block = sinks ? sinks->block(B) : SIZE_MAX;
  const bool flagged = !(cal_digest == st.default_cal);
  const BlockHash root = ChainRoot(salt);
  for (size_t i = start; i < end; ++i) {
    st.Enqueue(hashes[i], i == 0 ? root : hashes[i - 1], i == 0, blocks[i], tokens.subspan(i * B, B), calibration,
               flagged, cal_digest, i == sink_block ? sinks : nullptr);
  }
  return end;
}

bool OffloadCache::State::Enqueue(const BlockHash& chain, const BlockHash& parent, bool first, uint32_t block,
                                  std::span<const TokenId> tokens, std::shared_ptr<const Calibration> calibration,
                                  bool flagged, const BlockHash& cal_digest,
                                  std::shared_ptr<const WindowSinks> sinks) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (known.count(chain) != 0) return false;
    if (queue.size() >= o.queue_blocks) {
      ++totals.dropped_queue_full;
      return false;
    }
  }
  // The caller holds the block: Retain cannot fail on it.
  if (!pool->Retain(std::span<const uint32_t>(&block, 1)).ok()) return false;
  Job j{block, chain, parent, first, std::vector<TokenId>(tokens.begin(), tokens.end()), std::move(calibration),
        flagged, cal_digest, std::move(sinks)};
  {
    std::lock_guard<std::mutex> lock(mu);
    queue.push_back(std::move(j));
    Remember(chain);
    ++totals.queued_blocks;
  }
  work_cv.notify_one();
  return true;
}

Status OffloadCache::OffloadBlock(std::span<const BlockHash> hashes, size_t index, uint32_t block,
                                  std::span<const TokenId> tokens, std::string_view salt,
                                  std::shared_ptr<const Calibration> calibration) {
  State& st = *state_;
  const uint32_t B = st.pool->block_size();
  if (index >= hashes.size() || (index + 1) * B > tokens.size()) {
    return Status::InvalidArgument(fmt::format("offload: block {} of a chain of {} hashes and {} tokens", index,
                                               hashes.size(), tokens.size()));
  }
  if (st.tiers.empty()) return Status::Ok();
  KV_ASSIGN_OR_RETURN(const BlockHash cal_digest, st.DigestOf(calibration, /*check=*/true));
  st.Enqueue(hashes[index], index == 0 ? ChainRoot(salt) : hashes[index - 1], index == 0, block,
             tokens.subspan(index * B, B), calibration, !(cal_digest == st.default_cal), cal_digest, nullptr);
  return Status::Ok();
}

Result<OffloadCache::LoadedBlocks> OffloadCache::LoadBlocks(std::span<const BlockHash> hashes,
                                                            std::span<const size_t> indices,
                                                            std::span<const TokenId> tokens, std::string_view salt) {
  State& st = *state_;
  const uint32_t B = st.pool->block_size();
  const size_t T = st.tiers.size();
  for (size_t j = 0; j < indices.size(); ++j) {
    if (indices[j] >= hashes.size() || (indices[j] + 1) * B > tokens.size() || (j > 0 && indices[j] <= indices[j - 1])) {
      return Status::InvalidArgument("offload: LoadBlocks needs ascending chain indices within the hashes and tokens");
    }
  }
  LoadedBlocks out;
  if (indices.empty()) return out;
  if (T == 0) return Status::NotFound("offload: no tiers");
  TierLookup l;
  l.n = indices.size();
  l.index.assign(indices.begin(), indices.end());
  l.hashes.assign(hashes.begin(), hashes.end());
  l.root = ChainRoot(salt);
  for (const size_t i : indices) l.keys.push_back(BlockKey(st.compat, hashes[i]));
  st.FindHolders(l);
  l.miss.assign(T, {});
  l.erase.assign(T, {});
  auto miss = [&](std::string what) -> Status {
    for (size_t t = 0; t < T; ++t) {
      if (!l.erase[t].empty()) st.tiers[t]->Erase(l.erase[t]);
    }
    st.Account(l, 0, nullptr);
    return Status::NotFound("offload: " + what);
  };
  for (size_t j = 0; j < l.n; ++j) {
    if (l.src[j] >= 0) continue;
    st.CountMissing(l, j);
    return miss(fmt::format("no tier holds block {} of the run", indices[j]));
  }
  if (l.n > st.pool->num_available_blocks()) {
    st.CountAllocFailure();
    st.Account(l, 0, nullptr);
    return Status::PoolExhausted(fmt::format("offload: {} blocks to load, {} available", l.n,
                                             st.pool->num_available_blocks()));
  }
  st.Fetch(l, l.n);
  for (size_t j = 0; j < l.n; ++j) {
    if (l.objects[j] == nullptr) return miss(fmt::format("block {} of the run did not load", indices[j]));
  }
  if (st.ResolveCalibration(l, l.n) < l.n) return miss("the run's blocks carry no one calibration");
  out.calibration = l.calibration;
  out.blocks.resize(l.n);
  if (!st.pool->Allocate(out.blocks).ok()) {
    st.CountAllocFailure();
    st.Account(l, 0, nullptr);
    return Status::PoolExhausted("offload: no room to stage the run");
  }
  for (size_t j = 0; j < l.n; ++j) {
    const size_t i = l.Chain(j);
    std::optional<TierMiss> why =
        VerifyAndDecodeBlockObject(*l.objects[j], st.compat, hashes[i], l.Parent(i), tokens.subspan(i * B, B),
                                   *st.pool, out.blocks[j], nullptr, st.o.group);
    if (why.has_value()) {
      l.Reject(j, *why);
      std::vector<uint32_t> back(out.blocks.rbegin(), out.blocks.rend());
      (void)st.pool->Release(back);
      return miss(fmt::format("block {} of the run failed verification ({})", i, TierMissName(*why)));
    }
  }
  st.Account(l, l.n, nullptr);
  return out;
}

// Which tier holds each looked-up block: the first that says it has it (one
// batched Exists per tier, asking only for the blocks no earlier tier holds).
void OffloadCache::State::FindHolders(TierLookup& l) {
  const size_t T = tiers.size();
  l.src.assign(l.n, -1);
  l.have.assign(T, {});
  for (size_t t = 0; t < T; ++t) {
    std::vector<std::string> ask;
    std::vector<size_t> pos;
    for (size_t j = 0; j < l.n; ++j) {
      if (l.src[j] < 0) {
        ask.push_back(l.keys[j]);
        pos.push_back(j);
      }
    }
    if (ask.empty()) break;
    const std::vector<std::optional<TierMiss>> got = tiers[t]->Exists(ask);
    l.have[t].assign(l.n, std::nullopt);
    for (size_t k = 0; k < pos.size(); ++k) {
      if (!got[k].has_value()) l.src[pos[k]] = static_cast<int>(t);
      l.have[t][pos[k]] = got[k].has_value() ? got[k] : std::nullopt;
    }
    std::lock_guard<std::mutex> lock(mu);
    ++counters[t].s.lookups;
  }
}

// The contiguous run some tier holds, no longer than the pool could take
// now: bytes fetched for blocks that then cannot be allocated are wasted
// (and a waiting request asks again). The block that ends the run is a miss
// for every tier that was asked for it.
size_t OffloadCache::State::RunEnd(TierLookup& l) {
  size_t end = 0;
  while (end < l.n && l.src[end] >= 0) ++end;
  const size_t room = pool->num_available_blocks();
  if (end > room) {
    CountAllocFailure();
    end = room;
  }
  l.miss.assign(tiers.size(), {});
  if (end < l.n) CountMissing(l, end);
  return end;
}

// Loads blocks [0, end) of the run, one batched Load per tier.
void OffloadCache::State::Fetch(TierLookup& l, size_t end) {
  l.objects.assign(end, nullptr);
  for (size_t t = 0; t < tiers.size() && end > 0; ++t) {
    std::vector<std::string> ask;
    std::vector<size_t> pos;
    for (size_t j = 0; j < end; ++j) {
      if (l.src[j] == static_cast<int>(t)) {
        ask.push_back(l.keys[j]);
        pos.push_back(j);
      }
    }
    if (ask.empty()) continue;
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<TierGet> got = tiers[t]->Load(ask);
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    uint64_t bytes = 0;
    for (size_t k = 0; k < pos.size(); ++k) {
      if (got[k].bytes == nullptr) {
        ++l.miss[t][static_cast<size_t>(got[k].miss)];
        continue;
      }
      bytes += got[k].bytes->size();
      l.objects[pos[k]] = std::move(got[k].bytes);
    }
    std::lock_guard<std::mutex> lock(mu);
    counters[t].s.bytes_loaded += bytes;
    counters[t].AddLatency(us);
  }
}

// The calibration the first `ok` fetched blocks carry (l.calibration), and
// how many of them carry it: the run ends at the first block whose header
// names another calibration than the pool's hit (or, without one, than the
// run's first block): a kIncompatible miss, not erased. An object whose
// header does not parse is left to the verification, which rejects it. If
// the run's calibration cannot be had verified, no block of it is used:
// each is rejected (counted, erased) as a block no tier can decode, or, for
// a timeout or an unreachable tier, counted once and kept.
size_t OffloadCache::State::ResolveCalibration(TierLookup& l, size_t ok) {
  BlockHash want{};
  bool have_want = false;
  if (l.pool_hit) {
    want = *DigestOf(l.pool_calibration, /*check=*/false);
    have_want = true;
  }
  for (size_t j = 0; j < ok; ++j) {
    const Result<BlockObjectInfo> info = ParseBlockObjectHeader(*l.objects[j], l.objects[j]->size());
    if (!info.ok()) break;
    const BlockHash d = info->calibrated ? info->calibration : default_cal;
    if (!have_want) {
      want = d;
      have_want = true;
    } else if (!(d == want)) {
      ++l.miss[static_cast<size_t>(l.src[j])][static_cast<size_t>(TierMiss::kIncompatible)];
      ok = j;
      break;
    }
  }
  if (l.pool_hit || ok == 0) {
    l.calibration = l.pool_calibration;
    return ok;
  }
  if (want == BlockHash{}) return ok;  // l.calibration stays null: none
  if (want == default_cal) {
    l.calibration = o.calibration;
    return ok;
  }
  CalibrationLoad c = FetchCalibration(l, want);
  if (c.calibration != nullptr) {
    l.calibration = std::move(c.calibration);
    return ok;
  }
  if (IsTransportMiss(c.miss)) {
    ++l.miss[static_cast<size_t>(l.src[0])][static_cast<size_t>(c.miss)];
  } else {
    for (size_t j = 0; j < ok; ++j) l.Reject(j, c.miss);
    l.rejected = ok;
  }
  return 0;
}

// The calibration `digest` names: a recent one, or its object from the
// tiers (the first block's tier first, then the others in order), verified
// (DecodeCalibrationObject). A failed object is counted and erased from its
// tier. On failure the miss: that of an object that failed (kCorrupt,
// kIncompatible), else a transport miss, else kIncompatible (no tier holds
// it: the blocks cannot be decoded).
CalibrationLoad OffloadCache::State::FetchCalibration(TierLookup& l, const BlockHash& digest) {
  CalibrationLoad out;
  out.calibration = Recall(digest);
  if (out.calibration != nullptr) return out;
  const std::string key = CalibrationKey(compat, digest);
  std::optional<TierMiss> failed, transport;
  std::vector<size_t> order{static_cast<size_t>(l.src[0])};
  for (size_t t = 0; t < tiers.size(); ++t) {
    if (t != order[0]) order.push_back(t);
  }
  for (const size_t t : order) {
    std::vector<TierGet> got = tiers[t]->Load(std::span<const std::string>(&key, 1));
    if (got[0].bytes == nullptr) {
      if (IsTransportMiss(got[0].miss)) transport = got[0].miss;
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      counters[t].s.bytes_loaded += got[0].bytes->size();
    }
    CalibrationLoad c = DecodeCalibrationObject(*got[0].bytes, compat, digest, geometry);
    if (c.calibration != nullptr) {
      Keep(digest, c.calibration);
      return c;
    }
    ++l.miss[t][static_cast<size_t>(c.miss)];
    l.erase[t].push_back(key);
    if (!failed.has_value() || c.miss == TierMiss::kCorrupt) failed = c.miss;
  }
  out.miss = failed.value_or(transport.value_or(TierMiss::kIncompatible));
  return out;
}

// Staging blocks for the fetched run (all or nothing): nobody else can read
// them until they are named. Each object is verified and copied into its
// block in one pass (VerifyAndDecodeBlockObject); the first that fails ends
// the prefix and its block and the later ones are given back. Objects after
// the one that ended the prefix (or all of them, when the staging blocks
// could not be allocated) are not used, but a failing one is still counted
// and erased from its tier. Returns the verified blocks, chain order.
std::vector<uint32_t> OffloadCache::State::Stage(TierLookup& l, std::span<const TokenId> tokens) {
  const uint32_t B = pool->block_size();
  const size_t end = l.objects.size();
  size_t ok = 0;
  while (ok < end && l.objects[ok] != nullptr) ++ok;
  l.erase.assign(tiers.size(), {});
  ok = ResolveCalibration(l, ok);
  std::vector<uint32_t> fresh(ok);
  if (ok > 0 && !pool->Allocate(fresh).ok()) {
    CountAllocFailure();
    ok = 0;
    fresh.clear();
  }
  size_t good = 0;
  for (; good < ok; ++good) {
    const size_t i = l.Chain(good);
    std::shared_ptr<const WindowSinks> sinks;
    std::optional<TierMiss> why = VerifyAndDecodeBlockObject(
        *l.objects[good], compat, l.hashes[i], l.Parent(i), tokens.subspan(i * B, B), *pool, fresh[good],
        &sinks, o.group);
    // Sinks are kept with the block holding their last position, nowhere else.
    if (!why.has_value() && sinks && sinks->block(B) != i) why = TierMiss::kCorrupt;
    if (why.has_value()) {
      l.Reject(good, *why);
      break;
    }
    if (sinks && !l.sinks) l.sinks = std::move(sinks);
  }
  for (size_t j = std::max(good < ok ? good + 1 : good, l.rejected); j < end; ++j) {
    if (l.objects[j] == nullptr) continue;
    const size_t i = l.Chain(j);
    const std::optional<TierMiss> why =
        VerifyBlockObject(*l.objects[j], compat, l.hashes[i], l.Parent(i), tokens.subspan(i * B, B), o.group);
    if (why.has_value()) l.Reject(j, *why);
  }
  if (good < ok) {
    (void)pool->Release(std::span<const uint32_t>(fresh.data() + good, ok - good));
    fresh.resize(good);
  }
  for (size_t t = 0; t < tiers.size(); ++t) {
    if (!l.erase[t].empty()) tiers[t]->Erase(l.erase[t]);
  }
  return fresh;
}

// Adds the lookup's misses and the `ok` blocks it supplied to the counters.
void OffloadCache::State::Account(const TierLookup& l, size_t ok,
                                  std::vector<uint64_t>* served_by_tier) {
  const uint32_t B = pool->block_size();
  std::lock_guard<std::mutex> lock(mu);
  for (size_t t = 0; t < tiers.size(); ++t) {
    for (size_t r = 0; r < kNumTierMisses; ++r) counters[t].s.misses[r] += l.miss[t][r];
  }
  for (size_t j = 0; j < ok; ++j) {
    const size_t t = static_cast<size_t>(l.src[j]);
    TierStats& s = counters[t].s;
    ++s.hit_blocks;
    s.hit_tokens += B;
    if (served_by_tier != nullptr) (*served_by_tier)[1 + t] += B;
    Remember(l.hashes[l.Chain(j)]);
  }
}

PrefixMatch OffloadCache::Acquire(std::span<const TokenId> tokens, std::string_view salt,
                                  std::vector<uint64_t>* served_by_tier) {
  State& st = *state_;
  const size_t T = st.tiers.size();
  if (served_by_tier != nullptr) served_by_tier->assign(T + 1, 0);
  if (st.cache == nullptr) return PrefixMatch{};
  PrefixMatch m = st.cache->Acquire(tokens, salt);
  if (served_by_tier != nullptr) (*served_by_tier)[0] = m.num_tokens;
  const uint32_t B = st.pool->block_size();
  const size_t full = tokens.size() / B;
  if (T == 0 || m.blocks.size() >= full) return m;
  TierLookup l;
  l.i0 = m.blocks.size();
  l.pool_hit = !m.blocks.empty();
  l.pool_calibration = m.calibration;
  l.n = std::min<size_t>(full - l.i0, st.o.max_load_blocks);
  l.hashes = HashFullBlocks(tokens.first((l.i0 + l.n) * B), B, salt);
  l.root = ChainRoot(salt);
  for (size_t j = 0; j < l.n; ++j) l.keys.push_back(BlockKey(st.compat, l.hashes[l.i0 + j]));
  st.FindHolders(l);
  st.Fetch(l, st.RunEnd(l));
  const std::vector<uint32_t> fresh = st.Stage(l, tokens);
  if (!fresh.empty()) {
    m.blocks.insert(m.blocks.end(), fresh.begin(), fresh.end());
    m.num_tokens = m.blocks.size() * B;
    m.calibration = l.calibration;
    if (!m.sinks) m.sinks = l.sinks;
    // Name the loaded blocks so that the pool serves the next lookup. A chain
    // someone published meanwhile stops this; the blocks stay ours, unnamed.
    (void)st.cache->PublishHashed(std::span<const BlockHash>(l.hashes.data(), m.blocks.size()), m.blocks,
                                  l.i0, tokens.first(B), salt, m.calibration, nullptr, l.sinks);
  }
  // A publisher names its whole chain in the pool before any of it reaches
  // a tier, so a lookup that missed the pool just before a publish can find
  // the tiers holding part of what the pool now holds whole. Asked again
  // (only when it now holds more), the pool's longer answer replaces ours.
  if (m.blocks.size() < full && st.cache->Peek(tokens, salt).blocks.size() > m.blocks.size()) {
    PrefixMatch again = st.cache->Acquire(tokens, salt);
    const bool longer = again.blocks.size() > m.blocks.size();
    if (longer) std::swap(m, again);
    std::vector<uint32_t> back(again.blocks.rbegin(), again.blocks.rend());  // the other answer's, tail first
    (void)st.pool->Release(back);
    if (longer) {
      st.Account(l, 0, served_by_tier);
      if (served_by_tier != nullptr) {
        served_by_tier->assign(T + 1, 0);
        (*served_by_tier)[0] = m.num_tokens;
      }
      return m;
    }
  }
  st.Account(l, fresh.size(), served_by_tier);
  return m;
}

Result<size_t> OffloadCache::AcquireInto(std::span<const TokenId> tokens, std::string_view salt,
                                         const AdoptFn& adopt, std::vector<uint64_t>* served_by_tier) {
  PrefixMatch m = Acquire(tokens, salt, served_by_tier);
  if (m.blocks.empty()) return size_t{0};
  Status status = adopt(m.blocks, m.calibration, m.sinks);
  if (!status.ok()) {
    std::vector<uint32_t> back(m.blocks.rbegin(), m.blocks.rend());  // tail first
    (void)state_->pool->Release(back);
    return status;
  }
  return m.num_tokens;
}

Result<size_t> OffloadCache::AdoptInto(SequenceCache* seq, std::span<const TokenId> tokens,
                                       std::string_view salt, std::vector<uint64_t>* served_by_tier) {
  if (seq == nullptr || seq->layout() != CacheLayout::kPaged || seq->num_tokens() != 0) {
    return Status::FailedPrecondition("offload: AdoptInto needs an empty paged sequence");
  }
  return AcquireInto(
      tokens, salt,
      [seq](std::span<const uint32_t> blocks, std::shared_ptr<const Calibration> calibration,
            std::shared_ptr<const WindowSinks> sinks) {
        return seq->AdoptPrefix(blocks, std::move(calibration), std::move(sinks));
      },
      served_by_tier);
}

Result<size_t> OffloadCache::PublishBlocks(std::span<const TokenId> tokens,
                                           std::span<const uint32_t> block_table, size_t start,
                                           std::string_view salt,
                                           std::shared_ptr<const Calibration> calibration,
                                           const PrefixCache::SetHashFn& set_hash,
                                           std::shared_ptr<const WindowSinks> sinks) {
  const uint32_t B = state_->pool->block_size();
  const size_t full = tokens.size() / B;
  if (block_table.size() < full) {
    return Status::InvalidArgument(fmt::format(
        "offload: {} committed tokens fill {} blocks but the block table has {}", tokens.size(), full,
        block_table.size()));
  }
  const std::vector<BlockHash> hashes = HashFullBlocks(tokens, B, salt);
  return Publish(hashes, block_table.first(full), start, tokens, salt, std::move(calibration), set_hash,
                 std::move(sinks));
}

Result<size_t> OffloadCache::PublishSequence(SequenceCache* seq, std::span<const TokenId> tokens,
                                             std::string_view salt, size_t start) {
  if (seq == nullptr || seq->layout() != CacheLayout::kPaged) {
    return Status::FailedPrecondition("offload: PublishSequence needs a paged sequence");
  }
  if (tokens.size() > seq->num_tokens()) {
    return Status::InvalidArgument(fmt::format("offload: {} committed tokens but the sequence holds {}",
                                               tokens.size(), seq->num_tokens()));
  }
  return PublishBlocks(tokens, seq->block_table(), start, salt, seq->calibration(),
                       [seq](size_t logical, uint64_t hash) {
                         return seq->SetBlockHash(static_cast<uint32_t>(logical), hash);
                       },
                       seq->window_sinks());
}

void OffloadCache::Flush() {
  State& st = *state_;
  std::unique_lock<std::mutex> lock(st.mu);
  st.idle_cv.wait(lock, [&] { return st.queue.empty() && st.in_flight == 0; });
}

OffloadStats OffloadCache::stats() const {
  const State& st = *state_;
  std::vector<TierUsage> usage;
  for (const auto& t : st.tiers) usage.push_back(t->usage());
  std::lock_guard<std::mutex> lock(st.mu);
  OffloadStats out = st.totals;
  for (size_t t = 0; t < st.counters.size(); ++t) {
    TierStats s = st.counters[t].s;
    s.dropped_stores += st.totals.dropped_queue_full;
    s.load_p50_us = Percentile(st.counters[t].latency_us, 0.50);
    s.load_p99_us = Percentile(st.counters[t].latency_us, 0.99);
    s.usage = usage[t];
    out.tiers.push_back(std::move(s));
  }
  return out;
}

}  // namespace kvcache
