// The engine: Submit and the streams on the callers' threads, everything
// else on one step thread (engine.h).
//
// Ownership. The waiting queue lives in Shared, under its mutex (Submit
// pushes, the step thread pops, a preempted request goes back to its front);
// running requests, their caches and the decoder belong to the step thread
// alone. A stream and the engine share the request's StreamState (the
// pending event, under its own mutex); a stream keeps a weak reference to
// Shared to wake the step thread when cancelled.
//
// Blocks. One paged CacheKv per running request on the one pool. Admission
// adopts the longest cached prefix (OffloadCache::AcquireInto over the
// context but its last token, so at least one token runs), then reserves
// the context plus one block (CacheKv::Reserve): a request that cannot get
// its reservation stays where it is in the queue, and admission stops for
// the step. Whether the reservation can be met is worked out first from a
// lookup that takes nothing and counts nothing (PrefixCache::Peek) and the
// pool's available blocks, so a request waiting for blocks costs no counted
// lookup per step. Full blocks are published as they fill
// (OffloadCache::Publish with the request's chain hashes; without tiers the
// offload cache only names them in the prefix cache). A step whose pass runs
// out of blocks preempts the youngest running request and runs again
// without it.
//
// Shared prefixes. Submit hashes the prompt's full blocks once (the chains
// the prefix cache names them by). A waiting request is held back while
// some running request, still publishing, has not yet published a block
// the waiting one could adopt: the block at that request's publication
// point carries the same chain hash in both (chains: equal there, equal
// before). One comparison per running request; a held request is passed
// over, and requests behind it may be admitted. The hold lapses if the
// running request's prefill stands still at kMaxStalledHolds admissions in
// a row (its step budget taken by decodes), so no one waits on a request
// that does not move.
#include "engine/engine.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include "engine/engine_text.h"
#include "engine/sampler.h"
#include "engine/stop_text.h"
#include "kvcache/geometry.h"
#include "kvcache/serving/offload.h"
#include "kvcache/pool.h"
#include "kvcache/serving/prefix_cache.h"
#include "model/decoder/decoder.h"
#include "model/kv/cache_kv.h"

namespace kvcache::engine {

std::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "error";
}

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kMaxStops = 8;
constexpr uint32_t kMaxStalledHolds = 4;
constexpr uint32_t kMaxTopLogprobs = 20;

// A request's output, shared by its stream and the engine.
struct StreamState {
  std::mutex mu;
  std::condition_variable cv;
  StreamEvent pending;  // what the next Next returns
  bool has_pending = false;
  bool delivered_final = false;
  std::atomic<bool> cancelled{false};
};

struct Request {
  uint64_t id = 0;
  RequestParams params;
  std::shared_ptr<StreamState> stream;
  std::vector<int32_t> tokens;  // the prompt, then every generated token
  // Chain hashes of tokens' full blocks: the prompt's from Submit, then
  // extended as blocks are published.
  std::vector<BlockHash> hashes;
  uint32_t generated = 0;
  uint32_t cached_tokens = 0;
  bool admitted_before = false;
  bool held_before = false;  // held back for a running request's prefill at least once
  // The request it was last held for, that one's computed tokens then, and
  // the admissions since at which they had not grown.
  uint64_t hold_leader = 0, hold_leader_tokens = 0;
  uint32_t hold_stalls = 0;
  bool done = false;
  uint64_t admit_seq = 0;  // larger: admitted later (preemption picks the largest)
  std::unique_ptr<model::CacheKv> kv;  // while running
  size_t published = 0;                // blocks [0, published) named in the prefix cache
  bool publish_stopped = false;        // stopped at a duplicate: no further
  int32_t prev = 0;                    // the token before the next piece
  TokenSampler sampler;
  StopText text;

  Request(uint64_t id_, RequestParams p, std::shared_ptr<StreamState> s)
      : id(id_),
        params(std::move(p)),
        stream(std::move(s)),
        tokens(params.prompt),
        prev(params.prompt.back()),
        sampler(params.sampling, params.sampling.seed.value_or(id_)),
        text(params.stop) {}
};

