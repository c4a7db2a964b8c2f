// SequenceCache and LayerCache (include/kvcache/cache.h): creation,
// lifetime, accounting, rollback, copies, prefix hooks, reads and checks.
// Appends are in cache_append.cc, KeepRows in cache_keep_rows.cc; the bytes
// of either layout are in a RowStore (cache_state.h), so this file handles
// metadata and forwards the rest.
//
// Failure atomicity: every mutating operation first checks its input and
// acquires what it needs (RowStore calls that are all or nothing), then
// writes metadata, which cannot fail.
//
// Thread safety: as cache.h (one mutator at a time; const methods only read).
#include "kvcache/cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

#include "cache/cache_state.h"
#include "cache/contiguous_store.h"
#include "cache/paged_store.h"

namespace kvcache {

Transforms WithTransform(const Transforms& v, uint32_t n, uint32_t h, RowTransform t) {
  auto out = v ? std::make_shared<std::vector<RowTransform>>(*v)
               : std::make_shared<std::vector<RowTransform>>(n);
  (*out)[h] = std::move(t);
  bool any = false;
  for (const RowTransform& x : *out) any |= !x.empty();
  if (!any) return nullptr;
  return out;
}

Status UsedAfterRelease() { return Status::FailedPrecondition("cache: used after Release()"); }

Status CheckLayerHead(const SequenceCache::State& s, uint32_t layer, uint32_t head) {
  if (s.released) return UsedAfterRelease();
  if (layer >= s.geometry.n_layers() || head >= s.geometry.n_kv_heads()) {
    return Status::OutOfRange(fmt::format("cache: layer {} head {} out of range ({} x {})", layer,
                                          head, s.geometry.n_layers(), s.geometry.n_kv_heads()));
  }
  return Status::Ok();
}

void MaterializePositions(LayerMeta& lm) {
  if (lm.has_positions()) return;
  lm.positions.resize(lm.head_len.size());
  for (size_t h = 0; h < lm.head_len.size(); ++h) {
    lm.positions[h].resize(lm.head_len[h]);
    std::iota(lm.positions[h].begin(), lm.positions[h].end(), 0u);
  }
}

Result<uint32_t> AlignedBlockFirst(std::span<const LayerMeta> layers, uint32_t b,
                                   uint32_t block_size) {
  const uint64_t begin = uint64_t{b} * block_size, end = begin + block_size;
  if (block_size == 0 || MinRows(layers) < end) {
    return Status::FailedPrecondition(
        fmt::format("cache: logical block {} is not full in every head", b));
  }
  // Positions strictly increase along a head's rows, so a block whose last
  // row is block_size - 1 past its first holds consecutive positions.
  std::optional<uint32_t> first;
  for (uint32_t l = 0; l < layers.size(); ++l) {
    const LayerMeta& lm = layers[l];
    for (uint32_t h = 0; h < lm.head_len.size(); ++h) {
      const uint32_t p0 = lm.has_positions() ? lm.positions[h][begin] : static_cast<uint32_t>(begin);
      const uint32_t p1 = lm.has_positions() ? lm.positions[h][end - 1] : static_cast<uint32_t>(end - 1);
      if (p1 - p0 != block_size - 1 || p0 % block_size != 0 || (first && *first != p0)) {
        return Status::FailedPrecondition(fmt::format(
            "cache: logical block {} of layer {} head {} holds positions {}..{}, not one aligned "
            "block of positions shared by every head: it cannot be named by content",
            b, l, h, p0, p1));
      }
      first = p0;
    }
  }
  return first.value_or(static_cast<uint32_t>(begin));
}

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

// Metadata of an empty cache; the caller adds codecs and a store.
std::unique_ptr<SequenceCache::State> NewState(const Geometry& g, FormatPair f) {
  auto st = std::make_unique<SequenceCache::State>(g);
  st->formats = f;
  st->layers.resize(g.n_layers());
  for (LayerMeta& l : st->layers) l.head_len.assign(g.n_kv_heads(), 0);
  st->row_bytes[0] = RowBytes(f.k, g.head_dim());
  st->row_bytes[1] = RowBytes(f.v, g.head_dim());
  st->Touch();
  return st;
}

// The precision window's store, when `window` asks for one.
Status AddWindow(SequenceCache::State& st, const PrecisionWindow& window) {
  if (!window.enabled()) return Status::Ok();
  KV_ASSIGN_OR_RETURN(st.window, WindowStore::Create(st.geometry, st.formats, window));
  st.window_spec = window;
  return Status::Ok();
}

// A state with the metadata every copy of `s` shares (not storage).
std::unique_ptr<SequenceCache::State> CopyMeta(const SequenceCache::State& s) {
  auto st = NewState(s.geometry, s.formats);
  st->codec[0] = s.codec[0];
  st->codec[1] = s.codec[1];
  st->layers = s.layers;
  st->window_spec = s.window_spec;
  if (s.window) st->window = s.window->Copy();
  return st;
}

}  // namespace

