// The serving simulation as the demo shows it (see cmd_simulate.cc).
#pragma once

#include <cstdio>

namespace kvcache::tools {

// Simulates the built-in chat workload on a 1 GiB pool with a Llama-3-8B
// geometry (32 layers, 8 kv heads, head_dim 128) for bf16, fp8_e4m3, turbo4
// and turbo3, and prints the comparison table to `out`. Takes a few seconds.
// Returns a process exit code (0 on success; errors are printed to stderr).
int RunServingDemo(std::FILE* out);

}  // namespace kvcache::tools