// What Submit, the streams and the step thread share.
struct Shared {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::unique_ptr<Request>> waiting;
  bool accepting = true;
  bool stopping = false;
  bool poke = false;  // a cancellation to look at
  Clock::time_point deadline;
};

class Stream final : public RequestStream {
 public:
  Stream(uint64_t id, std::shared_ptr<StreamState> state, std::weak_ptr<Shared> shared)
      : id_(id), state_(std::move(state)), shared_(std::move(shared)) {}
  ~Stream() override { Cancel(); }

  uint64_t id() const override { return id_; }

  bool Next(StreamEvent* out, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(state_->mu);
    if (state_->delivered_final) return false;
    if (!state_->cv.wait_for(lock, timeout, [&] { return state_->has_pending; })) return false;
    *out = std::move(state_->pending);
    state_->pending = StreamEvent{};
    state_->has_pending = false;
    if (out->finished) state_->delivered_final = true;
    return true;
  }

  void Cancel() override {
    if (state_->cancelled.exchange(true)) return;
    if (std::shared_ptr<Shared> s = shared_.lock()) {
      std::lock_guard<std::mutex> lock(s->mu);
      s->poke = true;
      s->cv.notify_all();
    }
  }

 private:
  uint64_t id_;
  std::shared_ptr<StreamState> state_;
  std::weak_ptr<Shared> shared_;
};

std::vector<double> StepBounds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
}

bool Finite(float x) { return std::isfinite(x); }

class EngineImpl final : public Engine {
 public:
  EngineImpl(const model::LoadedModel& model, const EngineOptions& options)
      : model_(model),
        options_(options),
        decoder_(model.model(), options.threads),
        stop_tokens_(model.stop_tokens()),
        shared_(std::make_shared<Shared>()) {
    counters_.step_seconds_bounds = StepBounds();
    counters_.step_seconds_counts.assign(counters_.step_seconds_bounds.size(), 0);
  }
  ~EngineImpl() override { Shutdown(std::chrono::milliseconds(0)); }

  Status Init();
  void Start() { thread_ = std::thread([this] { Loop(); }); }

  using Engine::Submit;
  Result<std::shared_ptr<RequestStream>> Submit(RequestParams params, SubmitFault* fault) override;
  EngineMetrics Metrics() const override;
  const model::LoadedModel& model() const override { return model_; }
  const EngineOptions& options() const override { return options_; }
  void Shutdown(std::chrono::milliseconds deadline) override;

 private:
  Status CheckParams(const RequestParams& p) const;
  void Loop();
  // False when the loop should end (after cancelling what is left if the deadline passed).
  bool WaitForWork();
  void Step();
  void DropCancelled();
  void Admit();
  // True while a running request will publish, and has not yet, a full
  // block `r` could adopt (its publication point's chain hash is r's too),
  // unless that request's prefill has stood still at the last
  // kMaxStalledHolds admissions (a step budget the decodes take whole).
  bool HeldBack(Request& r) const;
  // Whether r's reservation can be met now, adopting what the prefix cache
  // holds (looked up without references or counting).
  bool CanReserve(const Request& r) const;
  Status StartRequest(Request& r);
  size_t Adopt(model::CacheKv& kv, const Request& r);
  void RunBatch();
  // One ForwardBatch over what fits; preempts and retries on pool exhaustion.
  // Fills in_step (the requests in the pass, item order); false if the pass failed.
  bool Forward(std::vector<Request*>* in_step);
  void Preempt();
  void Publish(Request& r);
  void OnLogits(Request& r, std::span<const float> logits);
  void Emit(Request& r, TokenOut out);
  void Finish(Request& r, FinishReason reason, Status error = Status::Ok());
  void SweepDone();
  void RecordStep(double seconds);

  const model::LoadedModel& model_;
  const EngineOptions options_;
  model::Decoder decoder_;
  const std::vector<int32_t> stop_tokens_;
  std::shared_ptr<BlockPool> pool_;
  std::unique_ptr<PrefixCache> prefix_;
  std::unique_ptr<OffloadCache> offload_;  // over prefix_ (no tiers: names blocks only)
  std::shared_ptr<Shared> shared_;
  std::atomic<uint64_t> next_id_{1};

