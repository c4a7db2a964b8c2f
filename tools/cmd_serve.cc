// `kvcache serve`: the OpenAI-compatible HTTP server (server/http_server.h)
// over one serving engine (engine/engine.h) on one model.
//
// Startup: load the model, create the engine, bind, print
// "kvcache serve: listening on http://HOST:PORT (model M, context N, kv F,
// products P (why))" on stdout (the port is the bound one, so --port 0 picks
// a free port a test can read), serve. The defaults are a bf16 cache and the
// products `--matmul auto` picks on this CPU (tools/kv_flags.h); the line
// says which were defaults and what decided the products.
// --kv-format global=SPEC,local=SPEC gives a model's sliding-window layers
// their own format (EngineOptions::local_formats; refused on a model
// without such layers).
// SIGTERM / SIGINT: new completions get 503, the engine finishes in-flight
// requests for --drain-seconds (cancelling what is left), the responses
// still being written end, the listener closes, exit 0
// (server::OpenAiServer::Shutdown). The signals are taken by one thread with
// sigtimedwait (blocked everywhere else), so no work happens in a handler.
#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "engine/engine.h"
#include "model/decoder/loaded_model.h"
#include "model/io/model_fingerprint.h"
#include "model/kv/kv_factory.h"
#include "server/http_server.h"
#include "tools/command.h"
#include "tools/kv_flags.h"

