// Workloads: JSONL parsing and the built-in generators (see workload.h).
#include "kvcache/serving/workload.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <xxhash.h>

namespace kvcache {
namespace {

constexpr uint32_t kVocab = 32000;
constexpr uint64_t kMaxLen = 1u << 20;  // prompt_len / max_new_tokens limit
constexpr uint32_t kMaxSamples = 256;

// Token i of the shared prefix named `name`: a pure function of (name, i), so
// every request naming it agrees on every position.
TokenId PrefixToken(std::string_view name, uint64_t i) {
  const uint64_t seed = XXH3_64bits(name.data(), name.size());
  return static_cast<TokenId>(XXH3_64bits_withSeed(&i, sizeof(i), seed) % kVocab);
}

Status LineError(size_t line, std::string_view field, std::string_view what) {
  return Status::InvalidArgument(fmt::format("line {}: field {}: {}", line, field, what));
}

// Reads a non-negative integer field in [lo, hi].
Result<uint64_t> GetUint(const nlohmann::json& j, size_t line, const char* field, uint64_t lo,
                         uint64_t hi) {
  const nlohmann::json& v = j.at(field);
  if (!v.is_number_unsigned()) {  // (nlohmann stores non-negative integers as unsigned)
    return LineError(line, field, fmt::format("must be an integer in [{}, {}]", lo, hi));
  }
  const uint64_t x = v.get<uint64_t>();
  if (x < lo || x > hi) return LineError(line, field, fmt::format("{} is outside [{}, {}]", x, lo, hi));
  return x;
}

Result<std::vector<TokenId>> GetTokens(const nlohmann::json& j, size_t line, const char* field) {
  const nlohmann::json& v = j.at(field);
  if (!v.is_array()) return LineError(line, field, "must be an array of token ids");
  if (v.size() > kMaxLen) return LineError(line, field, fmt::format("more than {} tokens", kMaxLen));
  std::vector<TokenId> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const nlohmann::json& t = v[i];
    if (!t.is_number_unsigned() || t.get<uint64_t>() > UINT32_MAX) {
      return LineError(line, field, fmt::format("element {} is not a token id in [0, 2^32)", i));
    }
    out.push_back(static_cast<TokenId>(t.get<uint64_t>()));
  }
  return out;
}

Result<Request> ParseLine(std::string_view text, size_t line) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::InvalidArgument(fmt::format("line {}: not valid JSON", line));
  if (!j.is_object()) return Status::InvalidArgument(fmt::format("line {}: not a JSON object", line));
  static const char* const kKnown[] = {"prompt_tokens", "prefix_id", "prefix_len", "prompt_len",
                                       "max_new_tokens", "arrival", "n", "namespace", "id",
                                       "output_tokens"};
  for (const auto& item : j.items()) {
    const std::string& key = item.key();  // not a structured binding: clang 14 (fuzz) cannot capture one
    if (std::find_if(std::begin(kKnown), std::end(kKnown),
                     [&](const char* k) { return key == k; }) == std::end(kKnown)) {
      return LineError(line, key, "unknown field");
    }
  }
  Request r;
  r.id = line - 1;
  const bool has_tokens = j.contains("prompt_tokens");
  const bool has_prefix = j.contains("prefix_id");
  if (has_tokens == has_prefix) {
    return LineError(line, "prompt_tokens",
                     "give exactly one of prompt_tokens or prefix_id + prompt_len");
  }
  if (has_tokens) {
    for (const char* f : {"prompt_len", "prefix_len"}) {
      if (j.contains(f)) return LineError(line, f, "only allowed with prefix_id");
    }
    KV_ASSIGN_OR_RETURN(r.prompt, GetTokens(j, line, "prompt_tokens"));
    if (r.prompt.empty()) return LineError(line, "prompt_tokens", "must not be empty");
  } else {
    const nlohmann::json& p = j.at("prefix_id");
    std::string name;
    if (p.is_string()) {
      name = p.get<std::string>();
    } else if (p.is_number_unsigned()) {
      name = std::to_string(p.get<uint64_t>());
    } else {
      return LineError(line, "prefix_id", "must be a string or a non-negative integer");
    }
    if (!j.contains("prompt_len")) return LineError(line, "prompt_len", "required with prefix_id");
    KV_ASSIGN_OR_RETURN(const uint64_t prompt_len, GetUint(j, line, "prompt_len", 1, kMaxLen));
    uint64_t prefix_len = prompt_len;
    if (j.contains("prefix_len")) {
      KV_ASSIGN_OR_RETURN(prefix_len, GetUint(j, line, "prefix_len", 0, prompt_len));
    }
    r.prompt.resize(prompt_len);
    for (uint64_t i = 0; i < prefix_len; ++i) r.prompt[i] = PrefixToken(name, i);
    const std::string unique = fmt::format("\x01line{}", line);
    for (uint64_t i = prefix_len; i < prompt_len; ++i) r.prompt[i] = PrefixToken(unique, i);
  }
  if (!j.contains("max_new_tokens")) return LineError(line, "max_new_tokens", "required");
  KV_ASSIGN_OR_RETURN(const uint64_t max_new, GetUint(j, line, "max_new_tokens", 1, kMaxLen));
  r.max_new_tokens = static_cast<uint32_t>(max_new);
  if (!j.contains("arrival")) return LineError(line, "arrival", "required");
  const nlohmann::json& a = j.at("arrival");
  if (!a.is_number() || !std::isfinite(a.get<double>()) || a.get<double>() < 0) {
    return LineError(line, "arrival", "must be a finite number >= 0 (decode steps)");
  }
  r.arrival = a.get<double>();
  if (j.contains("n")) {
    KV_ASSIGN_OR_RETURN(const uint64_t n, GetUint(j, line, "n", 1, kMaxSamples));
    r.num_samples = static_cast<uint32_t>(n);
  }
  if (j.contains("namespace")) {
    if (!j.at("namespace").is_string()) return LineError(line, "namespace", "must be a string");
    r.salt = j.at("namespace").get<std::string>();
  }
  if (j.contains("id")) {
    KV_ASSIGN_OR_RETURN(r.id, GetUint(j, line, "id", 0, UINT64_MAX));
  }
  if (j.contains("output_tokens")) {
    KV_ASSIGN_OR_RETURN(r.output, GetTokens(j, line, "output_tokens"));
    if (r.output.size() > r.max_new_tokens) {
      return LineError(line, "output_tokens", "longer than max_new_tokens");
    }
  }
  return r;
}

}  // namespace

