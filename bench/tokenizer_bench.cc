// Byte-level BPE encode/decode speed on SmolLM2's tokenizer (read from the
// GGUF that scripts/fetch_model.sh fetches) over the whole GPL-3 text
// (/usr/share/common-licenses/GPL-3, ~35 KB, ~7.6k tokens). Reports tokens
// per second and input bytes per second; fails with a message when the model
// or the text is absent.
#include <benchmark/benchmark.h>

#include <fstream>
#include <memory>
#include <string>

#include "model/io/gguf.h"
#include "model/io/model_store.h"
#include "model/tokenizer/bpe_tokenizer.h"

namespace kvcache::model {
namespace {

struct Setup {
  std::unique_ptr<BpeTokenizer> tok;
  std::string text;
  std::string error;
};

const Setup& Load() {
  static const Setup s = [] {
    Setup r;
    auto file = GgufFile::Open(SmolLm2Path());
    if (!file.ok()) {
      r.error = file.status().ToString() + " (fetch it with scripts/fetch_model.sh)";
      return r;
    }
    auto tok = BpeTokenizer::FromGguf(**file);
    if (!tok.ok()) {
      r.error = tok.status().ToString();
      return r;
    }
    r.tok = std::make_unique<BpeTokenizer>(std::move(tok).value());
    std::ifstream f("/usr/share/common-licenses/GPL-3", std::ios::binary);
    r.text.assign(std::istreambuf_iterator<char>(f), {});
    if (r.text.empty()) r.error = "cannot read /usr/share/common-licenses/GPL-3";
    return r;
  }();
  return s;
}

void BM_BpeEncodeGpl3(benchmark::State& state) {
  const Setup& s = Load();
  if (!s.error.empty()) {
    state.SkipWithError(s.error.c_str());
    return;
  }
  size_t tokens = 0;
  for (auto _ : state) {
    auto ids = s.tok->Encode(s.text);
    tokens += ids->size();
    benchmark::DoNotOptimize(ids);
  }
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * s.text.size()));
}
BENCHMARK(BM_BpeEncodeGpl3)->Unit(benchmark::kMillisecond);

void BM_BpeDecodeGpl3(benchmark::State& state) {
  const Setup& s = Load();
  if (!s.error.empty()) {
    state.SkipWithError(s.error.c_str());
    return;
  }
  const std::vector<int32_t> ids = *s.tok->Encode(s.text);
  for (auto _ : state) benchmark::DoNotOptimize(s.tok->Decode(ids));
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations() * ids.size()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_BpeDecodeGpl3)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvcache::model
