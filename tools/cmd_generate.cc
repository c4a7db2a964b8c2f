// `kvcache generate`: stream a story from the reference decoder (model/)
// with its K/V in a kvcache cache of the chosen format and layout, optionally
// with speculative decoding (--draft N: N drafted tokens -- by n-gram lookup
// in the context, or by the model's first --draft-layers layers with
// --draft-kind layers -- verified in one multi-token pass). --json prints one JSON object instead of streaming.
//
// --tiers SPEC (offload tiers, docs/tiers.md "Sharing a tier across two
// processes"): the K/V live in a sequence of the engine's KV manager
// (engine/kv_manager.h: a BlockPool with a prefix cache and an OffloadCache
// over the tiers), as a served request's do. Before the prefill the prompt's
// longest cached prefix is looked up (the pool, then the tiers in order),
// its blocks are adopted into the sequence instead of being recomputed, and
// only the rest of the prompt is run. After generation the prompt's full
// blocks (with --publish-generated also the generated tokens' full blocks)
// are published and written to the tiers, and the writes are flushed before
// the process exits, so the next process finds them. The lookup covers the
// prompt minus its last token: the model must run at least one position to
// give the first token's distribution. Blocks are keyed by a compatibility
// digest of the model fingerprint (model/io/model_fingerprint.h: XXH3-128 of
// the model file) with --weights, the geometry, --block-size, --kv-format
// and the pool's rotation: another model or format never hits.
//
// Defaults: a bf16 cache and the products `--matmul auto` picks on this CPU
// (tools/kv_flags.h), as `serve` has them, so the two give the same tokens;
// a header line on stderr says what was chosen and why (JSON: "matmul" the
// products run, "choice" that line). `--kv-format f32 --matmul f32` is the
// exact path.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>

#include "engine/kv_manager.h"
#include "kvcache/npy.h"
#include "kvcache/serving/offload.h"
#include "model/decoder/decoder.h"
#include "model/decoder/loaded_model.h"
#include "model/generate/generate.h"
#include "model/io/model_fingerprint.h"
#include "model/kv/kv_factory.h"
#include "model/tokenizer/unicode_classes.h"
#include "tools/command.h"
#include "tools/kv_flags.h"
#include "tools/tier_json.h"

