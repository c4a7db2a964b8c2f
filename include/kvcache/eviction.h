// Eviction policies: which stored positions of one kv head a cache keeps when
// memory is bounded. Pure selection functions; the caches (hybrid.h) apply
// their choice by compacting the kept rows and remembering each one's
// original position.
//
// A head's stored rows are numbered r = 0..n-1 in the order they were
// appended (ascending original position). Policies:
//
//   kKeepAll      every row.
//   kWindow       StreamingLLM: the first `sink_tokens` rows (attention sinks,
//                 kept forever) and the last `window_tokens` rows.
//   kHeavyHitter  H2O: the first `sink_tokens` rows, the last `window_tokens`
//                 rows, and among the others the `heavy_tokens` rows with the
//                 largest accumulated attention mass (importance). Ties are
//                 broken toward the more recent row (larger r): with equal
//                 mass, a newer row earned it in fewer decode steps.
//   kDeadHead     nothing (the head stores no K/V at all).
//
// Kept rows are returned in ascending order, so compaction preserves the
// appended order. A policy keeps at most budget() rows; a head with at most
// budget() rows keeps all of them under every policy but kDeadHead.
//
// A PolicyTable gives each kv head of a layer its own policy (DuoAttention:
// retrieval heads keep full history, streaming heads a sink + window).
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "kvcache/status.h"

namespace kvcache {

enum class EvictionKind : uint8_t { kKeepAll, kWindow, kHeavyHitter, kDeadHead };

struct EvictionPolicy {
  EvictionKind kind = EvictionKind::kKeepAll;
  uint32_t sink_tokens = 0;    // kWindow, kHeavyHitter
  uint32_t window_tokens = 0;  // kWindow, kHeavyHitter: >= 1 (the newest row is always kept)
  uint32_t heavy_tokens = 0;   // kHeavyHitter

  static EvictionPolicy KeepAll() { return {}; }
  static EvictionPolicy Window(uint32_t sink, uint32_t window) {
    return {EvictionKind::kWindow, sink, window, 0};
  }
  static EvictionPolicy HeavyHitter(uint32_t heavy, uint32_t window, uint32_t sink = 0) {
    return {EvictionKind::kHeavyHitter, sink, window, heavy};
  }
  static EvictionPolicy DeadHead() { return {EvictionKind::kDeadHead, 0, 0, 0}; }

  // InvalidArgument for a window of 0 on kWindow / kHeavyHitter, or sizes
  // on a policy that takes none.
  Status Validate() const;
  // Most rows kept: unbounded (max u64) for kKeepAll, 0 for kDeadHead.
  uint64_t budget() const;
  // True iff the policy needs importance (kHeavyHitter).
  bool needs_importance() const { return kind == EvictionKind::kHeavyHitter; }
  // True iff the head stores nothing.
  bool dead() const { return kind == EvictionKind::kDeadHead; }
  // "keep_all", "window(sink=4,window=1024)", "h2o(heavy=64,window=64,sink=0)", "dead".
  std::string ToString() const;
  bool operator==(const EvictionPolicy&) const = default;
};

// Rows to keep, ascending, of a head holding num_rows rows.
// importance [num_rows] (attention mass per row) is required by kHeavyHitter
// and ignored otherwise; InvalidArgument if it is missing or of the wrong
// size, holds a non-finite value, or the policy is invalid.
Result<std::vector<uint32_t>> SelectRows(const EvictionPolicy& policy, uint32_t num_rows,
                                         std::span<const float> importance = {});

// One policy per kv head of a layer.
class PolicyTable {
 public:
  // Every head the same policy.
  static Result<PolicyTable> Uniform(uint32_t n_kv_heads, const EvictionPolicy& policy);
  // per_head [n_kv_heads]; each must validate.
  static Result<PolicyTable> PerHead(std::vector<EvictionPolicy> per_head);
  // DuoAttention: heads with full_history[h] keep everything, the others use
  // `streaming` (usually a kWindow policy).
  static Result<PolicyTable> Duo(const std::vector<bool>& full_history,
                                 const EvictionPolicy& streaming);

  uint32_t n_kv_heads() const { return static_cast<uint32_t>(per_head_.size()); }
  const EvictionPolicy& head(uint32_t h) const { return per_head_[h]; }
  const std::vector<EvictionPolicy>& policies() const { return per_head_; }
  bool all_keep_all() const;

 private:
  explicit PolicyTable(std::vector<EvictionPolicy> p) : per_head_(std::move(p)) {}
  std::vector<EvictionPolicy> per_head_;
};

}  // namespace kvcache
