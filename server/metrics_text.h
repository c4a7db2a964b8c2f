// /metrics: the engine's counters and the HTTP front's own, in the
// Prometheus text exposition format 0.0.4 (one "# HELP" and "# TYPE" line
// per family, then its samples; a histogram as cumulative _bucket{le=...}
// samples ending at le="+Inf", then _sum and _count).
//
// Names (all prefixed kvcache_): pool_blocks{state="free|used|cached"},
// pool_blocks_total, requests_running, requests_waiting (gauges);
// requests_finished_total, requests_cancelled_total, preemptions_total,
// prompt_tokens_total, prefix_hit_tokens_total, generated_tokens_total,
// tier_hits_total, tier_misses_total, steps_total (counters);
// step_seconds (histogram); http_requests_total{code="..."} (counter).
//
// Thread safety: a pure function of its arguments.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "engine/engine.h"

namespace kvcache::server {

// The HTTP front's counters at one moment: responses by status code.
struct HttpCounters {
  std::map<int, uint64_t> responses_by_status;
};

std::string PrometheusText(const engine::EngineMetrics& m, const HttpCounters& http);

inline constexpr const char* kPrometheusContentType = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace kvcache::server