  // The step thread's.
  std::vector<std::unique_ptr<Request>> running_;
  std::vector<float> logits_;
  uint64_t admit_counter_ = 0;
  uint64_t passes_ = 0;  // batches built (the decode rotation)

  mutable std::mutex metrics_mu_;
  EngineMetrics counters_;  // the counters; pool and queue figures are read live

  std::mutex join_mu_;
  std::thread thread_;
};

Status EngineImpl::Init() {
  const EngineOptions& o = options_;
  if (o.threads == 0 || o.max_batch_tokens == 0 || o.max_running == 0 || o.max_waiting == 0) {
    return Status::InvalidArgument("engine: threads, max_batch_tokens, max_running and max_waiting must be > 0");
  }
  if (!o.tiers.empty() && !o.prefix_cache) {
    return Status::InvalidArgument("engine: tiers need the prefix cache");
  }
  if (!o.tiers.empty() && o.model_id.empty()) {
    return Status::InvalidArgument("engine: tiers need model_id (the model's fingerprint)");
  }
  const model::AttentionShape s = decoder_.attention_shape();
  KV_ASSIGN_OR_RETURN(Geometry geometry,
                      Geometry::Create({s.n_layers, s.n_kv_heads, s.head_dim, o.block_size}));
  const uint32_t blocks = BlockPool::BlocksForBytes(geometry, o.formats, o.pool_bytes);
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

// The prompt is checked by PreparePrompt (engine_text.h).
Status EngineImpl::CheckParams(const RequestParams& p) const {
  if (p.max_tokens == 0) return Status::InvalidArgument("request: max_tokens must be >= 1");
  const SamplingParams& s = p.sampling;
  if (!Finite(s.temperature)) return Status::InvalidArgument("request: temperature must be finite");
  if (!(s.top_p > 0.0f && s.top_p <= 1.0f)) {
    return Status::InvalidArgument("request: top_p must be in (0, 1]");
  }
  if (p.top_logprobs > kMaxTopLogprobs) {
    return Status::InvalidArgument("request: top_logprobs must be at most " + std::to_string(kMaxTopLogprobs));
  }
  if (p.stop.size() > kMaxStops) {
    return Status::InvalidArgument("request: at most " + std::to_string(kMaxStops) + " stop strings");
  }
  for (const std::string& stop : p.stop) {
    if (stop.empty()) return Status::InvalidArgument("request: an empty stop string");
  }
  return Status::Ok();
}

Result<std::shared_ptr<RequestStream>> EngineImpl::Submit(RequestParams params, SubmitFault* fault) {
  SubmitFault ignored = SubmitFault::kNone;
  SubmitFault& why = fault != nullptr ? *fault : ignored;
  KV_RETURN_IF_ERROR(PreparePrompt(model_, &params, &why));
  why = SubmitFault::kParams;
  KV_RETURN_IF_ERROR(CheckParams(params));
  why = SubmitFault::kEngine;
  std::vector<BlockHash> hashes;
  if (options_.prefix_cache) {
    const std::vector<TokenId> ids(params.prompt.begin(), params.prompt.end());
    hashes = HashFullBlocks(ids, options_.block_size, "");
  }
  auto state = std::make_shared<StreamState>();
  std::lock_guard<std::mutex> lock(shared_->mu);
  if (!shared_->accepting) return Status::FailedPrecondition("engine: shut down");
  if (shared_->waiting.size() >= options_.max_waiting) {
    return Status::CapacityExceeded("engine: " + std::to_string(shared_->waiting.size()) +
                                     " requests wait already (max_waiting)");
  }
  why = SubmitFault::kNone;
  const uint64_t id = next_id_.fetch_add(1);
  auto request = std::make_unique<Request>(id, std::move(params), state);
  request->hashes = std::move(hashes);
  shared_->waiting.push_back(std::move(request));
  shared_->cv.notify_all();
  return std::shared_ptr<RequestStream>(std::make_shared<Stream>(id, state, shared_));
}

EngineMetrics EngineImpl::Metrics() const {
  EngineMetrics m;
  {
    std::lock_guard<std::mutex> lock(metrics_mu_);
    m = counters_;
  }
  const PoolStats ps = pool_->stats();
  m.pool_blocks_total = ps.num_blocks;
  m.pool_blocks_free = ps.free_blocks;
  m.pool_blocks_used = ps.used_blocks;
  m.pool_blocks_cached = ps.cached_blocks;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    m.requests_waiting = shared_->waiting.size();
  }
  if (prefix_) m.prefix_lookups = prefix_->stats().lookups;
  if (offload_) {
    for (const TierStats& t : offload_->stats().tiers) {
      m.tier_hit_blocks += t.hit_blocks;
      for (uint64_t miss : t.misses) m.tier_miss_blocks += miss;
    }
  }
  return m;
}

