// The engine: Submit and the streams on the callers' threads, everything
// else on one step thread (engine.h).
//
// Ownership. Who runs is the Scheduler's (scheduler.h: admission, the
// step's batch, preemption, the prefix hold); what a request's K/V needs is
// the KV manager's (kv_manager.h: adopt, reserve, publish, free); the
// engine joins them (it is the scheduler's SchedulerKv), runs the decoder
// and streams the tokens. The waiting queue lives in the scheduler, under
// Shared's mutex (Submit pushes, the step thread pops, a preempted request
// goes back to its front); running requests, their K/V and the decoder
// belong to the step thread alone. A stream and the engine share the
// request's StreamState (the pending event, under its own mutex); a stream
// keeps a weak reference to Shared to wake the step thread when cancelled.
//
// Shared prefixes. Submit has the manager hash the prompt's full blocks once
// (the chains the prefix cache names them by), so the scheduler's hold rule
// costs one comparison per running request (KvManager::WillPublishFor).
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
#include "engine/kv_manager.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/stop_text.h"
#include "model/decoder/decoder.h"

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

// A request: what the scheduler knows of it (id, tokens, admission and
// hold state), its K/V while running, and its output.
struct Request final : ScheduledRequest {
  RequestParams params;
  std::shared_ptr<StreamState> stream;
  std::vector<int32_t> tokens;  // the prompt, then every generated token
  // Chain hashes of tokens' full blocks: the prompt's from Submit, then
  // extended as blocks are published.
  std::vector<BlockHash> hashes;
  uint32_t generated = 0;
  uint32_t cached_tokens = 0;
  bool admitted_before = false;
  std::unique_ptr<KvSequence> seq;  // while running
  int32_t prev = 0;                 // the token before the next piece
  TokenSampler sampler;
  StopText text;

  Request(uint64_t id_, RequestParams p, std::shared_ptr<StreamState> s)
      : params(std::move(p)),
        stream(std::move(s)),
        tokens(params.prompt),
        prev(params.prompt.back()),
        sampler(params.sampling, params.sampling.seed.value_or(id_)),
        text(params.stop) {
    id = id_;
  }
  size_t context_size() const override { return tokens.size(); }
  bool cancelled() const override { return stream->cancelled.load(); }
};

Request& AsRequest(ScheduledRequest& r) { return static_cast<Request&>(r); }
const Request& AsRequest(const ScheduledRequest& r) { return static_cast<const Request&>(r); }

// What Submit, the streams and the step thread share (mu also guards the
// scheduler's waiting queue).
struct Shared {
  std::mutex mu;
  std::condition_variable cv;
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

SchedulerOptions SchedulerOptionsOf(const EngineOptions& o) {
  SchedulerOptions s;
  s.max_batch_tokens = o.max_batch_tokens;
  s.max_running = o.max_running;
  return s;
}

class EngineImpl final : public Engine, private SchedulerKv {
 public:
  EngineImpl(const model::LoadedModel& model, const EngineOptions& options)
      : model_(model),
        options_(options),
        decoder_(model.model(), options.threads),
        stop_tokens_(model.stop_tokens()),
        shared_(std::make_shared<Shared>()),
        scheduler_(SchedulerOptionsOf(options), this, &shared_->mu) {
    counters_.step_seconds_bounds = StepBounds();
    counters_.step_seconds_counts.assign(counters_.step_seconds_bounds.size(), 0);
  }
  ~EngineImpl() override { Shutdown(std::chrono::milliseconds(0)); }

  Status Init();
  void Start() { thread_ = std::thread([this] { Loop(); }); }

  using Engine::Submit;
  Result<std::shared_ptr<RequestStream>> Submit(RequestParams params, SubmitFault* fault) override;
  bool prefix_caching() const override { return kv_->prefix_caching(); }
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
  void RunBatch();
  // One ForwardBatch over what the scheduler plans; preempts and retries on
  // pool exhaustion. Fills in_step (the requests in the pass, item order);
  // false if the pass failed.
  bool Forward(std::vector<Request*>* in_step);
  std::vector<std::unique_ptr<ScheduledRequest>>& running() { return scheduler_.running(); }