Result<std::vector<Request>> ParseWorkloadJsonl(std::string_view text) {
  std::vector<Request> out;
  size_t line = 0;
  while (!text.empty()) {
    ++line;
    const size_t nl = text.find('\n');
    std::string_view row = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    if (!row.empty() && row.back() == '\r') row.remove_suffix(1);
    if (row.find_first_not_of(" \t") == std::string_view::npos) continue;
    KV_ASSIGN_OR_RETURN(Request r, ParseLine(row, line));
    out.push_back(std::move(r));
  }
  if (out.empty()) return Status::InvalidArgument("workload: no requests");
  std::stable_sort(out.begin(), out.end(),
                   [](const Request& a, const Request& b) { return a.arrival < b.arrival; });
  return out;
}

Result<std::vector<Request>> LoadWorkloadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::IoError(fmt::format("workload: cannot open {}", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Status::IoError(fmt::format("workload: cannot read {}", path));
  Result<std::vector<Request>> r = ParseWorkloadJsonl(ss.str());
  if (!r.ok()) return Status(r.status().code(), fmt::format("{}: {}", path, r.status().message()));
  return r;
}

Result<WorkloadKind> ParseWorkloadKind(std::string_view name) {
  for (WorkloadKind k : {WorkloadKind::kChat, WorkloadKind::kSharedPrefix,
                         WorkloadKind::kParallelSampling}) {
    if (name == WorkloadKindName(k)) return k;
  }
  return Status::InvalidArgument(fmt::format(
      "unknown workload '{}' (chat, shared-prefix, parallel-sampling, or a .jsonl path)", name));
}

std::string_view WorkloadKindName(WorkloadKind kind) {
  switch (kind) {
    case WorkloadKind::kChat: return "chat";
    case WorkloadKind::kSharedPrefix: return "shared-prefix";
    case WorkloadKind::kParallelSampling: return "parallel-sampling";
  }
  return "unknown";
}

namespace {

class Gen {
 public:
  explicit Gen(uint64_t seed) : rng_(seed) {}
  uint32_t Uniform(uint32_t lo, uint32_t hi) {  // [lo, hi]
    return std::uniform_int_distribution<uint32_t>(lo, hi)(rng_);
  }
  double Exp(double mean) { return mean <= 0 ? 0 : std::exponential_distribution<double>(1.0 / mean)(rng_); }
  std::vector<TokenId> Tokens(size_t n) {
    std::vector<TokenId> t(n);
    for (TokenId& x : t) x = Uniform(0, kVocab - 1);
    return t;
  }

 private:
  std::mt19937_64 rng_;
};

std::vector<Request> Chat(const WorkloadOptions& o) {
  Gen g(o.seed);
  std::vector<std::vector<TokenId>> system(4);
  for (auto& s : system) s = g.Tokens(g.Uniform(250, 350));
  std::vector<Request> out;
  double start = 0;
  while (out.size() < o.num_requests) {
    const uint32_t turns = g.Uniform(2, 6);
    start += g.Exp(o.mean_interarrival_steps * 4.0);  // ~4 turns per conversation
    std::vector<TokenId> history = system[g.Uniform(0, 3)];
    double arrival = start;
    for (uint32_t t = 0; t < turns && out.size() < o.num_requests; ++t) {
      std::vector<TokenId> user = g.Tokens(g.Uniform(20, 150));
      history.insert(history.end(), user.begin(), user.end());
      Request r;
      r.id = out.size();
      r.arrival = arrival;
      r.prompt = history;
      r.max_new_tokens = 512;
      r.output = g.Tokens(g.Uniform(50, 400));
      history.insert(history.end(), r.output.begin(), r.output.end());
      // The user reads the answer (generated at one token per step), then types.
      arrival += static_cast<double>(r.output.size()) + g.Exp(30.0);
      out.push_back(std::move(r));
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Request& a, const Request& b) { return a.arrival < b.arrival; });
  return out;
}

std::vector<Request> SharedPrefix(const WorkloadOptions& o) {
  Gen g(o.seed);
  std::vector<std::vector<TokenId>> prefixes(4);
  for (auto& p : prefixes) p = g.Tokens(g.Uniform(800, 1200));
  std::vector<Request> out;
  double arrival = 0;
  for (uint32_t i = 0; i < o.num_requests; ++i) {
    arrival += g.Exp(o.mean_interarrival_steps);
    Request r;
    r.id = i;
    r.arrival = arrival;
    r.prompt = prefixes[g.Uniform(0, 3)];
    std::vector<TokenId> q = g.Tokens(g.Uniform(32, 128));
    r.prompt.insert(r.prompt.end(), q.begin(), q.end());
    r.max_new_tokens = 128;
    r.output = g.Tokens(g.Uniform(16, 128));
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<Request> ParallelSampling(const WorkloadOptions& o) {
  Gen g(o.seed);
  std::vector<Request> out;
  double arrival = 0;
  for (uint32_t i = 0; i < o.num_requests; ++i) {
    arrival += g.Exp(o.mean_interarrival_steps * 4.0);  // 4 samples each
    Request r;
    r.id = i;
    r.arrival = arrival;
    r.prompt = g.Tokens(g.Uniform(200, 600));
    r.max_new_tokens = 256;
    r.num_samples = 4;
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace

std::vector<Request> GenerateWorkload(const WorkloadOptions& options) {
  switch (options.kind) {
    case WorkloadKind::kChat: return Chat(options);
    case WorkloadKind::kSharedPrefix: return SharedPrefix(options);
    case WorkloadKind::kParallelSampling: return ParallelSampling(options);
  }
  return {};
}

}  // namespace kvcache
