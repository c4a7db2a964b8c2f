// `kvcache passkey`: long-context retrieval. A 5-digit pass key is stated
// once inside filler text at a given depth of a context of N tokens, and
// asked for at the end; the model answers greedily with --answer-tokens
// tokens (16 by default: a model that restates "the pass key." before the
// number needs about 10, one digit a token, and 8 cut such answers off
// inside the key). Per depth, the fraction of trials whose answer holds
// the key as a whole number (passkey_rule.h).
//
// The prompt is built from token ids: BOS, filler sentences up to the
// depth, the key's sentence, filler to the end, the question ("What is the
// pass key? The pass key is"). Every piece is tokenized alone and the ids
// concatenated, so a trial differs from the others only in the key's
// tokens: the filler before the key is prefilled once per depth and each
// trial forks it (KvBackend::Fork); model::Generate answers. Keys are drawn
// from --seed. --prompt-key K prints the prompt of key K at each depth as
// token ids and runs nothing, so another engine can be asked the very same
// prompt (scripts/passkey_llama.py). Each trial's result goes to stderr as
// it ends, so a long run shows its progress. --out FILE keeps the JSON
// document in FILE, rewritten (atomically) after every trial with
// "complete": false until the last; --resume continues the document FILE
// holds: the settings must be the same (every one but --threads and
// --chunk, which change no answer), the finished trials are kept, their keys
// drawn again from the seed and checked against the recorded ones, and the
// run goes on from the first trial not done. A 32k matrix takes hours a
// cache on two cores; a stopped run loses at most the trial it was in.
// The document also says what the cache spends: "cache_bits_per_value",
// the mean bits of a stored K/V value over every layer's rows at the
// prompt's length (each layer group's format, the precision window's bf16
// rows, a window layer's last positions only), and with an eviction
// policy "kept_positions", what its budget keeps of a full-attention
// layer's. Resuming a finished document adds them if it lacks them. With
// an eviction policy each answer also says which positions of the key's
// sentence the bounded layers still attended to ("key_rows_kept"), so a
// miss reads as the key evicted or the key kept and not retrieved.
// Every answer names the code that computed it ("simd_target", and
// "bf16_kernel" where the model's products are bf16), so a document resumed on another
// machine says which answers ran where: two machines that run the same
// code compute the same answers, unless an instruction whose internal
// summation order is the hardware's own (the dot and tiles kernels')
// sums differently there.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "kvcache/simd.h"
#include "model/decoder/decoder.h"
#include "model/decoder/loaded_model.h"
#include "model/generate/generate.h"
#include "model/generate/perplexity.h"
#include "model/kv/hybrid_kv.h"
#include "model/kv/kv_factory.h"
#include "model/tensor/matmul_bf16.h"
#include "tools/command.h"
#include "tools/json_result.h"
#include "tools/kv_flags.h"
#include "tools/passkey_rule.h"

namespace kvcache::tools {
namespace {

struct PasskeyOptions {
  std::string model_path, tokenizer_path;
  uint32_t context = 4096;
  std::string depths = "0.25,0.5,0.75";
  uint32_t trials = 20;
  uint32_t threads = 2;
  uint32_t chunk = 256;
  uint32_t seed = 1;
  uint32_t answer_tokens = 16;
  std::string matmul = "f32";
  std::string kv_format = "f32", layout = "paged", backend = "cache", eviction;
  uint32_t block_size = 16;
  bool json = false;
  std::string prompt_key;
  std::string out_path;
  bool resume = false;
};

constexpr const char* kFiller = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ";
constexpr uint32_t kMaxAnswerTokens = 1024;

Result<std::vector<double>> ParseDepths(const std::string& list) {
  std::vector<double> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const double d = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != '\0' || !(d >= 0.0 && d <= 1.0)) {
      return Status::InvalidArgument("--depths: '" + item + "' is not a fraction in [0, 1]");
    }
    out.push_back(d);
  }
  if (out.empty()) return Status::InvalidArgument("--depths: none given");
  return out;
}

// The ids of `text` without BOS.
Result<std::vector<int32_t>> Ids(const model::LoadedModel& lm, const std::string& text, int32_t bos) {
  KV_ASSIGN_OR_RETURN(std::vector<int32_t> ids, lm.Encode(text));
  if (!ids.empty() && ids[0] == bos) ids.erase(ids.begin());
  return ids;
}

