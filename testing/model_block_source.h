// The reference model of the block pool's accounting that the prefix-cache
// tests compare the real pool against: metadata only, plain containers,
// obviously correct. Not thread-safe: one thread at a time.
#pragma once

#include <cstdint>
#include <memory>

#include "testing/block_source.h"

namespace kvcache::serving {

// A BlockSource of num_blocks blocks of block_size tokens, following the
// contracts of kvcache/pool.h.
std::unique_ptr<BlockSource> NewModelBlockSource(uint32_t num_blocks, uint32_t block_size);

}  // namespace kvcache::serving
