// What the soak (tools/cmd_soak.cc) and the API-sequence fuzzer
// (fuzz/api_sequence.cc) both feed the library: K/V rows that are a function
// of (token, position, layer, head, side, element) only, so that identical
// token prefixes store identical rows and a row read back from f32 storage
// is checked exactly against RowValue; and the hybrid model options both run
// their speculative drafts with.
//
// Stateless; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvcache/hybrid.h"
#include "kvcache/serving/prefix_cache.h"

namespace kvcache::harness {

// Element `i` of the K (side 0) or V (side 1) row of `token` at position
// `pos` of (layer, head): a value in [-1, 1], exactly representable in f32.
float RowValue(TokenId token, uint32_t pos, uint32_t layer, uint32_t head, int side, uint32_t i);

// The rows of `tokens` at positions [first, first + tokens.size()), laid out
// [layers][tokens][heads][dim] as SequenceCache::Append takes them.
std::vector<float> TokenRows(std::span<const TokenId> tokens, uint32_t first, int side,
                             uint32_t layers, uint32_t heads, uint32_t dim);

// Hybrid model options with room for drafts of up to 8 tokens.
HybridModelOptions DraftOptions();

}  // namespace kvcache::harness