// The pieces every prompt is made of, tokenized alone: BOS (when the model
// adds one), one pass of the filler sentences, the question.
//
// A prompt is cut only where a pass of the filler ends ("... There and back
// again. "; PasskeyRest): the key's sentence and the question always follow
// a whole sentence. Cut at any token, the key's sentence could land inside
// a filler sentence ("The sky is blue. The sunThe pass key is 47531."),
// which Gemma 3 answered with the filler ("yellow.", docs/gemma3.md).
struct PromptParts {
  std::vector<int32_t> with_bos, filler, question;
  size_t passes = 0;  // passes of the filler in a prompt, before and after the key
  int32_t bos() const { return with_bos.empty() ? -1 : with_bos[0]; }
};

// The most tokens a key's sentence may take: the prompt's filler is the
// whole passes that fit beside it, so a prompt is at most --context long,
// shorter by less than a pass plus what the key's sentence leaves of this.
constexpr size_t kNeedleBudget = 48;

// What a run's document calls its prompts (the "prompt" setting), so that a
// document of other prompts is not resumed with these.
constexpr const char* kPromptKind = "whole filler passes";

Result<PromptParts> MakeParts(const model::LoadedModel& lm, uint32_t context) {
  PromptParts parts;
  KV_ASSIGN_OR_RETURN(parts.with_bos, lm.Encode(""));
  KV_ASSIGN_OR_RETURN(parts.filler, Ids(lm, kFiller, parts.bos()));
  KV_ASSIGN_OR_RETURN(parts.question, Ids(lm, "What is the pass key? The pass key is", parts.bos()));
  if (parts.filler.empty()) return Status::InvalidArgument("passkey: the filler encodes to nothing");
  const size_t fixed = parts.with_bos.size() + parts.question.size() + kNeedleBudget;
  parts.passes = PasskeyPasses(context, fixed, parts.filler.size());
  if (parts.passes == 0) {
    return Status::InvalidArgument("passkey: --context " + std::to_string(context) + " is too short: the question, " +
                                   "the key's sentence and one pass of the filler take " +
                                   std::to_string(fixed + parts.filler.size()));
  }
  return parts;
}

// Passes of the filler before the key at `depth`.
size_t FillerBefore(const PromptParts& parts, double depth) {
  return static_cast<size_t>(depth * static_cast<double>(parts.passes));
}

// The key's sentence.
Result<std::vector<int32_t>> KeySentence(const model::LoadedModel& lm, const PromptParts& parts,
                                         const std::string& key) {
  KV_ASSIGN_OR_RETURN(std::vector<int32_t> sentence,
                      Ids(lm, "The pass key is " + key + ". Remember it. " + key + " is the pass key. ", parts.bos()));
  if (sentence.size() > kNeedleBudget) {
    return Status::InvalidArgument("passkey: the key '" + key + "' makes a sentence of " +
                                   std::to_string(sentence.size()) + " tokens, past the " +
                                   std::to_string(kNeedleBudget) + " a prompt sets aside");
  }
  return sentence;
}

// The key's sentence, the filler after it, the question.
Result<std::vector<int32_t>> PromptRest(const model::LoadedModel& lm, const PromptParts& parts, size_t before,
                                        const std::string& key) {
  KV_ASSIGN_OR_RETURN(std::vector<int32_t> sentence, KeySentence(lm, parts, key));
  return PasskeyRest(sentence, parts.filler, parts.passes, before, parts.question);
}

