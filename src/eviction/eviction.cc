// Eviction policy selection (contract in kvcache/eviction.h).
#include "kvcache/eviction.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

namespace kvcache {

Status EvictionPolicy::Validate() const {
  switch (kind) {
    case EvictionKind::kKeepAll:
    case EvictionKind::kDeadHead:
      if (sink_tokens != 0 || window_tokens != 0 || heavy_tokens != 0) {
        return Status::InvalidArgument(
            fmt::format("eviction policy {} takes no sink/window/heavy sizes", ToString()));
      }
      return Status::Ok();
    case EvictionKind::kWindow:
      if (heavy_tokens != 0) {
        return Status::InvalidArgument("eviction policy window takes no heavy_tokens");
      }
      [[fallthrough]];
    case EvictionKind::kHeavyHitter:
      if (window_tokens == 0) {
        return Status::InvalidArgument(fmt::format(
            "eviction policy {}: a window of 0 would drop the newest token; use >= 1",
            ToString()));
      }
      return Status::Ok();
  }
  return Status::InvalidArgument("unknown eviction policy kind");
}

uint64_t EvictionPolicy::budget() const {
  switch (kind) {
    case EvictionKind::kKeepAll: return std::numeric_limits<uint64_t>::max();
    case EvictionKind::kDeadHead: return 0;
    case EvictionKind::kWindow: return uint64_t{sink_tokens} + window_tokens;
    case EvictionKind::kHeavyHitter:
      return uint64_t{sink_tokens} + window_tokens + heavy_tokens;
  }
  return 0;
}

std::string EvictionPolicy::ToString() const {
  switch (kind) {
    case EvictionKind::kKeepAll: return "keep_all";
    case EvictionKind::kDeadHead: return "dead";
    case EvictionKind::kWindow:
      return fmt::format("window(sink={},window={})", sink_tokens, window_tokens);
    case EvictionKind::kHeavyHitter:
      return fmt::format("h2o(heavy={},window={},sink={})", heavy_tokens, window_tokens,
                         sink_tokens);
  }
  return "unknown";
}

Result<std::vector<uint32_t>> SelectRows(const EvictionPolicy& policy, uint32_t num_rows,
                                         std::span<const float> importance) {
  KV_RETURN_IF_ERROR(policy.Validate());
  if (policy.needs_importance()) {
    if (importance.size() != num_rows) {
      return Status::InvalidArgument(fmt::format(
          "eviction {}: importance has {} values for {} rows", policy.ToString(),
          importance.size(), num_rows));
    }
    for (float x : importance) {
      if (!std::isfinite(x)) {
        return Status::InvalidArgument("eviction: non-finite importance value");
      }
    }
  }
  std::vector<uint32_t> keep;
  if (policy.dead()) return keep;
  if (num_rows <= policy.budget()) {
    keep.resize(num_rows);
    std::iota(keep.begin(), keep.end(), 0u);
    return keep;
  }
  // Here num_rows > sink + window (+ heavy), so the three ranges are disjoint.
  const uint32_t sink = policy.sink_tokens;
  const uint32_t recent_begin = num_rows - policy.window_tokens;
  keep.reserve(static_cast<size_t>(policy.budget()));
  for (uint32_t r = 0; r < sink; ++r) keep.push_back(r);
  if (policy.kind == EvictionKind::kHeavyHitter && policy.heavy_tokens > 0) {
    std::vector<uint32_t> middle(recent_begin - sink);
    std::iota(middle.begin(), middle.end(), sink);
    // Larger mass first; equal mass: the more recent row first.
    auto better = [&](uint32_t a, uint32_t b) {
      if (importance[a] != importance[b]) return importance[a] > importance[b];
      return a > b;
    };
    const size_t h = policy.heavy_tokens;  // < middle.size() since num_rows > budget
    std::nth_element(middle.begin(), middle.begin() + (h - 1), middle.end(), better);
    middle.resize(h);
    std::sort(middle.begin(), middle.end());
    keep.insert(keep.end(), middle.begin(), middle.end());
  }
  for (uint32_t r = recent_begin; r < num_rows; ++r) keep.push_back(r);
  return keep;
}

Result<PolicyTable> PolicyTable::Uniform(uint32_t n_kv_heads, const EvictionPolicy& policy) {
  return PerHead(std::vector<EvictionPolicy>(n_kv_heads, policy));
}

Result<PolicyTable> PolicyTable::PerHead(std::vector<EvictionPolicy> per_head) {
  if (per_head.empty()) return Status::InvalidArgument("policy table: no heads");
  for (size_t h = 0; h < per_head.size(); ++h) {
    const Status s = per_head[h].Validate();
    if (!s.ok()) {
      return Status::InvalidArgument(fmt::format("policy table head {}: {}", h, s.message()));
    }
  }
  return PolicyTable(std::move(per_head));
}

Result<PolicyTable> PolicyTable::Duo(const std::vector<bool>& full_history,
                                     const EvictionPolicy& streaming) {
  std::vector<EvictionPolicy> p;
  p.reserve(full_history.size());
  for (bool full : full_history) p.push_back(full ? EvictionPolicy::KeepAll() : streaming);
  return PerHead(std::move(p));
}

bool PolicyTable::all_keep_all() const {
  return std::all_of(per_head_.begin(), per_head_.end(),
                     [](const EvictionPolicy& p) { return p.kind == EvictionKind::kKeepAll; });
}

}  // namespace kvcache
