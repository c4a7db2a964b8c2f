// The scheduler (scheduler.h).
#include "engine/scheduler.h"

#include <algorithm>

namespace kvcache::engine {

std::vector<std::unique_ptr<ScheduledRequest>> Scheduler::TakeWaitingIf(
    const std::function<bool(const ScheduledRequest&)>& drop) {
  std::vector<std::unique_ptr<ScheduledRequest>> gone;
  std::lock_guard<std::mutex> lock(*mu_);
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (drop(**it)) {
      gone.push_back(std::move(*it));
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
  return gone;
}

AdmitResult Scheduler::Admit() {
  AdmitResult out;
  size_t at = 0;  // the next candidate's place in the queue
  for (;;) {
    std::unique_ptr<ScheduledRequest> r;
    {
      std::lock_guard<std::mutex> lock(*mu_);
      for (; running_.size() < options_.max_running && at < waiting_.size() && HeldBack(*waiting_[at]);
           ++at, ++out.held) {
        out.newly_held += waiting_[at]->held_before ? 0 : 1;
        waiting_[at]->held_before = true;
      }
      if (at == waiting_.size()) break;
      const bool fits = kv_->Fits(*waiting_[at]);
      if (fits && running_.size() + waiting_[at]->width > options_.max_running) break;
      r = std::move(waiting_[at]);
      waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(at));
      if (!fits) {
        out.rejected.push_back(std::move(r));
        continue;
      }
    }
    // With nothing running, blocks cannot come back (fail_when_idle): try,
    // and fail if it must.
    const bool wait = !running_.empty() && !kv_->CanAdmit(*r);
    const bool can_wait = !running_.empty() || !options_.fail_when_idle;
    std::vector<std::unique_ptr<ScheduledRequest>> forks;
    Status s = wait ? Status::Ok() : kv_->Admit(*r, &forks);
    if (!wait && s.ok()) {
      r->admit_seq = ++admit_counter_;
      running_.push_back(std::move(r));
      for (auto& f : forks) {
        f->admit_seq = admit_counter_;
        running_.push_back(std::move(f));
      }
      continue;
    }
    if (wait || (s.IsPoolExhausted() && can_wait)) {  // waits for blocks to come back
      std::lock_guard<std::mutex> lock(*mu_);
      waiting_.insert(waiting_.begin() + static_cast<std::ptrdiff_t>(at), std::move(r));
      break;
    }
    out.failed.emplace_back(std::move(r), std::move(s));
  }
  return out;
}

bool Scheduler::HeldBack(ScheduledRequest& r) const {
  for (const auto& leader : running_) {
    if (leader->done || leader->cancelled()) continue;
    if (!kv_->WillPublishFor(*leader, r)) continue;
    const uint64_t computed = kv_->Computed(*leader);
    const bool stalled = r.hold_leader == leader->id && r.hold_leader_tokens == computed;
    r.hold_stalls = stalled ? r.hold_stalls + 1 : 0;
    r.hold_leader = leader->id;
    r.hold_leader_tokens = computed;
    return r.hold_stalls < options_.max_stalled_holds;
  }
  return false;
}

std::vector<BatchSlot> Scheduler::Plan() {
  std::vector<BatchSlot> slots;
  uint32_t budget = options_.max_batch_tokens;
  const size_t n = running_.size(), first = budget < n ? passes_ % n : 0;
  ++passes_;
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t k = 0; k < n; ++k) {
      ScheduledRequest* r = running_[pass == 0 ? (first + k) % n : k].get();
      const uint64_t computed = kv_->Computed(*r);
      const size_t pending = r->context_size() - computed;
      if ((pending == 1) != (pass == 0) || budget == 0) continue;
      const uint32_t take = static_cast<uint32_t>(std::min<size_t>(pending, budget));
      budget -= take;
      slots.push_back({r, computed, take});
    }
  }
  return slots;
}

ScheduledRequest* Scheduler::PreemptYoungest() {
  auto youngest = running_.end();
  for (auto it = running_.begin(); it != running_.end(); ++it) {
    if (!(*it)->done && (youngest == running_.end() || (*it)->admit_seq >= (*youngest)->admit_seq)) youngest = it;
  }
  if (youngest == running_.end()) return nullptr;
  std::unique_ptr<ScheduledRequest> r = std::move(*youngest);
  running_.erase(youngest);
  kv_->Release(*r);
  ScheduledRequest* queued = r.get();
  std::lock_guard<std::mutex> lock(*mu_);
  waiting_.push_front(std::move(r));
  return queued;
}

void Scheduler::SweepDone() {
  std::erase_if(running_, [](const std::unique_ptr<ScheduledRequest>& r) { return r->done; });
}

}  // namespace kvcache::engine
