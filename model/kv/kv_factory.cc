// KV backend selection by name.
#include "model/kv/kv_factory.h"

#include <string>

#include "model/kv/cache_kv.h"
#include "model/kv/hybrid_kv.h"
#include "model/kv/naive_kv.h"

namespace kvcache::model {

namespace {

// The options CacheKv and HybridKv share, from the backend's.
template <class Options>
Options CacheOptions(const KvBackendOptions& o) {
  Options c;
  c.formats = o.formats;
  c.layout = o.layout;
  c.block_size = o.block_size;
  c.attention_pool = o.attention_pool;
  c.window = o.window;
  return c;
}

}  // namespace

Result<std::unique_ptr<KvBackend>> CreateKvBackend(const AttentionShape& shape,
                                                   const KvBackendOptions& options) {
  // The format pair meets head_dim once, where each backend builds its
  // cache or codecs (SequenceCache, BlockPool, RowCodec, HybridModel).
  if (options.window.enabled() && (options.kind == BackendKind::kNaive || options.eviction.enabled())) {
    return Status::InvalidArgument(
        "a precision window (+sN/+rN) needs the cache backend without eviction (the naive backend "
        "models it through kv variants)");
  }
  if (!shape.windows.empty() && shape.windows.size() != shape.n_layers) {
    return Status::InvalidArgument("kv backend: " + std::to_string(shape.windows.size()) + " layer windows for " +
                                   std::to_string(shape.n_layers) + " layers");
  }
  if (options.local_formats && (options.kind == BackendKind::kNaive || !shape.has_windows())) {
    return Status::InvalidArgument(
        "kv backend: a local (sliding-window layer) format needs the cache backend and a model with "
        "sliding-window layers");
  }
  if (options.kind == BackendKind::kNaive) {
    if (options.eviction.enabled()) return Status::InvalidArgument("eviction needs the cache backend");
    KV_ASSIGN_OR_RETURN(auto kv, NaiveKv::Create(shape, options.formats));
    return std::unique_ptr<KvBackend>(std::move(kv));
  }
  if (options.eviction.enabled() && options.layout != CacheLayout::kContiguous) {
    return Status::InvalidArgument("eviction runs on the contiguous layout only");
  }
  if (options.eviction.enabled() || shape.has_windows()) {
    HybridKvOptions h = CacheOptions<HybridKvOptions>(options);
    h.bounded_formats = options.local_formats;
    h.eviction = options.eviction;
    h.max_chunk_tokens = options.max_chunk_tokens;
    h.window_slack_tokens = options.window_slack_tokens;
    KV_ASSIGN_OR_RETURN(auto kv, HybridKv::Create(shape, h));
    return std::unique_ptr<KvBackend>(std::move(kv));
  }
  KV_ASSIGN_OR_RETURN(auto kv, CacheKv::Create(shape, CacheOptions<CacheKvOptions>(options)));
  return std::unique_ptr<KvBackend>(std::move(kv));
}

Result<PrecisionWindow> CacheWindowOf(const KvVariant& variant) {
  KvVariant rest = variant;
  rest.sinks = rest.recent = 0;
  rest.calibrate = false;
  if (!rest.plain()) {
    return Status::InvalidArgument(
        "kv variant '" + KvVariantName(variant) +
        "': the cache builds sinks (+sN) and a recent window (+rN) over a format pair; kc keys, "
        "+ob, +gN, +oN, +rot, +sym and +eb are the naive backend's (--backend naive)");
  }
  PrecisionWindow w;
  w.sinks = variant.sinks;
  w.recent = variant.recent;
  return w;
}

namespace {

// `name` as one of two choices; the error names both.
template <typename E>
Result<E> ParseOneOf(std::string_view what, std::string_view name, std::string_view a, E value_a,
                     std::string_view b, E value_b) {
  if (name == a) return value_a;
  if (name == b) return value_b;
  return Status::InvalidArgument("unknown " + std::string(what) + " '" + std::string(name) +
                                 "' (want " + std::string(a) + " or " + std::string(b) + ")");
}

}  // namespace

Result<BackendKind> ParseBackendKind(std::string_view name) {
  return ParseOneOf("backend", name, "cache", BackendKind::kCache, "naive", BackendKind::kNaive);
}

std::string_view BackendKindName(BackendKind kind) {
  return kind == BackendKind::kCache ? "cache" : "naive";
}

Result<CacheLayout> ParseCacheLayout(std::string_view name) {
  return ParseOneOf("layout", name, "contiguous", CacheLayout::kContiguous, "paged",
                    CacheLayout::kPaged);
}

std::string_view CacheLayoutName(CacheLayout layout) {
  return layout == CacheLayout::kContiguous ? "contiguous" : "paged";
}

namespace {

// One format spelling ("k:v" or a variant with a precision window) into
// formats and window.
Status ParseOneFormat(std::string_view kv_format, BackendKind kind, FormatPair* formats, PrecisionWindow* window) {
  if (kv_format.find('+') != std::string_view::npos) {
    KV_ASSIGN_OR_RETURN(KvVariant variant, ParseKvVariant(kv_format));
    if (kind != BackendKind::kCache) {
      return Status::InvalidArgument("kv format '" + std::string(kv_format) +
                                     "': options (+...) need the cache backend here");
    }
    if (window == nullptr) {
      return Status::InvalidArgument("kv format '" + std::string(kv_format) +
                                     "': a precision window (+sN/+rN) applies to the global layers only");
    }
    KV_ASSIGN_OR_RETURN(*window, CacheWindowOf(variant));
    *formats = variant.formats;
    return Status::Ok();
  }
  KV_ASSIGN_OR_RETURN(*formats, ParseFormatPair(kv_format));
  return Status::Ok();
}

}  // namespace

Result<KvBackendOptions> ParseKvBackendOptions(std::string_view kv_format,
                                               std::string_view layout,
                                               std::string_view backend, uint32_t block_size) {
  KvBackendOptions options;
  KV_ASSIGN_OR_RETURN(options.layout, ParseCacheLayout(layout));
  KV_ASSIGN_OR_RETURN(options.kind, ParseBackendKind(backend));
  options.block_size = block_size;
  if (kv_format.find('=') == std::string_view::npos) {
    KV_RETURN_IF_ERROR(ParseOneFormat(kv_format, options.kind, &options.formats, &options.window));
    return options;
  }
  // "global=F,local=G" (either order, each at most once).
  bool seen_global = false, seen_local = false;
  std::string_view rest = kv_format;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view part = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    const size_t eq = part.find('=');
    const std::string_view group = part.substr(0, eq);
    const std::string_view format = eq == std::string_view::npos ? std::string_view() : part.substr(eq + 1);
    if (group == "global" && !seen_global && !format.empty()) {
      seen_global = true;
      KV_RETURN_IF_ERROR(ParseOneFormat(format, options.kind, &options.formats, &options.window));
    } else if (group == "local" && !seen_local && !format.empty()) {
      seen_local = true;
      FormatPair local;
      KV_RETURN_IF_ERROR(ParseOneFormat(format, options.kind, &local, nullptr));
      options.local_formats = local;
    } else {
      return Status::InvalidArgument("kv format '" + std::string(kv_format) + "': '" + std::string(part) +
                                     "' names no layer group (want global=FORMAT,local=FORMAT, each once)");
    }
  }
  if (!seen_global || !seen_local) {
    return Status::InvalidArgument("kv format '" + std::string(kv_format) +
                                   "': give both groups (global=FORMAT,local=FORMAT) or one name for every layer");
  }
  return options;
}

}  // namespace kvcache::model
