// `kvcache generate`: stream a story from the reference decoder (model/)
// with its K/V in a kvcache cache of the chosen format and layout, optionally
// with speculative decoding (--draft N: N drafted tokens -- by n-gram lookup
// in the context, or by the model's first --draft-layers layers with
// --draft-kind layers -- verified in one multi-token pass). --json prints one JSON object instead of streaming.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>

#include "model/decoder.h"
#include "model/generate.h"
#include "model/kv_factory.h"
#include "model/loaded_model.h"
#include "model/unicode_classes.h"
#include "tools/command.h"
#include "tools/kv_flags.h"

namespace kvcache::tools {
namespace {

struct GenerateCliOptions {
  std::string model_path, tokenizer_path, prompt, prompt_file, prompt_ids;
  bool chat = false;
  uint32_t threads = 2;
  std::string weights = "quantized";
  uint32_t steps = 256;
  double temperature = 0.0;
  uint64_t seed = 42;
  std::string kv_format = "f32";
  std::string layout = "contiguous";
  std::string backend = "cache";
  uint32_t block_size = 16;
  uint32_t draft = 0;
  std::string draft_kind = "ngram";
  uint32_t draft_layers = 2;
  bool json = false;
};

uint32_t decoder_threads(const GenerateCliOptions& o) { return std::max(1u, o.threads); }

int Fail(const Status& s) {
  fmt::print(stderr, "kvcache generate: {}\n", s.ToString());
  return 2;
}

// The prompt's ids from whichever of --prompt / --prompt-file / --prompt-ids was given.
Result<std::vector<int32_t>> PromptIds(const GenerateCliOptions& o, const model::LoadedModel& m) {
  if (!o.prompt_ids.empty()) {
    std::vector<int32_t> ids;
    std::stringstream ss(o.prompt_ids);
    std::string item;
    while (std::getline(ss, item, ',')) {
      char* end = nullptr;
      const long v = std::strtol(item.c_str(), &end, 10);
      if (item.empty() || *end != '\0') {
        return Status::InvalidArgument("--prompt-ids: '" + item + "' is not a token id");
      }
      ids.push_back(static_cast<int32_t>(v));
    }
    return ids;
  }
  std::string text = o.prompt;
  if (!o.prompt_file.empty()) {
    std::ifstream in(o.prompt_file, std::ios::binary);
    if (!in) return Status::IoError("cannot open " + o.prompt_file);
    std::ostringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  return o.chat ? m.EncodeChat(text) : m.Encode(text);
}

int RunGenerate(const GenerateCliOptions& o) {
  if (o.weights != "quantized" && o.weights != "f32") {
    return Fail(Status::InvalidArgument("unknown --weights '" + o.weights + "' (want quantized or f32)"));
  }
  model::GgufLoadOptions load;
  load.dequantize_at_load = o.weights == "f32";
  auto files = model::LoadedModel::Load(o.model_path, o.tokenizer_path, load);
  if (!files.ok()) return Fail(files.status());
  const model::LoadedModel& lm = **files;
  auto parsed = model::ParseKvBackendOptions(o.kv_format, o.layout, o.backend, o.block_size);
  if (!parsed.ok()) return Fail(parsed.status());
  const model::KvBackendOptions& kv_options = *parsed;
  auto prompt_ids = PromptIds(o, lm);
  if (!prompt_ids.ok()) return Fail(prompt_ids.status());
  const std::vector<int32_t>& prompt = *prompt_ids;
  if (prompt.empty()) return Fail(Status::InvalidArgument("the prompt encodes to no tokens"));

  model::Decoder decoder(lm.model(), std::max(1u, o.threads));
  // The cache holds what this run needs (prompt + steps), not the model's
  // whole context.
  model::AttentionShape shape = decoder.attention_shape();
  shape.max_seq_len = static_cast<uint32_t>(
      std::min<uint64_t>(shape.max_seq_len, prompt.size() + uint64_t{o.steps} + o.draft + 1));
  auto kv = model::CreateKvBackend(shape, kv_options);
  if (!kv.ok()) return Fail(kv.status());

  model::GenerateOptions g;
  g.max_new_tokens = o.steps;
  g.sampling.temperature = static_cast<float>(o.temperature);
  g.sampling.seed = o.seed;
  g.draft_tokens = o.draft;
  g.draft_layers = o.draft_layers;
  g.stop_tokens = lm.stop_tokens();
  if (o.draft_kind == "layers") {
    g.draft_kind = model::DraftKind::kEarlyExit;
  } else if (o.draft_kind != "ngram") {
    return Fail(Status::InvalidArgument("unknown --draft-kind '" + o.draft_kind +
                                        "' (want ngram or layers)"));
  }
  // CPU time of the decode passes (from the first generated token, which
  // the prefill's logits give, to the end): the process's, and the calling
  // thread's. On a shared machine these say more than wall time.
  double cpu0 = -1, thread_cpu0 = -1;
  size_t tokens_at_cpu0 = 0;
  auto cpu_now = [](clockid_t id) {
    timespec ts;
    clock_gettime(id, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
  };
  size_t emitted = 0;
  auto mark = [&] {
    if (++emitted == 1) {
      cpu0 = cpu_now(CLOCK_PROCESS_CPUTIME_ID);
      thread_cpu0 = cpu_now(CLOCK_THREAD_CPUTIME_ID);
      tokens_at_cpu0 = 1;
    }
  };
  g.on_token = [&](int32_t) { mark(); };
  int32_t prev = prompt.back();
  if (!o.json) {
    auto text = lm.Decode(prompt);
    if (!text.ok()) return Fail(text.status());
    fmt::print("{}", *text);
    std::fflush(stdout);
    g.on_token = [&](int32_t t) {
      mark();
      auto piece = lm.DecodePiece(prev, t);
      prev = t;
      if (piece.ok()) {
        fmt::print("{}", *piece);
        std::fflush(stdout);
      }
    };
  }
  auto r = model::Generate(decoder, **kv, prompt, g);
  if (!r.ok()) {
    if (!o.json) fmt::print("\n");
    return Fail(r.status());
  }
  const double tps = r->decode_seconds > 0 ? r->tokens.size() / r->decode_seconds : 0.0;
  const size_t cpu_tokens = r->tokens.size() > tokens_at_cpu0 ? r->tokens.size() - tokens_at_cpu0 : 0;
  const double cpu_ms = cpu_tokens ? 1000 * (cpu_now(CLOCK_PROCESS_CPUTIME_ID) - cpu0) / cpu_tokens : 0;
  const double thread_cpu_ms =
      cpu_tokens ? 1000 * (cpu_now(CLOCK_THREAD_CPUTIME_ID) - thread_cpu0) / cpu_tokens : 0;
  if (!o.json) {
    fmt::print("\n");
    fmt::print(stderr, "[{} prompt tokens in {:.2f} s, {} tokens, {:.1f} tok/s ({:.1f} ms/token), kv {} {}, {} threads",
               prompt.size(), r->prefill_seconds, r->tokens.size(), tps, tps > 0 ? 1000.0 / tps : 0.0,
               FormatPairName(kv_options.formats), o.layout, decoder_threads(o));
    if (o.draft > 0) {
      fmt::print(stderr, ", {} draft of {}: {}/{} accepted ({:.1f}%), {} verify passes",
                 o.draft_kind, o.draft,
                 r->accepted_tokens, r->drafted_tokens, 100.0 * r->acceptance_rate(),
                 r->forward_passes);
    }
    fmt::print(stderr, ", decode CPU {:.1f} ms/token (calling thread {:.1f})]\n", cpu_ms, thread_cpu_ms);
    return 0;
  }
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), r->tokens.begin(), r->tokens.end());
  auto generated_text = lm.Decode(all);
  if (!generated_text.ok()) return Fail(generated_text.status());
  nlohmann::json j;
  j["model"] = o.model_path;
  // JSON strings must be UTF-8: decoded text may end inside a character.
  j["prompt"] = model::SanitizeUtf8(o.prompt);
  j["kv_format"] = FormatPairName(kv_options.formats);
  j["layout"] = o.layout;
  j["backend"] = o.backend;
  j["temperature"] = o.temperature;
  j["seed"] = o.seed;
  j["prompt_tokens"] = prompt;
  j["generated_tokens"] = r->tokens;
  j["text"] = model::SanitizeUtf8(*generated_text);
  j["num_generated"] = r->tokens.size();
  j["prefill_seconds"] = r->prefill_seconds;
  j["decode_seconds"] = r->decode_seconds;
  j["tokens_per_second"] = tps;
  j["threads"] = decoder_threads(o);
  j["decode_cpu_ms_per_token"] = cpu_ms;
  j["decode_thread_cpu_ms_per_token"] = thread_cpu_ms;
  j["weights"] = o.weights;
  j["forward_passes"] = r->forward_passes;
  j["draft_tokens"] = o.draft;
  if (o.draft > 0) {
    j["draft_kind"] = o.draft_kind;
    if (o.draft_kind == "layers") j["draft_layers"] = o.draft_layers;
    j["drafted_tokens"] = r->drafted_tokens;
    j["accepted_tokens"] = r->accepted_tokens;
    j["acceptance_rate"] = r->acceptance_rate();
  }
  fmt::print("{}\n", j.dump(2));
  return 0;
}

const bool kRegistered = RegisterCommand(
    "generate", "Generate text with the reference decoder on a kvcache cache",
    [](CLI::App* app) -> Runner {
      auto o = std::make_shared<GenerateCliOptions>();
      app->add_option("--model", o->model_path, "GGUF file, or llama2.c v1 checkpoint")->required();
      app->add_option("--tokenizer", o->tokenizer_path, "llama2.c tokenizer.bin (not for GGUF)");
      auto* text = app->add_option("--prompt", o->prompt, "Prompt text");
      auto* file = app->add_option("--prompt-file", o->prompt_file, "Prompt text from a file");
      auto* ids = app->add_option("--prompt-ids", o->prompt_ids, "Prompt as token ids: 1,2,3");
      text->excludes(file)->excludes(ids);
      file->excludes(ids);
      app->add_flag("--chat", o->chat, "Wrap the prompt as a user turn in the model's chat template");
      app->add_option("--threads", o->threads, "Threads for the weight products")->capture_default_str();
      app->add_option("--weights", o->weights, "quantized (as stored) | f32 (decoded at load)")
          ->capture_default_str();
      app->callback([app] {
        if (app->count("--prompt") + app->count("--prompt-file") + app->count("--prompt-ids") != 1) {
          throw CLI::ValidationError("one of --prompt, --prompt-file or --prompt-ids is required");
        }
      });
      app->add_option("--steps", o->steps, "Tokens to generate at most")->capture_default_str();
      app->add_option("--temperature", o->temperature, "Sampling temperature (0 = greedy)")
          ->capture_default_str();
      app->add_option("--seed", o->seed, "Sampling seed")->capture_default_str();
      AddKvBackendFlags(app, o->kv_format, o->layout, o->block_size, o->backend);
      app->add_option("--draft", o->draft, "Speculative decoding: tokens drafted per pass")
          ->capture_default_str();
      app->add_option("--draft-kind", o->draft_kind,
                      "ngram (lookup in the context) | layers (the model's first layers)")
          ->capture_default_str();
      app->add_option("--draft-layers", o->draft_layers, "Layers of the early-exit draft")
          ->capture_default_str();
      app->add_flag("--json", o->json, "Print one JSON object (ids, tokens/s) instead of streaming");
      return [o] { return RunGenerate(*o); };
    });

}  // namespace
}  // namespace kvcache::tools