namespace kvcache::tools {
namespace {

struct GenerateCliOptions {
  std::string model_path, tokenizer_path, prompt, prompt_file, prompt_ids;
  bool chat = false;
  uint32_t threads = 2;
  std::string weights = "quantized";
  std::string matmul = kDefaultMatMul;
  uint32_t steps = 256;
  double temperature = 0.0;
  uint64_t seed = 42;
  std::string kv_format = kDefaultKvFormat;
  bool kv_format_given = false;
  std::string layout = "contiguous";
  std::string backend = "cache";
  uint32_t block_size = 16;
  uint32_t draft = 0;
  std::string draft_kind = "ngram";
  uint32_t draft_layers = 2;
  bool json = false;
  std::string tiers;        // offload tier spec; empty = none
  bool layout_given = false;
  bool publish_generated = false;
  std::string logits_out;   // .npy of every sampled distribution
};

using Clock = std::chrono::steady_clock;
double SecondsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The offload path of --tiers: the KV manager (a pool, its prefix cache and
// the tiers) and the sequence on it, destroyed first (it holds pool blocks).
struct TierRun {
  std::unique_ptr<engine::KvManager> manager;
  std::unique_ptr<engine::KvSequence> seq;  // destroyed first (member order)
  std::string fingerprint;
  double fingerprint_seconds = 0;
  double lookup_seconds = 0;
  std::vector<uint64_t> served;  // [0] pool, [1 + t] tier t: prompt tokens
  size_t published_blocks = 0;
};

// "pool", then each tier's name (a repeated name gets "#<position>").
std::vector<std::string> ServedNames(const engine::KvManager* manager) {
  std::vector<std::string> names = {"pool"};
  if (manager == nullptr) return names;
  for (const TierStats& t : manager->tier_stats().tiers) {
    std::string n = t.name;
    if (std::find(names.begin(), names.end(), n) != names.end()) {
      n += "#" + std::to_string(names.size());
    }
    names.push_back(std::move(n));
  }
  return names;
}

Result<std::unique_ptr<TierRun>> OpenTiers(const GenerateCliOptions& o, const MatMulPick& products,
                                           const model::AttentionShape& shape, const model::KvBackendOptions& kv,
                                           ThreadPool* attention_pool) {
  if (kv.kind != model::BackendKind::kCache) {
    return Status::InvalidArgument("--tiers needs --backend cache");
  }
  if (kv.eviction.enabled()) return Status::InvalidArgument("--tiers does not combine with eviction");
  auto run = std::make_unique<TierRun>();
  const Clock::time_point t0 = Clock::now();
  KV_ASSIGN_OR_RETURN(std::string fp, model::ModelFingerprint(o.model_path));
  // --weights f32 decodes the weights at load: the same products by
  // contract, but keep the two apart rather than rely on it. The products
  // by what runs, not the flag's spelling (`auto` differs by CPU).
  run->fingerprint = fp + ";weights=" + o.weights +
                     (products.inputs == model::MatMulInputs::kF32 ? "" : ";matmul=" + products.name());
  run->fingerprint_seconds = SecondsBetween(t0, Clock::now());
  engine::KvManagerOptions m;
  m.formats = kv.formats;
  m.window = kv.window;
  m.block_size = kv.block_size;
  // One sequence, its copy-on-write copies, and room to load a prefix.
  m.pool_blocks = 2 * ((shape.max_seq_len + kv.block_size - 1) / kv.block_size) + 2;
  m.tiers = o.tiers;
  m.model_id = run->fingerprint;
  KV_ASSIGN_OR_RETURN(run->manager, engine::KvManager::Create(shape, attention_pool, m));
  return run;
}

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
  return o.chat ? m.EncodeChat(text) : m.Encode(text, /*parse_special=*/true);
}

int RunGenerate(const GenerateCliOptions& o) {
  if (o.weights != "quantized" && o.weights != "f32") {
    return Fail(Status::InvalidArgument("unknown --weights '" + o.weights + "' (want quantized or f32)"));
  }
  model::GgufLoadOptions load;
  load.dequantize_at_load = o.weights == "f32";
  auto picked = PickMatMul(o.matmul);
  if (!picked.ok()) return Fail(picked.status());
  const MatMulPick& products = *picked;
  load.matmul_inputs = products.inputs;
  auto files = model::LoadedModel::Load(o.model_path, o.tokenizer_path, load);
  if (!files.ok()) return Fail(files.status());
  const model::LoadedModel& lm = **files;
  auto parsed = model::ParseKvBackendOptions(o.kv_format, o.layout, o.backend, o.block_size);
  if (!parsed.ok()) return Fail(parsed.status());
  model::KvBackendOptions kv_options = *parsed;
  // A precision window keeps enough rows for a rejected draft to leave it as
  // plain decoding has it (cache.h, PrecisionWindow::slack).
  if (kv_options.window.recent > 0) kv_options.window.slack = std::max(kv_options.window.slack, o.draft);
  // The spelling given when it says more than a pair (a window, per-group formats).
  const std::string kv_name = o.kv_format.find_first_of("+=") != std::string::npos
                                  ? o.kv_format
                                  : std::string(FormatPairName(kv_options.formats));
  const std::string choice = ChoiceText(kv_name, o.kv_format_given, products);
  if (!o.json) fmt::print(stderr, "kvcache generate: {}\n", choice);
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
  std::unique_ptr<TierRun> tier_run;
  Result<std::unique_ptr<model::KvBackend>> kv = Status::Internal("no kv backend");
  model::KvBackend* backend = nullptr;  // kv's, or tier_run's sequence's
  size_t adopted_blocks = 0;  // the prompt's prefix blocks adopted from the pool or the tiers
  Clock::time_point start = Clock::now();
  if (!o.tiers.empty()) {
    if (o.layout_given && kv_options.layout != CacheLayout::kPaged) {
      return Fail(Status::InvalidArgument("--tiers needs the paged layout (--layout paged, or no --layout)"));
    }
    auto opened = OpenTiers(o, products, shape, kv_options, decoder.thread_pool());
    if (!opened.ok()) return Fail(opened.status());
    tier_run = std::move(*opened);
    // The sequence, adopting the longest cached prefix of the prompt but its last token.
    start = Clock::now();
    engine::KvAdmission found;
    auto admitted = tier_run->manager->Admit(prompt, &found);
    if (!admitted.ok()) return Fail(admitted.status());
    if (!found.adopt_error.ok()) return Fail(found.adopt_error);
    tier_run->seq = std::move(*admitted);
    tier_run->served = std::move(found.served);
    backend = tier_run->seq.get();
    adopted_blocks = tier_run->seq->cached_tokens() / kv_options.block_size;
    tier_run->lookup_seconds = SecondsBetween(start, Clock::now());
  } else {
    model::KvBackendOptions with_threads = kv_options;
    with_threads.attention_pool = decoder.thread_pool();
    kv = model::CreateKvBackend(shape, with_threads);
    if (!kv.ok()) return Fail(kv.status());
    backend = kv->get();
  }

  model::GenerateOptions g;
  g.max_new_tokens = o.steps;
  // The hybrid cache (window layers, eviction) takes passes of at most
  // max_chunk_tokens: a longer prompt runs in chunks of that size.
  if (shape.has_windows() || kv_options.eviction.enabled()) g.prefill_chunk_tokens = kv_options.max_chunk_tokens;
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
  // The first distribution is ready: the time to the first token.
  std::optional<Clock::time_point> first_token_at;
  std::vector<float> dumped;
  size_t dumped_rows = 0;
  g.on_logits = [&](std::span<const float> logits) {
    if (!first_token_at) first_token_at = Clock::now();
    if (!o.logits_out.empty()) {
      dumped.insert(dumped.end(), logits.begin(), logits.end());
      ++dumped_rows;
    }
  };
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
  if (tier_run == nullptr) start = Clock::now();
  auto r = model::Generate(decoder, *backend, prompt, g);
  if (!r.ok()) {
    if (!o.json) fmt::print("\n");
    return Fail(r.status());
  }
  const double ttft = first_token_at ? SecondsBetween(start, *first_token_at) : 0.0;
  if (!o.logits_out.empty()) {
    const uint64_t shape2[2] = {dumped_rows, lm.model().config().vocab_size};
    Status w = WriteNpy(o.logits_out, shape2, dumped);
    if (!w.ok()) return Fail(w);
  }
  if (tier_run != nullptr) {
    // Publish the committed full blocks (the prompt's; with
    // --publish-generated also those the generated tokens filled) and write
    // them to the tiers before exiting. The sequence holds every committed
    // position.
    std::vector<int32_t> committed = prompt;
    if (o.publish_generated) committed.insert(committed.end(), r->tokens.begin(), r->tokens.end());
    std::vector<BlockHash> hashes;
    auto published = tier_run->manager->Publish(*tier_run->seq, committed, &hashes);
    if (!published.ok()) return Fail(published.status());
    tier_run->published_blocks = *published > adopted_blocks ? *published - adopted_blocks : 0;
    tier_run->manager->FlushTiers();
  }
  const std::vector<std::string> served_names = ServedNames(tier_run ? tier_run->manager.get() : nullptr);
  std::vector<uint64_t> served = tier_run ? tier_run->served : std::vector<uint64_t>{0};
  served.resize(served_names.size(), 0);
  size_t prefix_tokens = 0;
  for (uint64_t n : served) prefix_tokens += n;
  const double tps = r->decode_seconds > 0 ? r->tokens.size() / r->decode_seconds : 0.0;
  const size_t cpu_tokens = r->tokens.size() > tokens_at_cpu0 ? r->tokens.size() - tokens_at_cpu0 : 0;
  const double cpu_ms = cpu_tokens ? 1000 * (cpu_now(CLOCK_PROCESS_CPUTIME_ID) - cpu0) / cpu_tokens : 0;
  const double thread_cpu_ms =
      cpu_tokens ? 1000 * (cpu_now(CLOCK_THREAD_CPUTIME_ID) - thread_cpu0) / cpu_tokens : 0;
  if (!o.json) {
    fmt::print("\n");
    fmt::print(stderr, "[{} prompt tokens in {:.2f} s, {} tokens, {:.1f} tok/s ({:.1f} ms/token), kv {} {}, {} threads",
               prompt.size(), r->prefill_seconds, r->tokens.size(), tps, tps > 0 ? 1000.0 / tps : 0.0,
               kv_name, tier_run ? "paged" : o.layout, decoder_threads(o));
    if (o.draft > 0) {
      fmt::print(stderr, ", {} draft of {}: {}/{} accepted ({:.1f}%), {} verify passes",
                 o.draft_kind, o.draft,
                 r->accepted_tokens, r->drafted_tokens, 100.0 * r->acceptance_rate(),
                 r->forward_passes);
    }
    fmt::print(stderr, ", decode CPU {:.1f} ms/token (calling thread {:.1f})", cpu_ms, thread_cpu_ms);
    if (tier_run != nullptr) {
      fmt::print(stderr, ", prefix {} of {} prompt tokens (", prefix_tokens, prompt.size());
      for (size_t i = 0; i < served.size(); ++i) {
        fmt::print(stderr, "{}{} {}", i ? ", " : "", served_names[i], served[i]);
      }
      fmt::print(stderr, "), first token after {:.3f} s, {} blocks published", ttft,
                 tier_run->published_blocks);
    }
    fmt::print(stderr, "]\n");
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
  j["kv_format"] = kv_name;
  j["layout"] = tier_run ? "paged" : o.layout;  // --tiers runs paged
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
  j["matmul"] = products.name();
  j["choice"] = choice;
  j["forward_passes"] = r->forward_passes;
  // Prompt tokens whose K/V came from a cache instead of the model, by
  // source ({"pool": 0} without --tiers), and what the prefill then ran.
  nlohmann::json by_tier = nlohmann::json::object();
  for (size_t i = 0; i < served.size(); ++i) by_tier[served_names[i]] = served[i];
  j["prefix_tokens_by_tier"] = by_tier;
  j["prefix_tokens"] = prefix_tokens;
  j["prefill_tokens"] = r->prompt_tokens;
  // From the prefix lookup (or the prefill) to the first token's logits.
  j["time_to_first_token_seconds"] = ttft;
  if (tier_run != nullptr) {
    j["block_size"] = kv_options.block_size;
    j["model_fingerprint"] = tier_run->fingerprint;
    j["fingerprint_seconds"] = tier_run->fingerprint_seconds;
    j["tier_lookup_seconds"] = tier_run->lookup_seconds;
    j["published_blocks"] = tier_run->published_blocks;
    const OffloadStats st = tier_run->manager->tier_stats();
    nlohmann::json tiers = nlohmann::json::array();
    for (const TierStats& t : st.tiers) tiers.push_back(TierStatsJson(t));
    j["tiers"] = tiers;
    j["dropped_queue_full"] = st.dropped_queue_full;
  }
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
      auto* text = app->add_option("--prompt", o->prompt,
                                   "Prompt text (special-token texts such as <start_of_turn> are read as their tokens)");
      auto* file = app->add_option("--prompt-file", o->prompt_file, "Prompt text from a file (read as --prompt is)");
      auto* ids = app->add_option("--prompt-ids", o->prompt_ids, "Prompt as token ids: 1,2,3");
      text->excludes(file)->excludes(ids);
      file->excludes(ids);
      app->add_flag("--chat", o->chat, "Wrap the prompt as a user turn in the model's chat template");
      app->add_option("--threads", o->threads, "Threads for the weight products")->capture_default_str();
      app->add_option("--weights", o->weights, "quantized (as stored) | f32 (decoded at load)")
          ->capture_default_str();
      app->add_option("--matmul", o->matmul,
                      kMatMulHelp)
          ->capture_default_str();
      app->callback([app, o] {
        o->layout_given = app->count("--layout") > 0;
        o->kv_format_given = app->count("--kv-format") > 0;
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
      app->add_option("--tiers", o->tiers,
                      "Offload tiers for the prompt's prefix blocks, in order: "
                      "host:4GiB,disk:PATH:20GiB,redis://127.0.0.1:6379 (docs/tiers.md; paged layout)");
      app->add_flag("--publish-generated", o->publish_generated,
                    "With --tiers: also store the generated tokens' full blocks");
      app->add_option("--logits-out", o->logits_out,
                      "Write every sampled distribution's logits as .npy [n][vocab] f32 "
                      "(the prefill's last position first)");
      return [o] { return RunGenerate(*o); };
    });

}  // namespace
}  // namespace kvcache::tools
