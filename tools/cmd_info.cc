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
// v_format, bytes_per_token, bits_per_value averaged over K and V; or error).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include <sstream>

#include "kvcache/format.h"
#include "kvcache/geometry.h"
#include "kvcache/simd.h"
#include "tools/command.h"
#include "tools/kv_flags.h"

namespace kvcache::tools {
namespace {

struct InfoOptions {
  bool json = false;
  uint32_t layers = 32, kv_heads = 8, head_dim = 128;
  uint64_t n_values = 4096;
  std::string pairs = "bf16:turbo4,turbo8:turbo4,bf16:q4_0,q8_0:q4_0";
};

int RunInfo(const InfoOptions& o) {
  auto geometry = Geometry::Create({o.layers, o.kv_heads, o.head_dim, 16});
  if (!geometry.ok()) {
    fmt::print(stderr, "kvcache info: {}\n", geometry.status().ToString());
    return 2;
  }
  nlohmann::json out;
  out["simd_target"] = SimdTarget();
  out["simd_targets"] = SupportedSimdTargets();
  out["supported_simd_targets"] = out["simd_targets"];
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
  fmt::print("SIMD target: {} (this CPU runs: {})\ngeometry: {} layers, {} kv heads, head_dim {}\n\n",
             out["simd_target"].get<std::string>(),
             fmt::join(out["simd_targets"].get<std::vector<std::string>>(), ", "), o.layers,
             o.kv_heads, o.head_dim);
  fmt::print("{:<10} {:>10} {:>10} {:>22} {:>18}\n", "format", "bits/val", "row bytes", "bytes/token (K or V)",
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
    },
    RunInfo);

}  // namespace
}  // namespace kvcache::tools
