// HybridKv: KvBackend on HybridSequence: window layers, streaming or H2O eviction.
#include "model/kv/hybrid_kv.h"

#include <algorithm>

#include <cstdlib>
#include <string>

#include "kvcache/attention.h"

namespace kvcache::model {

std::string EvictionSpec::ToString() const {
  switch (kind) {
    case Kind::kNone: return "none";
    case Kind::kStreaming: return "streaming:" + std::to_string(sinks) + "," + std::to_string(window);
    case Kind::kH2o: return "h2o:" + std::to_string(budget) + "," + std::to_string(recent);
  }
  return "?";
}

Result<EvictionSpec> ParseEvictionSpec(std::string_view text) {
  EvictionSpec s;
  if (text.empty() || text == "none") return s;
  const size_t colon = text.find(':');
  const std::string kind(text.substr(0, colon));
  const std::string args = colon == std::string_view::npos ? "" : std::string(text.substr(colon + 1));
  const size_t comma = args.find(',');
  auto number = [](const std::string& t, uint32_t* out) {
    char* end = nullptr;
    const unsigned long v = std::strtoul(t.c_str(), &end, 10);
    if (t.empty() || *end != '\0' || v > UINT32_MAX) return false;
    *out = static_cast<uint32_t>(v);
    return true;
  };
  uint32_t a = 0, b = 0;
  const bool two = comma != std::string::npos && number(args.substr(0, comma), &a) &&
                   number(args.substr(comma + 1), &b);
  const std::string bad = "eviction '" + std::string(text) + "': want streaming:SINKS,WINDOW or h2o:BUDGET,RECENT";
  if (!two) return Status::InvalidArgument(bad);
  if (kind == "streaming") {
    if (b == 0) return Status::InvalidArgument(bad + " (WINDOW >= 1)");
    s.kind = EvictionSpec::Kind::kStreaming;
    s.sinks = a;
    s.window = b;
  } else if (kind == "h2o") {
    if (b == 0 || a <= b) return Status::InvalidArgument(bad + " (RECENT >= 1, BUDGET > RECENT)");
    s.kind = EvictionSpec::Kind::kH2o;
    s.budget = a;
    s.recent = b;
  } else {
    return Status::InvalidArgument(bad);
  }
  return s;
}

Result<std::shared_ptr<const HybridModel>> HybridKv::MakeModel(const AttentionShape& shape,
                                                                const HybridKvOptions& options) {
  if (!shape.windows.empty() && shape.windows.size() != shape.n_layers) {
    return Status::InvalidArgument("hybrid kv: " + std::to_string(shape.windows.size()) + " windows for " +
                                   std::to_string(shape.n_layers) + " layers");
  }
  if (options.max_chunk_tokens == 0) return Status::InvalidArgument("hybrid kv: max_chunk_tokens must be >= 1");
  KV_ASSIGN_OR_RETURN(Geometry geometry,
                      Geometry::Create({shape.n_layers, shape.n_kv_heads, shape.head_dim, options.block_size}));
  const EvictionSpec& spec = options.eviction;
  std::vector<LayerSpec> layers;
  for (uint32_t l = 0; l < shape.n_layers; ++l) {
    const uint32_t w = shape.window(l);
    if (w != 0) {
      layers.push_back(LayerSpec::Window(0, w));
    } else if (spec.kind == EvictionSpec::Kind::kStreaming) {
      layers.push_back(LayerSpec::Window(spec.sinks, spec.window));
    } else if (spec.kind == EvictionSpec::Kind::kH2o) {
      layers.push_back(LayerSpec::FullWithPolicies(std::vector<EvictionPolicy>(
          shape.n_kv_heads, EvictionPolicy::HeavyHitter(spec.budget - spec.recent, spec.recent))));
    } else {
      layers.push_back(LayerSpec::Full());
    }
  }
  HybridModelOptions ho;
  ho.window_lookback_tokens = options.max_chunk_tokens - 1;
  ho.window_slack_tokens = options.window_slack_tokens;
  if (options.bounded_formats) ho.bounded_formats = *options.bounded_formats;
  return HybridModel::Create(geometry, options.formats, std::move(layers), ho);
}

namespace {

// The most f(S, W, L, G) over the heads of the layers in `group`: each
// head's sinks S, kept positions W (window plus heavy hitters), and its
// layer's lookback L and slack G.
template <class F>
uint64_t MostOverHeads(const HybridModel& model, int group, const F& f) {
  uint64_t most = 0;
  for (uint32_t l = 0; l < model.n_layers(); ++l) {
    if (model.group(l) != group) continue;
    const uint64_t L = model.options().window_lookback_tokens, G = model.window_slack(l);
    for (const EvictionPolicy& p : model.head_policies(l)) {
      most = std::max<uint64_t>(most, f(p.sink_tokens, uint64_t{p.window_tokens} + p.heavy_tokens, L, G));
    }
  }
  return most;
}

}  // namespace

uint64_t HybridKv::BlocksAt(const HybridModel& model, int group, uint64_t tokens) {
  const uint64_t B = model.geometry().block_size();
  const uint64_t all = (tokens + B - 1) / B;
  if (group != HybridModel::kBoundedGroup) return all;
  // A window head (sink S, window W, lookback L, slack G) keeps positions
  // p < S and p >= lo(n) = S + G * floor((n - S - W - L) / G) once n > S + W + L
  // (hybrid.h); a heavy-hitter head its budget plus the lookback and slack.
  const uint64_t most = MostOverHeads(model, group, [&](uint64_t S, uint64_t W, uint64_t L, uint64_t G) {
    if (tokens <= S + W + L) return all;
    const uint64_t lo = S + G * ((tokens - S - W - L) / G);
    return (S + B - 1) / B + (tokens + B - 1) / B - lo / B;
  });
  return std::min(all, most);
}

uint64_t HybridKv::BlocksPerSequence(const HybridModel& model, int group, uint64_t tokens) {
  const uint64_t B = model.geometry().block_size();
  const uint64_t all = (tokens + B - 1) / B;
  if (group != HybridModel::kBoundedGroup) return all;
  // BlocksAt peaks just before a head drops G rows: its sinks, then
  // W + L + G - 1 recent positions, which start on a block boundary only
  // when the sinks fill whole blocks.
  const uint64_t most = MostOverHeads(model, group, [&](uint64_t S, uint64_t W, uint64_t L, uint64_t G) {
    const uint64_t recent = W + L + G - 1;
    return (S + B - 1) / B + (recent + B - 1) / B + (S % B != 0 ? 1 : 0);
  });
  return std::min(all, most);
}

Result<std::unique_ptr<HybridKv>> HybridKv::Create(const AttentionShape& shape, const HybridKvOptions& options) {
  KV_ASSIGN_OR_RETURN(std::shared_ptr<const HybridModel> model, MakeModel(shape, options));
  if (options.layout == CacheLayout::kContiguous) {
    ContiguousOptions c;
    c.capacity_tokens = shape.max_seq_len;
    c.window = options.window;
    KV_ASSIGN_OR_RETURN(HybridSequence seq, HybridSequence::CreateContiguous(model, c));
    return std::unique_ptr<HybridKv>(new HybridKv(shape, options, std::move(seq)));
  }
  std::vector<std::shared_ptr<BlockPool>> pools = options.pools;
  if (pools.empty()) {
    uint32_t blocks[2];
    for (int g = 0; g < 2; ++g) {
      blocks[g] = options.pool_blocks[g] != 0
                      ? options.pool_blocks[g]
                      : static_cast<uint32_t>(4 * BlocksPerSequence(*model, g, shape.max_seq_len));
    }
    KV_ASSIGN_OR_RETURN(pools, model->CreatePools(blocks));
  }
  PagedOptions paged;
  paged.window = options.window;
  KV_ASSIGN_OR_RETURN(HybridSequence seq, HybridSequence::CreatePaged(model, pools, paged));
  return std::unique_ptr<HybridKv>(new HybridKv(shape, options, std::move(seq)));
}

Status HybridKv::AdoptPrefix(std::span<const uint32_t> full_blocks,
                             std::shared_ptr<const Calibration> full_calibration,
                             std::span<const uint32_t> window_blocks,
                             std::shared_ptr<const Calibration> window_calibration) {
  const uint64_t rows = uint64_t{full_blocks.size()} * options_.block_size;
  if (rows > shape_.max_seq_len) {
    return Status::FailedPrecondition("hybrid kv: a prefix of " + std::to_string(rows) +
                                      " positions exceeds max_seq_len " + std::to_string(shape_.max_seq_len));
  }
  KV_RETURN_IF_ERROR(seq_.AdoptPrefix(full_blocks, std::move(full_calibration), window_blocks,
                                      std::move(window_calibration)));
  ClosePass(seq_.num_tokens());
  return Status::Ok();
}

Status HybridKv::BeforePass(uint32_t len, uint32_t n) {
  if (n > options_.max_chunk_tokens) {
    return Status::InvalidArgument("hybrid kv: a pass of " + std::to_string(n) + " tokens exceeds max_chunk_tokens " +
                                   std::to_string(options_.max_chunk_tokens));
  }
  // H2O: the importance of every earlier pass is in; evict before adding more.
  if (options_.eviction.kind == EvictionSpec::Kind::kH2o && len > 0) KV_RETURN_IF_ERROR(seq_.Evict());
  // A reserved sequence: the pass's rows in each group, all or nothing.
  const HybridModel& model = seq_.model();
  for (int g = 0; g < 2; ++g) {
    if (reserve_rows_[g] == 0) continue;
    uint32_t held = 0;
    for (uint32_t l = 0; l < model.n_layers(); ++l) {
      if (model.group(l) != g) continue;
      for (uint32_t h = 0; h < shape_.n_kv_heads; ++h) held = std::max(held, seq_.head_len(l, h));
    }
    KV_RETURN_IF_ERROR(seq_.Reserve(g, std::max(reserve_rows_[g], held + n)));
  }
  return Status::Ok();
}

Status HybridKv::Store(uint32_t layer, std::span<const float> k, std::span<const float> v) {
  KV_RETURN_IF_ERROR(CheckStore(layer));
  KV_RETURN_IF_ERROR(seq_.AppendLayer(layer, {.k = k, .v = v}));
  // The pass's last layer stored: the windows have dropped what they left,
  // and the reservation goes back to Reserve's (what BeforePass added for
  // the pass is given back; lowering a reservation cannot fail).
  if (layer + 1 == shape_.n_layers) {
    for (int g = 0; g < 2; ++g) {
      if (reserve_rows_[g] != 0) (void)seq_.Reserve(g, reserve_rows_[g]);
    }
  }
  return Status::Ok();
}

Status HybridKv::Attend(uint32_t layer, std::span<const float> q, std::span<float> out) {
  KV_RETURN_IF_ERROR(CheckAttend(layer));
  AttentionOptions options;
  options.n_q_heads = shape_.n_heads;
  options.pool = options_.attention_pool;
  AttentionOutput output;
  output.out = out;
  const bool h2o = options_.eviction.kind == EvictionSpec::Kind::kH2o &&
                   seq_.model().head_policies(layer)[0].kind == EvictionKind::kHeavyHitter;
  KV_ASSIGN_OR_RETURN(LayerKvView view, seq_.View(layer));
  const uint32_t rows = view.num_tokens;
  if (h2o) {
    kv_probs_.assign(static_cast<size_t>(shape_.n_kv_heads) * rows, 0.0f);
    output.kv_probs = kv_probs_;
  }
  KV_RETURN_IF_ERROR(seq_.Attend(layer, pass_tokens(), q, options, output));
  if (h2o) {
    for (uint32_t h = 0; h < shape_.n_kv_heads; ++h) {
      std::span<const float> p(kv_probs_.data() + static_cast<size_t>(h) * rows, seq_.head_len(layer, h));
      KV_RETURN_IF_ERROR(seq_.AccumulateImportance(layer, h, p));
    }
  }
  return Status::Ok();
}

}  // namespace kvcache::model
