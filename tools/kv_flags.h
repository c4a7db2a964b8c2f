// The K/V backend flags that `generate` and `perplexity` share:
// --kv-format, --layout, --block-size, --backend (parsed by
// model::ParseKvBackendOptions), the --matmul help of `generate` and
// `serve`, and the geometry flags of the commands that size a cache without
// a model.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

namespace kvcache::tools {

inline constexpr const char* kMatMulHelp =
    "f32 (exact products) | int8 (Q4_1/Q8_0 times inputs rounded to int8 per 32, integer lanes) | "
    "bf16 (weights and inputs rounded to bf16, f32 sums; AMX tiles, or vdpbf16ps on AVX512_BF16, "
    "where the CPU has them: fast for many tokens per step)";

inline void AddKvBackendFlags(CLI::App* app, std::string& kv_format, std::string& layout,
                              uint32_t& block_size, std::string& backend) {
  app->add_option("--kv-format", kv_format, "K:V cache format (or one name for both)")
      ->capture_default_str();
  app->add_option("--layout", layout, "contiguous | paged")->capture_default_str();
  app->add_option("--block-size", block_size, "Paged block size in tokens")->capture_default_str();
  app->add_option("--backend", backend, "cache (kvcache) | naive (reference)")
      ->capture_default_str();
}

// --layers, --kv-heads, --head-dim (info, bench pool, bench tiers).
inline void AddGeometryFlags(CLI::App* app, uint32_t& layers, uint32_t& kv_heads, uint32_t& head_dim) {
  app->add_option("--layers", layers, "Number of layers")->capture_default_str();
  app->add_option("--kv-heads", kv_heads, "Number of kv heads")->capture_default_str();
  app->add_option("--head-dim", head_dim, "Values per head")->capture_default_str();
}

}  // namespace kvcache::tools
