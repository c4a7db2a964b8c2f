// Encode/decode throughput per format (RowCodec, head_dim 128, gaussian rows)
// and the rotation alone. bytes/s counts the f32 side (values * 4) so formats
// compare on the same work; "stored_B/s" counts the encoded bytes. The label
// names the SIMD target the kernels dispatched to.
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "kvcache/codec.h"
#include "kvcache/simd.h"

namespace kvcache {
namespace {

constexpr uint32_t kHeadDim = 128;
constexpr size_t kRows = 512;  // 256 KiB of f32: stays in L2, measures the kernel

std::vector<float> Rows() {
  std::mt19937_64 rng(1);
  std::normal_distribution<float> nd;
  std::vector<float> x(kRows * kHeadDim);
  for (auto& v : x) v = nd(rng);
  return x;
}

void SetCounters(benchmark::State& state, const RowCodec& c) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kRows * kHeadDim * 4));
  state.counters["stored_B/s"] = benchmark::Counter(
      static_cast<double>(state.iterations() * kRows * c.row_bytes()), benchmark::Counter::kIsRate);
  state.counters["rows/s"] = benchmark::Counter(static_cast<double>(state.iterations() * kRows),
                                                benchmark::Counter::kIsRate);
  state.SetLabel(SimdTarget());
}

// Times op(codec, rows, encoded bytes, decoded rows) over kRows gaussian
// rows of format f; the bytes hold the rows' encoding when `encoded`.
template <typename Op>
void RunCodec(benchmark::State& state, Format f, bool encoded, Op op) {
  const RowCodec c = RowCodec::Create(f, kHeadDim, Side::kKey).value();
  const std::vector<float> x = Rows();
  std::vector<uint8_t> bytes(kRows * c.row_bytes());
  if (encoded) (void)c.Encode(x, bytes);
  std::vector<float> y(encoded ? x.size() : 0);
  for (auto _ : state) {
    benchmark::DoNotOptimize(op(c, x, bytes, y).ok());
    benchmark::ClobberMemory();
  }
  SetCounters(state, c);
}

void BM_Encode(benchmark::State& state, Format f) {
  RunCodec(state, f, false, [](const RowCodec& c, const std::vector<float>& x,
                               std::vector<uint8_t>& bytes, std::vector<float>&) {
    return c.Encode(x, bytes);
  });
}

void BM_Decode(benchmark::State& state, Format f) {
  RunCodec(state, f, true, [](const RowCodec& c, const std::vector<float>&,
                              std::vector<uint8_t>& bytes, std::vector<float>& y) {
    return c.Decode(bytes, y);
  });
}

// The quantizer alone (RowCodec::EncodePrepared: no rotation, no value
// checks, no calibration) on the same rows: what docs/encode.md calls the
// bare quantizer.
void BM_EncodeBare(benchmark::State& state, Format f) {
  RunCodec(state, f, false, [](const RowCodec& c, const std::vector<float>& x,
                               std::vector<uint8_t>& bytes, std::vector<float>&) {
    return c.EncodePrepared(x, bytes);
  });
}

void BM_Rotate(benchmark::State& state) {
  const uint32_t d = static_cast<uint32_t>(state.range(0));
  const RowCodec c = RowCodec::Create(Format::kTurbo4, d, Side::kKey, 3).value();
  std::vector<float> x(kRows * d, 1.0f);
  for (auto _ : state) {
    benchmark::DoNotOptimize(c.RotateRows(x).ok());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kRows * d * 4));
  state.SetLabel(SimdTarget());
}

BENCHMARK(BM_Rotate)->Arg(64)->Arg(96)->Arg(128)->Arg(256);

const bool kRegistered = [] {
  for (Format f : kAllFormats) {
    const std::string name(FormatName(f));
    benchmark::RegisterBenchmark(("BM_Encode/" + name).c_str(), BM_Encode, f);
    benchmark::RegisterBenchmark(("BM_Decode/" + name).c_str(), BM_Decode, f);
  }
  for (Format f : {Format::kQ8_0, Format::kQ4_0, Format::kTurbo8, Format::kTurbo4,
                   Format::kTurbo3, Format::kTurbo2, Format::kTurbo4I}) {
    benchmark::RegisterBenchmark(("BM_EncodeBare/" + std::string(FormatName(f))).c_str(),
                                 BM_EncodeBare, f);
  }
  return true;
}();

}  // namespace
}  // namespace kvcache
