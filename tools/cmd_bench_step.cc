// `kvcache bench step`: one decode step of a real model over S sequences at
// once (Decoder::ForwardBatch with one new token each), per K/V format and
// stream count: what a serving engine's step costs, outside the HTTP server
// and the scheduler.
//
// Each sequence holds --context tokens, of which the first --shared are one
// prefill forked to every sequence (a shared system prompt: the forks share
// those blocks, as the prefix cache makes requests do) and the rest its own
// prefill. Token ids are drawn from a fixed seed. A timed step appends one
// token to every sequence; each sequence is then truncated back, so every
// step reads the same context. Reported per (format, streams): the median
// step's wall time over --steps steps, the tokens/s that gives (streams /
// step), and where the steps' time went (Decoder's PassProfile: weight
// products, attention, the rest), as shares of the summed step time.
//
// Prefill: the first sequence's own --context - --shared tokens are timed
// as they go in (the fill rate from the shared prefix to the context), and
// with --prefill N, N more tokens prefilled on top of the context in the
// engine's chunks, on a fork of it, three times (the median): what
// llama-bench's pp N at depth --context measures.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kvcache/cache.h"
#include "kvcache/pool.h"
#include "model/generate/generate.h"
#include "model/kv/hybrid_kv.h"
#include "kvcache/simd.h"
#include "model/decoder/decoder.h"
#include "model/decoder/loaded_model.h"
#include "model/kv/cache_kv.h"
#include "tools/bench_util.h"
#include "tools/command.h"
#include "tools/json_result.h"
#include "tools/kv_flags.h"

namespace kvcache::tools {
namespace {

struct BenchStepOptions {
  std::string model_path, tokenizer_path;
  std::string kv_formats = "bf16,turbo4";
  std::string streams = "1,8,32";
  uint32_t context = 338, shared = 304;
  uint32_t block_size = 16;
  std::string matmul = "bf16";
  uint32_t threads = 2;
  uint32_t steps = 8;
  uint32_t prefill = 0;
  bool json = false;
};

Result<std::vector<uint32_t>> ParseCounts(const std::string& text) {
  std::vector<uint32_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v <= 0 || v > 4096) {
      return Status::InvalidArgument("--streams: '" + item + "' is not a count in 1..4096");
    }
    out.push_back(static_cast<uint32_t>(v));
  }
  if (out.empty()) return Status::InvalidArgument("--streams: no counts");
  return out;
}

// Positions a sequence may reach: the context, then one decoded token or
// the --prefill tokens.
uint32_t Span(const BenchStepOptions& o) { return o.context + std::max<uint32_t>(o.prefill, 1); }

// Sequences beside the streams a pool must hold: the shared root, and the
// --prefill fork.
uint32_t Forks(const BenchStepOptions& o) { return o.prefill > 0 ? 2 : 1; }

// Wall seconds since t0.
double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Prefill chunks: the engine's default step budget.
constexpr uint32_t kPrefillChunk = 256;

// Prefills `tokens` into kv in chunks of kPrefillChunk.
Status Prefill(model::Decoder& decoder, model::KvBackend& kv, std::span<const int32_t> tokens) {
  return model::PrefillInChunks(decoder, kv, tokens, kPrefillChunk);
}

