// Registry of kvcache subcommands. Each tools/cmd_*.cc registers its commands
// at static-initialisation time:
//
//   static const bool kRegistered = kvcache::tools::RegisterCommand(
//       "bench pool", "Pool and cache operation timings",
//       [](CLI::App* app) -> kvcache::tools::Runner { ...add options...;
//                                                     return [=] { return 0; }; });
//
// A name with a space ("bench pool") nests under its parent, which is created
// on demand. The runner's return value is the process exit code.
//
// Most commands keep their flags in an options struct and run a function of
// it; RegisterOptionsCommand says just that:
//
//   static const bool kRegistered = RegisterOptionsCommand<InfoOptions>(
//       "info", "...", [](CLI::App* app, InfoOptions& o) { ...add options... },
//       RunInfo);
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kvcache::tools {

using Runner = std::function<int()>;
using Configure = std::function<Runner(CLI::App*)>;

struct CommandSpec {
  std::string name;
  std::string description;
  Configure configure;
};

bool RegisterCommand(std::string name, std::string description, Configure configure);
std::vector<CommandSpec>& Registry();

// A command whose flags fill an Options (default-constructed per command
// line) through add_flags(app, options), and whose runner returns
// run(options).
template <typename Options, typename AddFlags, typename Run>
bool RegisterOptionsCommand(std::string name, std::string description, AddFlags add_flags, Run run) {
  return RegisterCommand(std::move(name), std::move(description),
                         [add_flags, run](CLI::App* app) -> Runner {
                           auto o = std::make_shared<Options>();
                           add_flags(app, *o);
                           return [o, run] { return run(*o); };
                         });
}

}  // namespace kvcache::tools
