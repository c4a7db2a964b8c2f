// HybridModel and HybridSequence (contracts in include/kvcache/hybrid.h).
//
// A sequence is up to two SequenceCaches (full and bounded groups) plus one
// LinearState per linear layer. Speculative drafts are bookkeeping on top:
// the caches roll back with Truncate (rows past n0 + a), the linear states
// with their own scratch lanes, and window compaction is suspended while a
// draft is open and re-applied (a pure function of the length) afterwards.
#include "kvcache/hybrid.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "attention/plan.h"

namespace kvcache {
namespace {

Status ReleasedError() { return Status::FailedPrecondition("hybrid: sequence was released"); }
Status DraftOpen(const char* what) {
  return Status::FailedPrecondition(fmt::format("hybrid: {} while a draft is open", what));
}

bool Bounded(const EvictionPolicy& p) { return p.kind != EvictionKind::kKeepAll; }

// First position a window head of `layer` keeps past its sinks at length n
// (0 = all): lo(n) = S + G * floor((n - S - W - L) / G) once n > S + W + L.
uint32_t WindowLow(const HybridModel& m, uint32_t layer, const EvictionPolicy& p, uint32_t n) {
  const uint64_t S = p.sink_tokens, W = p.window_tokens, L = m.options().window_lookback_tokens;
  const uint64_t G = m.window_slack(layer);
  if (n <= S + W + L) return 0;
  return static_cast<uint32_t>(S + G * ((n - S - W - L) / G));
}

}  // namespace

std::string_view LayerKindName(LayerKind kind) {
  switch (kind) {
    case LayerKind::kFull: return "full";
    case LayerKind::kWindow: return "window";
    case LayerKind::kLinear: return "linear";
  }
  return "unknown";
}

// --- HybridModel -------------------------------------------------------------

Result<std::shared_ptr<const HybridModel>> HybridModel::Create(const Geometry& geometry,
                                                              FormatPair formats,
                                                              std::vector<LayerSpec> layers,
                                                              const HybridModelOptions& options) {
  const uint32_t L = geometry.n_layers(), H = geometry.n_kv_heads(), D = geometry.head_dim();
  if (layers.size() != L) {
    return Status::InvalidArgument(
        fmt::format("hybrid model: {} layer specs for {} layers", layers.size(), L));
  }
  KV_RETURN_IF_ERROR(CheckHeadDim(formats.k, D));
  KV_RETURN_IF_ERROR(CheckHeadDim(formats.v, D));
  if (options.bounded_formats) {
    KV_RETURN_IF_ERROR(CheckHeadDim(options.bounded_formats->k, D));
    KV_RETURN_IF_ERROR(CheckHeadDim(options.bounded_formats->v, D));
  }
  if (options.max_draft_tokens == 0) {
    return Status::InvalidArgument("hybrid model: max_draft_tokens must be >= 1");
  }
  std::shared_ptr<HybridModel> m(new HybridModel(geometry));
  m->formats_ = formats;
  m->options_ = options;
  if (m->options_.window_slack_tokens == 0) m->options_.window_slack_tokens = geometry.block_size();
  m->policies_.resize(L);
  m->group_.assign(L, -1);
  m->group_layer_.assign(L, 0);
  for (uint32_t l = 0; l < L; ++l) {
    const LayerSpec& s = layers[l];
    auto bad = [&](const std::string& why) {
      return Status::InvalidArgument(
          fmt::format("hybrid model: layer {} ({}): {}", l, LayerKindName(s.kind), why));
    };
    switch (s.kind) {
      case LayerKind::kWindow: {
        if (!s.head_policies.empty()) return bad("a window layer takes no head_policies");
        const EvictionPolicy p = EvictionPolicy::Window(s.sink_tokens, s.window_tokens);
        const Status st = p.Validate();
        if (!st.ok()) return bad(st.message());
        m->policies_[l].assign(H, p);
        break;
      }
      case LayerKind::kFull:
        if (s.sink_tokens || s.window_tokens) return bad("sink/window sizes belong to kWindow");
        if (s.head_policies.empty()) {
          m->policies_[l].assign(H, EvictionPolicy::KeepAll());
        } else {
          if (s.head_policies.size() != H) {
            return bad(fmt::format("{} head policies for {} kv heads", s.head_policies.size(), H));
          }
          for (const EvictionPolicy& p : s.head_policies) {
            const Status st = p.Validate();
            if (!st.ok()) return bad(st.message());
          }
          m->policies_[l] = s.head_policies;
        }
        break;
      case LayerKind::kLinear: {
        if (!s.head_policies.empty() || s.sink_tokens || s.window_tokens) {
          return bad("a linear layer takes no eviction policies or window");
        }
        auto probe = LinearState::Create({.n_heads = H, .d_k = 1, .d_v = 1, .rule = s.rule,
                                          .head_gate = s.head_gate,
                                          .max_draft_tokens = options.max_draft_tokens});
        if (!probe.ok()) return bad(probe.status().message());
        break;
      }
      default:
        return bad("unknown layer kind");
    }
    if (s.kind != LayerKind::kLinear) {
      const auto& ps = m->policies_[l];
      const int g = std::all_of(ps.begin(), ps.end(), Bounded) ? kBoundedGroup : kFullGroup;
      m->group_[l] = g;
      m->group_layer_[l] = m->group_size_[g]++;
    }
  }
  m->layers_ = std::move(layers);
  // Window blocks: window layers without sinks sharing one window, and a
  // slack of whole blocks, make lo(n) one block boundary for the group.
  bool aligned = m->group_size_[kBoundedGroup] > 0 &&
                 m->options_.window_slack_tokens % geometry.block_size() == 0;
  for (uint32_t l = 0; l < L && aligned; ++l) {
    if (m->group_[l] != kBoundedGroup) continue;
    const LayerSpec& s = m->layers_[l];
    aligned = s.kind == LayerKind::kWindow && s.sink_tokens == 0 &&
              s.window_tokens == m->layers_[m->first_bounded_layer()].window_tokens;
  }
  m->window_blocks_aligned_ = aligned;
  return std::shared_ptr<const HybridModel>(std::move(m));
}

uint32_t HybridModel::first_bounded_layer() const {
  for (uint32_t l = 0; l < n_layers(); ++l) {
    if (group_[l] == kBoundedGroup) return l;
  }
  return 0;
}

uint32_t HybridModel::WindowKeepFrom(uint32_t n) const {
  if (!window_blocks_aligned_) return 0;
  const uint32_t l = first_bounded_layer();
  return WindowLow(*this, l, policies_[l][0], n);
}

uint32_t HybridModel::window_slack(uint32_t layer) const {
  return layers_[layer].kind == LayerKind::kWindow ? options_.window_slack_tokens : 1;
}

Geometry HybridModel::group_geometry(int group) const {
  auto g = Geometry::Create({.n_layers = group_size_[group],
                             .n_kv_heads = geometry_.n_kv_heads(),
                             .head_dim = geometry_.head_dim(),
                             .block_size = geometry_.block_size()});
  assert(g.ok());
  return *g;
}

Result<std::vector<std::shared_ptr<BlockPool>>> HybridModel::CreatePools(
    std::span<const uint32_t> blocks_per_group, const BlockPoolOptions& options) const {
  if (blocks_per_group.size() != 2) {
    return Status::InvalidArgument("hybrid model: CreatePools wants [2] block counts");
  }
  std::vector<std::shared_ptr<BlockPool>> pools(2);
  for (int g = 0; g < 2; ++g) {
    if (group_size_[g] == 0) continue;
    BlockPoolOptions o = options;
    o.num_blocks = blocks_per_group[g];
    KV_ASSIGN_OR_RETURN(pools[g], BlockPool::Create(group_geometry(g), group_formats(g), o));
  }
  return pools;
}

// --- HybridSequence: creation and lifetime ----------------------------------------

HybridSequence::HybridSequence(HybridSequence&&) noexcept = default;
HybridSequence& HybridSequence::operator=(HybridSequence&&) noexcept = default;
HybridSequence::~HybridSequence() = default;

namespace {
Result<std::vector<std::unique_ptr<LinearState>>> MakeLinear(const HybridModel& m) {
  std::vector<std::unique_ptr<LinearState>> out(m.n_layers());
  const uint32_t H = m.geometry().n_kv_heads(), D = m.geometry().head_dim();
  for (uint32_t l = 0; l < m.n_layers(); ++l) {
    if (m.kind(l) != LayerKind::kLinear) continue;
    KV_ASSIGN_OR_RETURN(LinearState st,
                        LinearState::Create({.n_heads = H, .d_k = D, .d_v = D,
                                             .rule = m.spec(l).rule,
                                             .head_gate = m.spec(l).head_gate,
                                             .max_draft_tokens = m.options().max_draft_tokens}));
    out[l] = std::make_unique<LinearState>(std::move(st));
  }
  return out;
}

// A precision window (cache.h) is held by the full group alone: the bounded
// group's heads drop rows (window compaction, Evict), which a window does
// not allow. So every head of the full group must keep every row.
Status CheckPrecisionWindow(const HybridModel& m, const PrecisionWindow& w) {
  if (!w.enabled()) return Status::Ok();
  if (m.group_size(HybridModel::kFullGroup) == 0) {
    return Status::InvalidArgument("hybrid: a precision window needs at least one full layer (it applies to those)");
  }
  for (uint32_t l = 0; l < m.n_layers(); ++l) {
    if (m.group(l) != HybridModel::kFullGroup) continue;
    const std::vector<EvictionPolicy>& heads = m.head_policies(l);
    for (size_t h = 0; h < heads.size(); ++h) {
      if (heads[h].kind != EvictionKind::kKeepAll) {
        return Status::InvalidArgument(fmt::format(
            "hybrid: a precision window needs every head of the full layers to keep every row; layer {} "
            "head {} has an eviction policy",
            l, h));
      }
    }
  }
  return Status::Ok();
}

// The options of group g's SequenceCache: the window for the full group only.
template <class Options>
Options GroupOptions(const Options& options, int g) {
  Options o = options;
  if (g != HybridModel::kFullGroup) o.window = PrecisionWindow{};
  return o;
}

}  // namespace

Result<HybridSequence> HybridSequence::CreateContiguous(std::shared_ptr<const HybridModel> model,
                                                        const ContiguousOptions& options) {
  if (!model) return Status::InvalidArgument("hybrid: no model");
  KV_RETURN_IF_ERROR(CheckPrecisionWindow(*model, options.window));
  HybridSequence seq;
  seq.model_ = model;
  seq.layout_ = CacheLayout::kContiguous;
  for (int g = 0; g < 2; ++g) {
    if (model->group_size(g) == 0) continue;
    KV_ASSIGN_OR_RETURN(SequenceCache c, SequenceCache::CreateContiguous(model->group_geometry(g), model->group_formats(g),
                                                                         GroupOptions(options, g)));
    seq.groups_[g] = std::make_unique<SequenceCache>(std::move(c));
  }
  KV_ASSIGN_OR_RETURN(seq.linear_, MakeLinear(*model));
  seq.window_pending_.assign(model->n_layers(), 0);
  return seq;
}

Result<HybridSequence> HybridSequence::CreatePaged(
    std::shared_ptr<const HybridModel> model, std::span<const std::shared_ptr<BlockPool>> pools,
    const PagedOptions& options) {
  if (!model) return Status::InvalidArgument("hybrid: no model");
  KV_RETURN_IF_ERROR(CheckPrecisionWindow(*model, options.window));
  if (pools.size() != 2) {
    return Status::InvalidArgument("hybrid: CreatePaged wants [2] pools (full, bounded)");
  }
  for (int g = 0; g < 2; ++g) {
    if (model->group_size(g) == 0) continue;
    const auto& p = pools[g];
    if (!p || !(p->geometry() == model->group_geometry(g)) || !(p->formats() == model->group_formats(g))) {
      return Status::InvalidArgument(fmt::format(
          "hybrid: pool {} must have geometry {} and formats {} (see HybridModel::CreatePools)", g,
          model->group_geometry(g).ToString(), FormatPairName(model->group_formats(g))));
    }
  }
  HybridSequence seq;
  seq.model_ = model;
  seq.layout_ = CacheLayout::kPaged;
  for (int g = 0; g < 2; ++g) {
    if (model->group_size(g) == 0) continue;
    KV_ASSIGN_OR_RETURN(SequenceCache c, SequenceCache::CreatePaged(pools[g], GroupOptions(options, g)));
    seq.groups_[g] = std::make_unique<SequenceCache>(std::move(c));
  }
  KV_ASSIGN_OR_RETURN(seq.linear_, MakeLinear(*model));
  seq.window_pending_.assign(model->n_layers(), 0);
  return seq;
}

void HybridSequence::Release() {
  if (released_) return;
  for (auto& g : groups_) {
    if (g) g->Release();
  }
  for (auto& l : linear_) {
    if (l) l->Clear();
  }
  in_draft_ = false;
  std::fill(window_pending_.begin(), window_pending_.end(), 0);
  released_ = true;
}

// --- lengths -----------------------------------------------------------------------

uint32_t HybridSequence::num_tokens(uint32_t layer) const {
  if (layer >= model_->n_layers()) return 0;
  if (linear_[layer]) {
    return static_cast<uint32_t>(linear_[layer]->num_tokens() + linear_[layer]->draft_tokens());
  }
  return cache_of(layer).num_tokens(model_->group_layer(layer));
}

bool HybridSequence::window_compaction_pending() const {
  return std::any_of(window_pending_.begin(), window_pending_.end(),
                     [](uint8_t p) { return p != 0; });
}

uint32_t HybridSequence::num_tokens() const {
  uint32_t m = 0;
  for (uint32_t l = 0; l < model_->n_layers(); ++l) m = std::max(m, num_tokens(l));
  return m;
}

Status HybridSequence::CheckUsable() const { return released_ ? ReleasedError() : Status::Ok(); }

Status HybridSequence::CheckAttention(uint32_t layer) const {
  KV_RETURN_IF_ERROR(CheckUsable());
  if (layer >= model_->n_layers()) {
    return Status::OutOfRange(fmt::format("hybrid: layer {} of {}", layer, model_->n_layers()));
  }
  if (linear_[layer]) {
    return Status::InvalidArgument(fmt::format("hybrid: layer {} is linear (no K/V)", layer));
  }
  return Status::Ok();
}

std::vector<uint8_t> HybridSequence::AliveMask(uint32_t layer) const {
  const auto& ps = model_->head_policies(layer);
  if (std::none_of(ps.begin(), ps.end(), [](const EvictionPolicy& p) { return p.dead(); })) {
    return {};
  }
  std::vector<uint8_t> alive(ps.size());
  for (size_t h = 0; h < ps.size(); ++h) alive[h] = ps[h].dead() ? 0 : 1;
  return alive;
}

// --- appends ---------------------------------------------------------------------------

Status HybridSequence::AppendLayer(uint32_t layer, const HybridLayerInputs& in,
                                   std::span<float> out) {
  KV_RETURN_IF_ERROR(CheckUsable());
  if (layer >= model_->n_layers()) {
    return Status::OutOfRange(fmt::format("hybrid: layer {} of {}", layer, model_->n_layers()));
  }
  if (linear_[layer]) {
    return linear_[layer]->Append({.k = in.k, .v = in.v, .gate = in.gate, .q = in.q}, out);
  }
  if (!in.gate.empty() || !in.q.empty() || !out.empty()) {
    return Status::InvalidArgument(
        fmt::format("hybrid: layer {} is an attention layer: no gate, q or out", layer));
  }
  const std::vector<uint8_t> alive = AliveMask(layer);
  KV_RETURN_IF_ERROR(cache_of(layer).AppendLayer(model_->group_layer(layer), in.k, in.v,
                                                 AppendOptions{.alive = alive}));
  if (!in_draft_) return EnforceWindows(layer);
  return Status::Ok();
}

Status HybridSequence::Append(std::span<const float> k, std::span<const float> v) {
  KV_RETURN_IF_ERROR(CheckUsable());
  const size_t L = model_->n_layers();
  if (k.size() != v.size() || k.size() % L != 0) {
    return Status::InvalidArgument(fmt::format(
        "hybrid: Append wants k and v of equal size n_layers ({}) * n_tokens * kv_dim, got {} "
        "and {}",
        L, k.size(), v.size()));
  }
  const size_t per_layer = k.size() / L;
  if (per_layer == 0 || per_layer % model_->geometry().kv_dim() != 0) {
    return Status::InvalidArgument("hybrid: Append: per-layer size is not n_tokens * kv_dim");
  }
  for (uint32_t l = 0; l < L; ++l) {
    const Status s = AppendLayer(
        l, {.k = k.subspan(l * per_layer, per_layer), .v = v.subspan(l * per_layer, per_layer)});
    if (!s.ok()) {
      return Status(s.code(), fmt::format("hybrid: layer {} (layers before it were appended): {}",
                                          l, s.message()));
    }
  }
  return Status::Ok();
}

// --- window enforcement -------------------------------------------------------------------

Status HybridSequence::EnforceWindows(uint32_t layer) {
  if (linear_[layer]) return Status::Ok();
  if (drops_window_blocks() && model_->group(layer) == HybridModel::kBoundedGroup) {
    // Releases blocks only: nothing to wait for, never pending.
    KV_RETURN_IF_ERROR(DropWindowBlocks());
    window_pending_[layer] = 0;
    return Status::Ok();
  }
  // Pending until a pass over every window head succeeds (a failing
  // KeepRows leaves the heads before it compacted, the rest not yet).
  window_pending_[layer] = 1;
  KV_RETURN_IF_ERROR(CompactWindows(layer));
  window_pending_[layer] = 0;
  return Status::Ok();
}

Status HybridSequence::CompactWindows(uint32_t layer) {
  const auto& ps = model_->head_policies(layer);
  SequenceCache& c = cache_of(layer);
  const uint32_t gl = model_->group_layer(layer);
  const uint32_t n = c.num_tokens(gl);
  for (uint32_t h = 0; h < ps.size(); ++h) {
    if (ps[h].kind != EvictionKind::kWindow) continue;
    const uint32_t lo = WindowLow(*model_, layer, ps[h], n);
    if (lo == 0) continue;
    // Rows are ascending by position: sinks first, then the recent run. The
    // head is compact iff its first non-sink row is at lo or later.
    KV_ASSIGN_OR_RETURN(const LayerKvView view, c.View(gl));
    const uint32_t len = view.rows(h);
    uint32_t first = 0;
    while (first < len && view.position(h, first) < ps[h].sink_tokens) ++first;
    if (first == len || view.position(h, first) >= lo) continue;
    std::vector<uint32_t> keep(first);
    std::iota(keep.begin(), keep.end(), 0u);
    for (uint32_t r = first; r < len; ++r) {
      if (view.position(h, r) >= lo) keep.push_back(r);
    }
    KV_RETURN_IF_ERROR(c.KeepRows(gl, h, keep));
  }
  return Status::Ok();
}

bool HybridSequence::bounded_group_even() const {
  const SequenceCache& c = *groups_[HybridModel::kBoundedGroup];
  for (uint32_t gl = 1; gl < c.n_layers(); ++gl) {
    if (c.num_tokens(gl) != c.num_tokens(0)) return false;
  }
  return true;
}

Status HybridSequence::DropWindowBlocks() {
  if (!bounded_group_even()) return Status::Ok();  // the last layer of the pass drops
  SequenceCache& c = *groups_[HybridModel::kBoundedGroup];
  // Every head holds the run [first, n) (window layers store every
  // position); first and lo are multiples of the block size.
  const uint32_t n = c.num_tokens(0);
  const uint32_t first = n - c.head_len(0, 0);
  const uint32_t lo = model_->WindowKeepFrom(n);
  if (lo <= first) return Status::Ok();
  return c.DropLeadingBlocks((lo - first) / c.block_size());
}

Status HybridSequence::EnforceAllWindows() {
  // Every attention layer is pending until its own pass succeeds: a failure
  // in one layer leaves the layers after it uncompacted as well.
  for (uint32_t l = 0; l < model_->n_layers(); ++l) window_pending_[l] = linear_[l] ? 0 : 1;
  for (uint32_t l = 0; l < model_->n_layers(); ++l) KV_RETURN_IF_ERROR(EnforceWindows(l));
  return Status::Ok();
}

// --- speculative decoding ------------------------------------------------------------------

Status HybridSequence::BeginDraft() {
  KV_RETURN_IF_ERROR(CheckUsable());
  if (in_draft_) return Status::FailedPrecondition("hybrid: a draft is already open (no nesting)");
  const uint32_t n = num_tokens(0);
  for (uint32_t l = 1; l < model_->n_layers(); ++l) {
    if (num_tokens(l) != n) {
      return Status::FailedPrecondition(fmt::format(
          "hybrid: BeginDraft needs every layer at the same length (layer 0 has {}, layer {} "
          "has {})",
          n, l, num_tokens(l)));
    }
  }
  if (n == 0) {
    return Status::FailedPrecondition(
        "hybrid: BeginDraft needs a prefilled sequence (the first append calibrates formats)");
  }
  for (auto& lin : linear_) {
    if (lin) {
      const Status s = lin->BeginDraft();
      assert(s.ok());
      (void)s;
    }
  }
  in_draft_ = true;
  draft_base_ = n;
  return Status::Ok();
}

Status HybridSequence::Commit(uint32_t num_accepted) {
  KV_RETURN_IF_ERROR(CheckUsable());
  if (!in_draft_) return Status::FailedPrecondition("hybrid: Commit without a draft");
  for (uint32_t l = 0; l < model_->n_layers(); ++l) {
    const uint32_t drafted = num_tokens(l) - draft_base_;
    if (num_accepted > drafted) {
      return Status::OutOfRange(fmt::format(
          "hybrid: commit of {} tokens, layer {} drafted only {}", num_accepted, l, drafted));
    }
  }
  for (auto& g : groups_) {
    if (g) KV_RETURN_IF_ERROR(g->Truncate(draft_base_ + num_accepted));
  }
  for (auto& lin : linear_) {
    if (lin) KV_RETURN_IF_ERROR(lin->Commit(num_accepted));
  }
  in_draft_ = false;
  return EnforceAllWindows();
}

Status HybridSequence::Abort() {
  KV_RETURN_IF_ERROR(CheckUsable());
  if (!in_draft_) return Status::FailedPrecondition("hybrid: Abort without a draft");
  for (auto& g : groups_) {
    if (g) KV_RETURN_IF_ERROR(g->Truncate(draft_base_));
  }
  for (auto& lin : linear_) {
    if (lin) KV_RETURN_IF_ERROR(lin->Abort());
  }
  in_draft_ = false;
  return EnforceAllWindows();
}

Status HybridSequence::Truncate(uint32_t n) {
  KV_RETURN_IF_ERROR(CheckUsable());
  if (in_draft_) return DraftOpen("Truncate");
  const uint32_t cur = num_tokens();
  if (n > cur) {
    return Status::OutOfRange(fmt::format("hybrid: truncate to {} tokens, only {} stored", n, cur));
  }
  if (n == cur) return Status::Ok();
  for (uint32_t l = 0; l < model_->n_layers(); ++l) {
    if (linear_[l]) {
      return Status::FailedPrecondition(fmt::format(
          "hybrid: layer {} is linear; its state cannot be truncated (use a draft)", l));
    }
    // A window head that already evicted positions the shorter length keeps
    // would come out different from a sequence of that length.
    const auto& ps = model_->head_policies(l);
    const uint32_t len = num_tokens(l);
    for (const EvictionPolicy& p : ps) {
      if (p.kind != EvictionKind::kWindow) continue;
      if (WindowLow(*model_, l, p, std::min(n, len)) != WindowLow(*model_, l, p, len)) {
        return Status::FailedPrecondition(fmt::format(
            "hybrid: layer {} evicted positions a length of {} would keep (window {})", l, n,
            p.ToString()));
      }
    }
  }
  for (auto& g : groups_) {
    if (g) KV_RETURN_IF_ERROR(g->Truncate(std::min(n, g->num_tokens())));
  }
  // Layers that were ahead of the group now have its length: drop what the
  // window no longer covers, as the contiguous layout already did.
  if (drops_window_blocks()) return DropWindowBlocks();
  return Status::Ok();
}

// --- eviction ----------------------------------------------------------------------------

Status HybridSequence::Evict() {
  KV_RETURN_IF_ERROR(CheckUsable());
  if (in_draft_) return DraftOpen("Evict");
  for (uint32_t l = 0; l < model_->n_layers(); ++l) {
    if (linear_[l]) continue;
    const auto& ps = model_->head_policies(l);
    SequenceCache& c = cache_of(l);
    const uint32_t gl = model_->group_layer(l);
    for (uint32_t h = 0; h < ps.size(); ++h) {
      if (ps[h].kind != EvictionKind::kHeavyHitter) continue;
      const uint32_t n = c.head_len(gl, h);
      if (n <= ps[h].budget()) continue;
      KV_ASSIGN_OR_RETURN(std::vector<uint32_t> keep,
                          SelectRows(ps[h], n, c.HeadImportance(gl, h)));
      KV_RETURN_IF_ERROR(c.KeepRows(gl, h, keep));
    }
  }
  return Status::Ok();
}

Status HybridSequence::EvictLayer(uint32_t layer, const PolicyTable& table) {
  KV_RETURN_IF_ERROR(CheckAttention(layer));
  if (in_draft_) return DraftOpen("EvictLayer");
  const uint32_t H = model_->geometry().n_kv_heads();
  if (table.n_kv_heads() != H) {
    return Status::InvalidArgument(
        fmt::format("hybrid: policy table for {} heads, layer has {}", table.n_kv_heads(), H));
  }
  SequenceCache& c = cache_of(layer);
  const uint32_t gl = model_->group_layer(layer);
  // Select for every head first, so bad input changes nothing.
  std::vector<std::vector<uint32_t>> keep(H);
  for (uint32_t h = 0; h < H; ++h) {
    const std::vector<float> imp =
        table.head(h).needs_importance() ? c.HeadImportance(gl, h) : std::vector<float>{};
    KV_ASSIGN_OR_RETURN(keep[h], SelectRows(table.head(h), c.head_len(gl, h), imp));
  }
  for (uint32_t h = 0; h < H; ++h) KV_RETURN_IF_ERROR(c.KeepRows(gl, h, keep[h]));
  return Status::Ok();
}

// --- reads --------------------------------------------------------------------------------

Result<LayerKvView> HybridSequence::View(uint32_t layer) const {
  KV_RETURN_IF_ERROR(CheckAttention(layer));
  return cache_of(layer).View(model_->group_layer(layer));
}
Result<std::vector<float>> HybridSequence::HeadKeys(uint32_t layer, uint32_t head) const {
  KV_RETURN_IF_ERROR(CheckAttention(layer));
  return cache_of(layer).HeadKeys(model_->group_layer(layer), head);
}
Result<std::vector<float>> HybridSequence::HeadValues(uint32_t layer, uint32_t head) const {
  KV_RETURN_IF_ERROR(CheckAttention(layer));
  return cache_of(layer).HeadValues(model_->group_layer(layer), head);
}
std::vector<uint32_t> HybridSequence::HeadPositions(uint32_t layer, uint32_t head) const {
  if (!CheckAttention(layer).ok()) return {};
  return cache_of(layer).HeadPositions(model_->group_layer(layer), head);
}
uint32_t HybridSequence::head_len(uint32_t layer, uint32_t head) const {
  if (!CheckAttention(layer).ok()) return 0;
  return cache_of(layer).head_len(model_->group_layer(layer), head);
}
Status HybridSequence::AccumulateImportance(uint32_t layer, uint32_t head,
                                            std::span<const float> probs) {
  KV_RETURN_IF_ERROR(CheckAttention(layer));
  if (in_draft_) return DraftOpen("AccumulateImportance");
  return cache_of(layer).AccumulateImportance(model_->group_layer(layer), head, probs);
}
std::vector<float> HybridSequence::HeadImportance(uint32_t layer, uint32_t head) const {
  if (!CheckAttention(layer).ok()) return {};
  return cache_of(layer).HeadImportance(model_->group_layer(layer), head);
}

Result<const LinearState*> HybridSequence::Linear(uint32_t layer) const {
  KV_RETURN_IF_ERROR(CheckUsable());
  if (layer >= model_->n_layers() || !linear_[layer]) {
    return Status::InvalidArgument(fmt::format("hybrid: layer {} is not a linear layer", layer));
  }
  return static_cast<const LinearState*>(linear_[layer].get());
}

Status HybridSequence::LinearRead(uint32_t layer, std::span<const float> q,
                                  std::span<float> out) const {
  KV_ASSIGN_OR_RETURN(const LinearState* st, Linear(layer));
  return st->Read(q, out);
}

namespace {

// The window a head's policy asks attention for at length n (none when it
// covers everything; attention wants window <= num_tokens).
attention_internal::HeadWindow WindowFor(const EvictionPolicy& p, uint32_t n) {
  const bool win = p.kind == EvictionKind::kWindow && p.window_tokens < n;
  return {win ? p.window_tokens : 0, win ? p.sink_tokens : 0};
}

// FailedPrecondition when window compaction dropped a position that the
// earliest of n_queries queries over n positions still sees (compaction
// last ran at length compacted_at: n, or a draft's start).
Status CheckWindowsCover(const HybridModel& m, uint32_t layer, uint32_t n_queries, uint32_t n,
                         uint32_t compacted_at) {
  if (n_queries <= 1 || n_queries > n) return Status::Ok();
  for (const EvictionPolicy& p : m.head_policies(layer)) {
    if (p.kind != EvictionKind::kWindow) continue;
    const uint32_t lo = WindowLow(m, layer, p, compacted_at);
    const uint32_t p0 = n - n_queries;
    const uint32_t needed_from = p0 + 1 > p.window_tokens ? p0 + 1 - p.window_tokens : 0;
    if (lo > std::max(needed_from, p.sink_tokens)) {
      return Status::FailedPrecondition(fmt::format(
          "hybrid attend: layer {} window {} evicted positions < {} that query {} needs; "
          "set HybridModelOptions::window_lookback_tokens >= {} or verify inside a draft",
          layer, p.ToString(), lo, p0, n_queries - 1));
    }
  }
  return Status::Ok();
}

// A view cut to start `blocks` blocks later, with the arrays it points to.
struct CutView {
  std::vector<uint32_t> head_len;
  std::vector<const uint32_t*> positions;
  std::vector<std::vector<uint32_t>> own_positions;  // when the view had none
};

void CutLeadingBlocks(LayerKvView& view, uint32_t blocks, CutView& cut) {
  const uint32_t rows = blocks * view.block_size, H = view.n_kv_heads;
  cut.head_len.resize(H);
  cut.positions.resize(H);
  if (!view.positions) cut.own_positions.resize(H);
  for (uint32_t h = 0; h < H; ++h) {
    cut.head_len[h] = view.rows(h) - rows;
    if (view.positions) {
      cut.positions[h] = view.positions[h] + rows;
    } else {
      cut.own_positions[h].resize(cut.head_len[h]);
      std::iota(cut.own_positions[h].begin(), cut.own_positions[h].end(), rows);
      cut.positions[h] = cut.own_positions[h].data();
    }
  }
  view.head_len = cut.head_len.data();
  view.positions = cut.positions.data();
  view.block_table += blocks;
  view.num_blocks -= blocks;
}

}  // namespace

Status HybridSequence::Attend(uint32_t layer, uint32_t n_queries, std::span<const float> q,
                              const AttentionOptions& options,
                              const AttentionOutput& output) const {
  KV_RETURN_IF_ERROR(CheckAttention(layer));
  KV_ASSIGN_OR_RETURN(LayerKvView view, View(layer));
  // Window blocks: a layer appended before the last of its group still holds
  // whole blocks before lo(n). Attention does not see them, but its fixed
  // row segments (kernels.cc) would start elsewhere than in the contiguous
  // layout, whose rows start at lo(n): attend from lo(n) too, so that the
  // sums run in the same order (unless per-row probabilities are wanted:
  // those are indexed by the layer's stored rows). Drafts compact nothing in
  // either layout.
  CutView cut;
  if (drops_window_blocks() && model_->group(layer) == HybridModel::kBoundedGroup && !in_draft_ &&
      output.probs.empty() && output.kv_probs.empty() && view.rows(0) > 0) {
    const uint32_t first = view.position(0, 0), lo = model_->WindowKeepFrom(view.num_tokens);
    if (lo > first) CutLeadingBlocks(view, (lo - first) / view.block_size, cut);
  }
  // Inside a draft, compaction stopped at the draft's start.
  KV_RETURN_IF_ERROR(CheckWindowsCover(*model_, layer, n_queries, view.num_tokens,
                                       in_draft_ ? draft_base_ : view.num_tokens));
  // A full layer with a precision window (every head keeps every row):
  // one attention over its rows and its window's.
  if (view.hot) return AttendMulti(view, n_queries, q, options, output);
  std::vector<attention_internal::HeadWindow> windows;
  for (const EvictionPolicy& p : model_->head_policies(layer)) {
    windows.push_back(WindowFor(p, view.num_tokens));
  }
  return attention_internal::AttendHeadWindows(view, n_queries, q, options, windows, output);
}

AttentionOptions HybridSequence::AttentionOptionsFor(uint32_t layer,
                                                     AttentionOptions base) const {
  if (layer < model_->n_layers() && model_->kind(layer) == LayerKind::kWindow) {
    const LayerSpec& s = model_->spec(layer);
    const uint32_t n = num_tokens(layer);
    // attention.h: window <= num_tokens; a window covering everything is none.
    base.window = s.window_tokens >= n ? 0 : s.window_tokens;
    base.n_sink = base.window == 0 ? 0 : s.sink_tokens;
  }
  return base;
}

// --- copies ----------------------------------------------------------------------------------

Result<HybridSequence> HybridSequence::Fork() {
  KV_RETURN_IF_ERROR(CheckUsable());
  if (in_draft_) return DraftOpen("Fork");
  HybridSequence child;
  child.model_ = model_;
  child.layout_ = layout_;
  for (int g = 0; g < 2; ++g) {
    if (!groups_[g]) continue;
    KV_ASSIGN_OR_RETURN(SequenceCache c, groups_[g]->Fork());
    child.groups_[g] = std::make_unique<SequenceCache>(std::move(c));
  }
  child.window_pending_ = window_pending_;
  child.linear_.resize(linear_.size());
  for (size_t l = 0; l < linear_.size(); ++l) {
    if (linear_[l]) child.linear_[l] = std::make_unique<LinearState>(linear_[l]->Copy());
  }
  return child;
}

Result<HybridSequence> HybridSequence::Clone(const CloneOptions& options) const {
  KV_RETURN_IF_ERROR(CheckUsable());
  if (in_draft_) return DraftOpen("Clone");
  HybridSequence copy;
  copy.model_ = model_;
  copy.layout_ = options.layout == CloneLayout::kSame ? layout_ : CacheLayout::kContiguous;
  for (int g = 0; g < 2; ++g) {
    if (!groups_[g]) continue;
    KV_ASSIGN_OR_RETURN(SequenceCache c, groups_[g]->Clone(options));
    copy.groups_[g] = std::make_unique<SequenceCache>(std::move(c));
  }
  copy.window_pending_ = window_pending_;
  copy.linear_.resize(linear_.size());
  for (size_t l = 0; l < linear_.size(); ++l) {
    if (linear_[l]) copy.linear_[l] = std::make_unique<LinearState>(linear_[l]->Copy());
  }
  // A contiguous copy of window blocks compacts as the contiguous layout
  // does: layers still holding rows before their window drop them now (no
  // pool, so this cannot fail for lack of blocks).
  if (drops_window_blocks() && !copy.drops_window_blocks()) {
    for (uint32_t l = 0; l < model_->n_layers(); ++l) {
      if (model_->group(l) == HybridModel::kBoundedGroup) KV_RETURN_IF_ERROR(copy.EnforceWindows(l));
    }
  }
  return copy;
}

// --- prefix reuse ------------------------------------------------------------------------------

namespace {

// What SequenceCache::AdoptPrefix / AdoptBlocksAt would refuse for input
// reasons, checked before either group adopts anything.
Status CheckAdoptable(const SequenceCache& c, std::span<const uint32_t> blocks,
                      const std::shared_ptr<const Calibration>& calibration, const char* what) {
  if (calibration &&
      calibration->transforms.size() != size_t{c.n_layers()} * 2 * c.n_kv_heads()) {
    return Status::InvalidArgument(
        fmt::format("hybrid: AdoptPrefix: the {} calibration does not match the group", what));
  }
  const BlockPool& pool = *c.pool();
  for (uint32_t b : blocks) {
    if (b >= pool.num_blocks() || pool.refcount(b) == 0) {
      return Status::InvalidArgument(
          fmt::format("hybrid: AdoptPrefix: {} block {} is not held", what, b));
    }
  }
  return Status::Ok();
}

}  // namespace

Status HybridSequence::AdoptPrefix(std::span<const uint32_t> full_blocks,
                                   std::shared_ptr<const Calibration> full_calibration,
                                   std::span<const uint32_t> window_blocks,
                                   std::shared_ptr<const Calibration> window_calibration) {
  KV_RETURN_IF_ERROR(CheckUsable());
  if (!drops_window_blocks() || !groups_[HybridModel::kFullGroup]) {
    return Status::FailedPrecondition(
        "hybrid: AdoptPrefix needs the paged layout, a full layer and window blocks "
        "(HybridModel::window_blocks_aligned)");
  }
  for (uint32_t l = 0; l < model_->n_layers(); ++l) {
    if (linear_[l]) {
      return Status::FailedPrecondition(
          fmt::format("hybrid: AdoptPrefix: layer {} is linear (its state is no block)", l));
    }
  }
  if (in_draft_ || num_tokens() != 0) {
    return Status::FailedPrecondition("hybrid: AdoptPrefix needs an empty sequence");
  }
  SequenceCache& full = *groups_[HybridModel::kFullGroup];
  SequenceCache& bounded = *groups_[HybridModel::kBoundedGroup];
  const uint64_t B = full.block_size();
  const uint64_t P = full_blocks.size() * B;
  if (P > (uint64_t{1} << 30)) return Status::InvalidArgument("hybrid: AdoptPrefix: prefix too long");
  const uint32_t keep_from = model_->WindowKeepFrom(static_cast<uint32_t>(P));
  if (window_blocks.size() * B != P - keep_from) {
    return Status::InvalidArgument(fmt::format(
        "hybrid: AdoptPrefix of {} positions wants {} window blocks (positions {}..{}), got {}", P,
        (P - keep_from) / B, keep_from, P, window_blocks.size()));
  }
  KV_RETURN_IF_ERROR(CheckAdoptable(full, full_blocks, full_calibration, "full"));
  KV_RETURN_IF_ERROR(CheckAdoptable(bounded, window_blocks, window_calibration, "window"));
  KV_RETURN_IF_ERROR(bounded.AdoptBlocksAt(keep_from, window_blocks, window_calibration));
  const Status st = full.AdoptPrefix(full_blocks, full_calibration);
  if (!st.ok()) {
    // Not reached after the checks above; give the caller its references back.
    if (!window_blocks.empty()) (void)bounded.pool()->Retain(window_blocks);
    (void)bounded.Clear();
    return st;
  }
  return Status::Ok();
}

Result<SequenceCache*> HybridSequence::GroupForBlocks(int group) const {
  KV_RETURN_IF_ERROR(CheckUsable());
  if (group != HybridModel::kFullGroup && group != HybridModel::kBoundedGroup) {
    return Status::InvalidArgument(fmt::format("hybrid: no group {}", group));
  }
  if (!groups_[group]) return Status::InvalidArgument(fmt::format("hybrid: group {} is empty", group));
  return groups_[group].get();
}

Status HybridSequence::SetBlockHash(int group, uint32_t logical_block, uint64_t hash) {
  KV_ASSIGN_OR_RETURN(SequenceCache * c, GroupForBlocks(group));
  if (in_draft_) return DraftOpen("SetBlockHash");
  return c->SetBlockHash(logical_block, hash);
}

Result<uint32_t> HybridSequence::BlockFirstPosition(int group, uint32_t logical_block) const {
  KV_ASSIGN_OR_RETURN(SequenceCache * c, GroupForBlocks(group));
  return c->BlockFirstPosition(logical_block);
}

// --- accounting and checks -------------------------------------------------------------------

const SequenceCache* HybridSequence::group_cache(int group) const {
  return group >= 0 && group < 2 ? groups_[group].get() : nullptr;
}

Status HybridSequence::Reserve(int group, uint32_t max_rows) {
  KV_RETURN_IF_ERROR(CheckUsable());
  if (group < 0 || group >= 2 || groups_[group] == nullptr) {
    return Status::InvalidArgument(fmt::format("hybrid: Reserve of group {}, which holds no layer", group));
  }
  if (layout_ != CacheLayout::kPaged) return Status::FailedPrecondition("hybrid: Reserve needs the paged layout");
  return groups_[group]->Reserve(max_rows);
}

size_t HybridSequence::allocated_bytes() const {
  size_t total = 0;
  for (const auto& g : groups_) total += g ? g->allocated_bytes() : 0;
  for (const auto& l : linear_) total += l ? l->memory_bytes() : 0;
  return total;
}

size_t HybridSequence::used_bytes() const {
  size_t total = 0;
  for (const auto& g : groups_) total += g ? g->used_bytes() : 0;
  for (const auto& l : linear_) total += l ? l->state().size() * sizeof(double) : 0;
  return total;
}

Status HybridSequence::CheckInvariants() const {
  for (const auto& g : groups_) {
    if (g) KV_RETURN_IF_ERROR(g->CheckInvariants());
  }
  if (released_) return Status::Ok();
  for (uint32_t l = 0; l < model_->n_layers(); ++l) {
    if (linear_[l]) {
      if (linear_[l]->in_draft() != in_draft_) {
        return Status::Internal(fmt::format("hybrid: layer {} draft state disagrees", l));
      }
      continue;
    }
    const auto& ps = model_->head_policies(l);
    const uint32_t n = num_tokens(l);
    for (uint32_t h = 0; h < ps.size(); ++h) {
      const uint32_t len = head_len(l, h);
      if (ps[h].dead() && len != 0) {
        return Status::Internal(fmt::format("hybrid: dead head {} of layer {} stores rows", h, l));
      }
      if (ps[h].kind != EvictionKind::kWindow || in_draft_) continue;
      const uint32_t lo = WindowLow(*model_, l, ps[h], n);
      const uint32_t want = lo == 0 ? n : std::min(n, ps[h].sink_tokens) + (n - lo);
      if (drops_window_blocks() && model_->group(l) == HybridModel::kBoundedGroup &&
          !bounded_group_even()) {
        // Window blocks wait for the last layer of the group: this head holds
        // one run of positions ending at n - 1 that covers its window.
        const std::vector<uint32_t> pos = HeadPositions(l, h);
        if (len < want || len > n || pos.size() != len ||
            (len > 0 && (pos.back() != n - 1 || pos.back() - pos.front() != len - 1))) {
          return Status::Internal(fmt::format(
              "hybrid: window head {} of layer {} holds {} rows that are not one run ending at "
              "{} covering {} positions",
              h, l, len, n - 1, want));
        }
        continue;
      }
      if (window_pending_[l] && len > want && len <= n) {
        // A compaction that failed (PoolExhausted) waits for its retry: the
        // head still holds its sinks and every position from lo on, plus
        // older ones the retry drops.
        const std::vector<uint32_t> pos = HeadPositions(l, h);
        const uint32_t sinks = std::min(n, ps[h].sink_tokens);
        bool ok = pos.size() == len;
        for (uint32_t i = 0; ok && i < sinks; ++i) ok = pos[i] == i;
        for (uint32_t i = 0; ok && i < n - lo; ++i) ok = pos[len - 1 - i] == n - 1 - i;
        if (!ok) {
          return Status::Internal(fmt::format(
              "hybrid: window head {} of layer {} (compaction pending) lost sink or window "
              "positions at length {}",
              h, l, n));
        }
        continue;
      }
      if (len != want) {
        return Status::Internal(fmt::format(
            "hybrid: window head {} of layer {} stores {} rows, want {} at length {}", h, l, len,
            want, n));
      }
    }
  }
  return Status::Ok();
}

}  // namespace kvcache
