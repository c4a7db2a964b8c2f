// Running the `kvcache` binary from a test (KVCACHE_CLI_PATH, set by
// tests/CMakeLists.txt for every test target) and reading files it wrote.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace kvcache::testing {

struct CliRun {
  int exit_code = -1;
  std::string out;
};

// Runs the CLI with `args` (stdout captured, stderr dropped).
inline CliRun RunCli(const std::string& args) {
  const std::string cmd = std::string(KVCACHE_CLI_PATH) + " " + args + " 2>/dev/null";
  CliRun r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// A file's whole contents ("" if it cannot be read).
inline std::string ReadBytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace kvcache::testing
