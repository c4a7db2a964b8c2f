// The exact f32 weight product (model/tensor/matmul.h, MatMulInputs::kF32)
// over every quantized type it decodes, Gemma 3's Q5_0, Q4_K and Q6_K among
// them: MatMul against MatMulScalar within the f32 summation bound (they
// differ by summation order only), and thread counts and batches that
// change no bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "model/tensor/matmul.h"
#include "matmul_checks.h"
#include "random_weights.h"

namespace kvcache::model {
namespace {

const GgmlType kTypes[] = {GgmlType::kQ4_1, GgmlType::kQ8_0, GgmlType::kQ5_0, GgmlType::kQ4_K, GgmlType::kQ6_K};

TEST(MatMulF32, QuantTypesMatchTheScalarLoop) {
  const uint32_t rows = 13, cols = 512;
  for (GgmlType t : kTypes) {
    SCOPED_TRACE(GgmlTypeName(t));
    const std::vector<uint8_t> bytes = RandomQuantMatrix(t, rows, cols, 21);
    const WeightMatrix w{t, bytes.data(), rows, cols, QuantRowBytes(t, cols)};
    for (uint32_t n : {1u, 2u, 5u}) {
      const std::vector<float> x = RandomInputs(static_cast<size_t>(n) * cols, 22 + n);
      std::vector<float> got(static_cast<size_t>(n) * rows), want(got.size());
      MatMul(w, x.data(), n, got.data(), nullptr);
      MatMulScalar(w, x.data(), n, want.data());
      std::vector<float> row(cols);
      for (uint32_t r = 0; r < rows; ++r) {
        w.DecodeRows(r, 1, row.data());
        for (uint32_t i = 0; i < n; ++i) {
          double mag = 0;
          for (uint32_t c = 0; c < cols; ++c) mag += std::fabs(double(row[c]) * x[size_t{i} * cols + c]);
          // Two f32 sums of the same cols products: each within cols * 2^-24
          // of the exact sum's magnitude.
          EXPECT_LE(std::fabs(double(got[size_t{i} * rows + r]) - want[size_t{i} * rows + r]),
                    2 * cols * std::ldexp(mag, -24) + 1e-30)
              << "n " << n << " t " << i << " r " << r;
        }
      }
    }
  }
}

TEST(MatMulF32, ThreadsAndBatchChangeNoBit) {
  const uint32_t rows = 37, cols = 768, n = 5;
  for (GgmlType t : kTypes) {
    SCOPED_TRACE(GgmlTypeName(t));
    const std::vector<uint8_t> bytes = RandomQuantMatrix(t, rows, cols, 31);
    const WeightMatrix w{t, bytes.data(), rows, cols, QuantRowBytes(t, cols)};
    const std::vector<float> x = RandomInputs(static_cast<size_t>(n) * cols, 32);
    std::vector<float> want(static_cast<size_t>(n) * rows);
    MatMul(w, x.data(), n, want.data(), nullptr);
    ExpectSameBitsPooledAndAlone(w, x, n, want);
  }
}

}  // namespace
}  // namespace kvcache::model
