// `kvcache generate --tiers` on SmolLM2's GGUF, two processes over one disk
// folder: the second loads the prompt's full blocks from disk, prefills the
// rest only, and gives the tokens and (f32) the logits of an uncached run to
// the byte; a q8_0 cache over the same folder misses; turbo4 (calibrated per
// sequence) round-trips with its calibration. Short on purpose: a
// 70-token prompt (4 full blocks and a bit), 4 steps.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_runner.h"
#include "model_smollm/smollm_fixture.h"

namespace kvcache::model {
namespace {

namespace fs = std::filesystem;

using ::kvcache::testing::CliRun;
using ::kvcache::testing::Exact;
using ::kvcache::testing::RunCli;

using ::kvcache::testing::ReadBytes;

TEST(SmolLm2Tiers, SecondProcessLoadsThePromptFromDisk) {
  const LoadedModel* m = testing::SmolLm2();
  ASSERT_NE(m, nullptr);
  const std::vector<int32_t> prompt = testing::Gpl3Tokens(*m, 70);
  ASSERT_EQ(prompt.size(), 70u);
  std::string ids;
  for (int32_t t : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  const fs::path dir = fs::temp_directory_path() / ("kvc_smol_tiers_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string disk = " --tiers disk:" + (dir / "disk").string() + ":256MiB";
  auto run = [&](const std::string& extra, const std::string& logits) {
    const CliRun r = RunCli(Exact("generate --model " + SmolLm2Path() + " --prompt-ids " + ids +
                                  " --steps 4 --json --logits-out " + (dir / logits).string() + extra));
    EXPECT_EQ(r.exit_code, 0) << r.out;
    return r.exit_code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json::object();
  };
  const nlohmann::json plain = run("", "plain.npy");
  const nlohmann::json first = run(disk, "first.npy");
  const nlohmann::json second = run(disk, "second.npy");
  EXPECT_EQ(plain["prefix_tokens_by_tier"], nlohmann::json::parse(R"({"pool": 0})"));
  EXPECT_EQ(first["prefix_tokens"], 0);
  EXPECT_EQ(first["published_blocks"], 4);
  EXPECT_EQ(second["prefix_tokens_by_tier"]["disk"], 64);  // (70 - 1) / 16 full blocks
  EXPECT_EQ(second["prefill_tokens"], 6);
  EXPECT_EQ(second["generated_tokens"], plain["generated_tokens"]);
  const std::string want = ReadBytes(dir / "plain.npy");
  ASSERT_FALSE(want.empty());
  EXPECT_EQ(ReadBytes(dir / "first.npy"), want);
  EXPECT_EQ(ReadBytes(dir / "second.npy"), want);
  // Another format over the same folder: another digest, a miss.
  EXPECT_EQ(run(disk + " --kv-format q8_0", "q8.npy")["prefix_tokens"], 0);
  // turbo4 calibrates per sequence: the blocks name their calibration, stored
  // beside them; the second process adopts both and gives the first's tokens
  // and logits.
  const std::string turbo = disk + " --kv-format turbo4:turbo4";
  const nlohmann::json t1 = run(turbo, "turbo1.npy");
  const nlohmann::json t2 = run(turbo, "turbo2.npy");
  EXPECT_EQ(t1["prefix_tokens"], 0);
  EXPECT_EQ(t1["tiers"][0]["stored_blocks"], 4);
  EXPECT_EQ(t2["prefix_tokens_by_tier"]["disk"], 64);
  EXPECT_EQ(t2["tiers"][0]["hit_blocks"], 4);
  EXPECT_EQ(t2["generated_tokens"], t1["generated_tokens"]);
  EXPECT_EQ(ReadBytes(dir / "turbo2.npy"), ReadBytes(dir / "turbo1.npy"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvcache::model
