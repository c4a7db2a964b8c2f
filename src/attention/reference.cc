// AttendReference: plain scalar attention over f32 slices, in the order
// documented in reference.h. It defines the exact f32 result the SIMD
// kernels reproduce, and is the yardstick for every lossy format.
//
// Thread safety: reentrant.
#pragma GCC optimize("fp-contract=off")

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <vector>

#include "attention/reference.h"
#include "format/format_internal.h"
#include "kvcache/attention.h"

namespace kvcache {

using attention_internal::Dot;
using attention_internal::Exp;
using attention_internal::kSegmentRows;

Status AttendReference(std::span<const ReferenceHead> heads, uint32_t head_dim,
                       uint32_t num_tokens, uint32_t n_queries, std::span<const float> q,
                       const AttentionOptions& options, const AttentionOutput& output) {
  const uint32_t n_kv = static_cast<uint32_t>(heads.size());
  if (n_kv == 0 || head_dim == 0 || num_tokens == 0) {
    return Status::InvalidArgument("reference attention: empty input");
  }
  if (options.n_q_heads == 0 || options.n_q_heads % n_kv != 0) {
    return Status::InvalidArgument(
        fmt::format("reference attention: n_q_heads {} must be a positive multiple of {}",
                    options.n_q_heads, n_kv));
  }
  if (options.window > num_tokens || n_queries == 0 || n_queries > num_tokens) {
    return Status::InvalidArgument("reference attention: window or query count out of range");
  }
  const uint32_t nq = options.n_q_heads, group = nq / n_kv;
  const size_t qd = static_cast<size_t>(n_queries) * nq;
  if (q.size() != qd * head_dim || output.out.size() != qd * head_dim ||
      (!output.lse.empty() && output.lse.size() != qd) ||
      (!output.probs.empty() && output.probs.size() != qd * num_tokens) ||
      (!output.kv_probs.empty() && output.kv_probs.size() != size_t{n_kv} * num_tokens)) {
    return Status::InvalidArgument("reference attention: a buffer has the wrong size");
  }
  if (const size_t i = format_internal::FirstNonFinite(q.data(), q.size()); i != q.size()) {
    return Status::InvalidArgument(
        fmt::format("reference attention: query value {} is not finite ({})", i, q[i]));
  }
  for (const ReferenceHead& hd : heads) {
    const size_t rows = hd.keys.size() / head_dim;
    if (hd.keys.size() % head_dim != 0 || hd.values.size() != hd.keys.size() ||
        rows > num_tokens || (!hd.positions.empty() && hd.positions.size() != rows)) {
      return Status::InvalidArgument("reference attention: a head's slices are inconsistent");
    }
  }
  const float scale =
      options.scale > 0.0f ? options.scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
  const float neg_inf = -std::numeric_limits<float>::infinity();

  if (!output.kv_probs.empty()) std::fill(output.kv_probs.begin(), output.kv_probs.end(), 0.0f);
  std::vector<float> s, e, o(head_dim), o_seg(head_dim);
  for (uint32_t t = 0; t < n_queries; ++t) {
    const uint32_t qpos = num_tokens - n_queries + t;
    for (uint32_t h = 0; h < n_kv; ++h) {
      const ReferenceHead& hd = heads[h];
      const uint32_t rows = static_cast<uint32_t>(hd.keys.size() / head_dim);
      auto visible = [&](uint32_t r) {
        const uint32_t p = hd.positions.empty() ? r : hd.positions[r];
        if (p > qpos) return false;
        return options.window == 0 || p + options.window > qpos || p < options.n_sink;
      };
      for (uint32_t g = 0; g < group; ++g) {
        const size_t qh = static_cast<size_t>(t) * nq + h * group + g;
        const float* qv = q.data() + qh * head_dim;
        s.assign(rows, neg_inf);
        float m = neg_inf;
        for (uint32_t r = 0; r < rows; ++r) {
          if (!visible(r)) continue;
          s[r] = Dot(qv, hd.keys.data() + static_cast<size_t>(r) * head_dim, head_dim) * scale;
          m = std::max(m, s[r]);
        }
        float* out = output.out.data() + qh * head_dim;
        float* probs = output.probs.empty() ? nullptr : output.probs.data() + qh * num_tokens;
        if (probs) std::fill(probs, probs + num_tokens, 0.0f);
        if (m == neg_inf) {  // nothing visible
          std::fill(out, out + head_dim, 0.0f);
          if (!output.lse.empty()) output.lse[qh] = neg_inf;
          continue;
        }
        e.assign(rows, 0.0f);
        for (uint32_t r = 0; r < rows; ++r) e[r] = Exp(s[r] - m);
        float l = 0.0f;
        std::fill(o.begin(), o.end(), 0.0f);
        for (uint32_t seg = 0; seg < rows; seg += kSegmentRows) {
          float l_seg = 0.0f;
          std::fill(o_seg.begin(), o_seg.end(), 0.0f);
          for (uint32_t r = seg; r < std::min(rows, seg + kSegmentRows); ++r) {
            if (!visible(r)) continue;
            l_seg = l_seg + e[r];
            const float* v = hd.values.data() + static_cast<size_t>(r) * head_dim;
            for (uint32_t i = 0; i < head_dim; ++i) {
              const float prod = e[r] * v[i];
              o_seg[i] = o_seg[i] + prod;
            }
          }
          l = l + l_seg;
          for (uint32_t i = 0; i < head_dim; ++i) o[i] = o[i] + o_seg[i];
        }
        for (uint32_t i = 0; i < head_dim; ++i) out[i] = o[i] / l;
        if (!output.lse.empty()) output.lse[qh] = m + std::log(l);
        if (probs) {
          for (uint32_t r = 0; r < rows; ++r) probs[r] = e[r] / l;
        }
        if (!output.kv_probs.empty()) {
          float* kp = output.kv_probs.data() + static_cast<size_t>(h) * num_tokens;
          for (uint32_t r = 0; r < rows; ++r) kp[r] = kp[r] + e[r] / l;
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace kvcache
