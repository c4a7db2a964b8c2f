// The decoder's weight products (model/tensor/matmul.h) on SmolLM2's
// shapes, exact f32 inputs against int8 and bf16 inputs, times 1 token (decode) and
// 64 (a prefill chunk), from cache and streamed from memory (sizes below).
// Bytes/s counts the weight bytes read per product.
#include <benchmark/benchmark.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "kvcache/float16.h"
#include "kvcache/thread_pool.h"
#include "model/tensor/matmul.h"
#include "tools/support/bench_support.h"

namespace {

using kvcache::model::GgmlType;
using kvcache::model::MatMulInputs;
using kvcache::model::WeightMatrix;

struct Matrix {
  std::vector<uint8_t> bytes;
  WeightMatrix w;
};

Matrix MakeMatrix(GgmlType t, uint32_t rows, uint32_t cols) {
  const size_t bb = t == GgmlType::kQ4_1 ? 20 : 34;
  Matrix m;
  m.bytes.resize(static_cast<size_t>(rows) * cols / 32 * bb);
  std::mt19937_64 rng(1);
  for (uint8_t& b : m.bytes) b = static_cast<uint8_t>(rng());
  for (size_t blk = 0; blk < m.bytes.size() / bb; ++blk) {
    const uint16_t d = kvcache::FloatToF16(0.01f), mn = kvcache::FloatToF16(-0.1f);
    std::memcpy(&m.bytes[blk * bb], &d, 2);
    if (t == GgmlType::kQ4_1) std::memcpy(&m.bytes[blk * bb + 2], &mn, 2);
  }
  m.w = WeightMatrix{t, m.bytes.data(), rows, cols, static_cast<size_t>(cols) / 32 * bb};
  return m;
}

// args: type (0 Q4_1, 1 Q8_0), inputs (0 f32, 1 int8, 2 bf16), tokens, threads, size (0:
// cache-resident, [1536][576] and [4096][576]; 1: streamed from memory,
// [46080][576] Q4_1 = 16.6 MB, about a third of SmolLM2's layers, and the
// whole [49152][576] Q8_0 classifier, 30 MB)
void BM_MatMul(benchmark::State& state) {
  const GgmlType t = state.range(0) == 0 ? GgmlType::kQ4_1 : GgmlType::kQ8_0;
  const bool big = state.range(4) != 0;
  const uint32_t threads = static_cast<uint32_t>(state.range(3));
  std::unique_ptr<kvcache::ThreadPool> pool =
      threads > 1 ? std::make_unique<kvcache::ThreadPool>(threads) : nullptr;
  Matrix m = t == GgmlType::kQ4_1 ? MakeMatrix(t, big ? 46080 : 1536, 576)
                                  : MakeMatrix(t, big ? 49152 : 4096, 576);
  const MatMulInputs kinds[] = {MatMulInputs::kF32, MatMulInputs::kInt8, MatMulInputs::kBf16};
  m.w.inputs = kinds[state.range(1)];
  const uint32_t n = static_cast<uint32_t>(state.range(2));
  std::vector<float> x(static_cast<size_t>(n) * m.w.cols), out(static_cast<size_t>(n) * m.w.rows);
  std::mt19937_64 rng(2);
  std::normal_distribution<float> nd;
  for (float& v : x) v = nd(rng);
  for (auto _ : state) {
    kvcache::model::MatMul(m.w, x.data(), n, out.data(), pool.get());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(m.bytes.size()));
  state.SetLabel(std::string(t == GgmlType::kQ4_1 ? "q4_1" : "q8_0") + " " + std::string(kvcache::model::MatMulInputsName(m.w.inputs)) +
                 " n=" + std::to_string(n) + " threads=" + std::to_string(threads) + (big ? " streamed" : ""));
}
BENCHMARK(BM_MatMul)->ArgsProduct({{0, 1}, {0, 1, 2}, {1, 16, 64}, {1}, {0}});
BENCHMARK(BM_MatMul)->ArgsProduct({{0, 1}, {0, 1, 2}, {1}, {1, 2}, {1}})->UseRealTime();

// The floor the streamed products are compared with: one read of 96 MB
// (SmolLM2's weights as stored) split over the threads, in the same run.
void BM_ReadBandwidth(benchmark::State& state) {
  const uint32_t threads = static_cast<uint32_t>(state.range(0));
  std::unique_ptr<kvcache::ThreadPool> pool =
      threads > 1 ? std::make_unique<kvcache::ThreadPool>(threads) : nullptr;
  kvcache::attention_internal::ReadBandwidthProbe probe(96u << 20);
  double gbps = 0;
  for (auto _ : state) gbps = probe.MeasureOnce(pool.get());
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * (96 << 20));
  state.SetLabel("read 96 MB, threads=" + std::to_string(threads));
  benchmark::DoNotOptimize(gbps);
}
BENCHMARK(BM_ReadBandwidth)->Arg(1)->Arg(2)->UseRealTime();

}  // namespace
