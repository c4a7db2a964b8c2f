// Google Benchmark suite for hybrid layers: the linear-state update per
// token (the best SIMD target vs the lowest; bytes = the f64 state read and
// written once per token), speculative commit of a linear layer (replay vs
// moving the scratch lane), a window layer's append with compaction vs a
// full layer's, and H2O selection. Labels name the SIMD target.
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "kvcache/eviction.h"
#include "kvcache/hybrid.h"
#include "kvcache/linear_state.h"
#include "kvcache/simd.h"

namespace kvcache {
namespace {

std::vector<float> Rand(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-0.1f, 0.1f);
  std::vector<float> x(n);
  for (float& f : x) f = u(rng);
  return x;
}

// One token through one layer of 8 heads, d_k = d_v = 128, as a caller
// runs it (LinearState::Append with a query: the update, then the read);
// arg 0: rule, arg 1: 1 = the best SIMD target, 0 = the lowest this CPU
// supports (UseSimdTarget; EMU128 where it is compiled).
void BM_LinearUpdate(benchmark::State& state) {
  const auto rule = static_cast<LinearRule>(state.range(0));
  const std::vector<std::string> targets = SupportedSimdTargets();
  const std::string target = state.range(1) != 0 ? targets.front() : targets.back();
  if (!UseSimdTarget(target).ok()) {
    state.SkipWithError("cannot select the SIMD target");
    return;
  }
  auto st = std::move(*LinearState::Create({.n_heads = 8, .d_k = 128, .d_v = 128, .rule = rule}));
  const auto k = Rand(8 * 128, 1), v = Rand(8 * 128, 2), q = Rand(8 * 128, 3);
  const std::vector<float> gate(rule == LinearRule::kPlain ? 0 : 8, 0.9f);
  std::vector<float> out(8 * 128);
  for (auto _ : state) {
    (void)st.Append({.k = k, .v = v, .gate = gate, .q = q}, out);
    benchmark::DoNotOptimize(out.data());
  }
  (void)UseSimdTarget(targets.front());
  state.SetBytesProcessed(state.iterations() * int64_t{8 * 128 * 128} * 8 * 2);
  state.SetLabel(std::string(LinearRuleName(rule)) + " " + target);
}
BENCHMARK(BM_LinearUpdate)->ArgsProduct({{0, 1, 2}, {0, 1}});

// Draft 8 tokens on a delta-rule layer (8 x 128 x 128), commit arg 0 of them.
void BM_LinearDraftCommit(benchmark::State& state) {
  const uint32_t accepted = static_cast<uint32_t>(state.range(0));
  auto st = std::move(*LinearState::Create({.n_heads = 8, .d_k = 128, .d_v = 128,
                                            .rule = LinearRule::kDelta}));
  const auto k = Rand(8 * 8 * 128, 4), v = Rand(8 * 8 * 128, 5);
  for (auto _ : state) {
    (void)st.BeginDraft();
    (void)st.Append({.k = k, .v = v});
    (void)st.Commit(accepted);
  }
  state.SetLabel("draft 8, commit " + std::to_string(accepted) + " (includes the 8 draft updates)");
}
BENCHMARK(BM_LinearDraftCommit)->Arg(0)->Arg(4)->Arg(7)->Arg(8);

// Append one token to a 1-layer paged sequence (8 kv heads, d 128, f32,
// block 16) of kind arg 0 (0 full; 1, 2: window 4 + 1024 with slack 16, 256).
// A window compaction moves the W kept rows, so its cost per token is about
// (W / slack) row moves per head and side.
void BM_WindowAppend(benchmark::State& state) {
  const Geometry g = *Geometry::Create({1, 8, 128, 16});
  const LayerSpec spec = state.range(0) ? LayerSpec::Window(4, 1024) : LayerSpec::Full();
  const uint32_t slack = state.range(0) == 2 ? 256 : 16;
  auto model = *HybridModel::Create(g, {}, {spec}, {.window_slack_tokens = slack});
  auto pools = *model->CreatePools(std::vector<uint32_t>{400, 400});
  auto seq = std::move(*HybridSequence::CreatePaged(model, pools));
  const auto k = Rand(8 * 128, 6);
  uint32_t n = 0;
  for (auto _ : state) {
    if (++n == 4096) {  // keep the full layer inside its pool
      state.PauseTiming();
      seq = std::move(*HybridSequence::CreatePaged(model, pools));
      n = 0;
      state.ResumeTiming();
    }
    benchmark::DoNotOptimize(seq.AppendLayer(0, {.k = k, .v = k}));
  }
  state.SetLabel(state.range(0) ? "window(4,1024) G=" + std::to_string(slack) : "full");
}
BENCHMARK(BM_WindowAppend)->Arg(0)->Arg(1)->Arg(2);

// H2O selection over arg 0 rows (budget 256 heavy + 256 recent + 4 sinks).
void BM_SelectHeavyHitters(benchmark::State& state) {
  const uint32_t n = static_cast<uint32_t>(state.range(0));
  const auto imp = Rand(n, 7);
  const EvictionPolicy p = EvictionPolicy::HeavyHitter(256, 256, 4);
  for (auto _ : state) benchmark::DoNotOptimize(SelectRows(p, n, imp));
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_SelectHeavyHitters)->Arg(4096)->Arg(32768);

}  // namespace
}  // namespace kvcache
