// `kvcache bench capacity`: how many context-long sequences a KV budget
// holds, per K/V format and layer layout, admitted by the engine's KV
// manager and then really filled.
//
// For each format and layout, an engine::KvManager gets --budget-mib of
// pools (no prefix cache) and admits sequences with the engine's
// reservation (a --context-token prompt: the context plus one block, capped
// at the context, each layer group's worst case) until CanAdmit says no:
// that count is "admitted". Layouts: "hybrid" is the model as it is (a
// sliding-window model's window layers in their own pool, holding their
// windows only); "full" the same layers all attending to every position
// (AttentionShape::windows cleared), what a cache without per-group pools
// holds. A hybrid layout of a model without window layers, and per-kind
// formats (global=...,local=...) in the full layout, are skipped.
//
// Then (unless --no-fill) every admitted sequence (the first
// --sequences-max, if given) is filled to the context: chunks of the
// manager's max_chunk_tokens through Extend and Store of every layer, K and
// V drawn from a normal distribution per sequence (a few random chunks per
// sequence, reused across its positions and layers), no attention; the
// sequences are independent and filled on --threads threads. Read back:
// each pool's used and reserved blocks, the bytes the used blocks are,
// whether any append failed (a held reservation must never fail), whether
// the used blocks are what `kvcache info` counts per sequence at that
// context (HybridKv::BlocksAt, within one block per group per sequence),
// and the process's resident memory (/proc/self/statm) before the pools
// were made and after the fill.
//
// The model: --model (GGUF or llama2.c checkpoint; only its attention shape
// is used), or a synthetic shape (--layers, --kv-heads, --head-dim, and
// --window W with every --global-every'th layer attending to every
// position).
#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/kv_manager.h"
#include "kvcache/format.h"
#include "kvcache/geometry.h"
#include "kvcache/hybrid.h"
#include "kvcache/pool.h"
#include "kvcache/simd.h"
#include "model/decoder/decoder.h"
#include "model/decoder/gguf_model.h"
#include "model/io/checkpoint.h"
#include "model/kv/hybrid_kv.h"
#include "model/kv/kv_factory.h"
#include "tools/bench_util.h"
#include "tools/command.h"
#include "tools/json_result.h"

namespace kvcache::tools {
namespace {

struct BenchCapacityOptions {
  std::string model_path;
  // Synthetic shape (without --model).
  uint32_t layers = 6, kv_heads = 1, head_dim = 256, window = 0, global_every = 6;
  uint32_t context = 32768;
  double budget_mib = 2048;
  std::string kv_formats = "bf16;turbo4+s4+r120;turbo3i+s4+r120;turbo2i+s4+r120;global=turbo4+s4+r120,local=q8_0";
  std::string layouts = "hybrid";
  bool full_only = false;
  bool fill = true;
  uint32_t sequences_max = 0;  // 0: fill every admitted sequence
  uint32_t threads = 2;
  uint32_t block_size = 16;
  uint32_t max_chunk = 256;     // KvManagerOptions::max_chunk_tokens (the engine's step budget)
  uint32_t window_slack = 512;  // KvManagerOptions::window_slack_tokens
  uint64_t seed = 1;
  bool json = false;
};

constexpr double kMiB = 1048576.0;

// Resident bytes of this process (/proc/self/statm's second field); 0 where
// it cannot be read.
uint64_t ResidentBytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long long size = 0, resident = 0;
  const int n = std::fscanf(f, "%llu %llu", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE)) : 0;
}