Result<SequenceCache> SequenceCache::CreateContiguous(const Geometry& geometry, FormatPair formats,
                                                      const ContiguousOptions& options) {
  KV_ASSIGN_OR_RETURN(RowCodec kc, RowCodec::Create(formats.k, geometry.head_dim(), Side::kKey,
                                                    options.rotation_seed));
  KV_ASSIGN_OR_RETURN(RowCodec vc, RowCodec::Create(formats.v, geometry.head_dim(), Side::kValue,
                                                    options.rotation_seed));
  if (options.capacity_tokens > kMaxCacheTokens) {
    return Status::InvalidArgument(fmt::format("cache: capacity_tokens {} exceeds {}",
                                               options.capacity_tokens, kMaxCacheTokens));
  }
  auto st = NewState(geometry, formats);
  KV_RETURN_IF_ERROR(AddWindow(*st, options.window));
  st->codec[0] = std::make_shared<const RowCodec>(std::move(kc));
  st->codec[1] = std::make_shared<const RowCodec>(std::move(vc));
  st->store = std::make_unique<ContiguousStore>(geometry.n_layers(), geometry.n_kv_heads(),
                                                st->row_bytes, options);
  st->Touch();
  return SequenceCache(std::move(st));
}

Result<SequenceCache> SequenceCache::CreatePaged(std::shared_ptr<BlockPool> pool,
                                                 const PagedOptions& options) {
  if (!pool) return Status::InvalidArgument("cache: paged layout needs a pool");
  auto st = NewState(pool->geometry(), pool->formats());
  KV_RETURN_IF_ERROR(AddWindow(*st, options.window));
  st->Touch();
  st->codec[0] = pool->shared_codec(Side::kKey);
  st->codec[1] = pool->shared_codec(Side::kValue);
  st->store = std::make_unique<PagedStore>(std::move(pool));
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
  s.store->Release();
  for (LayerMeta& l : s.layers) {
    LayerMeta fresh;
    fresh.head_len.assign(s.geometry.n_kv_heads(), 0);
    l = std::move(fresh);
  }
  s.window.reset();
  s.released = true;
  s.Touch();
}

// --- shape and accounting --------------------------------------------------

const Geometry& SequenceCache::geometry() const { return s_->geometry; }
FormatPair SequenceCache::formats() const { return s_->formats; }
CacheLayout SequenceCache::layout() const { return s_->store->layout(); }
uint32_t SequenceCache::n_layers() const { return s_->geometry.n_layers(); }
uint32_t SequenceCache::n_kv_heads() const { return s_->geometry.n_kv_heads(); }
uint32_t SequenceCache::head_dim() const { return s_->geometry.head_dim(); }
uint32_t SequenceCache::block_size() const { return s_->store->block_size(); }
const std::shared_ptr<BlockPool>& SequenceCache::pool() const { return s_->store->pool(); }
const RowCodec& SequenceCache::codec(Side side) const {
  return *s_->codec[static_cast<int>(side)];
}
bool SequenceCache::released() const { return s_->released; }
const PrecisionWindow& SequenceCache::precision_window() const { return s_->window_spec; }

