// `kvcache soak`: the serving path under load from several threads, for
// --seconds (or until --operations), with invariant checks throughout, and
// what it leaked at the end.
//
// Every thread serves requests against ONE shared BlockPool and PrefixCache
// (the concurrency a server has): a request's prompt is one of four shared
// system prefixes plus a unique suffix; admission reserves its blocks
// (Reserve; refused -> the thread preempts its longest running sequence);
// the cached prefix is adopted (AdoptInto), the rest appended; each decode
// step appends one token, attends over the real stored rows (AttendDecode)
// and feeds the probabilities to the importance counters; some requests fork
// a second sample (copy-on-write); finished sequences publish their blocks
// and are released. Each thread also runs a hybrid sequence (full + window
// layer, shared hybrid pools) through speculative drafts: BeginDraft, draft
// appends, multi-token attention, Commit of a random number / Abort.
// Appends that find the pool exhausted preempt (release) the sequence.
//
// Checks: every 64 operations a thread runs CheckInvariants on all it holds;
// every append re-reads rows (K/V are a function of token and position, so
// rows adopted from another thread's blocks must read back exactly: f32
// storage); attention outputs must be finite with probabilities summing to
// the group size. At the end everything is released: pool_blocks_leaked =
// blocks still used or reserved; bytes_leaked = C++ heap bytes live
// (tools/heap_counter.h) above what was live before the pools were created.
// rss_*: resident set (/proc/self/statm) at start, sampled peak, at the end
// of the run (before releasing), plus rss_warm_bytes sampled after the first
// quarter of the run and rss_growth_after_warmup = rss_end / rss_warm - 1.
// The pools' lazily mapped arenas are written once up front (PreFault), as
// a server pre-faults its KV cache, so RSS shows the library's own growth.
// Before the measured run a 2000-operation warm-up run builds lazy statics.
//
// --tiers SPEC (offload.h's MakeTiers: host:SIZE, disk:PATH:SIZE, redis://...)
// puts an OffloadCache over the prefix cache: admissions acquire through it
// (the pool first, then the tiers), publications write through to the tiers,
// and --system-prompts (default 4) sets how many shared prefixes there are
// (more than the pool holds: acquires are then served from the tiers). A
// tier-served prefix must be contiguous (whole blocks, the pool's share
// first, never past the lookup) and every adopted row must read back exactly
// (the tokens matched); no tier may report a corrupt, incompatible or
// token-mismatched object. The JSON gains "tiers": per-tier counters.
// Without --tiers nothing of this runs.
//
// Thread safety: the workers share only the pools and the prefix cache
// (thread-safe); counters are atomics.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "kvcache/attention.h"
#include "kvcache/cache.h"
#include "kvcache/hybrid.h"
#include "kvcache/serving/offload.h"
#include "kvcache/pool.h"
#include "kvcache/serving/prefix_cache.h"
#include "tools/command.h"
#include "tools/heap_counter.h"
#include "tools/json_result.h"
#include "tools/support/harness.h"
#include "tools/tier_json.h"

namespace kvcache::tools {
namespace {

struct SoakOptions {
  double seconds = 5;
  uint64_t operations = 0;  // 0 = until --seconds
  uint32_t threads = 2;
  uint32_t blocks = 192;
  uint64_t seed = 1;
  bool json = false;
  std::string tiers;             // "" = no offload tiers
  uint32_t system_prompts = 4;   // shared prefixes
};

constexpr uint32_t kLayers = 2, kHeads = 2, kDim = 32, kBlock = 16, kQHeads = 4;

// [n_layers][T][H][D] rows of tokens [first, first + T).
std::vector<float> Rows(std::span<const TokenId> toks, uint32_t first, int side,
                        uint32_t layers = kLayers) {
  return harness::TokenRows(toks, first, side, layers, kHeads, kDim);
}

size_t RssBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long size = 0, resident = 0;
  const int n = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * static_cast<size_t>(sysconf(_SC_PAGESIZE)) : 0;
}

size_t HeapInUse() { return LiveHeapBytes(); }

struct Shared {
  std::shared_ptr<BlockPool> pool;
  std::unique_ptr<PrefixCache> prefix;
  std::unique_ptr<OffloadCache> offload;  // --tiers only
  size_t num_tiers = 0;
  std::shared_ptr<const HybridModel> hmodel;
  std::vector<std::shared_ptr<BlockPool>> hpools;
  std::vector<std::vector<TokenId>> system_prompts;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> operations{0}, checks{0}, failures{0}, preemptions{0}, requests{0},
      drafts{0}, tier_tokens{0};
  uint64_t max_operations = 0;
  std::mutex failure_mu;
  std::string first_failure;

