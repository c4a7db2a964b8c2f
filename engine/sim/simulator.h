// Serving simulation: replays a workload through the engine's Scheduler and
// KV manager (a real BlockPool and PrefixCache), without model math, to show
// how many requests a memory budget holds under each K/V format and how much
// prefix reuse saves.
//
// Time advances in decode steps. Each step:
//   1. admission (FCFS): a waiting request whose arrival has come looks up
//      its prompt in the prefix cache (all but the last prompt token: that one
//      is always computed, engines need its logits), then reserves blocks
//      (admission control: AdmissionPolicy, the KV manager's KvReservation)
//      and allocates its prefill; if the reservation fails it waits, and so
//      does everyone behind it;
//   2. decode: every running sequence appends one token, or with speculation
//      1 + draft_tokens rows of which a geometric number of drafts is
//      accepted (probability draft_accept each) and the rest truncated away;
//      when the pool runs out, the most recently admitted sequence is
//      preempted (its blocks released, tail first; it is requeued at the
//      front and recomputes prompt + output so far, usually hitting the
//      blocks it published);
//   3. publication: full blocks of committed tokens go to the prefix cache
//      (draft rows never do); finished sequences release their blocks.
// Parallel samples fork the prompt's blocks after prefill (shared by
// refcount; the partial block is copied on first write).
//
// Rows are not written (the KV manager is made without rows): memory is
// accounted in whole pool blocks of the real byte size of the format pair,
// which is what capacity depends on.
//
// Thread safety: Simulate is reentrant; it owns everything it creates.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "kvcache/format.h"
#include "kvcache/geometry.h"
#include "kvcache/serving/offload.h"
#include "kvcache/serving/prefix_cache.h"
#include "kvcache/status.h"
#include "kvcache/serving/workload.h"

namespace kvcache {

enum class AdmissionPolicy : uint8_t {
  // Reserve the uncached prompt blocks (+ one per extra sample); decode grows
  // from what is available and preempts when the pool runs out (vLLM-like).
  kReservePrompt,
  // Reserve the worst case (prompt + max_new_tokens + drafts, every sample):
  // appends never fail and nothing is preempted, but fewer requests fit.
  kReserveWorstCase,
};
Result<AdmissionPolicy> ParseAdmissionPolicy(std::string_view name);  // "prompt", "worst-case"
std::string_view AdmissionPolicyName(AdmissionPolicy policy);

struct SimulateOptions {
  GeometryOptions geometry{32, 8, 128, 16};
  FormatPair formats{Format::kBF16, Format::kBF16};
  uint64_t pool_bytes = uint64_t{1} << 30;
  AdmissionPolicy admission = AdmissionPolicy::kReservePrompt;
  bool prefix_caching = true;
  uint32_t draft_tokens = 0;   // speculative drafts per step (0 = none)
  double draft_accept = 0.7;   // acceptance probability of each draft
  uint32_t max_running = 256;  // batch limit (sequences decoding at once)
  uint64_t seed = 1;
  uint64_t max_steps = 50'000'000;  // a safety stop
  // Offload tiers under the prefix cache (offload.h), in order; empty =
  // none. Needs prefix_caching. Stores are write-through on a background
  // thread, so with tiers the counters (not the blocks' accounting) depend
  // on timing: a busy writer drops stores. Rows are not computed, so the
  // objects carry the pool's (zero) bytes; what is measured is traffic.
  std::vector<std::shared_ptr<Tier>> tiers;
  std::string model_fingerprint = "kvcache-simulate";
  // For tests: check pool and prefix-cache invariants after every step.
  bool check_invariants = false;
  // Called now and then with the fraction of requests done, in [0, 1].
  std::function<void(double)> progress;
};

struct SimulateReport {
  std::string formats;          // "k:v"
  uint32_t num_blocks = 0;      // pool size
  uint64_t block_bytes = 0;
  uint64_t bytes_per_token = 0;
  uint64_t capacity_tokens = 0;  // num_blocks * block_size
  uint64_t requests = 0;         // completed (all samples)
  uint64_t rejected = 0;         // could never fit in the pool
  uint64_t sequences = 0;        // completed samples
  uint64_t steps = 0;            // decode steps with work
  uint32_t peak_concurrent = 0;  // sequences decoding in one step
  double mean_concurrent = 0;
  double prefix_hit_rate = 0;
  PrefixCacheStats prefix;
  uint64_t tier_hit_tokens = 0;      // prompt tokens loaded from tiers
  OffloadStats offload;              // per-tier counters (empty without tiers)
  uint64_t preemptions = 0;
  uint64_t evicted_blocks = 0;
  double pool_utilization = 0;       // mean over steps of in-use / all blocks
  double peak_pool_utilization = 0;
  uint64_t tokens_appended = 0;      // rows written: prefill + decode + drafts
  uint64_t prefill_tokens = 0;       // prompt rows computed (not hit)
  uint64_t generated_tokens = 0;     // committed output tokens
  uint64_t draft_tokens = 0;         // draft rows appended
  uint64_t draft_accepted = 0;
  double mean_queue_steps = 0;       // arrival to first admission
  double wall_seconds = 0;
  double sim_tokens_per_second = 0;  // tokens_appended / wall_seconds
};

// Replays `requests` on a fresh pool of options.pool_bytes.
Result<SimulateReport> Simulate(const SimulateOptions& options, std::span<const Request> requests);

// Named geometries: llama3-8b (32,8,128), llama3-70b (80,8,128),
// mistral-7b (32,8,128), qwen2-7b (28,4,128); or "L,KVH,D". Block size 16.
Result<GeometryOptions> ParseModelGeometry(std::string_view text);

}  // namespace kvcache
