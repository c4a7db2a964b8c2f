// Google Benchmark suite for the pool and caches: alloc+release of one block,
// append of one token to every layer, fork and truncate of a 32k-token
// sequence (Llama-3-8B geometry: 32 layers, 8 kv heads, head_dim 128, block
// 16, f32). `kvcache bench pool --json` reports the same four numbers.
#include <benchmark/benchmark.h>

#include <vector>

#include "kvcache/cache.h"
#include "kvcache/pool.h"

namespace kvcache {
namespace {

Geometry Llama8B() { return *Geometry::Create({32, 8, 128, 16}); }

void BM_PoolAllocRelease(benchmark::State& state) {
  auto pool = *BlockPool::Create(Llama8B(), {}, {.num_blocks = 64});
  uint32_t b = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(pool->Allocate({&b, 1}));
    benchmark::DoNotOptimize(pool->Release({&b, 1}));
  }
}
BENCHMARK(BM_PoolAllocRelease);

void BM_CacheAppendToken(benchmark::State& state) {
  const Geometry g = Llama8B();
  auto pool = *BlockPool::Create(g, {}, {.num_blocks = 20});
  auto cache = std::move(*SequenceCache::CreatePaged(pool));
  std::vector<float> k(size_t{g.n_layers()} * g.kv_dim(), 0.25f), v = k;
  uint32_t n = 0;
  for (auto _ : state) {
    if (++n == 256) {  // 16 blocks; clearing costs ~1/256 of a step
      (void)cache.Clear();
      n = 0;
    }
    benchmark::DoNotOptimize(cache.Append(k, v));
  }
  state.SetBytesProcessed(state.iterations() * int64_t(k.size() + v.size()) * 4);
}
BENCHMARK(BM_CacheAppendToken);

// A 32k-token sequence whose blocks come straight from the pool (never touched).
struct LongSequence {
  std::shared_ptr<BlockPool> pool = *BlockPool::Create(Llama8B(), {}, {.num_blocks = 4200});
  SequenceCache seq = std::move(*SequenceCache::CreatePaged(pool));
  void Fill() {
    std::vector<uint32_t> blocks(32768 / 16);
    (void)pool->Allocate(blocks);
    (void)seq.AdoptPrefix(blocks, nullptr);
  }
};

void BM_CacheFork32k(benchmark::State& state) {
  LongSequence s;
  s.Fill();
  for (auto _ : state) {
    auto child = s.seq.Fork();
    benchmark::DoNotOptimize(child);
    state.PauseTiming();
    child->Release();
    state.ResumeTiming();
  }
}
BENCHMARK(BM_CacheFork32k)->Unit(benchmark::kMicrosecond);

void BM_CacheTruncate32k(benchmark::State& state) {
  LongSequence s;
  for (auto _ : state) {
    state.PauseTiming();
    s.Fill();
    state.ResumeTiming();
    benchmark::DoNotOptimize(s.seq.Truncate(0));
  }
}
BENCHMARK(BM_CacheTruncate32k)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvcache
