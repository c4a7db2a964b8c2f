// ThreadPool: workers sleep on a condition variable between loops; a loop is
// a shared atomic task counter that the caller and the workers drain.
//
// Invariants: at most one loop is published at a time (run_mu serializes
// callers); `generation` increments once per loop so a worker joins each loop
// at most once; the caller returns only after every worker that joined the
// loop has left it (active == 0), so `fn` outlives all its uses.
#include "kvcache/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace kvcache {
namespace {
// The pool whose task this thread is running, to run nested loops inline.
thread_local const void* tls_running_pool = nullptr;
}  // namespace

struct ThreadPool::State {
  uint32_t num_threads = 1;
  std::vector<std::thread> workers;

  std::mutex run_mu;  // serializes ParallelFor callers

  std::mutex mu;  // guards everything below
  std::condition_variable work_cv;
  std::condition_variable done_cv;
  bool stop = false;
  uint64_t generation = 0;
  const Task* fn = nullptr;
  uint32_t num_tasks = 0;
  uint32_t active = 0;  // workers inside the current loop
  std::atomic<uint32_t> next{0};

  void Drain(const Task& f, uint32_t n, uint32_t thread) {
    for (;;) {
      const uint32_t t = next.fetch_add(1, std::memory_order_relaxed);
      if (t >= n) return;
      f(t, thread);
    }
  }

  void WorkerLoop(uint32_t thread) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      work_cv.wait(lock, [&] { return stop || generation != seen; });
      if (stop) return;
      seen = generation;
      // num_tasks == 0: the loop already finished before this worker woke.
      if (num_tasks == 0) continue;
      const Task* f = fn;
      const uint32_t n = num_tasks;
      ++active;
      lock.unlock();
      tls_running_pool = this;
      Drain(*f, n, thread);
      tls_running_pool = nullptr;
      lock.lock();
      if (--active == 0) done_cv.notify_all();
    }
  }
};

ThreadPool::ThreadPool(uint32_t num_threads) : state_(std::make_unique<State>()) {
  state_->num_threads = std::max<uint32_t>(1, num_threads);
  for (uint32_t i = 1; i < state_->num_threads; ++i) {
    state_->workers.emplace_back([s = state_.get(), i] { s->WorkerLoop(i); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
  }
  state_->work_cv.notify_all();
  for (auto& w : state_->workers) w.join();
}

uint32_t ThreadPool::num_threads() const { return state_->num_threads; }

void ThreadPool::ParallelFor(uint32_t num_tasks, const Task& fn) {
  if (num_tasks == 0) return;
  State& s = *state_;
  if (tls_running_pool == &s || s.num_threads == 1 || num_tasks == 1) {
    for (uint32_t t = 0; t < num_tasks; ++t) fn(t, 0);
    return;
  }
  std::lock_guard<std::mutex> run_lock(s.run_mu);
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.fn = &fn;
    s.num_tasks = num_tasks;
    s.next.store(0, std::memory_order_relaxed);
    ++s.generation;
  }
  s.work_cv.notify_all();
  tls_running_pool = &s;
  s.Drain(fn, num_tasks, 0);
  tls_running_pool = nullptr;
  std::unique_lock<std::mutex> lock(s.mu);
  // Wait for the workers that joined this loop; clearing num_tasks under the
  // same lock makes any worker that wakes later skip it (fn dies on return).
  s.done_cv.wait(lock, [&] { return s.active == 0; });
  s.num_tasks = 0;
  s.fn = nullptr;
}

}  // namespace kvcache
