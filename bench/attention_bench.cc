// Google Benchmark suite for the attention kernels: decode per format pair
// (32 q heads / 8 kv heads / head_dim 128), contiguous vs paged, threads,
// multi-token verification and batched decode. Reports bytes/s of K/V read
// and labels the SIMD target.
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <vector>

#include "kvcache/attention.h"
#include "kvcache/simd.h"
#include "kvcache/thread_pool.h"
#include "tools/support/bench_support.h"

namespace kvcache {
namespace {

using attention_internal::SyntheticKv;
using attention_internal::SyntheticKvOptions;

constexpr uint32_t kQHeads = 32, kKvHeads = 8, kHeadDim = 128;

std::unique_ptr<SyntheticKv> Make(FormatPair fp, uint32_t tokens, bool paged, uint64_t seed = 1,
                                  uint32_t kv_heads = kKvHeads, uint32_t head_dim = kHeadDim) {
  SyntheticKvOptions o;
  o.formats = fp;
  o.n_kv_heads = kv_heads;
  o.head_dim = head_dim;
  o.num_tokens = tokens;
  o.paged = paged;
  o.seed = seed;
  auto kv = SyntheticKv::Create(o);
  return kv.ok() ? std::move(*kv) : nullptr;
}

// One kv head of head_dim values, `format` on both sides, seed 1.
std::unique_ptr<SyntheticKv> MakeHead(Format format, uint32_t tokens, bool paged, uint32_t head_dim) {
  return Make({format, format}, tokens, paged, 1, 1, head_dim);
}

// n query values in a fixed pattern, in [-0.06, 0.06].
std::vector<float> PatternQueries(size_t n) {
  std::vector<float> q(n);
  for (size_t i = 0; i < n; ++i) q[i] = 0.01f * static_cast<float>(i % 13) - 0.06f;
  return q;
}

// The timed loop of the multi-token cases: AttendMulti of t query tokens
// (q: [t][n_q_heads][head_dim]) over kv's view on pool, per iteration.
void TimeAttendMulti(benchmark::State& state, const SyntheticKv& kv, uint32_t t,
                     const std::vector<float>& q, uint32_t n_q_heads, ThreadPool* pool) {
  std::vector<float> out(q.size());
  AttentionOptions o;
  o.n_q_heads = n_q_heads;
  o.pool = pool;
  AttentionOutput ao;
  ao.out = out;
  for (auto _ : state) {
    const Status st = AttendMulti(kv.view(), t, q, o, ao);
    benchmark::DoNotOptimize(out.data());
    if (!st.ok()) state.SkipWithError(st.ToString().c_str());
  }
}

// Args: k format, v format, context, paged, threads, query tokens.
void BM_Attend(benchmark::State& state) {
  const FormatPair fp{static_cast<Format>(state.range(0)), static_cast<Format>(state.range(1))};
  const uint32_t ctx = static_cast<uint32_t>(state.range(2));
  const uint32_t threads = static_cast<uint32_t>(state.range(4));
  const uint32_t t = static_cast<uint32_t>(state.range(5));
  auto kv = Make(fp, ctx, state.range(3) != 0);
  if (!kv) {
    state.SkipWithError("cannot build the view");
    return;
  }
  ThreadPool pool(threads);
  TimeAttendMulti(state, *kv, t, std::vector<float>(size_t{t} * kQHeads * kHeadDim, 0.01f),
                  kQHeads, &pool);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kv->kv_bytes()));
  state.SetLabel(FormatPairName(fp) + (state.range(3) ? " paged " : " contiguous ") +
                 SimdTarget());
}

void DecodeArgs(benchmark::internal::Benchmark* b) {
  const Format fs[] = {Format::kF32,  Format::kF16,    Format::kBF16,   Format::kFp8E4M3,
                       Format::kQ8,   Format::kTurbo8, Format::kTurbo4, Format::kTurbo3,
                       Format::kTurbo2, Format::kQ8_0, Format::kQ4_0, Format::kTurbo4I};
  for (Format f : fs) {
    for (int paged : {0, 1}) {
      b->Args({static_cast<int>(f), static_cast<int>(f), 8192, paged, 1, 1});
    }
  }
  b->Args({static_cast<int>(Format::kBF16), static_cast<int>(Format::kTurbo4), 8192, 1, 1, 1});
  b->Args({static_cast<int>(Format::kBF16), static_cast<int>(Format::kBF16), 32768, 1, 2, 1});
  b->Args({static_cast<int>(Format::kTurbo4), static_cast<int>(Format::kTurbo4), 32768, 1, 2, 1});
  b->Args({static_cast<int>(Format::kTurbo4I), static_cast<int>(Format::kTurbo4I), 32768, 1, 2, 1});
  b->Args({static_cast<int>(Format::kBF16), static_cast<int>(Format::kBF16), 8192, 1, 1, 4});
}
BENCHMARK(BM_Attend)->Apply(DecodeArgs)->Unit(benchmark::kMicrosecond)->UseRealTime();

