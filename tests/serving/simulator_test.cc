// The serving simulation on the KV manager: invariants after every step
// under random workloads, no leaks at the end, and the effects each option
// should have.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "engine/kv_manager.h"
#include "engine/sim/simulator.h"
#include "engine/sim/simulator_internal.h"

namespace kvcache {
namespace {

struct Config {
  WorkloadKind kind;
  AdmissionPolicy admission;
  uint32_t draft_tokens;
  bool prefix_caching;
  uint32_t num_blocks;
};

std::vector<Request> Workload(WorkloadKind kind, uint32_t n, uint64_t seed) {
  WorkloadOptions w;
  w.kind = kind;
  w.num_requests = n;
  w.seed = seed;
  w.mean_interarrival_steps = 1.0;
  return GenerateWorkload(w);
}

// Runs on a KV manager of c.num_blocks blocks of 16 tokens (2 layers, 2 kv
// heads of 16, f32); `pool`, if given, gets its pool figures at the end.
SimulateReport RunSim(const Config& c, const std::vector<Request>& requests,
                   engine::KvGroupMetrics* pool = nullptr) {
  SimulateOptions o;
  o.geometry = {2, 2, 16, 16};
  o.formats = {Format::kF32, Format::kF32};
  o.admission = c.admission;
  o.draft_tokens = c.draft_tokens;
  o.draft_accept = 0.6;
  o.prefix_caching = c.prefix_caching;
  o.check_invariants = true;
  Result<std::unique_ptr<engine::KvManager>> kv = serving::NewSimulationKvManager(o, c.num_blocks);
  EXPECT_TRUE(kv.ok()) << kv.status().ToString();
  if (!kv.ok()) return {};
  Result<SimulateReport> r = serving::SimulateOn(kv->get(), 16, o, requests);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (pool) *pool = (*kv)->Metrics().groups[0];
  EXPECT_TRUE((*kv)->CheckInvariants().ok());
  return r.ok() ? *r : SimulateReport{};
}

TEST(Simulator, InvariantsHoldAndNothingLeaks) {
  const Config configs[] = {
      {WorkloadKind::kChat, AdmissionPolicy::kReservePrompt, 0, true, 300},
      {WorkloadKind::kChat, AdmissionPolicy::kReserveWorstCase, 0, true, 300},
      {WorkloadKind::kChat, AdmissionPolicy::kReservePrompt, 3, true, 200},
      {WorkloadKind::kChat, AdmissionPolicy::kReserveWorstCase, 3, false, 200},
      {WorkloadKind::kSharedPrefix, AdmissionPolicy::kReservePrompt, 2, true, 150},
      {WorkloadKind::kParallelSampling, AdmissionPolicy::kReservePrompt, 0, true, 250},
      {WorkloadKind::kParallelSampling, AdmissionPolicy::kReserveWorstCase, 4, true, 250},
  };
  for (const Config& c : configs) {
    SCOPED_TRACE(fmt::format("{} {} drafts={} prefix={} blocks={}", WorkloadKindName(c.kind),
                             AdmissionPolicyName(c.admission), c.draft_tokens, c.prefix_caching,
                             c.num_blocks));
    const std::vector<Request> requests = Workload(c.kind, 30, 7);
    engine::KvGroupMetrics pool;
    const SimulateReport r = RunSim(c, requests, &pool);
    if (HasFailure()) return;
    EXPECT_EQ(r.requests + r.rejected, requests.size());
    uint64_t samples = 0, outputs = 0;
    for (const Request& q : requests) {
      samples += q.num_samples;
      outputs += uint64_t{q.num_samples} * (q.output.empty() ? q.max_new_tokens : q.output.size());
    }
    if (r.rejected == 0) {
      EXPECT_EQ(r.sequences, samples);
      EXPECT_EQ(r.generated_tokens, outputs);
    }
    EXPECT_EQ(pool.blocks_used, 0u);
    EXPECT_EQ(pool.blocks_reserved, 0u);
    EXPECT_EQ(pool.blocks_free + pool.blocks_cached, c.num_blocks);
    EXPECT_EQ(pool.blocks_total, c.num_blocks);
    EXPECT_GT(r.peak_concurrent, 0u);
    EXPECT_LE(r.peak_pool_utilization, 1.0);
    if (c.admission == AdmissionPolicy::kReserveWorstCase) {
      EXPECT_EQ(r.preemptions, 0u);
    }
    if (c.draft_tokens > 0) {
      EXPECT_GT(r.draft_tokens, 0u);
      EXPECT_LT(r.draft_accepted, r.draft_tokens);
    }
    if (!c.prefix_caching) {
      EXPECT_EQ(r.prefix.lookups, 0u);
    }
  }
}

// A whole run's choices, pinned: the figures the simulator gave on the
// reference model of the pool's accounting and on the real pool alike
// (free blocks most recently freed first, LRU eviction) before the KV
// manager took its blocks over, and gives on the manager.
TEST(Simulator, RunMatchesTheBlockModel) {
  const Config c{WorkloadKind::kChat, AdmissionPolicy::kReservePrompt, 2, true, 150};
  const std::vector<Request> requests = Workload(c.kind, 40, 11);
  const SimulateReport r = RunSim(c, requests);
  EXPECT_EQ(r.preemptions, 27u);
  EXPECT_EQ(r.evicted_blocks, 1892u);
  EXPECT_EQ(r.tokens_appended, 37588u);
  EXPECT_EQ(r.prefix.hit_tokens, 528736u);
  EXPECT_EQ(r.peak_concurrent, 9u);
  EXPECT_EQ(r.steps, 2024u);
}

TEST(Simulator, TightPoolPreemptsAndEvicts) {
  const std::vector<Request> requests = Workload(WorkloadKind::kChat, 60, 3);
  const SimulateReport r =
      RunSim({WorkloadKind::kChat, AdmissionPolicy::kReservePrompt, 0, true, 120}, requests);
  EXPECT_GT(r.preemptions, 0u);
  EXPECT_GT(r.evicted_blocks, 0u);
  EXPECT_EQ(r.requests + r.rejected, 60u);
  EXPECT_GT(r.requests, 50u);
}

TEST(Simulator, PrefixCachingSavesPrefill) {
  const std::vector<Request> requests = Workload(WorkloadKind::kSharedPrefix, 60, 5);
  const SimulateReport on =
      RunSim({WorkloadKind::kSharedPrefix, AdmissionPolicy::kReservePrompt, 0, true, 400}, requests);
  const SimulateReport off =
      RunSim({WorkloadKind::kSharedPrefix, AdmissionPolicy::kReservePrompt, 0, false, 400}, requests);
  EXPECT_GT(on.prefix_hit_rate, 0.5);
  EXPECT_EQ(off.prefix_hit_rate, 0.0);
  EXPECT_LT(on.prefill_tokens * 2, off.prefill_tokens);
  EXPECT_LT(on.tokens_appended, off.tokens_appended);
}

TEST(Simulator, RejectsWhatCanNeverFit) {
  std::vector<Request> requests(2);
  requests[0].prompt.assign(100, 1);
  requests[0].max_new_tokens = 10;
  requests[1].prompt.assign(10000, 2);  // far beyond 16 blocks of 16
  requests[1].max_new_tokens = 10;
  requests[1].arrival = 1;
  const SimulateReport r =
      RunSim({WorkloadKind::kChat, AdmissionPolicy::kReservePrompt, 0, true, 16}, requests);
  EXPECT_EQ(r.requests, 1u);
  EXPECT_EQ(r.rejected, 1u);
}

TEST(Simulator, FormatsChangeCapacity) {
  const std::vector<Request> requests = Workload(WorkloadKind::kChat, 60, 1);
  SimulateOptions o;
  o.pool_bytes = uint64_t{256} << 20;
  o.formats = {Format::kBF16, Format::kBF16};
  Result<SimulateReport> bf16 = Simulate(o, requests);
  o.formats = {Format::kTurbo3, Format::kTurbo3};
  Result<SimulateReport> turbo3 = Simulate(o, requests);
  ASSERT_TRUE(bf16.ok()) << bf16.status().ToString();
  ASSERT_TRUE(turbo3.ok()) << turbo3.status().ToString();
  // llama3-8b geometry: 128 KiB per bf16 token; 16 tokens per block.
  EXPECT_EQ(bf16->bytes_per_token, 2u * 32 * 8 * 128 * 2);
  EXPECT_EQ(bf16->num_blocks, (uint64_t{256} << 20) / (16 * bf16->bytes_per_token));
  EXPECT_GT(turbo3->num_blocks, 4 * bf16->num_blocks);
  EXPECT_GE(turbo3->mean_concurrent, bf16->mean_concurrent);
  EXPECT_LE(turbo3->preemptions, bf16->preemptions);
  EXPECT_EQ(bf16->requests, 60u);
  // Errors are values.
  o.pool_bytes = 1000;
  EXPECT_EQ(Simulate(o, requests).status().code(), StatusCode::kInvalidArgument);
  o.pool_bytes = uint64_t{1} << 30;
  o.draft_accept = 1.5;
  EXPECT_FALSE(Simulate(o, requests).ok());
}

TEST(Simulator, ModelGeometries) {
  EXPECT_EQ(ParseModelGeometry("llama3-70b")->n_layers, 80u);
  EXPECT_EQ(ParseModelGeometry("qwen2-7b")->n_kv_heads, 4u);
  const GeometryOptions g = ParseModelGeometry("12,4,64").value();
  EXPECT_EQ(g.n_layers, 12u);
  EXPECT_EQ(g.n_kv_heads, 4u);
  EXPECT_EQ(g.head_dim, 64u);
  for (const char* bad : {"", "llama", "1,2", "1,2,3,4", "0,8,128", "a,b,c", "32,8,"}) {
    EXPECT_FALSE(ParseModelGeometry(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace kvcache
