// The demo's story and perplexity/KL table.
#include "model/demo_report.h"

#include <string>

#include "model/decoder.h"
#include "model/generate.h"
#include "model/model_files.h"
#include "model/perplexity.h"

namespace kvcache::model {
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

Status PrintDemoReport(const DemoReportOptions& options, std::FILE* out) {
  KV_ASSIGN_OR_RETURN(auto files, LoadModelFiles(options.model_path, options.tokenizer_path));
  const Tokenizer& tok = files->tokenizer;
  Decoder decoder(files->model);
  const ModelConfig& c = decoder.config();
  KvBackendOptions backend = options.backend;
  backend.formats = FormatPair{};
  const std::string where = std::string(BackendKindName(backend.kind)) +
                            (backend.kind == BackendKind::kCache
                                 ? std::string(" ") + std::string(CacheLayoutName(backend.layout))
                                 : std::string());

  // --- the story -------------------------------------------------------------
  const std::vector<int32_t> prompt = tok.Encode(options.prompt);
  GenerateOptions g;
  g.max_new_tokens = options.story_tokens;
  KV_ASSIGN_OR_RETURN(auto kv, CreateKvBackend(decoder.attention_shape(), backend));
  KV_ASSIGN_OR_RETURN(GenerateResult story, Generate(decoder, *kv, prompt, g));
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), story.tokens.begin(), story.tokens.end());
  KV_ASSIGN_OR_RETURN(std::string text, tok.Decode(all));
  std::fprintf(out, "== A story from stories260K (%s), greedy, K/V in the f32 cache (%s) ==\n",
               c.ToString().c_str(), where.c_str());
  std::fprintf(out, "%s\n", text.c_str());
  const double tps = story.decode_seconds > 0 ? story.tokens.size() / story.decode_seconds : 0;
  std::fprintf(out, "[%zu tokens in %.1f ms, %.0f tokens/s]\n", story.tokens.size(),
               1e3 * story.decode_seconds, tps);
  if (options.draft_tokens > 0) {
    GenerateOptions spec = g;
    spec.draft_tokens = options.draft_tokens;
    KV_ASSIGN_OR_RETURN(auto kv2, CreateKvBackend(decoder.attention_shape(), backend));
    KV_ASSIGN_OR_RETURN(GenerateResult s, Generate(decoder, *kv2, prompt, spec));
    std::fprintf(out,
                 "[speculative, n-gram draft of %u verified in one multi-token pass: %s output, "
                 "%u of %u drafted tokens accepted (%.1f%%), %u verify passes for %zu tokens]\n",
                 options.draft_tokens, s.tokens == story.tokens ? "identical" : "DIFFERENT",
                 s.accepted_tokens, s.drafted_tokens, 100.0 * s.acceptance_rate(),
                 s.forward_passes, s.tokens.size());
  }

  // --- the table -------------------------------------------------------------
  std::vector<int32_t> tokens = tok.Encode(options.text.empty() ? std::string(DemoStoryText())
                                                                : options.text);
  if (tokens.size() > c.max_seq_len) tokens.resize(c.max_seq_len);
  const std::vector<FormatPair> formats =
      options.formats.empty() ? DefaultDemoFormats() : options.formats;
  PerplexityOptions p;
  p.prefill_tokens = options.prefill_tokens;
  KV_ASSIGN_OR_RETURN(std::vector<FormatEvaluation> evals,
                      EvaluateFormats(decoder, tokens, backend, formats, p));
  std::fprintf(out,
               "\n== KV format quality: teacher-forced over %zu tokens of a short story "
               "(%u-token prefill, then one decode step per token), vs the f32 cache (%s) ==\n",
               tokens.size(), options.prefill_tokens, where.c_str());
  std::fprintf(out, "%-16s %9s %11s %9s %11s %10s\n", "K:V format", "bits K/V", "perplexity",
               "mean NLL", "KL vs f32", "top-1 agr");
  const uint32_t hd = c.head_dim();
  for (const FormatEvaluation& e : evals) {
    const std::string name = FormatPairName(e.formats);
    if (e.state != FormatEvaluation::State::kOk) {
      std::fprintf(out, "%-16s %s: %s\n", name.c_str(),
                   std::string(FormatEvaluationStateName(e.state)).c_str(), e.message.c_str());
      continue;
    }
    const PerplexityResult& r = e.result;
    const std::string bits = Fmt("%.4g", BitsPerValue(e.formats.k, hd)) + "/" +
                             Fmt("%.4g", BitsPerValue(e.formats.v, hd));
    std::fprintf(out, "%-16s %9s %11.4f %9.4f %11.2e %9.1f%%\n", name.c_str(), bits.c_str(),
                 r.perplexity, r.mean_nll, r.kl_vs_ref, 100.0 * r.top1_agree_vs_ref);
  }
  return Status::Ok();
}

}  // namespace kvcache::model
