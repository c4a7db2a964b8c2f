// SpinMutex: a small test-and-test-and-set lock for short critical sections.
//
// The pool's critical sections are a handful of list operations, far shorter
// than a futex round trip, so spinning beats std::mutex uncontended (the
// alloc+release benchmark takes two lock/unlock pairs). Under contention it
// yields after a short spin so that oversubscribed cores still make progress.
// Meets the Lockable requirements (usable with std::lock_guard).
#pragma once

#include <atomic>
#include <thread>

namespace kvcache::internal {

class SpinMutex {
 public:
  void lock() {
    for (;;) {
      if (!locked_.exchange(true, std::memory_order_acquire)) return;
      int spins = 0;
      while (locked_.load(std::memory_order_relaxed)) {
        if (++spins > 64) {
          std::this_thread::yield();
          spins = 0;
        }
      }
    }
  }
  bool try_lock() { return !locked_.exchange(true, std::memory_order_acquire); }
  void unlock() { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

}  // namespace kvcache::internal
