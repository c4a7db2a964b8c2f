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
// Locks: mu_ guards the queue and the counters; it is never held while
// calling a tier, the pool or the prefix cache, except PrefixCache-free
// pool calls that cannot call back (Retain). Tiers have their own locks.
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_set>

#include <fmt/format.h>

#include "kvcache/cache.h"
#include "kvcache/offload.h"

namespace kvcache {
namespace {

constexpr size_t kLatencySamples = 8192;
constexpr size_t kKnownStored = 1 << 16;

struct Job {
  uint32_t block;
  BlockHash chain, parent;
  bool first;  // the chain's first block (no parent key)
  std::vector<TokenId> tokens;
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

bool SameCalibration(const Calibration* a, const Calibration* b) {
  if (a == b) return true;
  if (a == nullptr || b == nullptr) return false;
  return a->transforms == b->transforms;
}

}  // namespace

struct OffloadCache::State {
  std::shared_ptr<BlockPool> pool;
  PrefixCache* cache = nullptr;
  std::vector<std::shared_ptr<Tier>> tiers;
  OffloadOptions o;
  BlockHash compat;

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
  std::thread writer;

  void Remember(const BlockHash& h) {  // REQUIRES mu
    if (!known.insert(h).second) return;
    known_fifo.push_back(h);
    while (known_fifo.size() > kKnownStored) {
      known.erase(known_fifo.front());
      known_fifo.pop_front();
    }
  }

