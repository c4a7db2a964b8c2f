// Prefix reuse through the offload tiers on stories260K: CacheKv adopting a
// prefix found in a prefix cache (bit-identical logits to recomputing it),
// and `kvcache generate --tiers` run as separate processes over one disk
// folder or one Redis server: the second process loads the prompt's full
// blocks, runs the model on the rest only, and produces the same tokens and,
// with f32, byte-identical logits to an uncached run. Another format,
// block size or model file never hits; calibrated formats (q8, turbo*) are
// offloaded with their calibration.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "kvcache/serving/prefix_cache.h"
#include "model/decoder/decoder.h"
#include "model/io/model_fingerprint.h"
#include "model/kv/cache_kv.h"
#include "model_fixture.h"
#include "serving/redis_process.h"

namespace kvcache::model {
namespace {

namespace fs = std::filesystem;

// --- CacheKv::AdoptPrefix ----------------------------------------------

constexpr uint32_t kBlock = 16;

struct PagedRun {
  std::shared_ptr<BlockPool> pool;
  AttentionShape shape;
};

PagedRun NewPagedRun(const Decoder& d, FormatPair f) {
  PagedRun r;
  r.shape = d.attention_shape();
  r.shape.max_seq_len = 128;
  Geometry g = Geometry::Create({r.shape.n_layers, r.shape.n_kv_heads, r.shape.head_dim, kBlock}).value();
  BlockPoolOptions o;
  o.num_blocks = 32;
  o.huge_pages = false;
  r.pool = BlockPool::Create(g, f, o).value();
  return r;
}

std::unique_ptr<CacheKv> NewKv(const PagedRun& r, FormatPair f) {
  CacheKvOptions c;
  c.formats = f;
  c.layout = CacheLayout::kPaged;
  c.block_size = kBlock;
  c.pool = r.pool;
  return CacheKv::Create(r.shape, c).value();
}

std::vector<int32_t> StoryPrompt(size_t n) {
  const testing::Loaded* m = testing::Stories260K();
  std::vector<int32_t> ids = m->tokenizer.Encode(testing::kStoryText);
  EXPECT_GE(ids.size(), n);
  ids.resize(std::min(ids.size(), n));
  return ids;
}

// Flips the low bit of the byte `from_end` bytes before the end of `path`.
void FlipByteFromEnd(const fs::path& path, std::streamoff from_end) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-from_end, std::ios::end);
  const char c = static_cast<char>(f.peek());
  f.seekp(-from_end, std::ios::end);
  f.put(static_cast<char>(c ^ 0x01));
}

TEST(CacheKvAdoptPrefix, AdoptedBlocksGiveTheLogitsOfRecomputing) {
  const testing::Loaded* m = testing::Stories260K();
  ASSERT_NE(m, nullptr);
  Decoder d(m->model);
  const uint32_t vocab = d.config().vocab_size;
  const std::vector<int32_t> prompt = StoryPrompt(3 * kBlock + 5);
  ASSERT_EQ(prompt.size(), 3 * kBlock + 5);
  const std::vector<TokenId> ids(prompt.begin(), prompt.end());
  for (const char* fname : {"f32", "bf16", "fp8_e4m3"}) {
    SCOPED_TRACE(fname);
    const FormatPair f = ParseFormatPair(fname).value();
    PagedRun run = NewPagedRun(d, f);
    std::unique_ptr<PrefixCache> cache = PrefixCache::Create(run.pool).value();
    // One pass over the whole prompt, its 3 full blocks published.
    std::vector<float> want(vocab);
    {
      std::unique_ptr<CacheKv> kv = NewKv(run, f);
      ASSERT_TRUE(d.Forward(prompt, *kv, want).ok());
      const std::vector<BlockHash> h = HashFullBlocks(ids, kBlock, "");
      ASSERT_EQ(h.size(), 3u);
      auto n = cache->PublishHashed(h, kv->cache().block_table().first(3), 0,
                                    std::span<const TokenId>(ids).first(kBlock), "", nullptr,
                                    [&](size_t b, uint64_t hash) {
                                      return kv->SetBlockHash(static_cast<uint32_t>(b), hash);
                                    });
      ASSERT_TRUE(n.ok());
      EXPECT_EQ(*n, 3u);
    }  // released: the blocks stay cached in the pool
    PrefixMatch match = cache->Acquire(ids, "");
    ASSERT_EQ(match.blocks.size(), 3u);
    std::unique_ptr<CacheKv> kv = NewKv(run, f);
    ASSERT_TRUE(kv->AdoptPrefix(match.blocks, match.calibration).ok());
    EXPECT_EQ(kv->num_tokens(), 3 * kBlock);
    std::vector<float> got(vocab);
    ASSERT_TRUE(d.Forward(std::span<const int32_t>(prompt).subspan(3 * kBlock), *kv, got).ok());
    EXPECT_EQ(kv->num_tokens(), prompt.size());
    // The stored rows are the same bytes, so every format gives the same bits.
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), vocab * sizeof(float)));
    // Not empty any more: a second adoption is refused, nothing changed.
    EXPECT_EQ(kv->AdoptPrefix(match.blocks, nullptr).code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(kv->num_tokens(), prompt.size());
    EXPECT_TRUE(kv->cache().CheckInvariants().ok());
  }
}

