// Simulate(): builds the pool for the options' memory budget and runs the
// simulation loop on it; ParseModelGeometry.
#include <charconv>

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
  BlockPoolOptions pool_options;
  pool_options.num_blocks = num_blocks;
  KV_ASSIGN_OR_RETURN(std::shared_ptr<BlockPool> pool,
                      BlockPool::Create(geometry, options.formats, pool_options));
  std::unique_ptr<serving::BlockSource> source = serving::NewPoolBlockSource(pool);
  SimulateReport report;
  if (options.tiers.empty()) {
    KV_ASSIGN_OR_RETURN(report, serving::SimulateOn(source.get(), options, requests));
  } else {
    if (!options.prefix_caching) {
      return Status::InvalidArgument("simulate: tiers need prefix caching");
    }
    KV_ASSIGN_OR_RETURN(std::unique_ptr<PrefixCache> cache, PrefixCache::Create(pool));
    OffloadOptions oo;
    oo.model = options.model_fingerprint;
    KV_ASSIGN_OR_RETURN(std::unique_ptr<OffloadCache> offload,
                        OffloadCache::Create(pool, cache.get(), options.tiers, oo));
    KV_ASSIGN_OR_RETURN(report, serving::SimulateWith(source.get(), cache.get(), offload.get(),
                                                      options, requests));
  }
  report.formats = FormatPairName(options.formats);
  report.num_blocks = source->num_blocks();
  report.block_bytes = block_bytes;
  report.bytes_per_token = block_bytes / geometry.block_size();
  report.capacity_tokens = uint64_t{report.num_blocks} * geometry.block_size();
  return report;
}

}  // namespace kvcache
