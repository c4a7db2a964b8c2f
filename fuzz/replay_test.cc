// kvcache_fuzz_replay: the fuzz targets as plain GoogleTests, built with the
// normal compiler so that the release and sanitizer suites run them without
// libFuzzer.
//   CorpusReplay.<target>   feeds every file of fuzz/corpus/<target>/ to the
//                           target's entry function (a crash or a failed
//                           FUZZ_CHECK fails the test);
//   ApiSequence.FixedSeeds  runs the API-sequence decoder over inputs drawn
//                           from fixed seeds, everything checked after every
//                           operation, reporting the first broken check;
//   ApiSequence.RegressionInputsAtTheirOldLength  the corpus' regression-*
//                           inputs, found when an input ran 400 operations
//                           without length limits, run that way again.
// The list of targets comes from fuzz/CMakeLists.txt (KVCACHE_FUZZ_TARGETS,
// through the generated fuzz_targets.inc).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "fuzz/api_sequence.h"

#define KVCACHE_FUZZ_ENTRY(name) int KvcacheFuzz_##name(const uint8_t* data, size_t size);
#include "fuzz_targets.inc"
#undef KVCACHE_FUZZ_ENTRY

namespace {

struct Target {
  const char* name;
  int (*entry)(const uint8_t*, size_t);
};
const Target kTargets[] = {
#define KVCACHE_FUZZ_ENTRY(name) {#name, &KvcacheFuzz_##name},
#include "fuzz_targets.inc"
#undef KVCACHE_FUZZ_ENTRY
};

class CorpusReplay : public ::testing::TestWithParam<Target> {};

TEST_P(CorpusReplay, EveryFileRunsClean) {
  // KVCACHE_FUZZ_CORPUS=DIR replays DIR/<target>/ instead (a finding).
  const char* over = std::getenv("KVCACHE_FUZZ_CORPUS");
  const std::filesystem::path dir =
      std::filesystem::path(over ? over : KVCACHE_FUZZ_CORPUS_DIR) / GetParam().name;
  if (over && !std::filesystem::is_directory(dir)) GTEST_SKIP() << dir << " absent";
  ASSERT_TRUE(std::filesystem::is_directory(dir)) << dir << " is missing: every target has a corpus";
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::ifstream f(e.path(), std::ios::binary);
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)),
                                     std::istreambuf_iterator<char>());
    SCOPED_TRACE(e.path().string());
    // libFuzzer passes a non-null pointer even for empty inputs.
    static const uint8_t kEmpty = 0;
    EXPECT_EQ(GetParam().entry(bytes.empty() ? &kEmpty : bytes.data(), bytes.size()), 0);
    ++files;
  }
  if (!over) {
    EXPECT_GE(files, 2u) << "a corpus holds real files and near-misses";
  }
}

INSTANTIATE_TEST_SUITE_P(Targets, CorpusReplay, ::testing::ValuesIn(kTargets),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(ApiSequence, FixedSeeds) {
  // Seeds 1-60 as before (an input runs at most 48 operations now, so most
  // of their bytes go unread) and 61-480: about as many operations as the
  // 60 ran at up to 400 each.
  for (uint64_t seed = 1; seed <= 480; ++seed) {
    std::mt19937_64 rng(seed);
    std::vector<uint8_t> bytes(200 + rng() % 1800);
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
    const std::string failure =
        kvcache::fuzz::RunApiSequence(bytes.data(), bytes.size(), {.check_all = true});
    EXPECT_EQ(failure, "") << "seed " << seed;
    if (!failure.empty()) break;
  }
}

TEST(ApiSequence, RegressionInputsAtTheirOldLength) {
  // The fuzzer now stops an input at 48 operations and 32 tokens (so an
  // execution stays short); these inputs found their bug further in.
  kvcache::fuzz::ApiSequenceOptions old;
  old.check_all = true;
  old.max_ops = 400;
  old.max_tokens = UINT32_MAX;
  old.max_hybrid_tokens = UINT32_MAX;
  size_t files = 0;
  for (const auto& e :
       std::filesystem::directory_iterator(std::string(KVCACHE_FUZZ_CORPUS_DIR) + "/api_sequence")) {
    if (!e.path().filename().string().starts_with("regression-")) continue;
    std::ifstream f(e.path(), std::ios::binary);
    const std::vector<uint8_t> bytes{std::istreambuf_iterator<char>(f), {}};
    EXPECT_EQ(kvcache::fuzz::RunApiSequence(bytes.data(), bytes.size(), old), "") << e.path();
    ++files;
  }
  EXPECT_GE(files, 5u);
}

}  // namespace