void EngineImpl::Shutdown(std::chrono::milliseconds deadline) {
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->accepting = false;
    const Clock::time_point at = Clock::now() + deadline;
    shared_->deadline = shared_->stopping ? std::min(shared_->deadline, at) : at;
    shared_->stopping = true;
    shared_->cv.notify_all();
  }
  std::lock_guard<std::mutex> lock(join_mu_);
  if (thread_.joinable()) thread_.join();
}

bool EngineImpl::WaitForWork() {
  std::vector<std::unique_ptr<Request>> cancel;
  {
    std::unique_lock<std::mutex> lock(shared_->mu);
    Shared& s = *shared_;
    auto ready = [&] { return s.poke || s.stopping || !s.waiting.empty() || !running_.empty(); };
    if (!s.stopping) s.cv.wait(lock, ready);
    s.poke = false;
    if (!s.stopping) return true;
    if (s.waiting.empty() && running_.empty()) return false;
    if (Clock::now() < s.deadline) return true;
    for (auto& r : s.waiting) cancel.push_back(std::move(r));
    s.waiting.clear();
  }
  // The deadline passed: cancel everything left.
  for (auto& r : cancel) Finish(*r, FinishReason::kCancelled);
  for (auto& r : running_) Finish(*r, FinishReason::kCancelled);
  SweepDone();
  return false;
}

void EngineImpl::Loop() {
  while (WaitForWork()) Step();
}

void EngineImpl::Step() {
  DropCancelled();
  Admit();
  {
    std::lock_guard<std::mutex> lock(metrics_mu_);
    counters_.requests_running = running_.size();
  }
  if (running_.empty()) return;
  const Clock::time_point t0 = Clock::now();
  RunBatch();
  RecordStep(std::chrono::duration<double>(Clock::now() - t0).count());
}

void EngineImpl::DropCancelled() {
  for (auto& r : running_) {
    if (r->stream->cancelled.load()) Finish(*r, FinishReason::kCancelled);
  }
  SweepDone();
  std::vector<std::unique_ptr<Request>> gone;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    auto& w = shared_->waiting;
    for (auto it = w.begin(); it != w.end();) {
      if ((*it)->stream->cancelled.load()) {
        gone.push_back(std::move(*it));
        it = w.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& r : gone) Finish(*r, FinishReason::kCancelled);
}

// Admits waiting requests in queue order, passing over the held-back ones
// (each is compared with the running set as it stands, so a request
// admitted here holds back the later ones that share its prefix).
void EngineImpl::Admit() {
  uint64_t held = 0, newly_held = 0;
  size_t at = 0;  // the next candidate's place in the queue
  while (running_.size() < options_.max_running) {
    std::unique_ptr<Request> r;
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      auto& w = shared_->waiting;
      for (; at < w.size() && HeldBack(*w[at]); ++at, ++held) {
        newly_held += w[at]->held_before ? 0 : 1;
        w[at]->held_before = true;
      }
      if (at == w.size()) break;
      r = std::move(w[at]);
      w.erase(w.begin() + static_cast<std::ptrdiff_t>(at));
    }
    // With nothing running, blocks cannot come back: try, and fail if it must.
    const bool wait = !running_.empty() && !CanReserve(*r);
    Status s = wait ? Status::Ok() : StartRequest(*r);
    if (!wait && s.ok()) {
      running_.push_back(std::move(r));
      continue;
    }
    if (wait || (s.IsPoolExhausted() && !running_.empty())) {  // waits for blocks to come back
      std::lock_guard<std::mutex> lock(shared_->mu);
      shared_->waiting.insert(shared_->waiting.begin() + static_cast<std::ptrdiff_t>(at), std::move(r));
      break;
    }
    Finish(*r, FinishReason::kError, s);
  }
  std::lock_guard<std::mutex> lock(metrics_mu_);
  counters_.requests_held = held;
  counters_.prefix_holds += newly_held;
}

