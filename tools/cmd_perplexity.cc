// `kvcache perplexity`: teacher-forced mean NLL of a text under the reference
// decoder with its K/V cache in a given format, plus the KL divergence and
// top-1 agreement of its next-token distributions against the f32 cache.
// A format the model's head_dim cannot take (or one not built yet) is
// reported as such: the JSON says "supported": false with the reason, and the
// exit code is 3. --model takes a GGUF file (tokenizer from its metadata) or
// a llama2.c checkpoint with --tokenizer; --formats K:V,K:V evaluates several
// pairs against one f32 run (--json: an array, one object per pair);
// --logprobs-out writes each scored token's log-probability as .npy;
// progress goes to stderr.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kvcache/npy.h"
#include "model/decoder/decoder.h"
#include "model/decoder/loaded_model.h"
#include "model/generate/perplexity.h"
#include "tools/command.h"
#include "tools/kv_flags.h"

namespace kvcache::tools {
namespace {

struct PerplexityCliOptions {
  std::string model_path, tokenizer_path, prompt, text_file;
  std::string kv_format = "f32";
  std::string formats;  // K:V,K:V,... (overrides --kv-format)
  std::string layout = "contiguous";
  std::string backend = "cache";
  uint32_t block_size = 16;
  uint32_t chunk = 1;
  uint32_t prefill = 0;
  uint32_t max_tokens = 0;
  uint32_t score_from = 0;
  uint32_t threads = 2;
  std::string matmul = "f32";
  std::string logprobs_out;
  std::string eviction;
  bool json = false;
};

int Fail(const Status& s) {
  fmt::print(stderr, "kvcache perplexity: {}\n", s.ToString());
  return 2;
}

// "q8_0:q8_0,bf16:turbo3" -> pairs.
Result<std::vector<FormatPair>> ParsePairs(const std::string& list) {
  std::vector<FormatPair> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    KV_ASSIGN_OR_RETURN(FormatPair p, ParseFormatPair(item));
    out.push_back(p);
  }
  if (out.empty()) return Status::InvalidArgument("--formats: no K:V pair given");
  return out;
}

// FILE.npy for one pair; FILE.<k>_<v>.npy for each of several.
std::string LogprobsPath(const std::string& base, FormatPair pair, bool several) {
  if (!several) return base;
  std::string stem = base, ext;
  if (stem.size() > 4 && stem.compare(stem.size() - 4, 4, ".npy") == 0) {
    stem.resize(stem.size() - 4);
    ext = ".npy";
  }
  return stem + "." + std::string(FormatName(pair.k)) + "_" + std::string(FormatName(pair.v)) + ext;
}

void PutStats(const model::ScoreStats& r, nlohmann::json& j) {
  j["num_predictions"] = r.num_predictions;
  j["mean_nll"] = r.mean_nll;
  j["perplexity"] = r.perplexity;
  j["f32_mean_nll"] = r.ref_mean_nll;
  j["f32_perplexity"] = std::exp(r.ref_mean_nll);
  j["kl_vs_f32"] = r.kl_vs_ref;
  j["top1_agree_vs_f32"] = r.top1_agree_vs_ref;
}

// The scores of one evaluation, in the JSON every format prints: over the
// scored positions (>= scored_from), and over all of them.
void PutResult(const model::PerplexityResult& r, nlohmann::json& j) {
  PutStats(r, j);
  j["scored_from"] = r.scored_from;
  nlohmann::json all;
  PutStats(r.all_positions, all);
  j["all_positions"] = std::move(all);
}

nlohmann::json EvaluationJson(const PerplexityCliOptions& o, const model::FormatEvaluation& e,
                              const std::string& name, const model::AttentionShape& shape,
                              const model::KvBackendOptions& backend, size_t num_tokens, size_t encoded) {
  const uint32_t head_dim = shape.head_dim;
  const bool ok = e.state == model::FormatEvaluation::State::kOk;
  const model::PerplexityResult& r = e.result;
  nlohmann::json j;
  j["model"] = o.model_path;
  j["kv_format"] = name;
  j["layout"] = o.layout;
  j["backend"] = o.backend;
  j["eviction"] = o.eviction.empty() ? "none" : o.eviction;
  j["chunk_tokens"] = o.chunk;
  j["prefill_tokens"] = o.prefill;
  j["num_tokens"] = num_tokens;
  if (encoded > num_tokens) j["truncated_from_tokens"] = encoded;
  j["supported"] = ok;
  j["status"] = model::FormatEvaluationStateName(e.state);
  if (!ok) {
    j["error"] = e.message;
  } else {
    PutResult(r, j);
    j["k_bits_per_value"] = BitsPerValue(e.formats.k, head_dim);
    j["v_bits_per_value"] = BitsPerValue(e.formats.v, head_dim);
    // Over the whole cache at the scored length: every layer's rows at its
    // group's format, the precision window's bf16 rows included.
    const model::VariantBits bits = model::CacheBits(shape, backend, static_cast<uint32_t>(num_tokens));
    j["cache_bits_per_value"] = bits.mean();
    j["cache_k_bits_per_value"] = bits.k;
    j["cache_v_bits_per_value"] = bits.v;
    if (!o.eviction.empty() && o.eviction != "none") {
      // What a budget keeps per position of the text: the format's bits x kept / scored.
      auto spec = model::ParseEvictionSpec(o.eviction);
      if (spec.ok() && spec->enabled()) {
        const size_t kept = std::min<size_t>(num_tokens, spec->kept());
        j["kept_positions"] = kept;
        j["effective_bits_per_value"] =
            (BitsPerValue(e.formats.k, head_dim) + BitsPerValue(e.formats.v, head_dim)) / 2 *
            static_cast<double>(kept) / static_cast<double>(num_tokens);
      }
    }
  }
  return j;
}

// Progress on stderr, at most every 2 s, per pass over the text (each
// format's, and the f32 reference's).
std::function<void(size_t, size_t)> ProgressPrinter() {
  struct State {
    std::chrono::steady_clock::time_point pass_start, last;
    size_t pass = 0, prev_done = 0, first_done = 0;
  };
  return [st = std::make_shared<State>()](size_t done, size_t total) {
    const auto now = std::chrono::steady_clock::now();
    if (done <= st->prev_done || st->pass == 0) {  // a new pass began
      ++st->pass;
      st->pass_start = st->last = now;
      st->first_done = done;
    }
    st->prev_done = done;
    if (done < total && now - st->last < std::chrono::seconds(2)) return;
    st->last = now;
    const double secs = std::chrono::duration<double>(now - st->pass_start).count();
    const double tps = secs > 0 ? (done - st->first_done) / secs : 0;
    const double eta = tps > 0 ? (total - done) / tps : 0;
    fmt::print(stderr, "\rperplexity: pass {}: {}/{} tokens, {:.1f} tok/s, ETA {:.0f} s   {}", st->pass, done,
               total, tps, eta, done == total ? "\n" : "");
  };
}

// --prompt, or the contents of --text-file.
Result<std::string> ReadText(const PerplexityCliOptions& o) {
  if (o.text_file.empty()) return o.prompt;
  std::ifstream in(o.text_file, std::ios::binary);
  if (!in) return Status::IoError("cannot open " + o.text_file);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// True when a spec uses KvVariant syntax (options or kc keys): the naive
// backend models every variant, the cache builds sinks and recent windows.
bool IsVariantSpec(const std::string& list) {
  return list.find('+') != std::string::npos || list.find("kc") != std::string::npos;
}

Result<std::vector<model::KvVariant>> ParseVariants(const std::string& list) {
  std::vector<model::KvVariant> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    KV_ASSIGN_OR_RETURN(model::KvVariant v, model::ParseKvVariant(item));
    out.push_back(v);
  }
  if (out.empty()) return Status::InvalidArgument("--formats: no variant given");
  return out;
}

// Bits are counted at this many positions (the model's context).
constexpr uint32_t kBitsAtPositions = 8192;

nlohmann::json VariantJson(const PerplexityCliOptions& o, const model::VariantEvaluation& e,
                           uint32_t head_dim, size_t num_tokens) {
  const bool cache = o.backend == "cache";
  const model::VariantBits bits =
      cache ? model::CacheWindowBits(e.variant, head_dim, kBitsAtPositions)
            : model::KvVariantBits(e.variant, head_dim, kBitsAtPositions);
  nlohmann::json j;
  j["model"] = o.model_path;
  j["kv_format"] = model::KvVariantName(e.variant);
  j["backend"] = o.backend;
  if (cache) j["layout"] = o.layout;
  j["chunk_tokens"] = o.chunk;
  j["prefill_tokens"] = o.prefill;
  j["num_tokens"] = num_tokens;
  j["supported"] = true;
  j["status"] = "ok";
  PutResult(e.result, j);
  j["bits_at_positions"] = kBitsAtPositions;
  j["k_bits_per_value"] = bits.k;
  j["v_bits_per_value"] = bits.v;
  j["bits_per_value"] = bits.mean();
  return j;
}

int RunVariants(const PerplexityCliOptions& o, model::Decoder& decoder, std::span<const int32_t> tokens,
                const model::PerplexityOptions& p, const model::KvBackendOptions& backend) {
  auto variants = ParseVariants(o.formats.empty() ? o.kv_format : o.formats);
  if (!variants.ok()) return Fail(variants.status());
  if (!o.eviction.empty()) return Fail(Status::InvalidArgument("--eviction does not combine with kv variants"));
  const bool cache = backend.kind == model::BackendKind::kCache;
  auto evals = model::EvaluateVariants(decoder, tokens, *variants, p, cache ? &backend : nullptr);
  if (!evals.ok()) return Fail(evals.status());
  const uint32_t hd = decoder.config().head_dim();
  nlohmann::json list = nlohmann::json::array();
  for (const model::VariantEvaluation& e : *evals) {
    if (!o.logprobs_out.empty()) {
      const uint64_t shape[1] = {e.result.logprobs.size()};
      std::string path = o.logprobs_out;
      if (evals->size() > 1) path += "." + model::KvVariantName(e.variant) + ".npy";
      if (Status s = WriteNpy(path, shape, e.result.logprobs); !s.ok()) return Fail(s);
    }
    nlohmann::json j = VariantJson(o, e, hd, tokens.size());
    if (o.json) {
      list.push_back(std::move(j));
      continue;
    }
    fmt::print("kv {} ({}): {} predictions, perplexity {:.4f} (f32 {:.4f}), KL vs f32 {:.3e}, "
               "top-1 agreement {:.2f}%, bits/value at {} positions K {:.3f} V {:.3f}\n",
               model::KvVariantName(e.variant), cache ? o.layout : o.backend, e.result.num_predictions, e.result.perplexity,
               std::exp(e.result.ref_mean_nll), e.result.kl_vs_ref, 100.0 * e.result.top1_agree_vs_ref,
               kBitsAtPositions, j["k_bits_per_value"].get<double>(), j["v_bits_per_value"].get<double>());
  }
  if (o.json) fmt::print("{}\n", list.dump(2));
  return 0;
}

// With --matmul int8 or bf16, the model the formats are scored on (the reference
// always runs the exact products); null for the exact products.
Result<std::unique_ptr<model::LoadedModel>> LoadScoredModel(const PerplexityCliOptions& o) {
  KV_ASSIGN_OR_RETURN(model::MatMulInputs inputs, model::ParseMatMulInputs(o.matmul));
  if (inputs == model::MatMulInputs::kF32) return std::unique_ptr<model::LoadedModel>();
  model::GgufLoadOptions load;
  load.matmul_inputs = inputs;
  return model::LoadedModel::Load(o.model_path, o.tokenizer_path, load);
}

int RunPerplexity(const PerplexityCliOptions& o) {
  auto read = ReadText(o);
  if (!read.ok()) return Fail(read.status());
  const std::string text = std::move(read).value();
  auto files = model::LoadedModel::Load(o.model_path, o.tokenizer_path);
  if (!files.ok()) return Fail(files.status());
  const model::LoadedModel& lm = **files;
  const std::string spec = o.formats.empty() ? o.kv_format : o.formats;
  // "global=F,local=G" entries (several separated by ';') are full backend
  // specs: per-group formats, each group's own window.
  const bool specs = spec.find('=') != std::string::npos || spec.find(';') != std::string::npos;
  const bool variant = !specs && IsVariantSpec(spec);
  auto parsed = model::ParseKvBackendOptions(variant || specs ? "f32" : o.kv_format, o.layout, o.backend,
                                             o.block_size);
  if (!parsed.ok()) return Fail(parsed.status());
  model::KvBackendOptions kv_options = *parsed;
  auto eviction = model::ParseEvictionSpec(o.eviction);
  if (!eviction.ok()) return Fail(eviction.status());
  kv_options.eviction = *eviction;
  kv_options.max_chunk_tokens = std::max(o.chunk, o.prefill);
  std::vector<FormatPair> pairs = {kv_options.formats};
  std::vector<std::string> names;
  std::vector<model::KvBackendOptions> backends;
  if (specs) {
    std::stringstream ss(spec);
    std::string item;
    while (std::getline(ss, item, ';')) {
      auto b = model::ParseKvBackendOptions(item, o.layout, o.backend, o.block_size);
      if (!b.ok()) return Fail(b.status());
      b->eviction = kv_options.eviction;
      b->max_chunk_tokens = kv_options.max_chunk_tokens;
      names.push_back(item);
      backends.push_back(*b);
    }
    if (backends.empty()) return Fail(Status::InvalidArgument("--formats: no entry given"));
  } else if (!o.formats.empty() && !variant) {
    auto p = ParsePairs(o.formats);
    if (!p.ok()) return Fail(p.status());
    pairs = *p;
  }

  auto scored = LoadScoredModel(o);
  if (!scored.ok()) return Fail(scored.status());
  std::optional<model::Decoder> exact;  // the reference's, when the scored products differ
  if (*scored) exact.emplace(lm.model(), std::max(1u, o.threads));
  model::Decoder decoder((*scored ? **scored : lm).model(), std::max(1u, o.threads));
  auto encoded_ids = lm.Encode(text);
  if (!encoded_ids.ok()) return Fail(encoded_ids.status());
  std::vector<int32_t> tokens = std::move(encoded_ids).value();
  const size_t encoded = tokens.size();
  uint32_t max_len = decoder.config().max_seq_len;
  if (o.max_tokens != 0) max_len = std::min(max_len, o.max_tokens);
  if (tokens.size() > max_len) tokens.resize(max_len);
  if (tokens.size() < 2) return Fail(Status::InvalidArgument("the text encodes to fewer than 2 tokens"));

  model::PerplexityOptions p;
  p.chunk_tokens = o.chunk;
  p.prefill_tokens = o.prefill;
  p.max_seq_len = static_cast<uint32_t>(tokens.size());
  p.score_from = o.score_from;
  if (o.score_from + 1 >= tokens.size()) {
    return Fail(Status::InvalidArgument(fmt::format("--score-from {} leaves no prediction in {} tokens", o.score_from,
                                                    tokens.size())));
  }
  p.on_progress = ProgressPrinter();
  if (exact) p.reference_decoder = &*exact;
  if (variant) return RunVariants(o, decoder, tokens, p, kv_options);
  if (!specs) {
    for (FormatPair pair : pairs) {
      backends.push_back(kv_options);
      backends.back().formats = pair;
      names.push_back(FormatPairName(pair));
    }
  }
  auto evals = model::EvaluateBackends(decoder, tokens, backends, p);
  if (!evals.ok()) return Fail(evals.status());
  model::AttentionShape shape = decoder.attention_shape();
  bool all_ok = true;
  nlohmann::json list = nlohmann::json::array();
  for (size_t i = 0; i < evals->size(); ++i) {
    const model::FormatEvaluation& e = (*evals)[i];
    const bool ok = e.state == model::FormatEvaluation::State::kOk;
    all_ok = all_ok && ok;
    if (ok && !o.logprobs_out.empty()) {
      const uint64_t shape[1] = {e.result.logprobs.size()};
      const std::string path = LogprobsPath(o.logprobs_out, e.formats, backends.size() > 1);
      if (Status s = WriteNpy(path, shape, e.result.logprobs); !s.ok()) return Fail(s);
    }
    nlohmann::json j = EvaluationJson(o, e, names[i], shape, backends[i], tokens.size(), encoded);
    if (o.json) {
      list.push_back(std::move(j));
    } else if (ok) {
      const model::PerplexityResult& r = e.result;
      fmt::print("kv {} ({}): {} predictions{}, mean NLL {:.6f}, perplexity {:.4f} "
                 "(f32 {:.4f}), KL vs f32 {:.3e}, top-1 agreement {:.2f}%, {:.3f} bits/value over the cache\n",
                 names[i], o.layout, r.num_predictions,
                 r.scored_from ? fmt::format(" from position {}", r.scored_from) : std::string(), r.mean_nll,
                 r.perplexity, std::exp(r.ref_mean_nll), r.kl_vs_ref, 100.0 * r.top1_agree_vs_ref,
                 j["cache_bits_per_value"].get<double>());
    } else {
      fmt::print(stderr, "kvcache perplexity: {} is {} for this model: {}\n", names[i],
                 model::FormatEvaluationStateName(e.state), e.message);
    }
  }
  if (o.json) {
    // One object for one format (the shape it always had), else an array of them.
    fmt::print("{}\n", (backends.size() == 1 && o.formats.empty() ? list[0] : list).dump(2));
  }
  return all_ok ? 0 : 3;
}

const bool kRegistered = RegisterOptionsCommand<PerplexityCliOptions>(
    "perplexity", "Teacher-forced perplexity, KL vs the f32 cache and top-1 agreement per KV format (or eviction budget) on a text",
    [](CLI::App* app, PerplexityCliOptions& o) {
      app->add_option("--model", o.model_path, "GGUF file, or llama2.c v1 checkpoint")->required();
      app->add_option("--tokenizer", o.tokenizer_path, "llama2.c tokenizer.bin (not for GGUF)");
      app->add_option("--formats", o.formats,
                      "K:V,K:V,... evaluated in one process against one f32 run (overrides --kv-format); "
                      "per layer group: global=SPEC,local=SPEC entries separated by ';'; "
                      "also kv variants: KSPEC[:VSPEC][+OPT]... (model/kv/kv_variant.h), e.g. turbo4+s4+r128 "
                      "(the cache's precision window; --backend naive models it and kc4:turbo4+s4+ob, "
                      "q4_0+rot, ...)");
      app->add_option("--max-tokens", o.max_tokens, "Score at most the first N tokens (0 = all that fit)")
          ->capture_default_str();
      app->add_option("--score-from", o.score_from,
                      "Score only the predictions at positions >= N (the earlier ones are context, as "
                      "llama-perplexity scores each chunk's second half); the JSON keeps all_positions too")
          ->capture_default_str();
      app->add_option("--threads", o.threads, "Threads for the weight products")->capture_default_str();
      app->add_option("--matmul", o.matmul,
                      "f32 | int8 | bf16: the products the formats are scored with (the f32 reference stays exact)")
          ->capture_default_str();
      app->add_option("--eviction", o.eviction,
                      "streaming:SINKS,WINDOW | h2o:BUDGET,RECENT (bounded cache; KL still vs the full f32 cache)");
      app->add_option("--logprobs-out", o.logprobs_out,
                      "Write log p(next token) per prediction, f32 [num_predictions] .npy "
                      "(several formats: FILE.<k>_<v>.npy)");
      auto* file = app->add_option("--text-file", o.text_file, "Text to score");
      auto* prompt = app->add_option("--prompt", o.prompt, "Text to score");
      file->excludes(prompt);
      prompt->excludes(file);
      AddKvBackendFlags(app, o.kv_format, o.layout, o.block_size, o.backend);
      app->add_option("--chunk", o.chunk, "Tokens per forward pass (1 = decode steps)")
          ->capture_default_str();
      app->add_option("--prefill", o.prefill,
                      "Tokens of a first prompt pass before the chunks (0 = none)")
          ->capture_default_str();
      app->add_flag("--json", o.json, "Print JSON");
      app->callback([app] {
        if (app->count("--text-file") + app->count("--prompt") != 1) {
          throw CLI::ValidationError("one of --text-file or --prompt is required");
        }
      });
    },
    RunPerplexity);

}  // namespace
}  // namespace kvcache::tools
