// KvVariant on the naive backend: the spelling parses and prints back, the
// bit accounting adds up by hand, the per-channel block quantizer gives
// hand-computed values, and the rows the backend attends are exactly bf16 of
// the stored rows inside the sinks / window / open block and, once a row
// leaves, exactly the independent codec round trip of it (RowCodec,
// calibration, rotation, dense outlier channels, channel blocks).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kvcache/codec.h"
#include "kvcache/float16.h"
#include "model/kv/kv_variant.h"
#include "model/kv/naive_kv.h"

namespace kvcache::model {
namespace {

KvVariant Parse(const char* s) {
  auto v = ParseKvVariant(s);
  EXPECT_TRUE(v.ok()) << s << ": " << v.status().ToString();
  return v.ok() ? *v : KvVariant{};
}

TEST(KvVariant, ParsesAndPrintsBack) {
  const KvVariant a = Parse("turbo4+s4+r128");
  EXPECT_EQ(a.formats, (FormatPair{Format::kTurbo4, Format::kTurbo4}));
  EXPECT_EQ(a.sinks, 4u);
  EXPECT_EQ(a.recent, 128u);
  EXPECT_FALSE(a.block_mode());
  const KvVariant b = Parse("kc3:q8_0+g32+sym+ob+cal+o2");
  EXPECT_EQ(b.key_channel.bits, 3u);
  EXPECT_FALSE(b.key_channel.asymmetric);
  EXPECT_EQ(b.formats.v, Format::kQ8_0);
  EXPECT_EQ(b.block_tokens, 32u);
  EXPECT_TRUE(b.open_block && b.calibrate && b.block_mode());
  EXPECT_EQ(b.key_outliers, 2u);
  EXPECT_TRUE(Parse("q4_0").plain());
  EXPECT_TRUE(Parse("q4_0+rot").rotate);
  for (const char* s : {"turbo4+s4+r128", "kc3:q8_0+ob+g32+sym+cal+o2+eb", "q4_0:q8_0+rot", "bf16:turbo2"}) {
    const KvVariant v = Parse(s);
    EXPECT_EQ(Parse(KvVariantName(v).c_str()), v) << s;
  }
}

TEST(KvVariant, RejectsWhatItCannotModel) {
  for (const char* s : {"turbo4+x", "turbo4+s", "turbo4+s4+s8", "kc4", "kc1:q4_0", "kc9:q4_0",
                        "q4_0:kc4", "turbo4+rot", "q4_0:turbo4+rot", "q4_0+sym", "q4_0+g0",
                        "q4_0+g5000", "nope", "q4_0+", "q4_0++s4"}) {
    auto v = ParseKvVariant(s);
    ASSERT_FALSE(v.ok()) << s;
    EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument) << s;
    EXPECT_NE(v.status().message().find(s), std::string::npos) << v.status().message();
  }
}

TEST(KvVariant, BitsCountEveryOverhead) {
  const double n = 8192;
  VariantBits b = KvVariantBits(Parse("turbo4"), 64, 8192);
  EXPECT_DOUBLE_EQ(b.k, 4.5);
  EXPECT_DOUBLE_EQ(b.v, 4.5);
  b = KvVariantBits(Parse("turbo4+s4+r128"), 64, 8192);
  EXPECT_DOUBLE_EQ(b.k, ((n - 132) * 4.5 + 132 * 16) / n);
  // kc4 asymmetric: 4 bits + 2 f16 per channel per 16 tokens; block mode
  // keeps up to 15 open rows in bf16.
  b = KvVariantBits(Parse("kc4:turbo4"), 64, 8192);
  EXPECT_DOUBLE_EQ(b.k, ((n - 15) * 6.0 + 15 * 16) / n);
  EXPECT_DOUBLE_EQ(b.v, ((n - 15) * 4.5 + 15 * 16) / n);
  b = KvVariantBits(Parse("kc2:turbo2+g64+sym"), 64, 8192);
  EXPECT_DOUBLE_EQ(b.k, ((n - 63) * 2.25 + 63 * 16) / n);
  b = KvVariantBits(Parse("q4_0+o2+cal"), 64, 8192);
  EXPECT_DOUBLE_EQ(b.k, 4.5 + 32.0 / 64 + 16.0 / (n * 64) + 32.0 / n);
  EXPECT_DOUBLE_EQ(b.v, 4.5 + 32.0 / n);
  EXPECT_DOUBLE_EQ(KvVariantBits(Parse("q4_0+s4"), 64, 2).k, 16.0);  // all sinks
}

TEST(ChannelBlock, AsymmetricByHand) {
  // Channel 0 spans 0..15 (scale 1, every integer exact, 7.4 -> 7, 7.5 -> 8);
  // channel 1 is constant (scale 0: decodes to f16 of the value).
  const std::vector<float> rows = {0, 3.1f, 15, 3.1f, 7.4f, 3.1f, 7.5f, 3.1f};
  std::vector<float> out(rows.size());
  ASSERT_TRUE(ChannelBlockRoundTrip({4, true}, 2, rows, out).ok());
  EXPECT_EQ(out, (std::vector<float>{0, F16ToFloat(FloatToF16(3.1f)), 15, F16ToFloat(FloatToF16(3.1f)), 7,
                                     F16ToFloat(FloatToF16(3.1f)), 8, F16ToFloat(FloatToF16(3.1f))}));
  // 2 bits over [-1, 2]: scale 1, levels -1, 0, 1, 2.
  const std::vector<float> two = {-1, 2, 0.4f, 0.6f};
  out.resize(4);
  ASSERT_TRUE(ChannelBlockRoundTrip({2, true}, 1, two, out).ok());
  EXPECT_EQ(out, (std::vector<float>{-1, 2, 0, 1}));
}

TEST(ChannelBlock, SymmetricByHand) {
  // 2 bits, amax 3: d = 3 / 1.5 = 2, levels -3, -1, 1, 3 (mid-rise).
  const std::vector<float> rows = {-3, 3, 0.9f, -0.1f, 2.1f, -2.5f};
  std::vector<float> out(rows.size());
  ASSERT_TRUE(ChannelBlockRoundTrip({2, false}, 1, rows, out).ok());
  EXPECT_EQ(out, (std::vector<float>{-3, 3, 1, -1, 3, -3}));
  const std::vector<float> zeros(4, 0.0f);
  out.assign(4, 1.0f);
  ASSERT_TRUE(ChannelBlockRoundTrip({4, false}, 2, zeros, out).ok());
  EXPECT_EQ(out, zeros);
}

TEST(ChannelBlock, RejectsBadInput) {
  std::vector<float> rows(6), out(6), short_out(5);
  EXPECT_FALSE(ChannelBlockRoundTrip({1, true}, 2, rows, out).ok());
  EXPECT_FALSE(ChannelBlockRoundTrip({9, true}, 2, rows, out).ok());
  EXPECT_FALSE(ChannelBlockRoundTrip({4, true}, 4, rows, out).ok());
  EXPECT_FALSE(ChannelBlockRoundTrip({4, true}, 2, rows, short_out).ok());
}

// One layer, 2 kv heads of head_dim 32, 2 query heads.
constexpr uint32_t kHd = 32, kKvHeads = 2, kKvDim = kHd * kKvHeads;
AttentionShape Shape(uint32_t max_len = 256) { return {1, kKvHeads, kKvHeads, kHd, max_len}; }

std::vector<float> Rows(uint32_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> r(static_cast<size_t>(n) * kKvDim);
  for (size_t i = 0; i < r.size(); ++i) r[i] = g(rng) * (i % kHd == 3 ? 20.0f : 1.0f) + (i % kHd == 5 ? 4 : 0);
  return r;
}

// Feeds rows k, v in passes of `pass` positions.
void Feed(NaiveKv& kv, const std::vector<float>& k, const std::vector<float>& v, uint32_t pass) {
  const uint32_t n = static_cast<uint32_t>(k.size() / kKvDim);
  for (uint32_t a = 0; a < n; a += pass) {
    const uint32_t m = std::min(pass, n - a);
    ASSERT_TRUE(kv.Extend(m).ok());
    ASSERT_TRUE(kv.Store(0, std::span(k).subspan(size_t{a} * kKvDim, size_t{m} * kKvDim),
                         std::span(v).subspan(size_t{a} * kKvDim, size_t{m} * kKvDim))
                    .ok());
  }
}

float Bf16(float x) { return BF16ToFloat(FloatToBF16(x)); }

// Rows [t0, t1) of head h.
std::vector<float> Head(const std::vector<float>& rows, uint32_t h, uint32_t t0, uint32_t t1) {
  std::vector<float> out;
  for (uint32_t t = t0; t < t1; ++t) {
    out.insert(out.end(), rows.begin() + t * kKvDim + h * kHd, rows.begin() + t * kKvDim + (h + 1) * kHd);
  }
  return out;
}

std::vector<float> CodecRoundTrip(const RowCodec& c, std::vector<float> rows, const RowTransform* t = nullptr) {
  std::vector<uint8_t> bytes(rows.size() / kHd * c.row_bytes());
  EXPECT_TRUE(c.Encode(rows, bytes, t).ok());
  EXPECT_TRUE(c.Decode(bytes, rows, t).ok());
  return rows;
}

void ExpectRowsBf16(std::span<const float> got, const std::vector<float>& raw, uint32_t t0, uint32_t t1) {
  for (size_t i = size_t{t0} * kKvDim; i < size_t{t1} * kKvDim; ++i) {
    ASSERT_EQ(got[i], Bf16(raw[i])) << "row " << i / kKvDim << " value " << i % kKvDim;
  }
}

void ExpectHeadRows(std::span<const float> got, const std::vector<float>& want, uint32_t h, uint32_t t0) {
  for (size_t j = 0; j < want.size(); ++j) {
    const size_t t = t0 + j / kHd;
    ASSERT_EQ(got[t * kKvDim + h * kHd + j % kHd], want[j]) << "head " << h << " row " << t;
  }
}

TEST(NaiveKvVariant, PlainEqualsCodecRoundTrip) {
  auto kv = NaiveKv::CreateVariant(Shape(), Parse("turbo4:q4_0"));
  ASSERT_TRUE(kv.ok());
  const auto k = Rows(40, 1), v = Rows(40, 2);
  Feed(**kv, k, v, 7);
  auto ck = RowCodec::Create(Format::kTurbo4, kHd, Side::kKey);
  auto cv = RowCodec::Create(Format::kQ4_0, kHd, Side::kValue);
  EXPECT_EQ(std::vector<float>((*kv)->AttendedKeys(0).begin(), (*kv)->AttendedKeys(0).end()),
            CodecRoundTrip(*ck, k));
  EXPECT_EQ(std::vector<float>((*kv)->AttendedValues(0).begin(), (*kv)->AttendedValues(0).end()),
            CodecRoundTrip(*cv, v));
}

TEST(NaiveKvVariant, SinksAndRecentWindowAreBf16UntilTheyLeave) {
  auto kv = NaiveKv::CreateVariant(Shape(), Parse("turbo3+s3+r10"));
  ASSERT_TRUE(kv.ok());
  const auto k = Rows(50, 3), v = Rows(50, 4);
  auto ck = RowCodec::Create(Format::kTurbo3, kHd, Side::kKey);
  auto cv = RowCodec::Create(Format::kTurbo3, kHd, Side::kValue);
  for (uint32_t n : {5u, 12u, 13u, 37u, 50u}) {
    auto fresh = NaiveKv::CreateVariant(Shape(), Parse("turbo3+s3+r10"));
    std::vector<float> kn(k.begin(), k.begin() + n * kKvDim), vn(v.begin(), v.begin() + n * kKvDim);
    Feed(**fresh, kn, vn, 4);
    const uint32_t end = std::max(3u, n > 10 ? n - 10 : 0);
    ExpectRowsBf16((*fresh)->AttendedKeys(0), k, 0, std::min(3u, n));
    ExpectRowsBf16((*fresh)->AttendedValues(0), v, 0, std::min(3u, n));
    ExpectRowsBf16((*fresh)->AttendedKeys(0), k, end, n);
    ExpectRowsBf16((*fresh)->AttendedValues(0), v, end, n);
    for (uint32_t h = 0; h < kKvHeads && end > 3; ++h) {
      ExpectHeadRows((*fresh)->AttendedKeys(0), CodecRoundTrip(*ck, Head(k, h, 3, end)), h, 3);
      ExpectHeadRows((*fresh)->AttendedValues(0), CodecRoundTrip(*cv, Head(v, h, 3, end)), h, 3);
    }
  }
  // Truncating brings rows back into the window: bf16 again.
  Feed(**kv, k, v, 9);
  ASSERT_TRUE((*kv)->Truncate(30).ok());
  ExpectRowsBf16((*kv)->AttendedKeys(0), k, 20, 30);
  ExpectHeadRows((*kv)->AttendedKeys(0), CodecRoundTrip(*ck, Head(k, 1, 3, 20)), 1, 3);
}

TEST(NaiveKvVariant, OpenBlockLeavesAWholeBlockAtATime) {
  const auto k = Rows(45, 5), v = Rows(45, 6);
  auto ck = RowCodec::Create(Format::kQ4_0, kHd, Side::kKey);
  auto kv = NaiveKv::CreateVariant(Shape(), Parse("q4_0+ob+r4"));
  ASSERT_TRUE(kv.ok());
  Feed(**kv, k, v, 5);
  // 45 - 4 = 41 -> whole blocks of 16 below: [0, 32) quantized, [32, 45) bf16.
  ExpectRowsBf16((*kv)->AttendedKeys(0), k, 32, 45);
  ExpectHeadRows((*kv)->AttendedKeys(0), CodecRoundTrip(*ck, Head(k, 0, 0, 32)), 0, 0);
}

TEST(NaiveKvVariant, ChannelBlocksQuantizeFullBlocksWithoutTheSinks) {
  const auto k = Rows(40, 7), v = Rows(40, 8);
  auto kv = NaiveKv::CreateVariant(Shape(), Parse("kc3:bf16+s2+g8"));
  ASSERT_TRUE(kv.ok());
  Feed(**kv, k, v, 3);
  ExpectRowsBf16((*kv)->AttendedKeys(0), k, 0, 2);
  ExpectRowsBf16((*kv)->AttendedValues(0), v, 0, 40);  // bf16 values are bf16 anyway
  for (uint32_t h = 0; h < kKvHeads; ++h) {
    for (uint32_t b0 : {2u, 8u, 16u, 24u, 32u}) {  // block 0 starts after the sinks
      const uint32_t b1 = b0 == 2 ? 8 : b0 + 8;
      std::vector<float> block = Head(k, h, b0, b1), want(block.size());
      ASSERT_TRUE(ChannelBlockRoundTrip({3, true}, kHd, block, want).ok());
      ExpectHeadRows((*kv)->AttendedKeys(0), want, h, b0);
    }
  }
  // 39 positions: the block [32, 40) is open, so bf16.
  auto open = NaiveKv::CreateVariant(Shape(), Parse("kc3:bf16+s2+g8"));
  std::vector<float> k39(k.begin(), k.begin() + 39 * kKvDim), v39(v.begin(), v.begin() + 39 * kKvDim);
  Feed(**open, k39, v39, 13);
  ExpectRowsBf16((*open)->AttendedKeys(0), k, 32, 39);
}

TEST(NaiveKvVariant, CalibrationRotationAndOutliersMatchTheirReferences) {
  const auto k = Rows(48, 9), v = Rows(48, 10);
  auto t4 = RowCodec::Create(Format::kTurbo4, kHd, Side::kKey);
  // cal: the transform is Calibrate of the first pass's rows of each head.
  auto cal = NaiveKv::CreateVariant(Shape(), Parse("turbo4+cal"));
  Feed(**cal, k, v, 16);
  for (uint32_t h = 0; h < kKvHeads; ++h) {
    const RowTransform t = t4->Calibrate(Head(k, h, 0, 16));
    ASSERT_FALSE(t.mean.empty());  // channel 5 has mean 4
    ExpectHeadRows((*cal)->AttendedKeys(0), CodecRoundTrip(*t4, Head(k, h, 0, 48), &t), h, 0);
  }
  // rot: inverse rotation of q4_0 of the rotated rows.
  auto q4 = RowCodec::Create(Format::kQ4_0, kHd, Side::kKey);
  auto rot = NaiveKv::CreateVariant(Shape(), Parse("q4_0+rot"));
  Feed(**rot, k, v, 16);
  std::vector<float> r = Head(k, 1, 0, 48);
  ASSERT_TRUE(t4->RotateRows(r).ok());
  r = CodecRoundTrip(*q4, r);
  for (size_t t = 0; t < 48; ++t) t4->InverseRotate(r.data() + t * kHd);
  ExpectHeadRows((*rot)->AttendedKeys(0), r, 1, 0);
  // o1: channel 3 (20x the others) is dense bf16, the rest is q4_0 of the
  // row with it zeroed.
  auto out = NaiveKv::CreateVariant(Shape(), Parse("q4_0+o1"));
  Feed(**out, k, v, 16);
  std::vector<float> z = Head(k, 0, 0, 48), raw = z;
  for (size_t t = 0; t < 48; ++t) z[t * kHd + 3] = 0;
  z = CodecRoundTrip(*q4, z);
  for (size_t t = 0; t < 48; ++t) z[t * kHd + 3] = Bf16(raw[t * kHd + 3]);
  ExpectHeadRows((*out)->AttendedKeys(0), z, 0, 0);
}

TEST(NaiveKvVariant, EncodeFromBf16RoundsTheRowFirst) {
  const auto k = Rows(20, 11), v = Rows(20, 12);
  auto kv = NaiveKv::CreateVariant(Shape(), Parse("q8_0+eb"));
  ASSERT_TRUE(kv.ok());
  Feed(**kv, k, v, 20);
  auto q8 = RowCodec::Create(Format::kQ8_0, kHd, Side::kValue);
  std::vector<float> r = Head(v, 1, 0, 20);
  for (float& x : r) x = Bf16(x);
  ExpectHeadRows((*kv)->AttendedValues(0), CodecRoundTrip(*q8, r), 1, 0);
}

TEST(NaiveKvVariant, RejectsWindowsAndOutliersThatDoNotFit) {
  auto a = NaiveKv::CreateVariant(Shape(64), Parse("turbo4+s4+r61"));
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(NaiveKv::CreateVariant(Shape(64), Parse("turbo4+s4+r60")).ok());
  EXPECT_FALSE(NaiveKv::CreateVariant(Shape(), Parse("q4_0+o32")).ok());
  AttentionShape odd = Shape();
  odd.head_dim = 24;
  EXPECT_FALSE(NaiveKv::CreateVariant(odd, Parse("bf16+rot")).ok());  // rotation needs a multiple of 16
}

}  // namespace
}  // namespace kvcache::model
