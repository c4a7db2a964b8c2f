// `kvcache info`: formats, their sizes for a geometry, and the SIMD target.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "kvcache/format.h"
#include "kvcache/geometry.h"
#include "kvcache/simd.h"
#include "tools/command.h"

namespace kvcache::tools {
namespace {

struct InfoOptions {
  bool json = false;
  uint32_t layers = 32, kv_heads = 8, head_dim = 128;
};

int RunInfo(const InfoOptions& o) {
  auto geometry = Geometry::Create({o.layers, o.kv_heads, o.head_dim, 16});
  if (!geometry.ok()) {
    fmt::print(stderr, "kvcache info: {}\n", geometry.status().ToString());
    return 2;
  }
  nlohmann::json out;
  out["simd_target"] = SimdTarget();
  out["supported_simd_targets"] = SupportedSimdTargets();
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
      j["bytes_per_token_per_side"] =
          static_cast<uint64_t>(RowBytes(f, o.head_dim)) * o.kv_heads * o.layers;
    } else {
      j["error"] = ok.message();
    }
    formats.push_back(std::move(j));
  }
  out["formats"] = std::move(formats);
  if (o.json) {
    fmt::print("{}\n", out.dump(2));
    return 0;
  }
  fmt::print("SIMD target: {}\ngeometry: {} layers, {} kv heads, head_dim {}\n\n",
             out["simd_target"].get<std::string>(), o.layers, o.kv_heads, o.head_dim);
  fmt::print("{:<10} {:>10} {:>10} {:>22}\n", "format", "bits/val", "row bytes", "bytes/token (K or V)");
  for (const auto& j : out["formats"]) {
    if (j["supported"].get<bool>()) {
      fmt::print("{:<10} {:>10.3f} {:>10} {:>22}\n", j["name"].get<std::string>(),
                 j["bits_per_value"].get<double>(), j["row_bytes"].get<size_t>(),
                 j["bytes_per_token_per_side"].get<uint64_t>());
    } else {
      fmt::print("{:<10} {}\n", j["name"].get<std::string>(), j["error"].get<std::string>());
    }
  }
  return 0;
}

const bool kRegistered = RegisterCommand(
    "info", "List the formats, their sizes for a geometry, and the SIMD target",
    [](CLI::App* app) -> Runner {
      auto o = std::make_shared<InfoOptions>();
      app->add_flag("--json", o->json, "Print JSON");
      app->add_option("--layers", o->layers, "Number of layers")->capture_default_str();
      app->add_option("--kv-heads", o->kv_heads, "Number of kv heads")->capture_default_str();
      app->add_option("--head-dim", o->head_dim, "Values per head")->capture_default_str();
      return [o] { return RunInfo(*o); };
    });

}  // namespace
}  // namespace kvcache::tools
