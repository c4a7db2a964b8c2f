// The bf16 weight product (model/tensor/matmul_bf16.h): every kernel this
// CPU runs (AMX tiles, vdpbf16ps, the f32 FMA kernel over rounded values)
// against a double-precision reference over the same bf16-rounded values,
// every shape edge (partial row blocks, partial token tiles, columns that
// are not a multiple of 32), and batch sizes and thread counts that change
// no bit.
#include "model/tensor/matmul_bf16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvcache/float16.h"
#include "kvcache/thread_pool.h"
#include "model/tensor/matmul.h"
#include "random_weights.h"

namespace kvcache::model {
namespace {

struct Case {
  GgmlType type;
  uint32_t rows, cols;
};

size_t RowBytes(GgmlType t, uint32_t cols) {
  switch (t) {
    case GgmlType::kF16: return size_t{cols} * 2;
    case GgmlType::kF32: return size_t{cols} * 4;
    default: return QuantRowBytes(t, cols);
  }
}

// Random codes with real-model scales (as the int8 test's matrices), or
// normal f32 / f16 values.
std::vector<uint8_t> RandomMatrix(const Case& c, uint64_t seed) {
  if (c.type != GgmlType::kF32 && c.type != GgmlType::kF16) return RandomQuantMatrix(c.type, c.rows, c.cols, seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0, 0.05f);
  std::vector<uint8_t> b(RowBytes(c.type, c.cols) * c.rows);
  for (size_t i = 0; i < size_t{c.rows} * c.cols; ++i) {
    const float v = nd(rng);
    if (c.type == GgmlType::kF32) {
      std::memcpy(&b[4 * i], &v, 4);
    } else {
      const uint16_t h = FloatToF16(v);
      std::memcpy(&b[2 * i], &h, 2);
    }
  }
  return b;
}

WeightMatrix Matrix(const Case& c, const std::vector<uint8_t>& bytes) {
  WeightMatrix w{c.type, bytes.data(), c.rows, c.cols, RowBytes(c.type, c.cols)};
  w.inputs = MatMulInputs::kBf16;
  return w;
}

float Bf16(float v) { return BF16ToFloat(FloatToBF16(v)); }

const char* Name(Bf16Kernel k) {
  switch (k) {
    case Bf16Kernel::kTiles: return "tiles";
    case Bf16Kernel::kDot: return "dot";
    default: return "fma";
  }
}

const Bf16Kernel kKernels[] = {Bf16Kernel::kFma, Bf16Kernel::kTiles, Bf16Kernel::kDot};

// out[t][r] from one kernel over all rows, split into `parts` row ranges.
std::vector<float> Product(const WeightMatrix& w, const float* x, uint32_t n, Bf16Kernel kernel,
                           uint32_t parts = 1) {
  Bf16Inputs in;
  PrepareBf16Inputs(x, n, w.cols, kernel, &in);
  EXPECT_EQ(in.kernel, Bf16KernelAvailable(kernel) ? kernel : Bf16Kernel::kFma);
  std::vector<float> out(static_cast<size_t>(n) * w.rows, std::nanf(""));
  for (uint32_t p = 0; p < parts; ++p) {
    MatMulRowsBf16(w, w.rows * p / parts, w.rows * (p + 1) / parts, in, out.data());
  }
  return out;
}

const Case kCases[] = {
    {GgmlType::kQ4_1, 70, 576},  // partial row block (70 = 4 x 16 + 6)
    {GgmlType::kQ8_0, 33, 64},   {GgmlType::kQ4_1, 16, 32},
    {GgmlType::kF32, 21, 40},    // columns not a multiple of 32
    {GgmlType::kF16, 5, 96},
    {GgmlType::kQ5_0, 19, 160},  {GgmlType::kQ4_K, 18, 512},  // Gemma 3's types
    {GgmlType::kQ6_K, 35, 256},
};
const uint32_t kTokens[] = {1, 3, 16, 17, 33, 48, 64, 70};

// Every kernel within the f32 summation bound of the double reference over
// the same rounded values, for every case and token count; the tiles and
// dot kernels only where the CPU has them.
TEST(MatMulBf16, EveryKernelMatchesTheReference) {
  for (const Bf16Kernel kernel : kKernels) {
    if (!Bf16KernelAvailable(kernel)) {
      std::printf("this CPU does not run the %s kernel: not tested here\n", Name(kernel));
      continue;
    }
    for (const Case& c : kCases) {
      const std::vector<uint8_t> bytes = RandomMatrix(c, 1000 + c.rows);
      const WeightMatrix w = Matrix(c, bytes);
      std::vector<float> row(c.cols);
      for (uint32_t n : kTokens) {
        SCOPED_TRACE(std::string(Name(kernel)) + " " + GgmlTypeName(c.type) + " rows " +
                     std::to_string(c.rows) + " cols " + std::to_string(c.cols) + " n " + std::to_string(n));
        const std::vector<float> x = RandomInputs(size_t{n} * c.cols, 7 + n);
        const std::vector<float> got = Product(w, x.data(), n, kernel);
        std::vector<double> ref(size_t{n} * c.rows);
        MatMulBf16Reference(w, x.data(), n, ref.data());
        for (uint32_t r = 0; r < c.rows; ++r) {
          w.DecodeRows(r, 1, row.data());
          for (uint32_t t = 0; t < n; ++t) {
            double mag = 0;
            for (uint32_t k = 0; k < c.cols; ++k) mag += std::fabs(Bf16(row[k]) * Bf16(x[size_t{t} * c.cols + k]));
            const double got_v = got[size_t{t} * c.rows + r], ref_v = ref[size_t{t} * c.rows + r];
            ASSERT_LE(std::fabs(got_v - ref_v), c.cols * std::ldexp(mag, -23) + 1e-30)
                << "t " << t << " r " << r << " got " << got_v << " ref " << ref_v;
          }
        }
      }
    }
  }
}

// The rounding is real: the bf16 product is not the exact f32 product (whose
// weights carry more than 8 significant bits), but it stays close to it.
TEST(MatMulBf16, RoundsWeightsAndInputs) {
  const Case c{GgmlType::kQ4_1, 32, 576};
  const std::vector<uint8_t> bytes = RandomMatrix(c, 3);
  WeightMatrix w = Matrix(c, bytes);
  const uint32_t n = 4;
  const std::vector<float> x = RandomInputs(size_t{n} * c.cols, 4);
  std::vector<float> bf(size_t{n} * c.rows), exact(size_t{n} * c.rows);
  MatMul(w, x.data(), n, bf.data(), nullptr);
  w.inputs = MatMulInputs::kF32;
  MatMul(w, x.data(), n, exact.data(), nullptr);
  size_t differ = 0;
  double err = 0, norm = 0;
  for (size_t i = 0; i < bf.size(); ++i) {
    differ += bf[i] != exact[i];
    err += (bf[i] - exact[i]) * double(bf[i] - exact[i]);
    norm += exact[i] * double(exact[i]);
  }
  EXPECT_GT(differ, bf.size() / 2);
  EXPECT_LT(std::sqrt(err / norm), 1e-2);
}

// A token's result is the same bits whatever else is in the product, however
// the rows are split, and through MatMul with a thread pool; for each kernel.
TEST(MatMulBf16, BatchSizeAndRowSplitChangeNoBit) {
  ThreadPool pool(2);
  for (const Bf16Kernel kernel : kKernels) {
    if (!Bf16KernelAvailable(kernel)) continue;
    for (const Case& c : kCases) {
      SCOPED_TRACE(std::string(Name(kernel)) + " " + GgmlTypeName(c.type));
      const std::vector<uint8_t> bytes = RandomMatrix(c, 50 + c.cols);
      const WeightMatrix w = Matrix(c, bytes);
      const uint32_t n = 70;
      const std::vector<float> x = RandomInputs(size_t{n} * c.cols, 9);
      const std::vector<float> all = Product(w, x.data(), n, kernel);
      const std::vector<float> split = Product(w, x.data(), n, kernel, 3);
      ASSERT_EQ(0, std::memcmp(all.data(), split.data(), all.size() * 4));
      for (uint32_t t : {0u, 5u, 16u, 47u, 69u}) {
        for (uint32_t k : {1u, 2u, 3u, 20u}) {  // t alone, and in smaller batches
          if (t + k > n) continue;
          const std::vector<float> part = Product(w, x.data() + size_t{t} * c.cols, k, kernel);
          ASSERT_EQ(0, std::memcmp(part.data(), all.data() + size_t{t} * c.rows, size_t{k} * c.rows * 4))
              << "tokens " << t << ".." << t + k;
        }
      }
      if (kernel == PreferredBf16Kernel()) {  // MatMul picks this kernel
        std::vector<float> pooled(all.size());
        MatMul(w, x.data(), n, pooled.data(), &pool);
        ASSERT_EQ(0, std::memcmp(all.data(), pooled.data(), all.size() * 4));
      }
    }
  }
}

TEST(MatMulBf16, ParsesItsName) {
  auto p = ParseMatMulInputs("bf16");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p, MatMulInputs::kBf16);
  EXPECT_EQ(MatMulInputsName(MatMulInputs::kBf16), "bf16");
  EXPECT_FALSE(ParseMatMulInputs("bf8").ok());
}

}  // namespace
}  // namespace kvcache::model
