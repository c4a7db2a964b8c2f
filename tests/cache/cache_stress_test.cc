// Concurrency stress of paged caches sharing one pool: each thread runs its
// own sequences (append, fork, truncate, clone, release) while the others do
// the same, and checks its own contents. Forked sequences are handed between
// threads through a mutex-protected queue, so shared blocks are read and
// copied-on-write from different threads. Meant to run clean under
// ThreadSanitizer.
#include <gtest/gtest.h>

#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "kvcache/cache.h"

namespace kvcache {
namespace {

struct Owned {
  SequenceCache cache;
  std::vector<float> tokens;  // value of every K/V entry of token t (layer 0 head 0 check)
};

TEST(CacheStressTest, ThreadsShareAPool) {
  auto geo = Geometry::Create({2, 2, 16, 4});
  ASSERT_TRUE(geo.ok());
  auto made = BlockPool::Create(*geo, {}, {.num_blocks = 96});
  ASSERT_TRUE(made.ok());
  std::shared_ptr<BlockPool> pool = *made;
  const size_t per_token = size_t{geo->n_layers()} * geo->kv_dim();
  std::mutex mu;
  std::deque<Owned> handoff;  // guarded by mu
  std::atomic<int> failures{0};
  auto check = [&](const Owned& o) {
    if (o.cache.num_tokens() != o.tokens.size()) return false;
    auto k = o.cache.HeadKeys(1, 1);
    if (!k.ok() || k->size() != o.tokens.size() * geo->head_dim()) return false;
    for (size_t t = 0; t < o.tokens.size(); ++t) {
      if ((*k)[t * geo->head_dim()] != o.tokens[t]) return false;
    }
    return o.cache.CheckInvariants().ok();
  };
  auto worker = [&](int tid) {
    std::mt19937 rng(77 + tid);
    std::vector<Owned> seqs;
    for (int i = 0; i < 1500; ++i) {
      const uint32_t op = rng() % 10;
      if (seqs.empty() || op == 0) {
        auto c = SequenceCache::CreatePaged(pool, {.reserve_tokens = rng() % 2 ? 8u : 0u});
        if (c.ok()) seqs.push_back({std::move(*c), {}});
        continue;
      }
      Owned& o = seqs[rng() % seqs.size()];
      if (op <= 4) {
        const uint32_t T = rng() % 3 + 1;
        const float base = static_cast<float>(tid * 100000 + i);
        // [n_layers][T][kv_dim]: every value of token t is base + t.
        const size_t kv_dim = geo->kv_dim();
        std::vector<float> k(T * per_token), v(T * per_token);
        for (uint32_t l = 0; l < geo->n_layers(); ++l)
          for (uint32_t t = 0; t < T; ++t)
            std::fill_n(k.begin() + (l * T + t) * kv_dim, kv_dim, base + t);
        v = k;
        Status s = o.cache.Append(k, v);
        if (s.ok()) {
          for (uint32_t t = 0; t < T; ++t) o.tokens.push_back(base + t);
        } else if (!s.IsPoolExhausted()) {
          ++failures;
        }
      } else if (op == 5) {
        const uint32_t n = static_cast<uint32_t>(o.tokens.size());
        const uint32_t to = n - std::min<uint32_t>(n, rng() % 4);
        if (!o.cache.Truncate(to).ok()) ++failures;
        o.tokens.resize(to);
      } else if (op == 6) {
        auto f = o.cache.Fork();
        if (f.ok()) {
          std::lock_guard<std::mutex> lock(mu);
          handoff.push_back({std::move(*f), o.tokens});
        }
      } else if (op == 7) {
        std::lock_guard<std::mutex> lock(mu);
        if (!handoff.empty()) {
          seqs.push_back(std::move(handoff.front()));
          handoff.pop_front();
        }
      } else if (op == 8) {
        auto c = o.cache.Clone();
        if (!c.ok()) ++failures;
      } else {
        if (!check(o)) ++failures;
        std::swap(o, seqs.back());
        seqs.pop_back();
      }
      if (seqs.size() > 6) seqs.erase(seqs.begin());
    }
    for (const Owned& o : seqs) {
      if (!check(o)) ++failures;
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();
  for (const Owned& o : handoff) EXPECT_TRUE(check(o));
  handoff.clear();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_TRUE(pool->CheckInvariants().ok());
  EXPECT_EQ(pool->num_free_blocks(), 96u);
  EXPECT_EQ(pool->num_reserved_blocks(), 0u);
}

}  // namespace
}  // namespace kvcache
