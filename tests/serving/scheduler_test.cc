// The scheduler the engine and the simulator share (engine/scheduler.h),
// on a K/V side that counts blocks: admission order, max_running with
// parallel samples, rejection, the step's token budget, preemption order.
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <vector>

namespace kvcache::engine {
namespace {

struct Req final : ScheduledRequest {
  Req(uint64_t id_, size_t context, uint32_t blocks_, uint32_t width_ = 1) : context(context), blocks(blocks_) {
    id = id_;
    width = width_;
  }
  size_t context_size() const override { return context; }
  size_t context;
  uint32_t blocks;        // what admission takes
  uint64_t computed = 0;  // positions done
};

// Admits while `free` blocks last; a request of more than `total` never fits.
class Blocks final : public SchedulerKv {
 public:
  uint32_t free = 10, total = 10;
  std::vector<uint64_t> released;
  bool Fits(const ScheduledRequest& r) const override { return static_cast<const Req&>(r).blocks <= total; }
  bool CanAdmit(const ScheduledRequest&) const override { return true; }
  Status Admit(ScheduledRequest& r, std::vector<std::unique_ptr<ScheduledRequest>>* forks) override {
    Req& q = static_cast<Req&>(r);
    if (q.blocks > free) return Status::PoolExhausted("blocks");
    free -= q.blocks;
    for (uint32_t i = 1; i < q.width; ++i) forks->push_back(std::make_unique<Req>(q.id * 100 + i, q.context, 0));
    return Status::Ok();
  }
  uint64_t Computed(const ScheduledRequest& r) const override { return static_cast<const Req&>(r).computed; }
  bool WillPublishFor(const ScheduledRequest&, const ScheduledRequest&) const override { return false; }
  void Release(ScheduledRequest& r) override {
    free += static_cast<Req&>(r).blocks;
    released.push_back(r.id);
  }
};

std::vector<uint64_t> Ids(const std::vector<std::unique_ptr<ScheduledRequest>>& v) {
  std::vector<uint64_t> ids;
  for (const auto& r : v) ids.push_back(r->id);
  return ids;
}

struct Fixture {
  explicit Fixture(SchedulerOptions o) : scheduler(o, &kv, &mu) {}
  void Enqueue(std::unique_ptr<Req> r) {
    std::lock_guard<std::mutex> lock(mu);
    scheduler.EnqueueLocked(std::move(r));
  }
  Blocks kv;
  std::mutex mu;
  Scheduler scheduler;
};

TEST(Scheduler, AdmitsInQueueOrderUntilTheHeadWaits) {
  Fixture f({.max_batch_tokens = 64, .max_running = 8});
  f.Enqueue(std::make_unique<Req>(1, 4, 4));
  f.Enqueue(std::make_unique<Req>(2, 4, 5));
  f.Enqueue(std::make_unique<Req>(3, 4, 4));  // more than the block left: the head waits
  f.Enqueue(std::make_unique<Req>(4, 4, 1));  // would fit, but waits behind it
  AdmitResult a = f.scheduler.Admit();
  EXPECT_TRUE(a.failed.empty());
  EXPECT_EQ(Ids(f.scheduler.running()), (std::vector<uint64_t>{1, 2}));
  std::lock_guard<std::mutex> lock(f.mu);
  EXPECT_EQ(f.scheduler.num_waiting_locked(), 2u);
}

TEST(Scheduler, ParallelSamplesCountAgainstMaxRunningAndTheHugeAreRejected) {
  Fixture f({.max_batch_tokens = 64, .max_running = 3});
  f.Enqueue(std::make_unique<Req>(1, 4, 1, 2));   // two sequences
  f.Enqueue(std::make_unique<Req>(2, 4, 11));     // never fits: rejected, not queued
  f.Enqueue(std::make_unique<Req>(3, 4, 1, 2));   // 2 + 2 > 3: waits
  AdmitResult a = f.scheduler.Admit();
  EXPECT_EQ(Ids(f.scheduler.running()), (std::vector<uint64_t>{1, 101}));
  ASSERT_EQ(a.rejected.size(), 1u);
  EXPECT_EQ(a.rejected[0]->id, 2u);
  EXPECT_EQ(f.scheduler.running()[0]->admit_seq, f.scheduler.running()[1]->admit_seq);
}

TEST(Scheduler, NothingRunningFailsOrWaitsAsConfigured) {
  for (bool fail : {true, false}) {
    Fixture f({.max_batch_tokens = 64, .max_running = 4, .fail_when_idle = fail});
    f.kv.free = 2;
    f.Enqueue(std::make_unique<Req>(1, 4, 3));
    AdmitResult a = f.scheduler.Admit();
    EXPECT_EQ(a.failed.size(), fail ? 1u : 0u);
    std::lock_guard<std::mutex> lock(f.mu);
    EXPECT_EQ(f.scheduler.num_waiting_locked(), fail ? 0u : 1u);
  }
}

TEST(Scheduler, PlansDecodesFirstThenPrefillChunksWithinTheBudget) {
  Fixture f({.max_batch_tokens = 8, .max_running = 8});
  f.Enqueue(std::make_unique<Req>(1, 20, 1));  // a prompt of 20
  f.Enqueue(std::make_unique<Req>(2, 6, 1));   // one decode pending
  f.scheduler.Admit();
  static_cast<Req&>(*f.scheduler.running()[1]).computed = 5;
  std::vector<BatchSlot> plan = f.scheduler.Plan();
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].request->id, 2u);
  EXPECT_EQ(plan[0].begin, 5u);
  EXPECT_EQ(plan[0].count, 1u);
  EXPECT_EQ(plan[1].request->id, 1u);
  EXPECT_EQ(plan[1].begin, 0u);
  EXPECT_EQ(plan[1].count, 7u);  // the rest of the budget
}

TEST(Scheduler, PreemptsTheYoungestLiveOneToTheFrontOfTheQueue) {
  Fixture f({.max_batch_tokens = 64, .max_running = 8});
  f.Enqueue(std::make_unique<Req>(1, 4, 1));
  f.Enqueue(std::make_unique<Req>(2, 4, 1, 2));  // 2 and its fork 201, admitted together
  f.scheduler.Admit();
  f.Enqueue(std::make_unique<Req>(3, 4, 1));  // queued behind the preempted ones
  ScheduledRequest* v = f.scheduler.PreemptYoungest();
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->id, 201u);  // of those admitted together, the last
  f.scheduler.running()[1]->done = true;  // 2 finished: not a candidate
  EXPECT_EQ(f.scheduler.PreemptYoungest()->id, 1u);
  EXPECT_EQ(f.kv.released, (std::vector<uint64_t>{201, 1}));
  std::lock_guard<std::mutex> lock(f.mu);
  auto waiting = f.scheduler.TakeWaitingLocked();
  ASSERT_EQ(waiting.size(), 3u);
  EXPECT_EQ(waiting[0]->id, 1u);
  EXPECT_EQ(waiting[1]->id, 201u);
  EXPECT_EQ(waiting[2]->id, 3u);
}

}  // namespace
}  // namespace kvcache::engine