// With an eviction policy: which positions of the key's sentence, [at, at +
// n), each layer the policy bounds still attends to after the answer, as
// {"LAYER/HEAD": "++-+..."} ('+' kept, '-' evicted), so that a miss can be
// told apart: the key evicted, or kept and not retrieved. H2O: the rows the
// head holds. StreamingLLM: its sinks and its window's last positions (the
// rows it stores beyond them, kept for chunked prefill, are masked). The
// model's own window layers are left out; empty for a backend that evicts
// nothing.
nlohmann::json KeyRowsKept(const model::KvBackend& kv, size_t at, size_t n) {
  nlohmann::json out = nlohmann::json::object();
  const auto* hybrid = dynamic_cast<const model::HybridKv*>(&kv);
  if (hybrid == nullptr) return out;
  const HybridSequence& seq = hybrid->sequence();
  const HybridModel& m = seq.model();
  for (uint32_t layer = 0; layer < m.n_layers(); ++layer) {
    const LayerSpec& spec = m.spec(layer);
    if (kv.window(layer) != 0 || spec.kind == LayerKind::kLinear) continue;
    if (spec.kind == LayerKind::kFull && spec.head_policies.empty()) continue;  // keeps every position
    const uint64_t len = seq.num_tokens(layer);
    for (uint32_t head = 0; head < m.geometry().n_kv_heads(); ++head) {
      const std::vector<uint32_t> held =
          spec.kind == LayerKind::kFull ? seq.HeadPositions(layer, head) : std::vector<uint32_t>{};
      std::string rows;
      for (size_t p = at; p < at + n; ++p) {
        const bool kept = spec.kind == LayerKind::kWindow
                              ? p < spec.sink_tokens || p + spec.window_tokens >= len
                              : std::binary_search(held.begin(), held.end(), static_cast<uint32_t>(p));
        rows += kept ? '+' : '-';
      }
      out[std::to_string(layer) + "/" + std::to_string(head)] = rows;
    }
  }
  return out;
}

// The whole prompt: the shared prefix, then a trial's rest.
std::vector<int32_t> Joined(const std::vector<int32_t>& prefix, const std::vector<int32_t>& rest) {
  std::vector<int32_t> prompt = prefix;
  prompt.insert(prompt.end(), rest.begin(), rest.end());
  return prompt;
}

Result<std::unique_ptr<model::LoadedModel>> LoadForPasskey(const PasskeyOptions& o) {
  if (o.answer_tokens == 0 || o.answer_tokens > kMaxAnswerTokens) {
    return Status::InvalidArgument("passkey: --answer-tokens must be 1 to " + std::to_string(kMaxAnswerTokens));
  }
  model::GgufLoadOptions load;
  load.max_seq_len = o.context + o.answer_tokens;
  KV_ASSIGN_OR_RETURN(load.matmul_inputs, model::ParseMatMulInputs(o.matmul));
  auto lm = model::LoadedModel::Load(o.model_path, o.tokenizer_path, load);
  if (!lm.ok()) {
    // The positions the loader names are the prompt's and the answer's.
    return Status(lm.status().code(), "passkey (--context " + std::to_string(o.context) + " + --answer-tokens " +
                                          std::to_string(o.answer_tokens) + "): " + lm.status().message());
  }
  return lm;
}

// --prompt-key: the prompt of that key at each depth, as ids.
Result<nlohmann::json> PrintPrompts(const PasskeyOptions& o) {
  KV_ASSIGN_OR_RETURN(std::vector<double> depths, ParseDepths(o.depths));
  KV_ASSIGN_OR_RETURN(std::unique_ptr<model::LoadedModel> lm, LoadForPasskey(o));
  KV_ASSIGN_OR_RETURN(PromptParts parts, MakeParts(*lm, o.context));
  nlohmann::json out;
  out["model"] = o.model_path;
  out["context"] = o.context;
  out["key"] = o.prompt_key;
  out["prompts"] = nlohmann::json::array();
  for (double depth : depths) {
    const size_t before = FillerBefore(parts, depth);
    KV_ASSIGN_OR_RETURN(std::vector<int32_t> rest, PromptRest(*lm, parts, before, o.prompt_key));
    const std::vector<int32_t> prefix = PasskeyPrefix(parts.with_bos, parts.filler, before);
    out["prompts"].push_back({{"depth", depth}, {"ids", Joined(prefix, rest)}});
  }
  return out;
}

// The settings a run's document records, which a resumed run must share
// (every answer depends on them; --threads and --chunk change none).
nlohmann::json RunSettings(const PasskeyOptions& o, const std::vector<double>& depths) {
  nlohmann::json j;
  j["model"] = o.model_path;
  j["context"] = o.context;
  j["kv_format"] = o.kv_format;
  j["eviction"] = o.eviction.empty() ? "none" : o.eviction;
  j["trials"] = o.trials;
  j["answer_tokens"] = o.answer_tokens;
  j["seed"] = o.seed;
  j["depths"] = depths;
  j["matmul"] = o.matmul;
  j["layout"] = o.layout;
  j["block_size"] = o.block_size;
  j["backend"] = o.backend;
  j["prompt"] = kPromptKind;
  return j;
}

