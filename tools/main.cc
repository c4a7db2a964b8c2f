// The kvcache command-line tool: builds the CLI11 tree from the registry,
// parses, and runs the one selected command.
//
// Global options (accepted before or after the subcommand):
//   --simd-target NAME  restrict kernel dispatch to one SIMD target
//                       (kvcache::UseSimdTarget; `kvcache info` lists them).
#include <fmt/format.h>

#include <map>
#include <sstream>

#include "kvcache/simd.h"
#include "tools/command.h"

namespace kvcache::tools {

std::vector<CommandSpec>& Registry() {
  static std::vector<CommandSpec> registry;
  return registry;
}

bool RegisterCommand(std::string name, std::string description, Configure configure) {
  Registry().push_back({std::move(name), std::move(description), std::move(configure)});
  return true;
}

namespace {
// The help line of a command group ("bench"): its commands' names.
std::string GroupDescription(const std::string& group) {
  std::string names;
  const std::string prefix = group + " ";
  for (const CommandSpec& spec : Registry()) {
    if (spec.name.starts_with(prefix)) {
      names += (names.empty() ? "" : ", ") + spec.name.substr(prefix.size());
    }
  }
  return (group == "bench" ? "Benchmarks: " : "Commands: ") + names;
}
}  // namespace

}  // namespace kvcache::tools

int main(int argc, char** argv) {
  using namespace kvcache::tools;
  CLI::App app{"kvcache: the key/value cache of LLM inference"};
  app.require_subcommand(1);
  std::string simd_target;
  app.add_option("--simd-target", simd_target,
                 "Run every kernel on this SIMD target (one of `kvcache info`'s simd_targets)");
  app.fallthrough();  // subcommands inherit it: the option may follow the command words

  std::map<std::string, CLI::App*> nodes;  // "bench" -> its App
  std::vector<std::pair<CLI::App*, Runner>> runners;
  for (const CommandSpec& spec : Registry()) {
    CLI::App* parent = &app;
    std::istringstream words(spec.name);
    std::string word, path;
    std::vector<std::string> parts;
    while (words >> word) parts.push_back(word);
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      path += (path.empty() ? "" : " ") + parts[i];
      auto it = nodes.find(path);
      if (it == nodes.end()) {
        CLI::App* node = parent->add_subcommand(parts[i], GroupDescription(parts[i]));
        node->require_subcommand(1);
        it = nodes.emplace(path, node).first;
      }
      parent = it->second;
    }
    CLI::App* sub = parent->add_subcommand(parts.back(), spec.description);
    runners.emplace_back(sub, spec.configure(sub));
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (!simd_target.empty()) {
    if (const kvcache::Status s = kvcache::UseSimdTarget(simd_target); !s.ok()) {
      fmt::print(stderr, "kvcache: --simd-target: {}\n", s.ToString());
      return 2;
    }
  }
  for (auto& [sub, runner] : runners) {
    if (sub->parsed()) return runner();
  }
  return 1;
}