Result<nlohmann::json> RunOne(model::Decoder& decoder, const FormatPair& formats, const std::string& name,
                              uint32_t streams, const BenchStepOptions& o) {
  const model::ModelConfig& c = decoder.config();
  model::AttentionShape shape = decoder.attention_shape();
  shape.max_seq_len = std::min(shape.max_seq_len, Span(o));
  // The sequences' K/V: one pool per layer group (a sliding-window model's
  // window layers in their own, holding only their windows), sized for
  // every stream plus the shared root and the --prefill fork.
  std::unique_ptr<model::KvBackend> root;
  double kv_bytes_per_token = 0;
  if (shape.has_windows()) {
    model::HybridKvOptions h;
    h.formats = formats;
    h.layout = CacheLayout::kPaged;
    h.block_size = o.block_size;
    h.attention_pool = decoder.thread_pool();
    h.max_chunk_tokens = kPrefillChunk;
    KV_ASSIGN_OR_RETURN(auto hybrid, model::HybridKv::MakeModel(shape, h));
    uint32_t blocks[2] = {0, 0};
    for (int g = 0; g < 2; ++g) {
      if (hybrid->group_size(g) == 0) continue;
      const uint64_t per_seq = model::HybridKv::BlocksPerSequence(*hybrid, g, Span(o)) + 1;
      blocks[g] = static_cast<uint32_t>((streams + Forks(o)) * per_seq);
      const uint64_t held = model::HybridKv::BlocksPerSequence(*hybrid, g, o.context + 1);
      kv_bytes_per_token += static_cast<double>(held) * BlockPool::BlockBytes(hybrid->group_geometry(g), hybrid->group_formats(g)) / (o.context + 1);
    }
    KV_ASSIGN_OR_RETURN(h.pools, hybrid->CreatePools(blocks));
    KV_ASSIGN_OR_RETURN(root, model::HybridKv::Create(shape, h));
  } else {
    KV_ASSIGN_OR_RETURN(Geometry geometry,
                        Geometry::Create({shape.n_layers, shape.n_kv_heads, shape.head_dim, o.block_size}));
    const uint32_t per_seq = (Span(o) + o.block_size - 1) / o.block_size + 1;
    BlockPoolOptions p;
    p.num_blocks = (streams + Forks(o)) * per_seq;
    KV_ASSIGN_OR_RETURN(std::shared_ptr<BlockPool> pool, BlockPool::Create(geometry, formats, p));
    model::CacheKvOptions co;
    co.formats = formats;
    co.layout = CacheLayout::kPaged;
    co.block_size = o.block_size;
    co.pool = pool;
    co.attention_pool = decoder.thread_pool();
    KV_ASSIGN_OR_RETURN(root, model::CacheKv::Create(shape, co));
    kv_bytes_per_token = static_cast<double>(pool->block_bytes()) / o.block_size;
  }
  std::mt19937 rng(1);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(c.vocab_size) - 1);
  auto draw = [&](uint32_t n) {
    std::vector<int32_t> t(n);
    for (int32_t& v : t) v = token(rng);
    return t;
  };
  const std::vector<int32_t> prefix = draw(o.shared);
  KV_RETURN_IF_ERROR(Prefill(decoder, *root, prefix));
  std::vector<std::unique_ptr<model::KvBackend>> seqs;
  double fill_s = 0;
  for (uint32_t s = 0; s < streams; ++s) {
    KV_ASSIGN_OR_RETURN(std::unique_ptr<model::KvBackend> f, root->Fork());
    const std::vector<int32_t> own = draw(o.context - o.shared);
    const auto t0 = std::chrono::steady_clock::now();
    KV_RETURN_IF_ERROR(Prefill(decoder, *f, own));
    if (s == 0) fill_s = SecondsSince(t0);
    seqs.push_back(std::move(f));
  }
  std::vector<int32_t> next = draw(streams);
  std::vector<model::BatchItem> items(streams);
  for (uint32_t s = 0; s < streams; ++s) items[s] = {std::span<const int32_t>(&next[s], 1), seqs[s].get(), false};
  std::vector<float> logits(static_cast<size_t>(streams) * c.vocab_size);
  model::PassProfile profile;
  model::ForwardOptions fo;
  std::vector<double> times;
  for (uint32_t step = 0; step <= o.steps; ++step) {  // step 0 warms up, untimed
    model::PassProfile one;
    fo.profile = &one;
    const auto t0 = std::chrono::steady_clock::now();
    KV_RETURN_IF_ERROR(decoder.ForwardBatch(items, logits, fo));
    const double dt = SecondsSince(t0);
    for (auto& s : seqs) KV_RETURN_IF_ERROR(s->Truncate(o.context));
    if (step == 0) continue;
    times.push_back(dt);
    profile.products_s += one.products_s;
    profile.attention_s += one.attention_s;
    profile.total_s += one.total_s;
  }
  const double step_s = Median(times);
  // N tokens prefilled at depth --context on a fork of the first
  // sequence; the median of three.
  std::vector<double> prefill_times;
  if (o.prefill > 0) {
    const std::vector<int32_t> more = draw(o.prefill);
    for (int rep = 0; rep < 3; ++rep) {
      // On a fork, dropped after: a window layer gives its old positions
      // back as the prefill moves its window, so the sequence itself could
      // not be truncated back to the context.
      KV_ASSIGN_OR_RETURN(std::unique_ptr<model::KvBackend> f, seqs[0]->Fork());
      const auto t0 = std::chrono::steady_clock::now();
      KV_RETURN_IF_ERROR(Prefill(decoder, *f, more));
      prefill_times.push_back(SecondsSince(t0));
    }
  }
  nlohmann::json r;
  r["kv_format"] = name;
  r["streams"] = streams;
  r["step_ms"] = step_s * 1e3;
  r["tokens_per_s"] = streams / step_s;
  r["ms_per_token"] = step_s * 1e3 / streams;
  r["products_share"] = profile.products_s / profile.total_s;
  r["attention_share"] = profile.attention_s / profile.total_s;
  r["other_share"] = 1.0 - (profile.products_s + profile.attention_s) / profile.total_s;
  r["kv_bytes_per_token"] = kv_bytes_per_token;
  r["fill_tokens"] = o.context - o.shared;
  r["fill_tokens_per_s"] = fill_s > 0 ? (o.context - o.shared) / fill_s : 0.0;
  if (o.prefill > 0) {
    const double p = Median(prefill_times);
    r["prefill_tokens"] = o.prefill;
    r["prefill_ms"] = p * 1e3;
    r["prefill_tokens_per_s"] = o.prefill / p;
  }
  return r;
}