  void Fail(const std::string& what) {
    failures.fetch_add(1);
    std::lock_guard<std::mutex> lock(failure_mu);
    if (first_failure.empty()) first_failure = what;
  }
};

struct Running {
  SequenceCache cache;
  std::vector<TokenId> tokens;
  uint32_t target = 0;  // tokens it ends at
  size_t offered = 0;   // blocks already handed to OffloadCache::Publish
  bool publish_stopped = false;  // a publication stopped at a duplicate: no more
};

class Worker {
 public:
  Worker(Shared* s, uint64_t seed) : s_(s), rng_(seed) {}
  void Run();

 private:
  bool Op() {  // counts one operation; false once the run should stop
    const uint64_t n = s_->operations.fetch_add(1) + 1;
    if (s_->max_operations && n >= s_->max_operations) s_->stop.store(true);
    if (++since_check_ >= 64) {
      since_check_ = 0;
      CheckAll();
    }
    return !s_->stop.load(std::memory_order_relaxed);
  }
  void Check(const Status& st, const char* what) {
    s_->checks.fetch_add(1);
    if (!st.ok()) s_->Fail(fmt::format("{}: {}", what, st.ToString()));
  }
  void CheckAll() {
    for (const Running& r : running_) Check(r.cache.CheckInvariants(), "sequence invariants");
    if (hybrid_) Check(hybrid_->CheckInvariants(), "hybrid invariants");
    s_->checks.fetch_add(1);
    const std::string pc = s_->prefix->CheckInvariants();
    if (!pc.empty()) s_->Fail("prefix cache: " + pc);
  }
  // The last row of every head and one random earlier row read back exactly.
  void CheckRows(const Running& r) {
    const uint32_t n = r.cache.num_tokens();
    if (n == 0) return;
    const uint32_t pos[2] = {n - 1, static_cast<uint32_t>(rng_() % n)};
    CheckPositions(r, pos, "");
  }
  // Every row of positions [0, n) reads back exactly (a prefix the tiers served).
  void CheckAllRows(const Running& r, uint32_t n) {
    std::vector<uint32_t> pos(n);
    std::iota(pos.begin(), pos.end(), 0u);
    CheckPositions(r, pos, "adopted prefix: ");
  }
  // The rows at `positions` of every layer and head equal RowValue's.
  void CheckPositions(const Running& r, std::span<const uint32_t> positions, const char* what) {
    const uint32_t n = r.cache.num_tokens();
    for (uint32_t l = 0; l < kLayers; ++l) {
      for (uint32_t h = 0; h < kHeads; ++h) {
        auto k = r.cache.HeadKeys(l, h);
        auto v = r.cache.HeadValues(l, h);
        s_->checks.fetch_add(1);
        if (!k.ok() || !v.ok() || k->size() != size_t{n} * kDim) {
          s_->Fail(fmt::format("{}rows unreadable", what));
          return;
        }
        for (uint32_t p : positions) {
          for (uint32_t i = 0; i < kDim; ++i) {
            if ((*k)[size_t{p} * kDim + i] != harness::RowValue(r.tokens[p], p, l, h, 0, i) ||
                (*v)[size_t{p} * kDim + i] != harness::RowValue(r.tokens[p], p, l, h, 1, i)) {
              s_->Fail(fmt::format("{}layer {} head {} position {} reads back wrong rows", what, l,
                                   h, p));
              return;
            }
          }
        }
      }
    }
  }
  void Preempt() {
    if (running_.empty()) return;
    auto it = std::max_element(running_.begin(), running_.end(), [](const Running& a, const Running& b) {
      return a.cache.num_tokens() < b.cache.num_tokens();
    });
    running_.erase(it);
    s_->preemptions.fetch_add(1);
  }
  // The prefix of `prompt` from the prefix cache (through the tiers with
  // --tiers) adopted into the empty `c`; tokens adopted.
  Result<size_t> Adopt(SequenceCache* c, std::span<const TokenId> prompt);
  Status Publish(Running& r);
  void Admit();
  void Step(Running& r);
  void Finish(size_t i);
  void HybridStep();