// The attention shape of --model (at --context positions), or the synthetic one.
Result<model::AttentionShape> ShapeOf(const BenchCapacityOptions& o) {
  if (o.model_path.empty()) {
    if (o.layers == 0 || o.kv_heads == 0 || o.head_dim == 0) {
      return Status::InvalidArgument("bench capacity: --layers, --kv-heads and --head-dim must be > 0");
    }
    model::AttentionShape s{o.layers, o.kv_heads, o.kv_heads, o.head_dim, o.context, {}};
    if (o.window > 0) {
      if (o.global_every == 0) return Status::InvalidArgument("bench capacity: --global-every must be > 0");
      s.windows.assign(o.layers, o.window);
      for (uint32_t l = 0; l < o.layers; ++l) {
        if ((l + 1) % o.global_every == 0) s.windows[l] = 0;
      }
    }
    return s;
  }
  // Only the shape is kept: the weights go with the model at the end of
  // this scope, before any resident-memory reading.
  auto load = [&o]() -> Result<model::Model> {
    if (!model::IsGgufFile(o.model_path)) return model::LoadModel(o.model_path);
    model::GgufLoadOptions options;
    options.max_seq_len = o.context;
    return model::LoadGgufModel(o.model_path, options);
  };
  Result<model::Model> m = load();
  if (!m.ok()) return m.status();
  if (m->config().max_seq_len < o.context) {
    return Status::InvalidArgument("bench capacity: --context " + std::to_string(o.context) + " exceeds the model's " +
                                   std::to_string(m->config().max_seq_len));
  }
  model::AttentionShape s = model::Decoder(*m, 1).attention_shape();
  s.max_seq_len = o.context;
  return s;
}

// One layer group of a case: its layers, formats, block size in bytes, and
// the blocks one sequence holds at the context (what `kvcache info` counts).
struct GroupInfo {
  std::string name;
  uint32_t layers = 0;
  FormatPair formats;
  uint64_t block_bytes = 0;
  uint64_t blocks_at_context = 0;
};

// The groups a manager with these options makes, in its GroupMetrics order,
// computed beside it (the manager does not say its block bytes).
Result<std::vector<GroupInfo>> GroupsOf(const model::AttentionShape& shape, const engine::KvManagerOptions& k) {
  std::vector<GroupInfo> out;
  if (!shape.has_windows()) {
    KV_ASSIGN_OR_RETURN(Geometry g, Geometry::Create({shape.n_layers, shape.n_kv_heads, shape.head_dim, k.block_size}));
    out.push_back({"all", shape.n_layers, k.formats, BlockPool::BlockBytes(g, k.formats),
                   (uint64_t{shape.max_seq_len} + k.block_size - 1) / k.block_size});
    return out;
  }
  model::HybridKvOptions h;
  h.formats = k.formats;
  h.bounded_formats = k.local_formats;
  h.layout = CacheLayout::kPaged;
  h.block_size = k.block_size;
  h.window = k.window;
  h.max_chunk_tokens = k.max_chunk_tokens;
  h.window_slack_tokens = k.window_slack_tokens;
  KV_ASSIGN_OR_RETURN(auto hybrid, model::HybridKv::MakeModel(shape, h));
  for (int g = 0; g < 2; ++g) {
    out.push_back({g == HybridModel::kFullGroup ? "global" : "local", hybrid->group_size(g), hybrid->group_formats(g),
                   BlockPool::BlockBytes(hybrid->group_geometry(g), hybrid->group_formats(g)),
                   model::HybridKv::BlocksAt(*hybrid, g, shape.max_seq_len)});
  }
  return out;
}

double BitsPerValueOf(FormatPair f, uint32_t head_dim) {
  return (BitsPerValue(f.k, head_dim) + BitsPerValue(f.v, head_dim)) / 2;
}

// Fills `seq` to `context` positions: chunks of `chunk` tokens, Extend then
// Store of every layer; K and V come from kRandomChunks chunks of normal
// values drawn with `seed`.
Status FillSequence(model::KvBackend& seq, const model::AttentionShape& shape, uint32_t context, uint32_t chunk,
                    uint64_t seed) {
  constexpr uint32_t kRandomChunks = 4;
  const size_t chunk_values = size_t{chunk} * shape.kv_dim();
  std::vector<float> k(kRandomChunks * chunk_values), v(kRandomChunks * chunk_values);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : k) x = normal(rng);
  for (float& x : v) x = normal(rng);
  uint32_t index = 0;
  for (uint32_t pos = 0; pos < context; pos += chunk, ++index) {
    const uint32_t n = std::min(chunk, context - pos);
    KV_RETURN_IF_ERROR(seq.Extend(n));
    const size_t values = size_t{n} * shape.kv_dim();
    for (uint32_t l = 0; l < shape.n_layers; ++l) {
      const size_t at = ((index + l) % kRandomChunks) * chunk_values;
      const size_t at_v = ((index + l + 1) % kRandomChunks) * chunk_values;
      KV_RETURN_IF_ERROR(seq.Store(l, std::span<const float>(k).subspan(at, values),
                                   std::span<const float>(v).subspan(at_v, values)));
    }
  }
  return Status::Ok();
}

