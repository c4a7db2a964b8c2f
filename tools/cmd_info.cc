// `kvcache info`: formats, their sizes for a geometry, and the SIMD target.
//
// --json prints one object: simd_target (what kernels dispatch to now, after
// any --simd-target), simd_targets (every compiled target this CPU runs, best
// first; supported_simd_targets is the same list under its older name), geometry,
// n_values, "formats" (per format: name, group_size, rotated, supported, and
// when supported bits_per_value, row_bytes, bytes_for_n_values (or null when
// n_values is not a multiple of head_dim), bytes_per_token_per_side (one side
// of one token over all layers and kv heads) and bytes_per_token (K and V in
// this format); otherwise error) and "pairs" (per K:V pair: k_format,
// v_format, bytes_per_token, bits_per_value averaged over K and V; or error)
// and "defaults" (what `serve` and `generate` run here without flags:
// kv_format, matmul (the products `--matmul auto` picks on this CPU) and
// matmul_why). With --model, the model's memory per sequence and the same
// "defaults".
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include <sstream>

#include "kvcache/format.h"
#include "kvcache/geometry.h"
#include "kvcache/pool.h"
#include "kvcache/simd.h"
#include "model/decoder/decoder.h"
#include "model/decoder/gguf_model.h"
#include "model/kv/hybrid_kv.h"
#include "model/kv/kv_factory.h"
#include "tools/command.h"
#include "tools/kv_flags.h"

