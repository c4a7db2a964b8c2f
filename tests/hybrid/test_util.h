// Helpers shared by the hybrid tests: deterministic token data, a bit-level
// snapshot of a HybridSequence, and a plain f32 attention over a view.
#pragma once

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kvcache/hybrid.h"

namespace kvcache::testing_hybrid {

// Deterministic K/V of one token for one layer: [n_kv_heads][head_dim].
inline std::vector<float> TokenRows(uint64_t seed, uint32_t layer, uint32_t pos, int side,
                                    uint32_t kv_dim) {
  std::mt19937_64 rng(seed * 1000003u + layer * 7919u + pos * 31u + side);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(kv_dim);
  for (float& f : x) f = n(rng) * 0.5f;
  return x;
}

// Everything a sequence holds, bit for bit: per attention layer and head the
// positions, the encoded K and V row bytes and the calibration; per linear
// layer the committed state and token count.
struct Snapshot {
  std::vector<uint32_t> num_tokens;
  std::vector<std::vector<std::vector<uint32_t>>> positions;  // [layer][head][row]
  std::vector<std::vector<std::vector<uint8_t>>> bytes;       // [layer][head] K rows then V rows
  std::vector<std::vector<RowTransform>> transforms;          // [layer][2*head + side]
  std::vector<std::vector<double>> linear;                    // [layer] state
  bool operator==(const Snapshot&) const = default;
};

inline Snapshot Take(const HybridSequence& s) {
  const HybridModel& m = s.model();
  const uint32_t L = m.n_layers(), H = m.geometry().n_kv_heads();
  Snapshot snap;
  snap.num_tokens.resize(L);
  snap.positions.resize(L);
  snap.bytes.resize(L);
  snap.transforms.resize(L);
  snap.linear.resize(L);
  for (uint32_t l = 0; l < L; ++l) {
    snap.num_tokens[l] = s.num_tokens(l);
    if (m.kind(l) == LayerKind::kLinear) {
      auto st = s.Linear(l);
      EXPECT_TRUE(st.ok());
      if (st.ok()) snap.linear[l].assign((*st)->state().begin(), (*st)->state().end());
      continue;
    }
    auto view = s.View(l);
    EXPECT_TRUE(view.ok()) << view.status().ToString();
    if (!view.ok()) continue;
    const LayerKvView& v = *view;
    snap.positions[l].resize(H);
    snap.bytes[l].resize(H);
    snap.transforms[l].resize(2 * H);
    for (uint32_t h = 0; h < H; ++h) {
      snap.positions[l][h] = s.HeadPositions(l, h);
      EXPECT_EQ(snap.positions[l][h].size(), v.rows(h));
      for (uint32_t r = 0; r < v.rows(h); ++r) {
        EXPECT_EQ(v.position(h, r), snap.positions[l][h][r]);
        for (const KvSideView* side : {&v.k, &v.v}) {
          const uint8_t* p = v.row_ptr(*side, h, r);
          snap.bytes[l][h].insert(snap.bytes[l][h].end(), p, p + side->row_bytes);
        }
      }
      if (v.k.transforms) snap.transforms[l][2 * h] = v.k.transforms[h];
      if (v.v.transforms) snap.transforms[l][2 * h + 1] = v.v.transforms[h];
    }
  }
  return snap;
}

// Decode attention of one query per kv head over an f32 view, rows in
// stored order, with the window/sink visibility rule of attention.h.
// q [n_kv_heads][head_dim]; returns [n_kv_heads][head_dim].
inline std::vector<float> PlainAttention(const LayerKvView& v, const std::vector<float>& q,
                                         uint32_t window = 0, uint32_t n_sink = 0) {
  const uint32_t D = v.head_dim;
  std::vector<float> out(size_t{v.n_kv_heads} * D, 0.0f);
  const uint32_t p_query = v.num_tokens - 1;
  for (uint32_t h = 0; h < v.n_kv_heads; ++h) {
    std::vector<float> scores;
    std::vector<const float*> vals;
    for (uint32_t r = 0; r < v.rows(h); ++r) {
      const uint32_t P = v.position(h, r);
      if (P > p_query) continue;
      if (window > 0 && !(P + window > p_query || P < n_sink)) continue;
      const float* k = reinterpret_cast<const float*>(v.row_ptr(v.k, h, r));
      float s = 0;
      for (uint32_t d = 0; d < D; ++d) s += q[h * D + d] * k[d];
      scores.push_back(s / std::sqrt(static_cast<float>(D)));
      vals.push_back(reinterpret_cast<const float*>(v.row_ptr(v.v, h, r)));
    }
    if (scores.empty()) continue;
    float mx = scores[0];
    for (float s : scores) mx = std::max(mx, s);
    float l = 0;
    for (float& s : scores) l += (s = std::exp(s - mx));
    for (size_t i = 0; i < scores.size(); ++i)
      for (uint32_t d = 0; d < D; ++d) out[h * D + d] += scores[i] / l * vals[i][d];
  }
  return out;
}

}  // namespace kvcache::testing_hybrid
