// The decoder's weight products (model/tensor/matmul.h) on SmolLM2's
// shapes (Q4_1, Q8_0) and Gemma 3 270M's (Q5_0, Q4_K, Q6_K), exact f32
// inputs against int8 and bf16 inputs, times 1 token (decode) and 16 or 64
// (a prefill chunk), from cache and streamed from memory (sizes below).
// Bytes/s counts the weight bytes read per product.
#include <benchmark/benchmark.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include <hwy/targets.h>

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

// Random codes with fixed scales (the K types' sub-block scales random).
Matrix MakeMatrix(GgmlType t, uint32_t rows, uint32_t cols) {
  const kvcache::model::GgmlTypeSize size = kvcache::model::GgmlTypeSizeOf(t);
  const size_t bb = size.block_bytes;
  Matrix m;
  m.bytes.resize(static_cast<size_t>(rows) * cols / size.block_values * bb);
  std::mt19937_64 rng(1);
  for (uint8_t& b : m.bytes) b = static_cast<uint8_t>(rng());
  const uint16_t d = kvcache::FloatToF16(t == GgmlType::kQ4_K || t == GgmlType::kQ6_K ? 0.001f : 0.01f);
  const uint16_t mn = kvcache::FloatToF16(t == GgmlType::kQ4_K ? 0.001f : -0.1f);
  for (size_t blk = 0; blk < m.bytes.size() / bb; ++blk) {
    uint8_t* p = &m.bytes[blk * bb];
    std::memcpy(t == GgmlType::kQ6_K ? p + 208 : p, &d, 2);
    if (t == GgmlType::kQ4_1 || t == GgmlType::kQ4_K) std::memcpy(p + 2, &mn, 2);
  }
  m.w = WeightMatrix{t, m.bytes.data(), rows, cols, static_cast<size_t>(cols) / size.block_values * bb};
  return m;
}

// Times MatMul of m (its inputs set from `inputs`: 0 f32, 1 int8, 2 bf16)
// by n normal inputs; counts the weight bytes read per product.
void RunProducts(benchmark::State& state, Matrix& m, int64_t inputs, uint32_t n, kvcache::ThreadPool* pool) {
  const MatMulInputs kinds[] = {MatMulInputs::kF32, MatMulInputs::kInt8, MatMulInputs::kBf16};
  m.w.inputs = kinds[inputs];
  std::vector<float> x(static_cast<size_t>(n) * m.w.cols), out(static_cast<size_t>(n) * m.w.rows);
  std::mt19937_64 rng(2);
  std::normal_distribution<float> nd;
  for (float& v : x) v = nd(rng);
  for (auto _ : state) {
    kvcache::model::MatMul(m.w, x.data(), n, out.data(), pool);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(m.bytes.size()));
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
  const uint32_t n = static_cast<uint32_t>(state.range(2));
  RunProducts(state, m, state.range(1), n, pool.get());
  state.SetLabel(std::string(t == GgmlType::kQ4_1 ? "q4_1" : "q8_0") + " " + std::string(kvcache::model::MatMulInputsName(m.w.inputs)) +
                 " n=" + std::to_string(n) + " threads=" + std::to_string(threads) + (big ? " streamed" : ""));
}
BENCHMARK(BM_MatMul)->ArgsProduct({{0, 1}, {0, 1, 2}, {1, 16, 64}, {1}, {0}});
BENCHMARK(BM_MatMul)->ArgsProduct({{0, 1}, {0, 1, 2}, {1}, {1, 2}, {1}})->UseRealTime();

// Gemma 3 270M's matrices, one layer's worth each (in cache):
// args: matrix (0: attn_q [1024][640] Q5_0, 1: ffn_gate [2048][640] Q5_0,
// 2: attn_output [640][1024] Q4_K, 3: ffn_down [640][2048] Q6_K, 4: attn_v
// [256][640] Q8_0), inputs (0 f32, 1 int8, 2 bf16), tokens, SIMD target (0:
// the best this CPU runs, 1: AVX2, where the CPU runs more; the bf16 dot
// and tile kernels do not go through Highway and ignore it).
void BM_MatMulGemma(benchmark::State& state) {
  struct Shape {
    GgmlType type;
    uint32_t rows, cols;
    const char* name;
  };
  const Shape shapes[] = {{GgmlType::kQ5_0, 1024, 640, "attn_q q5_0"},
                          {GgmlType::kQ5_0, 2048, 640, "ffn_gate q5_0"},
                          {GgmlType::kQ4_K, 640, 1024, "attn_output q4_k"},
                          {GgmlType::kQ6_K, 640, 2048, "ffn_down q6_k"},
                          {GgmlType::kQ8_0, 256, 640, "attn_v q8_0"}};
  const Shape& sh = shapes[state.range(0)];
  const bool avx2 = state.range(3) != 0;
  if (avx2) {
    if ((hwy::SupportedTargets() & HWY_AVX2) == 0) {
      state.SkipWithError("this CPU does not run AVX2");
      return;
    }
    hwy::SetSupportedTargetsForTest(HWY_AVX2);
  }
  Matrix m = MakeMatrix(sh.type, sh.rows, sh.cols);
  const uint32_t n = static_cast<uint32_t>(state.range(2));
  RunProducts(state, m, state.range(1), n, nullptr);
  if (avx2) hwy::SetSupportedTargetsForTest(0);
  state.counters["rows/s"] =
      benchmark::Counter(static_cast<double>(sh.rows) * n, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(sh.name) + " " + std::string(kvcache::model::MatMulInputsName(m.w.inputs)) +
                 " n=" + std::to_string(n) + (avx2 ? " AVX2" : " best"));
}
BENCHMARK(BM_MatMulGemma)->ArgsProduct({{0, 1, 2, 3, 4}, {0, 1, 2}, {1, 16}, {0, 1}});

// Gemma 3 270M's tied output head, [262144][640] Q8_0 (178 MB, streamed
// from memory every token), times one token: args inputs (0 f32, 1 int8,
// 2 bf16), threads. Compare with BM_ReadBandwidth of the same run.
void BM_MatMulGemmaHead(benchmark::State& state) {
  const uint32_t threads = static_cast<uint32_t>(state.range(1));
  std::unique_ptr<kvcache::ThreadPool> pool =
      threads > 1 ? std::make_unique<kvcache::ThreadPool>(threads) : nullptr;
  static Matrix m = MakeMatrix(GgmlType::kQ8_0, 262144, 640);
  RunProducts(state, m, state.range(0), 1, pool.get());
  state.SetLabel("output head q8_0 " + std::string(kvcache::model::MatMulInputsName(m.w.inputs)) +
                 " n=1 threads=" + std::to_string(threads));
}
BENCHMARK(BM_MatMulGemmaHead)->ArgsProduct({{1, 2}, {1, 2}})->UseRealTime();

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
