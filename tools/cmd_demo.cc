// `kvcache demo`: the main job that ./run.sh demo runs. It generates a short
// story with the reference decoder on the cache (plain and speculative, which
// must agree), prints perplexity and KL per KV format, and then simulates a
// chat workload on a 1 GiB pool for a Llama-3-8B geometry across formats.
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <string>

#include "model/demo_report.h"
#include "tools/cmd_simulate.h"
#include "tools/command.h"

namespace kvcache::tools {
namespace {

struct DemoOptions {
  std::string model_dir = KVCACHE_DEFAULT_MODEL_DIR;
};

int RunDemo(const DemoOptions& o) {
  fmt::print("== 1. A story from stories260K, its K/V in kvcache ==\n\n");
  std::fflush(stdout);
  model::DemoReportOptions report;
  report.model_path = o.model_dir + "/stories260K_v1.bin";
  report.tokenizer_path = o.model_dir + "/tokenizer.bin";
  const Status s = model::PrintDemoReport(report, stdout);
  if (!s.ok()) {
    fmt::print(stderr, "kvcache demo: {}\n", s.ToString());
    return 1;
  }
  fmt::print("\n== 2. Serving: how many requests 1 GiB of KV memory holds, per format ==\n\n");
  std::fflush(stdout);
  return RunServingDemo(stdout);
}

const bool kRegistered = RegisterCommand(
    "demo", "The main job: a story on the cache, quality per format, a serving simulation",
    [](CLI::App* app) -> Runner {
      auto o = std::make_shared<DemoOptions>();
      app->add_option("--model-dir", o->model_dir,
                      "Folder with stories260K_v1.bin and tokenizer.bin")
          ->capture_default_str();
      return [o] { return RunDemo(*o); };
    });

}  // namespace
}  // namespace kvcache::tools