namespace kvcache::tools {
namespace {

struct ServeCliOptions {
  std::string model_path, tokenizer_path;
  std::string kv_format = kDefaultKvFormat;
  bool kv_format_given = false;
  std::string matmul = kDefaultMatMul;
  MatMulPick products;  // matmul resolved
  uint32_t pool_mib = 512;  // holds SmolLM2's whole 8192-token context twice in bf16 (180 MiB each)
  uint32_t context = 0;  // 0: the model's
  uint32_t drain_seconds = 10;
  bool no_prefix_cache = false;
  engine::EngineOptions engine;
  server::ServerOptions http;
};

int Fail(const Status& s) {
  fmt::print(stderr, "kvcache serve: {}\n", s.ToString());
  return 1;
}

// The engine's options from the flags; the tiers' model fingerprint read
// from the file when tiers are given.
Result<engine::EngineOptions> EngineOptionsFor(const ServeCliOptions& o) {
  engine::EngineOptions e = o.engine;
  KV_ASSIGN_OR_RETURN(model::KvBackendOptions kv,
                      model::ParseKvBackendOptions(o.kv_format, "paged", "cache", e.block_size));
  e.formats = kv.formats;
  e.local_formats = kv.local_formats;
  e.window = kv.window;
  e.pool_bytes = uint64_t{o.pool_mib} << 20;
  e.prefix_cache = !o.no_prefix_cache;
  if (!e.tiers.empty()) {
    KV_ASSIGN_OR_RETURN(e.model_id, model::ModelFingerprint(o.model_path));
    // int8-input products give other K/V than exact ones: keep them apart
    // (by the products run, not the flag's spelling: `auto` differs by CPU).
    if (o.products.inputs != model::MatMulInputs::kF32) e.model_id += ";matmul=" + o.products.name();
  }
  return e;
}

// Waits for SIGTERM / SIGINT (blocked in every thread by RunServe) until
// `done`; on one, drains and stops the server.
void SignalLoop(const std::atomic<bool>& done, server::OpenAiServer& http, std::chrono::milliseconds drain) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  const timespec poll{0, 200'000'000};
  while (!done.load()) {
    const int sig = sigtimedwait(&set, nullptr, &poll);
    if (sig != SIGTERM && sig != SIGINT) continue;
    fmt::print(stderr, "kvcache serve: signal {}: draining for up to {} ms\n", sig, drain.count());
    http.Shutdown(drain);
    return;
  }
}

int RunServe(ServeCliOptions o) {
  // Before any thread exists: the signals go to SignalLoop only, and a
  // closed connection is a failed write, not SIGPIPE.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);

  model::GgufLoadOptions load;
  load.max_seq_len = o.context;
  auto products = PickMatMul(o.matmul);
  if (!products.ok()) return Fail(products.status());
  o.products = *products;
  load.matmul_inputs = o.products.inputs;
  auto lm = model::LoadedModel::Load(o.model_path, o.tokenizer_path, load);
  if (!lm.ok()) return Fail(lm.status());
  auto options = EngineOptionsFor(o);
  if (!options.ok()) return Fail(options.status());
  auto eng = engine::Engine::Create(**lm, *options);
  if (!eng.ok()) {
    // A pool too small for one full-context sequence: say which flags size it.
    if (eng.status().message().find("pool") == std::string::npos) return Fail(eng.status());
    return Fail(Status(eng.status().code(),
                       eng.status().message() + " (see --pool-mib, --context, --kv-format, --block-size)"));
  }
  if (o.http.model_name.empty()) o.http.model_name = std::filesystem::path(o.model_path).stem().string();
  server::OpenAiServer http(**eng, o.http);
  if (Status s = http.Bind(); !s.ok()) return Fail(s);
  fmt::print("kvcache serve: listening on http://{}:{} (model {}, context {}, {})\n", o.http.host, http.port(),
             o.http.model_name, (*lm)->model().config().max_seq_len,
             ChoiceText(o.kv_format, o.kv_format_given, o.products));
  std::fflush(stdout);
  std::atomic<bool> done{false};
  std::thread signals(SignalLoop, std::cref(done), std::ref(http),
                      std::chrono::milliseconds(uint64_t{o.drain_seconds} * 1000));
  const Status run = http.Run();
  done.store(true);
  signals.join();
  (*eng)->Shutdown(std::chrono::milliseconds(0));
  if (!run.ok()) return Fail(run);
  fmt::print(stderr, "kvcache serve: stopped\n");
  return 0;
}

void AddOptions(CLI::App* app, ServeCliOptions* o) {
  app->add_option("--model", o->model_path, "GGUF file, or llama2.c v1 checkpoint")->required();
  app->add_option("--tokenizer", o->tokenizer_path, "llama2.c tokenizer.bin (not for GGUF)");
  app->add_option("--model-name", o->http.model_name, "The model id clients see (default: the file's stem)");
  app->add_option("--host", o->http.host, "Address to bind")->capture_default_str();
  app->add_option("--port", o->http.port, "Port to bind (0: any free one)")->capture_default_str();
  app->add_option("--kv-format", o->kv_format,
                  "K:V cache format (or one name for both), with a precision window: turbo4+s4+r120; "
                  "per layer group on a model with sliding-window layers: global=turbo4+s4+r120,local=q8_0")
      ->capture_default_str();
  app->add_option("--pool-mib", o->pool_mib, "Block pool size, MiB")->capture_default_str();
  app->add_option("--block-size", o->engine.block_size, "Paged block size in tokens")->capture_default_str();
  app->add_option("--matmul", o->matmul,
                  kMatMulHelp)
      ->capture_default_str();
  app->add_option("--context", o->context, "Sequence capacity in tokens (0: the model's)")->capture_default_str();
  app->add_option("--max-batch-tokens", o->engine.max_batch_tokens, "Tokens per engine step")
      ->capture_default_str();
  app->add_option("--max-running", o->engine.max_running, "Requests in one step")->capture_default_str();
  app->add_option("--max-waiting", o->engine.max_waiting, "Queued requests before 503")->capture_default_str();
  app->add_option("--threads", o->engine.threads, "Decoder threads")->capture_default_str();
  app->add_option("--tiers", o->engine.tiers, "Offload tiers, as `generate --tiers` takes them");
  app->add_flag("--no-prefix-cache", o->no_prefix_cache, "Do not reuse or publish prompt blocks");
  app->add_option("--api-key", o->http.api_key, "Require Authorization: Bearer KEY on /v1/*")
      ->envname("KVCACHE_API_KEY");
  app->add_option("--max-body-bytes", o->http.max_body_bytes, "Largest request body (413 beyond)")
      ->capture_default_str();
  app->add_option("--http-threads", o->http.http_threads, "Connections served at once")->capture_default_str();
  app->add_option("--keep-alive", o->http.keep_alive_seconds,
                  "Seconds an idle connection stays open for another request (0: one request per connection)")
      ->capture_default_str()
      ->check(CLI::Range(0, 3600));
  app->add_option("--http-queue", o->http.http_queue, "Connections waiting for an HTTP thread before 503")
      ->capture_default_str();
  app->add_option("--drain-seconds", o->drain_seconds, "On SIGTERM: time in-flight requests get to finish")
      ->capture_default_str();
}

const bool kRegistered = RegisterCommand(
    "serve", "OpenAI-compatible HTTP server (chat/completions, completions, models, metrics)",
    [](CLI::App* app) -> Runner {
      auto o = std::make_shared<ServeCliOptions>();
      o->http.model_name.clear();
      AddOptions(app, o.get());
      app->callback([app, o] { o->kv_format_given = app->count("--kv-format") > 0; });
      return [o] { return RunServe(*o); };
    });

}  // namespace
}  // namespace kvcache::tools
