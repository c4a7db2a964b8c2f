// The integer-lane weight product (model/tensor/matmul_int8.h): the input
// rounding, every SIMD target against the scalar reference bit for bit,
// thread counts and batch sizes that change nothing, and how close it stays
// to the exact f32 product.
#include "model/tensor/matmul_int8.h"

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvcache/float16.h"
#include "kvcache/thread_pool.h"
#include "model/tensor/matmul.h"
#include "matmul_checks.h"
#include "random_weights.h"

namespace kvcache::model {
namespace {

const GgmlType kInt8Types[] = {GgmlType::kQ4_1, GgmlType::kQ8_0, GgmlType::kQ5_0, GgmlType::kQ4_K, GgmlType::kQ6_K};

WeightMatrix Matrix(GgmlType t, const std::vector<uint8_t>& bytes, uint32_t rows, uint32_t cols) {
  WeightMatrix w{t, bytes.data(), rows, cols, QuantRowBytes(t, cols)};
  w.inputs = MatMulInputs::kInt8;
  return w;
}

TEST(MatMulInt8, QuantizeInputsRoundsPerBlockOf32) {
  std::vector<float> x(64, 0.0f);
  x[0] = 2.54f;    // the block's amax: code 127, scale 0.02
  x[1] = -1.27f;   // -63.5 -> -64 (ties to even)
  x[2] = 0.01f;    // 0.5 -> 0
  x[3] = 0.03f;    // 1.5 -> 2
  // the second block is all zeros: scale 0, codes 0
  QuantizedInputs q;
  QuantizeInputs(x.data(), 1, 64, &q);
  ASSERT_EQ(q.q.size(), 64u);
  EXPECT_EQ(q.q[0], 127);
  EXPECT_EQ(q.q[1], -64);
  EXPECT_EQ(q.q[2], 0);
  EXPECT_EQ(q.q[3], 2);
  EXPECT_FLOAT_EQ(q.dxc[0], 2.54f / 127.0f);
  EXPECT_FLOAT_EQ(q.dxc[1], q.dxc[0] * (127 - 64 + 0 + 2));
  EXPECT_EQ(q.dxc[2], 0.0f);
  EXPECT_EQ(q.dxc[3], 0.0f);
  for (int j = 32; j < 64; ++j) EXPECT_EQ(q.q[j], 0);
}

// Every SIMD target rounds the inputs as the scalar reference does: random
// blocks, blocks of ties (x.5 after scaling), an all-zero block, one huge
// value among small ones, infinitesimal values.
TEST(MatMulInt8, QuantizeInputsMatchesScalarOnEveryTarget) {
  const uint32_t cols = 256, n = 3;
  std::vector<float> x = RandomInputs(static_cast<size_t>(n) * cols, 17);
  for (int j = 0; j < 32; ++j) x[32 + j] = (j - 16) * 0.5f + 0.25f;  // amax 7.75: some codes tie
  for (int j = 0; j < 32; ++j) x[64 + j] = 0.0f;
  x[96] = 1e30f;
  for (int j = 0; j < 32; ++j) x[128 + j] = (j % 3 - 1) * 1e-38f;
  for (int j = 0; j < 32; ++j) x[160 + j] = (j - 15.5f) * (127.0f / 15.5f) / 127.0f;  // exact halves
  QuantizedInputs want;
  QuantizeInputsScalar(x.data(), n, cols, &want);
  ForEachSimdTarget([&] {
    QuantizedInputs got;
    QuantizeInputs(x.data(), n, cols, &got);
    ASSERT_EQ(got.q.size(), want.q.size());
    for (size_t i = 0; i < want.q.size(); ++i) ASSERT_EQ(got.q[i], want.q[i]) << "value " << i << " x " << x[i];
    ASSERT_EQ(got.dxc.size(), want.dxc.size());
    ASSERT_EQ(0, std::memcmp(got.dxc.data(), want.dxc.data(), want.dxc.size() * 4));
  });
}

TEST(MatMulInt8, EverySimdTargetMatchesScalar) {
  ForEachSimdTarget([] {
    for (GgmlType t : kInt8Types) {
      const bool k = GgmlTypeSizeOf(t).block_values == 256;
      for (uint32_t cols : k ? std::vector<uint32_t>{256u, 512u, 2048u} : std::vector<uint32_t>{32u, 64u, 576u}) {
        for (uint32_t rows : {1u, 3u, 4u, 9u, 18u}) {
          for (uint32_t n : {1u, 2u, 5u}) {
            SCOPED_TRACE(GgmlTypeName(t) + " rows=" + std::to_string(rows) + " cols=" +
                         std::to_string(cols) + " n=" + std::to_string(n));
            const std::vector<uint8_t> bytes = RandomQuantMatrix(t, rows, cols, rows * 31 + cols);
            const WeightMatrix w = Matrix(t, bytes, rows, cols);
            const std::vector<float> x = RandomInputs(static_cast<size_t>(n) * cols, n + cols);
            QuantizedInputs q;
            QuantizeInputs(x.data(), n, cols, &q);
            std::vector<float> want(static_cast<size_t>(n) * rows, -1.0f), got(want.size(), -2.0f);
            MatMulInt8Scalar(w, q, want.data());
            MatMulRowsInt8(w, 0, rows, q, got.data());
            ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * 4));
          }
        }
      }
    }
  });
}

// Extreme blocks: every code byte the same value (0x00, 0x7F, 0x80, 0xFF:
// the smallest and largest codes, Q6_K's scales -128 and 127, Q4_K's 6-bit
// scales and mins 0 and 63) with unit f16 scales, against inputs at full
// scale (codes +-127): the byte products' pair sums are largest here, and
// must stay exact on every target.
TEST(MatMulInt8, ExtremeCodesMatchScalarOnEveryTarget) {
  const uint32_t rows = 5, cols = 512, n = 3;
  std::vector<float> x(static_cast<size_t>(n) * cols);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (i % 3 == 0) ? -1.0f : 1.0f;
  QuantizedInputs q;
  QuantizeInputs(x.data(), n, cols, &q);
  ForEachSimdTarget([&] {
    for (GgmlType t : kInt8Types) {
      for (uint8_t fill : {uint8_t{0x00}, uint8_t{0x7F}, uint8_t{0x80}, uint8_t{0xFF}}) {
        SCOPED_TRACE(GgmlTypeName(t) + " fill " + std::to_string(fill));
        std::vector<uint8_t> bytes(QuantRowBytes(t, cols) * rows, fill);
        const GgmlTypeSize s = GgmlTypeSizeOf(t);
        const uint16_t one = FloatToF16(1.0f);
        for (size_t blk = 0; blk < bytes.size() / s.block_bytes; ++blk) {
          uint8_t* p = &bytes[blk * s.block_bytes];
          std::memcpy(t == GgmlType::kQ6_K ? p + 208 : p, &one, 2);
          if (t == GgmlType::kQ4_1 || t == GgmlType::kQ4_K) std::memcpy(p + 2, &one, 2);
        }
        const WeightMatrix w = Matrix(t, bytes, rows, cols);
        std::vector<float> want(static_cast<size_t>(n) * rows, -1.0f), got(want.size(), -2.0f);
        MatMulInt8Scalar(w, q, want.data());
        MatMulRowsInt8(w, 0, rows, q, got.data());
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * 4));
      }
    }
  });
}

// Through MatMul: any thread count and any batch gives each token the bits
// it gets alone (the batch invariance the serving engine relies on).
TEST(MatMulInt8, ThreadsAndBatchChangeNothing) {
  const uint32_t rows = 67, cols = 768, n = 5;
  for (GgmlType t : kInt8Types) {
    SCOPED_TRACE(GgmlTypeName(t));
    const std::vector<uint8_t> bytes = RandomQuantMatrix(t, rows, cols, 5);
    const WeightMatrix w = Matrix(t, bytes, rows, cols);
    const std::vector<float> x = RandomInputs(static_cast<size_t>(n) * cols, 6);
    QuantizedInputs q;
    QuantizeInputs(x.data(), n, cols, &q);
    std::vector<float> want(static_cast<size_t>(n) * rows);
    MatMulInt8Scalar(w, q, want.data());
    ExpectSameBitsPooledAndAlone(w, x, n, want);
  }
}

// The approximation: relative to the exact f32 product of the same weights,
// the error is what int8 inputs cost. Rounding a block of 32 to steps of
// amax / 127 moves each value by at most amax / 254, uniformly distributed:
// an rms of amax / (254 sqrt 3) per value, about 0.8% of amax. Normal inputs
// (amax about 2.5 sigma per block of 32; the outlier block is exact at its
// outlier and coarse elsewhere) give a relative rms error of the dot
// products of about 1%, independent of the weight type since the weights
// are not rounded further: below 2% for every type, and above 0 (the
// rounding must show). The f32 path ignores kInt8 for F32 matrices.
TEST(MatMulInt8, StaysCloseToTheExactProduct) {
  const uint32_t rows = 64, cols = 768;
  for (GgmlType t : kInt8Types) {
    const std::vector<uint8_t> bytes = RandomQuantMatrix(t, rows, cols, 9);
    WeightMatrix w = Matrix(t, bytes, rows, cols);
    const std::vector<float> x = RandomInputs(cols, 10);
    std::vector<float> fast(rows), exact(rows);
    MatMul(w, x.data(), 1, fast.data(), nullptr);
    w.inputs = MatMulInputs::kF32;
    MatMulScalar(w, x.data(), 1, exact.data());
    double err = 0, norm = 0;
    for (uint32_t r = 0; r < rows; ++r) {
      err += (fast[r] - exact[r]) * (fast[r] - exact[r]);
      norm += exact[r] * exact[r];
    }
    std::printf("%s: relative rms error of the int8 product %.4f\n", GgmlTypeName(t).c_str(), std::sqrt(err / norm));
    EXPECT_LT(std::sqrt(err / norm), 0.02) << GgmlTypeName(t);
    EXPECT_GT(std::sqrt(err / norm), 0.0) << GgmlTypeName(t) << ": rounding the inputs must show";
  }
  std::vector<float> f(64 * 32), x = RandomInputs(32, 11), a(64), b(64);
  for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(i % 7) - 3.0f;
  WeightMatrix wf = WeightMatrix::F32(f, 64, 32);
  wf.inputs = MatMulInputs::kInt8;
  EXPECT_FALSE(UsesInt8(wf));
  for (GgmlType t : kInt8Types) EXPECT_TRUE(Int8Type(t)) << GgmlTypeName(t);
  for (GgmlType t : {GgmlType::kF16, GgmlType::kQ5_1, GgmlType::kQ5_K}) EXPECT_FALSE(Int8Type(t)) << GgmlTypeName(t);
  MatMul(wf, x.data(), 1, a.data(), nullptr);
  MatMulScalar(wf, x.data(), 1, b.data());
  for (int r = 0; r < 64; ++r) EXPECT_NEAR(a[r], b[r], 1e-4f);
}

}  // namespace
}  // namespace kvcache::model
