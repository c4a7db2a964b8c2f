// The serving simulation loop (see simulator.h for what a step does). Who
// is admitted, in what order the running sequences grow, and which one is
// preempted is the engine's Scheduler (engine/scheduler.h), as in the
// engine: first come first served (no prefix hold), max_running sequences,
// no token budget (a step decodes every running sequence), the youngest
// preempted first. This loop is the scheduler's SchedulerKv and runs the
// steps. Every block a request holds, the prefix cache and the tiers are
// the engine's KV manager's (engine/kv_manager.h), created without rows:
// a running sequence holds a KvSequence whose block table grows and
// shrinks as rows would make it.
//
// Bookkeeping per running sequence: its committed tokens, its KvSequence
// (rows: drafts included while a step runs) and the chain hashes of its
// committed full blocks. Invariant between steps: the sequences' undrawn
// reservations sum to what the pool has reserved, and no sequence holds
// drafts.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <mutex>
#include <random>
#include <unordered_map>

#include <fmt/format.h>
#include <xxhash.h>

#include "engine/kv_manager.h"
#include "engine/scheduler.h"
#include "engine/sim/simulator_internal.h"

namespace kvcache {

Result<AdmissionPolicy> ParseAdmissionPolicy(std::string_view name) {
  if (name == "prompt") return AdmissionPolicy::kReservePrompt;
  if (name == "worst-case") return AdmissionPolicy::kReserveWorstCase;
  return Status::InvalidArgument(fmt::format("unknown admission policy '{}' (prompt, worst-case)", name));
}

std::string_view AdmissionPolicyName(AdmissionPolicy policy) {
  return policy == AdmissionPolicy::kReservePrompt ? "prompt" : "worst-case";
}

namespace serving {
namespace {

constexpr uint32_t kVocab = 32000;

uint32_t CeilDiv(uint64_t a, uint32_t b) { return static_cast<uint32_t>((a + b - 1) / b); }

engine::KvReservation ReservationOf(AdmissionPolicy policy) {
  return policy == AdmissionPolicy::kReservePrompt ? engine::KvReservation::kPrompt
                                                   : engine::KvReservation::kWorstCase;
}

// A sequence as the scheduler sees it. Waiting: a new request (all its
// samples: width = num_samples) or a preempted sample resuming after `done`
// committed outputs. Running: one sample, its tokens and K/V.
struct Seq final : engine::ScheduledRequest {
  const Request* req = nullptr;
  uint32_t sample = 0;          // its (first) sample
  uint32_t resume_outputs = 0;  // committed outputs when it was queued
  bool counted_queue = false;   // its queueing delay was already recorded
  std::vector<TokenId> tokens;  // committed: prompt + outputs
  uint32_t generated = 0;       // committed outputs
  uint32_t target = 0;          // outputs it will produce in total
  // Running (not finished or preempted this step): its rows (committed;
  // drafts while a step runs) on the KV manager's pool.
  std::unique_ptr<engine::KvSequence> kv;
  std::vector<BlockHash> hashes;  // chain hashes of the committed full blocks

