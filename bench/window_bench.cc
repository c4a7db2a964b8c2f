// The precision window's cost (cache.h, PrecisionWindow) on a real
// SequenceCache: a decode step's attention and a token's append, with and
// without a window of 4 sinks + 128 recent positions, in one binary so the
// ratios come from one run. One layer, 32 q heads / 8 kv heads / head_dim
// 128 (a Llama-3-8B layer), paged, 2 threads.
#include <benchmark/benchmark.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kvcache/attention.h"
#include "kvcache/cache.h"
#include "kvcache/simd.h"
#include "kvcache/thread_pool.h"

namespace kvcache {
namespace {

constexpr uint32_t kQHeads = 32, kKvHeads = 8, kHeadDim = 128, kBlock = 16;
constexpr PrecisionWindow kWindow{.sinks = 4, .recent = 128};

Geometry OneLayer() { return *Geometry::Create({1, kKvHeads, kHeadDim, kBlock}); }

// A paged sequence of `tokens` random rows (filled in chunks of 512).
struct Filled {
  std::shared_ptr<BlockPool> pool;
  std::unique_ptr<SequenceCache> cache;
};
Result<Filled> Fill(Format f, uint32_t tokens, bool window) {
  const Geometry g = OneLayer();
  Filled out;
  KV_ASSIGN_OR_RETURN(out.pool,
                      BlockPool::Create(g, {f, f}, {.num_blocks = tokens / kBlock + 8}));
  PagedOptions po;
  if (window) po.window = kWindow;
  KV_ASSIGN_OR_RETURN(SequenceCache c, SequenceCache::CreatePaged(out.pool, po));
  out.cache = std::make_unique<SequenceCache>(std::move(c));
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  constexpr uint32_t kChunk = 512;
  std::vector<float> k(size_t{kChunk} * g.kv_dim()), v(k.size());
  for (uint32_t done = 0; done < tokens; done += kChunk) {
    for (float& x : k) x = nd(rng);
    for (float& x : v) x = nd(rng);
    const size_t n = size_t{std::min(kChunk, tokens - done)} * g.kv_dim();
    KV_RETURN_IF_ERROR(out.cache->Append({k.data(), n}, {v.data(), n}));
  }
  return out;
}

// Args: format (both sides), window (0/1), context.
void BM_PrecisionWindowDecode(benchmark::State& state) {
  const Format f = static_cast<Format>(state.range(0));
  const bool window = state.range(1) != 0;
  auto filled = Fill(f, static_cast<uint32_t>(state.range(2)), window);
  if (!filled.ok()) {
    state.SkipWithError(filled.status().ToString().c_str());
    return;
  }
  ThreadPool pool(2);
  std::vector<float> q(size_t{kQHeads} * kHeadDim), out(q.size());
  for (size_t i = 0; i < q.size(); ++i) q[i] = 0.01f * static_cast<float>(i % 13) - 0.06f;
  AttentionOptions o;
  o.n_q_heads = kQHeads;
  o.pool = &pool;
  AttentionOutput ao;
  ao.out = out;
  const LayerKvView view = *filled->cache->View(0);
  for (auto _ : state) {
    const Status st = AttendDecode(view, q, o, ao);
    benchmark::DoNotOptimize(out.data());
    if (!st.ok()) state.SkipWithError(st.ToString().c_str());
  }
  state.SetLabel(std::string(FormatName(f)) + (window ? "+s4+r128 " : " ") + SimdTarget());
}
void WindowDecodeArgs(benchmark::internal::Benchmark* b) {
  b->Args({static_cast<int>(Format::kBF16), 0, 32768});  // the reference point
  for (Format f : {Format::kTurbo4, Format::kTurbo3, Format::kQ8_0}) {
    for (int window : {0, 1}) b->Args({static_cast<int>(f), window, 32768});
  }
}
BENCHMARK(BM_PrecisionWindowDecode)
    ->Apply(WindowDecodeArgs)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// One token appended to a sequence of 4096 to 4351 tokens.
// Args: format, window (0/1).
void BM_PrecisionWindowAppend(benchmark::State& state) {
  const Format f = static_cast<Format>(state.range(0));
  const bool window = state.range(1) != 0;
  auto filled = Fill(f, 4096, window);
  if (!filled.ok()) {
    state.SkipWithError(filled.status().ToString().c_str());
    return;
  }
  SequenceCache& c = *filled->cache;
  std::vector<float> k(OneLayer().kv_dim(), 0.25f), v = k;
  uint32_t n = 0;
  for (auto _ : state) {
    if (++n == 256) {  // back to 4096 tokens now and then (1/256 of the steps)
      (void)c.Truncate(4096);
      n = 0;
    }
    benchmark::DoNotOptimize(c.Append(k, v));
  }
  state.SetLabel(std::string(FormatName(f)) + (window ? "+s4+r128" : ""));
}
BENCHMARK(BM_PrecisionWindowAppend)
    ->ArgsProduct({{static_cast<int>(Format::kTurbo4), static_cast<int>(Format::kQ8_0)}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvcache
