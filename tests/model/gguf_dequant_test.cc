// Dequantization of Gemma 3's weight types, Q5_0, Q4_K and Q6_K
// (model/tensor/gguf_dequant.h): the scalar reference against a plain
// per-value reading of ggml's block layouts, written here from the layout
// description; every SIMD target against the scalar reference bit for bit;
// every byte value at every position of a block and extreme scales; the
// errors; and a few rows of each type of the real Gemma 3 file.
//
// The plain readings multiply and subtract exactly as the layout defines
// (each operation rounded on its own).
#pragma GCC optimize("fp-contract=off")

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kvcache/float16.h"
#include "model/io/gguf.h"
#include "model/io/model_store.h"
#include "model/tensor/ggml_type.h"
#include "model/tensor/gguf_dequant.h"
#include "model/tensor/matmul.h"
#include "matmul_checks.h"

namespace kvcache::model {
namespace {

const GgmlType kNewTypes[] = {GgmlType::kQ5_0, GgmlType::kQ4_K, GgmlType::kQ6_K};

float HalfAt(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return F16ToFloat(h);
}

// Q5_0, value i (0..31): a nibble from byte 6 + i % 16 (low for the first
// 16 values), bit i of the little-endian u32 at byte 2 as its fifth bit,
// minus 16, times the f16 d at byte 0.
float PlainQ50(const uint8_t* b, int i) {
  const int byte = b[6 + i % 16];
  const int nibble = i < 16 ? byte % 16 : byte / 16;
  const int fifth = (b[2 + i / 8] >> (i % 8)) & 1;
  return static_cast<float>(nibble + 16 * fifth - 16) * HalfAt(b);
}

// Q4_K, value i (0..255) of sub-block j = i / 32: its 6-bit scale and min
// from the 12 bytes at byte 4, its nibble from the 128 bytes at byte 16,
// value = (d * scale) * nibble - dmin * min.
float PlainQ4K(const uint8_t* b, int i) {
  const int j = i / 32;
  const uint8_t* s = b + 4;
  int scale, min;
  if (j < 4) {
    scale = s[j] % 64;
    min = s[j + 4] % 64;
  } else {
    scale = s[j + 4] % 16 + 16 * (s[j - 4] / 64);
    min = s[j + 4] / 16 + 16 * (s[j] / 64);
  }
  const int byte = b[16 + 32 * (j / 2) + i % 32];
  const int nibble = j % 2 == 0 ? byte % 16 : byte / 16;
  return HalfAt(b) * static_cast<float>(scale) * static_cast<float>(nibble) - HalfAt(b + 2) * static_cast<float>(min);
}

// Q6_K, value i (0..255) = 128 h + 32 k + l: low 4 bits from ql (byte 64 h
// + 32 (k % 2) + l; low nibble for k < 2), high 2 bits from qh (byte 128 +
// 32 h + l, bits 2k and 2k + 1), minus 32, times d (f16 at byte 208) times
// the int8 scale at byte 192 + 8 h + 2 k + l / 16.
float PlainQ6K(const uint8_t* b, int i) {
  const int h = i / 128, k = i % 128 / 32, l = i % 32;
  const int low_byte = b[64 * h + 32 * (k % 2) + l];
  const int low = k < 2 ? low_byte % 16 : low_byte / 16;
  const int high = (b[128 + 32 * h + l] >> (2 * k)) % 4;
  const int scale = static_cast<int8_t>(b[192 + 8 * h + 2 * k + l / 16]);
  return HalfAt(b + 208) * static_cast<float>(scale) * static_cast<float>(low + 16 * high - 32);
}

float Plain(GgmlType t, const uint8_t* block, int i) {
  switch (t) {
    case GgmlType::kQ5_0: return PlainQ50(block, i);
    case GgmlType::kQ4_K: return PlainQ4K(block, i);
    default: return PlainQ6K(block, i);
  }
}

// Byte offsets of a block's f16 scales.
std::vector<size_t> ScaleOffsets(GgmlType t) {
  switch (t) {
    case GgmlType::kQ5_0: return {0};
    case GgmlType::kQ4_K: return {0, 2};
    default: return {208};
  }
}

void PutHalf(uint8_t* p, uint16_t h) { std::memcpy(p, &h, 2); }

// Every finite f16 magnitude class: zero, the smallest subnormal, the
// largest subnormal, the smallest normal, one, the largest finite value, and
// negatives.
const uint16_t kExtremeHalves[] = {0x0000, 0x0001, 0x03FF, 0x0400, 0x3C00, 0x7BFF, 0x8001, 0xBC00, 0xFBFF};

// blocks of t: for every shift s < 256, every byte b[k] = (37 k + s) mod
// 256, so every byte value lands at every position (every nibble, high-bit
// and scale pattern); then the f16 scales set to each extreme value in turn.
std::vector<uint8_t> PatternBlocks(GgmlType t) {
  const size_t bb = GgmlTypeSizeOf(t).block_bytes;
  std::vector<uint8_t> out;
  for (const uint16_t half : kExtremeHalves) {
    for (int s = 0; s < 256; ++s) {
      std::vector<uint8_t> b(bb);
      for (size_t k = 0; k < bb; ++k) b[k] = static_cast<uint8_t>((37 * k + s) % 256);
      for (size_t off : ScaleOffsets(t)) PutHalf(&b[off], half);
      out.insert(out.end(), b.begin(), b.end());
    }
  }
  return out;
}

// Random bytes with random finite f16 scales of any magnitude.
std::vector<uint8_t> RandomBlocks(GgmlType t, size_t blocks, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const size_t bb = GgmlTypeSizeOf(t).block_bytes;
  std::vector<uint8_t> b(blocks * bb);
  for (uint8_t& x : b) x = static_cast<uint8_t>(rng());
  for (size_t blk = 0; blk < blocks; ++blk) {
    for (size_t off : ScaleOffsets(t)) {
      PutHalf(&b[blk * bb + off], static_cast<uint16_t>(rng() % 0x7C00 | (rng() & 1) << 15));
    }
  }
  return b;
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

void ExpectPlain(GgmlType t, const std::vector<uint8_t>& bytes) {
  const GgmlTypeSize s = GgmlTypeSizeOf(t);
  const size_t blocks = bytes.size() / s.block_bytes, n = blocks * s.block_values;
  std::vector<float> got(n, -1.0f);
  ASSERT_TRUE(DequantizeRowScalar(t, bytes.data(), n, got.data()).ok());
  for (size_t blk = 0; blk < blocks; ++blk) {
    const uint8_t* b = bytes.data() + blk * s.block_bytes;
    for (uint32_t i = 0; i < s.block_values; ++i) {
      const float want = Plain(t, b, static_cast<int>(i));
      ASSERT_EQ(Bits(want), Bits(got[blk * s.block_values + i]))
          << GgmlTypeName(t) << " block " << blk << " value " << i << ": want " << want << " got "
          << got[blk * s.block_values + i];
    }
  }
}

TEST(GgufDequantQuants, ScalarReadsTheLayout) {
  for (GgmlType t : kNewTypes) {
    SCOPED_TRACE(GgmlTypeName(t));
    ExpectPlain(t, PatternBlocks(t));
    ExpectPlain(t, RandomBlocks(t, 300, 5));
  }
}

TEST(GgufDequantQuants, EverySimdTargetMatchesScalar) {
  ForEachSimdTarget([] {
    for (GgmlType t : kNewTypes) {
      const uint32_t bv = GgmlTypeSizeOf(t).block_values;
      std::vector<std::vector<uint8_t>> inputs = {PatternBlocks(t)};
      for (uint32_t blocks : {1u, 3u, 8u}) inputs.push_back(RandomBlocks(t, blocks * (bv == 32 ? 8 : 1), blocks));
      for (const std::vector<uint8_t>& src : inputs) {
        const size_t n = src.size() / GgmlTypeSizeOf(t).block_bytes * bv;
        SCOPED_TRACE(GgmlTypeName(t) + " n=" + std::to_string(n));
        std::vector<float> want(n, -1.0f), got(n, -2.0f);
        ASSERT_TRUE(DequantizeRowScalar(t, src.data(), n, want.data()).ok());
        ASSERT_TRUE(DequantizeRow(t, src.data(), n, got.data()).ok());
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), n * 4));
      }
    }
  });
}

TEST(GgufDequantQuants, ErrorsNameTheType) {
  for (GgmlType t : kNewTypes) EXPECT_TRUE(CanDequantize(t)) << GgmlTypeName(t);
  for (GgmlType t : {GgmlType::kQ4_0, GgmlType::kQ5_1, GgmlType::kQ5_K, GgmlType::kQ2_K, GgmlType::kBF16}) {
    EXPECT_FALSE(CanDequantize(t)) << GgmlTypeName(t);
  }
  std::vector<uint8_t> src(512, 0);
  std::vector<float> dst(512);
  // Not whole blocks: 32 values of a 256-value type, 48 of Q5_0.
  Status s = DequantizeRow(GgmlType::kQ4_K, src.data(), 32, dst.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("Q4_K"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("256"), std::string::npos) << s.message();
  EXPECT_EQ(DequantizeRowScalar(GgmlType::kQ6_K, src.data(), 128, dst.data()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DequantizeRow(GgmlType::kQ5_0, src.data(), 48, dst.data()).code(), StatusCode::kInvalidArgument);
  // A type without a dequantizer: the message names it and what is decoded.
  s = DequantizeRow(GgmlType::kQ5_K, src.data(), 256, dst.data());
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("Q5_K"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(DequantizableTypeNames()), std::string::npos) << s.message();
  EXPECT_EQ(DequantizableTypeNames(), "F32, F16, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K");
}

// The real file, where it is fetched (scripts/fetch_model.sh gemma3): the
// first tensor of each of its quantized types, a few rows each, decode to
// finite values of a weight's magnitude, the same bits on both paths.
std::string GemmaPath() { return ModelCacheDir() + "/gemma-3-270m-q4_k_m.gguf"; }

// The first tensor of each of `types` in the file, in file order.
std::vector<const GgufTensor*> FirstOfEachType(const GgufFile& f, const std::vector<GgmlType>& types) {
  std::vector<const GgufTensor*> out;
  std::vector<GgmlType> seen;
  for (const GgufTensor& t : f.tensors()) {
    if (std::find(types.begin(), types.end(), t.type) == types.end()) continue;
    if (std::find(seen.begin(), seen.end(), t.type) != seen.end()) continue;
    seen.push_back(t.type);
    out.push_back(&t);
  }
  return out;
}

// The file, or null where it is absent (the test then skips); a file that
// is there but does not open fails the test.
std::unique_ptr<GgufFile> OpenGemma() {
  if (!std::filesystem::exists(GemmaPath())) return nullptr;
  auto f = GgufFile::Open(GemmaPath());
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  return f.ok() ? std::move(f).value() : nullptr;
}

TEST(GgufDequantQuants, GemmaRowsAreSane) {
  const std::unique_ptr<GgufFile> f = OpenGemma();
  if (f == nullptr) GTEST_SKIP() << GemmaPath() << " is absent (scripts/fetch_model.sh gemma3)";
  const std::vector<const GgufTensor*> tensors =
      FirstOfEachType(*f, {GgmlType::kQ5_0, GgmlType::kQ4_K, GgmlType::kQ6_K, GgmlType::kQ8_0});
  for (const GgufTensor* tp : tensors) {
    const GgufTensor& t = *tp;
    SCOPED_TRACE(t.name + " " + GgmlTypeName(t.type) + " " + t.DimsString());
    const size_t cols = t.cols();
    std::vector<float> simd(cols), scalar(cols);
    double sum_sq = 0;
    float amax = 0;
    for (uint64_t r : {uint64_t{0}, uint64_t{1}, uint64_t{2}, t.rows() / 2, t.rows() - 1}) {
      const uint8_t* src = t.bytes.data() + r * t.row_bytes();
      ASSERT_TRUE(DequantizeRow(t.type, src, cols, simd.data()).ok());
      ASSERT_TRUE(DequantizeRowScalar(t.type, src, cols, scalar.data()).ok());
      ASSERT_EQ(0, std::memcmp(simd.data(), scalar.data(), cols * 4)) << "row " << r;
      for (float v : simd) {
        ASSERT_TRUE(std::isfinite(v)) << "row " << r;
        amax = std::max(amax, std::fabs(v));
        sum_sq += double(v) * v;
      }
    }
    const double rms = std::sqrt(sum_sq / (5.0 * cols));
    EXPECT_GT(rms, 1e-3);
    EXPECT_LT(rms, 1.0);
    EXPECT_LT(amax, 64.0f);
  }
  EXPECT_EQ(tensors.size(), 4u) << "the file holds Q5_0, Q4_K, Q6_K and Q8_0 tensors";
}

// The real matrices through the three products: 64 rows of the first
// tensor of each quantized type times 4 normal inputs with an outlier
// channel; the int8 and bf16 products stay within 3% (relative rms) of the
// exact f32 one, as on random codes (matmul_int8_test.cc,
// matmul_bf16_test.cc).
TEST(GgufDequantQuants, GemmaProductsAgree) {
  const std::unique_ptr<GgufFile> f = OpenGemma();
  if (f == nullptr) GTEST_SKIP() << GemmaPath() << " is absent (scripts/fetch_model.sh gemma3)";
  const std::vector<const GgufTensor*> tensors = FirstOfEachType(*f, {kNewTypes[0], kNewTypes[1], kNewTypes[2]});
  for (const GgufTensor* tp : tensors) {
    const GgufTensor& t = *tp;
    SCOPED_TRACE(t.name + " " + GgmlTypeName(t.type));
    const uint32_t rows = 64, cols = static_cast<uint32_t>(t.cols()), n = 4;
    WeightMatrix w{t.type, t.bytes.data(), rows, cols, t.row_bytes()};
    std::mt19937_64 rng(3);
    std::normal_distribution<float> nd;
    std::vector<float> x(size_t{n} * cols);
    for (float& v : x) v = nd(rng);
    x[5] = 30.0f;
    std::vector<float> exact(size_t{n} * rows);
    MatMul(w, x.data(), n, exact.data(), nullptr);
    for (MatMulInputs in : {MatMulInputs::kInt8, MatMulInputs::kBf16}) {
      w.inputs = in;
      std::vector<float> got(exact.size());
      MatMul(w, x.data(), n, got.data(), nullptr);
      double err = 0, norm = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        err += (double(got[i]) - exact[i]) * (double(got[i]) - exact[i]);
        norm += double(exact[i]) * exact[i];
      }
      EXPECT_LT(std::sqrt(err / norm), 0.03) << MatMulInputsName(in);
      EXPECT_GT(norm, 0.0);
    }
  }
  EXPECT_EQ(tensors.size(), 3u);
}

}  // namespace
}  // namespace kvcache::model
