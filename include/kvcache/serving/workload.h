// Serving workloads: the requests a simulation replays (see simulator.h).
//
// A workload is a list of requests, each with an arrival time (in decode
// steps), prompt token ids, a generation budget, optionally several parallel
// samples and a prefix-cache namespace. Workloads come from a JSONL file (one
// request per line; format in docs/workloads.md) or from the built-in
// generators below, which are deterministic functions of their options.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvcache/serving/prefix_cache.h"
#include "kvcache/status.h"

namespace kvcache {

struct Request {
  uint64_t id = 0;
  double arrival = 0;            // decode step at which it arrives (>= 0)
  std::vector<TokenId> prompt;   // [prompt_len], >= 1 token
  uint32_t max_new_tokens = 1;   // >= 1: generation stops here
  uint32_t num_samples = 1;      // parallel samples: forks of the prompt
  std::string salt;              // prefix-cache namespace ("" = shared)
  // Tokens sample 0 generates, if known (multi-turn chats reuse them in the
  // next turn's prompt); otherwise generated pseudo-randomly. Its length, if
  // nonempty, is the sample's output length (<= max_new_tokens).
  std::vector<TokenId> output;
};

// Parses a JSONL workload (see docs/workloads.md). Errors are InvalidArgument
// "line N: field F: what is wrong". Blank lines are skipped. Requests are
// returned in arrival order (stable for equal arrivals).
Result<std::vector<Request>> ParseWorkloadJsonl(std::string_view text);
// Reads and parses a file (IoError if it cannot be read).
Result<std::vector<Request>> LoadWorkloadFile(const std::string& path);

enum class WorkloadKind : uint8_t { kChat, kSharedPrefix, kParallelSampling };
Result<WorkloadKind> ParseWorkloadKind(std::string_view name);  // "chat", ...
std::string_view WorkloadKindName(WorkloadKind kind);

struct WorkloadOptions {
  WorkloadKind kind = WorkloadKind::kChat;
  uint32_t num_requests = 300;
  uint64_t seed = 1;
  // Mean decode steps between arrivals (Poisson arrivals).
  double mean_interarrival_steps = 1.0;
};

// chat: multi-turn conversations (2-6 turns) that all start with one of four
//   system prompts (~300 tokens); each turn's prompt is the previous turn's
//   prompt + its answer + a new user message, so turns reuse the chain.
// shared-prefix: few-shot style: one of four long prefixes (~1000 tokens) +
//   a unique question (32-128 tokens), short answers.
// parallel-sampling: unique prompts (200-600 tokens), 4 samples each.
std::vector<Request> GenerateWorkload(const WorkloadOptions& options);

}  // namespace kvcache
