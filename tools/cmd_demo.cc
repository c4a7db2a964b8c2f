// `kvcache demo`: the main job that ./run.sh demo runs. On SmolLM2-135M-
// Instruct (the GGUF that scripts/fetch_model.sh fetches) it answers a chat
// prompt with the K/V in kvcache (plain and speculative, which must agree),
// prints perplexity and KL per KV format on GPL-3 text with the memory each
// format needs for the model's 8k context, and then simulates a chat
// workload on a 1 GiB pool for a Llama-3-8B geometry across formats.
// --model-dir runs the first part on stories260K instead.
#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "kvcache/format.h"
#include "model/io/model_store.h"
#include "tools/cmd_simulate.h"
#include "tools/command.h"
#include "tools/demo_report.h"

namespace kvcache::tools {
namespace {

struct DemoOptions {
  std::string model = model::SmolLm2Path();
  std::string model_dir;  // set: stories260K from this folder instead
  uint32_t threads = 2;
};

// The first `bytes` of GPL-3 (every Debian machine has it), or "" if absent.
std::string Gpl3Prefix(size_t bytes) {
  std::ifstream in("/usr/share/common-licenses/GPL-3", std::ios::binary);
  std::string s(bytes, '\0');
  in.read(s.data(), static_cast<std::streamsize>(bytes));
  s.resize(static_cast<size_t>(in.gcount()));
  return s;
}

int RunDemo(const DemoOptions& o) {
  DemoReportOptions report;
  if (!o.model_dir.empty()) {
    fmt::print("== 1. A story from stories260K, its K/V in kvcache ==\n\n");
    report.model_path = o.model_dir + "/stories260K_v1.bin";
    report.tokenizer_path = o.model_dir + "/tokenizer.bin";
  } else {
    fmt::print("== 1. SmolLM2-135M-Instruct (GGUF Q4_1) answering, its K/V in kvcache ==\n\n");
    report.model_path = o.model;
    report.chat = true;
    report.prompt = "What is a key-value cache in a language model? Answer in two sentences.";
    report.story_tokens = 64;
    report.threads = o.threads;
    report.text = Gpl3Prefix(1600);
    report.text_name = "GPL-3";
    report.max_table_tokens = 320;
    report.prefill_tokens = 64;
    report.chunk_tokens = 16;
    report.formats = DefaultDemoFormats();
    for (const char* mixed : {"q8_0:q4_0", "q8_0:turbo4", "bf16:turbo3"}) {
      report.formats.push_back(*ParseFormatPair(mixed));
    }
    for (const char* w : {"turbo4+s4+r120", "turbo3+s4+r120", "turbo2+s4+r112", "q8_0+s4+r112",
                          "turbo4i+s4+r120", "turbo3i+s4+r120", "turbo2i+s4+r112"}) {
      report.windows.push_back(*model::ParseKvVariant(w));
    }
  }
  std::fflush(stdout);
  const Status s = PrintDemoReport(report, stdout);
  if (!s.ok()) {
    fmt::print(stderr, "kvcache demo: {}\n", s.ToString());
    return 1;
  }
  fmt::print("\n== 2. Serving: how many requests 1 GiB of KV memory holds, per format ==\n\n");
  std::fflush(stdout);
  return RunServingDemo(stdout);
}

const bool kRegistered = RegisterOptionsCommand<DemoOptions>(
    "demo", "SmolLM2 answers a chat prompt on the cache (plain and speculative), quality and memory per KV format, a serving simulation",
    [](CLI::App* app, DemoOptions& o) {
      app->add_option("--model", o.model, "SmolLM2 GGUF (scripts/fetch_model.sh fetches it)")
          ->capture_default_str();
      app->add_option("--model-dir", o.model_dir,
                      "Run on stories260K from this folder (stories260K_v1.bin, tokenizer.bin) instead");
      app->add_option("--threads", o.threads, "Threads for the weight products")->capture_default_str();
    },
    RunDemo);

}  // namespace
}  // namespace kvcache::tools
