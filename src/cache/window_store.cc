// WindowStore (window_store.h): the bf16 rows of a precision window.
#include "cache/window_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace kvcache {
namespace {

bool IsFloatFormat(Format f) { return f == Format::kF32 || f == Format::kF16 || f == Format::kBF16; }

}  // namespace

Result<std::unique_ptr<WindowStore>> WindowStore::Create(const Geometry& geometry,
                                                         FormatPair formats,
                                                         const PrecisionWindow& window) {
  if (window.sinks > PrecisionWindow::kMaxSinks || window.recent > PrecisionWindow::kMaxRecent ||
      window.slack > PrecisionWindow::kMaxSlack) {
    return Status::InvalidArgument(fmt::format(
        "cache: precision window of {} sinks, {} recent positions and {} slack rows (at most {}, "
        "{} and {})",
        window.sinks, window.recent, window.slack, PrecisionWindow::kMaxSinks,
        PrecisionWindow::kMaxRecent, PrecisionWindow::kMaxSlack));
  }
  if (window.slack > 0 && window.recent == 0) {
    return Status::InvalidArgument("cache: precision window slack without recent positions");
  }
  if (!window.enabled()) return Status::InvalidArgument("cache: empty precision window");
  if (IsFloatFormat(formats.k) && IsFloatFormat(formats.v)) {
    return Status::InvalidArgument(fmt::format(
        "cache: a precision window keeps bf16 rows beside a quantized format; {} has nothing to "
        "gain from it",
        FormatPairName(formats)));
  }
  KV_ASSIGN_OR_RETURN(RowCodec codec,
                      RowCodec::Create(Format::kBF16, geometry.head_dim(), Side::kKey));
  return std::unique_ptr<WindowStore>(new WindowStore(geometry, window, std::move(codec)));
}

WindowStore::WindowStore(const Geometry& g, const PrecisionWindow& w, RowCodec codec)
    : geometry_(g),
      window_(w),
      ring_(w.recent + w.slack),
      slots_(w.sinks + w.recent + w.slack),
      row_bytes_(codec.row_bytes()),
      codec_(std::move(codec)),
      layers_(g.n_layers()),
      zeros_(g.kv_dim(), 0.0f) {
  const size_t side_bytes = size_t{g.n_kv_heads()} * slots_ * row_bytes_;
  for (uint32_t l = 0; l < g.n_layers(); ++l) {
    Layer& layer = layers_[l];
    layer.slot_pos.assign(slots_, kNone);
    for (auto& r : layer.rows) r.assign(side_bytes, 0);  // zeros: finite even where unused
    Reset(l, 0);
    Refresh(l, 0);
  }
}

uint32_t WindowStore::SlotOf(uint32_t p) const {
  if (p < window_.sinks) return p;
  return window_.sinks + (p - window_.sinks) % ring_;
}

uint8_t* WindowStore::Row(Layer& l, int side, uint32_t head, uint32_t slot) {
  return l.rows[side].data() + (size_t{head} * slots_ + slot) * row_bytes_;
}

// Position p of every head, both sides, into `slot`; k, v: [n_kv_heads][head_dim].
void WindowStore::WriteRow(Layer& l, uint32_t slot, uint32_t p, const float* k, const float* v) {
  const uint32_t D = geometry_.head_dim();
  const float* src[2] = {k, v};
  for (int side = 0; side < 2; ++side) {
    for (uint32_t h = 0; h < geometry_.n_kv_heads(); ++h) {
      // Sizes are right by construction and bf16 takes any finite row.
      (void)codec_.EncodePrepared({src[side] + size_t{h} * D, D},
                                  {Row(l, side, h, slot), row_bytes_});
    }
  }
  l.slot_pos[slot] = p;
}

void WindowStore::Append(uint32_t layer, uint32_t n0, uint32_t T, const float* k,
                         const float* v) {
  const size_t kv = geometry_.kv_dim();
  const uint32_t n1 = n0 + T, S = window_.sinks, R = ring_;
  // The ring keeps the last R positions of the append (and of the sequence).
  const uint32_t ring_from = std::max(S, n1 > R ? n1 - R : 0u);
  Layer& l = layers_[layer];
  for (uint32_t t = 0; t < T; ++t) {
    const uint32_t p = n0 + t;
    const size_t at = size_t{t} * kv;
    const float* kr = k ? k + at : zeros_.data();
    const float* vr = v ? v + at : zeros_.data();
    if (p < S) {
      if (p == l.sinks_held) {
        WriteRow(l, p, p, kr, vr);
        ++l.sinks_held;
      }
    } else if (R > 0 && p >= ring_from) {
      WriteRow(l, SlotOf(p), p, kr, vr);
    }
  }
  // Positions below S that are not held sinks, and those that left the
  // ring, are the cache's. Every position that leaves the ring here had its
  // slot overwritten: an append of R or more positions rewrites every slot,
  // and in a shorter one a held p' < ring_from (so p' >= n0 - R) is
  // replaced by p' + R.
  l.ring_begin = std::max({l.ring_begin, std::min(n1, S), R > 0 ? ring_from : n1});
}

void WindowStore::Truncate(uint32_t layer, uint32_t n) {
  Layer& l = layers_[layer];
  for (uint32_t& p : l.slot_pos) {
    if (p != kNone && p >= n) p = kNone;
  }
  l.sinks_held = std::min(l.sinks_held, n);
  l.ring_begin = std::min(l.ring_begin, n);
}

