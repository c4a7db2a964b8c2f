// Choosing a KV backend by name: the kvcache cache (contiguous or paged) or
// the naive reference, in a K:V format pair. Used by the CLI commands, the
// demo report and the tests.
//
// Thread safety: free functions, reentrant.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "kvcache/cache.h"
#include "kvcache/format.h"
#include "kvcache/thread_pool.h"
#include "model/kv/hybrid_kv.h"
#include "model/kv/kv_backend.h"
#include "model/kv/kv_variant.h"

namespace kvcache::model {

enum class BackendKind : uint8_t {
  kCache,  // kvcache::SequenceCache + attention kernels (model/kv/cache_kv.h)
  kNaive,  // plain vectors + scalar attention, codec round trip (model/kv/naive_kv.h)
};

struct KvBackendOptions {
  BackendKind kind = BackendKind::kCache;
  FormatPair formats;
  // The sliding-window layers' format pair when it differs (cache backend:
  // HybridKvOptions::bounded_formats).
  std::optional<FormatPair> local_formats;
  CacheLayout layout = CacheLayout::kContiguous;  // kCache only
  uint32_t block_size = 16;                       // kCache paged only
  // kCache contiguous only: bounded memory (model/kv/hybrid_kv.h) when enabled.
  EvictionSpec eviction;
  // kCache with sliding-window layers or eviction: the largest pass
  // (prefill chunk) attended with exact windows (HybridKvOptions).
  uint32_t max_chunk_tokens = 512;
  // kCache with sliding-window layers: HybridKvOptions::window_slack_tokens.
  uint32_t window_slack_tokens = 512;
  // kCache: threads for attention (CacheKvOptions::attention_pool).
  ThreadPool* attention_pool = nullptr;
  // kCache: the precision window (CacheKvOptions::window); not with eviction.
  PrecisionWindow window;
};

// The precision window a variant spells ("turbo4+s4+r128": sinks and recent
// positions over a plain format pair; "+cal" is accepted, the cache always
// calibrates the formats that calibrate). InvalidArgument naming the option
// for anything the cache does not build (kc keys, ob, g, o, rot, eb, sym).
Result<PrecisionWindow> CacheWindowOf(const KvVariant& variant);

// A shape with sliding-window layers (AttentionShape::windows) or eviction
// gets a HybridKv (its window layers in their own group and, paged, their
// own pool), otherwise a CacheKv; kNaive a NaiveKv, which masks windows.
// InvalidArgument when a format cannot take the model's head_dim (the
// message says which: the backend's cache or codecs check it, once), or
// local formats meet a backend or model without window layers (a window
// longer than max_seq_len is allowed: it covers every position); Unimplemented when a format is not built yet.
Result<std::unique_ptr<KvBackend>> CreateKvBackend(const AttentionShape& shape,
                                                   const KvBackendOptions& options);

// "cache" | "naive".
Result<BackendKind> ParseBackendKind(std::string_view name);
std::string_view BackendKindName(BackendKind kind);
// "contiguous" | "paged".
Result<CacheLayout> ParseCacheLayout(std::string_view name);
std::string_view CacheLayoutName(CacheLayout layout);
// Backend options from their command-line spellings ("k:v", "paged",
// "cache"); on the cache backend kv_format may add a precision window
// ("turbo4+s4+r128", CacheWindowOf). Per layer kind:
// "global=turbo4+s4+r120,local=bf16" gives the full layers one format (and
// the window) and the sliding-window layers another; a plain name means
// every layer.
Result<KvBackendOptions> ParseKvBackendOptions(std::string_view kv_format,
                                               std::string_view layout,
                                               std::string_view backend, uint32_t block_size);

}  // namespace kvcache::model
