// `kvcache demo`: the main job that ./run.sh demo runs.
#include <fmt/format.h>

#include <cstdlib>

#include "tools/command.h"

namespace kvcache::tools {
namespace {

const bool kRegistered = RegisterCommand(
    "demo", "The main job: what ./run.sh demo shows",
    [](CLI::App* app) -> Runner {
      (void)app;
      return [] {
        fmt::print("kvcache demo\n");
        return 0;
      };
    });

}  // namespace
}  // namespace kvcache::tools
