// Simulate(): builds the KV manager for the options' memory budget and runs
// the simulation loop on it; ParseModelGeometry.
#include <algorithm>
#include <charconv>
#include <cstdint>

#include <fmt/format.h>

#include "kvcache/pool.h"
#include "engine/sim/simulator.h"
#include "engine/sim/simulator_internal.h"

namespace kvcache {

Result<GeometryOptions> ParseModelGeometry(std::string_view text) {
  struct Named {
    std::string_view name;
    GeometryOptions g;
  };
  static constexpr Named kNamed[] = {
      {"llama3-8b", {32, 8, 128, 16}},
      {"llama3-70b", {80, 8, 128, 16}},
      {"mistral-7b", {32, 8, 128, 16}},
      {"qwen2-7b", {28, 4, 128, 16}},
  };
  for (const Named& n : kNamed) {
    if (text == n.name) return n.g;
  }
  uint32_t v[3];
  std::string_view rest = text;
  for (int i = 0; i < 3; ++i) {
    const size_t comma = rest.find(',');
    std::string_view part = rest.substr(0, comma);
    auto [ptr, ec] = std::from_chars(part.data(), part.data() + part.size(), v[i]);
    if (ec != std::errc() || ptr != part.data() + part.size() || part.empty() ||
        (i < 2) == (comma == std::string_view::npos)) {
      return Status::InvalidArgument(fmt::format(
          "model geometry '{}': expected llama3-8b, llama3-70b, mistral-7b, qwen2-7b or "
          "LAYERS,KV_HEADS,HEAD_DIM",
          text));
    }
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
  }
  GeometryOptions g{v[0], v[1], v[2], 16};
  if (auto checked = Geometry::Create(g); !checked.ok()) return checked.status();
  return g;
}

namespace serving {

Result<std::unique_ptr<engine::KvManager>> NewSimulationKvManager(const SimulateOptions& options,
                                                                  uint32_t num_blocks) {
  if (!options.tiers.empty() && !options.prefix_caching) {
    return Status::InvalidArgument("simulate: tiers need prefix caching");
  }
  const GeometryOptions& g = options.geometry;
  // The longest sequence is the whole pool: the simulator's own admission
  // (Fits) rejects what could never fit.
  const uint32_t max_blocks = std::min<uint32_t>(num_blocks, UINT32_MAX / g.block_size);
  model::AttentionShape shape;
  shape.n_layers = g.n_layers;
  shape.n_heads = g.n_kv_heads;
  shape.n_kv_heads = g.n_kv_heads;
  shape.head_dim = g.head_dim;
  shape.max_seq_len = max_blocks * g.block_size;
  engine::KvManagerOptions k;
  k.formats = options.formats;
  k.block_size = g.block_size;
  k.pool_blocks = num_blocks;
  k.prefix_cache = options.prefix_caching;
  k.tier_objects = options.tiers;
  k.model_id = options.model_fingerprint;
  k.rows = false;
  return engine::KvManager::Create(shape, nullptr, k);
}

}  // namespace serving

Result<SimulateReport> Simulate(const SimulateOptions& options, std::span<const Request> requests) {
  KV_ASSIGN_OR_RETURN(const Geometry geometry, Geometry::Create(options.geometry));
  KV_RETURN_IF_ERROR(CheckHeadDim(options.formats.k, geometry.head_dim()));
  KV_RETURN_IF_ERROR(CheckHeadDim(options.formats.v, geometry.head_dim()));
  const uint64_t block_bytes = BlockPool::BlockBytes(geometry, options.formats);
  const uint32_t num_blocks = BlockPool::BlocksForBytes(geometry, options.formats, options.pool_bytes);
  if (num_blocks == 0) {
    return Status::InvalidArgument(fmt::format(
        "simulate: a pool of {} bytes holds no block of {} bytes", options.pool_bytes, block_bytes));
  }
  KV_ASSIGN_OR_RETURN(std::unique_ptr<engine::KvManager> kv, serving::NewSimulationKvManager(options, num_blocks));
  KV_ASSIGN_OR_RETURN(SimulateReport report,
                      serving::SimulateOn(kv.get(), geometry.block_size(), options, requests));
  report.formats = FormatPairName(options.formats);
  report.num_blocks = num_blocks;
  report.block_bytes = block_bytes;
  report.bytes_per_token = block_bytes / geometry.block_size();
  report.capacity_tokens = uint64_t{report.num_blocks} * geometry.block_size();
  return report;
}

}  // namespace kvcache