bool EngineImpl::HeldBack(Request& r) const {
  const uint32_t B = options_.block_size;
  const size_t adoptable = std::min(r.hashes.size(), (r.tokens.size() - 1) / B);
  if (!offload_ || adoptable == 0) return false;
  for (const auto& leader : running_) {
    const size_t p = leader->published;
    if (leader->publish_stopped || leader->done || leader->stream->cancelled.load()) continue;
    if (p >= adoptable || p >= leader->hashes.size() || leader->hashes[p] != r.hashes[p]) continue;
    const uint64_t computed = leader->kv->num_tokens();
    const bool stalled = r.hold_leader == leader->id && r.hold_leader_tokens == computed;
    r.hold_stalls = stalled ? r.hold_stalls + 1 : 0;
    r.hold_leader = leader->id;
    r.hold_leader_tokens = computed;
    return r.hold_stalls < kMaxStalledHolds;
  }
  return false;
}

bool EngineImpl::CanReserve(const Request& r) const {
  const uint32_t B = options_.block_size;
  const uint64_t want = std::min<uint64_t>(r.tokens.size() + B, decoder_.config().max_seq_len);
  uint64_t hit = 0, parked = 0;
  if (prefix_) {
    const std::vector<TokenId> ids(r.tokens.begin(), r.tokens.end() - 1);
    const PrefixMatch m = prefix_->Peek(ids, "");
    hit = m.blocks.size();
    for (uint32_t b : m.blocks) parked += pool_->state(b) == BlockState::kCached ? 1 : 0;
  }
  // Adopting a parked block takes it out of the available ones; the rest
  // of the reservation needs new blocks (a tier's hit takes pool blocks too).
  const uint64_t need = (want + B - 1) / B - std::min<uint64_t>(hit, (want + B - 1) / B);
  return need + parked <= pool_->stats().available_blocks;
}

size_t EngineImpl::Adopt(model::CacheKv& kv, const Request& r) {
  if (!offload_) return 0;
  // Every cached block but the one holding the last token: a token must run.
  const std::vector<TokenId> ids(r.tokens.begin(), r.tokens.end() - 1);
  auto adopted = offload_->AcquireInto(
      ids, "",
      [&kv](std::span<const uint32_t> blocks, std::shared_ptr<const Calibration> calibration,
            std::shared_ptr<const WindowSinks> sinks) {
        return kv.AdoptPrefix(blocks, std::move(calibration), std::move(sinks));
      });
  return adopted.ok() ? *adopted : 0;  // a failed adoption leaves kv empty: recompute
}

