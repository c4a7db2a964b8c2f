// The simulation loop over any BlockSource (the real pool or the reference
// model); Simulate() in simulator.h runs it on a real BlockPool.
#pragma once

#include <span>

#include "engine/sim/simulator.h"
#include "engine/sim/block_source.h"

namespace kvcache::serving {

// Replays `requests` on `source` (fresh: no blocks in use). Fills every field
// of the report except the pool-size ones (num_blocks, block_bytes, ...),
// which the caller knows.
Result<SimulateReport> SimulateOn(BlockSource* source, const SimulateOptions& options,
                                  std::span<const Request> requests);
// The same with a prefix cache (and, optionally, tiers under it) the caller
// owns; `cache` null = no prefix caching.
Result<SimulateReport> SimulateWith(BlockSource* source, PrefixCache* cache, OffloadCache* offload,
                                    const SimulateOptions& options,
                                    std::span<const Request> requests);

}  // namespace kvcache::serving
