// KV backend selection by name.
#include "model/kv/kv_factory.h"

#include <string>

#include "model/kv/cache_kv.h"
#include "model/kv/naive_kv.h"

namespace kvcache::model {

Result<std::unique_ptr<KvBackend>> CreateKvBackend(const AttentionShape& shape,
                                                   const KvBackendOptions& options) {
  // The format pair meets head_dim once, where each backend builds its
  // cache or codecs (SequenceCache, BlockPool, RowCodec, HybridModel).
  if (options.window.enabled() && (options.kind == BackendKind::kNaive || options.eviction.enabled())) {
    return Status::InvalidArgument(
        "a precision window (+sN/+rN) needs the cache backend without eviction (the naive backend "
        "models it through kv variants)");
  }
  if (options.kind == BackendKind::kNaive) {
    if (options.eviction.enabled()) return Status::InvalidArgument("eviction needs the cache backend");
    KV_ASSIGN_OR_RETURN(auto kv, NaiveKv::Create(shape, options.formats));
    return std::unique_ptr<KvBackend>(std::move(kv));
  }
  if (options.eviction.enabled()) {
    if (options.layout != CacheLayout::kContiguous) {
      return Status::InvalidArgument("eviction runs on the contiguous layout only");
    }
    KV_ASSIGN_OR_RETURN(auto kv, EvictKv::Create(shape, options.formats, options.eviction));
    return std::unique_ptr<KvBackend>(std::move(kv));
  }
  CacheKvOptions c;
  c.formats = options.formats;
  c.layout = options.layout;
  c.block_size = options.block_size;
  c.attention_pool = options.attention_pool;
  c.window = options.window;
  KV_ASSIGN_OR_RETURN(auto kv, CacheKv::Create(shape, c));
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

Result<KvBackendOptions> ParseKvBackendOptions(std::string_view kv_format,
                                               std::string_view layout,
                                               std::string_view backend, uint32_t block_size) {
  KvBackendOptions options;
  KV_ASSIGN_OR_RETURN(options.layout, ParseCacheLayout(layout));
  KV_ASSIGN_OR_RETURN(options.kind, ParseBackendKind(backend));
  if (kv_format.find('+') != std::string_view::npos) {
    KV_ASSIGN_OR_RETURN(KvVariant variant, ParseKvVariant(kv_format));
    if (options.kind != BackendKind::kCache) {
      return Status::InvalidArgument("kv format '" + std::string(kv_format) +
                                     "': options (+...) need the cache backend here");
    }
    KV_ASSIGN_OR_RETURN(options.window, CacheWindowOf(variant));
    options.formats = variant.formats;
  } else {
    KV_ASSIGN_OR_RETURN(options.formats, ParseFormatPair(kv_format));
  }
  options.block_size = block_size;
  return options;
}

}  // namespace kvcache::model