namespace kvcache::tools {
namespace {

// What `serve` and `generate` run on this CPU without flags.
nlohmann::json DefaultsJson() {
  const Result<MatMulPick> pick = PickMatMul(kDefaultMatMul);  // "auto" always parses
  return {{"kv_format", kDefaultKvFormat}, {"matmul", pick->name()}, {"matmul_why", pick->why}};
}

// "serve / generate defaults on this CPU: kv bf16, products bf16 (auto: ...)".
void PrintDefaults() {
  const Result<MatMulPick> pick = PickMatMul(kDefaultMatMul);
  fmt::print("serve / generate defaults on this CPU: {}\n", ChoiceText(kDefaultKvFormat, true, *pick));
}

struct InfoOptions {
  bool json = false;
  uint32_t layers = 32, kv_heads = 8, head_dim = 128;
  uint64_t n_values = 4096;
  std::string pairs = "bf16:turbo4,turbo8:turbo4,bf16:q4_0,q8_0:q4_0";
  // A model's memory per sequence (--model): its layer groups at --context
  // positions in --kv-format, paged in blocks of --block-size.
  std::string model_path, kv_format = kDefaultKvFormat;
  uint32_t context = 0, block_size = 16, max_chunk = 512;
};

// One sequence of a model at o.context positions, per layer group: the
// blocks the paged pool holds at most and their bytes, beside a cache that
// keeps every position of every layer ("full-only").
Result<nlohmann::json> ModelMemory(const InfoOptions& o) {
  model::GgufLoadOptions load;
  load.max_seq_len = o.context;
  KV_ASSIGN_OR_RETURN(model::Model m, model::LoadGgufModel(o.model_path, load));
  model::Decoder decoder(m);
  const model::AttentionShape shape = decoder.attention_shape();
  const uint32_t context = shape.max_seq_len;
  KV_ASSIGN_OR_RETURN(model::KvBackendOptions kv,
                      model::ParseKvBackendOptions(o.kv_format, "paged", "cache", o.block_size));
  model::HybridKvOptions h;
  h.formats = kv.formats;
  h.bounded_formats = kv.local_formats;
  h.block_size = o.block_size;
  h.max_chunk_tokens = o.max_chunk;
  KV_ASSIGN_OR_RETURN(auto hybrid, model::HybridKv::MakeModel(shape, h));
  nlohmann::json j;
  j["model"] = o.model_path;
  j["family"] = model::ModelFamilyName(m.config().family);
  j["context"] = context;
  j["kv_format"] = o.kv_format;
  j["block_size"] = o.block_size;
  j["defaults"] = DefaultsJson();
  nlohmann::json groups = nlohmann::json::array();
  uint64_t total = 0;
  for (int g = 0; g < 2; ++g) {
    if (hybrid->group_size(g) == 0) continue;
    const uint64_t blocks = model::HybridKv::BlocksAt(*hybrid, g, context);
    const uint64_t bytes = blocks * BlockPool::BlockBytes(hybrid->group_geometry(g), hybrid->group_formats(g));
    nlohmann::json gj;
    gj["group"] = g == HybridModel::kFullGroup ? "global" : "local";
    gj["layers"] = hybrid->group_size(g);
    gj["formats"] = FormatPairName(hybrid->group_formats(g));
    gj["blocks"] = blocks;
    gj["most_blocks"] = model::HybridKv::BlocksPerSequence(*hybrid, g, context);
    gj["bytes"] = bytes;
    total += bytes;
    groups.push_back(std::move(gj));
  }
  // The precision window's bf16 rows beside the full layers' (K and V).
  const uint64_t window_rows = std::min<uint64_t>(kv.window.sinks + kv.window.recent, context);
  const uint64_t window_bytes = window_rows * 2 * 2 * shape.kv_dim() * hybrid->group_size(HybridModel::kFullGroup);
  j["groups"] = std::move(groups);
  j["precision_window_bytes"] = window_bytes;
  j["bytes_per_sequence"] = total + window_bytes;
  // Every layer keeping every position in the full group's format.
  KV_ASSIGN_OR_RETURN(Geometry all, Geometry::Create({shape.n_layers, shape.n_kv_heads, shape.head_dim, o.block_size}));
  const uint64_t full_blocks = (uint64_t{context} + o.block_size - 1) / o.block_size;
  j["full_only_bytes_per_sequence"] = full_blocks * BlockPool::BlockBytes(all, kv.formats) + window_bytes * shape.n_layers /
                                      std::max(1u, hybrid->group_size(HybridModel::kFullGroup));
  return j;
}

int RunModelMemory(const InfoOptions& o) {
  auto mem = ModelMemory(o);
  if (!mem.ok()) {
    fmt::print(stderr, "kvcache info: {}\n", mem.status().ToString());
    return 2;
  }
  const nlohmann::json& j = *mem;
  if (o.json) {
    fmt::print("{}\n", j.dump(2));
    return 0;
  }
  fmt::print("{} ({}), {} positions, kv {}, blocks of {} tokens: one sequence holds\n",
             o.model_path, j["family"].get<std::string>(), j["context"].get<uint32_t>(), o.kv_format, o.block_size);
  for (const auto& g : j["groups"]) {
    fmt::print("  {:<7} {:>2} layers {:<12} {:>7} blocks {:>14} bytes ({:.1f} MiB; at most {} blocks on the way)\n",
               g["group"].get<std::string>(), g["layers"].get<uint32_t>(), g["formats"].get<std::string>(),
               g["blocks"].get<uint64_t>(), g["bytes"].get<uint64_t>(), g["bytes"].get<uint64_t>() / 1048576.0,
               g["most_blocks"].get<uint64_t>());
  }
  if (j["precision_window_bytes"].get<uint64_t>() != 0) {
    fmt::print("  precision window rows (bf16): {} bytes\n", j["precision_window_bytes"].get<uint64_t>());
  }
  fmt::print("  total {} bytes ({:.1f} MiB); every layer keeping every position: {} bytes ({:.1f} MiB)\n",
             j["bytes_per_sequence"].get<uint64_t>(), j["bytes_per_sequence"].get<uint64_t>() / 1048576.0,
             j["full_only_bytes_per_sequence"].get<uint64_t>(),
             j["full_only_bytes_per_sequence"].get<uint64_t>() / 1048576.0);
  PrintDefaults();
  return 0;
}

int RunInfo(const InfoOptions& o) {
  if (!o.model_path.empty()) return RunModelMemory(o);
  auto geometry = Geometry::Create({o.layers, o.kv_heads, o.head_dim, 16});
  if (!geometry.ok()) {
    fmt::print(stderr, "kvcache info: {}\n", geometry.status().ToString());
    return 2;
  }
  nlohmann::json out;
  out["simd_target"] = SimdTarget();
  out["simd_targets"] = SupportedSimdTargets();
  out["supported_simd_targets"] = out["simd_targets"];
  out["defaults"] = DefaultsJson();
  out["geometry"] = {{"n_layers", o.layers}, {"n_kv_heads", o.kv_heads}, {"head_dim", o.head_dim}};
  nlohmann::json formats = nlohmann::json::array();
  for (Format f : kAllFormats) {
    nlohmann::json j;
    j["name"] = FormatName(f);
    j["group_size"] = GroupSize(f);
    j["rotated"] = IsRotated(f);
    const Status ok = CheckHeadDim(f, o.head_dim);
    j["supported"] = ok.ok();
    if (ok.ok()) {
      j["bits_per_value"] = BitsPerValue(f, o.head_dim);
      j["row_bytes"] = RowBytes(f, o.head_dim);
      // One side (K or V) of one token across all layers and kv heads.
      if (o.n_values % o.head_dim == 0) {
        j["bytes_for_n_values"] = BytesFor(f, o.head_dim, o.n_values);
      } else {
        j["bytes_for_n_values"] = nullptr;
      }
      j["bytes_per_token_per_side"] =
          static_cast<uint64_t>(RowBytes(f, o.head_dim)) * o.kv_heads * o.layers;
      j["bytes_per_token"] = 2 * j["bytes_per_token_per_side"].get<uint64_t>();
    } else {
      j["error"] = ok.message();
    }
    formats.push_back(std::move(j));
  }
  out["formats"] = std::move(formats);
  out["n_values"] = o.n_values;
  nlohmann::json pairs = nlohmann::json::array();
  std::stringstream pair_list(o.pairs);
  std::string item;
  while (std::getline(pair_list, item, ',')) {
    if (item.empty()) continue;
    auto pair = ParseFormatPair(item);
    if (!pair.ok()) {
      fmt::print(stderr, "kvcache info: --pairs: '{}': {}\n", item, pair.status().ToString());
      return 2;
    }
    nlohmann::json j;
    j["k_format"] = FormatName(pair->k);
    j["v_format"] = FormatName(pair->v);
    Status ok = CheckHeadDim(pair->k, o.head_dim);
    if (ok.ok()) ok = CheckHeadDim(pair->v, o.head_dim);
    if (ok.ok()) {
      const uint64_t row = RowBytes(pair->k, o.head_dim) + RowBytes(pair->v, o.head_dim);
      j["bytes_per_token"] = row * o.kv_heads * o.layers;
      j["bits_per_value"] = (BitsPerValue(pair->k, o.head_dim) + BitsPerValue(pair->v, o.head_dim)) / 2;
    } else {
      j["error"] = ok.message();
    }
    pairs.push_back(std::move(j));
  }
  out["pairs"] = std::move(pairs);
  if (o.json) {
    fmt::print("{}\n", out.dump(2));
    return 0;
  }
  fmt::print("SIMD target: {} (this CPU runs: {})\ngeometry: {} layers, {} kv heads, head_dim {}\n",
             out["simd_target"].get<std::string>(),
             fmt::join(out["simd_targets"].get<std::vector<std::string>>(), ", "), o.layers,
             o.kv_heads, o.head_dim);
  PrintDefaults();
  fmt::print("\n{:<10} {:>10} {:>10} {:>22} {:>18}\n", "format", "bits/val", "row bytes", "bytes/token (K or V)",
             "bytes/token (K+V)");
  for (const auto& j : out["formats"]) {
    if (j["supported"].get<bool>()) {
      fmt::print("{:<10} {:>10.3f} {:>10} {:>22} {:>18}\n", j["name"].get<std::string>(),
                 j["bits_per_value"].get<double>(), j["row_bytes"].get<size_t>(),
                 j["bytes_per_token_per_side"].get<uint64_t>(), j["bytes_per_token"].get<uint64_t>());
    } else {
      fmt::print("{:<10} {}\n", j["name"].get<std::string>(), j["error"].get<std::string>());
    }
  }
  if (!out["pairs"].empty()) {
    fmt::print("\n{:<20} {:>10} {:>18}\n", "K:V", "bits/val", "bytes/token (K+V)");
    for (const auto& j : out["pairs"]) {
      const std::string name = j["k_format"].get<std::string>() + ":" + j["v_format"].get<std::string>();
      if (j.contains("error")) {
        fmt::print("{:<20} {}\n", name, j["error"].get<std::string>());
      } else {
        fmt::print("{:<20} {:>10.3f} {:>18}\n", name, j["bits_per_value"].get<double>(),
                   j["bytes_per_token"].get<uint64_t>());
      }
    }
  }
  return 0;
}

const bool kRegistered = RegisterOptionsCommand<InfoOptions>(
    "info", "The formats and their bytes per token for a geometry, and the SIMD targets this CPU runs",
    [](CLI::App* app, InfoOptions& o) {
      app->add_flag("--json", o.json, "Print JSON");
      AddGeometryFlags(app, o.layers, o.kv_heads, o.head_dim);
      app->add_option("--n-values", o.n_values, "Report bytes for this many values")->capture_default_str();
      app->add_option("--pairs", o.pairs, "Comma-separated K:V pairs to size per token")->capture_default_str();
      app->add_option("--model", o.model_path,
                      "GGUF model: print one sequence's bytes per layer group (global / sliding-window) at --context");
      app->add_option("--context", o.context, "Positions per sequence (0 = the model's context)")->capture_default_str();
      app->add_option("--kv-format", o.kv_format,
                      "K:V format of every layer, or global=SPEC,local=SPEC (with --model)")
          ->capture_default_str();
      app->add_option("--block-size", o.block_size, "Paged block size in tokens (with --model)")->capture_default_str();
      app->add_option("--max-chunk", o.max_chunk,
                      "Largest prefill chunk a window layer must serve exactly (its lookback; with --model)")
          ->capture_default_str();
    },
    RunInfo);

}  // namespace
}  // namespace kvcache::tools