uint32_t SequenceCache::num_tokens() const { return s_->num_tokens(); }
uint32_t SequenceCache::num_tokens(uint32_t layer) const {
  return layer < s_->layers.size() ? s_->layers[layer].num_tokens : 0;
}
uint32_t SequenceCache::head_len(uint32_t layer, uint32_t head) const {
  if (layer >= s_->layers.size() || head >= s_->geometry.n_kv_heads()) return 0;
  return s_->layers[layer].head_len[head];
}

uint32_t SequenceCache::capacity_tokens() const {
  return s_->released ? 0 : s_->store->capacity_tokens();
}
size_t SequenceCache::allocated_bytes() const {
  return s_->store->allocated_bytes() + (s_->window ? s_->window->allocated_bytes() : 0);
}

size_t SequenceCache::used_bytes() const {
  const State& s = *s_;
  size_t rows = 0, held = 0;
  for (uint32_t l = 0; l < s.layers.size(); ++l) {
    for (uint32_t x : s.layers[l].head_len) rows += x;
    if (s.window) held += size_t{s.window->held(l)} * s.geometry.n_kv_heads();
  }
  return rows * (s.row_bytes[0] + s.row_bytes[1]) +
         held * 2 * RowBytes(Format::kBF16, s.geometry.head_dim());
}

bool SequenceCache::is_within_planned_capacity() const {
  return !s_->released && s_->store->is_within_planned_capacity(s_->layers);
}

// --- reservations ------------------------------------------------------------

Status SequenceCache::Reserve(uint32_t max_tokens) {
  if (s_->released) return UsedAfterRelease();
  return s_->store->Reserve(max_tokens, s_->layers);
}
uint32_t SequenceCache::reserved_blocks() const { return s_->store->reserved_blocks(); }
uint32_t SequenceCache::reservation_target_tokens() const {
  return s_->store->reservation_target_tokens();
}
bool SequenceCache::is_fully_reserved() const { return s_->store->is_fully_reserved(s_->layers); }

// --- rollback ------------------------------------------------------------------

