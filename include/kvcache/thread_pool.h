// A small fixed-size thread pool for data-parallel loops (attention kernels,
// batched decode).
//
// ParallelFor(n, fn) runs fn(task, thread) for every task in [0, n) and
// returns once all of them have finished. The calling thread works too, so a
// pool of num_threads() == 1 spawns no thread at all and runs everything
// inline. Idle workers sleep on a condition variable (no busy-waiting).
//
// Thread safety: ParallelFor may be called from any thread; calls from
// different threads are serialized (one loop runs at a time). A ParallelFor
// issued from inside a task of the same pool runs inline on that thread.
// `thread` is in [0, num_threads()) and no two tasks running at the same
// time see the same value, so it can index per-thread scratch.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

namespace kvcache {

class ThreadPool {
 public:
  // num_threads counts the caller: num_threads - 1 workers are started.
  // 0 is treated as 1.
  explicit ThreadPool(uint32_t num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  uint32_t num_threads() const;

  using Task = std::function<void(uint32_t task, uint32_t thread)>;
  void ParallelFor(uint32_t num_tasks, const Task& fn);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace kvcache
