// SequenceCache::Append, AppendLayer and AdvanceLen (include/kvcache/cache.h):
// the one append path, in three steps.
//
//   plan    check the input, name the heads that store rows (AppendPlan);
//   encode  the store makes room (AppendGuard: grown buffers, fresh and
//           copied-on-write blocks, all or nothing), then every alive
//           head's rows are encoded in place through Rows();
//   commit  metadata and calibration, then the store's commit.
//
// Encoding is the only step that can fail after room was acquired
// (non-finite input, a format not implemented); the guard then undoes the
// store's step, and metadata was never touched: on any failure nothing
// changes. New calibration (heads that start now) waits in
// PendingTransforms until commit.
//
// The one-token path (decode) is hot: per layer and side one RowAddressing,
// one finiteness check and one dispatched encode for all alive heads; no
// allocation once its thread-local scratch has grown.
//
// Thread safety: as cache.h (mutating calls; the scratch is per thread).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "cache/cache_state.h"
#include "format/format_internal.h"
#include "kvcache/cache.h"

namespace kvcache {
namespace {

using State = SequenceCache::State;

// Drives RowStore's append protocol: what Acquire took is undone when the
// guard goes out of scope, unless Commit ran.
class AppendGuard {
 public:
  explicit AppendGuard(RowStore& store) : store_(store) {}
  AppendGuard(const AppendGuard&) = delete;
  AppendGuard& operator=(const AppendGuard&) = delete;
  ~AppendGuard() {
    if (armed_) store_.UndoAppend();
  }

  Status Acquire(const AppendPlan& plan, std::span<const LayerMeta> layers) {
    KV_RETURN_IF_ERROR(store_.AcquireForAppend(plan, layers));
    armed_ = true;
    return Status::Ok();
  }
  void Commit(std::span<const LayerMeta> layers) {
    store_.CommitAppend(layers);
    armed_ = false;
  }

 private:
  RowStore& store_;
  bool armed_ = false;
};

// Calibration made by this append, per (layer of the plan, side); the
// layers' own transforms where it made none.
class PendingTransforms {
 public:
  PendingTransforms(const State& s, const AppendPlan& plan) : s_(s), plan_(plan) {}

  const Transforms& of(uint32_t li, int side) const {
    for (const auto& [key, t] : made_) {
      if (key == Key(li, side)) return t;
    }
    return s_.layers[plan_.first_layer + li].transforms[side];
  }
  // Calibrates head h of (li, side) on its first rows.
  void Calibrate(uint32_t li, int side, uint32_t h, std::span<const float> rows) {
    RowTransform t = s_.codec[side]->Calibrate(rows);
    if (t.empty()) return;
    for (auto& [key, v] : made_) {
      if (key == Key(li, side)) {
        v = WithTransform(v, plan_.n_kv_heads, h, std::move(t));
        return;
      }
    }
    made_.emplace_back(Key(li, side), WithTransform(of(li, side), plan_.n_kv_heads, h, std::move(t)));
  }
  void Commit(State& s) {
    for (auto& [key, t] : made_) {
      s.layers[plan_.first_layer + key / kSides].transforms[key % kSides] = std::move(t);
    }
  }

