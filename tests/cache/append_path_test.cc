// The one-token append path (a layer's heads encoded with one dispatch)
// against the multi-token path (one RowCodec::Encode per head): the same
// tokens stored either way must decode to identical rows, for every format as
// K and as V, paged and contiguous, with calibrated transforms (a 9-token
// prefill) and with dead heads (an alive mask); a non-finite value in a
// one-token append is InvalidArgument and changes nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kvcache/cache.h"

namespace kvcache {
namespace {

constexpr uint32_t kLayers = 3, kHeads = 4, kDim = 32, kBlock = 4;

// [n_layers][T][H][D] gaussian values with a per-channel offset (so the
// calibration of the q8 and turbo formats finds a mean).
std::vector<float> Tokens(uint32_t T, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> x(size_t{kLayers} * T * kHeads * kDim);
  for (size_t i = 0; i < x.size(); ++i) x[i] = nd(rng) + 0.5f * static_cast<float>(i % kDim % 5);
  return x;
}

// Token t of a [n_layers][T][H][D] block, as a one-token block.
std::vector<float> TokenAt(const std::vector<float>& x, uint32_t T, uint32_t t) {
  std::vector<float> out;
  const size_t per = size_t{kHeads} * kDim;
  for (uint32_t l = 0; l < kLayers; ++l) {
    const float* p = x.data() + (size_t{l} * T + t) * per;
    out.insert(out.end(), p, p + per);
  }
  return out;
}

SequenceCache Make(FormatPair f, bool paged) {
  const Geometry g = *Geometry::Create({kLayers, kHeads, kDim, kBlock});
  if (!paged) return std::move(*SequenceCache::CreateContiguous(g, f));
  auto pool = *BlockPool::Create(g, f, {.num_blocks = 64});
  return std::move(*SequenceCache::CreatePaged(pool));
}

void ExpectSameRows(const SequenceCache& a, const SequenceCache& b) {
  ASSERT_EQ(a.num_tokens(), b.num_tokens());
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (uint32_t h = 0; h < kHeads; ++h) {
      SCOPED_TRACE("layer " + std::to_string(l) + " head " + std::to_string(h));
      auto ka = a.HeadKeys(l, h), kb = b.HeadKeys(l, h);
      auto va = a.HeadValues(l, h), vb = b.HeadValues(l, h);
      ASSERT_TRUE(ka.ok() && kb.ok() && va.ok() && vb.ok());
      ASSERT_EQ(ka->size(), kb->size());
      ASSERT_EQ(va->size(), vb->size());
      EXPECT_EQ(0, std::memcmp(ka->data(), kb->data(), ka->size() * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(va->data(), vb->data(), va->size() * sizeof(float)));
    }
  }
}

TEST(AppendPath, OneTokenAppendsStoreWhatAMultiTokenAppendStores) {
  const size_t nf = kAllFormats.size();
  for (size_t i = 0; i < nf; ++i) {
    const FormatPair f{kAllFormats[i], kAllFormats[(i + 4) % nf]};
    for (bool paged : {true, false}) {
      SCOPED_TRACE(FormatPairName(f) + (paged ? " paged" : " contiguous"));
      SequenceCache one = Make(f, paged), many = Make(f, paged);
      const std::vector<float> pk = Tokens(9, 1 + i), pv = Tokens(9, 100 + i);
      ASSERT_TRUE(one.Append(pk, pv).ok());  // calibrates (>= 8 rows)
      ASSERT_TRUE(many.Append(pk, pv).ok());
      // 6 tokens, all heads alive: one at a time vs in one call.
      const std::vector<float> k = Tokens(6, 7 + i), v = Tokens(6, 70 + i);
      for (uint32_t t = 0; t < 6; ++t) ASSERT_TRUE(one.Append(TokenAt(k, 6, t), TokenAt(v, 6, t)).ok());
      ASSERT_TRUE(many.Append(k, v).ok());
      ExpectSameRows(one, many);
      // 3 tokens with heads 1 and 3 dead.
      const std::vector<uint8_t> alive = {1, 0, 1, 0};
      const std::vector<float> k2 = Tokens(3, 9 + i), v2 = Tokens(3, 90 + i);
      for (uint32_t t = 0; t < 3; ++t) {
        ASSERT_TRUE(one.Append(TokenAt(k2, 3, t), TokenAt(v2, 3, t), {.alive = alive}).ok());
      }
      ASSERT_TRUE(many.Append(k2, v2, {.alive = alive}).ok());
      ExpectSameRows(one, many);
      ASSERT_TRUE(one.CheckInvariants().ok());
    }
  }
}

TEST(AppendPath, FreshHeadsOneTokenAtATimeMatchEncode) {
  // No prefill: every head starts with a one-token append (calibration sees
  // one row and makes no transform), so the rows are RowCodec::Encode's.
  for (Format fmt : kAllFormats) {
    SCOPED_TRACE(FormatName(fmt));
    SequenceCache c = Make({fmt, fmt}, true);
    const std::vector<float> k = Tokens(5, 3), v = Tokens(5, 4);
    for (uint32_t t = 0; t < 5; ++t) ASSERT_TRUE(c.Append(TokenAt(k, 5, t), TokenAt(v, 5, t)).ok());
    const RowCodec& kc = c.codec(Side::kKey);
    for (uint32_t l = 0; l < kLayers; ++l) {
      for (uint32_t h = 0; h < kHeads; ++h) {
        std::vector<float> rows;
        for (uint32_t t = 0; t < 5; ++t) {
          const float* p = k.data() + ((size_t{l} * 5 + t) * kHeads + h) * kDim;
          rows.insert(rows.end(), p, p + kDim);
        }
        std::vector<uint8_t> bytes(5 * kc.row_bytes());
        ASSERT_TRUE(kc.Encode(rows, bytes).ok());
        std::vector<float> want(rows.size());
        ASSERT_TRUE(kc.Decode(bytes, want).ok());
        auto got = c.HeadKeys(l, h);
        ASSERT_TRUE(got.ok());
        ASSERT_EQ(got->size(), want.size());
        EXPECT_EQ(0, std::memcmp(got->data(), want.data(), want.size() * sizeof(float)));
      }
    }
  }
}

TEST(AppendPath, NonFiniteOneTokenAppendChangesNothing) {
  for (bool paged : {true, false}) {
    for (Format fmt : {Format::kBF16, Format::kQ8_0, Format::kTurbo4}) {
      SCOPED_TRACE(std::string(FormatName(fmt)) + (paged ? " paged" : " contiguous"));
      SequenceCache c = Make({fmt, fmt}, paged);
      ASSERT_TRUE(c.Append(Tokens(3, 5), Tokens(3, 6)).ok());
      auto before = c.HeadValues(2, 3);
      ASSERT_TRUE(before.ok());
      for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
        std::vector<float> k = Tokens(1, 7), v = Tokens(1, 8);
        v[(size_t{2} * kHeads + 3) * kDim + 17] = bad;  // layer 2, head 3, index 17
        const Status st = c.Append(k, v);
        ASSERT_EQ(st.code(), StatusCode::kInvalidArgument);
        EXPECT_NE(st.message().find("index 17"), std::string::npos) << st.message();
        EXPECT_EQ(c.num_tokens(), 3u);
        auto after = c.HeadValues(2, 3);
        ASSERT_TRUE(after.ok());
        EXPECT_EQ(0, std::memcmp(before->data(), after->data(), before->size() * sizeof(float)));
        ASSERT_TRUE(c.CheckInvariants().ok());
      }
      // And the cache still appends.
      ASSERT_TRUE(c.Append(Tokens(1, 9), Tokens(1, 10)).ok());
      EXPECT_EQ(c.num_tokens(), 4u);
    }
  }
}

}  // namespace
}  // namespace kvcache
