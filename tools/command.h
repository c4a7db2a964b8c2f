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
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
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

}  // namespace kvcache::tools
