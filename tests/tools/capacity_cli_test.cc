// `kvcache bench capacity` end to end on small shapes: the sequences a
// budget admits, computed here from the block sizes, the fill, and the JSON.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_runner.h"
#include "kvcache/format.h"
#include "kvcache/geometry.h"
#include "kvcache/pool.h"

namespace kvcache {
namespace {

constexpr uint64_t kMiB = 1 << 20;

nlohmann::json RunJson(const std::string& args) {
  const testing::CliRun r = testing::RunCli("bench capacity --json " + args);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  return nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
}

uint64_t BlockBytes(uint32_t layers, uint32_t kv_heads, uint32_t head_dim, const char* format) {
  const Geometry g = *Geometry::Create({layers, kv_heads, head_dim, 16});
  return BlockPool::BlockBytes(g, *ParseFormatPair(format));
}

// stories260K: 5 layers, 4 kv heads of 8, every layer full. A 256-token
// sequence is 16 blocks; 1 MiB holds floor(1 MiB / block) blocks.
TEST(CliBenchCapacity, FullAttentionModelAdmitsBudgetOverSequenceBlocks) {
  const nlohmann::json j = RunJson(std::string("--model ") + KVCACHE_TESTDATA_DIR +
                                   "/stories260K/stories260K_v1.bin --context 256 --budget-mib 1 "
                                   "--kv-formats 'bf16;f16' --layouts hybrid,full");
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["shape"]["layers"], 5);
  EXPECT_EQ(j["shape"]["window_layers"], 0);
  ASSERT_EQ(j["results"].size(), 4u);
  EXPECT_TRUE(j["results"][0].contains("skipped"));  // hybrid: the model has no window layers
  for (size_t i = 2; i < 4; ++i) {
    const nlohmann::json& r = j["results"][i];
    ASSERT_FALSE(r.contains("skipped")) << r.dump();
    const uint64_t blocks = kMiB / BlockBytes(5, 4, 8, r["kv_format"].get<std::string>().c_str());
    EXPECT_EQ(r["admitted"], blocks / 16) << r.dump();
    EXPECT_EQ(r["admitted_expected"], blocks / 16);
    EXPECT_TRUE(r["admit_refused_after"].get<bool>());
    EXPECT_EQ(r["filled"], r["admitted"]);
    EXPECT_EQ(r["append_failures"], 0);
    EXPECT_TRUE(r["fill_ok"].get<bool>()) << r.dump();
    EXPECT_TRUE(r["ok"].get<bool>());
    ASSERT_EQ(r["groups"].size(), 1u);
    const nlohmann::json& g = r["groups"][0];
    EXPECT_EQ(g["admission_blocks_per_sequence"], 16);
    EXPECT_EQ(g["blocks_per_sequence_at_context"], 16);
    EXPECT_EQ(g["blocks_used"], 16 * r["filled"].get<uint64_t>());
    EXPECT_DOUBLE_EQ(g["bits_per_value"].get<double>(), 16.0);
    for (const char* key : {"mib_per_sequence", "used_mib", "rss_before_mib", "rss_after_fill_mib", "rss_growth_mib",
                            "fill_seconds"}) {
      EXPECT_TRUE(r.contains(key)) << key;
    }
  }
}

// A synthetic window model: layers 0-2 attend to a window of 32, layer 3 to
// every position. At 512 positions, chunks of 16 and a slack of 16, a
// sequence reserves 32 full-group blocks and ceil((32 + 16 + 16 - 1) / 16) =
// 4 window-group blocks, and holds 32 - floor((512 - 32 - 16) / 16) = 3 of
// them once filled. The pools split the budget so that each holds the same
// number of sequences.
TEST(CliBenchCapacity, WindowModelReservesEachGroupsWorstCase) {
  const nlohmann::json j = RunJson(
      "--layers 4 --kv-heads 1 --head-dim 64 --window 32 --global-every 4 --context 512 --budget-mib 1 "
      "--max-chunk 16 --window-slack 16 --kv-formats 'bf16;global=q8_0,local=bf16' --threads 2");
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["shape"]["window_layers"], 3);
  ASSERT_EQ(j["results"].size(), 2u);
  for (const nlohmann::json& r : j["results"]) {
    ASSERT_FALSE(r.contains("skipped")) << r.dump();
    ASSERT_EQ(r["groups"].size(), 2u);
    const bool mixed = r["kv_format"] != "bf16";
    const uint64_t full_block = BlockBytes(1, 1, 64, mixed ? "q8_0" : "bf16");
    const uint64_t window_block = BlockBytes(3, 1, 64, "bf16");
    const uint64_t seq_bytes = 32 * full_block + 4 * window_block;
    const uint64_t full_blocks = kMiB * 32 / seq_bytes, window_blocks = kMiB * 4 / seq_bytes;
    const uint64_t expected = std::min(full_blocks / 32, window_blocks / 4);
    EXPECT_GT(expected, 1u);
    EXPECT_EQ(r["admitted"], expected) << r.dump();
    EXPECT_EQ(r["filled"], expected);
    EXPECT_TRUE(r["fill_ok"].get<bool>()) << r.dump();
    const nlohmann::json& full = r["groups"][0];
    const nlohmann::json& window = r["groups"][1];
    EXPECT_EQ(full["group"], "global");
    EXPECT_EQ(full["pool_blocks"], full_blocks);
    EXPECT_EQ(window["pool_blocks"], window_blocks);
    EXPECT_EQ(full["admission_blocks_per_sequence"], 32);
    EXPECT_EQ(window["admission_blocks_per_sequence"], 4);
    EXPECT_EQ(full["blocks_used"], 32 * expected);
    EXPECT_EQ(window["blocks_per_sequence_at_context"], 3);
    EXPECT_EQ(window["blocks_used"], 3 * expected);
  }
}

TEST(CliBenchCapacity, NoFillAndCapsAndBadInput) {
  nlohmann::json j = RunJson("--layers 2 --kv-heads 2 --head-dim 64 --context 64 --budget-mib 1 --kv-formats q8_0 "
                             "--layouts full --no-fill");
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["results"][0]["filled"], 0);
  EXPECT_GT(j["results"][0]["admitted"].get<uint64_t>(), 0u);
  j = RunJson("--layers 2 --kv-heads 2 --head-dim 64 --context 64 --budget-mib 1 --kv-formats q8_0 "
              "--full-only --sequences-max 3");
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["results"].size(), 1u);
  EXPECT_EQ(j["results"][0]["filled"], 3);
  EXPECT_EQ(j["results"][0]["groups"][0]["blocks_used"], 3 * 4);
  EXPECT_NE(testing::RunCli("bench capacity --layers 2 --context 64 --kv-formats nope").exit_code, 0);
  EXPECT_NE(testing::RunCli("bench capacity --layers 2 --context 64 --layouts sideways").exit_code, 0);
  // A budget below one sequence.
  EXPECT_NE(testing::RunCli("bench capacity --layers 2 --context 4096 --budget-mib 0.01 --kv-formats bf16 "
                            "--layouts full")
                .exit_code,
            0);
}

}  // namespace
}  // namespace kvcache