// FILE's document, checked for --resume against this run's settings: the
// same settings (the model compared by file name, so a run moves between
// machines), and results that are a prefix of the run's trials, each
// answer whole. Every problem is an error naming it: IoError (unreadable),
// Corruption (not such a document), InvalidArgument (other settings).
Result<nlohmann::json> LoadForResume(const std::string& path, const nlohmann::json& settings) {
  const std::string what = "passkey --resume: " + path + ": ";
  std::ifstream in(path);
  if (!in) return Status::IoError(what + "cannot be read");
  nlohmann::json doc = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object()) return Status::Corruption(what + "not a JSON object");
  // The member `name` of object o, or nullptr (never inserts, never throws).
  auto member = [](const nlohmann::json& o, const char* name) -> const nlohmann::json* {
    if (!o.is_object()) return nullptr;
    const auto it = o.find(name);
    return it == o.end() ? nullptr : &*it;
  };
  for (const auto& [name, want] : settings.items()) {
    const nlohmann::json* got = member(doc, name.c_str());
    if (got == nullptr && name == "prompt") {
      return Status::InvalidArgument(what + "was made with the earlier prompts, cut at any token; these are cut "
                                     "only between passes of the filler, so its trials are not this run's");
    }
    if (got == nullptr) return Status::InvalidArgument(what + "has no '" + name + "' (not written with --out)");
    const bool same = name == "model" ? got->is_string() && std::filesystem::path(got->get<std::string>()).filename() ==
                                                                 std::filesystem::path(want.get<std::string>()).filename()
                                      : *got == want;
    if (!same) {
      return Status::InvalidArgument(what + "'" + name + "' is " + got->dump() + ", this run's " + want.dump());
    }
  }
  const nlohmann::json* results = member(doc, "results");
  if (results == nullptr || !results->is_array() || results->size() > settings["depths"].size()) {
    return Status::Corruption(what + "'results' is not one entry per depth");
  }
  const uint32_t trials = settings["trials"].get<uint32_t>();
  for (size_t i = 0; i < results->size(); ++i) {
    const nlohmann::json& r = (*results)[i];
    const nlohmann::json* answers = member(r, "answers");
    const nlohmann::json* depth = member(r, "depth");
    if (answers == nullptr || !answers->is_array() || answers->size() > trials || depth == nullptr ||
        *depth != settings["depths"][i] || (i + 1 < results->size() && answers->size() != trials)) {
      return Status::Corruption(what + "the results of depth " + std::to_string(i + 1) +
                                " are not those of this run's trials");
    }
    for (const nlohmann::json& a : *answers) {
      const nlohmann::json *key = member(a, "key"), *text = member(a, "answer"), *ids = member(a, "answer_ids"),
                           *found = member(a, "found");
      if (key == nullptr || !key->is_string() || text == nullptr || !text->is_string() || ids == nullptr ||
          !ids->is_array() || found == nullptr || !found->is_boolean()) {
        return Status::Corruption(what + "an answer at depth " + std::to_string(i + 1) +
                                  " lacks its key, answer, ids or found");
      }
    }
  }
  return doc;
}

// Writes doc to path through a temporary file and a rename, so the file is
// always a whole document: the last one written.
Status WriteAtomically(const std::string& path, const nlohmann::json& doc) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << doc.dump(2) << "\n";
    f.flush();
    if (!f) return Status::IoError("passkey --out: cannot write " + tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return Status::IoError("passkey --out: cannot rename " + tmp + " to " + path + ": " + ec.message());
  return Status::Ok();
}

