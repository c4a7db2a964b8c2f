// The soak's and the API-sequence fuzzer's shared rows (harness.h).
#include "tools/support/harness.h"

namespace kvcache::harness {

float RowValue(TokenId token, uint32_t pos, uint32_t layer, uint32_t head, int side, uint32_t i) {
  uint64_t x = (uint64_t{token} * 0x9E3779B97F4A7C15ull) ^ (uint64_t{pos} << 20) ^
               (uint64_t{layer} << 40) ^ (uint64_t{head} << 48) ^ (uint64_t(side) << 56) ^ i;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<float>(static_cast<int>(x % 2001) - 1000) / 1000.0f;
}

std::vector<float> TokenRows(std::span<const TokenId> tokens, uint32_t first, int side,
                             uint32_t layers, uint32_t heads, uint32_t dim) {
  std::vector<float> out;
  out.reserve(size_t{layers} * tokens.size() * heads * dim);
  for (uint32_t l = 0; l < layers; ++l)
    for (uint32_t t = 0; t < tokens.size(); ++t)
      for (uint32_t h = 0; h < heads; ++h)
        for (uint32_t i = 0; i < dim; ++i) out.push_back(RowValue(tokens[t], first + t, l, h, side, i));
  return out;
}

HybridModelOptions DraftOptions() {
  HybridModelOptions o;
  o.max_draft_tokens = 8;
  return o;
}

}  // namespace kvcache::harness
