// ThreadPool: a loop is a shared atomic task counter that the caller and the
// workers drain. Between loops a worker first spins for a short while
// (kSpin) watching the loop generation, then sleeps on a condition
// variable; the caller likewise spins briefly for the workers to leave
// before it sleeps. Decoding runs hundreds of short loops a token (one per
// weight product), and a futex wake-up per loop would cost as much as the
// loop itself.
//
// Invariants: at most one loop is published at a time (run_mu serializes
// callers); `generation` increments once per loop so a worker joins each loop
// at most once; the caller returns only after every worker that joined the
// loop has left it (active == 0), so `fn` outlives all its uses.
#include "kvcache/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace kvcache {
namespace {
// The pool whose task this thread is running, to run nested loops inline.
thread_local const void* tls_running_pool = nullptr;

// How long a worker or a finished caller spins before it sleeps.
constexpr std::chrono::microseconds kSpin{100};

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Spins until done() or kSpin has passed; true iff done().
template <typename Done>
bool SpinUntil(Done done) {
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  for (uint32_t i = 0;; ++i) {
    if (done()) return true;
    CpuRelax();
    if ((i & 63) == 63 && std::chrono::steady_clock::now() >= deadline) return done();
  }
}
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
  // Mirrors of generation / active / stop for the spinning phases (read
  // without mu; every decision is re-checked under mu).
  std::atomic<uint64_t> generation_seen{0};
  std::atomic<uint32_t> active_seen{0};
  std::atomic<bool> stop_seen{false};

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
      if (!stop && generation == seen) {
        lock.unlock();
        SpinUntil([&] {
          return stop_seen.load(std::memory_order_acquire) ||
                 generation_seen.load(std::memory_order_acquire) != seen;
        });
        lock.lock();
      }
      work_cv.wait(lock, [&] { return stop || generation != seen; });
      if (stop) return;
      seen = generation;
      // num_tasks == 0: the loop already finished before this worker woke.
      if (num_tasks == 0) continue;
      const Task* f = fn;
      const uint32_t n = num_tasks;
      ++active;
      active_seen.store(active, std::memory_order_release);
      lock.unlock();
      tls_running_pool = this;
      Drain(*f, n, thread);
      tls_running_pool = nullptr;
      lock.lock();
      active_seen.store(--active, std::memory_order_release);
      if (active == 0) done_cv.notify_all();
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
    state_->stop_seen.store(true, std::memory_order_release);
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
    s.generation_seen.store(s.generation, std::memory_order_release);
  }
  s.work_cv.notify_all();
  tls_running_pool = &s;
  s.Drain(fn, num_tasks, 0);
  tls_running_pool = nullptr;
  // Workers that joined are finishing their last tasks: usually a spin's
  // worth of time.
  SpinUntil([&] { return s.active_seen.load(std::memory_order_acquire) == 0; });
  std::unique_lock<std::mutex> lock(s.mu);
  // Wait for the workers that joined this loop; clearing num_tasks under the
  // same lock makes any worker that wakes later skip it (fn dies on return).
  s.done_cv.wait(lock, [&] { return s.active == 0; });
  s.num_tasks = 0;
  s.fn = nullptr;
}

}  // namespace kvcache
