// Hash chain: determinism, the prefix property, and salt isolation.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <numeric>
#include <vector>

#include "kvcache/serving/prefix_cache.h"

namespace kvcache {
namespace {

std::vector<TokenId> Iota(size_t n, TokenId start = 0) {
  std::vector<TokenId> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

TEST(HashChain, DeterministicAndPinned) {
  const std::vector<TokenId> t = Iota(16);
  const BlockHash a = ChainHash(ChainRoot(""), t);
  const BlockHash b = ChainHash(ChainRoot(""), t);
  EXPECT_EQ(a, b);
  // The documented bytes: parent (16 zero bytes for the shared root), then
  // the ids as u32 little-endian, hashed by XXH3-128.
  std::vector<unsigned char> bytes(16, 0);
  for (TokenId id : t) {
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<unsigned char>(id >> (8 * i)));
  }
  const XXH128_hash_t ref = XXH3_128bits(bytes.data(), bytes.size());
  EXPECT_EQ(a.lo, ref.low64);
  EXPECT_EQ(a.hi, ref.high64);
  // Pinned too, so that a change of the hashed bytes (which would silently
  // orphan persisted or remote caches) fails loudly.
  EXPECT_EQ(a.lo, 0x0b49a1755bdbc8b2ull);
  EXPECT_EQ(a.hi, 0x16d310809c3605d6ull);
}

TEST(HashChain, FullBlocksFollowTheChain) {
  const std::vector<TokenId> t = Iota(16 * 3 + 5);
  const std::vector<BlockHash> h = HashFullBlocks(t, 16, "");
  ASSERT_EQ(h.size(), 3u);  // the partial block is not named
  BlockHash parent = ChainRoot("");
  for (size_t i = 0; i < 3; ++i) {
    parent = ChainHash(parent, std::span<const TokenId>(t).subspan(16 * i, 16));
    EXPECT_EQ(h[i], parent);
  }
}

TEST(HashChain, ABlockNamesItsWholePrefix) {
  std::vector<TokenId> a = Iota(64), b = Iota(64);
  b[20] = 999;  // differs in block 1
  const auto ha = HashFullBlocks(a, 16, ""), hb = HashFullBlocks(b, 16, "");
  EXPECT_EQ(ha[0], hb[0]);
  for (size_t i = 1; i < 4; ++i) EXPECT_NE(ha[i], hb[i]) << i;  // same tokens, other prefix
  // Same block contents at another position in the chain hash differently.
  std::vector<TokenId> c = Iota(32);
  std::copy(c.begin(), c.begin() + 16, c.begin() + 16);
  const auto hc = HashFullBlocks(c, 16, "");
  EXPECT_NE(hc[0], hc[1]);
}

TEST(HashChain, SaltsNeverShare) {
  const std::vector<TokenId> t = Iota(64);
  const auto shared = HashFullBlocks(t, 16, "");
  const auto a = HashFullBlocks(t, 16, "tenant-a");
  const auto b = HashFullBlocks(t, 16, "tenant-b");
  EXPECT_EQ(a, HashFullBlocks(t, 16, "tenant-a"));
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_NE(a[i], b[i]);
    EXPECT_NE(a[i], shared[i]);
    EXPECT_NE(b[i], shared[i]);
  }
  EXPECT_EQ(ChainRoot(""), BlockHash{});
  EXPECT_NE(ChainRoot("x"), ChainRoot("y"));
}

TEST(HashChain, LongBlocksUseTheHeapPath) {
  const std::vector<TokenId> t = Iota(1024);
  const auto h = HashFullBlocks(t, 512, "");
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(h[1], ChainHash(h[0], std::span<const TokenId>(t).subspan(512)));
  EXPECT_NE(h[0], h[1]);
}

}  // namespace
}  // namespace kvcache
