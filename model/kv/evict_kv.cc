// EvictKv: KvBackend on HybridSequence with streaming or H2O eviction.
#include "model/kv/evict_kv.h"

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

Result<std::unique_ptr<EvictKv>> EvictKv::Create(const AttentionShape& shape, FormatPair formats,
                                                 const EvictionSpec& spec) {
  if (!spec.enabled()) return Status::InvalidArgument("evict kv: no eviction policy");
  KV_ASSIGN_OR_RETURN(Geometry geometry, Geometry::Create({shape.n_layers, shape.n_kv_heads, shape.head_dim, 16}));
  std::vector<LayerSpec> layers;
  for (uint32_t l = 0; l < shape.n_layers; ++l) {
    if (spec.kind == EvictionSpec::Kind::kStreaming) {
      layers.push_back(LayerSpec::Window(spec.sinks, spec.window));
    } else {
      layers.push_back(LayerSpec::FullWithPolicies(std::vector<EvictionPolicy>(
          shape.n_kv_heads, EvictionPolicy::HeavyHitter(spec.budget - spec.recent, spec.recent))));
    }
  }
  HybridModelOptions ho;
  ho.window_lookback_tokens = spec.max_chunk_tokens > 0 ? spec.max_chunk_tokens - 1 : 0;
  KV_ASSIGN_OR_RETURN(std::shared_ptr<const HybridModel> model,
                      HybridModel::Create(geometry, formats, std::move(layers), ho));
  ContiguousOptions c;
  c.capacity_tokens = shape.max_seq_len;
  KV_ASSIGN_OR_RETURN(HybridSequence seq, HybridSequence::CreateContiguous(model, c));
  return std::unique_ptr<EvictKv>(new EvictKv(shape, spec, std::move(seq)));
}

Status EvictKv::BeforePass(uint32_t len, uint32_t n) {
  if (spec_.kind == EvictionSpec::Kind::kStreaming && n > spec_.max_chunk_tokens) {
    return Status::InvalidArgument("evict kv: a pass of " + std::to_string(n) + " tokens exceeds max_chunk_tokens " +
                                   std::to_string(spec_.max_chunk_tokens));
  }
  // H2O: the importance of every earlier pass is in; evict before adding more.
  if (spec_.kind == EvictionSpec::Kind::kH2o && len > 0) KV_RETURN_IF_ERROR(seq_.Evict());
  return Status::Ok();
}

Status EvictKv::Store(uint32_t layer, std::span<const float> k, std::span<const float> v) {
  KV_RETURN_IF_ERROR(CheckStore(layer));
  return seq_.AppendLayer(layer, {.k = k, .v = v});
}

Status EvictKv::Attend(uint32_t layer, std::span<const float> q, std::span<float> out) {
  KV_RETURN_IF_ERROR(CheckAttend(layer));
  AttentionOptions options;
  options.n_q_heads = shape_.n_heads;
  AttentionOutput output;
  output.out = out;
  const bool h2o = spec_.kind == EvictionSpec::Kind::kH2o;
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
