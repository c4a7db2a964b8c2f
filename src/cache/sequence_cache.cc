// SequenceCache: appends, rollback, fork/clone, reservations and views for
// both layouts (contracts in include/kvcache/cache.h, state in cache_state.h).
//
// Failure atomicity: every mutating operation first computes what it needs
// (lengths, capacities, blocks), acquires it all or fails, then writes. The
// only step that can fail after acquiring is encoding (non-finite input, a
// format not implemented); it is undone: copied-on-write and fresh blocks go
// back (into the reservation they came from), grown buffers are dropped and
// metadata is untouched because it is committed last.
#include "kvcache/cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "cache/cache_state.h"
#include "format/format_internal.h"

namespace kvcache {
namespace {

constexpr uint32_t kMaxTokens = 1u << 30;
constexpr int kSides = 2;
constexpr Side kSideOf[2] = {Side::kKey, Side::kValue};

uint32_t CeilDiv(uint32_t a, uint32_t b) { return (a + b - 1) / b; }

Status Released() {
  return Status::FailedPrecondition("cache: used after Release()");
}

// Returns a copy of `v` (or n empty transforms) with entry h replaced.
std::shared_ptr<const std::vector<RowTransform>> WithTransform(
    const std::shared_ptr<const std::vector<RowTransform>>& v, uint32_t n, uint32_t h,
    RowTransform t) {
  auto out = v ? std::make_shared<std::vector<RowTransform>>(*v)
               : std::make_shared<std::vector<RowTransform>>(n);
  (*out)[h] = std::move(t);
  bool any = false;
  for (const RowTransform& x : *out) any |= !x.empty();
  if (!any) return nullptr;
  return out;
}

}  // namespace

// --- creation and lifetime -------------------------------------------------

SequenceCache::SequenceCache(std::unique_ptr<State> state) : s_(std::move(state)) {}
SequenceCache::SequenceCache(SequenceCache&& other) noexcept = default;
SequenceCache& SequenceCache::operator=(SequenceCache&& other) noexcept {
  if (this != &other) {
    if (s_) Release();
    s_ = std::move(other.s_);
  }
  return *this;
}
SequenceCache::~SequenceCache() {
  if (s_) Release();
}

namespace {
std::unique_ptr<SequenceCache::State> NewState(const Geometry& g, FormatPair f,
                                               CacheLayout layout) {
  auto st = std::make_unique<SequenceCache::State>(g);
  st->formats = f;
  st->layout = layout;
  st->layers.resize(g.n_layers());
  for (LayerMeta& l : st->layers) l.head_len.assign(g.n_kv_heads(), 0);
  st->row_bytes[0] = RowBytes(f.k, g.head_dim());
  st->row_bytes[1] = RowBytes(f.v, g.head_dim());
  if (layout == CacheLayout::kContiguous) {
    st->store.resize(g.n_layers());
    for (ContiguousLayer& c : st->store)
      for (int s = 0; s < kSides; ++s) c.heads[s].resize(g.n_kv_heads());
  }
  st->Touch();
  return st;
}
}  // namespace

Result<SequenceCache> SequenceCache::CreateContiguous(const Geometry& geometry, FormatPair formats,
                                                      const ContiguousOptions& options) {
  KV_ASSIGN_OR_RETURN(RowCodec kc, RowCodec::Create(formats.k, geometry.head_dim(), Side::kKey,
                                                    options.rotation_seed));
  KV_ASSIGN_OR_RETURN(RowCodec vc, RowCodec::Create(formats.v, geometry.head_dim(), Side::kValue,
                                                    options.rotation_seed));
  if (options.capacity_tokens > kMaxTokens) {
    return Status::InvalidArgument(
        fmt::format("cache: capacity_tokens {} exceeds {}", options.capacity_tokens, kMaxTokens));
  }
  auto st = NewState(geometry, formats, CacheLayout::kContiguous);
  st->codec[0] = std::make_shared<const RowCodec>(std::move(kc));
  st->codec[1] = std::make_shared<const RowCodec>(std::move(vc));
  st->contiguous = options;
  return SequenceCache(std::move(st));
}

Result<SequenceCache> SequenceCache::CreatePaged(std::shared_ptr<BlockPool> pool,
                                                 const PagedOptions& options) {
  if (!pool) return Status::InvalidArgument("cache: paged layout needs a pool");
  auto st = NewState(pool->geometry(), pool->formats(), CacheLayout::kPaged);
  st->codec[0] = pool->shared_codec(Side::kKey);
  st->codec[1] = pool->shared_codec(Side::kValue);
  st->pool = std::move(pool);
  SequenceCache cache(std::move(st));
  if (options.reserve_tokens > 0) {
    Status s = cache.Reserve(options.reserve_tokens);
    if (!s.ok()) {
      cache.Release();
      return s;
    }
  }
  return cache;
}

void SequenceCache::Release() {
  State& s = *s_;
  if (s.released) return;
  if (s.layout == CacheLayout::kPaged) {
    if (!s.table.empty()) {
      std::vector<uint32_t> back(s.table.rbegin(), s.table.rend());
      Status st = s.pool->Release(back);
      assert(st.ok());
      (void)st;
    }
    if (s.reserved > 0) s.pool->Unreserve(s.reserved);
    s.table.clear();
    s.maybe_shared.clear();
    s.reserved = 0;
    s.reserve_target = 0;
  } else {
    for (ContiguousLayer& c : s.store)
      for (int side = 0; side < kSides; ++side)
        for (HeadBuffer& b : c.heads[side]) b = HeadBuffer{};
  }
  for (LayerMeta& l : s.layers) {
    LayerMeta fresh;
    fresh.head_len.assign(s.geometry.n_kv_heads(), 0);
    l = std::move(fresh);
  }
  s.released = true;
  s.Touch();
}

void SequenceCache::ReleaseToPool() {
  if (s_->layout == CacheLayout::kPaged) Release();
}

// --- shape and accounting --------------------------------------------------

const Geometry& SequenceCache::geometry() const { return s_->geometry; }
FormatPair SequenceCache::formats() const { return s_->formats; }
CacheLayout SequenceCache::layout() const { return s_->layout; }
uint32_t SequenceCache::n_layers() const { return s_->geometry.n_layers(); }
uint32_t SequenceCache::n_kv_heads() const { return s_->geometry.n_kv_heads(); }
uint32_t SequenceCache::head_dim() const { return s_->geometry.head_dim(); }
uint32_t SequenceCache::block_size() const {
  return s_->layout == CacheLayout::kPaged ? s_->bs() : 0;
}
const std::shared_ptr<BlockPool>& SequenceCache::pool() const { return s_->pool; }
const RowCodec& SequenceCache::codec(Side side) const {
  return *s_->codec[static_cast<int>(side)];
}
bool SequenceCache::released() const { return s_->released; }

uint32_t SequenceCache::num_tokens() const { return s_->num_tokens(); }
uint32_t SequenceCache::num_tokens(uint32_t layer) const {
  return layer < s_->layers.size() ? s_->layers[layer].num_tokens : 0;
}
uint32_t SequenceCache::head_len(uint32_t layer, uint32_t head) const {
  if (layer >= s_->layers.size() || head >= s_->geometry.n_kv_heads()) return 0;
  return s_->layers[layer].head_len[head];
}

uint32_t SequenceCache::capacity_tokens() const {
  const State& s = *s_;
  if (s.released) return 0;
  if (s.layout == CacheLayout::kPaged) return static_cast<uint32_t>(s.table.size()) * s.bs();
  uint32_t m = UINT32_MAX;
  for (const ContiguousLayer& c : s.store)
    for (int side = 0; side < kSides; ++side)
      for (const HeadBuffer& b : c.heads[side])
        m = std::min(m, b.data ? b.cap : s.contiguous.capacity_tokens);
  return m == UINT32_MAX ? 0 : m;
}

size_t SequenceCache::allocated_bytes() const {
  const State& s = *s_;
  if (s.layout == CacheLayout::kPaged) return s.table.size() * s.pool->block_bytes();
  size_t total = 0;
  for (const ContiguousLayer& c : s.store)
    for (int side = 0; side < kSides; ++side)
      for (const HeadBuffer& b : c.heads[side]) total += size_t{b.cap} * s.row_bytes[side];
  return total;
}

size_t SequenceCache::used_bytes() const {
  const State& s = *s_;
  size_t rows = 0;
  for (const LayerMeta& l : s.layers)
    for (uint32_t x : l.head_len) rows += x;
  return rows * (s.row_bytes[0] + s.row_bytes[1]);
}

bool SequenceCache::is_within_planned_capacity() const {
  const State& s = *s_;
  if (s.released) return false;
  if (s.layout == CacheLayout::kContiguous) {
    return s.contiguous.capacity_tokens > 0 && !s.grew_past_plan;
  }
  return s.reserve_target > 0 && s.num_tokens() <= s.reserve_target && is_fully_reserved();
}

// --- reservations ------------------------------------------------------------

uint32_t BlocksNeeded(const SequenceCache::State& s, uint32_t target, bool assume_all_shared) {
  if (s.layout != CacheLayout::kPaged) return 0;
  const uint32_t tb = CeilDiv(target, s.bs());
  const uint32_t have = static_cast<uint32_t>(s.table.size());
  uint32_t need = tb > have ? tb - have : 0;
  const uint32_t from = s.min_rows() / s.bs();
  // A block marked maybe-shared may have become exclusive since (the other
  // holder, e.g. a fork's child, is gone): ask the pool, so that a
  // reservation never promises a copy-on-write that no write will need.
  // Exclusivity cannot be lost behind this sequence's back (another holder
  // appears only by Fork or a content hash, both of which mark the block).
  for (uint32_t i = from; i < std::min(have, tb); ++i) {
    need += (assume_all_shared || (s.maybe_shared[i] && !s.pool->IsExclusive(s.table[i]))) ? 1 : 0;
  }
  return need;
}

void TrimReservation(SequenceCache::State& s) {
  if (s.reserved == 0) return;
  const uint32_t need = BlocksNeeded(s, s.reserve_target, false);
  if (s.reserved > need) {
    s.pool->Unreserve(s.reserved - need);
    s.reserved = need;
  }
}

Status AllocateDrawingReservation(SequenceCache::State& s, std::span<uint32_t> fresh,
                                  uint32_t* from_reserved) {
  *from_reserved = std::min<uint32_t>(static_cast<uint32_t>(fresh.size()), s.reserved);
  KV_RETURN_IF_ERROR(s.pool->Allocate(fresh, *from_reserved));
  s.reserved -= *from_reserved;
  return Status::Ok();
}

void SwapInCopies(SequenceCache::State& s, std::span<const uint32_t> cow_idx,
                  std::span<const uint32_t> fresh, std::vector<uint32_t>* cow_old) {
  for (size_t j = 0; j < cow_idx.size(); ++j) {
    const uint32_t i = cow_idx[j];
    cow_old->push_back(s.table[i]);
    s.pool->CopyBlock(s.table[i], fresh[j]);
    s.table[i] = fresh[j];
    s.maybe_shared[i] = 0;
  }
}

Status SequenceCache::Reserve(uint32_t max_tokens) {
  State& s = *s_;
  if (s.released) return Released();
  if (s.layout != CacheLayout::kPaged) return Status::Ok();
  if (max_tokens > kMaxTokens) {
    return Status::InvalidArgument(fmt::format("cache: reserve of {} tokens", max_tokens));
  }
  const uint32_t need = BlocksNeeded(s, max_tokens, false);
  if (need > s.reserved) {
    KV_RETURN_IF_ERROR(s.pool->Reserve(need - s.reserved));
  } else if (need < s.reserved) {
    s.pool->Unreserve(s.reserved - need);
  }
  s.reserved = need;
  s.reserve_target = max_tokens;
  return Status::Ok();
}

uint32_t SequenceCache::reserved_blocks() const { return s_->reserved; }
uint32_t SequenceCache::reservation_target_tokens() const { return s_->reserve_target; }
bool SequenceCache::is_fully_reserved() const {
  const State& s = *s_;
  return s.reserved >= BlocksNeeded(s, s.reserve_target, false);
}

Status ReleaseKeepingReservation(SequenceCache::State& s, std::vector<uint32_t> dropped) {
  const uint32_t need = BlocksNeeded(s, s.reserve_target, false);
  const uint32_t shortfall = need > s.reserved ? need - s.reserved : 0;
  if (!dropped.empty()) {
    KV_ASSIGN_OR_RETURN(uint32_t got, s.pool->ReleaseAndReserve(dropped, shortfall));
    s.reserved += got;
  }
  if (need > s.reserved && s.pool->Reserve(need - s.reserved).ok()) s.reserved = need;
  return Status::Ok();
}

// --- appends -------------------------------------------------------------------

namespace {

struct PendingBuffer {
  uint32_t layer, side, head;
  HeadBuffer buf;
};

}  // namespace

// The one append path. k, v: [nl][T][H][D] (nullptr = zero rows); alive as
// documented in AppendOptions, indexed relative to first layer l0.
static Status AppendRows(SequenceCache::State& s, uint32_t l0, uint32_t nl, const float* k,
                         const float* v, uint32_t T, std::span<const uint8_t> alive) {
  const uint32_t H = s.geometry.n_kv_heads(), D = s.geometry.head_dim();
  const size_t kv_dim = size_t{H} * D;
  if (!alive.empty() && alive.size() != H && alive.size() != size_t{nl} * H) {
    return Status::InvalidArgument(fmt::format(
        "cache: alive mask has {} entries, want {} or {}", alive.size(), H, size_t{nl} * H));
  }
  auto is_alive = [&](uint32_t li, uint32_t h) -> bool {
    if (alive.empty()) return true;
    return alive.size() == H ? alive[h] != 0 : alive[size_t{li} * H + h] != 0;
  };
  for (uint32_t li = 0; li < nl; ++li) {
    if (s.layers[l0 + li].num_tokens + uint64_t{T} > kMaxTokens) {
      return Status::CapacityExceeded(fmt::format("cache: more than {} tokens", kMaxTokens));
    }
  }
  const bool paged = s.layout == CacheLayout::kPaged;

  // 1. Capacity (contiguous) or blocks (paged), all or nothing.
  std::vector<PendingBuffer> pending;
  std::vector<uint32_t> fresh, cow_idx, cow_old;
  uint32_t from_reserved = 0;
  const size_t old_table = s.table.size();
  if (!paged) {
    const uint32_t plan = s.contiguous.capacity_tokens;
    for (uint32_t li = 0; li < nl; ++li) {
      const LayerMeta& lm = s.layers[l0 + li];
      for (uint32_t h = 0; h < H; ++h) {
        if (!is_alive(li, h) || T == 0) continue;
        const uint32_t want = lm.head_len[h] + T;
        if (s.contiguous.policy == CapacityPolicy::kFixed && want > plan) {
          return Status::CapacityExceeded(fmt::format(
              "cache: layer {} head {} would hold {} rows, fixed capacity is {}", l0 + li, h,
              want, plan));
        }
        for (int side = 0; side < kSides; ++side) {
          const HeadBuffer& cur = s.store[l0 + li].heads[side][h];
          if (want <= cur.cap) continue;
          uint32_t cap = std::max({want, plan, cur.cap * 2});
          if (plan == 0) cap = std::max(cap, 16u);
          if (s.contiguous.policy == CapacityPolicy::kFixed) cap = plan;
          PendingBuffer p{l0 + li, static_cast<uint32_t>(side), h, {}};
          p.buf.data.reset(new uint8_t[size_t{cap} * s.row_bytes[side]]);
          p.buf.cap = cap;
          if (lm.head_len[h] > 0) {
            std::memcpy(p.buf.data.get(), cur.data.get(), size_t{lm.head_len[h]} * s.row_bytes[side]);
          }
          pending.push_back(std::move(p));
        }
      }
    }
  } else if (T > 0) {
    const uint32_t bs = s.bs();
    uint32_t new_max = s.max_rows();
    // Blocks the new rows land in that may be shared, marked in this thread's
    // reusable buffer (all zero between calls); only [lo, hi) is scanned.
    thread_local std::vector<uint8_t> candidate;
    if (candidate.size() < old_table) candidate.resize(old_table, 0);
    size_t lo = old_table, hi = 0;
    for (uint32_t li = 0; li < nl; ++li) {
      const LayerMeta& lm = s.layers[l0 + li];
      for (uint32_t h = 0; h < H; ++h) {
        if (!is_alive(li, h)) continue;
        const uint32_t a = lm.head_len[h], b = a + T;
        new_max = std::max(new_max, b);
        const size_t end = std::min<size_t>(old_table, CeilDiv(b, bs));
        for (size_t i = a / bs; i < end; ++i) {
          if (s.maybe_shared[i]) {
            candidate[i] = 1;
            lo = std::min(lo, i);
            hi = std::max(hi, i + 1);
          }
        }
      }
    }
    for (size_t i = lo; i < hi; ++i) {
      if (!candidate[i]) continue;
      candidate[i] = 0;
      if (s.pool->IsExclusive(s.table[i])) {
        s.maybe_shared[i] = 0;  // a cached fact, not state: safe to keep on failure
      } else {
        cow_idx.push_back(static_cast<uint32_t>(i));
      }
    }
    const uint32_t want_blocks = CeilDiv(new_max, bs);
    const uint32_t n_new = want_blocks > old_table ? want_blocks - old_table : 0;
    fresh.resize(n_new + cow_idx.size());
    if (!fresh.empty()) {
      KV_RETURN_IF_ERROR(AllocateDrawingReservation(s, fresh, &from_reserved));
      SwapInCopies(s, cow_idx, std::span<const uint32_t>(fresh).first(cow_idx.size()), &cow_old);
      for (size_t j = cow_idx.size(); j < fresh.size(); ++j) {
        s.table.push_back(fresh[j]);
        s.maybe_shared.push_back(0);
      }
    }
  }

  auto undo = [&]() {
    if (!paged) return;  // pending buffers are dropped with `pending`
    for (size_t j = 0; j < cow_idx.size(); ++j) {
      s.table[cow_idx[j]] = cow_old[j];
      s.maybe_shared[cow_idx[j]] = 1;
    }
    s.table.resize(old_table);
    s.maybe_shared.resize(old_table);
    if (!fresh.empty()) {
      Result<uint32_t> got = s.pool->ReleaseAndReserve(fresh, from_reserved);
      assert(got.ok() && *got == from_reserved);
      s.reserved += got.ok() ? *got : 0;
    }
  };

  // 2. Encode every alive head's rows into place. Transforms this append
  // makes (calibration of heads that start now) wait in made_tf until commit.
  std::vector<std::pair<size_t, std::shared_ptr<const std::vector<RowTransform>>>> made_tf;
  auto transforms_of = [&](uint32_t li, int side) -> const std::shared_ptr<const std::vector<RowTransform>>& {
    const size_t key = size_t{li} * kSides + side;
    for (const auto& [k, t] : made_tf) {
      if (k == key) return t;
    }
    return s.layers[l0 + li].transforms[side];
  };
  auto calibrate = [&](uint32_t li, int side, uint32_t h, std::span<const float> rows) {
    RowTransform t = s.codec[side]->Calibrate(rows);
    if (t.empty()) return;
    const size_t key = size_t{li} * kSides + side;
    for (auto& [k, v] : made_tf) {
      if (k == key) {
        v = WithTransform(v, H, h, std::move(t));
        return;
      }
    }
    made_tf.emplace_back(key, WithTransform(s.layers[l0 + li].transforms[side], H, h, std::move(t)));
  };
  // Where row `r` of head h of layer l, side `side` goes.
  auto row_dst = [&](uint32_t l, int side, uint32_t h, uint32_t r) -> uint8_t* {
    const size_t rb = s.row_bytes[side];
    if (paged) {
      const uint32_t bs = s.bs();
      return s.pool->block_data(l, kSideOf[side], s.table[r / bs]) +
             size_t{h} * s.pool->head_stride(kSideOf[side]) + size_t{r % bs} * rb;
    }
    for (PendingBuffer& p : pending) {
      if (p.layer == l && p.side == static_cast<uint32_t>(side) && p.head == h) {
        return p.buf.data.get() + size_t{r} * rb;
      }
    }
    return s.store[l].heads[side][h].data.get() + size_t{r} * rb;
  };

  if (T == 1 && k != nullptr && v != nullptr) {
    // One token (decode): per layer and side, the alive heads' rows are
    // checked once and encoded with one dispatch, each into its slot.
    struct Scratch {
      std::vector<uint32_t> heads;
      std::vector<uint8_t*> dst;
      std::vector<const RowTransform*> tf;
      std::vector<float> rows;
    };
    thread_local Scratch sc;
    const size_t head_stride[kSides] = {paged ? s.pool->head_stride(kSideOf[0]) : 0,
                                        paged ? s.pool->head_stride(kSideOf[1]) : 0};
    sc.heads.resize(H);
    sc.dst.resize(H);
    sc.tf.resize(H);
    for (uint32_t li = 0; li < nl; ++li) {
      const uint32_t l = l0 + li;
      const LayerMeta& lm = s.layers[l];
      uint32_t n = 0;
      for (uint32_t h = 0; h < H; ++h) {
        if (is_alive(li, h)) sc.heads[n++] = h;
      }
      if (n == 0) continue;
      for (int side = 0; side < kSides; ++side) {
        const float* src = (side == 0 ? k : v) + size_t{li} * kv_dim;
        const RowCodec& codec = *s.codec[side];
        const float* x = src;
        if (n != H) {  // the alive heads' rows, packed
          sc.rows.resize(size_t{n} * D);
          for (uint32_t j = 0; j < n; ++j) {
            std::memcpy(sc.rows.data() + size_t{j} * D, src + size_t{sc.heads[j]} * D, D * sizeof(float));
          }
          x = sc.rows.data();
        }
        if (const size_t i = format_internal::FirstNonFinite(x, size_t{n} * D); i != size_t{n} * D) {
          undo();
          return Status::InvalidArgument(fmt::format(
              "encode {}: non-finite value at row 0, index {}", FormatName(codec.format()), i % D));
        }
        for (uint32_t j = 0; j < n; ++j) {
          if (lm.head_len[sc.heads[j]] == 0) calibrate(li, side, sc.heads[j], {x + size_t{j} * D, D});
        }
        const auto& tfv = transforms_of(li, side);
        // Paged: heads of equal length share the block and slot; one lookup
        // (and one division by the block size) per distinct length.
        uint32_t last_len = UINT32_MAX;
        const uint8_t* slot0 = nullptr;  // head 0's row in the block of last_len
        for (uint32_t j = 0; j < n; ++j) {
          const uint32_t h = sc.heads[j];
          const uint32_t r = lm.head_len[h];
          if (!paged) {
            sc.dst[j] = row_dst(l, side, h, r);
          } else {
            if (r != last_len) {
              slot0 = row_dst(l, side, 0, r);
              last_len = r;
            }
            sc.dst[j] = const_cast<uint8_t*>(slot0) + size_t{h} * head_stride[side];
          }
          sc.tf[j] = (tfv && !(*tfv)[h].empty()) ? &(*tfv)[h] : nullptr;
        }
        const Status st =
            format_internal::EncodeHeadRows(codec, n, x, sc.dst.data(), tfv ? sc.tf.data() : nullptr);
        if (!st.ok()) {
          undo();
          return st;
        }
      }
    }
  } else {
    for (uint32_t li = 0; li < nl && T > 0; ++li) {
      const uint32_t l = l0 + li;
      const LayerMeta& lm = s.layers[l];
      for (uint32_t h = 0; h < H; ++h) {
        if (!is_alive(li, h)) continue;
        for (int side = 0; side < kSides; ++side) {
          const float* src = side == 0 ? k : v;
          const RowCodec& codec = *s.codec[side];
          const size_t rb = s.row_bytes[side];
          // Rows of this head: [T][D].
          std::span<const float> rows;
          if (src != nullptr && T == 1) {
            rows = {src + size_t{li} * kv_dim + size_t{h} * D, D};
          } else {
            s.scratch.resize(size_t{T} * D);
            if (src == nullptr) {
              std::fill(s.scratch.begin(), s.scratch.end(), 0.0f);
            } else {
              for (uint32_t t = 0; t < T; ++t) {
                std::memcpy(s.scratch.data() + size_t{t} * D,
                            src + (size_t{li} * T + t) * kv_dim + size_t{h} * D, D * sizeof(float));
              }
            }
            rows = {s.scratch.data(), size_t{T} * D};
          }
          const uint32_t a = lm.head_len[h];
          if (a == 0) calibrate(li, side, h, rows);
          const auto& tfv = transforms_of(li, side);
          const RowTransform* tf = (tfv && !(*tfv)[h].empty()) ? &(*tfv)[h] : nullptr;
          Status st;
          if (!paged) {
            st = codec.Encode(rows, {row_dst(l, side, h, a), size_t{T} * rb}, tf);
          } else {
            const uint32_t bs = s.bs();
            for (uint32_t r = a; r < a + T && st.ok();) {
              const uint32_t slot = r % bs, cnt = std::min(bs - slot, a + T - r);
              st = codec.Encode(rows.subspan(size_t{r - a} * D, size_t{cnt} * D),
                                {row_dst(l, side, h, r), size_t{cnt} * rb}, tf);
              r += cnt;
            }
          }
          if (!st.ok()) {
            undo();
            return st;
          }
        }
      }
    }
  }

  // 3. Commit: nothing below can fail.
  if (!cow_old.empty()) {
    Status st = s.pool->Release(cow_old);
    assert(st.ok());
    (void)st;
  }
  for (PendingBuffer& p : pending) {
    if (s.contiguous.capacity_tokens > 0 && p.buf.cap > s.contiguous.capacity_tokens) {
      s.grew_past_plan = true;
    }
    s.store[p.layer].heads[p.side][p.head] = std::move(p.buf);
  }
  for (uint32_t li = 0; li < nl && T > 0; ++li) {
    LayerMeta& lm = s.layers[l0 + li];
    bool any_dead = false;
    for (uint32_t h = 0; h < H; ++h) any_dead |= !is_alive(li, h);
    if (any_dead && !lm.has_positions()) {
      lm.positions.resize(H);
      for (uint32_t h = 0; h < H; ++h) {
        lm.positions[h].resize(lm.head_len[h]);
        std::iota(lm.positions[h].begin(), lm.positions[h].end(), 0u);
      }
    }
    for (uint32_t h = 0; h < H; ++h) {
      if (!is_alive(li, h)) continue;
      if (lm.has_positions()) {
        for (uint32_t t = 0; t < T; ++t) lm.positions[h].push_back(lm.num_tokens + t);
      }
      lm.head_len[h] += T;
      if (lm.has_importance()) lm.head_imp[h].resize(lm.head_len[h], 0.0f);
    }
    lm.num_tokens += T;
    if (lm.has_importance()) lm.pos_imp.resize(lm.num_tokens, 0.0f);
  }
  for (auto& [key, t] : made_tf) s.layers[l0 + key / kSides].transforms[key % kSides] = std::move(t);
  // Appends past the reservation target leave nothing to keep reserved.
  TrimReservation(s);
  s.Touch();
  return Status::Ok();
}

Status SequenceCache::Append(std::span<const float> k, std::span<const float> v,
                             const AppendOptions& options) {
  State& s = *s_;
  if (s.released) return Released();
  const size_t per_token = size_t{s.geometry.n_layers()} * s.geometry.kv_dim();
  if (k.size() != v.size() || k.empty() || k.size() % per_token != 0) {
    return Status::InvalidArgument(fmt::format(
        "cache: append wants k and v of equal size n_tokens * {} (n_layers * n_kv_heads * "
        "head_dim), got {} and {}",
        per_token, k.size(), v.size()));
  }
  const uint32_t T = static_cast<uint32_t>(std::min<size_t>(k.size() / per_token, kMaxTokens + 1u));
  return AppendRows(s, 0, s.geometry.n_layers(), k.data(), v.data(), T, options.alive);
}

Status SequenceCache::AppendLayer(uint32_t layer, std::span<const float> k,
                                  std::span<const float> v, const AppendOptions& options) {
  State& s = *s_;
  if (s.released) return Released();
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
  const uint32_t T = static_cast<uint32_t>(std::min<size_t>(k.size() / per_token, kMaxTokens + 1u));
  return AppendRows(s, layer, 1, k.data(), v.data(), T, options.alive);
}

Status SequenceCache::AdvanceLen(uint32_t n) {
  State& s = *s_;
  if (s.released) return Released();
  if (n == 0) return Status::Ok();
  return AppendRows(s, 0, s.geometry.n_layers(), nullptr, nullptr, n, {});
}

// --- rollback ------------------------------------------------------------------

Status SequenceCache::Truncate(uint32_t num_tokens) {
  State& s = *s_;
  if (s.released) return Released();
  if (num_tokens > s.num_tokens()) {
    return Status::OutOfRange(
        fmt::format("cache: truncate to {} tokens, only {} stored", num_tokens, s.num_tokens()));
  }
  const uint32_t H = s.geometry.n_kv_heads();
  for (LayerMeta& lm : s.layers) {
    if (lm.num_tokens <= num_tokens) continue;
    for (uint32_t h = 0; h < H; ++h) {
      uint32_t keep = std::min(lm.head_len[h], num_tokens);
      if (lm.has_positions()) {
        auto& p = lm.positions[h];
        keep = static_cast<uint32_t>(std::lower_bound(p.begin(), p.end(), num_tokens) - p.begin());
        p.resize(keep);
      }
      if (lm.has_importance()) lm.head_imp[h].resize(keep);
      if (keep == 0 && lm.head_len[h] > 0) {
        for (int side = 0; side < kSides; ++side) {
          if (lm.transforms[side]) lm.transforms[side] = WithTransform(lm.transforms[side], H, h, {});
        }
      }
      lm.head_len[h] = keep;
    }
    lm.num_tokens = num_tokens;
    if (lm.has_importance()) lm.pos_imp.resize(num_tokens);
    if (num_tokens == 0) {
      lm.positions.clear();
      lm.head_imp.clear();
      lm.pos_imp.clear();
    }
  }
  if (s.layout == CacheLayout::kPaged) {
    const uint32_t keep = CeilDiv(s.max_rows(), s.bs());
    std::vector<uint32_t> dropped(s.table.rbegin(), s.table.rend() - keep);
    s.table.resize(keep);
    s.maybe_shared.resize(keep);
    KV_RETURN_IF_ERROR(ReleaseKeepingReservation(s, std::move(dropped)));
  }
  s.Touch();
  return Status::Ok();
}

Status SequenceCache::TruncateLast(uint32_t n_drop) {
  if (s_->released) return Released();
  const uint32_t n = num_tokens();
  if (n_drop > n) {
    return Status::OutOfRange(fmt::format("cache: drop {} of {} tokens", n_drop, n));
  }
  return Truncate(n - n_drop);
}

Status SequenceCache::Clear() {
  State& s = *s_;
  if (s.released) return Released();
  KV_RETURN_IF_ERROR(Truncate(0));
  for (LayerMeta& lm : s.layers) {
    lm.transforms[0] = lm.transforms[1] = nullptr;
    lm.positions.clear();
    lm.head_imp.clear();
    lm.pos_imp.clear();
  }
  s.Touch();
  return Status::Ok();
}

// --- copies ----------------------------------------------------------------------

namespace {

// Copies the metadata every copy shares (not storage, not pool bookkeeping).
std::unique_ptr<SequenceCache::State> CopyMeta(const SequenceCache::State& s, CacheLayout layout) {
  auto st = NewState(s.geometry, s.formats, layout);
  st->codec[0] = s.codec[0];
  st->codec[1] = s.codec[1];
  st->layers = s.layers;
  return st;
}

// Start of row `row` of (layer, side, head) in a live cache.
const uint8_t* RowPtr(const SequenceCache::State& s, uint32_t l, int side, uint32_t h,
                      uint32_t row) {
  const size_t rb = s.row_bytes[side];
  if (s.layout == CacheLayout::kContiguous) {
    return s.store[l].heads[side][h].data.get() + size_t{row} * rb;
  }
  return s.pool->block_data(l, kSideOf[side], s.table[row / s.bs()]) +
         size_t{h} * s.pool->head_stride(kSideOf[side]) + size_t{row % s.bs()} * rb;
}

}  // namespace

Result<SequenceCache> SequenceCache::Clone(const CloneOptions& options) const {
  const State& s = *s_;
  if (s.released) return Released();
  const bool to_paged = s.layout == CacheLayout::kPaged && options.layout == CloneLayout::kSame;
  if (to_paged) {
    auto st = CopyMeta(s, CacheLayout::kPaged);
    st->pool = s.pool;
    std::vector<uint32_t> fresh(s.table.size());
    if (!fresh.empty()) KV_RETURN_IF_ERROR(s.pool->Allocate(fresh));
    for (size_t i = 0; i < fresh.size(); ++i) s.pool->CopyBlock(s.table[i], fresh[i]);
    st->table = std::move(fresh);
    st->maybe_shared.assign(st->table.size(), 0);
    st->Touch();
    return SequenceCache(std::move(st));
  }
  auto st = CopyMeta(s, CacheLayout::kContiguous);
  const bool same = s.layout == CacheLayout::kContiguous;
  if (same) {
    st->contiguous = s.contiguous;
    st->grew_past_plan = s.grew_past_plan;
  }
  const uint32_t H = s.geometry.n_kv_heads();
  for (uint32_t l = 0; l < s.geometry.n_layers(); ++l) {
    for (int side = 0; side < kSides; ++side) {
      const size_t rb = s.row_bytes[side];
      for (uint32_t h = 0; h < H; ++h) {
        const uint32_t n = s.layers[l].head_len[h];
        const uint32_t cap = same ? s.store[l].heads[side][h].cap : n;
        if (cap == 0) continue;
        HeadBuffer& b = st->store[l].heads[side][h];
        b.data.reset(new uint8_t[size_t{cap} * rb]);
        b.cap = cap;
        if (same) {
          if (n > 0) std::memcpy(b.data.get(), RowPtr(s, l, side, h, 0), size_t{n} * rb);
          continue;
        }
        for (uint32_t r = 0; r < n;) {
          const uint32_t cnt = std::min(s.bs() - r % s.bs(), n - r);
          std::memcpy(b.data.get() + size_t{r} * rb, RowPtr(s, l, side, h, r), size_t{cnt} * rb);
          r += cnt;
        }
      }
    }
  }
  st->Touch();
  return SequenceCache(std::move(st));
}

Result<SequenceCache> SequenceCache::Fork() {
  State& s = *s_;
  if (s.released) return Released();
  if (s.layout == CacheLayout::kContiguous) return Clone({CloneLayout::kSame});
  // The parent's writes to every block it holds are now copy-on-write:
  // keep its reservation whole first (the only way Fork can fail).
  uint32_t extra = 0;
  if (s.reserve_target > 0) {
    const uint32_t need = BlocksNeeded(s, s.reserve_target, true);
    if (need > s.reserved) {
      extra = need - s.reserved;
      KV_RETURN_IF_ERROR(s.pool->Reserve(extra));
    }
  }
  Status st = s.pool->Retain(s.table);
  if (!st.ok()) {
    if (extra) s.pool->Unreserve(extra);
    return st;
  }
  s.reserved += extra;
  std::fill(s.maybe_shared.begin(), s.maybe_shared.end(), 1);
  auto child = CopyMeta(s, CacheLayout::kPaged);
  child->pool = s.pool;
  child->table = s.table;
  child->maybe_shared = s.maybe_shared;
  child->Touch();
  return SequenceCache(std::move(child));
}

// --- paged exports and prefix hooks ------------------------------------------

std::span<const uint32_t> SequenceCache::block_table() const { return s_->table; }
std::span<const uint32_t> SequenceCache::context_lens() const {
  if (s_->layout != CacheLayout::kPaged) return {};
  return {s_->context_len, 1};
}

Status SequenceCache::SetBlockHash(uint32_t logical_block, uint64_t hash) {
  State& s = *s_;
  if (s.released) return Released();
  if (s.layout != CacheLayout::kPaged) {
    return Status::FailedPrecondition("cache: block hashes need the paged layout");
  }
  if (logical_block >= s.table.size()) {
    return Status::OutOfRange(
        fmt::format("cache: logical block {} of {}", logical_block, s.table.size()));
  }
  if (s.min_rows() < (logical_block + 1) * s.bs()) {
    return Status::FailedPrecondition(
        fmt::format("cache: logical block {} is not full in every head", logical_block));
  }
  // A content hash names positions [b * bs, (b + 1) * bs). A head whose rows
  // were compacted (KeepRows, dead at some appends) holds later positions
  // in those slots: naming them would hand an adopter rows of the wrong
  // positions. Positions are strictly increasing and position(r) >= r, so
  // the block's last slot holding its own position proves every slot does.
  const uint32_t last = (logical_block + 1) * s.bs() - 1;
  for (uint32_t l = 0; l < s.layers.size(); ++l) {
    const LayerMeta& lm = s.layers[l];
    if (!lm.has_positions()) continue;
    for (uint32_t h = 0; h < lm.positions.size(); ++h) {
      if (lm.positions[h][last] != last) {
        return Status::FailedPrecondition(fmt::format(
            "cache: logical block {} of layer {} head {} holds compacted rows (position {} in "
            "slot {}): it cannot be named by content",
            logical_block, l, h, lm.positions[h][last], last));
      }
    }
  }
  KV_RETURN_IF_ERROR(s.pool->SetBlockHash(s.table[logical_block], hash));
  s.maybe_shared[logical_block] = 1;
  return Status::Ok();
}

std::shared_ptr<const Calibration> SequenceCache::calibration() const {
  const State& s = *s_;
  const uint32_t H = s.geometry.n_kv_heads();
  auto c = std::make_shared<Calibration>();
  c->transforms.resize(size_t{s.geometry.n_layers()} * kSides * H);
  bool any = false;
  for (uint32_t l = 0; l < s.geometry.n_layers(); ++l) {
    for (int side = 0; side < kSides; ++side) {
      if (!s.layers[l].transforms[side]) continue;
      any = true;
      for (uint32_t h = 0; h < H; ++h) {
        c->transforms[(size_t{l} * kSides + side) * H + h] = (*s.layers[l].transforms[side])[h];
      }
    }
  }
  if (!any) return nullptr;
  return c;
}

Status SequenceCache::AdoptPrefix(std::span<const uint32_t> blocks,
                                  std::shared_ptr<const Calibration> calibration) {
  State& s = *s_;
  if (s.released) return Released();
  if (s.layout != CacheLayout::kPaged || !s.table.empty() || s.num_tokens() != 0) {
    return Status::FailedPrecondition("cache: AdoptPrefix needs an empty paged cache");
  }
  const uint32_t H = s.geometry.n_kv_heads();
  if (calibration &&
      calibration->transforms.size() != size_t{s.geometry.n_layers()} * kSides * H) {
    return Status::InvalidArgument("cache: calibration does not match the geometry");
  }
  if (blocks.size() * size_t{s.bs()} > kMaxTokens) {
    return Status::InvalidArgument("cache: prefix too long");
  }
  for (uint32_t b : blocks) {
    if (b >= s.pool->num_blocks() || s.pool->refcount(b) == 0) {
      return Status::InvalidArgument(fmt::format("cache: prefix block {} is not held", b));
    }
  }
  const uint32_t rows = static_cast<uint32_t>(blocks.size()) * s.bs();
  s.table.assign(blocks.begin(), blocks.end());
  s.maybe_shared.assign(blocks.size(), 1);
  for (uint32_t l = 0; l < s.geometry.n_layers(); ++l) {
    LayerMeta& lm = s.layers[l];
    lm.num_tokens = rows;
    lm.head_len.assign(H, rows);
    for (int side = 0; side < kSides; ++side) {
      lm.transforms[side] = nullptr;
      if (!calibration || rows == 0) continue;
      auto v = std::make_shared<std::vector<RowTransform>>(
          calibration->transforms.begin() + (size_t{l} * kSides + side) * H,
          calibration->transforms.begin() + (size_t{l} * kSides + side + 1) * H);
      bool any = false;
      for (const RowTransform& t : *v) any |= !t.empty();
      if (any) lm.transforms[side] = std::move(v);
    }
  }
  // A shorter need now; return what the reservation no longer covers.
  TrimReservation(s);
  s.Touch();
  return Status::Ok();
}

// --- per layer reads ---------------------------------------------------------------

namespace {
Status CheckLayerHead(const SequenceCache::State& s, uint32_t layer, uint32_t head) {
  if (s.released) return Released();
  if (layer >= s.geometry.n_layers() || head >= s.geometry.n_kv_heads()) {
    return Status::OutOfRange(fmt::format("cache: layer {} head {} out of range ({} x {})", layer,
                                          head, s.geometry.n_layers(), s.geometry.n_kv_heads()));
  }
  return Status::Ok();
}

Result<std::vector<float>> DecodeHead(const SequenceCache::State& s, uint32_t l, uint32_t h,
                                      int side) {
  KV_RETURN_IF_ERROR(CheckLayerHead(s, l, h));
  const uint32_t D = s.geometry.head_dim(), n = s.layers[l].head_len[h];
  const size_t rb = s.row_bytes[side];
  const auto& tfv = s.layers[l].transforms[side];
  const RowTransform* tf = (tfv && !(*tfv)[h].empty()) ? &(*tfv)[h] : nullptr;
  std::vector<float> out(size_t{n} * D);
  const uint32_t seg = s.layout == CacheLayout::kPaged ? s.bs() : std::max(n, 1u);
  for (uint32_t r = 0; r < n;) {
    const uint32_t cnt = std::min(seg - r % seg, n - r);
    KV_RETURN_IF_ERROR(s.codec[side]->Decode({RowPtr(s, l, side, h, r), size_t{cnt} * rb},
                                             {out.data() + size_t{r} * D, size_t{cnt} * D}, tf));
    r += cnt;
  }
  return out;
}
}  // namespace

Result<std::vector<float>> SequenceCache::HeadKeys(uint32_t layer, uint32_t head) const {
  return DecodeHead(*s_, layer, head, 0);
}
Result<std::vector<float>> SequenceCache::HeadValues(uint32_t layer, uint32_t head) const {
  return DecodeHead(*s_, layer, head, 1);
}

std::vector<uint32_t> SequenceCache::HeadPositions(uint32_t layer, uint32_t head) const {
  const State& s = *s_;
  if (!CheckLayerHead(s, layer, head).ok()) return {};
  const LayerMeta& lm = s.layers[layer];
  if (lm.has_positions()) return lm.positions[head];
  std::vector<uint32_t> p(lm.head_len[head]);
  std::iota(p.begin(), p.end(), 0u);
  return p;
}

Status SequenceCache::AccumulateImportance(uint32_t layer, uint32_t head,
                                           std::span<const float> probs) {
  State& s = *s_;
  KV_RETURN_IF_ERROR(CheckLayerHead(s, layer, head));
  LayerMeta& lm = s.layers[layer];
  if (probs.size() != lm.head_len[head]) {
    return Status::InvalidArgument(fmt::format(
        "cache: importance for {} rows, head {} stores {}", probs.size(), head, lm.head_len[head]));
  }
  // Validate everything before touching anything: a NaN or infinity added
  // here would poison every later eviction decision of the head.
  for (size_t r = 0; r < probs.size(); ++r) {
    if (!std::isfinite(probs[r])) {
      return Status::InvalidArgument(fmt::format(
          "cache: non-finite importance {} at row {} of layer {} head {}", probs[r], r, layer,
          head));
    }
  }
  if (!lm.has_importance()) {
    lm.head_imp.resize(s.geometry.n_kv_heads());
    for (uint32_t h = 0; h < s.geometry.n_kv_heads(); ++h) lm.head_imp[h].assign(lm.head_len[h], 0.0f);
    lm.pos_imp.assign(lm.num_tokens, 0.0f);
  }
  std::vector<float>& acc = lm.head_imp[head];
  for (size_t r = 0; r < probs.size(); ++r) {
    acc[r] += probs[r];
    lm.pos_imp[lm.has_positions() ? lm.positions[head][r] : r] += probs[r];
  }
  return Status::Ok();
}

std::vector<float> SequenceCache::HeadImportance(uint32_t layer, uint32_t head) const {
  const State& s = *s_;
  if (!CheckLayerHead(s, layer, head).ok()) return {};
  const LayerMeta& lm = s.layers[layer];
  if (!lm.has_importance()) return std::vector<float>(lm.head_len[head], 0.0f);
  return lm.head_imp[head];
}

std::vector<float> SequenceCache::Importance(uint32_t layer) const {
  const State& s = *s_;
  if (s.released || layer >= s.geometry.n_layers()) return {};
  const LayerMeta& lm = s.layers[layer];
  if (!lm.has_importance()) return std::vector<float>(lm.num_tokens, 0.0f);
  return lm.pos_imp;
}

Result<LayerKvView> SequenceCache::View(uint32_t layer) const {
  const State& s = *s_;
  KV_RETURN_IF_ERROR(CheckLayerHead(s, layer, 0));
  const LayerMeta& lm = s.layers[layer];
  static constexpr uint32_t kZero = 0;
  LayerKvView v;
  v.n_kv_heads = s.geometry.n_kv_heads();
  v.head_dim = s.geometry.head_dim();
  v.num_tokens = lm.num_tokens;
  v.head_len = lm.head_len.data();
  if (lm.has_positions()) v.positions = lm.position_ptrs.data();
  KvSideView* sides[2] = {&v.k, &v.v};
  for (int side = 0; side < kSides; ++side) {
    KvSideView& sv = *sides[side];
    sv.format = side == 0 ? s.formats.k : s.formats.v;
    sv.row_bytes = static_cast<uint32_t>(s.row_bytes[side]);
    sv.codec = s.codec[side].get();
    sv.transforms = lm.transforms[side] ? lm.transforms[side]->data() : nullptr;
  }
  if (s.layout == CacheLayout::kPaged) {
    v.block_size = s.bs();
    v.block_table = s.table.data();
    v.num_blocks = static_cast<uint32_t>(s.table.size());
    for (int side = 0; side < kSides; ++side) {
      sides[side]->base = s.pool->arena(layer, kSideOf[side]);
      sides[side]->block_stride = s.pool->block_stride(kSideOf[side]);
      sides[side]->head_stride = s.pool->head_stride(kSideOf[side]);
    }
  } else {
    const ContiguousLayer& c = s.store[layer];
    uint32_t cap = 1;
    for (int side = 0; side < kSides; ++side) {
      for (uint32_t h = 0; h < v.n_kv_heads; ++h) cap = std::max(cap, c.heads[side][h].cap);
      sides[side]->head_base = c.bases[side].data();
    }
    v.block_size = cap;
    v.block_table = &kZero;
    v.num_blocks = 1;
  }
  return v;
}

// --- checks ----------------------------------------------------------------------

Status SequenceCache::CheckInvariants() const {
  const State& s = *s_;
  auto fail = [](std::string m) { return Status::Internal("cache invariant: " + m); };
  const uint32_t H = s.geometry.n_kv_heads();
  for (uint32_t l = 0; l < s.layers.size(); ++l) {
    const LayerMeta& lm = s.layers[l];
    if (lm.head_len.size() != H) return fail("head_len size");
    for (uint32_t h = 0; h < H; ++h) {
      const uint32_t n = lm.head_len[h];
      if (n > lm.num_tokens) return fail(fmt::format("layer {} head {} len > num_tokens", l, h));
      if (lm.has_positions()) {
        const auto& p = lm.positions[h];
        if (p.size() != n) return fail("positions size");
        for (size_t r = 0; r < p.size(); ++r) {
          if (p[r] >= lm.num_tokens || (r > 0 && p[r] <= p[r - 1])) return fail("positions order");
        }
      } else if (n != lm.num_tokens) {
        return fail(fmt::format("layer {} head {} short without positions", l, h));
      }
      for (int side = 0; side < kSides; ++side) {
        if (n == 0 && lm.transforms[side] && !(*lm.transforms[side])[h].empty()) {
          return fail("transform on an empty head");
        }
        if (s.layout == CacheLayout::kContiguous && n > s.store[l].heads[side][h].cap) {
          return fail("rows beyond buffer");
        }
      }
      if (lm.has_importance() && lm.head_imp[h].size() != n) return fail("head importance size");
    }
    if (lm.has_importance() && lm.pos_imp.size() != lm.num_tokens) return fail("importance size");
  }
  if (s.context_len[0] != s.num_tokens()) return fail("context_len stale");
  if (s.layout == CacheLayout::kPaged) {
    if (s.table.size() != CeilDiv(s.max_rows(), s.bs())) {
      return fail(fmt::format("table has {} blocks for {} rows", s.table.size(), s.max_rows()));
    }
    if (s.maybe_shared.size() != s.table.size()) return fail("maybe_shared size");
    for (size_t i = 0; i < s.table.size(); ++i) {
      if (s.pool->refcount(s.table[i]) == 0) return fail(fmt::format("block {} not held", i));
      if (!s.maybe_shared[i] && !s.pool->IsExclusive(s.table[i])) {
        return fail(fmt::format("block {} shared but not marked", i));
      }
    }
    if (s.released && (s.reserved || !s.table.empty())) return fail("released but holding");
    KV_RETURN_IF_ERROR(s.pool->CheckInvariants());
  }
  return Status::Ok();
}

std::string SequenceCache::DebugString() const {
  const State& s = *s_;
  std::string out = fmt::format(
      "SequenceCache{{{} {} {} tokens={} used={}B allocated={}B{}", s.geometry.ToString(),
      FormatPairName(s.formats), s.layout == CacheLayout::kPaged ? "paged" : "contiguous",
      s.num_tokens(), used_bytes(), allocated_bytes(), s.released ? " released" : "");
  if (s.layout == CacheLayout::kPaged) {
    out += fmt::format(" blocks={} reserved={} target={}", s.table.size(), s.reserved,
                       s.reserve_target);
  }
  return out + "}";
}

}  // namespace kvcache