Result<nlohmann::json> RunPasskey(const PasskeyOptions& o) {
  if (o.trials == 0 || o.chunk == 0) return Status::InvalidArgument("passkey: --trials and --chunk must be >= 1");
  if (o.resume && o.out_path.empty()) return Status::InvalidArgument("passkey: --resume needs --out FILE");
  KV_ASSIGN_OR_RETURN(std::vector<double> depths, ParseDepths(o.depths));
  const nlohmann::json settings = RunSettings(o, depths);
  nlohmann::json out = settings;
  out["complete"] = false;
  out["results"] = nlohmann::json::array();
  if (o.resume) {
    KV_ASSIGN_OR_RETURN(nlohmann::json doc, LoadForResume(o.out_path, settings));
    out["results"] = std::move(doc["results"]);
  } else if (!o.out_path.empty() && std::filesystem::exists(o.out_path)) {
    return Status::FailedPrecondition("passkey --out: " + o.out_path +
                                 " exists; --resume continues it (or remove it to start again)");
  }
  KV_ASSIGN_OR_RETURN(std::unique_ptr<model::LoadedModel> lm, LoadForPasskey(o));
  model::Decoder decoder(lm->model(), std::max(1u, o.threads));
  KV_ASSIGN_OR_RETURN(model::KvBackendOptions kv, model::ParseKvBackendOptions(o.kv_format, o.layout, o.backend,
                                                                               o.block_size));
  KV_ASSIGN_OR_RETURN(kv.eviction, model::ParseEvictionSpec(o.eviction));
  kv.max_chunk_tokens = o.chunk;
  kv.attention_pool = decoder.thread_pool();
  KV_ASSIGN_OR_RETURN(PromptParts parts, MakeParts(*lm, o.context));
  // What the cache spends at a prompt of `tokens` (every trial's is as long).
  auto put_bits = [&](size_t tokens) {
    const uint32_t n = static_cast<uint32_t>(tokens);
    out["cache_bits_per_value"] = model::CacheBits(decoder.attention_shape(), kv, n).mean();
    if (kv.eviction.enabled()) {
      out["kept_positions"] = std::min(n, kv.eviction.kept());
    }
  };
  // What each answer records of the code it ran on: the bf16 kernel only
  // where the loaded weights take bf16 inputs (a llama2.c checkpoint's
  // products are f32 whatever --matmul says).
  nlohmann::json ran_on = {{"simd_target", SimdTarget()}};
  if (lm->model().classifier().inputs == model::MatMulInputs::kBf16) {
    ran_on["bf16_kernel"] = model::Bf16KernelName(model::PreferredBf16Kernel());
  }
  std::mt19937 rng(o.seed);
  std::uniform_int_distribution<int> digits(10000, 99999);
  const auto start = std::chrono::steady_clock::now();
  for (size_t di = 0; di < depths.size(); ++di) {
    const double depth = depths[di];
    if (di == out["results"].size()) {
      out["results"].push_back({{"depth", depth}, {"found", 0}, {"accuracy", 0.0},
                                {"answers", nlohmann::json::array()}});
    }
    nlohmann::json& r = out["results"][di];
    nlohmann::json& answers = r["answers"];
    const size_t done = answers.size();
    // The keys of the trials already done, drawn again: the same seed gives
    // the same keys, or the document is not this run's.
    uint32_t found = 0;
    for (size_t t = 0; t < done; ++t) {
      const std::string key = std::to_string(digits(rng));
      if (answers[t]["key"] != key) {
        return Status::InvalidArgument("passkey --resume: " + o.out_path + ": trial " + std::to_string(t + 1) +
                                       " at depth " + fmt::format("{:g}", depth) + " has key " +
                                       answers[t]["key"].dump() + ", the seed draws " + key);
      }
      found += answers[t]["found"].get<bool>();
    }
    if (done == o.trials) continue;
    const size_t before = FillerBefore(parts, depth);
    const std::vector<int32_t> prefix = PasskeyPrefix(parts.with_bos, parts.filler, before);
    KV_ASSIGN_OR_RETURN(auto root, model::CreateKvBackend(decoder.attention_shape(), kv));
    KV_RETURN_IF_ERROR(model::PrefillInChunks(decoder, *root, prefix, o.chunk));
    for (uint32_t t = static_cast<uint32_t>(done); t < o.trials; ++t) {
      const std::string key = std::to_string(digits(rng));
      KV_ASSIGN_OR_RETURN(std::vector<int32_t> rest, PromptRest(*lm, parts, before, key));
      KV_ASSIGN_OR_RETURN(auto seq, root->Fork());
      // All but the prompt's last token in chunks; Generate runs that one
      // and answers greedily.
      KV_RETURN_IF_ERROR(model::PrefillInChunks(
          decoder, *seq, std::span<const int32_t>(rest).first(rest.size() - 1), o.chunk));
      const std::vector<int32_t> prompt = Joined(prefix, rest);
      model::GenerateOptions g;
      g.max_new_tokens = o.answer_tokens;
      g.stop_at_eos = false;
      KV_ASSIGN_OR_RETURN(model::GenerateResult answered, model::Generate(decoder, *seq, prompt, g));
      const std::vector<int32_t>& answer = answered.tokens;
      KV_ASSIGN_OR_RETURN(std::string text, lm->Decode(answer));
      const bool ok = AnswerHoldsKey(text, key);
      found += ok;
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      fmt::print(stderr, "passkey: depth {:g}, trial {}/{}: key {} {} ({} found), {:.0f} s\n", depth, t + 1,
                 o.trials, key, ok ? "found" : "missed", found, secs);
      answers.push_back({{"key", key}, {"answer", text}, {"answer_ids", answer}, {"found", ok},
                         {"prompt_tokens", prompt.size()}, {"key_at", prefix.size()}});
      answers.back().update(ran_on);
      if (kv.eviction.enabled()) {
        KV_ASSIGN_OR_RETURN(const std::vector<int32_t> sentence, KeySentence(*lm, parts, key));
        answers.back()["key_rows_kept"] = KeyRowsKept(*seq, prefix.size(), sentence.size());
      }
      put_bits(prompt.size());
      r["found"] = found;
      r["accuracy"] = static_cast<double>(found) / static_cast<double>(answers.size());
      if (!o.out_path.empty()) KV_RETURN_IF_ERROR(WriteAtomically(o.out_path, out));
    }
  }
  // A resumed document whose trials were all done before gets the figures
  // from its first answer's prompt.
  if (!out.contains("cache_bits_per_value") && !out["results"].empty() && !out["results"][0]["answers"].empty()) {
    const nlohmann::json& tokens = out["results"][0]["answers"][0]["prompt_tokens"];
    if (tokens.is_number_unsigned()) put_bits(tokens.get<size_t>());
  }
  out["complete"] = true;
  if (!o.out_path.empty()) KV_RETURN_IF_ERROR(WriteAtomically(o.out_path, out));
  return out;
}