  Shared* s_;
  std::mt19937_64 rng_;
  std::vector<Running> running_;
  std::optional<HybridSequence> hybrid_;
  uint32_t since_check_ = 0;
};

Result<size_t> Worker::Adopt(SequenceCache* c, std::span<const TokenId> prompt) {
  if (!s_->offload) return s_->prefix->AdoptInto(c, prompt, "");
  std::vector<uint64_t> served;
  KV_ASSIGN_OR_RETURN(const size_t adopted, s_->offload->AdoptInto(c, prompt, "", &served));
  s_->checks.fetch_add(1);
  uint64_t sum = 0;
  for (uint64_t x : served) sum += x;
  if (adopted % kBlock != 0 || adopted != c->num_tokens() || adopted > prompt.size() ||
      served.size() != 1 + s_->num_tiers || sum != adopted) {
    s_->Fail(fmt::format("tier acquire: {} tokens adopted ({} held) for a lookup of {}, served {}",
                         adopted, c->num_tokens(), prompt.size(), sum));
  }
  s_->tier_tokens.fetch_add(sum - (served.empty() ? 0 : served[0]));
  return adopted;
}

Status Worker::Publish(Running& r) {
  if (!s_->offload) return s_->prefix->PublishSequence(&r.cache, r.tokens, "").status();
  const size_t full = r.tokens.size() / kBlock;
  if (r.publish_stopped || full <= r.offered) return Status::Ok();
  KV_ASSIGN_OR_RETURN(const size_t end, s_->offload->PublishSequence(&r.cache, r.tokens, "", r.offered));
  r.offered = full;
  r.publish_stopped = end < full;
  return Status::Ok();
}

void Worker::Admit() {
  std::vector<TokenId> prompt = s_->system_prompts[rng_() % s_->system_prompts.size()];
  const uint32_t suffix = 1 + rng_() % 40;
  for (uint32_t i = 0; i < suffix; ++i) prompt.push_back(100 + rng_() % 5000);
  const uint32_t gen = 4 + rng_() % 24;
  auto c = SequenceCache::CreatePaged(s_->pool);
  if (!c.ok()) return s_->Fail("create: " + c.status().ToString());
  Status st = c->Reserve(static_cast<uint32_t>(prompt.size()) + gen);
  if (!Op()) return;
  if (!st.ok()) {
    if (st.code() != StatusCode::kPoolExhausted) return s_->Fail("reserve: " + st.ToString());
    Preempt();
    return;
  }
  // The last prompt token is always computed (its query starts decoding),
  // so at most the blocks before it are adopted.
  auto adopted = Adopt(&*c, std::span<const TokenId>(prompt).first(prompt.size() - 1));
  if (!Op()) return;
  if (!adopted.ok()) return s_->Fail("adopt: " + adopted.status().ToString());
  const uint32_t a = static_cast<uint32_t>(*adopted);
  std::span<const TokenId> rest(prompt.data() + a, prompt.size() - a);
  st = c->Append(Rows(rest, a, 0), Rows(rest, a, 1));
  if (!Op()) return;
  if (!st.ok()) {
    if (st.code() != StatusCode::kPoolExhausted) return s_->Fail("prefill: " + st.ToString());
    Preempt();
    return;
  }
  s_->requests.fetch_add(1);
  Running r{std::move(*c), prompt, static_cast<uint32_t>(prompt.size()) + gen};
  CheckRows(r);
  if (s_->offload && a > 0) CheckAllRows(r, a);
  // Publish the prompt at once: other threads' requests reuse it.
  const Status pub = Publish(r);
  if (!pub.ok()) s_->Fail("publish: " + pub.ToString());
  if (!Op()) return;
  running_.push_back(std::move(r));
  // Parallel sampling now and then: a fork shares every block.
  if (rng_() % 4 == 0 && running_.size() < 6) {
    auto f = running_.back().cache.Fork();
    if (!Op()) return;
    if (f.ok()) {
      running_.push_back({std::move(*f), running_.back().tokens, running_.back().target,
                          running_.back().offered, running_.back().publish_stopped});
    } else if (f.status().code() != StatusCode::kPoolExhausted) {
      s_->Fail("fork: " + f.status().ToString());
    }
  }
}

void Worker::Step(Running& r) {
  const uint32_t n = r.cache.num_tokens();
  const TokenId t = 100 + rng_() % 5000;
  const std::span<const TokenId> one(&t, 1);
  Status st = r.cache.Append(Rows(one, n, 0), Rows(one, n, 1));
  if (!Op()) return;
  if (!st.ok()) {
    if (st.code() != StatusCode::kPoolExhausted) return s_->Fail("decode append: " + st.ToString());
    r.target = 0;  // preempted: finished without publishing
    s_->preemptions.fetch_add(1);
    return;
  }
  r.tokens.push_back(t);
  if (rng_() % 8 == 0) CheckRows(r);
  // Attention of one query over every layer's real rows.
  std::vector<float> q(size_t{kQHeads} * kDim), out(q.size()), kv_probs(size_t{kHeads} * (n + 1));
  for (float& x : q) x = static_cast<float>(static_cast<int>(rng_() % 2001) - 1000) / 1000.0f;
  for (uint32_t l = 0; l < kLayers; ++l) {
    auto view = r.cache.View(l);
    if (!view.ok()) return s_->Fail("view: " + view.status().ToString());
    AttentionOutput ao;
    ao.out = out;
    ao.kv_probs = kv_probs;
    st = AttendDecode(*view, q, {.n_q_heads = kQHeads}, ao);
    if (!Op()) return;
    if (!st.ok()) return s_->Fail("attend: " + st.ToString());
    s_->checks.fetch_add(1);
    for (float x : out)
      if (!std::isfinite(x)) return s_->Fail("attention output not finite");
    for (uint32_t h = 0; h < kHeads; ++h) {
      std::span<const float> p(kv_probs.data() + size_t{h} * (n + 1), n + 1);
      double sum = 0;
      for (float x : p) sum += x;
      if (std::fabs(sum - kQHeads / kHeads) > 1e-3) {
        return s_->Fail(fmt::format("attention probabilities sum to {}", sum));
      }
      st = r.cache.AccumulateImportance(l, h, p.first(r.cache.head_len(l, h)));
      if (!st.ok()) return s_->Fail("importance: " + st.ToString());
    }
  }
}

void Worker::Finish(size_t i) {
  Running& r = running_[i];
  if (r.target != 0) {
    const Status pub = Publish(r);
    if (!pub.ok()) s_->Fail("publish: " + pub.ToString());
  }
  running_.erase(running_.begin() + i);
  Op();
}

void Worker::HybridStep() {
  if (!hybrid_ || hybrid_->num_tokens() > 160) {
    hybrid_.reset();
    auto h = HybridSequence::CreatePaged(s_->hmodel, s_->hpools);
    if (!h.ok()) return s_->Fail("hybrid create: " + h.status().ToString());
    std::vector<TokenId> p(8);
    for (TokenId& t : p) t = rng_() % 64;
    Status st = h->Append(Rows(p, 0, 0), Rows(p, 0, 1));
    if (!Op()) return;
    if (!st.ok()) {
      if (st.code() != StatusCode::kPoolExhausted) s_->Fail("hybrid prefill: " + st.ToString());
      s_->preemptions.fetch_add(1);
      return;
    }
    hybrid_.emplace(std::move(*h));
    return;
  }
  HybridSequence& h = *hybrid_;
  Status st = h.BeginDraft();
  if (!Op()) return;
  if (!st.ok()) return s_->Fail("begin draft: " + st.ToString());
  const uint32_t k = 1 + rng_() % 4;
  for (uint32_t i = 0; i < k; ++i) {
    const TokenId t = rng_() % 64;
    const uint32_t n = h.num_tokens();
    st = h.Append(Rows({&t, 1}, n, 0), Rows({&t, 1}, n, 1));
    if (!Op()) break;
    if (!st.ok()) {
      if (st.code() != StatusCode::kPoolExhausted) s_->Fail("draft append: " + st.ToString());
      Check(h.Abort(), "abort after exhaustion");
      hybrid_.reset();  // preempted
      s_->preemptions.fetch_add(1);
      return;
    }
  }
  const uint32_t drafted = h.num_tokens() - h.draft_base();
  if (drafted > 0) {
    std::vector<float> q(size_t{drafted} * kQHeads * kDim), out(q.size());
    for (float& x : q) x = static_cast<float>(static_cast<int>(rng_() % 2001) - 1000) / 1000.0f;
    for (uint32_t l = 0; l < kLayers; ++l) {
      AttentionOutput ao;
      ao.out = out;
      st = h.Attend(l, drafted, q, {.n_q_heads = kQHeads}, ao);
      Op();
      if (!st.ok()) return s_->Fail(fmt::format("draft attend layer {}: {}", l, st.ToString()));
      for (float x : out)
        if (!std::isfinite(x)) return s_->Fail("draft attention not finite");
    }
  }
  const uint32_t accept = static_cast<uint32_t>(rng_() % (drafted + 1));
  st = rng_() % 8 == 0 ? h.Abort() : h.Commit(accept);
  Op();
  s_->drafts.fetch_add(1);
  if (!st.ok()) {
    if (st.code() != StatusCode::kPoolExhausted) return s_->Fail("commit: " + st.ToString());
    hybrid_.reset();
    s_->preemptions.fetch_add(1);
  }
}

void Worker::Run() {
  while (!s_->stop.load(std::memory_order_relaxed)) {
    if (running_.size() < 4) Admit();
    for (size_t i = 0; i < running_.size() && !s_->stop.load(std::memory_order_relaxed);) {
      Running& r = running_[i];
      if (r.target == 0 || r.cache.num_tokens() >= r.target) {
        Finish(i);
        continue;
      }
      Step(r);
      ++i;
    }
    if (rng_() % 2 == 0) HybridStep();
  }
  CheckAll();
  running_.clear();
  hybrid_.reset();
}

// One tier's counters (plain, like SoakNumbers).
struct SoakTier {
  char name[16] = {0};
  uint64_t lookups = 0, hit_blocks = 0, hit_tokens = 0, bytes_loaded = 0, bytes_stored = 0,
           stored_blocks = 0, dropped_stores = 0, objects = 0, bytes = 0, evictions = 0,
           recovered_objects = 0, discarded_files = 0;
  uint64_t misses[kNumTierMisses] = {};
};
constexpr size_t kMaxSoakTiers = 4;

// What one run measured (plain numbers, so that nothing here allocates
// while the heap is being compared).
struct SoakNumbers {
  SoakTier tiers[kMaxSoakTiers];
  size_t num_tiers = 0;
  uint64_t tier_tokens = 0, tier_queue_dropped = 0, tier_load_alloc_failures = 0;
  double seconds = 0;
  uint64_t operations = 0, requests = 0, drafts = 0, preemptions = 0, evictions = 0;
  uint64_t checks = 0, failures = 0;
  double hit_rate = 0;
  size_t rss_start = 0, rss_warm = 0, rss_peak = 0, rss_end = 0;
  uint64_t leaked_blocks = 0, leaked_bytes = 0;
  size_t heap_start = 0, heap_end = 0;
  char first_failure[256] = {0};  // not a std::string: no heap while measuring
};

// Writes every block of `pool` once (allocate all, zero, release), as a
// server pre-faults its KV cache: the arenas are lazily mapped, and RSS
// should then measure the library's own growth, not first touches.
Status PreFault(BlockPool& pool) {
  std::vector<uint32_t> all(pool.num_blocks());
  KV_RETURN_IF_ERROR(pool.Allocate(all));
  const Geometry& g = pool.geometry();
  for (uint32_t b : all) {
    for (uint32_t l = 0; l < g.n_layers(); ++l) {
      for (Side side : {Side::kKey, Side::kValue}) {
        std::memset(pool.block_data(l, side, b), 0, pool.block_stride(side));
      }
    }
  }
  return pool.Release(all);
}

Status SoakOnce(const SoakOptions& o, SoakNumbers* n) {
  const size_t heap_start = HeapInUse();
  n->rss_start = RssBytes();
  n->rss_peak = n->rss_start;
  {
    Shared s;
    s.max_operations = o.operations;
    KV_ASSIGN_OR_RETURN(Geometry g, Geometry::Create({kLayers, kHeads, kDim, kBlock}));
    KV_ASSIGN_OR_RETURN(s.pool, BlockPool::Create(g, {}, {.num_blocks = o.blocks}));
    KV_ASSIGN_OR_RETURN(s.prefix, PrefixCache::Create(s.pool, {.evicted_history = 4096}));
    if (!o.tiers.empty()) {
      KV_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<Tier>> tiers, MakeTiers(o.tiers));
      if (tiers.size() > kMaxSoakTiers) {
        return Status::InvalidArgument(fmt::format("--tiers: at most {} tiers", kMaxSoakTiers));
      }
      OffloadOptions oo;
      oo.model = "kvcache-soak";
      s.num_tiers = tiers.size();
      KV_ASSIGN_OR_RETURN(s.offload,
                          OffloadCache::Create(s.pool, s.prefix.get(), std::move(tiers), oo));
    }
    KV_ASSIGN_OR_RETURN(s.hmodel, HybridModel::Create(
                                      g, {}, {LayerSpec::Full(), LayerSpec::Window(4, 32)},
                                      harness::DraftOptions()));
    const uint32_t hblocks[2] = {o.blocks / 2 + 8, o.blocks / 4 + 8};
    KV_ASSIGN_OR_RETURN(s.hpools, s.hmodel->CreatePools(hblocks));
    KV_RETURN_IF_ERROR(PreFault(*s.pool));
    for (const auto& p : s.hpools)
      if (p) KV_RETURN_IF_ERROR(PreFault(*p));
    std::mt19937_64 rng(o.seed);
    for (uint32_t i = 0; i < o.system_prompts; ++i) {
      std::vector<TokenId> p(32 + rng() % 48);
      for (TokenId& t : p) t = 10000 + rng() % 1000;
      s.system_prompts.push_back(std::move(p));
    }
    const auto t0 = std::chrono::steady_clock::now();
    {
      std::vector<std::unique_ptr<Worker>> workers;
      for (uint32_t t = 0; t < o.threads; ++t) {
        workers.push_back(std::make_unique<Worker>(&s, o.seed * 1000003 + t));
      }
      std::vector<std::thread> threads;
      for (auto& w : workers) threads.emplace_back([&w] { w->Run(); });
      const double limit = o.seconds > 0 ? o.seconds : 1e12;
      while (!s.stop.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        const double el =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const size_t rss = RssBytes();
        n->rss_peak = std::max(n->rss_peak, rss);
        n->rss_end = rss;
        const bool warm = o.operations ? s.operations.load() >= o.operations / 4 : el >= limit / 4;
        if (n->rss_warm == 0 && warm) n->rss_warm = rss;
        if (el >= limit) s.stop.store(true);
      }
      for (auto& t : threads) t.join();
    }
    n->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s.offload) {
      // The writer's queued references go back before the pool is counted.
      s.offload->Flush();
      const OffloadStats os = s.offload->stats();
      s.offload.reset();
      n->num_tiers = std::min(os.tiers.size(), kMaxSoakTiers);
      for (size_t t = 0; t < n->num_tiers; ++t) {
        const TierStats& x = os.tiers[t];
        SoakTier& y = n->tiers[t];
        std::snprintf(y.name, sizeof y.name, "%s", x.name.c_str());
        y.lookups = x.lookups;
        y.hit_blocks = x.hit_blocks;
        y.hit_tokens = x.hit_tokens;
        y.bytes_loaded = x.bytes_loaded;
        y.bytes_stored = x.bytes_stored;
        y.stored_blocks = x.stored_blocks;
        y.dropped_stores = x.dropped_stores;
        y.objects = x.usage.objects;
        y.bytes = x.usage.bytes;
        y.evictions = x.usage.evictions;
        y.recovered_objects = x.usage.recovered_objects;
        y.discarded_files = x.usage.discarded_files;
        for (size_t m = 0; m < kNumTierMisses; ++m) y.misses[m] = x.misses[m];
        // Nobody corrupts objects here: any of these is a broken invariant.
        s.checks.fetch_add(1);
        for (TierMiss bad : {TierMiss::kCorrupt, TierMiss::kIncompatible, TierMiss::kTokenMismatch}) {
          if (x.misses[static_cast<size_t>(bad)] != 0) {
            s.Fail(fmt::format("tier {}: {} {} objects", x.name, x.misses[static_cast<size_t>(bad)],
                               TierMissName(bad)));
          }
        }
      }
      n->tier_tokens = s.tier_tokens.load();
      n->tier_queue_dropped = os.dropped_queue_full;
      n->tier_load_alloc_failures = os.load_alloc_failures;
    }
    // Everything released: every pool must be exactly full again.
    const PoolStats st = s.pool->stats();
    n->leaked_blocks = st.used_blocks + st.reserved_blocks;
    for (const auto& p : s.hpools) {
      if (!p) continue;
      const PoolStats h = p->stats();
      n->leaked_blocks += h.used_blocks + h.reserved_blocks;
    }
    if (!s.pool->CheckInvariants().ok()) s.Fail("pool invariants at the end");
    const std::string pc = s.prefix->CheckInvariants();
    if (!pc.empty()) s.Fail("prefix cache at the end: " + pc);
    n->operations = s.operations.load();
    n->requests = s.requests.load();
    n->drafts = s.drafts.load();
    n->preemptions = s.preemptions.load();
    n->hit_rate = s.prefix->stats().hit_rate();
    n->evictions = s.pool->stats().evictions;
    n->checks = s.checks.load() + 2;
    n->failures = s.failures.load();
    std::snprintf(n->first_failure, sizeof n->first_failure, "%s", s.first_failure.c_str());
  }
  const size_t heap_end = HeapInUse();
  n->heap_start = heap_start;
  n->heap_end = heap_end;
  n->leaked_bytes = heap_end > heap_start ? heap_end - heap_start : 0;
  return Status::Ok();
}

