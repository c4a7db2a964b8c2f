// The kvcache CLI end to end: `info --json` and `eval --json` output shape and
// sanity, an .npy round trip through `eval --keys`, and clean failures.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "tools/support/eval/synthetic.h"
#include "kvcache/format.h"
#include "kvcache/npy.h"
#include "model/tensor/matmul.h"

namespace kvcache {
namespace {

struct CliResult {
  int exit_code = -1;
  std::string out, err;
};

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Unique per test: ctest runs the test cases of this file in parallel processes.
std::string TempPath(const std::string& name) {
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  return testing::TempDir() + "/kvcache_cli_test_" + info->test_suite_name() + "_" + info->name() + "_" + name;
}

CliResult RunCli(const std::string& args) {
  const std::string out = TempPath("stdout"), err = TempPath("stderr");
  const std::string cmd = std::string("'") + KVCACHE_CLI_PATH + "' " + args + " >'" + out + "' 2>'" + err + "'";
  const int status = std::system(cmd.c_str());
  CliResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = Slurp(out);
  r.err = Slurp(err);
  return r;
}

std::vector<nlohmann::json> JsonLines(const std::string& text) {
  std::vector<nlohmann::json> lines;
  std::stringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
  }
  return lines;
}

// `info --json`'s simd_targets (what this CPU runs, best first) into *targets.
void CliSimdTargets(std::vector<std::string>* targets) {
  const CliResult r = RunCli("info --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  *targets = nlohmann::json::parse(r.out)["simd_targets"].get<std::vector<std::string>>();
}

// "a,b,c" for a --simd-targets option.
std::string CommaList(const std::vector<std::string>& names) {
  std::string list;
  for (const std::string& t : names) list += (list.empty() ? "" : ",") + t;
  return list;
}

TEST(CliInfo, JsonListsEveryFormat) {
  const CliResult r = RunCli("info --json --layers 2 --kv-heads 4 --head-dim 64 --n-values 256");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["simd_target"].is_string());
  EXPECT_FALSE(j["simd_target"].get<std::string>().empty());
  ASSERT_EQ(j["formats"].size(), kAllFormats.size());
  for (size_t i = 0; i < kAllFormats.size(); ++i) {
    const Format f = kAllFormats[i];
    const auto& e = j["formats"][i];
    EXPECT_EQ(e["name"], std::string(FormatName(f)));
    ASSERT_TRUE(e["supported"].get<bool>()) << e.dump();
    EXPECT_DOUBLE_EQ(e["bits_per_value"].get<double>(), BitsPerValue(f, 64));
    EXPECT_EQ(e["bytes_for_n_values"].get<size_t>(), BytesFor(f, 64, 256));
    EXPECT_EQ(e["bytes_per_token_per_side"].get<uint64_t>(), RowBytes(f, 64) * 4 * 2);
    EXPECT_EQ(e["bytes_per_token"].get<uint64_t>(), 2 * RowBytes(f, 64) * 4 * 2);
  }
  ASSERT_FALSE(j["pairs"].empty());
  for (const auto& p : j["pairs"]) {
    auto k = ParseFormat(p["k_format"].get<std::string>());
    auto v = ParseFormat(p["v_format"].get<std::string>());
    ASSERT_TRUE(k.ok() && v.ok());
    EXPECT_EQ(p["bytes_per_token"].get<uint64_t>(), (RowBytes(*k, 64) + RowBytes(*v, 64)) * 4 * 2);
  }
}

// simd_targets lists what this CPU runs, best first; the global --simd-target
// (before or after the command words) moves simd_target; a bad name fails.
TEST(CliInfo, SimdTargetsAndTheGlobalSimdTargetOption) {
  CliResult r = RunCli("info --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const auto targets = j["simd_targets"].get<std::vector<std::string>>();
  ASSERT_FALSE(targets.empty());
  EXPECT_EQ(j["simd_target"].get<std::string>(), targets.front());
  EXPECT_EQ(j["supported_simd_targets"], j["simd_targets"]);
  for (size_t i = 0; i < targets.size(); ++i) {
    const std::string& t = targets[i];
    r = RunCli(i % 2 ? "--simd-target " + t + " info --json" : "info --json --simd-target " + t);
    ASSERT_EQ(r.exit_code, 0) << t << ": " << r.err;
    const auto jt = nlohmann::json::parse(r.out);
    EXPECT_EQ(jt["simd_target"].get<std::string>(), t);
    EXPECT_EQ(jt["simd_targets"].get<std::vector<std::string>>(), targets);
  }
  r = RunCli("info --json --simd-target NOPE");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_NE(r.err.find("'NOPE'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(targets.front()), std::string::npos) << r.err;
}

// "defaults": what serve and generate run here without flags: a bf16 cache
// and the products --matmul auto picks on this CPU (model::AutoMatMulInputs),
// also said by the text output.
TEST(CliInfo, SaysTheServeAndGenerateDefaults) {
  CliResult r = RunCli("info --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto d = nlohmann::json::parse(r.out)["defaults"];
  const model::MatMulChoice pick = model::AutoMatMulInputs();
  EXPECT_EQ(d["kv_format"], "bf16");
  EXPECT_EQ(d["matmul"], std::string(model::MatMulInputsName(pick.inputs)));
  EXPECT_EQ(d["matmul_why"], "auto: " + std::string(pick.why));
  r = RunCli("info");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("serve / generate defaults on this CPU: kv bf16, products " +
                       std::string(model::MatMulInputsName(pick.inputs)) + " (auto: " + std::string(pick.why) + ")"),
            std::string::npos)
      << r.out;
}

TEST(CliInfo, UnsupportedHeadDimIsReportedPerFormat) {
  const CliResult r = RunCli("info --json --head-dim 40");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  for (const auto& e : j["formats"]) {
    const auto f = ParseFormat(e["name"].get<std::string>());
    ASSERT_TRUE(f.ok());
    EXPECT_EQ(e["supported"].get<bool>(), CheckHeadDim(*f, 40).ok()) << e.dump();
    if (!e["supported"].get<bool>()) {
      EXPECT_TRUE(e["error"].is_string());
    }
  }
}

const char* const kMetricKeys[] = {"k_bits", "v_bits", "k_nmse", "v_nmse", "attn_rel_err",
                                   "attn_cosine", "softmax_kl", "top1_agree"};

void ExpectSaneRow(const nlohmann::json& row) {
  ASSERT_TRUE(row["k_format"].is_string());
  ASSERT_TRUE(row["v_format"].is_string());
  if (row.contains("error")) {
    EXPECT_TRUE(row["error"].is_string());
    return;
  }
  for (const char* key : kMetricKeys) ASSERT_TRUE(row[key].is_number()) << key << " in " << row.dump();
  const Format k = *ParseFormat(row["k_format"].get<std::string>());
  const Format v = *ParseFormat(row["v_format"].get<std::string>());
  const uint32_t d = row["head_dim"].get<uint32_t>();
  EXPECT_DOUBLE_EQ(row["k_bits"].get<double>(), BitsPerValue(k, d));
  EXPECT_DOUBLE_EQ(row["v_bits"].get<double>(), BitsPerValue(v, d));
  EXPECT_GE(row["k_nmse"].get<double>(), 0.0);
  EXPECT_GE(row["v_nmse"].get<double>(), 0.0);
  EXPECT_GE(row["attn_rel_err"].get<double>(), 0.0);
  EXPECT_LE(row["attn_cosine"].get<double>(), 1.0 + 1e-9);
  EXPECT_GE(row["softmax_kl"].get<double>(), 0.0);
  EXPECT_GE(row["top1_agree"].get<double>(), 0.0);
  EXPECT_LE(row["top1_agree"].get<double>(), 1.0);
  if (k == Format::kF32) {
    EXPECT_EQ(row["k_nmse"].get<double>(), 0.0);
  }
  if (v == Format::kF32) {
    EXPECT_EQ(row["v_nmse"].get<double>(), 0.0);
  }
  if (k == Format::kF32 && v == Format::kF32) {
    EXPECT_EQ(row["attn_rel_err"].get<double>(), 0.0);
    EXPECT_EQ(row["attn_cosine"].get<double>(), 1.0);
    EXPECT_EQ(row["softmax_kl"].get<double>(), 0.0);
    EXPECT_EQ(row["top1_agree"].get<double>(), 1.0);
  }
}

TEST(CliEval, DefaultPairsJsonShape) {
  for (const char* data : {"gaussian", "outlier"}) {
    const CliResult r = RunCli(std::string("eval --json --tokens 64 --num-queries 8 --head-dim 64 --data ") + data);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto rows = JsonLines(r.out);
    // Every format as K=V plus the mixed pairs.
    ASSERT_GE(rows.size(), kAllFormats.size() + 4);
    EXPECT_EQ(rows[0]["k_format"], "f32");
    EXPECT_EQ(rows[0]["v_format"], "f32");
    EXPECT_FALSE(rows[0].contains("error")) << rows[0].dump();
    for (const auto& row : rows) {
      ExpectSaneRow(row);
      EXPECT_EQ(row["data"], data);
      EXPECT_EQ(row["tokens"], 64);
      EXPECT_EQ(row["head_dim"], 64);
    }
  }
}

TEST(CliEval, UnsupportedHeadDimIsAnErrorRowNotACrash) {
  const CliResult r = RunCli("eval --json --tokens 16 --num-queries 4 --head-dim 40 --formats f32,q4_0:f32,turbo4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto rows = JsonLines(r.out);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_FALSE(rows[0].contains("error"));
  EXPECT_NE(rows[1]["error"].get<std::string>().find("q4_0"), std::string::npos) << rows[1].dump();
  EXPECT_NE(rows[2]["error"].get<std::string>().find("turbo4"), std::string::npos) << rows[2].dump();
}

TEST(CliEval, TableWithoutJson) {
  const CliResult r = RunCli("eval --tokens 16 --num-queries 4 --head-dim 32 --formats f32:f32");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("attn_rel_err"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("f32:f32"), std::string::npos) << r.out;
}

TEST(CliEval, NpyRoundTripThroughKeysValuesQueries) {
  const eval::SyntheticShape s{48, 2, 32};
  const auto keys = eval::MakeKeys(eval::DataKind::kOutlier, s, 5);
  const auto values = eval::MakeValues(eval::DataKind::kGaussian, s, 5);
  eval::QueryOptions qo;
  qo.num_queries = 6;
  qo.q_heads = 4;
  const auto queries = eval::MakeQueries(keys, s, qo);
  const std::vector<uint64_t> kv_shape = {48, 2, 32}, q_shape = {6, 4, 32};
  const std::string kp = TempPath("k.npy"), vp = TempPath("v.npy"), qp = TempPath("q.npy"), kp16 = TempPath("k16.npy");
  ASSERT_TRUE(WriteNpy(kp, kv_shape, keys).ok());
  ASSERT_TRUE(WriteNpy(vp, kv_shape, values, {NpyDtype::kF32, 2}).ok());
  ASSERT_TRUE(WriteNpy(qp, q_shape, queries, {NpyDtype::kF32, 3}).ok());
  ASSERT_TRUE(WriteNpy(kp16, kv_shape, keys, {NpyDtype::kF16, 1}).ok());

  CliResult r = RunCli("eval --json --formats f32 --keys '" + kp + "' --values '" + vp + "' --queries '" + qp + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto rows = JsonLines(r.out);
  ASSERT_EQ(rows.size(), 1u);
  ExpectSaneRow(rows[0]);
  EXPECT_EQ(rows[0]["data"], "npy");
  EXPECT_EQ(rows[0]["tokens"], 48);
  EXPECT_EQ(rows[0]["kv_heads"], 2);
  EXPECT_EQ(rows[0]["q_heads"], 4);
  EXPECT_EQ(rows[0]["queries"], 6);
  EXPECT_EQ(rows[0]["head_dim"], 32);

  // float16 keys only: synthetic values, queries drawn from the keys; --tokens keeps the first.
  r = RunCli("eval --json --formats f32,q4_0 --tokens 40 --keys '" + kp16 + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  rows = JsonLines(r.out);
  ASSERT_EQ(rows.size(), 2u);
  for (const auto& row : rows) ExpectSaneRow(row);
  EXPECT_EQ(rows[0]["tokens"], 40);
  EXPECT_EQ(rows[0]["q_heads"], 4);
  for (const std::string& p : {kp, vp, qp, kp16}) std::filesystem::remove(p);
}

TEST(CliEval, MalformedNpyFailsCleanly) {
  const std::string bad = TempPath("bad.npy");
  {
    std::ofstream out(bad, std::ios::binary);
    out << "\x93NUMPY\x01";  // cut off inside the preamble
  }
  CliResult r = RunCli("eval --json --keys '" + bad + "'");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_NE(r.err.find("Corruption"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("bad.npy"), std::string::npos) << r.err;

  // Well-formed but the wrong rank.
  const std::vector<uint64_t> shape = {4, 8};
  const std::vector<float> data(32, 1.0f);
  ASSERT_TRUE(WriteNpy(bad, shape, data).ok());
  r = RunCli("eval --json --keys '" + bad + "'");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("shape"), std::string::npos) << r.err;

  // Values that do not match the keys.
  const std::vector<uint64_t> k_shape = {4, 1, 8}, v_shape = {4, 1, 16};
  const std::string kp = TempPath("k_ok.npy");
  ASSERT_TRUE(WriteNpy(kp, k_shape, data).ok());
  const std::vector<float> v_data(64, 1.0f);
  ASSERT_TRUE(WriteNpy(bad, v_shape, v_data).ok());
  r = RunCli("eval --json --keys '" + kp + "' --values '" + bad + "'");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("differs from keys"), std::string::npos) << r.err;

  r = RunCli("eval --json --keys '" + TempPath("does_not_exist.npy") + "'");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("IoError"), std::string::npos) << r.err;
  std::filesystem::remove(bad);
  std::filesystem::remove(kp);
}

TEST(CliEval, UnknownFormatAndDataFailCleanly) {
  CliResult r = RunCli("eval --json --tokens 16 --formats f32,turbo5");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_NE(r.err.find("turbo5"), std::string::npos) << r.err;
  r = RunCli("eval --json --tokens 16 --data uniform");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("uniform"), std::string::npos) << r.err;
  r = RunCli("eval --json --tokens 16 --q-heads 3");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("multiple"), std::string::npos) << r.err;
}

}  // namespace
// `bench attention --json` (tiny sizes): one object per case with every field
// the issue names, the floors, and figures that are consistent with each other.
TEST(CliBenchAttention, JsonShapeAndConsistency) {
  const CliResult r = RunCli(
      "bench attention --json --formats bf16:bf16,q8:q8 --layout both --context 256 "
      "--batch-seqs 2 --batch-context 64 --repeats 1 --bandwidth-mib 64 --threads 2 "
      "--block-size 8");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto rows = JsonLines(r.out);
  ASSERT_EQ(rows.size(), 8u);  // 2 pairs x 2 layouts x (single, batched)
  for (const auto& j : rows) {
    for (const char* key :
         {"k_format", "v_format", "layout", "block_size", "context_tokens", "threads", "step_us",
          "kv_bytes", "effective_gb_per_s", "read_bandwidth_gb_per_s", "bandwidth_fraction",
          "simd_target", "case", "sequences", "step_cpu_us", "read_bandwidth_cpu_gb_per_s",
          "bandwidth_fraction_cpu", "pattern_read_us", "pattern_read_cpu_us",
          "pattern_fraction_cpu", "compute_cpu_us"}) {
      EXPECT_TRUE(j.contains(key)) << key << " in " << j.dump();
    }
    const bool batched = j["case"] == "batched";
    const double tokens = batched ? 2.0 * 64 : 256.0;
    const double row_bytes = j["k_format"] == "bf16" ? 2 * 256.0 : 2 * 132.0;  // K + V
    EXPECT_DOUBLE_EQ(j["kv_bytes"].get<double>(), tokens * 8 * row_bytes);
    EXPECT_EQ(j["block_size"].get<uint32_t>(), j["layout"] == "paged" ? 8u : 0u);
    EXPECT_GT(j["step_us"].get<double>(), 0.0);
    EXPECT_GT(j["pattern_read_us"].get<double>(), 0.0);
    EXPECT_GT(j["compute_cpu_us"].get<double>(), 0.0);
    EXPECT_NEAR(j["effective_gb_per_s"].get<double>(),
                j["kv_bytes"].get<double>() / j["step_us"].get<double>() / 1e3, 1e-6);
  }
}

// Several block sizes: one paged case each, beside the contiguous one, all
// timed in the same interleaved rounds.
TEST(CliBenchAttention, SeveralBlockSizesGiveOnePagedCaseEach) {
  const CliResult r = RunCli(
      "bench attention --json --formats q8:q8 --layout both --context 256 --batch-seqs 0 "
      "--repeats 2 --bandwidth-mib 64 --threads 2 --block-size 8,32");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto rows = JsonLines(r.out);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0]["layout"], "contiguous");
  EXPECT_EQ(rows[0]["block_size"].get<uint32_t>(), 0u);
  EXPECT_EQ(rows[1]["layout"], "paged");
  EXPECT_EQ(rows[1]["block_size"].get<uint32_t>(), 8u);
  EXPECT_EQ(rows[2]["layout"], "paged");
  EXPECT_EQ(rows[2]["block_size"].get<uint32_t>(), 32u);
  for (const auto& j : rows) {
    EXPECT_DOUBLE_EQ(j["kv_bytes"].get<double>(), 256.0 * 8 * 2 * 132.0);
    EXPECT_GT(j["step_cpu_us"].get<double>(), 0.0);
  }
}

