// How the commands that compute one JSON object end (bench pool, bench
// tiers, bench step, bench capacity, soak, passkey): the error, or the
// object as indented JSON (--json), or the command's own text.
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <string_view>

#include <nlohmann/json.hpp>

#include "kvcache/status.h"

namespace kvcache::tools {

// A failed result prints "kvcache <command>: <status>" on stderr and returns
// 2; else --json prints the object indented by 2 and returns 0, and without
// it text(object) prints the text and returns 0.
template <typename Text>
int PrintResult(std::string_view command, const Result<nlohmann::json>& result, bool json,
                Text text) {
  if (!result.ok()) {
    fmt::print(stderr, "kvcache {}: {}\n", command, result.status().ToString());
    return 2;
  }
  if (json) {
    fmt::print("{}\n", result->dump(2));
  } else {
    text(*result);
  }
  return 0;
}

// The runner of such a command: compute(options) is its result,
// text(options, result) its text; options.json says which is printed.
template <typename Options, typename Compute, typename Text>
auto JsonResultRunner(std::string_view command, Compute compute, Text text) {
  return [command, compute, text](const Options& o) {
    return PrintResult(command, compute(o), o.json,
                       [&o, &text](const nlohmann::json& j) { text(o, j); });
  };
}

}  // namespace kvcache::tools
