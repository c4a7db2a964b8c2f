// `kvcache bench attention --passes`: the decode step's time split by pass
// (K pass with the scores, exp, V pass, the rest), per stored row, from the
// library's profiled run of the same kernels (AttendMultiProfiled,
// kvcache/attention_profile.h), beside the memory floor of the access
// pattern. Options are parsed and checked by cmd_bench_attention.cc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvcache/format.h"

namespace kvcache::tools {

struct PassesOptions {
  bool json = false;
  std::vector<FormatPair> pairs;
  std::vector<uint32_t> layouts;       // block sizes, 0 = contiguous
  std::vector<std::string> targets;    // canonical SIMD target names
  std::vector<uint32_t> threads;       // thread counts, each its own pool
  uint32_t context = 32768;            // the memory case (flushed before each step)
  uint32_t cache_context = 1024;       // the in-cache case (no flush)
  uint32_t repeats = 5;
  bool small_pages = false;
  uint32_t q_heads = 32, kv_heads = 8, head_dim = 128;  // the geometry
};

// Builds every case, times them in interleaved rounds and prints one row per
// case (text or JSON). Returns the process exit code.
int RunAttentionPasses(const PassesOptions& o);

}  // namespace kvcache::tools
