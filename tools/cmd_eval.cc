// `kvcache eval`: the quality of K/V format pairs on synthetic data or on a
// model's own dumps (.npy), measured against f32 attention.
//
// Output with --json: one JSON object per line (JSON Lines), one per pair, in
// the order of --formats:
//   {"k_format":"turbo4","v_format":"turbo4","k_bits":4.5,"v_bits":4.5,
//    "k_nmse":...,"v_nmse":...,"attn_rel_err":...,"attn_cosine":...,
//    "softmax_kl":...,"top1_agree":...,"data":"gaussian","tokens":1024,
//    "kv_heads":2,"q_heads":4,"head_dim":128,"queries":64}
// A pair that cannot be measured (a head_dim the format cannot take, a codec
// error) is printed as {"k_format":..,"v_format":..,"error":"..."} and the
// command still exits 0; bad arguments or unreadable files exit 2.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <optional>
#include <sstream>

#include "kvcache/format.h"
#include "kvcache/npy.h"
#include "tools/command.h"
#include "tools/support/eval/eval.h"
#include "tools/support/eval/synthetic.h"

namespace kvcache::tools {
namespace {

struct EvalCliOptions {
  bool json = false;
  uint32_t head_dim = 128, tokens = 1024, kv_heads = 2, q_heads = 0, num_queries = 64;
  uint32_t calibration_tokens = 256;
  uint64_t seed = 1;
  std::string data = "gaussian";
  std::string keys_path, values_path, queries_path;
  std::string formats;
  bool tokens_given = false;
};

std::vector<FormatPair> DefaultPairs() {
  std::vector<FormatPair> pairs;
  for (Format f : kAllFormats) pairs.push_back({f, f});
  pairs.push_back({Format::kBF16, Format::kTurbo4});
  pairs.push_back({Format::kTurbo8, Format::kTurbo4});
  pairs.push_back({Format::kBF16, Format::kQ4_0});
  pairs.push_back({Format::kQ8_0, Format::kQ4_0});
  return pairs;
}

Result<std::vector<FormatPair>> ParsePairs(const std::string& text) {
  if (text.empty()) return DefaultPairs();
  std::vector<FormatPair> pairs;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    auto pair = ParseFormatPair(item);
    if (!pair.ok()) {
      return Status::InvalidArgument(fmt::format("--formats: '{}': {}", item, pair.status().message()));
    }
    pairs.push_back(*pair);
  }
  if (pairs.empty()) return Status::InvalidArgument("--formats: no format pairs given");
  return pairs;
}

// A [n][heads][head_dim] array from a .npy file.
Result<NpyArray> ReadRank3(const std::string& path, const char* what) {
  KV_ASSIGN_OR_RETURN(NpyArray a, ReadNpy(path));
  if (a.shape.size() != 3 || a.num_elements() == 0) {
    std::string dims;
    for (uint64_t d : a.shape) dims += fmt::format("{}{}", dims.empty() ? "" : ", ", d);
    return Status::InvalidArgument(fmt::format(
        "{}: {} must have shape [{}, heads, head_dim] with no zero dimension, got ({})", path, what,
        what == std::string("queries") ? "n" : "tokens", dims));
  }
  for (uint64_t d : a.shape) {
    if (d > (1u << 30)) return Status::InvalidArgument(fmt::format("{}: dimension {} too large", path, d));
  }
  return a;
}

Result<eval::EvalData> LoadData(const EvalCliOptions& o, std::string* label) {
  eval::EvalData data;
  eval::SyntheticShape shape;
  if (!o.keys_path.empty()) {
    KV_ASSIGN_OR_RETURN(NpyArray keys, ReadRank3(o.keys_path, "keys"));
    shape.tokens = static_cast<uint32_t>(keys.shape[0]);
    shape.kv_heads = static_cast<uint32_t>(keys.shape[1]);
    shape.head_dim = static_cast<uint32_t>(keys.shape[2]);
    data.keys = std::move(keys.data);
    *label = "npy";
  } else {
    KV_ASSIGN_OR_RETURN(eval::DataKind kind, eval::ParseDataKind(o.data));
    if (o.tokens == 0 || o.kv_heads == 0 || o.head_dim == 0) {
      return Status::InvalidArgument("--tokens, --kv-heads and --head-dim must be > 0");
    }
    shape = {o.tokens, o.kv_heads, o.head_dim};
    data.keys = eval::MakeKeys(kind, shape, o.seed);
    *label = o.data;
  }
  if (!o.values_path.empty()) {
    KV_ASSIGN_OR_RETURN(NpyArray values, ReadRank3(o.values_path, "values"));
    if (values.shape[0] != shape.tokens || values.shape[1] != shape.kv_heads || values.shape[2] != shape.head_dim) {
      return Status::InvalidArgument(fmt::format("{}: values shape ({}, {}, {}) differs from keys ({}, {}, {})",
                                                 o.values_path, values.shape[0], values.shape[1], values.shape[2],
                                                 shape.tokens, shape.kv_heads, shape.head_dim));
    }
    data.values = std::move(values.data);
  } else {
    const eval::DataKind vkind = o.keys_path.empty() && o.data == "outlier" ? eval::DataKind::kOutlier
                                                                            : eval::DataKind::kGaussian;
    data.values = eval::MakeValues(vkind, shape, o.seed);
  }
  // --tokens with a dump keeps its first tokens.
  if (!o.keys_path.empty() && o.tokens_given && o.tokens > 0 && o.tokens < shape.tokens) {
    const size_t n = static_cast<size_t>(o.tokens) * shape.kv_heads * shape.head_dim;
    data.keys.resize(n);
    data.values.resize(n);
    shape.tokens = o.tokens;
  }
  data.tokens = shape.tokens;
  data.kv_heads = shape.kv_heads;
  data.head_dim = shape.head_dim;
  if (!o.queries_path.empty()) {
    KV_ASSIGN_OR_RETURN(NpyArray q, ReadRank3(o.queries_path, "queries"));
    if (q.shape[2] != shape.head_dim || q.shape[1] % shape.kv_heads != 0) {
      return Status::InvalidArgument(fmt::format(
          "{}: queries shape ({}, {}, {}) needs head_dim {} and a multiple of {} query heads", o.queries_path,
          q.shape[0], q.shape[1], q.shape[2], shape.head_dim, shape.kv_heads));
    }
    data.num_queries = static_cast<uint32_t>(q.shape[0]);
    data.q_heads = static_cast<uint32_t>(q.shape[1]);
    data.queries = std::move(q.data);
  } else {
    eval::QueryOptions qo;
    qo.num_queries = o.num_queries;
    qo.q_heads = o.q_heads == 0 ? 2 * shape.kv_heads : o.q_heads;
    qo.seed = o.seed;
    if (qo.num_queries == 0 || qo.q_heads % shape.kv_heads != 0) {
      return Status::InvalidArgument(fmt::format("--num-queries must be > 0 and --q-heads ({}) a multiple of kv heads ({})",
                                                 qo.q_heads, shape.kv_heads));
    }
    data.num_queries = qo.num_queries;
    data.q_heads = qo.q_heads;
    data.queries = eval::MakeQueries(data.keys, shape, qo);
  }
  KV_RETURN_IF_ERROR(data.Validate());
  return data;
}

int RunEval(const EvalCliOptions& o) {
  auto pairs = ParsePairs(o.formats);
  if (!pairs.ok()) {
    fmt::print(stderr, "kvcache eval: {}\n", pairs.status().ToString());
    return 2;
  }
  std::string label;
  auto data = LoadData(o, &label);
  if (!data.ok()) {
    fmt::print(stderr, "kvcache eval: {}\n", data.status().ToString());
    return 2;
  }
  eval::EvalOptions eo;
  eo.calibration_tokens = o.calibration_tokens;
  eval::Evaluator evaluator(*data, eo);
  std::vector<nlohmann::ordered_json> rows;
  for (const FormatPair& pair : *pairs) {
    nlohmann::ordered_json j;
    j["k_format"] = FormatName(pair.k);
    j["v_format"] = FormatName(pair.v);
    auto r = evaluator.Evaluate(pair);
    if (r.ok()) {
      j["k_bits"] = r->k_bits;
      j["v_bits"] = r->v_bits;
      j["k_nmse"] = r->k_nmse;
      j["v_nmse"] = r->v_nmse;
      j["attn_rel_err"] = r->attention.rel_err;
      j["attn_cosine"] = r->attention.cosine;
      j["softmax_kl"] = r->attention.kl;
      j["top1_agree"] = r->attention.top1_agree;
    } else {
      j["error"] = r.status().ToString();
    }
    j["data"] = label;
    j["tokens"] = data->tokens;
    j["kv_heads"] = data->kv_heads;
    j["q_heads"] = data->q_heads;
    j["head_dim"] = data->head_dim;
    j["queries"] = data->num_queries;
    if (o.json) {
      fmt::print("{}\n", j.dump());
      std::fflush(stdout);
    }
    rows.push_back(std::move(j));
  }
  if (o.json) return 0;
  fmt::print("data {}: {} tokens, {} kv heads, {} query heads, head_dim {}, {} queries\n\n", label, data->tokens,
             data->kv_heads, data->q_heads, data->head_dim, data->num_queries);
  fmt::print("{:<20} {:>6} {:>6} {:>10} {:>10} {:>12} {:>11} {:>10} {:>7}\n", "K:V", "k_bits", "v_bits", "k_nmse",
             "v_nmse", "attn_rel_err", "attn_cosine", "softmax_kl", "top1");
  for (const auto& j : rows) {
    const std::string name = j["k_format"].get<std::string>() + ":" + j["v_format"].get<std::string>();
    if (j.contains("error")) {
      fmt::print("{:<20} error: {}\n", name, j["error"].get<std::string>());
      continue;
    }
    fmt::print("{:<20} {:>6.3f} {:>6.3f} {:>10.3e} {:>10.3e} {:>12.3e} {:>11.6f} {:>10.3e} {:>7.3f}\n", name,
               j["k_bits"].get<double>(), j["v_bits"].get<double>(), j["k_nmse"].get<double>(),
               j["v_nmse"].get<double>(), j["attn_rel_err"].get<double>(), j["attn_cosine"].get<double>(),
               j["softmax_kl"].get<double>(), j["top1_agree"].get<double>());
  }
  return 0;
}

const bool kRegistered = RegisterOptionsCommand<EvalCliOptions>(
    "eval", "Measure K/V format pairs against f32 attention (synthetic data or .npy dumps)",
    [](CLI::App* app, EvalCliOptions& o) {
      app->add_flag("--json", o.json, "Print one JSON object per format pair per line");
      app->add_option("--head-dim", o.head_dim, "Values per head (synthetic data)")->capture_default_str();
      auto* tokens = app->add_option("--tokens", o.tokens,
                                     "Tokens (synthetic data; with --keys, keep the first N)")->capture_default_str();
      app->add_option("--kv-heads", o.kv_heads, "KV heads (synthetic data)")->capture_default_str();
      app->add_option("--q-heads", o.q_heads, "Query heads, a multiple of kv heads (0: 2x kv heads)")
          ->capture_default_str();
      app->add_option("--num-queries", o.num_queries, "Queries drawn when --queries is not given")
          ->capture_default_str();
      app->add_option("--data", o.data, "Synthetic data: gaussian or outlier")->capture_default_str();
      app->add_option("--keys", o.keys_path, "Keys .npy, float32/float16 [tokens, kv_heads, head_dim]");
      app->add_option("--values", o.values_path, "Values .npy, same shape as the keys (default: synthetic)");
      app->add_option("--queries", o.queries_path,
                      "Queries .npy [n, q_heads, head_dim] (default: drawn from the keys)");
      app->add_option("--formats", o.formats, "Comma-separated K:V pairs (default: every format and a few mixes)");
      app->add_option("--seed", o.seed, "Seed of the synthetic data and queries")->capture_default_str();
      app->add_option("--calibration-tokens", o.calibration_tokens,
                      "Rows per head the codec calibrates on (the first ones)")->capture_default_str();
      app->callback([&o, tokens] { o.tokens_given = tokens->count() > 0; });
    },
    RunEval);

}  // namespace
}  // namespace kvcache::tools
