// The demo's story and perplexity/KL table.
#include "tools/demo_report.h"

#include <algorithm>
#include <string>

#include "model/decoder/decoder.h"
#include "model/decoder/loaded_model.h"
#include "model/generate/generate.h"
#include "model/generate/perplexity.h"

namespace kvcache::tools {

using model::AttentionShape;
using model::BackendKind;
using model::Decoder;
using model::FormatEvaluation;
using model::GenerateOptions;
using model::GenerateResult;
using model::LoadedModel;
using model::ModelConfig;
using model::PerplexityOptions;
using model::PerplexityResult;

namespace {

constexpr const char* kDemoStory =
    "Once upon a time, there was a little girl named Mia. She liked to play in the garden "
    "with her dog, Max. One day, Mia saw a big red ball under a tree. She ran to get it, "
    "but Max got there first. Max took the ball and ran away. Mia laughed and chased him "
    "around the garden. When they were tired, they sat in the sun and ate a cookie. Mia "
    "said, \"You are my best friend, Max.\" Max wagged his tail and was very happy.";

std::string Fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

}  // namespace

std::string_view DemoStoryText() { return kDemoStory; }

std::vector<FormatPair> DefaultDemoFormats() {
  std::vector<FormatPair> out;
  for (const char* name : {"f32", "f16", "bf16", "fp8_e4m3", "q8", "bf16:fp8_e4m3", "bf16:q8",
                           "turbo8", "turbo4", "turbo3", "turbo2", "q8_0", "q4_0"}) {
    out.push_back(*ParseFormatPair(name));
  }
  return out;
}

namespace {

// What both parts of the report run on.
struct Report {
  const DemoReportOptions& options;
  const LoadedModel& lm;
  Decoder& decoder;
  model::KvBackendOptions backend;  // the options' backend with the f32 cache
  std::string where;                // the backend as the titles name it
  std::FILE* out;

  // The story (or chat answer) on the f32 cache, and its speculative rerun.
  Status PrintStory() const;
  // Perplexity, KL and top-1 agreement against the f32 cache per format,
  // with the K/V memory each needs for the model's whole context.
  Status PrintTable() const;
};

Status Report::PrintStory() const {
  const ModelConfig& c = decoder.config();
  const std::string model_name = lm.is_gguf() ? "SmolLM2 GGUF" : "stories260K";
  KV_ASSIGN_OR_RETURN(const std::vector<int32_t> prompt,
                      options.chat ? lm.EncodeChat(options.prompt) : lm.Encode(options.prompt));
  GenerateOptions g;
  g.max_new_tokens = options.story_tokens;
  g.stop_tokens = lm.stop_tokens();
  AttentionShape shape = decoder.attention_shape();
  shape.max_seq_len = std::min<uint32_t>(
      shape.max_seq_len, static_cast<uint32_t>(prompt.size()) + options.story_tokens + options.draft_tokens + 1);
  KV_ASSIGN_OR_RETURN(auto kv, model::CreateKvBackend(shape, backend));
  KV_ASSIGN_OR_RETURN(GenerateResult story, model::Generate(decoder, *kv, prompt, g));
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), story.tokens.begin(), story.tokens.end());
  if (options.chat) {
    KV_ASSIGN_OR_RETURN(std::string answer, lm.Decode(story.tokens));
    std::fprintf(out, "== A chat answer from %s (%s), greedy, K/V in the f32 cache (%s) ==\n", model_name.c_str(),
                 c.ToString().c_str(), where.c_str());
    std::fprintf(out, "user> %s\nassistant> %s\n", options.prompt.c_str(), answer.c_str());
  } else {
    KV_ASSIGN_OR_RETURN(std::string text, lm.Decode(all));
    std::fprintf(out, "== A story from %s (%s), greedy, K/V in the f32 cache (%s) ==\n", model_name.c_str(),
                 c.ToString().c_str(), where.c_str());
    std::fprintf(out, "%s\n", text.c_str());
  }
  const double tps = story.decode_seconds > 0 ? story.tokens.size() / story.decode_seconds : 0;
  std::fprintf(out, "[%zu prompt tokens in %.1f ms; %zu tokens in %.1f ms, %.1f tokens/s wall, %u threads]\n",
               prompt.size(), 1e3 * story.prefill_seconds, story.tokens.size(), 1e3 * story.decode_seconds, tps,
               std::max(1u, options.threads));
  if (options.draft_tokens > 0) {
    GenerateOptions spec = g;
    spec.draft_tokens = options.draft_tokens;
    KV_ASSIGN_OR_RETURN(auto kv2, model::CreateKvBackend(shape, backend));
    KV_ASSIGN_OR_RETURN(GenerateResult s, model::Generate(decoder, *kv2, prompt, spec));
    std::fprintf(out,
                 "[speculative, n-gram draft of %u verified in one multi-token pass: %s output, "
                 "%u of %u drafted tokens accepted (%.1f%%), %u verify passes for %zu tokens]\n",
                 options.draft_tokens, s.tokens == story.tokens ? "identical" : "DIFFERENT",
                 s.accepted_tokens, s.drafted_tokens, 100.0 * s.acceptance_rate(),
                 s.forward_passes, s.tokens.size());
  }
  return Status::Ok();
}