namespace {

// Keeps positions [0, num_tokens) of one layer's metadata.
void TruncateLayer(LayerMeta& lm, uint32_t num_tokens) {
  const uint32_t H = static_cast<uint32_t>(lm.head_len.size());
  for (uint32_t h = 0; h < H; ++h) {
    uint32_t keep = std::min(lm.head_len[h], num_tokens);
    if (lm.has_positions()) {
      auto& p = lm.positions[h];
      keep = static_cast<uint32_t>(std::lower_bound(p.begin(), p.end(), num_tokens) - p.begin());
      p.resize(keep);
    }
    if (lm.has_importance()) lm.head_imp[h].resize(keep);
    if (keep == 0 && lm.head_len[h] > 0) {
      for (Transforms& t : lm.transforms) {
        if (t) t = WithTransform(t, H, h, {});
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

}  // namespace

Status SequenceCache::Truncate(uint32_t num_tokens) {
  State& s = *s_;
  if (s.released) return UsedAfterRelease();
  if (num_tokens > s.num_tokens()) {
    return Status::OutOfRange(
        fmt::format("cache: truncate to {} tokens, only {} stored", num_tokens, s.num_tokens()));
  }
  for (uint32_t l = 0; l < s.layers.size(); ++l) {
    if (s.layers[l].num_tokens <= num_tokens) continue;
    TruncateLayer(s.layers[l], num_tokens);
    if (s.window) s.window->Truncate(l, num_tokens);
  }
  KV_RETURN_IF_ERROR(s.store->Shrink(s.layers));
  s.Touch();
  return Status::Ok();
}

Status SequenceCache::TruncateLast(uint32_t n_drop) {
  if (s_->released) return UsedAfterRelease();
  const uint32_t n = num_tokens();
  if (n_drop > n) {
    return Status::OutOfRange(fmt::format("cache: drop {} of {} tokens", n_drop, n));
  }
  return Truncate(n - n_drop);
}

Status SequenceCache::Clear() {
  State& s = *s_;
  if (s.released) return UsedAfterRelease();
  KV_RETURN_IF_ERROR(Truncate(0));
  for (uint32_t l = 0; l < s.layers.size(); ++l) {
    if (s.window) s.window->Reset(l, 0);
    LayerMeta& lm = s.layers[l];
    lm.transforms[0] = lm.transforms[1] = nullptr;
    lm.positions.clear();
    lm.head_imp.clear();
    lm.pos_imp.clear();
  }
  s.Touch();
  return Status::Ok();
}

// --- copies ----------------------------------------------------------------------

Result<SequenceCache> SequenceCache::Clone(const CloneOptions& options) const {
  const State& s = *s_;
  if (s.released) return UsedAfterRelease();
  auto st = CopyMeta(s);
  KV_ASSIGN_OR_RETURN(st->store, options.layout == CloneLayout::kSame
                                     ? s.store->Clone(s.layers)
                                     : s.store->CloneContiguous(s.layers));
  st->Touch();
  return SequenceCache(std::move(st));
}

Result<SequenceCache> SequenceCache::Fork() {
  State& s = *s_;
  if (s.released) return UsedAfterRelease();
  auto child = CopyMeta(s);
  KV_ASSIGN_OR_RETURN(child->store, s.store->Fork(s.layers));
  child->Touch();
  return SequenceCache(std::move(child));
}

// --- paged exports and prefix hooks ------------------------------------------

std::span<const uint32_t> SequenceCache::block_table() const { return s_->store->block_table(); }
std::span<const uint32_t> SequenceCache::context_lens() const {
  if (s_->store->layout() != CacheLayout::kPaged) return {};
  return {s_->context_len, 1};
}

Status SequenceCache::SetBlockHash(uint32_t logical_block, uint64_t hash) {
  if (s_->released) return UsedAfterRelease();
  return s_->store->SetBlockHash(logical_block, hash, s_->layers);
}

Result<uint32_t> SequenceCache::BlockFirstPosition(uint32_t logical_block) const {
  const State& s = *s_;
  if (s.released) return UsedAfterRelease();
  if (s.store->layout() != CacheLayout::kPaged) {
    return Status::FailedPrecondition("cache: block positions need the paged layout");
  }
  if (logical_block >= s.store->num_blocks()) {
    return Status::OutOfRange(
        fmt::format("cache: logical block {} of {}", logical_block, s.store->num_blocks()));
  }
  return AlignedBlockFirst(s.layers, logical_block, s.store->block_size());
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

namespace {

// The transforms of (layer, side) in `c` ([n_layers][2][H]); null if none.
Transforms TransformsOf(const Calibration& c, uint32_t layer, int side, uint32_t H) {
  const auto first = c.transforms.begin() + (size_t{layer} * kSides + side) * H;
  auto v = std::make_shared<std::vector<RowTransform>>(first, first + H);
  for (const RowTransform& t : *v) {
    if (!t.empty()) return v;
  }
  return nullptr;
}

}  // namespace

std::shared_ptr<const WindowSinks> SequenceCache::window_sinks() const {
  const State& s = *s_;
  if (s.released || !s.window) return nullptr;
  for (uint32_t l = 0; l < s.geometry.n_layers(); ++l) {
    if (!s.window->sinks_complete(l)) return nullptr;
  }
  auto out = std::make_shared<WindowSinks>();
  out->sinks = s.window_spec.sinks;
  out->n_layers = s.geometry.n_layers();
  out->n_kv_heads = s.geometry.n_kv_heads();
  out->head_dim = s.geometry.head_dim();
  out->formats = s.formats;
  const size_t per_layer = s.window->sink_bytes_per_layer();
  out->rows.resize(per_layer * s.geometry.n_layers());
  for (uint32_t l = 0; l < s.geometry.n_layers(); ++l) {
    s.window->CopySinks(l, out->rows.data() + per_layer * l);
  }
  return out;
}

namespace {

// AdoptPrefix and AdoptBlocksAt: the adopted rows are positions
// [first, first + blocks.size() * block_size).
Status AdoptRows(SequenceCache::State& s, uint32_t first, std::span<const uint32_t> blocks,
                 const std::shared_ptr<const Calibration>& calibration,
                 const std::shared_ptr<const WindowSinks>& sinks) {
  if (s.released) return UsedAfterRelease();
  if (s.store->layout() != CacheLayout::kPaged || !s.store->block_table().empty() ||
      s.num_tokens() != 0) {
    return Status::FailedPrecondition("cache: AdoptPrefix needs an empty paged cache");
  }
  const uint32_t bs = s.store->block_size();
  if (first % bs != 0) {
    return Status::InvalidArgument(
        fmt::format("cache: adopted blocks start at position {}, not a multiple of {}", first, bs));
  }
  if (first > 0 && s.window) {
    return Status::FailedPrecondition(
        "cache: a precision window adopts blocks from position 0 only (AdoptPrefix)");
  }
  const uint64_t rows64 = uint64_t{blocks.size()} * bs;
  if (first + rows64 > kMaxCacheTokens) {
    return Status::InvalidArgument("cache: prefix too long");
  }
  const uint32_t H = s.geometry.n_kv_heads();
  if (calibration &&
      calibration->transforms.size() != size_t{s.geometry.n_layers()} * kSides * H) {
    return Status::InvalidArgument("cache: calibration does not match the geometry");
  }
  if (sinks) KV_RETURN_IF_ERROR(sinks->CheckFits(s.geometry));
  // The sinks are the window's when they fit it and the adopted rows cover
  // them; any other window (or format) reads the adopted positions in the
  // format, as without them.
  const bool take_sinks = sinks && s.window && sinks->sinks == s.window_spec.sinks &&
                          sinks->formats == s.formats && rows64 >= sinks->sinks;
  KV_RETURN_IF_ERROR(s.store->AdoptBlocks(blocks));
  const uint32_t rows = static_cast<uint32_t>(rows64);
  const size_t sink_layer_bytes = s.window ? s.window->sink_bytes_per_layer() : 0;
  for (uint32_t l = 0; l < s.geometry.n_layers(); ++l) {
    LayerMeta& lm = s.layers[l];
    lm.num_tokens = first + rows;
    lm.head_len.assign(H, rows);
    if (first > 0) {  // as DropLeadingBlocks leaves them
      lm.positions.assign(H, std::vector<uint32_t>(rows));
      for (auto& p : lm.positions) std::iota(p.begin(), p.end(), first);
    }
    if (s.window) {
      s.window->Reset(l, rows);  // the adopted rows are the blocks' alone,
      if (take_sinks) s.window->SetSinks(l, sinks->rows.data() + sink_layer_bytes * l);  // but the sinks'
    }
    for (int side = 0; side < kSides; ++side) {
      lm.transforms[side] =
          calibration && rows > 0 ? TransformsOf(*calibration, l, side, H) : nullptr;
    }
  }
  // A shorter need now; return what the reservation no longer covers.
  s.store->TrimReservation(s.layers);
  s.Touch();
  return Status::Ok();
}

}  // namespace

Status SequenceCache::AdoptPrefix(std::span<const uint32_t> blocks,
                                  std::shared_ptr<const Calibration> calibration,
                                  std::shared_ptr<const WindowSinks> sinks) {
  return AdoptRows(*s_, 0, blocks, calibration, sinks);
}

Status SequenceCache::AdoptBlocksAt(uint32_t first_position, std::span<const uint32_t> blocks,
                                    std::shared_ptr<const Calibration> calibration) {
  return AdoptRows(*s_, first_position, blocks, calibration, nullptr);
}

// --- per layer reads ---------------------------------------------------------------

namespace {

Result<std::vector<float>> DecodeHead(const SequenceCache::State& s, uint32_t l, uint32_t h,
                                      int side) {
  KV_RETURN_IF_ERROR(CheckLayerHead(s, l, h));
  const uint32_t D = s.geometry.head_dim(), n = s.layers[l].head_len[h];
  const size_t rb = s.row_bytes[side];
  const auto& tfv = s.layers[l].transforms[side];
  const RowTransform* tf = (tfv && !(*tfv)[h].empty()) ? &(*tfv)[h] : nullptr;
  std::vector<float> out(size_t{n} * D);
  const RowAddressing<uint8_t> rows = s.store->Rows(l, side);
  for (uint32_t r = 0; r < n;) {
    const uint32_t cnt = std::min(rows.run(r), n - r);
    KV_RETURN_IF_ERROR(s.codec[side]->Decode({rows.row(h, r), size_t{cnt} * rb},
                                             {out.data() + size_t{r} * D, size_t{cnt} * D}, tf));
    r += cnt;
  }
  if (s.window) KV_RETURN_IF_ERROR(s.window->Overlay(l, side, h, out));
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
  LayerKvView v;
  v.n_kv_heads = s.geometry.n_kv_heads();
  v.head_dim = s.geometry.head_dim();
  v.num_tokens = lm.num_tokens;
  v.head_len = lm.head_len.data();
  if (lm.has_positions()) v.positions = lm.position_ptrs.data();
  if (s.window) {  // this view: the rows outside the window; the window's rows beside it
    v.head_len = s.window->cold_len(layer);
    v.first_position = s.window->cold_first(layer);
    v.recent = s.window_spec.recent;
    v.recent_from = s.window->recent_from(layer);
    v.hot = s.window->hot(layer);
  }
  v.num_blocks = s.store->num_blocks();
  KvSideView* sides[kSides] = {&v.k, &v.v};
  for (int side = 0; side < kSides; ++side) {
    const RowAddressing<uint8_t> rows = s.store->Rows(layer, side);
    KvSideView& sv = *sides[side];
    sv.format = side == 0 ? s.formats.k : s.formats.v;
    sv.row_bytes = static_cast<uint32_t>(s.row_bytes[side]);
    sv.codec = s.codec[side].get();
    sv.transforms = lm.transforms[side] ? lm.transforms[side]->data() : nullptr;
    sv.base = rows.base;
    sv.head_base = rows.head_base;
    sv.block_stride = rows.block_stride;
    sv.head_stride = rows.head_stride;
    v.block_table = rows.block_table;
    v.block_size = std::max(v.block_size, rows.block_size);
  }
  return v;
}

// --- checks ----------------------------------------------------------------------

namespace {

Status Broken(std::string what) { return Status::Internal("cache invariant: " + what); }

Status CheckHead(const LayerMeta& lm, uint32_t l, uint32_t h) {
  const uint32_t n = lm.head_len[h];
  if (n > lm.num_tokens) return Broken(fmt::format("layer {} head {} len > num_tokens", l, h));
  if (lm.has_positions()) {
    const auto& p = lm.positions[h];
    if (p.size() != n) return Broken("positions size");
    for (size_t r = 0; r < p.size(); ++r) {
      if (p[r] >= lm.num_tokens || (r > 0 && p[r] <= p[r - 1])) return Broken("positions order");
    }
  } else if (n != lm.num_tokens) {
    return Broken(fmt::format("layer {} head {} short without positions", l, h));
  }
  for (const Transforms& t : lm.transforms) {
    if (n == 0 && t && !(*t)[h].empty()) return Broken("transform on an empty head");
  }
  if (lm.has_importance() && lm.head_imp[h].size() != n) return Broken("head importance size");
  return Status::Ok();
}

Status CheckLayer(const LayerMeta& lm, uint32_t l, uint32_t H) {
  if (lm.head_len.size() != H) return Broken("head_len size");
  for (uint32_t h = 0; h < H; ++h) KV_RETURN_IF_ERROR(CheckHead(lm, l, h));
  if (lm.has_importance() && lm.pos_imp.size() != lm.num_tokens) return Broken("importance size");
  return Status::Ok();
}

}  // namespace

Status SequenceCache::CheckInvariants() const {
  const State& s = *s_;
  for (uint32_t l = 0; l < s.layers.size(); ++l) {
    KV_RETURN_IF_ERROR(CheckLayer(s.layers[l], l, s.geometry.n_kv_heads()));
    if (s.window) KV_RETURN_IF_ERROR(s.window->CheckInvariants(l, s.layers[l].num_tokens));
  }
  if (s.context_len[0] != s.num_tokens()) return Broken("context_len stale");
  return s.store->CheckInvariants(s.layers, s.released);
}

std::string SequenceCache::DebugString() const {
  const State& s = *s_;
  const bool paged = s.store->layout() == CacheLayout::kPaged;
  const std::string window =
      s.window_spec.enabled()
          ? fmt::format(" window=s{}+r{}", s.window_spec.sinks, s.window_spec.recent)
          : "";
  return fmt::format("SequenceCache{{{} {} {}{} tokens={} used={}B allocated={}B{}{}}}",
                     s.geometry.ToString(), FormatPairName(s.formats),
                     paged ? "paged" : "contiguous", window, s.num_tokens(), used_bytes(),
                     allocated_bytes(), s.released ? " released" : "", s.store->DebugString());
}

// --- LayerCache: forwards to its SequenceCache ---------------------------------------

uint32_t LayerCache::n_kv_heads() const { return seq_->n_kv_heads(); }
uint32_t LayerCache::head_dim() const { return seq_->head_dim(); }
uint32_t LayerCache::num_tokens() const { return seq_->num_tokens(layer_); }
Status LayerCache::Append(std::span<const float> k, std::span<const float> v,
                          const AppendOptions& options) {
  return seq_->AppendLayer(layer_, k, v, options);
}
uint32_t LayerCache::head_len(uint32_t head) const { return seq_->head_len(layer_, head); }
Result<std::vector<float>> LayerCache::HeadKeys(uint32_t head) const {
  return seq_->HeadKeys(layer_, head);
}
Result<std::vector<float>> LayerCache::HeadValues(uint32_t head) const {
  return seq_->HeadValues(layer_, head);
}
std::vector<uint32_t> LayerCache::HeadPositions(uint32_t head) const {
  return seq_->HeadPositions(layer_, head);
}
Status LayerCache::AccumulateImportance(uint32_t head, std::span<const float> probs) {
  return seq_->AccumulateImportance(layer_, head, probs);
}
std::vector<float> LayerCache::HeadImportance(uint32_t head) const {
  return seq_->HeadImportance(layer_, head);
}
std::vector<float> LayerCache::Importance() const { return seq_->Importance(layer_); }
Result<LayerKvView> LayerCache::View() const { return seq_->View(layer_); }
size_t LayerCache::allocated_bytes() const {
  const SequenceCache::State& s = *seq_->s_;
  if (s.released) return 0;
  return s.store->allocated_bytes(layer_) + (s.window ? s.window->allocated_bytes(layer_) : 0);
}
size_t LayerCache::used_bytes() const {
  size_t rows = 0;
  for (uint32_t h = 0; h < seq_->n_kv_heads(); ++h) rows += seq_->head_len(layer_, h);
  const SequenceCache::State& s = *seq_->s_;
  const size_t held = s.window ? size_t{s.window->held(layer_)} * s.geometry.n_kv_heads() : 0;
  return rows * (s.row_bytes[0] + s.row_bytes[1]) +
         held * 2 * RowBytes(Format::kBF16, s.geometry.head_dim());
}

}  // namespace kvcache