  Seq(const Request* r, uint32_t first_sample, uint32_t num_samples, uint32_t done_outputs, bool counted)
      : req(r), sample(first_sample), resume_outputs(done_outputs), counted_queue(counted) {
    id = r->id;
    width = num_samples;
  }
  size_t context_size() const override { return tokens.size(); }
};

Seq& AsSeq(engine::ScheduledRequest& r) { return static_cast<Seq&>(r); }
const Seq& AsSeq(const engine::ScheduledRequest& r) { return static_cast<const Seq&>(r); }

TokenId OutputToken(const Request& r, uint32_t sample, uint32_t j) {
  if (sample == 0 && j < r.output.size()) return r.output[j];
  const uint64_t key[3] = {r.id, sample, j};
  return static_cast<TokenId>(XXH3_64bits(key, sizeof(key)) % kVocab);
}

uint32_t TargetOutputs(const Request& r) {
  return r.output.empty() ? r.max_new_tokens : static_cast<uint32_t>(r.output.size());
}

// The requests by arrival (stable); InvalidArgument names a malformed one.
Result<std::vector<const Request*>> ArrivalOrder(std::span<const Request> requests) {
  std::vector<const Request*> order;
  for (const Request& r : requests) {
    if (r.prompt.empty() || r.max_new_tokens == 0 || r.num_samples == 0 ||
        r.output.size() > r.max_new_tokens) {
      return Status::InvalidArgument(fmt::format("simulate: request {} is malformed", r.id));
    }
    order.push_back(&r);
  }
  std::stable_sort(order.begin(), order.end(),
                   [](const Request* a, const Request* b) { return a->arrival < b->arrival; });
  return order;
}

// The simulation: the engine's Scheduler decides admission and preemption;
// this class is its SchedulerKv (over the KV manager) and runs the steps.
class Sim final : private engine::SchedulerKv {
 public:
  Sim(engine::KvManager* kv, uint32_t block_size, const SimulateOptions& o)
      : kv_(kv),
        o_(o),
        bs_(block_size),
        num_blocks_(kv->Metrics().groups[0].blocks_total),
        rng_(o.seed),
        scheduler_(SchedulerOptionsOf(o), this, &queue_mu_) {}

  Result<SimulateReport> Run(std::span<const Request> requests);

 private:
  static engine::SchedulerOptions SchedulerOptionsOf(const SimulateOptions& o) {
    engine::SchedulerOptions s;
    s.max_running = o.max_running;
    s.max_batch_tokens = UINT32_MAX;  // a step decodes every running sequence
    s.fail_when_idle = false;         // the tiers' writer gives blocks back
    return s;
  }
  // Blocks a sample needs beyond the shared full prompt blocks, worst case.
  uint32_t WorstCaseBlocks(uint64_t prompt_len, uint32_t remaining) const {
    return CeilDiv(prompt_len + remaining + o_.draft_tokens, bs_);
  }
  // The context a waiting sequence resumes with: its prompt and done outputs.
  std::vector<TokenId> Context(const Seq& p) const;

  // SchedulerKv. Admission: the KV manager's (the cached prefix of the
  // prompt but its last token, each sample's reservation), the prefill's
  // rows, and samples 1.. as forks of sample 0. Every running sequence has
  // one decode pending.
  bool Fits(const engine::ScheduledRequest& r) const override;
  bool CanAdmit(const engine::ScheduledRequest&) const override { return true; }  // Admit tries
  Status Admit(engine::ScheduledRequest& r, std::vector<std::unique_ptr<engine::ScheduledRequest>>* forks) override;
  uint64_t Computed(const engine::ScheduledRequest& r) const override { return AsSeq(r).tokens.size() - 1; }
  bool WillPublishFor(const engine::ScheduledRequest&, const engine::ScheduledRequest&) const override {
    return false;  // no prefix hold: admission is first come first served
  }
  void Release(engine::ScheduledRequest& r) override;  // a preemption

  Status ForkSamples(Seq& s, std::vector<std::unique_ptr<engine::ScheduledRequest>>* forks);
  // Appends n rows; PoolExhausted changes nothing.
  Status AppendRows(Seq& s, uint32_t n);
  Status Publish(Seq& s) { return kv_->Publish(*s.kv, s.tokens, &s.hashes).status(); }
  Status DecodeStep(Seq& s, bool* preempted_self);
  // One decode step of every live sequence; adds the requests that finished.
  Status DecodeAll(uint64_t* finished);
  // The report's totals once every request is done.
  void Finish(uint64_t finished, uint64_t concurrent_sum, double util_sum,
              std::chrono::steady_clock::time_point t0);
  Status Check() const;

