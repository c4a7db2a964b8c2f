// The K/V backend flags that `generate` and `perplexity` share:
// --kv-format, --layout, --block-size, --backend (parsed by
// model::ParseKvBackendOptions), the --matmul help of `generate` and
// `serve`, the defaults `serve` and `generate` start with and the line that
// says them, and the geometry flags of the commands that size a cache
// without a model.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <string_view>

#include "kvcache/status.h"
#include "model/tensor/matmul.h"

namespace kvcache::tools {

inline constexpr const char* kMatMulHelp =
    "auto (bf16 where the CPU has AMX or AVX512_BF16, else int8 on x86, else f32) | "
    "f32 (exact products) | int8 (quantized matrices times inputs rounded to int8 per 32, integer lanes) | "
    "bf16 (weights and inputs rounded to bf16, f32 sums; AMX tiles, or vdpbf16ps on AVX512_BF16, "
    "where the CPU has them: fast for many tokens per step)";

// What `serve` and `generate` run when no flag says otherwise: a bf16 cache
// (half of f32's bytes) and the products `auto` picks on this CPU
// (model::AutoMatMulInputs). `--kv-format f32 --matmul f32` is the exact path.
inline constexpr const char* kDefaultKvFormat = "bf16";
inline constexpr const char* kDefaultMatMul = "auto";

// --matmul resolved: the products and, for `auto`, what decided them.
struct MatMulPick {
  model::MatMulInputs inputs = model::MatMulInputs::kF32;
  std::string why;  // "auto: AVX512_BF16 dot products"; empty when named

  std::string name() const { return std::string(model::MatMulInputsName(inputs)); }
};

inline Result<MatMulPick> PickMatMul(std::string_view flag) {
  KV_ASSIGN_OR_RETURN(model::MatMulInputs inputs, model::ParseMatMulInputs(flag));
  MatMulPick pick{inputs, ""};
  if (flag == "auto") pick.why = "auto: " + std::string(model::AutoMatMulInputs().why);
  return pick;
}

// What a run chose and why, as `serve`'s startup line and `generate`'s
// header say it: "kv bf16 (default), products bf16 (auto: AVX512_BF16 dot
// products)". kv_given: --kv-format was on the command line.
inline std::string ChoiceText(std::string_view kv, bool kv_given, const MatMulPick& m) {
  std::string s = "kv " + std::string(kv) + (kv_given ? "" : " (default)") + ", products " + m.name();
  if (!m.why.empty()) s += " (" + m.why + ")";
  return s;
}

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
