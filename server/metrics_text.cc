// The Prometheus text of /metrics (see metrics_text.h).
#include "server/metrics_text.h"

#include <fmt/format.h>

#include <cmath>

namespace kvcache::server {
namespace {

void Family(std::string* out, const char* name, const char* type, const char* help) {
  *out += fmt::format("# HELP kvcache_{} {}\n# TYPE kvcache_{} {}\n", name, help, name, type);
}

void Sample(std::string* out, const char* name, uint64_t value, const std::string& labels = "") {
  *out += fmt::format("kvcache_{}{} {}\n", name, labels, value);
}

void Single(std::string* out, const char* name, const char* type, const char* help, uint64_t value) {
  Family(out, name, type, help);
  Sample(out, name, value);
}

// A bound as Prometheus spells it: shortest round-trip, "+Inf" for infinity.
std::string Bound(double b) {
  if (std::isinf(b)) return "+Inf";
  return fmt::format("{}", b);
}

void StepHistogram(std::string* out, const engine::EngineMetrics& m) {
  Family(out, "step_seconds", "histogram", "Wall time of one engine step (a batched forward pass)");
  const size_t n = std::min(m.step_seconds_bounds.size(), m.step_seconds_counts.size());
  bool has_inf = false;
  for (size_t i = 0; i < n; ++i) {
    has_inf = has_inf || std::isinf(m.step_seconds_bounds[i]);
    *out += fmt::format("kvcache_step_seconds_bucket{{le=\"{}\"}} {}\n", Bound(m.step_seconds_bounds[i]),
                        m.step_seconds_counts[i]);
  }
  if (!has_inf) *out += fmt::format("kvcache_step_seconds_bucket{{le=\"+Inf\"}} {}\n", m.steps);
  *out += fmt::format("kvcache_step_seconds_sum {}\n", m.step_seconds_sum);
  *out += fmt::format("kvcache_step_seconds_count {}\n", m.steps);
}

}  // namespace

std::string PrometheusText(const engine::EngineMetrics& m, const HttpCounters& http) {
  std::string out;
  Family(&out, "pool_blocks", "gauge", "Blocks of the KV pool by state");
  Sample(&out, "pool_blocks", m.pool_blocks_free, "{state=\"free\"}");
  Sample(&out, "pool_blocks", m.pool_blocks_used, "{state=\"used\"}");
  Sample(&out, "pool_blocks", m.pool_blocks_cached, "{state=\"cached\"}");
  // Each layer group's own pool (a model with sliding-window layers has two).
  Family(&out, "pool_group_blocks", "gauge", "Blocks of each layer group's KV pool by state");
  for (const engine::PoolGroupMetrics& g : m.pool_groups) {
    const std::pair<const char*, uint64_t> states[] = {
        {"free", g.free}, {"used", g.used}, {"cached", g.cached}, {"reserved", g.reserved}, {"total", g.total}};
    for (const auto& [state, value] : states) {
      Sample(&out, "pool_group_blocks", value, fmt::format("{{group=\"{}\",state=\"{}\"}}", g.kind, state));
    }
  }
  const struct {
    const char* name;
    const char* type;
    const char* help;
    uint64_t value;
  } singles[] = {
      {"pool_blocks_total", "gauge", "Blocks of the KV pool", m.pool_blocks_total},
      {"requests_running", "gauge", "Requests in the running batch", m.requests_running},
      {"requests_waiting", "gauge", "Requests queued for admission", m.requests_waiting},
      {"requests_finished_total", "counter", "Requests that ended (any reason)", m.requests_finished},
      {"requests_cancelled_total", "counter", "Requests cancelled (client gone, shutdown)", m.requests_cancelled},
      {"preemptions_total", "counter", "Running requests preempted for lack of blocks", m.preemptions},
      {"prompt_tokens_total", "counter", "Prompt tokens of admitted requests", m.prompt_tokens},
      {"prefix_hit_tokens_total", "counter", "Prompt tokens adopted from the prefix cache or a tier",
       m.cached_prompt_tokens},
      {"prefix_lookups_total", "counter", "Prefix-cache lookups (one per admission)", m.prefix_lookups},
      {"requests_held", "gauge", "Waiting requests held for a running request's prefill of their prefix",
       m.requests_held},
      {"prefix_holds_total", "counter", "Requests held back to adopt a prefix another request prefilled",
       m.prefix_holds},
      {"generated_tokens_total", "counter", "Tokens sampled", m.generated_tokens},
      {"tier_hits_total", "counter", "Blocks found in an offload tier", m.tier_hit_blocks},
      {"tier_misses_total", "counter", "Blocks looked up in the tiers and not found", m.tier_miss_blocks},
      {"steps_total", "counter", "Engine steps run", m.steps},
  };
  for (const auto& s : singles) Single(&out, s.name, s.type, s.help, s.value);
  StepHistogram(&out, m);
  Family(&out, "http_requests_total", "counter", "HTTP responses by status code");
  for (const auto& [code, count] : http.responses_by_status) {
    Sample(&out, "http_requests_total", count, fmt::format("{{code=\"{}\"}}", code));
  }
  return out;
}

}  // namespace kvcache::server
