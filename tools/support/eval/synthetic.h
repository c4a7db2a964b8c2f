// Synthetic keys, values and queries for measuring format quality.
//
// Two kinds of data, both fully determined by a seed:
//   gaussian  i.i.d. N(0, 1) keys and values.
//   outlier   keys shaped like real post-RoPE keys, per kv head:
//             - channel spreads s_c lognormal (log-sd 0.5, median 1);
//             - a per-channel mean offset m_c ~ N(0, s_c^2) (as large as the spread);
//             - max(1, D/32) outlier channels whose offset is +-U(5, 15) x the median
//               spread;
//             - D/8 heavy-tailed channels (Student-t, 3 dof, scaled to variance s_c^2);
//             - token 0 is an attention sink: its key is m plus a deviation 8x the
//               norm of a typical token's deviation;
//             values near isotropic: N(0, v_c^2) with v_c lognormal (log-sd 0.1).
// Queries (MakeQueries) are drawn from the key distribution, so they share the
// keys' outlier channels: for query n and query head h (kv head g = h / group),
//   q = mu_g + 0.5 (k_j - mu_g) + 0.5 (k_i - k_l) / sqrt(2)
// with mu_g the per-channel mean of head g's keys and j, i, l random positions
// other than 0 (position 0 is the sink in real models). This works the same
// for keys read from a user's .npy file.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "kvcache/status.h"

namespace kvcache::eval {

enum class DataKind : uint8_t { kGaussian, kOutlier };
Result<DataKind> ParseDataKind(std::string_view name);  // "gaussian" | "outlier"

struct SyntheticShape {
  uint32_t tokens = 1024;
  uint32_t kv_heads = 2;
  uint32_t head_dim = 128;
};

// [tokens][kv_heads][head_dim]
std::vector<float> MakeKeys(DataKind kind, const SyntheticShape& shape, uint64_t seed);
// [tokens][kv_heads][head_dim]
std::vector<float> MakeValues(DataKind kind, const SyntheticShape& shape, uint64_t seed);

struct QueryOptions {
  uint32_t num_queries = 64;
  uint32_t q_heads = 4;  // a multiple of kv_heads
  uint64_t seed = 1;
};
// keys [tokens][kv_heads][head_dim] -> queries [num_queries][q_heads][head_dim].
// REQUIRES: q_heads % kv_heads == 0, tokens >= 1.
std::vector<float> MakeQueries(const std::vector<float>& keys, const SyntheticShape& shape,
                               const QueryOptions& options);

// The outlier generator's per-head channel statistics, exposed for tests.
struct ChannelStats {
  std::vector<float> mean;            // [head_dim] offset m_c
  std::vector<float> spread;          // [head_dim] s_c
  std::vector<uint32_t> outliers;     // channels with a 5-15x offset
  std::vector<uint32_t> heavy_tailed; // Student-t channels
};
ChannelStats OutlierChannelStats(uint32_t head_dim, uint64_t seed, uint32_t kv_head);

}  // namespace kvcache::eval
