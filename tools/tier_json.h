// One offload tier's counters as JSON (kvcache simulate / generate --tiers;
// soak prints its own subset, with the same misses object):
// {"name", "lookups", "hit_blocks", "hit_tokens", "misses": {reason: n},
//  "bytes_loaded", "bytes_stored", "stored_blocks", "load_p50_us",
//  "load_p99_us", "dropped_stores", "objects", "evictions"}.
#pragma once

#include <span>
#include <string>

#include <nlohmann/json.hpp>

#include "kvcache/serving/offload.h"

namespace kvcache::tools {

// {reason: blocks} for every TierMiss.
inline nlohmann::json TierMissesJson(std::span<const uint64_t, kNumTierMisses> misses) {
  nlohmann::json tm = nlohmann::json::object();
  for (size_t i = 0; i < kNumTierMisses; ++i) {
    tm[std::string(TierMissName(static_cast<TierMiss>(i)))] = misses[i];
  }
  return tm;
}

inline nlohmann::json TierStatsJson(const TierStats& t) {
  const nlohmann::json tm = TierMissesJson(t.misses);
  return {{"name", t.name},
          {"lookups", t.lookups},
          {"hit_blocks", t.hit_blocks},
          {"hit_tokens", t.hit_tokens},
          {"misses", tm},
          {"bytes_loaded", t.bytes_loaded},
          {"bytes_stored", t.bytes_stored},
          {"stored_blocks", t.stored_blocks},
          {"load_p50_us", t.load_p50_us},
          {"load_p99_us", t.load_p99_us},
          {"dropped_stores", t.dropped_stores},
          {"objects", t.usage.objects},
          {"evictions", t.usage.evictions}};
}

}  // namespace kvcache::tools