 private:
  static size_t Key(uint32_t li, int side) { return size_t{li} * kSides + side; }
  const State& s_;
  const AppendPlan& plan_;
  std::vector<std::pair<size_t, Transforms>> made_;
};

Result<AppendPlan> PlanAppend(const State& s, uint32_t l0, uint32_t nl, uint32_t T,
                              std::span<const uint8_t> alive) {
  const uint32_t H = s.geometry.n_kv_heads();
  if (!alive.empty() && alive.size() != H && alive.size() != size_t{nl} * H) {
    return Status::InvalidArgument(fmt::format(
        "cache: alive mask has {} entries, want {} or {}", alive.size(), H, size_t{nl} * H));
  }
  if (s.window && std::find(alive.begin(), alive.end(), 0) != alive.end()) {
    return Status::FailedPrecondition(
        "cache: a precision window needs every head to store every position (dead heads in the "
        "alive mask)");
  }
  for (uint32_t li = 0; li < nl; ++li) {
    if (s.layers[l0 + li].num_tokens + uint64_t{T} > kMaxCacheTokens) {
      return Status::CapacityExceeded(fmt::format("cache: more than {} tokens", kMaxCacheTokens));
    }
  }
  return AppendPlan{l0, nl, T, H, alive};
}

// Per-thread scratch of the one-token path, grown once.
struct TokenScratch {
  std::vector<uint32_t> heads;
  std::vector<uint8_t*> dst;
  std::vector<const RowTransform*> tf;
  std::vector<float> rows;
};

// One token, one layer and side: the n alive heads' rows sc.heads[0..n) of
// src ([H][D]), checked once and encoded with one dispatch, each into its slot.
Status EncodeTokenSide(const State& s, const AppendPlan& plan, uint32_t li, int side,
                       const float* src, uint32_t n, PendingTransforms& made, TokenScratch& sc) {
  const uint32_t D = s.geometry.head_dim(), l = plan.first_layer + li;
  const LayerMeta& lm = s.layers[l];
  const RowCodec& codec = *s.codec[side];
  const float* x = src;
  if (n != plan.n_kv_heads) {  // the alive heads' rows, packed
    sc.rows.resize(size_t{n} * D);
    for (uint32_t j = 0; j < n; ++j) {
      std::memcpy(sc.rows.data() + size_t{j} * D, src + size_t{sc.heads[j]} * D, D * sizeof(float));
    }
    x = sc.rows.data();
  }
  if (const size_t i = format_internal::FirstNonFinite(x, size_t{n} * D); i != size_t{n} * D) {
    return Status::InvalidArgument(fmt::format("encode {}: non-finite value at row 0, index {}",
                                               FormatName(codec.format()), i % D));
  }
  for (uint32_t j = 0; j < n; ++j) {
    if (lm.head_len[sc.heads[j]] == 0) made.Calibrate(li, side, sc.heads[j], {x + size_t{j} * D, D});
  }
  const Transforms& tfv = made.of(li, side);
  const RowAddressing<uint8_t> rows = s.store->Rows(l, side);
  // Heads of equal length share the row's offset: one lookup (and one
  // division by the block size) per distinct length.
  uint32_t last_len = UINT32_MAX;
  size_t offset = 0;
  for (uint32_t j = 0; j < n; ++j) {
    const uint32_t h = sc.heads[j];
    if (lm.head_len[h] != last_len) {
      last_len = lm.head_len[h];
      offset = rows.offset(last_len);
    }
    sc.dst[j] = rows.at(h, offset);
    sc.tf[j] = (tfv && !(*tfv)[h].empty()) ? &(*tfv)[h] : nullptr;
  }
  return format_internal::EncodeHeadRows(codec, n, x, sc.dst.data(), tfv ? sc.tf.data() : nullptr);
}

// One token for every layer of the plan; k, v: [n_layers][H][D].
Status EncodeToken(const State& s, const AppendPlan& plan, const float* const src[kSides],
                   PendingTransforms& made) {
  const uint32_t H = plan.n_kv_heads;
  const size_t kv_dim = size_t{H} * s.geometry.head_dim();
  thread_local TokenScratch sc;
  sc.heads.resize(H);
  sc.dst.resize(H);
  sc.tf.resize(H);
  for (uint32_t li = 0; li < plan.n_layers; ++li) {
    uint32_t n = 0;
    for (uint32_t h = 0; h < H; ++h) {
      if (plan.is_alive(li, h)) sc.heads[n++] = h;
    }
    for (int side = 0; side < kSides && n > 0; ++side) {
      KV_RETURN_IF_ERROR(EncodeTokenSide(s, plan, li, side, src[side] + li * kv_dim, n, made, sc));
    }
  }
  return Status::Ok();
}

// Rows [T][D] of head h of plan layer li from src ([n_layers][T][H][D], or
// nullptr for zeros), gathered into s.scratch unless they lie together.
std::span<const float> HeadRows(State& s, const AppendPlan& plan, const float* src, uint32_t li,
                                uint32_t h) {
  const uint32_t T = plan.n_tokens, D = s.geometry.head_dim();
  const size_t kv_dim = size_t{plan.n_kv_heads} * D;
  if (src != nullptr && T == 1) return {src + size_t{li} * kv_dim + size_t{h} * D, D};
  s.scratch.resize(size_t{T} * D);
  if (src == nullptr) {
    std::fill(s.scratch.begin(), s.scratch.end(), 0.0f);
  } else {
    for (uint32_t t = 0; t < T; ++t) {
      std::memcpy(s.scratch.data() + size_t{t} * D,
                  src + (size_t{li} * T + t) * kv_dim + size_t{h} * D, D * sizeof(float));
    }
  }
  return {s.scratch.data(), size_t{T} * D};
}

// Any number of tokens (prefill chunks, zero rows): one RowCodec::Encode per
// head, side and stretch of rows that lie together.
Status EncodeChunk(State& s, const AppendPlan& plan, const float* const src[kSides],
                   PendingTransforms& made) {
  const uint32_t T = plan.n_tokens, D = s.geometry.head_dim();
  for (uint32_t li = 0; li < plan.n_layers; ++li) {
    const uint32_t l = plan.first_layer + li;
    for (uint32_t h = 0; h < plan.n_kv_heads; ++h) {
      for (int side = 0; side < kSides && plan.is_alive(li, h); ++side) {
        const std::span<const float> rows = HeadRows(s, plan, src[side], li, h);
        const uint32_t a = s.layers[l].head_len[h];
        if (a == 0) made.Calibrate(li, side, h, rows);
        const Transforms& tfv = made.of(li, side);
        const RowTransform* tf = (tfv && !(*tfv)[h].empty()) ? &(*tfv)[h] : nullptr;
        const RowAddressing<uint8_t> dst = s.store->Rows(l, side);
        for (uint32_t r = a; r < a + T;) {
          const uint32_t cnt = std::min(dst.run(r), a + T - r);
          KV_RETURN_IF_ERROR(s.codec[side]->Encode(rows.subspan(size_t{r - a} * D, size_t{cnt} * D),
                                                   {dst.row(h, r), size_t{cnt} * dst.row_bytes}, tf));
          r += cnt;
        }
      }
    }
  }
  return Status::Ok();
}

// Lengths, positions and importance of the plan's layers after the append.
void CommitRows(State& s, const AppendPlan& plan) {
  const uint32_t T = plan.n_tokens, H = plan.n_kv_heads;
  for (uint32_t li = 0; li < plan.n_layers; ++li) {
    LayerMeta& lm = s.layers[plan.first_layer + li];
    bool any_dead = false;
    for (uint32_t h = 0; h < H; ++h) any_dead |= !plan.is_alive(li, h);
    if (any_dead) MaterializePositions(lm);
    for (uint32_t h = 0; h < H; ++h) {
      if (!plan.is_alive(li, h)) continue;
      if (lm.has_positions()) {
        for (uint32_t t = 0; t < T; ++t) lm.positions[h].push_back(lm.num_tokens + t);
      }
      lm.head_len[h] += T;
      if (lm.has_importance()) lm.head_imp[h].resize(lm.head_len[h], 0.0f);
    }
    lm.num_tokens += T;
    if (lm.has_importance()) lm.pos_imp.resize(lm.num_tokens, 0.0f);
  }
}

// The one append path. k, v: [nl][T][H][D] (nullptr = zero rows); alive as
// documented in AppendOptions, indexed relative to first layer l0.
Status AppendRows(State& s, uint32_t l0, uint32_t nl, const float* k, const float* v, uint32_t T,
                  std::span<const uint8_t> alive) {
  KV_ASSIGN_OR_RETURN(const AppendPlan plan, PlanAppend(s, l0, nl, T, alive));
  AppendGuard guard(*s.store);
  KV_RETURN_IF_ERROR(guard.Acquire(plan, s.layers));
  PendingTransforms made(s, plan);
  const float* const src[kSides] = {k, v};
  KV_RETURN_IF_ERROR(T == 1 && k != nullptr && v != nullptr ? EncodeToken(s, plan, src, made)
                                                            : EncodeChunk(s, plan, src, made));
  if (s.window) {  // the rows are known finite now
    const size_t layer_floats = size_t{T} * s.geometry.kv_dim();
    for (uint32_t li = 0; li < nl; ++li) {
      s.window->Append(l0 + li, s.layers[l0 + li].num_tokens, T, k ? k + li * layer_floats : nullptr,
                       v ? v + li * layer_floats : nullptr);
    }
  }
  CommitRows(s, plan);
  made.Commit(s);
  guard.Commit(s.layers);
  s.Touch();
  return Status::Ok();
}

}  // namespace

Status SequenceCache::Append(std::span<const float> k, std::span<const float> v,
                             const AppendOptions& options) {
  State& s = *s_;
  if (s.released) return UsedAfterRelease();
  const size_t per_token = size_t{s.geometry.n_layers()} * s.geometry.kv_dim();
  if (k.size() != v.size() || k.empty() || k.size() % per_token != 0) {
    return Status::InvalidArgument(fmt::format(
        "cache: append wants k and v of equal size n_tokens * {} (n_layers * n_kv_heads * "
        "head_dim), got {} and {}",
        per_token, k.size(), v.size()));
  }
  const uint32_t T =
      static_cast<uint32_t>(std::min<size_t>(k.size() / per_token, kMaxCacheTokens + 1u));
  return AppendRows(s, 0, s.geometry.n_layers(), k.data(), v.data(), T, options.alive);
}

Status SequenceCache::AppendLayer(uint32_t layer, std::span<const float> k,
                                  std::span<const float> v, const AppendOptions& options) {
  State& s = *s_;
  if (s.released) return UsedAfterRelease();
  if (layer >= s.geometry.n_layers()) {
    return Status::OutOfRange(fmt::format("cache: layer {} of {}", layer, s.geometry.n_layers()));
  }
  const size_t per_token = s.geometry.kv_dim();
  if (k.size() != v.size() || k.empty() || k.size() % per_token != 0) {
    return Status::InvalidArgument(fmt::format(
        "cache: layer append wants k and v of equal size n_tokens * {} (n_kv_heads * head_dim), "
        "got {} and {}",
        per_token, k.size(), v.size()));
  }
  if (options.alive.size() > s.geometry.n_kv_heads()) {
    return Status::InvalidArgument(
        fmt::format("cache: layer alive mask has {} entries, want {}", options.alive.size(),
                    s.geometry.n_kv_heads()));
  }
  const uint32_t T =
      static_cast<uint32_t>(std::min<size_t>(k.size() / per_token, kMaxCacheTokens + 1u));
  return AppendRows(s, layer, 1, k.data(), v.data(), T, options.alive);
}

Status SequenceCache::AdvanceLen(uint32_t n) {
  State& s = *s_;
  if (s.released) return UsedAfterRelease();
  if (n == 0) return Status::Ok();
  return AppendRows(s, 0, s.geometry.n_layers(), nullptr, nullptr, n, {});
}

}  // namespace kvcache