Status EngineImpl::StartRequest(Request& r) {
  model::CacheKvOptions o;
  o.formats = options_.formats;
  o.window = options_.window;
  o.layout = CacheLayout::kPaged;
  o.block_size = options_.block_size;
  o.pool = pool_;
  o.attention_pool = decoder_.thread_pool();
  KV_ASSIGN_OR_RETURN(std::unique_ptr<model::CacheKv> kv,
                      model::CacheKv::Create(decoder_.attention_shape(), o));
  const size_t adopted = Adopt(*kv, r);
  const uint32_t max_seq = decoder_.config().max_seq_len;
  const uint64_t want = std::min<uint64_t>(r.tokens.size() + options_.block_size, max_seq);
  KV_RETURN_IF_ERROR(kv->Reserve(static_cast<uint32_t>(want)));  // kv's blocks go back on failure
  r.kv = std::move(kv);
  r.published = adopted / options_.block_size;
  r.publish_stopped = false;
  r.admit_seq = ++admit_counter_;
  if (!r.admitted_before) {
    r.admitted_before = true;
    r.cached_tokens = static_cast<uint32_t>(adopted);
    std::lock_guard<std::mutex> lock(metrics_mu_);
    counters_.prompt_tokens += r.params.prompt.size();
    counters_.cached_prompt_tokens += adopted;
  }
  return Status::Ok();
}

bool EngineImpl::Forward(std::vector<Request*>* in_step) {
  const uint32_t vocab = decoder_.config().vocab_size;
  for (;;) {
    in_step->clear();
    std::vector<model::BatchItem> items;
    uint32_t budget = options_.max_batch_tokens;
    // Decodes (one pending token) first, then prefill chunks, in admission
    // order; when the budget cannot take every decode, the first one taken
    // rotates with the step count so that none waits for ever.
    const size_t n = running_.size(), first = budget < n ? passes_ % n : 0;
    ++passes_;
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t k = 0; k < n; ++k) {
        Request* r = running_[pass == 0 ? (first + k) % n : k].get();
        const size_t pending = r->tokens.size() - r->kv->num_tokens();
        if ((pending == 1) != (pass == 0) || budget == 0) continue;
        const uint32_t take = static_cast<uint32_t>(std::min<size_t>(pending, budget));
        budget -= take;
        items.push_back({std::span<const int32_t>(r->tokens).subspan(r->kv->num_tokens(), take), r->kv.get(),
                         false});
        in_step->push_back(r);
      }
    }
    logits_.resize(items.size() * size_t{vocab});
    Status s = decoder_.ForwardBatch(items, logits_);
    if (s.ok()) return true;
    if (s.IsPoolExhausted() && running_.size() > 1) {
      Preempt();
      continue;
    }
    for (Request* r : *in_step) Finish(*r, FinishReason::kError, s);
    SweepDone();
    return false;
  }
}

void EngineImpl::Preempt() {
  auto youngest = std::max_element(running_.begin(), running_.end(), [](const auto& a, const auto& b) {
    return a->admit_seq < b->admit_seq;
  });
  std::unique_ptr<Request> r = std::move(*youngest);
  running_.erase(youngest);
  r->kv.reset();  // its published blocks stay cached
  r->published = 0;
  {
    std::lock_guard<std::mutex> lock(metrics_mu_);
    ++counters_.preemptions;
  }
  std::lock_guard<std::mutex> lock(shared_->mu);
  shared_->waiting.push_front(std::move(r));
}

void EngineImpl::RunBatch() {
  std::vector<Request*> in_step;
  if (!Forward(&in_step)) return;
  const uint32_t vocab = decoder_.config().vocab_size;
  for (size_t i = 0; i < in_step.size(); ++i) {
    Request& r = *in_step[i];
    Publish(r);
    if (r.kv->num_tokens() < r.tokens.size()) continue;  // prefill goes on
    OnLogits(r, std::span<const float>(logits_).subspan(i * vocab, vocab));
  }
  SweepDone();
}