// One format in one layout.
Result<nlohmann::json> RunCase(const model::AttentionShape& model_shape, const std::string& spec,
                               const std::string& layout, const BenchCapacityOptions& o) {
  nlohmann::json r;
  r["kv_format"] = spec;
  r["layout"] = layout;
  model::AttentionShape shape = model_shape;
  if (layout == "full") {
    shape.windows.clear();
  } else if (!shape.has_windows()) {
    r["skipped"] = "the model has no sliding-window layers: the hybrid layout is the full one";
    return r;
  }
  KV_ASSIGN_OR_RETURN(model::KvBackendOptions kv, model::ParseKvBackendOptions(spec, "paged", "cache", o.block_size));
  if (kv.local_formats && !shape.has_windows()) {
    r["skipped"] = "per-kind formats need sliding-window layers";
    return r;
  }
  engine::KvManagerOptions k;
  k.formats = kv.formats;
  k.local_formats = kv.local_formats;
  k.window = kv.window;
  k.block_size = o.block_size;
  k.pool_bytes = static_cast<uint64_t>(o.budget_mib * kMiB);
  k.prefix_cache = false;
  k.rows = true;
  k.max_chunk_tokens = o.max_chunk;
  k.window_slack_tokens = o.window_slack;
  k.pool_balance_tokens = 0;  // the pools balanced for context-long sequences: what is counted here
  KV_ASSIGN_OR_RETURN(std::vector<GroupInfo> groups, GroupsOf(shape, k));

  const uint64_t rss_before = ResidentBytes();
  KV_ASSIGN_OR_RETURN(std::unique_ptr<engine::KvManager> manager, engine::KvManager::Create(shape, nullptr, k));
  // A context-long prompt: the engine's reservation for it is every
  // position of the context in each group (the window group's worst case).
  const std::vector<int32_t> prompt(o.context, 0);
  const engine::KvDemand demand = manager->AdmissionDemand(prompt.size());
  std::vector<std::unique_ptr<engine::KvSequence>> seqs;
  while (manager->CanAdmit(prompt)) {
    KV_ASSIGN_OR_RETURN(std::unique_ptr<engine::KvSequence> seq, manager->Admit(prompt));
    seqs.push_back(std::move(seq));
  }
  const bool refused = manager->Admit(prompt).status().IsPoolExhausted();
  const std::vector<engine::KvGroupMetrics> admitted_metrics = manager->GroupMetrics();
  // Admitted, computed from the pools' sizes: the fewest whole demands any
  // group's pool holds.
  uint64_t expected = UINT64_MAX;
  for (size_t g = 0; g < admitted_metrics.size(); ++g) {
    expected = std::min(expected, admitted_metrics[g].blocks_total / std::max<uint64_t>(demand.blocks[g], 1));
  }

  const uint32_t filled =
      o.fill ? static_cast<uint32_t>(o.sequences_max > 0 ? std::min<size_t>(o.sequences_max, seqs.size()) : seqs.size())
             : 0;
  std::atomic<uint32_t> next{0}, failures{0};
  std::mutex error_mu;
  Status first_error;
  const auto t0 = std::chrono::steady_clock::now();
  auto worker = [&] {
    for (uint32_t i = next++; i < filled; i = next++) {
      const Status s = FillSequence(*seqs[i], shape, o.context, o.max_chunk, o.seed * 1000003 + i);
      if (!s.ok()) {
        ++failures;
        std::lock_guard<std::mutex> lock(error_mu);
        if (first_error.ok()) first_error = s;
      }
    }
  };
  std::vector<std::thread> pool;
  for (uint32_t t = 1; t < std::min(o.threads, std::max(filled, 1u)); ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
  const double fill_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const uint64_t rss_after = ResidentBytes();
  const std::vector<engine::KvGroupMetrics> m = manager->GroupMetrics();
  const Status invariants = manager->CheckInvariants();

  bool blocks_match = true;
  uint64_t at_context_bytes = 0, demand_bytes = 0, used_bytes = 0;
  nlohmann::json gj = nlohmann::json::array();
  for (size_t g = 0; g < groups.size() && g < m.size(); ++g) {
    const GroupInfo& info = groups[g];
    const uint64_t want = uint64_t{filled} * info.blocks_at_context;
    const uint64_t diff = m[g].blocks_used > want ? m[g].blocks_used - want : want - m[g].blocks_used;
    const bool match = diff <= filled;
    blocks_match = blocks_match && match;
    at_context_bytes += info.blocks_at_context * info.block_bytes;
    demand_bytes += demand.blocks[g] * info.block_bytes;
    used_bytes += m[g].blocks_used * info.block_bytes;
    nlohmann::json j;
    j["group"] = info.name;
    j["kind"] = std::string(engine::KvGroupKindName(m[g].kind));
    j["layers"] = info.layers;
    j["formats"] = FormatPairName(info.formats);
    j["bits_per_value"] = BitsPerValueOf(info.formats, shape.head_dim);
    j["block_bytes"] = info.block_bytes;
    j["pool_blocks"] = m[g].blocks_total;
    j["admission_blocks_per_sequence"] = demand.blocks[g];
    j["blocks_per_sequence_at_context"] = info.blocks_at_context;
    j["mib_per_sequence"] = info.blocks_at_context * info.block_bytes / kMiB;
    j["blocks_used"] = m[g].blocks_used;
    j["bytes_used"] = m[g].blocks_used * info.block_bytes;
    j["blocks_reserved"] = m[g].blocks_reserved;
    j["blocks_free"] = m[g].blocks_free;
    j["blocks_used_per_filled_sequence"] = filled > 0 ? double(m[g].blocks_used) / filled : 0.0;
    j["blocks_match"] = match;
    gj.push_back(std::move(j));
  }
  // The precision window's bf16 rows (K and V of the full layers, outside
  // the pools), as `kvcache info` counts them.
  const uint32_t full_layers = shape.has_windows() ? groups[0].layers : shape.n_layers;
  const uint64_t window_rows = std::min<uint64_t>(uint64_t{kv.window.sinks} + kv.window.recent, o.context);
  const uint64_t window_bytes = window_rows * 2 * 2 * shape.kv_dim() * full_layers;

  r["groups"] = std::move(gj);
  r["admitted"] = seqs.size();
  r["admitted_expected"] = expected;
  r["admitted_matches"] = seqs.size() == expected;
  r["admit_refused_after"] = refused;
  r["mib_per_sequence"] = at_context_bytes / kMiB;
  r["admission_mib_per_sequence"] = demand_bytes / kMiB;
  r["precision_window_bytes_per_sequence"] = window_bytes;
  r["filled"] = filled;
  r["fill_seconds"] = fill_s;
  r["append_failures"] = failures.load();
  if (!first_error.ok()) r["first_error"] = first_error.ToString();
  r["blocks_match"] = blocks_match;
  r["invariants_ok"] = invariants.ok();
  if (!invariants.ok()) r["invariants_error"] = invariants.ToString();
  r["used_mib"] = used_bytes / kMiB;
  r["rss_before_mib"] = rss_before / kMiB;
  r["rss_after_fill_mib"] = rss_after / kMiB;
  r["rss_growth_mib"] = (double(rss_after) - double(rss_before)) / kMiB;
  r["rss_growth_per_filled_mib"] = filled > 0 ? (double(rss_after) - double(rss_before)) / kMiB / filled : 0.0;
  r["fill_ok"] = failures.load() == 0 && blocks_match && invariants.ok();
  // Every check: the admissions stopped where the pools' sizes say, and the fill held.
  r["ok"] = r["fill_ok"].get<bool>() && seqs.size() == expected && refused;
  return r;
}

Result<nlohmann::json> RunBench(const BenchCapacityOptions& o) {
  if (o.context == 0 || o.budget_mib <= 0 || o.block_size == 0 || o.max_chunk == 0 || o.threads == 0) {
    return Status::InvalidArgument(
        "bench capacity: --context, --budget-mib, --block-size, --max-chunk and --threads must be > 0");
  }
  KV_ASSIGN_OR_RETURN(model::AttentionShape shape, ShapeOf(o));
  const std::vector<std::string> specs = Split(o.kv_formats, ';');
  const std::vector<std::string> layouts = o.full_only ? std::vector<std::string>{"full"} : Split(o.layouts, ',');
  if (specs.empty()) return Status::InvalidArgument("bench capacity: --kv-formats names no format");
  if (layouts.empty()) return Status::InvalidArgument("bench capacity: --layouts names no layout");
  for (const std::string& l : layouts) {
    if (l != "hybrid" && l != "full") {
      return Status::InvalidArgument("bench capacity: --layouts: '" + l + "' is not hybrid or full");
    }
  }
  for (const std::string& spec : specs) {  // every spec checked before the first case runs
    KV_RETURN_IF_ERROR(model::ParseKvBackendOptions(spec, "paged", "cache", o.block_size).status());
  }
  uint32_t window_layers = 0, window = 0;
  for (uint32_t w : shape.windows) {
    window_layers += w != 0 ? 1 : 0;
    window = std::max(window, w);
  }
  nlohmann::json out = {
      {"model", o.model_path.empty() ? "synthetic" : o.model_path},
      {"shape",
       {{"layers", shape.n_layers},
        {"kv_heads", shape.n_kv_heads},
        {"head_dim", shape.head_dim},
        {"window_layers", window_layers},
        {"window", window}}},
      {"context", o.context},
      {"budget_mib", o.budget_mib},
      {"block_size", o.block_size},
      {"max_chunk_tokens", o.max_chunk},
      {"window_slack_tokens", o.window_slack},
      {"threads", o.threads},
      {"fill", o.fill},
      {"simd_target", SimdTarget()},
  };
  out["results"] = nlohmann::json::array();
  for (const std::string& layout : layouts) {
    for (const std::string& spec : specs) {
      KV_ASSIGN_OR_RETURN(nlohmann::json r, RunCase(shape, spec, layout, o));
      out["results"].push_back(std::move(r));
    }
  }
  return out;
}

void PrintText(const BenchCapacityOptions& o, const nlohmann::json& j) {
  const auto& s = j["shape"];
  fmt::print("{}: {} layers ({} with a window of {}), {} kv heads of {}; {} positions per sequence, {} MiB, blocks of "
             "{}, simd {}\n",
             j["model"].get<std::string>(), s["layers"].get<uint32_t>(), s["window_layers"].get<uint32_t>(),
             s["window"].get<uint32_t>(), s["kv_heads"].get<uint32_t>(), s["head_dim"].get<uint32_t>(), o.context,
             o.budget_mib, o.block_size, j["simd_target"].get<std::string>());
  fmt::print("{:<40} {:<6} {:>9} {:>9} {:>8} {:>7} {:>10} {:>9} {:>6}\n", "kv", "layout", "MiB/seq", "admit MiB",
             "admitted", "filled", "RSS +MiB", "fill s", "ok");
  for (const auto& r : j["results"]) {
    if (r.contains("skipped")) {
      fmt::print("{:<40} {:<6} skipped: {}\n", r["kv_format"].get<std::string>(), r["layout"].get<std::string>(),
                 r["skipped"].get<std::string>());
      continue;
    }
    fmt::print("{:<40} {:<6} {:>9.2f} {:>9.2f} {:>8} {:>7} {:>10.1f} {:>9.1f} {:>6}\n",
               r["kv_format"].get<std::string>(), r["layout"].get<std::string>(), r["mib_per_sequence"].get<double>(),
               r["admission_mib_per_sequence"].get<double>(), r["admitted"].get<uint64_t>(),
               r["filled"].get<uint32_t>(), r["rss_growth_mib"].get<double>(), r["fill_seconds"].get<double>(),
               r["ok"].get<bool>() ? "yes" : "NO");
    for (const auto& g : r["groups"]) {
      fmt::print("    {:<7} {:>2} layers {:<18} {:>6.3f} bits  {:>6} blocks/seq at context ({:>6} admitted)  "
                 "used {} blocks ({:.1f} per filled sequence)\n",
                 g["group"].get<std::string>(), g["layers"].get<uint32_t>(), g["formats"].get<std::string>(),
                 g["bits_per_value"].get<double>(), g["blocks_per_sequence_at_context"].get<uint64_t>(),
                 g["admission_blocks_per_sequence"].get<uint64_t>(), g["blocks_used"].get<uint64_t>(),
                 g["blocks_used_per_filled_sequence"].get<double>());
    }
    if (r.contains("first_error")) fmt::print("    first failed append: {}\n", r["first_error"].get<std::string>());
  }
}

// Prints the result; exit 1 when a check failed: an append (a held
// reservation must never fail), the pools against the per-sequence counts,
// or the admissions against the pools' sizes.
int RunCapacity(const BenchCapacityOptions& o) {
  const Result<nlohmann::json> result = RunBench(o);
  const int rc = PrintResult("bench capacity", result, o.json,
                             [&o](const nlohmann::json& j) { PrintText(o, j); });
  if (rc != 0) return rc;
  for (const auto& r : (*result)["results"]) {
    if (!r.contains("skipped") && !r["ok"].get<bool>()) return 1;
  }
  return 0;
}

const bool kRegistered = RegisterOptionsCommand<BenchCapacityOptions>(
    "bench capacity",
    "How many context-long sequences a KV budget admits per format and layout, then filled for real",
    [](CLI::App* app, BenchCapacityOptions& o) {
      // Every option but --model shows its default.
      auto option = [app](const char* name, auto& value, const char* help) {
        app->add_option(name, value, help)->capture_default_str();
      };
      app->add_option("--model", o.model_path, "GGUF file or llama2.c checkpoint (its attention shape only)");
      AddGeometryFlags(app, o.layers, o.kv_heads, o.head_dim);
      option("--window", o.window, "Without --model: the sliding window of the window layers (0: none)");
      option("--global-every", o.global_every,
             "Without --model, with --window: every Nth layer attends to every position");
      option("--context", o.context, "Positions per sequence");
      option("--budget-mib", o.budget_mib, "The pools' bytes, all groups together, MiB");
      option("--kv-formats", o.kv_formats,
             "K:V formats, ';'-separated; each a format (with +sN+rN) or global=SPEC,local=SPEC");
      option("--layouts", o.layouts,
             "hybrid (the model's window layers in their own pool) and/or full (every layer whole)");
      app->add_flag("--full-only", o.full_only, "Only the full layout (--layouts full)");
      app->add_flag("--fill,!--no-fill", o.fill, "Fill every admitted sequence to the context (the default)");
      option("--sequences-max", o.sequences_max, "Fill at most this many sequences (0: all)");
      option("--threads", o.threads, "Threads filling sequences");
      option("--block-size", o.block_size, "Paged block size in tokens");
      option("--max-chunk", o.max_chunk, "Tokens per pass (the manager's max_chunk_tokens)");
      option("--window-slack", o.window_slack, "The manager's window_slack_tokens");
      option("--seed", o.seed, "Seed of the K/V values");
      app->add_flag("--json", o.json, "Print JSON");
    },
    RunCapacity);

}  // namespace
}  // namespace kvcache::tools