// --simd-targets: every case once per target, in the order given, same K/V.
TEST(CliBenchAttention, SimdTargetsGiveOneRowPerTarget) {
  std::vector<std::string> targets;
  ASSERT_NO_FATAL_FAILURE(CliSimdTargets(&targets));
  const std::string list = CommaList({targets.rbegin(), targets.rend()});
  CliResult r = RunCli("bench attention --json --formats q8_0:q8_0 --layout both --context 128 --batch-seqs 0 "
             "--repeats 1 --bandwidth-mib 64 --threads 1 --simd-targets " + list);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto rows = JsonLines(r.out);
  ASSERT_EQ(rows.size(), 2 * targets.size());  // 2 layouts x targets
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i]["simd_target"].get<std::string>(), targets[targets.size() - 1 - i % targets.size()]);
    EXPECT_EQ(rows[i]["layout"], i < targets.size() ? "contiguous" : "paged");
    EXPECT_DOUBLE_EQ(rows[i]["kv_bytes"].get<double>(), 128.0 * 8 * 2 * 136.0);
  }
}

// `bench encode --json` (tiny sizes): one row per format and target, in that
// order, with the fields and figures consistent with each other.
TEST(CliBenchEncode, JsonShapePerFormatAndTarget) {
  std::vector<std::string> targets;
  ASSERT_NO_FATAL_FAILURE(CliSimdTargets(&targets));
  const std::string list = CommaList(targets);
  CliResult r = RunCli("bench encode --json --formats q8_0,turbo4,f16 --rows 16 --append-tokens 2 --rounds 1 "
             "--simd-targets " + list);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto rows = JsonLines(r.out);
  ASSERT_EQ(rows.size(), 3 * targets.size());
  const char* formats[] = {"q8_0", "turbo4", "f16"};
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& j = rows[i];
    EXPECT_EQ(j["format"].get<std::string>(), formats[i / targets.size()]);
    EXPECT_EQ(j["simd_target"].get<std::string>(), targets[i % targets.size()]);
    for (const char* key : {"encode_gb_per_s", "decode_gb_per_s", "append_token_us", "encode_token_us"}) {
      ASSERT_TRUE(j.contains(key)) << key << " in " << j.dump();
      EXPECT_GT(j[key].get<double>(), 0.0) << key;
    }
    EXPECT_EQ(j["append_layout"], "paged/16");
    EXPECT_EQ(j["head_dim"].get<uint32_t>(), 128u);
    // One token of Llama-3-8B K and V in f32: 2 x 32 x 8 x 128 x 4 bytes.
    EXPECT_NEAR(j["encode_token_us"].get<double>(), 262144.0 / j["encode_gb_per_s"].get<double>() / 1e3, 1e-6);
    EXPECT_NEAR(j["append_vs_encode"].get<double>(),
                j["append_token_us"].get<double>() / j["encode_token_us"].get<double>(), 1e-9);
  }
  // The table without --json, and clean failures.
  r = RunCli("bench encode --formats bf16 --rows 8 --append-tokens 1 --rounds 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("bf16"), std::string::npos) << r.out;
  for (const char* args : {"--formats nope --rows 8", "--simd-targets NOPE --rows 8", "--rounds 0",
                           "--rows 0", "--append-tokens 0 --rows 8"}) {
    r = RunCli(std::string("bench encode ") + args);
    EXPECT_EQ(r.exit_code, 2) << args;
    EXPECT_NE(r.err.find("bench encode"), std::string::npos) << args << ": " << r.err;
  }
}

