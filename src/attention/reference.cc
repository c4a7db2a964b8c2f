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

namespace {

Status CheckReference(std::span<const ReferenceHead> heads, uint32_t head_dim,
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
  const size_t qd = static_cast<size_t>(n_queries) * options.n_q_heads;
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
  return Status::Ok();
}

// One query vector qv at position qpos over one head's rows: out[head_dim],
// *lse and probs[num_tokens] (each when non-null) written, kv_probs (when
// non-null) added into. s, e, o, o_seg: scratch.
struct OneQuery {
  const float* qv;
  uint32_t qpos;
  float* out;
  float* lse;
  float* probs;
  float* kv_probs;
};
struct RefScratch {
  std::vector<float> s, e, o, o_seg;
};

void AttendOne(const ReferenceHead& hd, uint32_t head_dim, uint32_t num_tokens, float scale,
               const AttentionOptions& options, const OneQuery& a, RefScratch& sc) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const uint32_t rows = static_cast<uint32_t>(hd.keys.size() / head_dim);
  auto visible = [&](uint32_t r) {
    const uint32_t p = hd.positions.empty() ? r : hd.positions[r];
    if (p > a.qpos) return false;
    return options.window == 0 || p + options.window > a.qpos || p < options.n_sink;
  };
  std::vector<float>& s = sc.s;
  s.assign(rows, neg_inf);
  float m = neg_inf;
  for (uint32_t r = 0; r < rows; ++r) {
    if (!visible(r)) continue;
    s[r] = Dot(a.qv, hd.keys.data() + static_cast<size_t>(r) * head_dim, head_dim) * scale;
    m = std::max(m, s[r]);
  }
  if (a.probs) std::fill(a.probs, a.probs + num_tokens, 0.0f);
  if (m == neg_inf) {  // nothing visible
    std::fill(a.out, a.out + head_dim, 0.0f);
    if (a.lse) *a.lse = neg_inf;
    return;
  }
  std::vector<float>& e = sc.e;
  e.assign(rows, 0.0f);
  for (uint32_t r = 0; r < rows; ++r) e[r] = Exp(s[r] - m);
  float l = 0.0f;
  std::vector<float>& o = sc.o;
  std::vector<float>& o_seg = sc.o_seg;
  o.assign(head_dim, 0.0f);
  o_seg.resize(head_dim);
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
  for (uint32_t i = 0; i < head_dim; ++i) a.out[i] = o[i] / l;
  if (a.lse) *a.lse = m + std::log(l);
  if (a.probs) {
    for (uint32_t r = 0; r < rows; ++r) a.probs[r] = e[r] / l;
  }
  if (a.kv_probs) {
    for (uint32_t r = 0; r < rows; ++r) a.kv_probs[r] = a.kv_probs[r] + e[r] / l;
  }
}

}  // namespace

Status AttendReference(std::span<const ReferenceHead> heads, uint32_t head_dim,
                       uint32_t num_tokens, uint32_t n_queries, std::span<const float> q,
                       const AttentionOptions& options, const AttentionOutput& output) {
  KV_RETURN_IF_ERROR(CheckReference(heads, head_dim, num_tokens, n_queries, q, options, output));
  const uint32_t n_kv = static_cast<uint32_t>(heads.size());
  const uint32_t nq = options.n_q_heads, group = nq / n_kv;
  const float scale =
      options.scale > 0.0f ? options.scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
  if (!output.kv_probs.empty()) std::fill(output.kv_probs.begin(), output.kv_probs.end(), 0.0f);
  RefScratch sc;
  for (uint32_t t = 0; t < n_queries; ++t) {
    for (uint32_t h = 0; h < n_kv; ++h) {
      for (uint32_t g = 0; g < group; ++g) {
        const size_t qh = static_cast<size_t>(t) * nq + h * group + g;
        OneQuery a;
        a.qv = q.data() + qh * head_dim;
        a.qpos = num_tokens - n_queries + t;
        a.out = output.out.data() + qh * head_dim;
        a.lse = output.lse.empty() ? nullptr : output.lse.data() + qh;
        a.probs = output.probs.empty() ? nullptr : output.probs.data() + qh * num_tokens;
        a.kv_probs = output.kv_probs.empty()
                         ? nullptr
                         : output.kv_probs.data() + static_cast<size_t>(h) * num_tokens;
        AttendOne(heads[h], head_dim, num_tokens, scale, options, a, sc);
      }
    }
  }
  return Status::Ok();
}

}  // namespace kvcache
