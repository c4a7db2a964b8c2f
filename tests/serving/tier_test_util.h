// Helpers shared by the tier tests: pools with random block contents, token
// chains, and encoded objects. Single-threaded helpers; deterministic seeds.
#pragma once

#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kvcache/pool.h"
#include "kvcache/serving/prefix_cache.h"
#include "kvcache/serving/tier_object.h"

namespace kvcache::tiertest {

inline std::shared_ptr<BlockPool> NewPool(GeometryOptions g, FormatPair f, uint32_t num_blocks,
                                          uint64_t rotation_seed = RowCodec::kDefaultRotationSeed) {
  BlockPoolOptions o;
  o.num_blocks = num_blocks;
  o.rotation_seed = rotation_seed;
  o.huge_pages = false;
  return BlockPool::Create(Geometry::Create(g).value(), f, o).value();
}

// Fills every byte of `block` (all layers, K and V) from a seeded generator.
inline void FillBlock(BlockPool& pool, uint32_t block, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (uint32_t l = 0; l < pool.geometry().n_layers(); ++l) {
    for (Side s : {Side::kKey, Side::kValue}) {
      uint8_t* p = pool.block_data(l, s, block);
      for (size_t i = 0; i < pool.block_stride(s); ++i) p[i] = static_cast<uint8_t>(rng());
    }
  }
}

inline bool SameBlock(const BlockPool& a, uint32_t ba, const BlockPool& b, uint32_t bb) {
  for (uint32_t l = 0; l < a.geometry().n_layers(); ++l) {
    for (Side s : {Side::kKey, Side::kValue}) {
      if (std::memcmp(a.block_data(l, s, ba), b.block_data(l, s, bb), a.block_stride(s)) != 0) {
        return false;
      }
    }
  }
  return true;
}

inline std::vector<TokenId> Tokens(size_t n, TokenId start = 1) {
  std::vector<TokenId> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

// The object of block `block` holding chain block `i` of `tokens`.
inline TierBytes Object(const BlockPool& pool, uint32_t block, const BlockHash& compat,
                        std::span<const TokenId> tokens, size_t i, std::string_view salt = "") {
  const uint32_t B = pool.block_size();
  const std::vector<BlockHash> h = HashFullBlocks(tokens.first((i + 1) * B), B, salt);
  const BlockHash parent = i == 0 ? ChainRoot(salt) : h[i - 1];
  return std::make_shared<const std::vector<uint8_t>>(
      EncodeBlockObject(pool, block, compat, h[i], parent, tokens.subspan(i * B, B)).value());
}

// `object` with byte `at` set to `value` and its header checksum (offset
// 112, over header_bytes from offset 8, the field read as zero) recomputed:
// a writer's bug rather than a flipped bit. Block and calibration objects
// share this layout.
inline std::vector<uint8_t> Resealed(std::vector<uint8_t> b, size_t at, uint8_t value) {
  b[at] = value;
  uint32_t header_bytes;
  std::memcpy(&header_bytes, b.data() + 8, 4);
  std::memset(b.data() + 112, 0, 8);
  const uint64_t sum = BlockChecksum(std::span(b).first(header_bytes));
  std::memcpy(b.data() + 112, &sum, 8);
  return b;
}

}  // namespace kvcache::tiertest