// `bench attention --passes --json` (tiny sizes): one row per format pair x
// layout x (memory, cache) x target x thread count, in that order, the
// per-pass figures adding up and the floors where they belong.
TEST(CliBenchAttention, PassesJsonShapeAndConsistency) {
  std::vector<std::string> targets;
  ASSERT_NO_FATAL_FAILURE(CliSimdTargets(&targets));
  const std::string list = CommaList(targets);
  CliResult r = RunCli("bench attention --passes --json --formats bf16:bf16,q4_0:q4_0 --layout both "
             "--context 256 --cache-context 128 --pass-threads 1,2 --repeats 1 --simd-targets " +
             list);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto rows = JsonLines(r.out);
  const size_t nt = targets.size();
  ASSERT_EQ(rows.size(), 2 * 2 * 2 * nt * 2);
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& j = rows[i];
    const bool memory = (i / (2 * nt)) % 2 == 0;
    EXPECT_EQ(j["k_format"], i < rows.size() / 2 ? "bf16" : "q4_0");
    EXPECT_EQ(j["layout"], (i / (4 * nt)) % 2 == 0 ? "contiguous" : "paged");
    EXPECT_EQ(j["where"], memory ? "memory" : "cache");
    EXPECT_EQ(j["simd_target"].get<std::string>(), targets[(i / 2) % nt]);
    EXPECT_EQ(j["threads"].get<uint32_t>(), i % 2 == 0 ? 1u : 2u);
    EXPECT_EQ(j["context_tokens"].get<uint32_t>(), memory ? 256u : 128u);
    EXPECT_DOUBLE_EQ(j["rows"].get<double>(), (memory ? 256.0 : 128.0) * 8);
    double total = 0;
    for (const char* pass : {"k", "exp", "v", "other"}) {
      const std::string cyc = std::string(pass) + "_cycles_per_row";
      const std::string ns = std::string(pass) + "_ns_per_row";
      ASSERT_TRUE(j.contains(cyc) && j.contains(ns)) << pass << " in " << j.dump();
      EXPECT_GE(j[ns].get<double>(), 0.0);
      total += j[cyc].get<double>();
    }
    EXPECT_GT(j["k_cycles_per_row"].get<double>(), 0.0);
    EXPECT_GT(j["v_cycles_per_row"].get<double>(), 0.0);
    EXPECT_NEAR(j["total_cycles_per_row"].get<double>(), total, 1e-9 * total);
    for (const char* key : {"tsc_ghz", "step_us", "plain_step_us", "step_cpu_us",
                            "plain_step_cpu_us", "read_cycles_per_row"}) {
      ASSERT_TRUE(j.contains(key)) << key << " in " << j.dump();
      EXPECT_GT(j[key].get<double>(), 0.0) << key;
    }
    EXPECT_EQ(j.contains("pattern_cycles_per_row"), memory) << j.dump();
    if (memory) {
      EXPECT_NEAR(j["k_pattern_cycles_per_row"].get<double>() + j["v_pattern_cycles_per_row"].get<double>(),
                  j["pattern_cycles_per_row"].get<double>(), 1e-9 * j["pattern_cycles_per_row"].get<double>());
    }
    EXPECT_EQ(j["k_row_bytes"].get<uint32_t>(), i < rows.size() / 2 ? 256u : 72u);
  }
  for (const char* args : {"--cache-context 0", "--pass-threads 1,0", "--key-paths float",
                           "--formats bf16:nope"}) {
    r = RunCli(std::string("bench attention --passes --context 64 ") + args);
    EXPECT_EQ(r.exit_code, 2) << args;
    EXPECT_NE(r.err.find("bench attention"), std::string::npos) << args << ": " << r.err;
  }
}

TEST(CliBenchAttention, BadOptionsFailCleanly) {
  for (const char* args : {"--layout diagonal", "--formats bf16:nope", "--block-size 0",
                           "--block-size 16,0", "--repeats 0", "--simd-targets AVX2,NOPE"}) {
    const CliResult r = RunCli(std::string("bench attention --batch-seqs 0 --context 64 ") + args);
    EXPECT_EQ(r.exit_code, 2) << args;
    EXPECT_NE(r.err.find("bench attention"), std::string::npos) << args << ": " << r.err;
  }
}

}  // namespace kvcache
