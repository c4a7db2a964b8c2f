// `kvcache perplexity`: teacher-forced mean NLL of a text under the reference
// decoder with its K/V cache in a given format, plus the KL divergence and
// top-1 agreement of its next-token distributions against the f32 cache.
// A format the model's head_dim cannot take (or one not built yet) is
// reported as such: the JSON says "supported": false with the reason, and the
// exit code is 3.
#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/decoder.h"
#include "model/model_files.h"
#include "model/perplexity.h"
#include "tools/command.h"
#include "tools/kv_flags.h"

namespace kvcache::tools {
namespace {

struct PerplexityCliOptions {
  std::string model_path, tokenizer_path, prompt, text_file;
  std::string kv_format = "f32";
  std::string layout = "contiguous";
  std::string backend = "cache";
  uint32_t block_size = 16;
  uint32_t chunk = 1;
  uint32_t prefill = 0;
  bool json = false;
};

int Fail(const Status& s) {
  fmt::print(stderr, "kvcache perplexity: {}\n", s.ToString());
  return 2;
}

int RunPerplexity(const PerplexityCliOptions& o) {
  std::string text = o.prompt;
  if (!o.text_file.empty()) {
    std::ifstream in(o.text_file, std::ios::binary);
    if (!in) return Fail(Status::IoError("cannot open " + o.text_file));
    std::ostringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  auto files = model::LoadModelFiles(o.model_path, o.tokenizer_path);
  if (!files.ok()) return Fail(files.status());
  auto parsed = model::ParseKvBackendOptions(o.kv_format, o.layout, o.backend, o.block_size);
  if (!parsed.ok()) return Fail(parsed.status());
  const model::KvBackendOptions& kv_options = *parsed;

  model::Decoder decoder((*files)->model);
  std::vector<int32_t> tokens = (*files)->tokenizer.Encode(text);
  const size_t encoded = tokens.size();
  const uint32_t max_len = decoder.config().max_seq_len;
  if (tokens.size() > max_len) tokens.resize(max_len);
  if (tokens.size() < 2) return Fail(Status::InvalidArgument("the text encodes to no tokens"));

  model::PerplexityOptions p;
  p.chunk_tokens = o.chunk;
  p.prefill_tokens = o.prefill;
  auto e = model::EvaluateFormat(decoder, tokens, kv_options, p);
  if (!e.ok()) return Fail(e.status());
  const bool ok = e->state == model::FormatEvaluation::State::kOk;
  const model::PerplexityResult& r = e->result;
  nlohmann::json j;
  j["model"] = o.model_path;
  j["kv_format"] = FormatPairName(kv_options.formats);
  j["layout"] = o.layout;
  j["backend"] = o.backend;
  j["chunk_tokens"] = o.chunk;
  j["prefill_tokens"] = o.prefill;
  j["num_tokens"] = tokens.size();
  if (encoded > tokens.size()) j["truncated_from_tokens"] = encoded;
  j["supported"] = ok;
  j["status"] = model::FormatEvaluationStateName(e->state);
  if (!ok) {
    j["error"] = e->message;
  } else {
    j["num_predictions"] = r.num_predictions;
    j["mean_nll"] = r.mean_nll;
    j["perplexity"] = r.perplexity;
    j["f32_mean_nll"] = r.ref_mean_nll;
    j["f32_perplexity"] = std::exp(r.ref_mean_nll);
    j["kl_vs_f32"] = r.kl_vs_ref;
    j["top1_agree_vs_f32"] = r.top1_agree_vs_ref;
    const uint32_t hd = decoder.config().head_dim();
    j["k_bits_per_value"] = BitsPerValue(kv_options.formats.k, hd);
    j["v_bits_per_value"] = BitsPerValue(kv_options.formats.v, hd);
  }
  if (o.json) {
    fmt::print("{}\n", j.dump(2));
  } else if (ok) {
    fmt::print("kv {} ({}): {} predictions, mean NLL {:.6f}, perplexity {:.4f} "
               "(f32 {:.4f}), KL vs f32 {:.3e}, top-1 agreement {:.2f}%\n",
               FormatPairName(kv_options.formats), o.layout, r.num_predictions, r.mean_nll,
               r.perplexity, std::exp(r.ref_mean_nll), r.kl_vs_ref, 100.0 * r.top1_agree_vs_ref);
  } else {
    fmt::print(stderr, "kvcache perplexity: {} is {} for this model: {}\n",
               FormatPairName(kv_options.formats), model::FormatEvaluationStateName(e->state),
               e->message);
  }
  return ok ? 0 : 3;
}

const bool kRegistered = RegisterCommand(
    "perplexity", "Teacher-forced perplexity and KL vs the f32 cache for one KV format",
    [](CLI::App* app) -> Runner {
      auto o = std::make_shared<PerplexityCliOptions>();
      app->add_option("--model", o->model_path, "llama2.c v1 checkpoint")->required();
      app->add_option("--tokenizer", o->tokenizer_path, "llama2.c tokenizer.bin")->required();
      auto* file = app->add_option("--text-file", o->text_file, "Text to score");
      auto* prompt = app->add_option("--prompt", o->prompt, "Text to score");
      file->excludes(prompt);
      prompt->excludes(file);
      AddKvBackendFlags(app, o->kv_format, o->layout, o->block_size, o->backend);
      app->add_option("--chunk", o->chunk, "Tokens per forward pass (1 = decode steps)")
          ->capture_default_str();
      app->add_option("--prefill", o->prefill,
                      "Tokens of a first prompt pass before the chunks (0 = none)")
          ->capture_default_str();
      app->add_flag("--json", o->json, "Print JSON");
      app->callback([app] {
        if (app->count("--text-file") + app->count("--prompt") != 1) {
          throw CLI::ValidationError("one of --text-file or --prompt is required");
        }
      });
      return [o] { return RunPerplexity(*o); };
    });

}  // namespace
}  // namespace kvcache::tools