  void WriterLoop();
  void StoreBatch(std::vector<Job>& jobs);
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

void OffloadCache::State::StoreBatch(std::vector<Job>& jobs) {
  std::vector<TierPut> puts;
  std::vector<std::string> keys;
  for (const Job& j : jobs) {
    Result<std::vector<uint8_t>> obj = EncodeBlockObject(*pool, j.block, compat, j.chain, j.parent, j.tokens);
    (void)pool->Release(std::span<const uint32_t>(&j.block, 1));
    if (!obj.ok()) continue;  // cannot happen for a block of this pool; nothing to store
    TierPut p;
    p.key = BlockKey(compat, j.chain);
    p.parent_key = j.first ? std::string() : BlockKey(compat, j.parent);
    p.bytes = std::make_shared<const std::vector<uint8_t>>(std::move(*obj));
    keys.push_back(p.key);
    puts.push_back(std::move(p));
  }
  if (puts.empty()) return;
  const uint64_t object_bytes = puts[0].bytes->size();  // one pool: every object has one size
  for (size_t t = 0; t < tiers.size(); ++t) {
    const std::vector<std::optional<TierMiss>> have = tiers[t]->Exists(keys);
    std::vector<TierPut> missing;
    for (size_t i = 0; i < puts.size(); ++i) {
      if (have[i].has_value()) missing.push_back(puts[i]);
    }
    const size_t stored = missing.empty() ? 0 : tiers[t]->Store(missing);
    std::lock_guard<std::mutex> lock(mu);
    TierStats& s = counters[t].s;
    s.stored_blocks += stored;
    s.bytes_stored += stored * object_bytes;
    s.dropped_stores += missing.size() - stored;
  }
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
  if (pool == nullptr || cache == nullptr) return Status::InvalidArgument("offload: null pool or cache");
  if (cache->block_size() != pool->block_size()) {
    return Status::InvalidArgument("offload: the prefix cache is not over this pool");
  }
  for (const auto& t : tiers) {
    if (t == nullptr) return Status::InvalidArgument("offload: null tier");
  }
  if (options.queue_blocks == 0 || options.store_batch == 0) {
    return Status::InvalidArgument("offload: queue_blocks and store_batch must be > 0");
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
  if (options.calibration != nullptr) c.calibration = CalibrationDigest(*options.calibration);
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
                                     const PrefixCache::SetHashFn& set_hash) {
  State& st = *state_;
  const uint32_t B = st.pool->block_size();
  if (tokens.size() < hashes.size() * B) {
    return Status::InvalidArgument("offload: fewer tokens than the blocks being published");
  }
  KV_ASSIGN_OR_RETURN(const size_t end,
                      st.cache->PublishHashed(hashes, blocks, start, tokens.first(std::min<size_t>(B, tokens.size())), salt,
                                              calibration, set_hash));
  if (st.tiers.empty() || end <= start) return end;
  if (!SameCalibration(calibration.get(), st.o.calibration.get())) {
    std::lock_guard<std::mutex> lock(st.mu);
    st.totals.skipped_calibration += end - start;
    return end;
  }
  const BlockHash root = ChainRoot(salt);
  bool queued = false;
  for (size_t i = start; i < end; ++i) {
    {
      std::lock_guard<std::mutex> lock(st.mu);
      if (st.known.count(hashes[i]) != 0) continue;
      if (st.queue.size() >= st.o.queue_blocks) {
        ++st.totals.dropped_queue_full;
        continue;
      }
    }
    // The caller holds blocks[i]: Retain cannot fail on it.
    if (!st.pool->Retain(std::span<const uint32_t>(&blocks[i], 1)).ok()) continue;
    Job j{blocks[i], hashes[i], i == 0 ? root : hashes[i - 1], i == 0,
          std::vector<TokenId>(tokens.begin() + static_cast<ptrdiff_t>(i * B),
                               tokens.begin() + static_cast<ptrdiff_t>((i + 1) * B))};
    std::lock_guard<std::mutex> lock(st.mu);
    st.queue.push_back(std::move(j));
    st.Remember(hashes[i]);
    ++st.totals.queued_blocks;
    queued = true;
  }
  if (queued) st.work_cv.notify_one();
  return end;
}

PrefixMatch OffloadCache::Acquire(std::span<const TokenId> tokens, std::string_view salt,
                                  std::vector<uint64_t>* served_by_tier) {
  State& st = *state_;
  const size_t T = st.tiers.size();
  if (served_by_tier != nullptr) served_by_tier->assign(T + 1, 0);
  PrefixMatch m = st.cache->Acquire(tokens, salt);
  if (served_by_tier != nullptr) (*served_by_tier)[0] = m.num_tokens;
  const uint32_t B = st.pool->block_size();
  const size_t full = tokens.size() / B;
  const size_t i0 = m.blocks.size();
  if (T == 0 || i0 >= full) return m;
  const size_t n = std::min<size_t>(full - i0, st.o.max_load_blocks);
  const std::vector<BlockHash> hashes = HashFullBlocks(tokens.first((i0 + n) * B), B, salt);
  const BlockHash root = ChainRoot(salt);
  std::vector<std::string> keys(n);
  for (size_t j = 0; j < n; ++j) keys[j] = BlockKey(st.compat, hashes[i0 + j]);

  // Which tier holds each block: the first that says it has it.
  std::vector<int> src(n, -1);
  std::vector<std::vector<std::optional<TierMiss>>> have(T);
  for (size_t t = 0; t < T; ++t) {
    std::vector<std::string> ask;
    std::vector<size_t> pos;
    for (size_t j = 0; j < n; ++j) {
      if (src[j] < 0) {
        ask.push_back(keys[j]);
        pos.push_back(j);
      }
    }
    if (ask.empty()) break;
    const std::vector<std::optional<TierMiss>> got = st.tiers[t]->Exists(ask);
    have[t].assign(n, std::nullopt);
    for (size_t k = 0; k < pos.size(); ++k) {
      if (!got[k].has_value()) src[pos[k]] = static_cast<int>(t);
      have[t][pos[k]] = got[k].has_value() ? got[k] : std::nullopt;
    }
    std::lock_guard<std::mutex> lock(st.mu);
    ++st.counters[t].s.lookups;
  }
  size_t end = 0;
  while (end < n && src[end] >= 0) ++end;
  // Load no more than the pool could take now: bytes fetched for blocks that
  // then cannot be allocated are wasted (and a waiting request asks again).
  const size_t room = st.pool->num_available_blocks();
  if (end > room) {
    std::lock_guard<std::mutex> lock(st.mu);
    ++st.totals.load_alloc_failures;
    end = room;
  }
  // The block that ends the run: a miss for every tier that was asked for it.
  std::vector<std::array<uint64_t, kNumTierMisses>> miss(T);
  if (end < n) {
    for (size_t t = 0; t < T; ++t) {
      if (!have[t].empty() && have[t][end].has_value()) ++miss[t][static_cast<size_t>(*have[t][end])];
    }
  }
  // Fetch the run, tier by tier.
  std::vector<TierBlobPtr> objects(end);
  for (size_t t = 0; t < T && end > 0; ++t) {
    std::vector<std::string> ask;
    std::vector<size_t> pos;
    for (size_t j = 0; j < end; ++j) {
      if (src[j] == static_cast<int>(t)) {
        ask.push_back(keys[j]);
        pos.push_back(j);
      }
    }
    if (ask.empty()) continue;
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<TierGet> got = st.tiers[t]->Load(ask);
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    uint64_t bytes = 0;
    for (size_t k = 0; k < pos.size(); ++k) {
      if (got[k].bytes == nullptr) {
        ++miss[t][static_cast<size_t>(got[k].miss)];
        continue;
      }
      bytes += got[k].bytes->size();
      objects[pos[k]] = std::move(got[k].bytes);
    }
    std::lock_guard<std::mutex> lock(st.mu);
    st.counters[t].s.bytes_loaded += bytes;
    st.counters[t].AddLatency(us);
  }
  size_t ok = 0;
  while (ok < end && objects[ok] != nullptr) ++ok;
  // Staging blocks for the fetched run (all or nothing): nobody else can
  // read them until they are named below. Each object is verified and copied
  // into its block in one pass (VerifyAndDecodeBlockObject); the first that
  // fails ends the prefix and its block and the later ones are given back.
  std::vector<uint32_t> fresh(ok);
  if (ok > 0 && !st.pool->Allocate(fresh).ok()) {
    std::lock_guard<std::mutex> lock(st.mu);
    ++st.totals.load_alloc_failures;
    ok = 0;
    fresh.clear();
  }
  std::vector<std::vector<std::string>> erase(T);
  auto reject = [&](size_t j, TierMiss why) {
    const size_t t = static_cast<size_t>(src[j]);
    ++miss[t][static_cast<size_t>(why)];
    erase[t].push_back(keys[j]);
  };
  size_t good = 0;
  for (; good < ok; ++good) {
    const size_t j = good;
    const std::optional<TierMiss> why = VerifyAndDecodeBlockObject(
        *objects[j], st.compat, hashes[i0 + j], i0 + j == 0 ? root : hashes[i0 + j - 1],
        tokens.subspan((i0 + j) * B, B), *st.pool, fresh[j]);
    if (why.has_value()) {
      reject(j, *why);
      break;
    }
  }
  // Objects after the one that ended the prefix (or all of them, when the
  // staging blocks could not be allocated) are not used, but a failing one
  // is still counted and erased from its tier.
  for (size_t j = good < ok ? good + 1 : good; j < end; ++j) {
    if (objects[j] == nullptr) continue;
    const std::optional<TierMiss> why =
        VerifyBlockObject(*objects[j], st.compat, hashes[i0 + j],
                          i0 + j == 0 ? root : hashes[i0 + j - 1], tokens.subspan((i0 + j) * B, B));
    if (why.has_value()) reject(j, *why);
  }
  if (good < ok) {
    (void)st.pool->Release(std::span<const uint32_t>(fresh.data() + good, ok - good));
    fresh.resize(good);
    ok = good;
  }
  for (size_t t = 0; t < T; ++t) {
    if (!erase[t].empty()) st.tiers[t]->Erase(erase[t]);
  }
  {
    std::lock_guard<std::mutex> lock(st.mu);
    for (size_t t = 0; t < T; ++t) {
      for (size_t r = 0; r < kNumTierMisses; ++r) st.counters[t].s.misses[r] += miss[t][r];
    }
    for (size_t j = 0; j < ok; ++j) {
      TierStats& s = st.counters[static_cast<size_t>(src[j])].s;
      ++s.hit_blocks;
      s.hit_tokens += B;
      if (served_by_tier != nullptr) (*served_by_tier)[1 + static_cast<size_t>(src[j])] += B;
      st.Remember(hashes[i0 + j]);
    }
  }
  if (ok == 0) return m;
  m.blocks.insert(m.blocks.end(), fresh.begin(), fresh.end());
  m.num_tokens = m.blocks.size() * B;
  if (m.calibration == nullptr) m.calibration = st.o.calibration;
  // Name the loaded blocks so that the pool serves the next lookup. A chain
  // someone published meanwhile stops this; the blocks stay ours, unnamed.
  (void)st.cache->PublishHashed(std::span<const BlockHash>(hashes.data(), i0 + ok), m.blocks, i0,
                                tokens.first(B), salt, m.calibration);
  return m;
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

Result<uint64_t> ParseByteSize(std::string_view text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  const std::string num(text.substr(0, i));
  const std::string_view unit = text.substr(i);
  char* endp = nullptr;
  const double v = num.empty() ? -1 : std::strtod(num.c_str(), &endp);
  static constexpr std::pair<std::string_view, double> kUnits[] = {
      {"", 1}, {"B", 1}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0},
      {"TiB", 1099511627776.0}};
  for (const auto& [name, scale] : kUnits) {
    if (unit == name && v >= 0 && endp == num.c_str() + num.size()) {
      return static_cast<uint64_t>(v * scale);
    }
  }
  return Status::InvalidArgument(
      fmt::format("size '{}': expected a number with B, KiB, MiB, GiB or TiB", text));
}

Result<std::vector<std::shared_ptr<Tier>>> MakeTiers(std::string_view specs) {
  std::vector<std::shared_ptr<Tier>> out;
  while (!specs.empty()) {
    const size_t comma = specs.find(',');
    const std::string_view spec = specs.substr(0, comma);
    specs = comma == std::string_view::npos ? std::string_view() : specs.substr(comma + 1);
    if (spec.starts_with("host:")) {
      KV_ASSIGN_OR_RETURN(const uint64_t bytes, ParseByteSize(spec.substr(5)));
      out.push_back(NewHostTier({.capacity_bytes = bytes}));
    } else if (spec.starts_with("disk:")) {
      const std::string_view rest = spec.substr(5);
      const size_t colon = rest.rfind(':');
      if (colon == std::string_view::npos || colon == 0) {
        return Status::InvalidArgument(fmt::format("tier '{}': expected disk:PATH:SIZE", spec));
      }
      KV_ASSIGN_OR_RETURN(const uint64_t bytes, ParseByteSize(rest.substr(colon + 1)));
      DiskTierOptions d;
      d.path = std::string(rest.substr(0, colon));
      d.capacity_bytes = bytes;
      KV_ASSIGN_OR_RETURN(std::unique_ptr<Tier> t, OpenDiskTier(d));
      out.push_back(std::move(t));
    } else if (spec.starts_with("redis://")) {
      RedisTierOptions r;
      r.url = std::string(spec);
      KV_ASSIGN_OR_RETURN(std::unique_ptr<Tier> t, NewRedisTier(r));
      out.push_back(std::move(t));
    } else {
      return Status::InvalidArgument(fmt::format(
          "tier '{}': expected host:SIZE, disk:PATH:SIZE or redis://[:password@]host:port[/db]", spec));
    }
  }
  return out;
}

}  // namespace kvcache
