// The public attention entry points: validate every input (a failing call
// writes nothing), prepare the queries per head (column scales, rotation,
// key-mean bias) and hand a Plan to the SIMD kernels.
//
// Thread safety: reentrant; the only shared state is the caller's pool.
#include "kvcache/attention.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "attention/plan.h"
#include "attention/reference.h"
#include "format/format_internal.h"
#include "kvcache/attention_profile.h"
#include "kvcache/geometry.h"

namespace kvcache {
namespace {

using attention_internal::HeadJob;
using attention_internal::HeadWindow;
using attention_internal::PaddedDim;
using attention_internal::Plan;
using attention_internal::QueryVec;

Status CheckSide(const LayerKvView& view, const KvSideView& side, const char* name) {
  KV_RETURN_IF_ERROR(CheckHeadDim(side.format, view.head_dim));
  if (side.base == nullptr && side.head_base == nullptr) {
    return Status::InvalidArgument(fmt::format("attention: {} storage is null", name));
  }
  if (side.head_base != nullptr) {
    for (uint32_t h = 0; h < view.n_kv_heads; ++h) {
      if (view.rows(h) > 0 && side.head_base[h] == nullptr) {
        return Status::InvalidArgument(fmt::format(
            "attention: {} kv head {} stores {} rows but has no row buffer", name, h,
            view.rows(h)));
      }
    }
  }
  if (side.row_bytes != RowBytes(side.format, view.head_dim)) {
    return Status::InvalidArgument(fmt::format(
        "attention: {} row_bytes {} does not match format {} at head_dim {} ({})", name,
        side.row_bytes, FormatName(side.format), view.head_dim,
        RowBytes(side.format, view.head_dim)));
  }
  if (side.codec != nullptr &&
      (side.codec->format() != side.format || side.codec->head_dim() != view.head_dim)) {
    return Status::InvalidArgument(
        fmt::format("attention: {} codec does not match the view's format/head_dim", name));
  }
  if (IsRotated(side.format) && side.codec == nullptr) {
    return Status::InvalidArgument(fmt::format(
        "attention: {} format {} is rotated and needs the view's codec", name,
        FormatName(side.format)));
  }
  if (side.transforms != nullptr) {
    for (uint32_t h = 0; h < view.n_kv_heads; ++h) {
      const RowTransform& t = side.transforms[h];
      if ((!t.mean.empty() && t.mean.size() != view.head_dim) ||
          (!t.col_scale.empty() && t.col_scale.size() != view.head_dim)) {
        return Status::InvalidArgument(fmt::format(
            "attention: {} transform of kv head {} has the wrong size (head_dim {})", name, h,
            view.head_dim));
      }
    }
  }
  return Status::Ok();
}

Status CheckView(const LayerKvView& view);

// A view's precision window (kv_view.h): a plain view of the same shape
// whose slots all name their positions.
Status CheckWindowView(const LayerKvView& view) {
  const LayerKvView& hot = *view.hot;
  if (hot.hot != nullptr || view.positions != nullptr || hot.positions == nullptr) {
    return Status::InvalidArgument(
        "attention: a precision window is a view with positions beside a view without them");
  }
  if (hot.n_kv_heads != view.n_kv_heads || hot.head_dim != view.head_dim ||
      hot.num_tokens != view.num_tokens) {
    return Status::InvalidArgument(
        "attention: the precision window's shape differs from its view's");
  }
  const Status st = CheckView(hot);
  if (!st.ok()) return Status(st.code(), "precision window: " + st.message());
  return Status::Ok();
}

Status CheckView(const LayerKvView& view) {
  if (view.n_kv_heads == 0 || view.n_kv_heads > Geometry::kMaxKvHeads) {
    return Status::InvalidArgument(
        fmt::format("attention: n_kv_heads {} out of range [1, {}]", view.n_kv_heads,
                    Geometry::kMaxKvHeads));
  }
  if (view.head_dim == 0 || view.head_dim > Geometry::kMaxHeadDim) {
    return Status::InvalidArgument(fmt::format("attention: head_dim {} out of range [1, {}]",
                                               view.head_dim, Geometry::kMaxHeadDim));
  }
  if (view.num_tokens == 0) {
    return Status::InvalidArgument("attention: the view is empty (num_tokens 0)");
  }
  if (view.block_size == 0 || view.block_table == nullptr) {
    return Status::InvalidArgument("attention: the view has no block table / block size");
  }
  const uint64_t stored_capacity = static_cast<uint64_t>(view.num_blocks) * view.block_size;
  for (uint32_t h = 0; h < view.n_kv_heads; ++h) {
    const uint32_t rows = view.rows(h);
    if (rows > view.num_tokens) {
      return Status::InvalidArgument(fmt::format(
          "attention: kv head {} stores {} rows, more than num_tokens {}", h, rows,
          view.num_tokens));
    }
    if (rows > stored_capacity) {
      return Status::InvalidArgument(fmt::format(
          "attention: kv head {} stores {} rows but the block table covers {}", h, rows,
          stored_capacity));
    }
  }
  KV_RETURN_IF_ERROR(CheckSide(view, view.k, "K"));
  KV_RETURN_IF_ERROR(CheckSide(view, view.v, "V"));
  if (view.first_position > view.num_tokens) {
    return Status::InvalidArgument(fmt::format("attention: first_position {} past num_tokens {}",
                                               view.first_position, view.num_tokens));
  }
  return view.hot ? CheckWindowView(view) : Status::Ok();
}

Status CheckWindow(uint32_t window, uint32_t num_tokens) {
  if (window > num_tokens) {
    return Status::InvalidArgument(fmt::format(
        "attention: window {} is larger than the cache ({} tokens)", window, num_tokens));
  }
  return Status::Ok();
}

// The options, and the per-head windows when given (they replace the
// options' window, which is then not checked).
Status CheckOptions(const AttentionOptions& o, uint32_t n_kv_heads, uint32_t num_tokens,
                    std::span<const HeadWindow> windows = {}) {
  if (o.n_q_heads == 0 || o.n_q_heads % n_kv_heads != 0) {
    return Status::InvalidArgument(fmt::format(
        "attention: n_q_heads {} must be a positive multiple of n_kv_heads {}", o.n_q_heads,
        n_kv_heads));
  }
  if (!std::isfinite(o.scale) || o.scale < 0.0f) {
    return Status::InvalidArgument("attention: scale must be finite and >= 0 (0 = 1/sqrt(d))");
  }
  if (windows.empty()) return CheckWindow(o.window, num_tokens);
  if (windows.size() != n_kv_heads) {
    return Status::InvalidArgument(fmt::format(
        "attention: {} head windows for {} kv heads", windows.size(), n_kv_heads));
  }
  for (const HeadWindow& w : windows) KV_RETURN_IF_ERROR(CheckWindow(w.window, num_tokens));
  return Status::Ok();
}

Status CheckSize(std::span<const float> s, size_t want, const char* name, bool optional) {
  if (optional && s.empty()) return Status::Ok();
  if (s.size() != want) {
    return Status::InvalidArgument(
        fmt::format("attention: {} has {} floats, expected {}", name, s.size(), want));
  }
  return Status::Ok();
}

// A NaN or infinite query value makes its head's scores NaN, which the
// softmax cannot order: an error naming the value, not garbage out.
// `unit` names what q is split into first (query token, or sequence).
Status CheckQueryFinite(std::span<const float> q, uint32_t heads, uint32_t head_dim,
                        const char* unit) {
  const size_t i = format_internal::FirstNonFinite(q.data(), q.size());
  if (i == q.size()) return Status::Ok();
  const size_t per_unit = static_cast<size_t>(heads) * head_dim;
  return Status::InvalidArgument(
      fmt::format("attention: query value {} is {} ({} {}, q head {}, dim {})", i, q[i], unit,
                  i / per_unit, (i % per_unit) / head_dim, i % head_dim));
}

float EffectiveScale(const AttentionOptions& o, uint32_t head_dim) {
  return o.scale > 0.0f ? o.scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

// Adds the jobs for one sequence (all kv heads) to the plan. q/out/lse/probs
// are laid out [n_queries][n_q_heads][...], kv_probs [n_kv_heads][num_tokens].
// Kv head h attends with windows[h] (empty: the options' window for every
// head). Returns nothing: inputs checked.
void AddSequence(Plan& plan, const LayerKvView& view, uint32_t n_queries, const float* q,
                 const AttentionOptions& options, std::span<const HeadWindow> windows,
                 float* out, float* lse, float* probs, float* kv_probs) {
  const uint32_t d = view.head_dim;
  const uint32_t n_q_heads = options.n_q_heads;
  const uint32_t group = n_q_heads / view.n_kv_heads;
  for (uint32_t h = 0; h < view.n_kv_heads; ++h) {
    HeadJob job;
    job.view = &view;
    job.head = h;
    job.rows = view.rows(h);
    const HeadWindow w = windows.empty() ? HeadWindow{options.window, options.n_sink} : windows[h];
    job.window = w.window;
    job.n_sink = w.n_sink;
    const RowTransform* kt = view.k.transforms ? &view.k.transforms[h] : nullptr;
    const RowTransform* vt = view.v.transforms ? &view.v.transforms[h] : nullptr;
    const bool no_transforms = (kt == nullptr || kt->empty()) && (vt == nullptr || vt->empty());
    job.exact = view.k.format == Format::kF32 && view.v.format == Format::kF32 && no_transforms;
    job.has_bias = kt != nullptr && !kt->mean.empty();
    job.first_query = static_cast<uint32_t>(plan.queries.size());
    job.nq = n_queries * group;
    job.kv_probs = kv_probs == nullptr ? nullptr : kv_probs + static_cast<size_t>(h) * view.num_tokens;
    for (uint32_t t = 0; t < n_queries; ++t) {
      for (uint32_t g = 0; g < group; ++g) {
        const size_t qh = static_cast<size_t>(t) * n_q_heads + h * group + g;
        QueryVec qv;
        qv.q = q + qh * d;  // original; replaced by the prepared copy below
        qv.qpos = view.num_tokens - n_queries + t;
        qv.out = out + qh * d;
        qv.lse = lse ? lse + qh : nullptr;
        qv.probs = probs ? probs + qh * view.num_tokens : nullptr;
        if (job.has_bias) {
          double dot = 0.0;
          for (uint32_t i = 0; i < d; ++i) dot += static_cast<double>(qv.q[i]) * kt->mean[i];
          qv.bias = static_cast<float>(dot * plan.scale);
        }
        plan.queries.push_back(qv);
      }
    }
    plan.jobs.push_back(job);
  }
}

// Copies every query into prepared_q (column scales, rotation, zero padding)
// and repoints QueryVec::q at the copies. The copies start on 64-byte
// boundaries (padded_dim is a multiple of 16 floats): the float K pass loads
// every query block once per stored row, and a 512-bit load that straddles
// two cache lines costs two loads.
void PrepareQueries(Plan& plan) {
  const uint32_t d = plan.head_dim, pd = plan.padded_dim;
  constexpr size_t kAlignFloats = 64 / sizeof(float);
  plan.prepared_q.assign(plan.queries.size() * pd + kAlignFloats, 0.0f);
  const size_t misalign = reinterpret_cast<uintptr_t>(plan.prepared_q.data()) % 64 / sizeof(float);
  float* const base = plan.prepared_q.data() + (kAlignFloats - misalign) % kAlignFloats;
  for (const HeadJob& job : plan.jobs) {
    const KvSideView& k = job.view->k;
    const RowTransform* kt = k.transforms ? &k.transforms[job.head] : nullptr;
    for (uint32_t i = 0; i < job.nq; ++i) {
      QueryVec& qv = plan.queries[job.first_query + i];
      float* dst = base + static_cast<size_t>(job.first_query + i) * pd;
      std::memcpy(dst, qv.q, d * sizeof(float));
      if (kt != nullptr && !kt->col_scale.empty()) {
        for (uint32_t j = 0; j < d; ++j) dst[j] *= kt->col_scale[j];
      }
      if (IsRotated(k.format)) k.codec->Rotate(dst);
      if (attention_internal::UsesNibbleOrder(k.format)) attention_internal::ToNibbleOrder(dst, d);
      qv.q = dst;
    }
  }
}

Plan NewPlan(const AttentionOptions& options, uint32_t head_dim) {
  Plan plan;
  plan.head_dim = head_dim;
  plan.padded_dim = PaddedDim(head_dim);
  plan.scale = EffectiveScale(options, head_dim);
  plan.pool = options.pool;
  plan.int_keys = !options.float_query_keys;
  plan.int8_keys = options.int8_query_keys;
  return plan;
}

// A view with a precision window attends in two parts in one plan: its own
// rows and the window's (each a plain job per kv head, with its own lse),
// then MergeParts folds them as one softmax over both:
//   m = max(lse_0, lse_1), w_i = exp(lse_i - m) / sum_i exp(lse_i - m),
//   out = w_0 out_0 + w_1 out_1, lse = m + log(sum_i exp(lse_i - m)),
// the split-softmax combine of flash-decoding, exact up to rounding.
struct PartOutput {
  std::vector<float> out, lse, probs;
};

void AddParts(Plan& plan, const LayerKvView& view, uint32_t n_queries, const float* q,
              const AttentionOptions& options, bool want_probs, PartOutput parts[2]) {
  const size_t qd = static_cast<size_t>(n_queries) * options.n_q_heads;
  const LayerKvView* views[2] = {&view, view.hot};
  // The window's rows: each query's last `recent` positions and the sinks,
  // as a sliding window over its slots (kv_view.h).
  const std::vector<HeadWindow> hot_windows(view.n_kv_heads,
                                            HeadWindow{view.recent, view.first_position});
  for (int i = 0; i < 2; ++i) {
    parts[i].out.assign(qd * view.head_dim, 0.0f);
    parts[i].lse.assign(qd, 0.0f);
    if (want_probs) parts[i].probs.assign(qd * view.num_tokens, 0.0f);
    AddSequence(plan, *views[i], n_queries, q, options,
                i == 1 && view.recent != 0 ? std::span<const HeadWindow>(hot_windows)
                                           : std::span<const HeadWindow>(),
                parts[i].out.data(), parts[i].lse.data(),
                want_probs ? parts[i].probs.data() : nullptr, nullptr);
  }
}

// Row r of the window's probabilities `ph` of kv head h, added at its
// position into p ([num_tokens]) with weight w.
void AddWindowProbs(const LayerKvView& hot, uint32_t h, const float* ph, float w, float* p) {
  for (uint32_t r = 0; r < hot.rows(h); ++r) {
    const uint32_t pos = hot.position(h, r);
    if (pos < hot.num_tokens) p[pos] += w * ph[r];
  }
}

// Folds the parts into the caller's outputs (lse, probs, kv_probs may be null).
void MergeParts(const LayerKvView& view, uint32_t n_queries, uint32_t n_q_heads,
                const PartOutput parts[2], float* out, float* lse, float* probs,
                float* kv_probs) {
  const uint32_t d = view.head_dim, N = view.num_tokens, group = n_q_heads / view.n_kv_heads;
  const size_t qd = static_cast<size_t>(n_queries) * n_q_heads;
  const bool want_probs = !parts[0].probs.empty();
  std::vector<float> row(want_probs ? N : 0);
  if (kv_probs) std::fill(kv_probs, kv_probs + size_t{view.n_kv_heads} * N, 0.0f);
  for (size_t qh = 0; qh < qd; ++qh) {
    const float l0 = parts[0].lse[qh], l1 = parts[1].lse[qh];
    const float m = std::max(l0, l1);
    float w0 = 0.0f, w1 = 0.0f, sum = 0.0f;
    if (m != -std::numeric_limits<float>::infinity()) {
      w0 = std::exp(l0 - m);
      w1 = std::exp(l1 - m);
      sum = w0 + w1;
      w0 /= sum;
      w1 /= sum;
    }
    for (uint32_t i = 0; i < d; ++i) {
      out[qh * d + i] = w0 * parts[0].out[qh * d + i] + w1 * parts[1].out[qh * d + i];
    }
    if (lse) lse[qh] = sum > 0.0f ? m + std::log(sum) : m;
    if (!want_probs) continue;
    const uint32_t h = static_cast<uint32_t>(qh % n_q_heads) / group;
    for (uint32_t r = 0; r < N; ++r) row[r] = w0 * parts[0].probs[qh * N + r];
    AddWindowProbs(*view.hot, h, parts[1].probs.data() + qh * N, w1, row.data());
    if (probs) std::copy(row.begin(), row.end(), probs + qh * N);
    if (kv_probs) {
      for (uint32_t r = 0; r < N; ++r) kv_probs[size_t{h} * N + r] += row[r];
    }
  }
}

// AttendMulti, with per-head windows when `windows` is not empty
// (AttendHeadWindows), and with profile non-null its profiled twin (plan.h
// RunPlanProfiled).
Status AttendMultiImpl(const LayerKvView& view, uint32_t n_queries, std::span<const float> q,
                       const AttentionOptions& options, std::span<const HeadWindow> windows,
                       const AttentionOutput& output, AttentionPassProfile* profile) {
  KV_RETURN_IF_ERROR(CheckView(view));
  KV_RETURN_IF_ERROR(CheckOptions(options, view.n_kv_heads, view.num_tokens, windows));
  if (n_queries == 0 || n_queries > view.num_tokens) {
    return Status::InvalidArgument(fmt::format(
        "attention: {} query tokens, but the cache holds {} positions (queries are its last "
        "positions)",
        n_queries, view.num_tokens));
  }
  const size_t qd = static_cast<size_t>(n_queries) * options.n_q_heads;
  KV_RETURN_IF_ERROR(CheckSize(q, qd * view.head_dim, "query", false));
  KV_RETURN_IF_ERROR(CheckQueryFinite(q, options.n_q_heads, view.head_dim, "query token"));
  KV_RETURN_IF_ERROR(CheckSize(output.out, qd * view.head_dim, "out", false));
  KV_RETURN_IF_ERROR(CheckSize(output.lse, qd, "lse", true));
  KV_RETURN_IF_ERROR(CheckSize(output.probs, qd * view.num_tokens, "probs", true));
  KV_RETURN_IF_ERROR(CheckSize(output.kv_probs,
                               static_cast<size_t>(view.n_kv_heads) * view.num_tokens,
                               "kv_probs", true));
  if (view.hot && (!windows.empty() || options.window != 0)) {
    return Status::InvalidArgument(
        "attention: a sliding window does not combine with a precision window");
  }
  auto ptr = [](std::span<float> x) { return x.empty() ? nullptr : x.data(); };
  Plan plan = NewPlan(options, view.head_dim);
  PartOutput parts[2];
  if (view.hot) {
    AddParts(plan, view, n_queries, q.data(), options,
             !output.probs.empty() || !output.kv_probs.empty(), parts);
  } else {
    AddSequence(plan, view, n_queries, q.data(), options, windows, output.out.data(),
                ptr(output.lse), ptr(output.probs), ptr(output.kv_probs));
  }
  PrepareQueries(plan);
  if (profile != nullptr) {
    attention_internal::RunPlanProfiled(plan, profile);
  } else {
    attention_internal::RunPlan(plan);
  }
  if (view.hot) {
    MergeParts(view, n_queries, options.n_q_heads, parts, output.out.data(), ptr(output.lse),
               ptr(output.probs), ptr(output.kv_probs));
  }
  return Status::Ok();
}

}  // namespace

Status AttendMulti(const LayerKvView& view, uint32_t n_queries, std::span<const float> q,
                   const AttentionOptions& options, const AttentionOutput& output) {
  return AttendMultiImpl(view, n_queries, q, options, {}, output, nullptr);
}

Status AttendMultiProfiled(const LayerKvView& view, uint32_t n_queries, std::span<const float> q,
                           const AttentionOptions& options, const AttentionOutput& output,
                           AttentionPassProfile* profile) {
  if (profile == nullptr) return Status::InvalidArgument("attention: no profile to fill");
  return AttendMultiImpl(view, n_queries, q, options, {}, output, profile);
}

namespace attention_internal {
Status AttendHeadWindows(const LayerKvView& view, uint32_t n_queries, std::span<const float> q,
                         const AttentionOptions& options, std::span<const HeadWindow> windows,
                         const AttentionOutput& output) {
  if (windows.empty()) return Status::InvalidArgument("attention: no head windows");
  return AttendMultiImpl(view, n_queries, q, options, windows, output, nullptr);
}
}  // namespace attention_internal

Status AttendDecode(const LayerKvView& view, std::span<const float> q,
                    const AttentionOptions& options, const AttentionOutput& output) {
  return AttendMulti(view, 1, q, options, output);
}

namespace {

// Kv head `h` of `view` as a view of one kv head: the same rows, positions,
// transforms and codec, addressed from that head's storage. Its precision
// window (if any) is cut the same way into `hot`, which must outlive the
// result.
LayerKvView OneHeadView(const LayerKvView& view, uint32_t h, LayerKvView* hot) {
  LayerKvView one = view;
  one.n_kv_heads = 1;
  if (view.head_len != nullptr) one.head_len = view.head_len + h;
  if (view.positions != nullptr) one.positions = view.positions + h;
  for (KvSideView* side : {&one.k, &one.v}) {
    if (side->head_base != nullptr) {
      side->head_base += h;
    } else if (side->base != nullptr) {
      side->base += static_cast<size_t>(h) * side->head_stride;
    }
    if (side->transforms != nullptr) side->transforms += h;
  }
  if (view.hot != nullptr) {
    *hot = OneHeadView(*view.hot, h, nullptr);
    one.hot = hot;
  }
  return one;
}

}  // namespace

Status AttendDecodeHead(const LayerKvView& view, uint32_t kv_head, std::span<const float> q,
                        const AttentionOptions& options, const AttentionOutput& output) {
  KV_RETURN_IF_ERROR(CheckView(view));
  KV_RETURN_IF_ERROR(CheckOptions(options, view.n_kv_heads, view.num_tokens));
  if (kv_head >= view.n_kv_heads) {
    return Status::OutOfRange(fmt::format("attention: kv head {} out of range (the view has {})",
                                          kv_head, view.n_kv_heads));
  }
  // The query, out, lse and the window are checked by the one-head call
  // below, before it writes anything; probs and kv_probs here, since they
  // may hold the head's stored rows or be padded to num_tokens.
  const uint32_t group = options.n_q_heads / view.n_kv_heads;
  const uint32_t n = view.num_tokens, rows = view.rows(kv_head);
  const bool padded_probs = output.probs.size() == size_t{group} * n;
  if (!padded_probs) KV_RETURN_IF_ERROR(CheckSize(output.probs, size_t{group} * rows, "probs", true));
  const bool padded_kv = output.kv_probs.size() == n;
  if (!padded_kv) KV_RETURN_IF_ERROR(CheckSize(output.kv_probs, rows, "kv_probs", true));

  LayerKvView hot;
  const LayerKvView one = OneHeadView(view, kv_head, &hot);
  AttentionOptions one_options = options;
  one_options.n_q_heads = group;
  // The one-head call writes probabilities padded to num_tokens: straight
  // into a padded (or absent) buffer; through a scratch copy into a buffer
  // of the head's rows, which gets the first `rows` of each.
  std::vector<float> probs_scratch(padded_probs || output.probs.empty() ? 0 : size_t{group} * n);
  std::vector<float> kv_scratch(padded_kv || output.kv_probs.empty() ? 0 : n);
  const AttentionOutput one_output{
      output.out, output.lse,
      probs_scratch.empty() ? output.probs : std::span<float>(probs_scratch),
      kv_scratch.empty() ? output.kv_probs : std::span<float>(kv_scratch)};
  KV_RETURN_IF_ERROR(AttendMultiImpl(one, 1, q, one_options, {}, one_output, nullptr));
  for (uint32_t g = 0; g < group && !probs_scratch.empty(); ++g) {
    const float* src = probs_scratch.data() + size_t{g} * n;
    std::copy(src, src + rows, output.probs.data() + size_t{g} * rows);
  }
  if (!kv_scratch.empty()) std::copy_n(kv_scratch.begin(), rows, output.kv_probs.begin());
  return Status::Ok();
}

Status AttendDecodeBatch(std::span<const LayerKvView> views, std::span<const float> q,
                         const AttentionOptions& options, std::span<float> out,
                         std::span<float> lse) {
  if (views.empty()) return Status::InvalidArgument("attention: no sequences in the batch");
  const uint32_t n_kv = views[0].n_kv_heads, d = views[0].head_dim;
  for (size_t s = 0; s < views.size(); ++s) {
    const Status st = CheckView(views[s]);
    if (!st.ok()) {
      return Status(st.code(), fmt::format("sequence {}: {}", s, st.message()));
    }
    if (views[s].n_kv_heads != n_kv || views[s].head_dim != d) {
      return Status::InvalidArgument(fmt::format(
          "attention: sequence {} has n_kv_heads {} / head_dim {}, sequence 0 has {} / {}", s,
          views[s].n_kv_heads, views[s].head_dim, n_kv, d));
    }
    KV_RETURN_IF_ERROR(CheckOptions(options, n_kv, views[s].num_tokens));
    if (views[s].hot && options.window != 0) {
      return Status::InvalidArgument(fmt::format(
          "attention: sequence {}: a sliding window does not combine with a precision window", s));
    }
  }
  const size_t per_seq = static_cast<size_t>(options.n_q_heads) * d;
  KV_RETURN_IF_ERROR(CheckSize(q, views.size() * per_seq, "query", false));
  KV_RETURN_IF_ERROR(CheckQueryFinite(q, options.n_q_heads, d, "sequence"));
  KV_RETURN_IF_ERROR(CheckSize(out, views.size() * per_seq, "out", false));
  KV_RETURN_IF_ERROR(CheckSize(lse, views.size() * options.n_q_heads, "lse", true));
  Plan plan = NewPlan(options, d);
  std::vector<PartOutput> parts;  // two per sequence with a precision window
  for (const LayerKvView& v : views) parts.resize(parts.size() + (v.hot ? 2 : 0));
  size_t next_part = 0;
  for (size_t s = 0; s < views.size(); ++s) {
    if (views[s].hot) {
      AddParts(plan, views[s], 1, q.data() + s * per_seq, options, false, &parts[next_part]);
      next_part += 2;
      continue;
    }
    AddSequence(plan, views[s], 1, q.data() + s * per_seq, options, {}, out.data() + s * per_seq,
                lse.empty() ? nullptr : lse.data() + s * options.n_q_heads, nullptr, nullptr);
  }
  PrepareQueries(plan);
  attention_internal::RunPlan(plan);
  next_part = 0;
  for (size_t s = 0; s < views.size(); ++s) {
    if (!views[s].hot) continue;
    MergeParts(views[s], 1, options.n_q_heads, &parts[next_part], out.data() + s * per_seq,
               lse.empty() ? nullptr : lse.data() + s * options.n_q_heads, nullptr, nullptr);
    next_part += 2;
  }
  return Status::Ok();
}

}  // namespace kvcache
