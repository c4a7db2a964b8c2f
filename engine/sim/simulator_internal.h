// The simulation loop on a KV manager the caller owns; Simulate() in
// simulator.h builds one for the options' memory budget and runs it.
#pragma once

#include <memory>
#include <span>

#include "engine/kv_manager.h"
#include "engine/sim/simulator.h"

namespace kvcache::serving {

// The KV manager a simulation runs on: without rows, `num_blocks` blocks of
// the options' geometry and formats, the prefix cache and the tiers as the
// options say. InvalidArgument for options that do not make one.
Result<std::unique_ptr<engine::KvManager>> NewSimulationKvManager(const SimulateOptions& options,
                                                                  uint32_t num_blocks);

// Replays `requests` on `kv` (fresh: no block in use; made as above, its
// blocks of `block_size` tokens). Fills every field of the report except the
// pool-size ones (num_blocks, block_bytes, ...), which the caller knows.
// Internal if a block is still in use or reserved at the end.
Result<SimulateReport> SimulateOn(engine::KvManager* kv, uint32_t block_size, const SimulateOptions& options,
                                  std::span<const Request> requests);

}  // namespace kvcache::serving
