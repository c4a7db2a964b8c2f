// `kvcache simulate`: replay a serving workload through a real pool and
// prefix cache for one or several K/V formats and compare them.
#include <unistd.h>

#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/sim/simulator.h"
#include "kvcache/serving/workload.h"
#include "tools/cmd_simulate.h"
#include "tools/command.h"
#include "tools/tier_json.h"

namespace kvcache::tools {
namespace {

struct SimulateCliOptions {
  bool json = false;
  double pool_gib = 1.0;
  std::string geometry = "llama3-8b";
  std::vector<std::string> formats;
  std::string workload = "chat";
  uint32_t requests = 300;
  uint64_t seed = 1;
  double interarrival = 1.0;
  double draft_accept = -1;  // unset
  uint32_t draft_tokens = 0;
  std::string admission = "prompt";
  bool no_prefix_cache = false;
  std::string tiers;  // offload tiers: host:SIZE,disk:PATH:SIZE,redis://HOST:PORT
  uint32_t max_running = 256;
};

const std::vector<std::string> kDefaultFormats = {"bf16", "fp8_e4m3", "turbo4", "turbo3"};

nlohmann::json ReportJson(const SimulateReport& r) {
  nlohmann::json misses = nlohmann::json::object();
  for (size_t i = 0; i < kNumMissReasons; ++i) {
    misses[std::string(MissReasonName(static_cast<MissReason>(i)))] = {
        {"lookups", r.prefix.miss_lookups[i]}, {"tokens", r.prefix.miss_tokens[i]}};
  }
  nlohmann::json tiers = nlohmann::json::array();
  for (const TierStats& t : r.offload.tiers) tiers.push_back(TierStatsJson(t));
  return {
      {"tiers", tiers},
      {"tier_hit_tokens", r.tier_hit_tokens},
      {"kv_format", r.formats},
      {"requests", r.requests},
      {"rejected", r.rejected},
      {"sequences", r.sequences},
      {"peak_concurrent", r.peak_concurrent},
      {"mean_concurrent", r.mean_concurrent},
      {"prefix_hit_rate", r.prefix_hit_rate},
      {"preemptions", r.preemptions},
      {"evicted_blocks", r.evicted_blocks},
      {"pool_utilization", r.pool_utilization},
      {"peak_pool_utilization", r.peak_pool_utilization},
      {"tokens_appended", r.tokens_appended},
      {"prefill_tokens", r.prefill_tokens},
      {"generated_tokens", r.generated_tokens},
      {"draft_tokens", r.draft_tokens},
      {"draft_accepted", r.draft_accepted},
      {"steps", r.steps},
      {"mean_queue_steps", r.mean_queue_steps},
      {"pool", {{"num_blocks", r.num_blocks},
                {"block_bytes", r.block_bytes},
                {"bytes_per_token", r.bytes_per_token},
                {"capacity_tokens", r.capacity_tokens}}},
      {"prefix_cache", {{"lookups", r.prefix.lookups},
                        {"lookup_tokens", r.prefix.lookup_tokens},
                        {"hit_tokens", r.prefix.hit_tokens},
                        {"published_blocks", r.prefix.published_blocks},
                        {"evictions", r.prefix.evictions},
                        {"orphans_dropped", r.prefix.orphans_dropped},
                        {"misses", misses}}},
      {"wall_seconds", r.wall_seconds},
      {"sim_tokens_per_second", r.sim_tokens_per_second},
  };
}

void PrintTable(std::FILE* out, const std::vector<SimulateReport>& reports) {
  fmt::print(out, "{:<20} {:>7} {:>9} {:>8} {:>6} {:>6} {:>6} {:>8} {:>8} {:>6} {:>10} {:>7}\n",
             "kv_format", "blocks", "cap_tok", "requests", "peak", "mean", "hit%", "preempt",
             "evicted", "util%", "appended", "sim_s");
  for (const SimulateReport& r : reports) {
    fmt::print(out,
               "{:<20} {:>7} {:>9} {:>8} {:>6} {:>6.1f} {:>6.1f} {:>8} {:>8} {:>6.1f} {:>10} {:>7.2f}\n",
               r.formats, r.num_blocks, r.capacity_tokens, r.requests, r.peak_concurrent,
               r.mean_concurrent, 100 * r.prefix_hit_rate, r.preemptions, r.evicted_blocks,
               100 * r.pool_utilization, r.tokens_appended, r.wall_seconds);
  }
}

// Draws "[#####     ] 42% label" on a terminal; silent elsewhere.
class ProgressBar {
 public:
  explicit ProgressBar(bool enabled) : enabled_(enabled) {}
  std::function<void(double)> For(std::string label) {
    if (!enabled_) return nullptr;
    return [this, label](double f) {
      const int width = 30, filled = static_cast<int>(f * width + 0.5);
      fmt::print("\r[{}{}] {:3.0f}% {}", std::string(filled, '#'), std::string(width - filled, ' '),
                 100 * f, label);
      std::fflush(stdout);
    };
  }
  void Done() {
    if (enabled_) fmt::print("\r{:60}\r", "");
  }