Result<nlohmann::json> RunBench(const BenchStepOptions& o) {
  if (o.context == 0 || o.shared >= o.context) {
    return Status::InvalidArgument("bench step: want 0 <= --shared < --context");
  }
  if (o.threads == 0 || o.steps == 0) return Status::InvalidArgument("bench step: --threads and --steps must be > 0");
  if (o.prefill > 65536) return Status::InvalidArgument("bench step: --prefill must be <= 65536");
  KV_ASSIGN_OR_RETURN(std::vector<uint32_t> counts, ParseCounts(o.streams));
  model::GgufLoadOptions load;
  KV_ASSIGN_OR_RETURN(load.matmul_inputs, model::ParseMatMulInputs(o.matmul));
  load.max_seq_len = Span(o);
  KV_ASSIGN_OR_RETURN(std::unique_ptr<model::LoadedModel> lm, model::LoadedModel::Load(o.model_path, o.tokenizer_path, load));
  if (lm->model().config().max_seq_len < Span(o)) {
    return Status::InvalidArgument("bench step: --context " + std::to_string(o.context) + " plus --prefill " +
                                   std::to_string(o.prefill) + " does not fit the model's context");
  }
  model::Decoder decoder(lm->model(), o.threads);
  nlohmann::json out;
  out["model"] = o.model_path;
  out["matmul"] = o.matmul;
  out["threads"] = o.threads;
  out["context"] = o.context;
  out["shared"] = o.shared;
  out["steps"] = o.steps;
  out["prefill"] = o.prefill;
  out["simd_target"] = SimdTarget();
  out["results"] = nlohmann::json::array();
  const std::vector<std::string> names = Split(o.kv_formats, ',');
  if (names.empty()) return Status::InvalidArgument("bench step: --kv-formats names no format");
  for (const std::string& name : names) {
    KV_ASSIGN_OR_RETURN(FormatPair formats, ParseFormatPair(name));
    for (uint32_t s : counts) {
      KV_ASSIGN_OR_RETURN(nlohmann::json r, RunOne(decoder, formats, name, s, o));
      out["results"].push_back(std::move(r));
    }
  }
  return out;
}

// The text of a result: one row per (format, stream count).
void PrintText(const BenchStepOptions& o, const nlohmann::json& j) {
  fmt::print("matmul {}  threads {}  context {} ({} shared)  simd {}\n", o.matmul, o.threads, o.context,
             o.shared, j["simd_target"].get<std::string>());
  fmt::print("{:<10} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7}\n", "kv", "streams", "step ms", "ms/token",
             "tokens/s", "products", "attention", "other");
  for (const auto& r : j["results"]) {
    fmt::print("{:<10} {:>7} {:>9.2f} {:>9.3f} {:>9.1f} {:>8.0f}% {:>8.0f}% {:>6.0f}%\n",
               r["kv_format"].get<std::string>(), r["streams"].get<uint32_t>(), r["step_ms"].get<double>(),
               r["ms_per_token"].get<double>(), r["tokens_per_s"].get<double>(),
               100 * r["products_share"].get<double>(), 100 * r["attention_share"].get<double>(),
               100 * r["other_share"].get<double>());
  }
  for (const auto& r : j["results"]) {
    fmt::print("{:<10} {:>7}  fill {} tokens: {:.1f} tokens/s", r["kv_format"].get<std::string>(),
               r["streams"].get<uint32_t>(), r["fill_tokens"].get<uint32_t>(), r["fill_tokens_per_s"].get<double>());
    if (r.contains("prefill_tokens")) {
      fmt::print("; prefill {} at depth {}: {:.1f} ms, {:.1f} tokens/s", r["prefill_tokens"].get<uint32_t>(),
                 o.context, r["prefill_ms"].get<double>(), r["prefill_tokens_per_s"].get<double>());
    }
    fmt::print("\n");
  }
}

const bool kRegistered = RegisterOptionsCommand<BenchStepOptions>(
    "bench step", "One batched decode step of a model over many sequences, per K/V format and stream count",
    [](CLI::App* app, BenchStepOptions& o) {
      app->add_option("--model", o.model_path, "GGUF file, or llama2.c v1 checkpoint")->required();
      app->add_option("--tokenizer", o.tokenizer_path, "llama2.c tokenizer.bin (not for GGUF)");
      app->add_option("--kv-formats", o.kv_formats, "K:V formats, comma-separated")->capture_default_str();
      app->add_option("--streams", o.streams, "Sequences per step, comma-separated")->capture_default_str();
      app->add_option("--context", o.context, "Tokens each sequence holds")->capture_default_str();
      app->add_option("--shared", o.shared, "Of those, the prefix all sequences share")->capture_default_str();
      app->add_option("--block-size", o.block_size, "Paged block size in tokens")->capture_default_str();
      app->add_option("--matmul", o.matmul, kMatMulHelp)->capture_default_str();
      app->add_option("--threads", o.threads, "Decoder threads")->capture_default_str();
      app->add_option("--steps", o.steps, "Timed steps per measurement (median)")->capture_default_str();
      app->add_option("--prefill", o.prefill,
                      "Also time N tokens prefilled at depth --context on one sequence (median of 3; 0: off)")
          ->capture_default_str();
      app->add_flag("--json", o.json, "Print JSON");
    },
    JsonResultRunner<BenchStepOptions>("bench step", RunBench, PrintText));

}  // namespace
}  // namespace kvcache::tools