const bool kRegistered = RegisterOptionsCommand<PasskeyOptions>(
    "passkey", "Long-context retrieval: a pass key stated once at a depth of the context, asked for at the end",
    [](CLI::App* app, PasskeyOptions& o) {
      app->add_option("--model", o.model_path, "GGUF file, or llama2.c v1 checkpoint")->required();
      app->add_option("--tokenizer", o.tokenizer_path, "llama2.c tokenizer.bin (not for GGUF)");
      app->add_option("--context", o.context, "Tokens of the prompt")->capture_default_str();
      app->add_option("--depths", o.depths, "Where the key sits, fractions of the filler")->capture_default_str();
      app->add_option("--trials", o.trials, "Keys per depth")->capture_default_str();
      app->add_option("--threads", o.threads, "Decoder threads")->capture_default_str();
      app->add_option("--chunk", o.chunk, "Prefill chunk in tokens")->capture_default_str();
      app->add_option("--seed", o.seed, "Seed of the keys")->capture_default_str();
      app->add_option("--answer-tokens", o.answer_tokens,
                      "Tokens the model answers with (greedy); a trial finds the key when they hold it")
          ->capture_default_str();
      app->add_option("--matmul", o.matmul, kMatMulHelp)->capture_default_str();
      app->add_option("--eviction", o.eviction, "streaming:SINKS,WINDOW | h2o:BUDGET,RECENT (bounded cache)");
      AddKvBackendFlags(app, o.kv_format, o.layout, o.block_size, o.backend);
      app->add_flag("--json", o.json, "Print JSON (with every answer)");
      app->add_option("--out", o.out_path,
                      "Keep the JSON document in this file, rewritten after every trial (\"complete\": false "
                      "until the last)");
      app->add_flag("--resume", o.resume,
                    "Continue the document --out holds (the same settings but --threads and --chunk): "
                    "its trials are kept, the rest run");
      app->add_option("--prompt-key", o.prompt_key,
                      "Print the prompt of this key at each depth as token ids (JSON) and run nothing");
    },
    [](const PasskeyOptions& o) {
      if (!o.prompt_key.empty()) {
        return PrintResult("passkey", PrintPrompts(o), /*json=*/false,
                           [](const nlohmann::json& p) { fmt::print("{}\n", p.dump()); });
      }
      return PrintResult("passkey", RunPasskey(o), o.json, [&o](const nlohmann::json& r) {
        for (const auto& d : r["results"]) {
          fmt::print("context {} kv {} eviction {}: depth {:.2f}: {}/{} keys retrieved\n", o.context, o.kv_format,
                     r["eviction"].get<std::string>(), d["depth"].get<double>(), d["found"].get<uint32_t>(),
                     o.trials);
        }
      });
    });

}  // namespace
}  // namespace kvcache::tools