 private:
  bool enabled_;
};

int RunSimulate(const SimulateCliOptions& o) {
  auto fail = [](const Status& s) {
    fmt::print(stderr, "kvcache simulate: {}\n", s.ToString());
    return 2;
  };
  Result<GeometryOptions> geometry = ParseModelGeometry(o.geometry);
  if (!geometry.ok()) return fail(geometry.status());
  Result<AdmissionPolicy> admission = ParseAdmissionPolicy(o.admission);
  if (!admission.ok()) return fail(admission.status());
  std::vector<FormatPair> formats;
  for (const std::string& f : o.formats.empty() ? kDefaultFormats : o.formats) {
    Result<FormatPair> pair = ParseFormatPair(f);
    if (!pair.ok()) return fail(pair.status());
    formats.push_back(*pair);
  }
  if (!(o.pool_gib > 0) || o.pool_gib > 1 << 20) {
    return fail(Status::InvalidArgument("--pool-gib must be > 0"));
  }
  if (o.draft_accept != -1 && !(o.draft_accept >= 0 && o.draft_accept <= 1)) {
    return fail(Status::InvalidArgument("--draft-accept must be in [0, 1]"));
  }
  std::vector<Request> requests;
  std::string workload_name = o.workload;
  if (Result<WorkloadKind> kind = ParseWorkloadKind(o.workload); kind.ok()) {
    WorkloadOptions w;
    w.kind = *kind;
    w.num_requests = o.requests;
    w.seed = o.seed;
    w.mean_interarrival_steps = o.interarrival;
    requests = GenerateWorkload(w);
  } else if (o.workload.ends_with(".jsonl")) {
    Result<std::vector<Request>> loaded = LoadWorkloadFile(o.workload);
    if (!loaded.ok()) return fail(loaded.status());
    requests = std::move(*loaded);
  } else {
    return fail(kind.status());
  }

  SimulateOptions s;
  s.geometry = *geometry;
  s.pool_bytes = static_cast<uint64_t>(o.pool_gib * double(uint64_t{1} << 30));
  s.admission = *admission;
  s.prefix_caching = !o.no_prefix_cache;
  s.seed = o.seed;
  s.max_running = o.max_running;
  s.draft_tokens = o.draft_tokens;
  if (o.draft_accept != -1) {
    s.draft_accept = o.draft_accept;
    if (s.draft_tokens == 0) s.draft_tokens = 4;
  }
  if (!o.tiers.empty()) {
    Result<std::vector<std::shared_ptr<Tier>>> tiers = MakeTiers(o.tiers);
    if (!tiers.ok()) return fail(tiers.status());
    s.tiers = std::move(*tiers);
  }
  ProgressBar bar(!o.json && isatty(STDOUT_FILENO));
  std::vector<SimulateReport> reports;
  for (FormatPair f : formats) {
    s.formats = f;
    s.progress = bar.For(FormatPairName(f));
    Result<SimulateReport> r = Simulate(s, requests);
    bar.Done();
    if (!r.ok()) return fail(r.status());
    reports.push_back(std::move(*r));
  }

  if (o.json) {
    nlohmann::json out;
    out["workload"] = {{"name", workload_name}, {"requests", requests.size()}, {"seed", o.seed}};
    out["geometry"] = {{"n_layers", s.geometry.n_layers},
                       {"n_kv_heads", s.geometry.n_kv_heads},
                       {"head_dim", s.geometry.head_dim},
                       {"block_size", s.geometry.block_size}};
    out["pool_bytes"] = s.pool_bytes;
    out["admission"] = AdmissionPolicyName(s.admission);
    out["prefix_caching"] = s.prefix_caching;
    out["draft_tokens"] = s.draft_tokens;
    out["draft_accept"] = s.draft_tokens ? s.draft_accept : 0.0;
    nlohmann::json results = nlohmann::json::array();
    for (const SimulateReport& r : reports) results.push_back(ReportJson(r));
    out["results"] = std::move(results);
    fmt::print("{}\n", out.dump(2));
    return 0;
  }
  fmt::print("workload {} ({} requests), geometry L={} KVH={} D={}, pool {:.2f} GiB, admission {}{}\n",
             workload_name, requests.size(), s.geometry.n_layers, s.geometry.n_kv_heads,
             s.geometry.head_dim, o.pool_gib, AdmissionPolicyName(s.admission),
             s.draft_tokens ? fmt::format(", {} drafts/step at p={}", s.draft_tokens, s.draft_accept)
                            : std::string());
  PrintTable(stdout, reports);
  for (const SimulateReport& r : reports) {
    for (const TierStats& t : r.offload.tiers) {
      fmt::print("  {} tier {}: {} blocks ({} tokens) loaded, {} stored, {} dropped, load p50 {:.0f} us p99 {:.0f} us\n",
                 r.formats, t.name, t.hit_blocks, t.hit_tokens, t.stored_blocks, t.dropped_stores,
                 t.load_p50_us, t.load_p99_us);
    }
  }
  return 0;
}

const bool kRegistered = RegisterCommand(
    "simulate", "Replay a serving workload through a real pool and prefix cache, per K/V format",
    [](CLI::App* app) -> Runner {
      auto o = std::make_shared<SimulateCliOptions>();
      app->add_flag("--json", o->json, "Print JSON");
      app->add_option("--pool-gib", o->pool_gib, "K/V pool size in GiB")->capture_default_str();
      app->add_option("--model-geometry", o->geometry,
                      "llama3-8b, llama3-70b, mistral-7b, qwen2-7b or LAYERS,KV_HEADS,HEAD_DIM")
          ->capture_default_str();
      app->add_option("--kv-format", o->formats,
                      "K:V format pair (or one name for both); repeat to compare "
                      "(default: bf16, fp8_e4m3, turbo4, turbo3)");
      app->add_option("--workload", o->workload,
                      "chat, shared-prefix, parallel-sampling, or a PATH.jsonl (docs/workloads.md)")
          ->capture_default_str();
      app->add_option("--requests", o->requests, "Requests to generate")
          ->check(CLI::Range(1u, 1000000u))->capture_default_str();
      app->add_option("--seed", o->seed, "Workload and acceptance seed")->capture_default_str();
      app->add_option("--interarrival", o->interarrival, "Mean decode steps between arrivals")
          ->check(CLI::Range(0.0, 1e6))->capture_default_str();
      app->add_option("--draft-accept", o->draft_accept,
                      "Speculative decoding: acceptance probability per draft (enables 4 drafts/step)");
      app->add_option("--draft-tokens", o->draft_tokens, "Speculative drafts per step")
          ->check(CLI::Range(0u, 64u));
      app->add_option("--admission", o->admission, "prompt (reserve the prompt, preempt) or worst-case")
          ->capture_default_str();
      app->add_flag("--no-prefix-cache", o->no_prefix_cache, "Disable prefix reuse");
      app->add_option("--tiers", o->tiers,
                      "Offload tiers under the prefix cache, in order: "
                      "host:4GiB,disk:PATH:20GiB,redis://127.0.0.1:6379 (docs/tiers.md)");
      app->add_option("--max-running", o->max_running, "Batch limit")
          ->check(CLI::Range(1u, 1000000u))->capture_default_str();
      return [o] { return RunSimulate(*o); };
    });

}  // namespace

int RunServingDemo(std::FILE* out) {
  // The defaults of `kvcache simulate`: llama3-8b geometry, 1 GiB, chat,
  // 300 requests, admission by prompt reservation, prefix caching.
  SimulateOptions s;
  WorkloadOptions w;
  const std::vector<Request> requests = GenerateWorkload(w);
  std::vector<SimulateReport> reports;
  for (const std::string& name : kDefaultFormats) {
    Result<FormatPair> f = ParseFormatPair(name);
    if (!f.ok()) {
      fmt::print(stderr, "demo: {}\n", f.status().ToString());
      return 2;
    }
    s.formats = *f;
    Result<SimulateReport> r = Simulate(s, requests);
    if (!r.ok()) {
      fmt::print(stderr, "demo: simulate {}: {}\n", name, r.status().ToString());
      return 2;
    }
    reports.push_back(std::move(*r));
  }
  fmt::print(out, "Serving simulation: chat workload ({} requests, multi-turn, shared system "
                  "prompts), Llama-3-8B geometry (32 layers, 8 kv heads, head_dim 128), 1 GiB K/V "
                  "pool, prefix caching on\n",
             requests.size());
  PrintTable(out, reports);
  fmt::print(out,
             "(peak/mean: sequences decoding at once; hit%: prompt tokens served from cached "
             "blocks; util%: mean share of blocks in use; appended: K/V rows written)\n");
  return 0;
}

}  // namespace kvcache::tools