void EngineImpl::Publish(Request& r) {
  if (!offload_ || r.publish_stopped) return;
  const uint32_t B = options_.block_size;
  const size_t full = r.kv->num_tokens() / B;
  if (full <= r.published) return;
  const std::vector<TokenId> ids(r.tokens.begin(), r.tokens.begin() + full * B);
  while (r.hashes.size() < full) {
    const size_t b = r.hashes.size();
    const BlockHash parent = b == 0 ? ChainRoot("") : r.hashes.back();
    r.hashes.push_back(ChainHash(parent, std::span<const TokenId>(ids).subspan(b * B, B)));
  }
  model::CacheKv* kv = r.kv.get();
  // The window's sinks go with the block that completes them, when this
  // publication names it (copied only then).
  std::shared_ptr<const WindowSinks> sinks;
  const uint32_t S = options_.window.sinks;
  if (S > 0 && r.published <= (S - 1) / B && (S - 1) / B < full) sinks = kv->cache().window_sinks();
  auto end = offload_->Publish(
      std::span<const BlockHash>(r.hashes).first(full), kv->cache().block_table(), r.published, ids, "",
      kv->cache().calibration(),
      [kv](size_t block, uint64_t hash) { return kv->SetBlockHash(static_cast<uint32_t>(block), hash); },
      std::move(sinks));
  if (!end.ok() || *end < full) {
    r.publish_stopped = true;  // a duplicate (or an error): the rest stays private
    return;
  }
  r.published = *end;
}

void EngineImpl::OnLogits(Request& r, std::span<const float> logits) {
  const int32_t t = r.sampler.Sample(logits);
  const bool stop_token = !r.params.ignore_eos &&
                          std::find(stop_tokens_.begin(), stop_tokens_.end(), t) != stop_tokens_.end();
  if (stop_token) {
    Finish(r, FinishReason::kStop);
    return;
  }
  TokenOut out;
  out.token = t;
  if (r.params.logprobs) {
    out.logprob = LogprobOf(logits, t);
    out.top = TopLogprobs(logits, r.params.top_logprobs);
  }
  r.tokens.push_back(t);
  ++r.generated;
  SetPieces(model_, r.prev, &out);
  r.prev = t;
  bool stopped = false;
  out.text = r.text.Add(out.piece, &stopped);
  Emit(r, std::move(out));
  if (stopped) {
    Finish(r, FinishReason::kStop);
  } else if (r.generated >= r.params.max_tokens || r.tokens.size() >= decoder_.config().max_seq_len) {
    Finish(r, FinishReason::kLength);
  }
}

void EngineImpl::Emit(Request& r, TokenOut out) {
  {
    std::lock_guard<std::mutex> lock(metrics_mu_);
    ++counters_.generated_tokens;
  }
  std::lock_guard<std::mutex> lock(r.stream->mu);
  r.stream->pending.tokens.push_back(std::move(out));
  r.stream->has_pending = true;
  r.stream->cv.notify_all();
}

void EngineImpl::Finish(Request& r, FinishReason reason, Status error) {
  if (r.done) return;
  r.done = true;
  r.kv.reset();
  {
    std::lock_guard<std::mutex> lock(metrics_mu_);
    ++(reason == FinishReason::kCancelled ? counters_.requests_cancelled : counters_.requests_finished);
  }
  std::lock_guard<std::mutex> lock(r.stream->mu);
  StreamEvent& e = r.stream->pending;
  e.finished = true;
  e.finish_reason = reason;
  e.error = std::move(error);
  e.text_tail = r.text.TakeHeld();
  e.usage.prompt_tokens = static_cast<uint32_t>(r.params.prompt.size());
  e.usage.completion_tokens = r.generated;
  e.usage.cached_tokens = r.cached_tokens;
  r.stream->has_pending = true;
  r.stream->cv.notify_all();
}

void EngineImpl::SweepDone() {
  std::erase_if(running_, [](const std::unique_ptr<Request>& r) { return r->done; });
}

void EngineImpl::RecordStep(double seconds) {
  std::lock_guard<std::mutex> lock(metrics_mu_);
  ++counters_.steps;
  counters_.step_seconds_sum += seconds;
  for (size_t i = 0; i < counters_.step_seconds_bounds.size(); ++i) {
    if (seconds <= counters_.step_seconds_bounds[i]) ++counters_.step_seconds_counts[i];
  }
  counters_.requests_running = running_.size();
}

}  // namespace

Result<std::unique_ptr<Engine>> Engine::Create(const model::LoadedModel& model,
                                               const EngineOptions& options) {
  auto engine = std::make_unique<EngineImpl>(model, options);
  KV_RETURN_IF_ERROR(engine->Init());
  engine->Start();
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace kvcache::engine
