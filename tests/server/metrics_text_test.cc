// /metrics' Prometheus text: every family has HELP and TYPE lines, the
// samples carry the snapshot's numbers, and the step histogram is
// cumulative with a +Inf bucket equal to _count.
#include "server/metrics_text.h"

#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>

namespace kvcache::server {
namespace {

// sample name (with labels) -> value, and the family -> type of each # TYPE line.
struct Parsed {
  std::map<std::string, std::string> samples;
  std::map<std::string, std::string> types;
  int help_lines = 0;
};

Parsed Parse(const std::string& text) {
  Parsed p;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with("# HELP ")) {
      ++p.help_lines;
    } else if (line.starts_with("# TYPE ")) {
      std::istringstream f(line.substr(7));
      std::string name, type;
      f >> name >> type;
      p.types[name] = type;
    } else {
      const size_t sp = line.rfind(' ');
      EXPECT_NE(sp, std::string::npos) << line;
      p.samples[line.substr(0, sp)] = line.substr(sp + 1);
    }
  }
  return p;
}

TEST(MetricsText, SamplesAndFamilies) {
  engine::EngineMetrics m;
  m.pool_blocks_total = 100;
  m.pool_blocks_free = 60;
  m.pool_blocks_used = 30;
  m.pool_blocks_cached = 10;
  m.requests_running = 3;
  m.requests_waiting = 2;
  m.preemptions = 4;
  m.cached_prompt_tokens = 64;
  m.generated_tokens = 1234;
  m.tier_hit_blocks = 5;
  m.prefix_lookups = 11;
  m.requests_held = 3;
  m.prefix_holds = 8;
  m.steps = 7;
  m.step_seconds_bounds = {0.001, 0.01, 0.1};
  m.step_seconds_counts = {1, 5, 6};
  m.step_seconds_sum = 0.25;
  HttpCounters http;
  http.responses_by_status = {{200, 9}, {400, 2}};
  const std::string text = PrometheusText(m, http);
  Parsed p = Parse(text);
  EXPECT_EQ(p.samples["kvcache_pool_blocks{state=\"free\"}"], "60");
  EXPECT_EQ(p.samples["kvcache_pool_blocks{state=\"used\"}"], "30");
  EXPECT_EQ(p.samples["kvcache_pool_blocks{state=\"cached\"}"], "10");
  EXPECT_EQ(p.samples["kvcache_requests_running"], "3");
  EXPECT_EQ(p.samples["kvcache_requests_waiting"], "2");
  EXPECT_EQ(p.samples["kvcache_preemptions_total"], "4");
  EXPECT_EQ(p.samples["kvcache_prefix_hit_tokens_total"], "64");
  EXPECT_EQ(p.samples["kvcache_generated_tokens_total"], "1234");
  EXPECT_EQ(p.samples["kvcache_tier_hits_total"], "5");
  EXPECT_EQ(p.samples["kvcache_prefix_lookups_total"], "11");
  EXPECT_EQ(p.samples["kvcache_requests_held"], "3");
  EXPECT_EQ(p.samples["kvcache_prefix_holds_total"], "8");
  EXPECT_EQ(p.types["kvcache_requests_held"], "gauge");
  EXPECT_EQ(p.samples["kvcache_step_seconds_bucket{le=\"0.001\"}"], "1");
  EXPECT_EQ(p.samples["kvcache_step_seconds_bucket{le=\"0.1\"}"], "6");
  EXPECT_EQ(p.samples["kvcache_step_seconds_bucket{le=\"+Inf\"}"], "7");
  EXPECT_EQ(p.samples["kvcache_step_seconds_count"], "7");
  EXPECT_EQ(p.samples["kvcache_step_seconds_sum"], "0.25");
  EXPECT_EQ(p.samples["kvcache_http_requests_total{code=\"400\"}"], "2");
  EXPECT_EQ(p.types["kvcache_step_seconds"], "histogram");
  EXPECT_EQ(p.types["kvcache_pool_blocks"], "gauge");
  EXPECT_EQ(p.types["kvcache_generated_tokens_total"], "counter");
  EXPECT_EQ(static_cast<size_t>(p.help_lines), p.types.size());
  // Every sample belongs to a declared family.
  for (const auto& [name, value] : p.samples) {
    std::string family = name.substr(0, name.find('{'));
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      if (family.ends_with(suffix) && p.types.count(family.substr(0, family.size() - strlen(suffix)))) {
        family = family.substr(0, family.size() - strlen(suffix));
      }
    }
    EXPECT_TRUE(p.types.count(family)) << name;
  }
  EXPECT_TRUE(text.ends_with("\n"));
}

TEST(MetricsText, EmptySnapshot) {
  Parsed p = Parse(PrometheusText(engine::EngineMetrics{}, HttpCounters{}));
  EXPECT_EQ(p.samples["kvcache_step_seconds_bucket{le=\"+Inf\"}"], "0");
  EXPECT_EQ(p.samples["kvcache_pool_blocks{state=\"used\"}"], "0");
}

}  // namespace
}  // namespace kvcache::server
