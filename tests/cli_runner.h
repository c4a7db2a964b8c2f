// Running the `kvcache` binary from a test (KVCACHE_CLI_PATH, set by
// tests/CMakeLists.txt for every test target) and reading files it wrote.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

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

// Runs a shell command line; its stdout captured.
inline CliRun RunShell(const std::string& cmd) {
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

// Runs the CLI with `args` (stdout captured, stderr dropped).
inline CliRun RunCli(const std::string& args) {
  return RunShell(std::string(KVCACHE_CLI_PATH) + " " + args + " 2>/dev/null");
}

// Runs the CLI with `args`, stdout and stderr together (for the messages a
// failing command prints).
inline CliRun RunCliWithStderr(const std::string& args) {
  return RunShell(std::string(KVCACHE_CLI_PATH) + " " + args + " 2>&1");
}

// `kvcache serve ARGS --port 0`'s startup line ("kvcache serve: listening on
// ..."), the server then stopped with SIGTERM; or all it printed when it
// exited or did not start within `seconds`.
inline std::string ServeStartupLine(const std::string& args, int seconds = 60) {
  const std::string out = (std::filesystem::temp_directory_path() /
                           ("kvcache_serve_line_" + std::to_string(::getpid()) + ".txt")).string();
  const std::string text =
      RunShell(std::string("'") + KVCACHE_CLI_PATH + "' serve --port 0 " + args + " >'" + out + "' 2>&1 & p=$!; i=0; " +
               "while [ $i -lt " + std::to_string(seconds * 10) + " ] && ! grep -q listening '" + out +
               "' && kill -0 $p 2>/dev/null; do sleep 0.1; i=$((i+1)); done; kill -TERM $p 2>/dev/null; wait $p; "
               "cat '" + out + "'; rm -f '" + out + "'")
          .out;
  const size_t at = text.find("kvcache serve: listening");
  if (at == std::string::npos) return text;
  return text.substr(at, text.find('\n', at) - at);
}

// `args` on the exact path: f32 products, and an f32 cache unless `args`
// names a format (`generate` and `serve` default to a bf16 cache and the
// products `--matmul auto` picks; the tests that compare logits to the byte
// or tokens with the reference run the exact path).
inline std::string Exact(const std::string& args) {
  const bool has_format = args.find("--kv-format") != std::string::npos;
  return args + " --matmul f32" + (has_format ? "" : " --kv-format f32");
}

// A file's whole contents ("" if it cannot be read).
inline std::string ReadBytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace kvcache::testing