Status Report::PrintTable() const {
  const ModelConfig& c = decoder.config();
  KV_ASSIGN_OR_RETURN(std::vector<int32_t> tokens,
                      lm.Encode(options.text.empty() ? std::string(DemoStoryText()) : options.text));
  uint32_t max_tokens = c.max_seq_len;
  if (options.max_table_tokens != 0) max_tokens = std::min(max_tokens, options.max_table_tokens);
  if (tokens.size() > max_tokens) tokens.resize(max_tokens);
  const std::vector<FormatPair> formats =
      options.formats.empty() ? DefaultDemoFormats() : options.formats;
  PerplexityOptions p;
  p.prefill_tokens = options.prefill_tokens;
  p.chunk_tokens = std::max(1u, options.chunk_tokens);
  p.max_seq_len = static_cast<uint32_t>(tokens.size());
  KV_ASSIGN_OR_RETURN(std::vector<FormatEvaluation> evals,
                      model::EvaluateFormats(decoder, tokens, backend, formats, p));
  std::fprintf(out,
               "\n== KV format quality: teacher-forced over %zu tokens of %s "
               "(%u-token prefill, then passes of %u tokens), vs the f32 cache (%s) ==\n",
               tokens.size(), options.text_name.c_str(), options.prefill_tokens, p.chunk_tokens, where.c_str());
  // K and V of every layer and kv head for the model's whole context.
  const double context_values = static_cast<double>(c.n_layers) * c.n_kv_heads * c.head_dim() * c.max_seq_len;
  std::fprintf(out, "%-23s %9s %11s %9s %11s %10s %12s\n", "K:V format", "bits K/V", "perplexity",
               "mean NLL", "KL vs f32", "top-1 agr", "KV @ context");
  const uint32_t hd = c.head_dim();
  for (const FormatEvaluation& e : evals) {
    const std::string name = FormatPairName(e.formats);
    if (e.state != FormatEvaluation::State::kOk) {
      std::fprintf(out, "%-23s %s: %s\n", name.c_str(),
                   std::string(model::FormatEvaluationStateName(e.state)).c_str(), e.message.c_str());
      continue;
    }
    const PerplexityResult& r = e.result;
    const std::string bits = Fmt("%.4g", BitsPerValue(e.formats.k, hd)) + "/" +
                             Fmt("%.4g", BitsPerValue(e.formats.v, hd));
    const double mib = context_values * (BitsPerValue(e.formats.k, hd) + BitsPerValue(e.formats.v, hd)) / 8 /
                       (1024.0 * 1024.0);
    std::fprintf(out, "%-23s %9s %11.4f %9.4f %11.2e %9.1f%% %8.1f MiB\n", name.c_str(), bits.c_str(),
                 r.perplexity, r.mean_nll, r.kl_vs_ref, 100.0 * r.top1_agree_vs_ref, mib);
  }
  if (!options.windows.empty() && backend.kind == BackendKind::kCache) {
    KV_ASSIGN_OR_RETURN(std::vector<model::VariantEvaluation> windows,
                        model::EvaluateVariants(decoder, tokens, options.windows, p, &backend));
    for (const model::VariantEvaluation& e : windows) {
      const model::VariantBits b = model::CacheWindowBits(e.variant, hd, c.max_seq_len);
      const PerplexityResult& r = e.result;
      const std::string bits = Fmt("%.3g", b.k) + "/" + Fmt("%.3g", b.v);
      std::fprintf(out, "%-23s %9s %11.4f %9.4f %11.2e %9.1f%% %8.1f MiB\n",
                   model::KvVariantName(e.variant).c_str(), bits.c_str(), r.perplexity, r.mean_nll,
                   r.kl_vs_ref, 100.0 * r.top1_agree_vs_ref, context_values * (b.k + b.v) / 8 / (1024.0 * 1024.0));
    }
    std::fprintf(out,
                 "(+sN+rN: a precision window, the first N and the last N positions also kept as bf16 "
                 "rows; over %zu tokens it holds a large share of them, docs/smollm2.md has 4096)\n",
                 tokens.size());
  }
  std::fprintf(out, "(KV @ context: K+V of %u layers x %u kv heads x %u positions)\n", c.n_layers, c.n_kv_heads,
               c.max_seq_len);
  return Status::Ok();
}


}  // namespace

Status PrintDemoReport(const DemoReportOptions& options, std::FILE* out) {
  KV_ASSIGN_OR_RETURN(auto files, LoadedModel::Load(options.model_path, options.tokenizer_path));
  const LoadedModel& lm = *files;
  Decoder decoder(lm.model(), std::max(1u, options.threads));
  model::KvBackendOptions backend = options.backend;
  backend.formats = FormatPair{};
  std::string where = std::string(model::BackendKindName(backend.kind)) +
                      (backend.kind == BackendKind::kCache
                           ? std::string(" ") + std::string(model::CacheLayoutName(backend.layout))
                           : std::string());
  const Report report{options, lm, decoder, backend, std::move(where), out};
  KV_RETURN_IF_ERROR(report.PrintStory());
  return report.PrintTable();
}

}  // namespace kvcache::tools
