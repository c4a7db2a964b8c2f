// Pieces the bench commands share: the median of a round's samples, a
// comma list's items, the model-less cache of bench pool and bench tiers
// and its flags, and
// `bench attention`'s case geometry, K/V storage options and queries (its
// step mode in cmd_bench_attention.cc, its --passes mode in
// cmd_bench_attention_passes.cc).
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "kvcache/format.h"
#include "tools/kv_flags.h"
#include "tools/support/bench_support.h"

namespace kvcache::tools {

// The median of v: the mean of the two middle values for an even count, 0
// for none.
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The median as bench pool and bench tiers take it: the upper of the two
// middle values for an even count. REQUIRES: v is not empty.
inline double UpperMedian(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The non-empty items of s between separators sep ("a,,b" -> a, b).
inline std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep)) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// The cache bench pool and bench tiers size without a model (Llama-3-8B's
// layers, kv heads, head_dim and block by default), and their --json.
struct BenchCacheOptions {
  bool json = false;
  uint32_t layers = 32, kv_heads = 8, head_dim = 128, block_size = 16;
  std::string kv_format;
};

// --json, --layers, --kv-heads, --head-dim, --block-size and --kv-format.
inline void AddBenchCacheFlags(CLI::App* app, BenchCacheOptions& o) {
  app->add_flag("--json", o.json, "Print JSON");
  AddGeometryFlags(app, o.layers, o.kv_heads, o.head_dim);
  app->add_option("--block-size", o.block_size, "Tokens per block")->capture_default_str();
  app->add_option("--kv-format", o.kv_format, "K:V format pair")->capture_default_str();
}

// bench attention: 32 q heads over 8 kv heads of head_dim 128 (Llama-3-8B),
// a flush read of kFlushBytes before every out-of-cache step.
constexpr uint32_t kQHeads = 32, kKvHeads = 8, kHeadDim = 128;
constexpr size_t kFlushBytes = size_t{64} << 20;

// A case's synthetic K/V storage: block_size 0 is the contiguous layout.
inline attention_internal::SyntheticKvOptions BenchKvOptions(FormatPair formats, uint32_t block_size,
                                                             bool small_pages) {
  attention_internal::SyntheticKvOptions so;
  so.formats = formats;
  so.n_kv_heads = kKvHeads;
  so.head_dim = kHeadDim;
  so.paged = block_size != 0;
  so.block_size = block_size != 0 ? block_size : 16;
  so.huge_pages = !small_pages;
  return so;
}

// The benches' queries: q[i] = 0.01 * (i % period) - 0.4.
inline void FillBenchQuery(std::vector<float>* q, uint32_t period) {
  for (size_t i = 0; i < q->size(); ++i) (*q)[i] = 0.01f * static_cast<float>(i % period) - 0.4f;
}

}  // namespace kvcache::tools