TEST(CacheKvAdoptPrefix, RefusesContiguousAndTooLongPrefixes) {
  const testing::Loaded* m = testing::Stories260K();
  ASSERT_NE(m, nullptr);
  Decoder d(m->model);
  const FormatPair f = ParseFormatPair("f32").value();
  AttentionShape shape = d.attention_shape();
  shape.max_seq_len = 40;
  CacheKvOptions c;
  c.formats = f;
  std::unique_ptr<CacheKv> contiguous = CacheKv::Create(shape, c).value();
  const uint32_t none[1] = {0};
  EXPECT_EQ(contiguous->AdoptPrefix(std::span<const uint32_t>(none, 0), nullptr).code(),
            StatusCode::kFailedPrecondition);

  PagedRun run = NewPagedRun(d, f);
  run.shape.max_seq_len = 40;  // room for 2 blocks and a bit
  std::unique_ptr<CacheKv> kv = NewKv(run, f);
  std::vector<uint32_t> blocks(3);
  ASSERT_TRUE(run.pool->Allocate(blocks).ok());
  EXPECT_EQ(kv->AdoptPrefix(blocks, nullptr).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(kv->num_tokens(), 0u);
  ASSERT_TRUE(run.pool->Release(blocks).ok());  // still ours: nothing was taken over
  EXPECT_TRUE(run.pool->CheckInvariants().ok());
}

TEST(ModelFingerprint, ContentNotPath) {
  ASSERT_NE(testing::Stories260K(), nullptr);
  const std::string src = testing::ModelDir() + "stories260K_v1.bin";
  const fs::path dir = fs::temp_directory_path() / ("kvc_fp_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(src, dir / "copy.bin", fs::copy_options::overwrite_existing);
  const Result<std::string> fp = ModelFingerprint(src);
  ASSERT_TRUE(fp.ok()) << fp.status().ToString();
  const std::string a = *fp;
  EXPECT_EQ(a.rfind("xxh3-128:", 0), 0u) << a;
  EXPECT_EQ(ModelFingerprint((dir / "copy.bin").string()).value(), a);
  FlipByteFromEnd(dir / "copy.bin", 100);  // one byte of tensor data
  EXPECT_NE(ModelFingerprint((dir / "copy.bin").string()).value(), a);
  EXPECT_EQ(ModelFingerprint((dir / "missing.bin").string()).status().code(), StatusCode::kIoError);
  fs::remove_all(dir);
}

// --- kvcache generate --tiers, process after process --------------------

using ::kvcache::testing::CliRun;
using ::kvcache::testing::Exact;
using ::kvcache::testing::RunCli;

using ::kvcache::testing::ReadBytes;

class GenerateTiers : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(testing::Stories260K(), nullptr);
    dir_ = fs::temp_directory_path() /
           ("kvc_gen_tiers_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Model(const std::string& model_file = "") const {
    const std::string dir = testing::ModelDir();
    return "--model " + (model_file.empty() ? dir + "stories260K_v1.bin" : model_file) +
           " --tokenizer " + dir + "tokenizer.bin";
  }
  std::string Disk() const { return "disk:" + (dir_ / "disk").string() + ":64MiB"; }
  // generate --json with `extra`; logits to `logits` (a file in dir_).
  nlohmann::json Generate(const std::string& extra, const std::string& logits,
                          const std::string& model_file = "") {
    const CliRun r = RunCli(Exact("generate " + Model(model_file) + " --prompt '" + kPrompt +
                                  "' --steps 12 --json --logits-out " + (dir_ / logits).string() + " " +
                                  extra));
    // A failed run ends the test here (GoogleTest reports the exception):
    // the callers read its fields from const objects, where a missing one
    // is undefined behaviour, not a failure.
    if (r.exit_code != 0) throw std::runtime_error("generate failed: " + r.out);
    return nlohmann::json::parse(r.out);
  }
  std::string Logits(const std::string& name) const { return ReadBytes(dir_ / name); }

  static constexpr const char* kPrompt =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the park "
      "with her friends. One day, she saw a big red ball under a tree and ran to get it.";  // 62 tokens
  fs::path dir_;
};

// Full blocks of the prompt but its last token.
size_t ExpectedPrefix(const nlohmann::json& j, size_t block = kBlock) {
  return (j["prompt_tokens"].size() - 1) / block * block;
}

TEST_F(GenerateTiers, SecondProcessLoadsThePromptFromDisk) {
  const nlohmann::json plain = Generate("", "plain.npy");
  EXPECT_EQ(plain["prefix_tokens_by_tier"], nlohmann::json::parse(R"({"pool": 0})"));
  const nlohmann::json first = Generate("--tiers " + Disk(), "first.npy");
  const nlohmann::json second = Generate("--tiers " + Disk(), "second.npy");
  const size_t prefix = ExpectedPrefix(plain);
  ASSERT_EQ(prefix, 3 * kBlock);
  // The first process finds nothing and stores the prompt's full blocks.
  EXPECT_EQ(first["prefix_tokens_by_tier"], nlohmann::json::parse(R"({"pool": 0, "disk": 0})"));
  EXPECT_EQ(first["published_blocks"], plain["prompt_tokens"].size() / kBlock);
  EXPECT_EQ(first["tiers"][0]["stored_blocks"], first["published_blocks"]);
  // The second loads them and runs the model on the rest only.
  EXPECT_EQ(second["prefix_tokens_by_tier"]["disk"], prefix);
  EXPECT_EQ(second["prefix_tokens_by_tier"]["pool"], 0);
  EXPECT_EQ(second["prefix_tokens"], prefix);
  EXPECT_EQ(second["prefill_tokens"], plain["prompt_tokens"].size() - prefix);
  EXPECT_EQ(second["tiers"][0]["hit_tokens"], prefix);
  EXPECT_EQ(second["published_blocks"], 0);
  EXPECT_EQ(second["model_fingerprint"], first["model_fingerprint"]);
  // The same tokens, and with f32 the same logits to the byte.
  EXPECT_EQ(first["generated_tokens"], plain["generated_tokens"]);
  EXPECT_EQ(second["generated_tokens"], plain["generated_tokens"]);
  ASSERT_FALSE(Logits("plain.npy").empty());
  EXPECT_EQ(Logits("first.npy"), Logits("plain.npy"));
  EXPECT_EQ(Logits("second.npy"), Logits("plain.npy"));
}

TEST_F(GenerateTiers, AnotherFormatOrModelMisses) {
  (void)Generate("--tiers " + Disk(), "f32.npy");
  // Another K/V format: another compatibility digest, nothing served.
  const nlohmann::json bf16 = Generate("--kv-format bf16 --tiers " + Disk(), "bf16.npy");
  EXPECT_EQ(bf16["prefix_tokens"], 0);
  EXPECT_EQ(bf16["tiers"][0]["misses"]["absent"], 1);
  // ... and it stores its own blocks, which it then finds.
  const nlohmann::json bf16_again = Generate("--kv-format bf16 --tiers " + Disk(), "bf16b.npy");
  EXPECT_EQ(bf16_again["prefix_tokens_by_tier"]["disk"], ExpectedPrefix(bf16));
  EXPECT_EQ(bf16_again["generated_tokens"], bf16["generated_tokens"]);
  EXPECT_EQ(Logits("bf16b.npy"), Logits("bf16.npy"));
  // Another block size: other blocks.
  EXPECT_EQ(Generate("--block-size 8 --tiers " + Disk(), "b8.npy")["prefix_tokens"], 0);
  // Another model file: one byte of its weights changed. The same bytes
  // under another path hit (the fingerprint is of the content).
  const fs::path same = dir_ / "same.bin", other = dir_ / "other.bin";
  fs::copy_file(testing::ModelDir() + "stories260K_v1.bin", same);
  fs::copy_file(testing::ModelDir() + "stories260K_v1.bin", other);
  FlipByteFromEnd(other, 200);
  const nlohmann::json o = Generate("--tiers " + Disk(), "other.npy", other.string());
  EXPECT_EQ(o["prefix_tokens"], 0);
  EXPECT_NE(o["model_fingerprint"], bf16["model_fingerprint"]);
  const nlohmann::json s = Generate("--tiers " + Disk(), "same.npy", same.string());
  EXPECT_EQ(s["prefix_tokens_by_tier"]["disk"], ExpectedPrefix(s));
  EXPECT_EQ(Logits("same.npy"), Logits("f32.npy"));
}

TEST_F(GenerateTiers, CalibratedFormatsAreOffloaded) {
  // q8 and the turbo formats calibrate per sequence (a per-head mean, for q8
  // keys column scales, from the first rows): the blocks name their
  // calibration, stored beside them in the folder, and the next process
  // adopts both: the uncached run's tokens and logits. (The turbo formats
  // need head_dim % 16 == 0, stories260K's is 8: turbo4 is in
  // tests/model_smollm/tier_smollm_test.cc.)
  for (const std::string f : {"q8", "q8:bf16"}) {
    SCOPED_TRACE(f);
    fs::remove_all(dir_ / "disk");
    const nlohmann::json plain = Generate("--kv-format " + f, "plain.npy");
    const nlohmann::json a = Generate("--kv-format " + f + " --tiers " + Disk(), "a.npy");
    EXPECT_EQ(a["prefix_tokens"], 0);
    EXPECT_GT(a["published_blocks"].get<int>(), 0);
    EXPECT_EQ(a["tiers"][0]["stored_blocks"], a["published_blocks"]);
    const nlohmann::json b = Generate("--kv-format " + f + " --tiers " + Disk(), "b.npy");
    EXPECT_EQ(b["prefix_tokens_by_tier"]["disk"], ExpectedPrefix(b));
    EXPECT_EQ(b["tiers"][0]["hit_blocks"], ExpectedPrefix(b) / kBlock);
    EXPECT_EQ(b["tiers"][0]["misses"]["incompatible"], 0);
    EXPECT_EQ(b["tiers"][0]["misses"]["corrupt"], 0);
    EXPECT_EQ(b["generated_tokens"], a["generated_tokens"]);
    EXPECT_EQ(b["generated_tokens"], plain["generated_tokens"]);
    EXPECT_EQ(Logits("b.npy"), Logits("a.npy"));
    // Another format over the same folder never hits.
    const nlohmann::json other = Generate("--kv-format bf16 --tiers " + Disk(), "c.npy");
    EXPECT_EQ(other["prefix_tokens"], 0);
  }
}

TEST_F(GenerateTiers, WindowSinksTravelThroughTheFolder) {
  // A precision window of 4 sinks (q8: stories260K's head_dim 8 takes no
  // turbo format): the block completing the sinks carries their bf16 rows,
  // so the second process reads the first's sinks and gives its logits to
  // the byte. (Recent positions inside adopted blocks are read in the
  // format, so a window with them is not expected to give the same.)
  const nlohmann::json plain = Generate("--kv-format q8+s4", "plain.npy");
  const nlohmann::json a = Generate("--kv-format q8+s4 --tiers " + Disk(), "a.npy");
  EXPECT_EQ(a["prefix_tokens"], 0);
  const nlohmann::json b = Generate("--kv-format q8+s4 --tiers " + Disk(), "b.npy");
  EXPECT_EQ(b["prefix_tokens_by_tier"]["disk"], ExpectedPrefix(b));
  EXPECT_EQ(b["tiers"][0]["misses"]["corrupt"], 0);
  EXPECT_EQ(b["generated_tokens"], plain["generated_tokens"]);
  ASSERT_FALSE(Logits("a.npy").empty());
  EXPECT_EQ(Logits("b.npy"), Logits("a.npy"));
  // Another window over the same folder adopts the blocks without them.
  const nlohmann::json other = Generate("--kv-format q8+s2 --tiers " + Disk(), "c.npy");
  EXPECT_EQ(other["prefix_tokens_by_tier"]["disk"], ExpectedPrefix(other));
}

TEST_F(GenerateTiers, PublishGeneratedServesAContinuation) {
  const nlohmann::json first =
      Generate("--publish-generated --tiers " + Disk(), "first.npy");
  // Prompt + generated tokens as the next prompt: the generated tokens'
  // full blocks come from the tier too.
  std::vector<int32_t> next = first["prompt_tokens"].get<std::vector<int32_t>>();
  for (int32_t t : first["generated_tokens"].get<std::vector<int32_t>>()) next.push_back(t);
  std::string ids;
  for (int32_t t : next) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  auto run = [&](const std::string& extra, const std::string& logits) {
    const CliRun r = RunCli(Exact("generate " + Model() + " --prompt-ids " + ids + " --steps 6 --json --logits-out " +
                                  (dir_ / logits).string() + " " + extra));
    EXPECT_EQ(r.exit_code, 0) << r.out;
    return r.exit_code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json::object();
  };
  const nlohmann::json plain = run("", "plain.npy");
  const nlohmann::json cont = run("--tiers " + Disk(), "cont.npy");
  // The first run's cache held prompt + generated but the last token; this
  // run looks up all but its last token: the same positions.
  EXPECT_EQ(cont["prefix_tokens_by_tier"]["disk"], (next.size() - 1) / kBlock * kBlock);
  EXPECT_GT(cont["prefix_tokens"].get<size_t>(), first["prompt_tokens"].size() / kBlock * kBlock);
  EXPECT_EQ(cont["generated_tokens"], plain["generated_tokens"]);
  EXPECT_EQ(Logits("cont.npy"), Logits("plain.npy"));
}

TEST_F(GenerateTiers, SecondProcessLoadsThePromptFromRedis) {
  kvcache::testing::RedisProcess redis;
  ASSERT_TRUE(redis.Start()) << "redis-server could not be started on 127.0.0.1 (apt-get install redis-server)";
  const nlohmann::json plain = Generate("", "plain.npy");
  const nlohmann::json first = Generate("--tiers " + redis.url(), "first.npy");
  const nlohmann::json second = Generate("--tiers " + redis.url(), "second.npy");
  EXPECT_EQ(first["prefix_tokens_by_tier"]["redis"], 0);
  EXPECT_EQ(second["prefix_tokens_by_tier"]["redis"], ExpectedPrefix(plain));
  EXPECT_EQ(second["generated_tokens"], plain["generated_tokens"]);
  EXPECT_EQ(Logits("second.npy"), Logits("plain.npy"));
  // Disk first, then Redis: a process with an empty disk folder asks the
  // disk, then Redis, which has the prefix.
  const nlohmann::json third = Generate("--tiers " + Disk() + "," + redis.url(), "third.npy");
  EXPECT_EQ(third["prefix_tokens_by_tier"]["disk"], 0);
  EXPECT_EQ(third["prefix_tokens_by_tier"]["redis"], ExpectedPrefix(plain));
  EXPECT_EQ(Logits("third.npy"), Logits("plain.npy"));
  // The server gone: the run still succeeds, recomputing the prompt (misses
  // counted as unavailable), with the same output.
  redis.Stop();
  const nlohmann::json down = Generate("--tiers " + redis.url(), "down.npy");
  EXPECT_EQ(down["prefix_tokens"], 0);
  EXPECT_GT(down["tiers"][0]["misses"]["unavailable"].get<int>() + down["tiers"][0]["misses"]["timeout"].get<int>(), 0);
  EXPECT_EQ(down["generated_tokens"], plain["generated_tokens"]);
  EXPECT_EQ(Logits("down.npy"), Logits("plain.npy"));
}

TEST_F(GenerateTiers, UsageErrors) {
  const std::string base = "generate " + Model() + " --prompt 'Once upon a time' --steps 2 --json ";
  EXPECT_EQ(RunCli(base + "--tiers " + Disk() + " --layout contiguous").exit_code, 2);
  EXPECT_EQ(RunCli(base + "--tiers " + Disk() + " --backend naive").exit_code, 2);
  EXPECT_EQ(RunCli(base + "--tiers floppy:1GiB").exit_code, 2);
  EXPECT_EQ(RunCli(base + "--tiers disk:" + (dir_ / "d").string()).exit_code, 2);  // no size
  // --layout paged is what --tiers runs anyway.
  EXPECT_EQ(RunCli(base + "--tiers " + Disk() + " --layout paged").exit_code, 0);
}

}  // namespace
}  // namespace kvcache::model