Result<nlohmann::json> RunSoak(const SoakOptions& o) {
  if (o.threads == 0 || o.threads > 256) return Status::InvalidArgument("--threads must be in [1, 256]");
  if (o.system_prompts == 0 || o.system_prompts > 100000) {
    return Status::InvalidArgument("--system-prompts must be in [1, 100000]");
  }
  if (!(o.seconds > 0) && o.operations == 0) {
    return Status::InvalidArgument("give --seconds > 0 or --operations > 0");
  }
  // A short warm-up run first: lazily built statics, thread arenas and
  // page-cache effects are then in place before anything is measured.
  SoakOptions warm = o;
  warm.seconds = 0;
  warm.operations = 2000;
  SoakNumbers w, n;
  KV_RETURN_IF_ERROR(SoakOnce(warm, &w));
  KV_RETURN_IF_ERROR(SoakOnce(o, &n));
  nlohmann::json j;
  j["threads"] = o.threads;
  j["seconds"] = n.seconds;
  j["operations"] = n.operations;
  j["operations_per_second"] = n.seconds > 0 ? n.operations / n.seconds : 0.0;
  j["requests"] = n.requests;
  j["drafts"] = n.drafts;
  j["preemptions"] = n.preemptions;
  j["prefix_hit_rate"] = n.hit_rate;
  j["pool_evictions"] = n.evictions;
  j["invariant_checks"] = n.checks + w.checks;
  j["invariant_failures"] = n.failures + w.failures;
  j["first_failure"] = w.first_failure[0] ? w.first_failure : n.first_failure;
  j["rss_start_bytes"] = n.rss_start;
  j["rss_warm_bytes"] = n.rss_warm;
  j["rss_peak_bytes"] = n.rss_peak;
  j["rss_end_bytes"] = n.rss_end;
  j["rss_growth_after_warmup"] =
      n.rss_warm > 0 ? (static_cast<double>(n.rss_end) - static_cast<double>(n.rss_warm)) / n.rss_warm : 0.0;
  j["pool_blocks_leaked"] = n.leaked_blocks + w.leaked_blocks;
  j["bytes_leaked"] = n.leaked_bytes;
  j["heap_start_bytes"] = n.heap_start;
  j["heap_end_bytes"] = n.heap_end;
  if (!o.tiers.empty()) {
    nlohmann::json tiers = nlohmann::json::array();
    for (size_t t = 0; t < n.num_tiers; ++t) {
      const SoakTier& x = n.tiers[t];
      tiers.push_back({{"name", x.name},
                       {"lookups", x.lookups},
                       {"hit_blocks", x.hit_blocks},
                       {"hit_tokens", x.hit_tokens},
                       {"misses", TierMissesJson(x.misses)},
                       {"bytes_loaded", x.bytes_loaded},
                       {"bytes_stored", x.bytes_stored},
                       {"stored_blocks", x.stored_blocks},
                       {"dropped_stores", x.dropped_stores},
                       {"objects", x.objects},
                       {"bytes", x.bytes},
                       {"evictions", x.evictions},
                       {"recovered_objects", x.recovered_objects},
                       {"discarded_files", x.discarded_files}});
    }
    j["tiers"] = tiers;
    j["tier_served_tokens"] = n.tier_tokens;
    j["tier_queue_dropped"] = n.tier_queue_dropped;
    j["tier_load_alloc_failures"] = n.tier_load_alloc_failures;
  }
  return j;
}