// The arithmetic cost per stored row with memory out of the way: one kv
// head, one GQA group of q heads (4 unless told), head_dim 128, 512 rows
// (L2-resident), one thread, repeated steps on the same data. Args: format
// (both sides), q heads per kv head. Reports ns_per_row (docs/attention.md,
// "Where the arithmetic goes").
void BM_AttendInCache(benchmark::State& state) {
  const Format f = static_cast<Format>(state.range(0));
  const uint32_t group = static_cast<uint32_t>(state.range(1));
  const uint32_t head_dim = static_cast<uint32_t>(state.range(2));
  const bool paged = state.range(3) != 0;
  constexpr uint32_t kRows = 512;
  auto kv = MakeHead(f, kRows, paged, head_dim);
  if (!kv) {
    state.SkipWithError("cannot build the view");
    return;
  }
  std::vector<float> q = PatternQueries(group * head_dim), out(q.size());
  AttentionOptions o;
  o.n_q_heads = group;
  AttentionOutput ao;
  ao.out = out;
  for (auto _ : state) {
    const Status st = AttendDecode(kv->view(), q, o, ao);
    benchmark::DoNotOptimize(out.data());
    if (!st.ok()) state.SkipWithError(st.ToString().c_str());
  }
  state.counters["ns_per_row"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * kRows,
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.SetLabel(std::string(FormatName(f)) + " group " + std::to_string(group) + " hd " +
                 std::to_string(head_dim) + (paged ? " paged " : " ") + SimdTarget());
}
// Every format with a group of 4; bf16, q8_0 and turbo4 also with groups of
// 1, 2 and 3 (SmolLM2 has 3 q heads per kv head), so the cost of a group
// compares within one run.
void InCacheArgs(benchmark::internal::Benchmark* b) {
  for (int f = 0; f <= static_cast<int>(Format::kTurbo4I); ++f) b->Args({f, 4, kHeadDim, 0});
  for (Format f : {Format::kBF16, Format::kQ8_0, Format::kTurbo4}) {
    for (int g : {1, 2, 3}) b->Args({static_cast<int>(f), g, kHeadDim, 0});
  }
  // SmolLM2's heads: groups of 3, head_dim 64, in 16-token blocks.
  for (Format f : {Format::kBF16, Format::kTurbo4}) {
    b->Args({static_cast<int>(f), 3, 64, 0});
    b->Args({static_cast<int>(f), 3, 64, 1});
  }
}
BENCHMARK(BM_AttendInCache)->Apply(InCacheArgs)->Unit(benchmark::kMicrosecond);

// Chunked prefill with Gemma 3's heads (4 q heads on 1 kv head of 256): a
// chunk of query tokens at the end of a context of stored tokens, causal
// (query t sees rows up to its own position). Args: format (both sides),
// context, query tokens, threads. Reports macs_per_s: the query-key pairs
// each query sees, times q heads, times head_dim, twice (K and V), per
// second.
void BM_AttendPrefill(benchmark::State& state) {
  constexpr uint32_t kGroup = 4, kDim = 256;
  const Format f = static_cast<Format>(state.range(0));
  const uint32_t ctx = static_cast<uint32_t>(state.range(1));
  const uint32_t t = static_cast<uint32_t>(state.range(2));
  auto kv = MakeHead(f, ctx, false, kDim);
  if (!kv) {
    state.SkipWithError("cannot build the view");
    return;
  }
  ThreadPool pool(static_cast<uint32_t>(state.range(3)));
  TimeAttendMulti(state, *kv, t, PatternQueries(size_t{t} * kGroup * kDim), kGroup, &pool);
  // Query i (0-based in the chunk) sees ctx - t + i + 1 rows.
  const double pairs = static_cast<double>(t) * (ctx - t) + 0.5 * t * (t + 1.0);
  state.counters["macs_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * pairs * kGroup * kDim * 2,
      benchmark::Counter::kIsRate);
  state.SetLabel(std::string(FormatName(f)) + " " + SimdTarget());
}
void PrefillArgs(benchmark::internal::Benchmark* b) {
  for (Format f : {Format::kF32, Format::kBF16, Format::kQ8_0, Format::kTurbo4}) {
    for (int threads : {1, 2}) b->Args({static_cast<int>(f), 16384, 256, threads});
  }
}
BENCHMARK(BM_AttendPrefill)
    ->Apply(PrefillArgs)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Args: format (both sides), sequences, context, threads.
void BM_AttendBatch(benchmark::State& state) {
  const Format f = static_cast<Format>(state.range(0));
  const uint32_t n = static_cast<uint32_t>(state.range(1));
  const uint32_t ctx = static_cast<uint32_t>(state.range(2));
  std::vector<std::unique_ptr<SyntheticKv>> kvs;
  std::vector<LayerKvView> views;
  size_t bytes = 0;
  for (uint32_t s = 0; s < n; ++s) {
    kvs.push_back(Make({f, f}, ctx, true, 10 + s));
    if (!kvs.back()) {
      state.SkipWithError("cannot build the view");
      return;
    }
    views.push_back(kvs.back()->view());
    bytes += kvs.back()->kv_bytes();
  }
  ThreadPool pool(static_cast<uint32_t>(state.range(3)));
  std::vector<float> q(size_t{n} * kQHeads * kHeadDim, 0.01f), out(q.size());
  AttentionOptions o;
  o.n_q_heads = kQHeads;
  o.pool = &pool;
  for (auto _ : state) {
    const Status st = AttendDecodeBatch(views, q, o, out);
    benchmark::DoNotOptimize(out.data());
    if (!st.ok()) state.SkipWithError(st.ToString().c_str());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  state.SetLabel(std::string(FormatName(f)) + " " + SimdTarget());
}
BENCHMARK(BM_AttendBatch)
    ->Args({static_cast<int>(Format::kBF16), 16, 2048, 2})
    ->Args({static_cast<int>(Format::kTurbo4), 16, 2048, 2})
    ->Args({static_cast<int>(Format::kTurbo4I), 16, 2048, 2})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace
}  // namespace kvcache