  // SchedulerKv: the KV manager, for the scheduler.
  bool Fits(const ScheduledRequest&) const override { return true; }  // Init: the pool holds a whole context
  bool CanAdmit(const ScheduledRequest& r) const override { return kv_->CanAdmit(AsRequest(r).tokens); }
  Status Admit(ScheduledRequest& r, std::vector<std::unique_ptr<ScheduledRequest>>* forks) override;
  uint64_t Computed(const ScheduledRequest& r) const override { return AsRequest(r).seq->num_tokens(); }
  bool WillPublishFor(const ScheduledRequest& leader, const ScheduledRequest& r) const override {
    const Request& l = AsRequest(leader);
    return kv_->WillPublishFor(*l.seq, l.hashes, AsRequest(r).tokens, AsRequest(r).hashes);
  }
  void Release(ScheduledRequest& r) override { AsRequest(r).seq.reset(); }  // published blocks stay cached
  void OnLogits(Request& r, std::span<const float> logits);
  void Emit(Request& r, TokenOut out);
  void Finish(Request& r, FinishReason reason, Status error = Status::Ok());
  void SweepDone();
  void RecordStep(double seconds);

  const model::LoadedModel& model_;
  const EngineOptions options_;
  model::Decoder decoder_;
  const std::vector<int32_t> stop_tokens_;
  std::unique_ptr<KvManager> kv_;
  std::shared_ptr<Shared> shared_;
  std::atomic<uint64_t> next_id_{1};
  Scheduler scheduler_;  // its waiting queue under shared_->mu, the rest the step thread's

  // The step thread's.
  std::vector<float> logits_;

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
  const KvManagerOptions k{.formats = o.formats, .local_formats = o.local_formats, .window = o.window, .block_size = o.block_size,
                           .pool_bytes = o.pool_bytes, .prefix_cache = o.prefix_cache, .tiers = o.tiers,
                           .model_id = o.model_id, .max_chunk_tokens = o.max_batch_tokens,
                           .pool_balance_tokens = o.pool_balance_tokens};
  KV_ASSIGN_OR_RETURN(kv_, KvManager::Create(decoder_.attention_shape(), decoder_.thread_pool(), k));
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
  std::vector<BlockHash> hashes = kv_->HashPrompt(params.prompt);
  auto state = std::make_shared<StreamState>();
  std::lock_guard<std::mutex> lock(shared_->mu);
  if (!shared_->accepting) return Status::FailedPrecondition("engine: shut down");
  const size_t waiting = scheduler_.num_waiting_locked();
  if (waiting >= options_.max_waiting) {
    return Status::CapacityExceeded("engine: " + std::to_string(waiting) + " requests wait already (max_waiting)");
  }
  why = SubmitFault::kNone;
  const uint64_t id = next_id_.fetch_add(1);
  auto request = std::make_unique<Request>(id, std::move(params), state);
  request->hashes = std::move(hashes);
  scheduler_.EnqueueLocked(std::move(request));
  shared_->cv.notify_all();
  return std::shared_ptr<RequestStream>(std::make_shared<Stream>(id, state, shared_));
}

EngineMetrics EngineImpl::Metrics() const {
  EngineMetrics m;
  {
    std::lock_guard<std::mutex> lock(metrics_mu_);
    m = counters_;
  }
  const KvMetrics kv = kv_->Metrics();
  for (const KvGroupMetrics& g : kv.groups) {
    m.pool_blocks_total += g.blocks_total;
    m.pool_blocks_free += g.blocks_free;
    m.pool_blocks_used += g.blocks_used;
    m.pool_blocks_cached += g.blocks_cached;
    m.pool_groups.push_back({.kind = std::string(KvGroupKindName(g.kind)),
                             .total = g.blocks_total,
                             .free = g.blocks_free,
                             .used = g.blocks_used,
                             .cached = g.blocks_cached,
                             .reserved = g.blocks_reserved});
  }
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    m.requests_waiting = scheduler_.num_waiting_locked();
  }
  m.prefix_lookups = kv.prefix_lookups;
  m.tier_hit_blocks = kv.tier_hit_blocks;
  m.tier_miss_blocks = kv.tier_miss_blocks;
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
  std::deque<std::unique_ptr<ScheduledRequest>> cancel;
  {
    std::unique_lock<std::mutex> lock(shared_->mu);
    Shared& s = *shared_;
    auto idle = [&] { return scheduler_.num_waiting_locked() == 0 && running().empty(); };
    auto ready = [&] { return s.poke || s.stopping || !idle(); };
    if (!s.stopping) s.cv.wait(lock, ready);
    s.poke = false;
    if (!s.stopping) return true;
    if (idle()) return false;
    if (Clock::now() < s.deadline) return true;
    cancel = scheduler_.TakeWaitingLocked();
  }
  // The deadline passed: cancel everything left.
  for (auto& r : cancel) Finish(AsRequest(*r), FinishReason::kCancelled);
  for (auto& r : running()) Finish(AsRequest(*r), FinishReason::kCancelled);
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
    counters_.requests_running = running().size();
  }
  if (running().empty()) return;
  const Clock::time_point t0 = Clock::now();
  RunBatch();
  RecordStep(std::chrono::duration<double>(Clock::now() - t0).count());
}

void EngineImpl::DropCancelled() {
  for (auto& r : running()) {
    if (r->cancelled()) Finish(AsRequest(*r), FinishReason::kCancelled);
  }
  SweepDone();
  for (auto& r : scheduler_.TakeWaitingIf([](const ScheduledRequest& w) { return w.cancelled(); })) {
    Finish(AsRequest(*r), FinishReason::kCancelled);
  }
}

void EngineImpl::Admit() {
  AdmitResult admitted = scheduler_.Admit();
  for (auto& [r, error] : admitted.failed) Finish(AsRequest(*r), FinishReason::kError, std::move(error));
  std::lock_guard<std::mutex> lock(metrics_mu_);
  counters_.requests_held = admitted.held;
  counters_.prefix_holds += admitted.newly_held;
}

Status EngineImpl::Admit(ScheduledRequest& sr, std::vector<std::unique_ptr<ScheduledRequest>>*) {
  Request& r = AsRequest(sr);
  KV_ASSIGN_OR_RETURN(r.seq, kv_->Admit(r.tokens));
  if (!r.admitted_before) {
    r.admitted_before = true;
    r.cached_tokens = r.seq->cached_tokens();
    std::lock_guard<std::mutex> lock(metrics_mu_);
    counters_.prompt_tokens += r.params.prompt.size();
    counters_.cached_prompt_tokens += r.cached_tokens;
  }
  return Status::Ok();
}

bool EngineImpl::Forward(std::vector<Request*>* in_step) {
  const uint32_t vocab = decoder_.config().vocab_size;
  for (;;) {
    in_step->clear();
    std::vector<model::BatchItem> items;
    for (const BatchSlot& slot : scheduler_.Plan()) {
      Request* r = &AsRequest(*slot.request);
      items.push_back({std::span<const int32_t>(r->tokens).subspan(slot.begin, slot.count), r->seq.get(), false});
      in_step->push_back(r);
    }
    logits_.resize(items.size() * size_t{vocab});
    Status s = decoder_.ForwardBatch(items, logits_);
    if (s.ok()) return true;
    if (s.IsPoolExhausted() && running().size() > 1) {
      scheduler_.PreemptYoungest();
      std::lock_guard<std::mutex> lock(metrics_mu_);
      ++counters_.preemptions;
      continue;
    }
    for (Request* r : *in_step) Finish(*r, FinishReason::kError, s);
    SweepDone();
    return false;
  }
}

void EngineImpl::RunBatch() {
  std::vector<Request*> in_step;
  if (!Forward(&in_step)) return;
  const uint32_t vocab = decoder_.config().vocab_size;
  for (size_t i = 0; i < in_step.size(); ++i) {
    Request& r = *in_step[i];
    (void)kv_->Publish(*r.seq, r.tokens, &r.hashes);  // a failure stops the request's publication only
    if (r.seq->num_tokens() < r.tokens.size()) continue;  // prefill goes on
    OnLogits(r, std::span<const float>(logits_).subspan(i * vocab, vocab));
  }
  SweepDone();
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
  r.seq.reset();
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

void EngineImpl::SweepDone() { scheduler_.SweepDone(); }

void EngineImpl::RecordStep(double seconds) {
  std::lock_guard<std::mutex> lock(metrics_mu_);
  ++counters_.steps;
  counters_.step_seconds_sum += seconds;
  for (size_t i = 0; i < counters_.step_seconds_bounds.size(); ++i) {
    if (seconds <= counters_.step_seconds_bounds[i]) ++counters_.step_seconds_counts[i];
  }
  counters_.requests_running = running().size();
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
