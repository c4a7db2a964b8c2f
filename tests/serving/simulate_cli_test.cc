// `kvcache simulate`: the --json shape, side-by-side formats, and errors.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace {

struct CliRun {
  int code;
  std::string out;
};

CliRun RunCli(const std::string& args) {
  const std::string cmd = std::string(KVCACHE_CLI_PATH) + " " + args + " 2>&1";
  CliRun r{-1, ""};
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(SimulateCli, JsonShape) {
  const CliRun r = RunCli(
      "simulate --json --pool-gib 0.25 --requests 30 --seed 3 --kv-format bf16 "
      "--kv-format bf16:turbo4 --model-geometry qwen2-7b --draft-accept 0.5");
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["workload"]["name"], "chat");
  EXPECT_EQ(j["workload"]["requests"], 30);
  EXPECT_EQ(j["geometry"]["n_layers"], 28);
  EXPECT_EQ(j["geometry"]["n_kv_heads"], 4);
  EXPECT_EQ(j["draft_tokens"], 4);
  EXPECT_DOUBLE_EQ(j["draft_accept"].get<double>(), 0.5);
  ASSERT_EQ(j["results"].size(), 2u);
  EXPECT_EQ(j["results"][0]["kv_format"], "bf16:bf16");
  EXPECT_EQ(j["results"][1]["kv_format"], "bf16:turbo4");
  for (const auto& res : j["results"]) {
    for (const char* key : {"requests", "peak_concurrent", "mean_concurrent", "prefix_hit_rate",
                            "preemptions", "evicted_blocks", "pool_utilization",
                            "tokens_appended", "sim_tokens_per_second"}) {
      EXPECT_TRUE(res.contains(key)) << key;
      EXPECT_TRUE(res[key].is_number()) << key;
    }
    EXPECT_EQ(res["requests"].get<int>() + res["rejected"].get<int>(), 30);
    EXPECT_GT(res["draft_tokens"].get<int>(), 0);
    EXPECT_TRUE(res["prefix_cache"]["misses"].contains("partial_block"));
  }
  EXPECT_GT(j["results"][1]["pool"]["num_blocks"].get<int>(),
            j["results"][0]["pool"]["num_blocks"].get<int>());
}

TEST(SimulateCli, TableAndWorkloadFile) {
  const std::string path = testing::TempDir() + "/cli_workload.jsonl";
  {
    std::ofstream out(path);
    out << "{\"prefix_id\": \"sys\", \"prompt_len\": 300, \"prefix_len\": 256, \"max_new_tokens\": 20, \"arrival\": 0}\n"
        << "{\"prefix_id\": \"sys\", \"prompt_len\": 280, \"prefix_len\": 256, \"max_new_tokens\": 20, \"arrival\": 5, \"n\": 2}\n";
  }
  CliRun r = RunCli("simulate --json --workload " + path + " --kv-format fp8_e4m3");
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["results"][0]["requests"], 2);
  EXPECT_EQ(j["results"][0]["sequences"], 3);
  EXPECT_GT(j["results"][0]["prefix_hit_rate"].get<double>(), 0.4);
  // Without --json (and not on a terminal): a table, no progress bar.
  r = RunCli("simulate --workload " + path + " --kv-format turbo3");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("turbo3:turbo3"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('\r'), std::string::npos);
}

TEST(SimulateCli, DefaultsCompareTheDemoFormats) {
  const CliRun r = RunCli("simulate --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["workload"]["requests"], 300);
  EXPECT_EQ(j["geometry"]["n_layers"], 32);
  EXPECT_EQ(j["pool_bytes"], 1u << 30);
  ASSERT_EQ(j["results"].size(), 4u);
  const char* names[] = {"bf16:bf16", "fp8_e4m3:fp8_e4m3", "turbo4:turbo4", "turbo3:turbo3"};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(j["results"][i]["kv_format"], names[i]);
    EXPECT_EQ(j["results"][i]["requests"], 300);
    if (i > 0) {
      EXPECT_GT(j["results"][i]["pool"]["num_blocks"], j["results"][i - 1]["pool"]["num_blocks"]);
      EXPECT_GE(j["results"][i]["mean_concurrent"].get<double>(),
                j["results"][i - 1]["mean_concurrent"].get<double>());
    }
  }
}

TEST(SimulateCli, Errors) {
  const std::string path = testing::TempDir() + "/cli_bad.jsonl";
  {
    std::ofstream out(path);
    out << "{\"prompt_tokens\": [1, 2], \"max_new_tokens\": 3, \"arrival\": 0}\n"
        << "{\"prompt_tokens\": [1, 2], \"max_new_tokens\": -3, \"arrival\": 0}\n";
  }
  CliRun r = RunCli("simulate --json --workload " + path);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("line 2: field max_new_tokens"), std::string::npos) << r.out;
  r = RunCli("simulate --kv-format nope");
  EXPECT_NE(r.code, 0);
  r = RunCli("simulate --model-geometry 1,2");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("model geometry"), std::string::npos) << r.out;
  r = RunCli("simulate --workload nope");
  EXPECT_NE(r.code, 0);
  r = RunCli("simulate --draft-accept 2");
  EXPECT_NE(r.code, 0);
}

}  // namespace
