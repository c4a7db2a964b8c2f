// The scheduler: who runs in the next step. It keeps the waiting queue and
// the running set and decides admission (queue order, max_running, the
// prefix hold), the step's batch (max_batch_tokens: decodes first, then
// chunks of the prompts being prefilled) and preemption (the youngest
// running request first). It knows no blocks: it asks its SchedulerKv (the
// KV manager, for the engine; the block accounting, for the serving
// simulator in engine/sim/) whether a request can be admitted, admits it,
// and frees a preempted request's K/V. The engine and the simulator run on
// this one scheduler; what a step does with the batch is theirs (the engine
// runs one forward pass over it and, when the pool runs out, preempts and
// plans again; the simulator grows each sequence in turn and preempts when
// one cannot grow).
//
// The prefix hold: a waiting request is passed over while a running request
// is about to publish a full block it could adopt (SchedulerKv::
// WillPublishFor), unless that request's prefill has stood still at the
// last max_stalled_holds admissions (its step budget taken by decodes); the
// requests behind it may be admitted meanwhile (engine.h).
//
// Thread safety: the waiting queue is guarded by the mutex the scheduler
// is given (Submit pushes on the callers' threads): the *Locked methods
// require the caller to hold it, the others take it. Everything else is the
// step thread's.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "kvcache/status.h"

namespace kvcache::engine {

// What the scheduler knows of a request; the engine's request derives from it.
struct ScheduledRequest {
  virtual ~ScheduledRequest() = default;
  uint64_t id = 0;
  uint32_t width = 1;           // running sequences it becomes (parallel samples)
  bool done = false;            // finished: leaves the running set at the next sweep
  uint64_t admit_seq = 0;       // larger: admitted later (preemption picks the largest)
  bool held_before = false;     // held back for a running request's prefill at least once
  // The request it was last held for, that one's computed tokens then, and
  // the admissions since at which they had not grown.
  uint64_t hold_leader = 0, hold_leader_tokens = 0;
  uint32_t hold_stalls = 0;
  // The context: the prompt, then every generated token (a running
  // request's tokens past SchedulerKv::Computed are pending).
  virtual size_t context_size() const = 0;
  // A cancelled request is no one's leader (it leaves at the next step).
  virtual bool cancelled() const { return false; }
};

// What the scheduler asks of the K/V side.
class SchedulerKv {
 public:
  virtual ~SchedulerKv() = default;
  // False for a request that could not be admitted even alone: it leaves
  // the queue (AdmitResult::rejected) when it comes up, instead of waiting
  // for ever.
  virtual bool Fits(const ScheduledRequest& r) const = 0;
  // Whether r's admission can be met now (nothing taken or counted); true
  // where that cannot be told without trying (Admit then says).
  virtual bool CanAdmit(const ScheduledRequest& r) const = 0;
  // Admits r (its K/V from now on); PoolExhausted (nothing held) when the
  // blocks are not there. A request of width > 1 adds its other sequences
  // (forks of r) to `forks`; they run beside it, admitted with it.
  virtual Status Admit(ScheduledRequest& r, std::vector<std::unique_ptr<ScheduledRequest>>* forks) = 0;
  // Positions of a running r already computed.
  virtual uint64_t Computed(const ScheduledRequest& r) const = 0;
  // Whether the running `leader` will publish, and has not yet, a block the
  // waiting `r` could adopt.
  virtual bool WillPublishFor(const ScheduledRequest& leader, const ScheduledRequest& r) const = 0;
  // Frees a preempted r's K/V (what it published stays cached).
  virtual void Release(ScheduledRequest& r) = 0;
};

struct SchedulerOptions {
  uint32_t max_batch_tokens = 256;  // tokens per step (decodes + prefill chunks)
  uint32_t max_running = 64;        // requests in one step
  uint32_t max_stalled_holds = 4;   // admissions a hold survives a leader that does not move
  // With nothing running, a request the K/V side cannot admit fails
  // (AdmitResult::failed: no running request will give blocks back) or,
  // false, waits (blocks other holders give back in time, as the
  // simulator's tier writer does).
  bool fail_when_idle = true;
};

// A request's share of a step: tokens [begin, begin + count) of its context.
struct BatchSlot {
  ScheduledRequest* request = nullptr;
  uint64_t begin = 0;
  uint32_t count = 0;
};

struct AdmitResult {
  uint64_t held = 0;        // waiting requests passed over for a prefix hold
  uint64_t newly_held = 0;  // of them, held for the first time
  std::vector<std::unique_ptr<ScheduledRequest>> rejected;  // out of the queue: they never fit (SchedulerKv::Fits)
  // Requests that cannot be admitted ever (the K/V side's error), out of the queue.
  std::vector<std::pair<std::unique_ptr<ScheduledRequest>, Status>> failed;
};

class Scheduler {
 public:
  Scheduler(const SchedulerOptions& options, SchedulerKv* kv, std::mutex* queue_mu)
      : options_(options), kv_(kv), mu_(queue_mu) {}

  // The waiting queue (the caller holds the queue mutex).
  size_t num_waiting_locked() const { return waiting_.size(); }
  void EnqueueLocked(std::unique_ptr<ScheduledRequest> r) { waiting_.push_back(std::move(r)); }
  std::deque<std::unique_ptr<ScheduledRequest>> TakeWaitingLocked() { return std::exchange(waiting_, {}); }
  // Takes the waiting requests `drop` says so of, queue order kept.
  std::vector<std::unique_ptr<ScheduledRequest>> TakeWaitingIf(
      const std::function<bool(const ScheduledRequest&)>& drop);

  std::vector<std::unique_ptr<ScheduledRequest>>& running() { return running_; }
  const std::vector<std::unique_ptr<ScheduledRequest>>& running() const { return running_; }

  // Admits waiting requests in queue order, passing over the held-back ones
  // (each is compared with the running set as it stands, so a request
  // admitted here holds back the later ones that share its prefix). A
  // request the K/V side cannot take now stays where it is in the queue and
  // admission stops; with nothing running, blocks cannot come back, so it
  // is tried anyway, and fails if it must.
  AdmitResult Admit();

  // The step's batch: decodes (one pending token) first, then prefill
  // chunks, in admission order, within max_batch_tokens; when the budget
  // cannot take every decode, the first one taken rotates with the step
  // count so that none waits for ever.
  std::vector<BatchSlot> Plan();

  // Preempts the youngest running request that is not done (of those
  // admitted together, the last): its K/V is freed, it goes back to the
  // front of the queue. Returns it (queued now); null when none runs.
  ScheduledRequest* PreemptYoungest();

  // Drops the finished requests from the running set.
  void SweepDone();

 private:
  bool HeldBack(ScheduledRequest& r) const;

  const SchedulerOptions options_;
  SchedulerKv* const kv_;
  std::mutex* const mu_;
  std::deque<std::unique_ptr<ScheduledRequest>> waiting_;  // under *mu_
  std::vector<std::unique_ptr<ScheduledRequest>> running_;
  uint64_t admit_counter_ = 0;
  uint64_t passes_ = 0;  // batches planned (the decode rotation)
};

}  // namespace kvcache::engine