  engine::KvManager* kv_;
  const SimulateOptions& o_;
  const uint32_t bs_;
  const uint64_t num_blocks_;
  std::mt19937_64 rng_;
  std::mutex queue_mu_;  // the scheduler's queue (one thread here)
  engine::Scheduler scheduler_;
  double now_ = 0;
  Status kv_error_;  // the first failure inside Admit's bookkeeping
  std::unordered_map<const Request*, uint32_t> unfinished_;  // samples not yet done, per request
  SimulateReport rep_;
  double queue_steps_sum_ = 0;
  uint64_t queue_count_ = 0;
};

Status Sim::AppendRows(Seq& s, uint32_t n) {
  KV_RETURN_IF_ERROR(s.kv->Extend(n));
  rep_.tokens_appended += n;
  return Status::Ok();
}

void Sim::Release(engine::ScheduledRequest& r) {
  Seq& s = AsSeq(r);
  ++rep_.preemptions;
  // Queued again as this one sample, resuming after its committed outputs.
  s.width = 1;
  s.resume_outputs = s.generated;
  s.counted_queue = true;
  s.kv.reset();
}

std::vector<TokenId> Sim::Context(const Seq& p) const {
  std::vector<TokenId> prompt = p.req->prompt;
  for (uint32_t j = 0; j < p.resume_outputs; ++j) prompt.push_back(OutputToken(*p.req, p.sample, j));
  return prompt;
}

Status Sim::ForkSamples(Seq& s, std::vector<std::unique_ptr<engine::ScheduledRequest>>* forks) {
  for (uint32_t i = 1; i < s.width; ++i) {
    auto f = std::make_unique<Seq>(s.req, s.sample + i, 1, s.resume_outputs, false);
    f->tokens = s.tokens;
    f->generated = s.resume_outputs;
    f->target = s.target;
    KV_ASSIGN_OR_RETURN(f->kv, kv_->Fork(*s.kv));  // shares every block
    f->hashes = s.hashes;
    forks->push_back(std::move(f));
  }
  return Status::Ok();
}

bool Sim::Fits(const engine::ScheduledRequest& q) const {
  // A request that could not fit even alone is rejected, not queued forever.
  const Seq& p = AsSeq(q);
  const uint32_t remaining = TargetOutputs(*p.req) - p.resume_outputs;
  const uint64_t len = p.req->prompt.size() + p.resume_outputs;
  const uint64_t alone = WorstCaseBlocks(len, remaining) +
                         uint64_t{p.width - 1} * (WorstCaseBlocks(len, remaining) - len / bs_);
  return alone <= num_blocks_;
}

Status Sim::Admit(engine::ScheduledRequest& q, std::vector<std::unique_ptr<engine::ScheduledRequest>>* forks) {
  Seq& s = AsSeq(q);
  const Request& r = *s.req;
  const uint32_t target = TargetOutputs(r);
  std::vector<TokenId> prompt = Context(s);
  engine::KvAdmitOptions a;
  a.reservation = ReservationOf(o_.admission);
  a.samples = s.width;
  a.max_new_tokens = target - s.resume_outputs;
  a.draft_tokens = o_.draft_tokens;
  a.salt = r.salt;
  engine::KvAdmission found;
  Result<std::unique_ptr<engine::KvSequence>> admitted = kv_->Admit(prompt, a, &found);
  // Tier loads count whether or not the reservation is met (what was loaded
  // stays cached in the pool).
  for (size_t t = 1; t < found.served.size(); ++t) rep_.tier_hit_tokens += found.served[t];
  if (!admitted.ok()) return admitted.status();  // PoolExhausted: it waits
  std::unique_ptr<engine::KvSequence> kv = std::move(*admitted);
  if (!s.counted_queue) {
    queue_steps_sum_ += std::max(0.0, now_ - r.arrival);
    ++queue_count_;
  }
  // Sample s.sample from here on (the others are its forks).
  const uint32_t computed = static_cast<uint32_t>(prompt.size() - kv->cached_tokens());
  s.tokens = std::move(prompt);
  s.generated = s.resume_outputs;
  s.target = target;
  s.kv = std::move(kv);
  s.hashes.clear();
  Status st = AppendRows(s, computed);  // draws the prefill's blocks from the reservation
  rep_.prefill_tokens += st.ok() ? computed : 0;
  if (st.ok()) st = Publish(s);
  if (st.ok()) st = ForkSamples(s, forks);
  s.width = 1;
  if (!st.ok()) {  // past the reservation nothing may fail: the run stops
    if (kv_error_.ok()) kv_error_ = st;
    return Status::Internal("simulate: admission failed after its reservation: " + st.ToString());
  }
  return Status::Ok();
}

Status Sim::DecodeStep(Seq& s, bool* preempted_self) {
  *preempted_self = false;
  const uint32_t remaining = s.target - s.generated;
  const uint32_t drafts = std::min(o_.draft_tokens, remaining - 1);
  const uint32_t rows = 1 + drafts;
  for (;;) {
    Status st = AppendRows(s, rows);
    if (st.ok()) break;
    if (!st.IsPoolExhausted()) return st;
    // The scheduler preempts the most recently admitted live sequence (maybe s itself).
    const engine::ScheduledRequest* victim = scheduler_.PreemptYoungest();
    KV_RETURN_IF_ERROR(kv_error_);
    if (victim == &s) {
      *preempted_self = true;
      return Status::Ok();
    }
  }
  uint32_t accepted = 0;
  if (drafts > 0) {
    std::bernoulli_distribution accept(o_.draft_accept);
    while (accepted < drafts && accept(rng_)) ++accepted;
    rep_.draft_tokens += drafts;
    rep_.draft_accepted += accepted;
    KV_RETURN_IF_ERROR(s.kv->Truncate(s.kv->num_tokens() - (drafts - accepted)));
  }
  for (uint32_t j = 0; j < 1 + accepted; ++j) {
    s.tokens.push_back(OutputToken(*s.req, s.sample, s.generated++));
  }
  rep_.generated_tokens += 1 + accepted;
  return Publish(s);
}

Status Sim::Check() const {
  KV_RETURN_IF_ERROR(kv_->CheckInvariants());
  uint64_t reserved = 0;
  for (const auto& r : scheduler_.running()) {
    const Seq& s = AsSeq(*r);
    if (!s.kv) continue;  // finished this step
    reserved += s.kv->reserved_blocks();
    KV_RETURN_IF_ERROR(s.kv->CheckBlocks());
    if (s.kv->num_tokens() != s.tokens.size()) return Status::Internal("sim: drafts left behind");
  }
  const uint64_t pool_reserved = kv_->GroupMetrics()[0].blocks_reserved;
  if (reserved != pool_reserved) {
    return Status::Internal(fmt::format("sim: {} reserved by sequences, pool says {}", reserved, pool_reserved));
  }
  return Status::Ok();
}

Status Sim::DecodeAll(uint64_t* finished) {
  // Every running sequence, in admission order.
  for (const engine::BatchSlot& slot : scheduler_.Plan()) {
    Seq& s = AsSeq(*slot.request);
    if (!s.kv) continue;  // preempted earlier in this step
    bool self = false;
    KV_RETURN_IF_ERROR(DecodeStep(s, &self));
    if (!self && s.generated >= s.target) {
      s.kv.reset();  // its published blocks stay cached
      s.done = true;
      ++rep_.sequences;
      // A request is done when its last sample is.
      if (--unfinished_[s.req] == 0) ++*finished;
    }
  }
  return Status::Ok();
}

void Sim::Finish(uint64_t finished, uint64_t concurrent_sum, double util_sum,
                 std::chrono::steady_clock::time_point t0) {
  rep_.requests = finished;
  rep_.mean_concurrent = rep_.steps ? double(concurrent_sum) / double(rep_.steps) : 0;
  rep_.pool_utilization = rep_.steps ? util_sum / double(rep_.steps) : 0;
  kv_->FlushTiers();
  const engine::KvMetrics m = kv_->Metrics();
  rep_.evicted_blocks = m.groups[0].evictions;
  if (kv_->prefix_caching()) {
    rep_.prefix = m.prefix;
    rep_.prefix_hit_rate = rep_.prefix.hit_rate();
  }
  rep_.offload = kv_->tier_stats();
  rep_.mean_queue_steps = queue_count_ ? queue_steps_sum_ / double(queue_count_) : 0;
  rep_.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  rep_.sim_tokens_per_second =
      rep_.wall_seconds > 0 ? double(rep_.tokens_appended) / rep_.wall_seconds : 0;
}

Result<SimulateReport> Sim::Run(std::span<const Request> requests) {
  const auto t0 = std::chrono::steady_clock::now();
  KV_ASSIGN_OR_RETURN(const std::vector<const Request*> order, ArrivalOrder(requests));
  size_t next_arrival = 0;
  uint64_t finished = 0, concurrent_sum = 0;
  double util_sum = 0;
  double now = 0;
  const size_t total = order.size();
  uint64_t last_progress_step = 0;

  while (finished + rep_.rejected < total) {
    if (rep_.steps >= o_.max_steps) {
      return Status::Internal(fmt::format("simulate: no end after {} steps", o_.max_steps));
    }
    size_t waiting = 0;
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      while (next_arrival < order.size() && order[next_arrival]->arrival <= now) {
        const Request* r = order[next_arrival++];
        unfinished_[r] = r->num_samples;
        scheduler_.EnqueueLocked(std::make_unique<Seq>(r, 0, r->num_samples, 0, false));
      }
      waiting = scheduler_.num_waiting_locked();
    }
    if (scheduler_.running().empty() && waiting == 0) {
      now = std::ceil(order[next_arrival]->arrival);  // idle: jump to the next arrival
      continue;
    }
    // 1. admission, first come first served (the scheduler's: no prefix
    // hold here, and no request passes the head of the line).
    now_ = now;
    engine::AdmitResult admitted = scheduler_.Admit();
    KV_RETURN_IF_ERROR(kv_error_);
    rep_.rejected += admitted.rejected.size();
    for (auto& failed : admitted.failed) return failed.second;
    // 2. decode.
    const uint32_t live = static_cast<uint32_t>(scheduler_.running().size());
    if (live > 0) {
      ++rep_.steps;
      concurrent_sum += live;
      rep_.peak_concurrent = std::max(rep_.peak_concurrent, live);
    }
    KV_RETURN_IF_ERROR(DecodeAll(&finished));
    if (live > 0) {
      const engine::KvGroupMetrics g = kv_->GroupMetrics()[0];
      const double util = double(g.blocks_used) / double(g.blocks_total);
      util_sum += util;
      rep_.peak_pool_utilization = std::max(rep_.peak_pool_utilization, util);
    }
    scheduler_.SweepDone();
    if (o_.check_invariants) KV_RETURN_IF_ERROR(Check());
    now += 1;
    if (o_.progress && rep_.steps - last_progress_step >= 256) {
      last_progress_step = rep_.steps;
      o_.progress(double(finished + rep_.rejected) / double(total));
    }
  }
  if (o_.progress) o_.progress(1.0);
  Finish(finished, concurrent_sum, util_sum, t0);
  // Every block is back: free, or cached for the prefix cache.
  const engine::KvGroupMetrics g = kv_->GroupMetrics()[0];
  if (g.blocks_used != 0 || g.blocks_reserved != 0 || g.blocks_free + g.blocks_cached != g.blocks_total) {
    return Status::Internal(fmt::format("simulate: the pool ends with {} blocks in use, {} reserved, {} free, {} cached of {}",
                                        g.blocks_used, g.blocks_reserved, g.blocks_free, g.blocks_cached, g.blocks_total));
  }
  return rep_;
}

}  // namespace

Result<SimulateReport> SimulateOn(engine::KvManager* kv, uint32_t block_size, const SimulateOptions& options,
                                  std::span<const Request> requests) {
  if (!(options.draft_accept >= 0 && options.draft_accept <= 1)) {
    return Status::InvalidArgument("simulate: draft_accept must be in [0, 1]");
  }
  if (options.max_running == 0) return Status::InvalidArgument("simulate: max_running must be > 0");
  Sim sim(kv, block_size, options);
  return sim.Run(requests);
}

}  // namespace serving
}  // namespace kvcache