void WindowStore::Reset(uint32_t layer, uint32_t n) {
  Layer& l = layers_[layer];
  std::fill(l.slot_pos.begin(), l.slot_pos.end(), kNone);
  l.sinks_held = 0;
  l.ring_begin = n;
}

void WindowStore::CopySinks(uint32_t layer, uint8_t* out) const {
  const Layer& l = layers_[layer];
  const size_t n = size_t{window_.sinks} * row_bytes_;
  for (int side = 0; side < 2; ++side) {
    for (uint32_t h = 0; h < geometry_.n_kv_heads(); ++h) {
      std::memcpy(out, l.rows[side].data() + size_t{h} * slots_ * row_bytes_, n);
      out += n;
    }
  }
}

void WindowStore::SetSinks(uint32_t layer, const uint8_t* in) {
  Layer& l = layers_[layer];
  const uint32_t S = window_.sinks;
  const size_t n = size_t{S} * row_bytes_;
  for (int side = 0; side < 2; ++side) {
    for (uint32_t h = 0; h < geometry_.n_kv_heads(); ++h) {
      std::memcpy(Row(l, side, h, 0), in, n);
      in += n;
    }
  }
  for (uint32_t p = 0; p < S; ++p) l.slot_pos[p] = p;
  l.sinks_held = S;
  l.ring_begin = std::max(l.ring_begin, S);
}

void WindowStore::Refresh(uint32_t layer, uint32_t num_tokens) {
  Layer& l = layers_[layer];
  const uint32_t H = geometry_.n_kv_heads(), W = window_.recent;
  l.hot_begin = std::max(l.ring_begin, num_tokens > W ? num_tokens - W : 0u);
  l.cold_len.assign(H, std::min(l.hot_begin, num_tokens));
  l.hot_len.assign(H, std::min(num_tokens, slots_));
  l.positions.assign(H, l.slot_pos.data());
  LayerKvView& v = l.view;
  v = LayerKvView{};
  v.n_kv_heads = H;
  v.head_dim = geometry_.head_dim();
  v.block_size = slots_;
  v.num_tokens = num_tokens;
  v.head_len = l.hot_len.data();
  v.positions = l.positions.data();
  static constexpr uint32_t kOneBlock[1] = {0};
  v.block_table = kOneBlock;
  v.num_blocks = 1;
  KvSideView* sides[2] = {&v.k, &v.v};
  for (int side = 0; side < 2; ++side) {
    l.head_base[side].resize(H);
    for (uint32_t h = 0; h < H; ++h) l.head_base[side][h] = Row(l, side, h, 0);
    KvSideView& sv = *sides[side];
    sv.format = Format::kBF16;
    sv.row_bytes = static_cast<uint32_t>(row_bytes_);
    sv.codec = &codec_;
    sv.head_base = l.head_base[side].data();
  }
}

Status WindowStore::Overlay(uint32_t layer, int side, uint32_t head,
                            std::vector<float>& rows) const {
  const Layer& l = layers_[layer];
  const uint32_t D = geometry_.head_dim();
  for (uint32_t slot = 0; slot < slots_; ++slot) {
    const uint32_t p = l.slot_pos[slot];
    if (p == kNone || (p >= l.sinks_held && p < l.hot_begin) || size_t{p + 1} * D > rows.size()) {
      continue;
    }
    const uint8_t* src = l.rows[side].data() + (size_t{head} * slots_ + slot) * row_bytes_;
    KV_RETURN_IF_ERROR(codec_.Decode({src, row_bytes_}, {rows.data() + size_t{p} * D, D}));
  }
  return Status::Ok();
}

uint32_t WindowStore::held(uint32_t layer) const {
  const auto& pos = layers_[layer].slot_pos;
  return static_cast<uint32_t>(pos.size() - std::count(pos.begin(), pos.end(), kNone));
}

size_t WindowStore::allocated_bytes(uint32_t layer) const {
  return layers_[layer].rows[0].size() + layers_[layer].rows[1].size();
}

size_t WindowStore::allocated_bytes() const {
  size_t n = 0;
  for (uint32_t l = 0; l < layers_.size(); ++l) n += allocated_bytes(l);
  return n;
}

Status WindowStore::CheckInvariants(uint32_t layer, uint32_t num_tokens) const {
  const Layer& l = layers_[layer];
  auto broken = [&](const char* what) {
    return Status::Internal(fmt::format("cache invariant: precision window, layer {}: {}", layer,
                                        what));
  };
  if (l.sinks_held > std::min(num_tokens, window_.sinks)) return broken("too many sinks held");
  if (l.ring_begin < l.sinks_held) return broken("the ring starts below the sinks");
  if (num_tokens > l.ring_begin && l.ring_begin < window_.sinks) {
    return broken("the ring starts inside the sinks");
  }
  if (num_tokens > l.ring_begin && num_tokens - l.ring_begin > ring_) {
    return broken("more ring rows than slots");
  }
  for (uint32_t p = 0; p < num_tokens; ++p) {
    const bool held = p < l.sinks_held || p >= l.ring_begin;
    if (held && l.slot_pos[SlotOf(p)] != p) return broken("a held position is not in its slot");
  }
  for (uint32_t slot = 0; slot < slots_; ++slot) {
    const uint32_t p = l.slot_pos[slot];
    if (p == kNone) continue;
    if (p >= num_tokens || SlotOf(p) != slot || (p >= l.sinks_held && p < l.ring_begin)) {
      return broken("a slot holds a position the window does not");
    }
  }
  return Status::Ok();
}

}  // namespace kvcache