// The text of a result.
void PrintText(const SoakOptions& o, const nlohmann::json& j) {
  fmt::print("{} operations in {:.1f} s ({:.0f}/s) on {} threads; {} requests, {} drafts, {} preemptions\n",
             j["operations"].get<uint64_t>(), j["seconds"].get<double>(),
             j["operations_per_second"].get<double>(), o.threads,
             j["requests"].get<uint64_t>(), j["drafts"].get<uint64_t>(),
             j["preemptions"].get<uint64_t>());
  fmt::print("invariant checks {}, failures {}; leaked {} blocks, {} bytes; rss start {} peak {} end {}\n",
             j["invariant_checks"].get<uint64_t>(), j["invariant_failures"].get<uint64_t>(),
             j["pool_blocks_leaked"].get<uint64_t>(), j["bytes_leaked"].get<uint64_t>(),
             j["rss_start_bytes"].get<uint64_t>(), j["rss_peak_bytes"].get<uint64_t>(),
             j["rss_end_bytes"].get<uint64_t>());
}

// The result, then the exit code: 1 if a check failed (the first failure
// on stderr).
int Soak(const SoakOptions& o) {
  const Result<nlohmann::json> r = RunSoak(o);
  const int printed = PrintResult("soak", r, o.json, [&o](const nlohmann::json& j) { PrintText(o, j); });
  if (!r.ok()) return printed;
  const nlohmann::json& j = *r;
  const bool clean = j["invariant_failures"].get<uint64_t>() == 0 &&
                     j["pool_blocks_leaked"].get<uint64_t>() == 0 &&
                     j["bytes_leaked"].get<uint64_t>() == 0;
  if (!clean) fmt::print(stderr, "kvcache soak: {}\n", j["first_failure"].get<std::string>());
  return clean ? 0 : 1;
}

const bool kRegistered = RegisterOptionsCommand<SoakOptions>(
    "soak", "Serving path under load from several threads, with invariant and leak checks",
    [](CLI::App* app, SoakOptions& o) {
      app->add_option("--seconds", o.seconds, "Wall-clock run time (0: until --operations)")
          ->capture_default_str();
      app->add_option("--operations", o.operations, "Stop after this many operations (0: no limit)")
          ->capture_default_str();
      app->add_option("--threads", o.threads, "Worker threads")->capture_default_str();
      app->add_option("--blocks", o.blocks, "Blocks in the shared pool")->capture_default_str();
      app->add_option("--seed", o.seed, "Random seed")->capture_default_str();
      app->add_flag("--json", o.json, "Print JSON");
      app->add_option("--tiers", o.tiers,
                      "Offload tiers under the prefix cache (host:SIZE,disk:PATH:SIZE,redis://...)");
      app->add_option("--system-prompts", o.system_prompts, "Shared prompt prefixes")
          ->capture_default_str();
    },
    Soak);

}  // namespace
}  // namespace kvcache::tools
