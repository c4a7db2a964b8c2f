// `kvcache soak` end to end: a short run from two threads must report its
// operations and checks, no invariant failure and nothing leaked (blocks or
// heap bytes), in the documented JSON fields; with --tiers, acquires served
// by the host and disk tiers under the same checks; bad options fail cleanly.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace kvcache {
namespace {

struct SoakRun {
  int exit_code = -1;
  std::string out, err;
};

SoakRun Soak(const std::string& args) {
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  const std::string base = testing::TempDir() + "/kvcache_soak_test_" + info->name();
  const std::string cmd = std::string("'") + KVCACHE_CLI_PATH + "' soak " + args + " >'" + base +
                          ".out' 2>'" + base + ".err'";
  const int status = std::system(cmd.c_str());
  SoakRun r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  for (auto [path, dst] : {std::pair{base + ".out", &r.out}, std::pair{base + ".err", &r.err}}) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    *dst = ss.str();
  }
  return r;
}

TEST(SoakCliTest, ShortRunIsCleanAndReportsEveryField) {
  const SoakRun r = Soak("--seconds 2 --threads 2 --blocks 96 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  for (const char* f : {"operations", "invariant_checks", "invariant_failures", "rss_start_bytes",
                        "rss_peak_bytes", "rss_end_bytes", "pool_blocks_leaked", "bytes_leaked"}) {
    ASSERT_TRUE(j.contains(f)) << f;
    EXPECT_TRUE(j[f].is_number_unsigned()) << f;
  }
  EXPECT_GT(j["operations"].get<uint64_t>(), 1000u);
  EXPECT_GT(j["invariant_checks"].get<uint64_t>(), 100u);
  EXPECT_EQ(j["invariant_failures"].get<uint64_t>(), 0u) << j["first_failure"];
  EXPECT_EQ(j["pool_blocks_leaked"].get<uint64_t>(), 0u);
  EXPECT_EQ(j["bytes_leaked"].get<uint64_t>(), 0u);
  EXPECT_GT(j["requests"].get<uint64_t>(), 0u);
  EXPECT_GT(j["drafts"].get<uint64_t>(), 0u);
  EXPECT_GE(j["rss_peak_bytes"].get<uint64_t>(), j["rss_end_bytes"].get<uint64_t>());
  EXPECT_GT(j["rss_start_bytes"].get<uint64_t>(), 0u);
}

TEST(SoakCliTest, StopsAfterOperationsAndPreemptsUnderPressure) {
  // A pool too small for four running requests per thread: admission is
  // refused and sequences are preempted, and still nothing leaks.
  const SoakRun r = Soak("--seconds 0 --operations 20000 --threads 2 --blocks 24 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_GE(j["operations"].get<uint64_t>(), 20000u);
  EXPECT_LT(j["operations"].get<uint64_t>(), 20100u);
  EXPECT_GT(j["preemptions"].get<uint64_t>(), 0u);
  EXPECT_EQ(j["invariant_failures"].get<uint64_t>(), 0u) << j["first_failure"];
  EXPECT_EQ(j["pool_blocks_leaked"].get<uint64_t>(), 0u);
}

TEST(SoakCliTest, TiersServeAcquiresUnderTheSameChecks) {
  // More shared prefixes than the pool keeps: acquires come back from the
  // host and disk tiers, every adopted row is checked, nothing leaks.
  const std::string disk = testing::TempDir() + "/kvcache_soak_test_disk";
  const SoakRun r = Soak("--seconds 0 --operations 40000 --threads 2 --blocks 48 --system-prompts 40"
                         " --tiers host:2MiB,disk:" + disk + ":4MiB --json");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["invariant_failures"].get<uint64_t>(), 0u) << j["first_failure"];
  EXPECT_EQ(j["pool_blocks_leaked"].get<uint64_t>(), 0u);
  EXPECT_EQ(j["bytes_leaked"].get<uint64_t>(), 0u);
  ASSERT_TRUE(j.contains("tiers"));
  ASSERT_EQ(j["tiers"].size(), 2u);
  uint64_t hits = 0;
  for (const auto& t : j["tiers"]) {
    EXPECT_GT(t["stored_blocks"].get<uint64_t>(), 0u) << t["name"];
    for (const char* m : {"corrupt", "incompatible", "token_mismatch"}) {
      EXPECT_EQ(t["misses"][m].get<uint64_t>(), 0u) << t["name"] << " " << m;
    }
    hits += t["hit_blocks"].get<uint64_t>();
  }
  EXPECT_EQ(j["tiers"][0]["name"], "host");
  EXPECT_EQ(j["tiers"][1]["name"], "disk");
  EXPECT_GT(hits, 0u);
  EXPECT_GT(j["tier_served_tokens"].get<uint64_t>(), 0u);
}

TEST(SoakCliTest, WithoutTiersTheJsonHasNoTierFields) {
  const SoakRun r = Soak("--seconds 0 --operations 3000 --threads 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_FALSE(j.contains("tiers"));
  EXPECT_FALSE(j.contains("tier_served_tokens"));
}

TEST(SoakCliTest, BadOptionsFailCleanly) {
  EXPECT_EQ(Soak("--threads 0").exit_code, 2);
  EXPECT_EQ(Soak("--seconds 0").exit_code, 2);
  EXPECT_EQ(Soak("--seconds 1 --tiers nowhere:1GiB").exit_code, 2);
  EXPECT_EQ(Soak("--seconds 1 --system-prompts 0").exit_code, 2);
}

}  // namespace
}  // namespace kvcache
