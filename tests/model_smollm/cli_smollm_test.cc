// `kvcache generate` / `kvcache perplexity` / `kvcache serve` on SmolLM2's
// GGUF through the binary: chat generation (plain == speculative), token-id
// prompts, the defaults (a bf16 cache, the products `auto` picks) and the
// lines that say them, several formats against one f32 run with per-token
// log-probabilities written as .npy, per-group formats refused by `serve` on
// a model without sliding-window layers, and a broken GGUF failing with its
// reason.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_runner.h"
#include "kvcache/format.h"
#include "kvcache/npy.h"
#include "model/tensor/matmul.h"
#include "model_smollm/smollm_fixture.h"

namespace kvcache::model {
namespace {

using ::kvcache::testing::CliRun;
using ::kvcache::testing::Exact;
using ::kvcache::testing::RunCli;
using ::kvcache::testing::RunCliWithStderr;
using ::kvcache::testing::ServeStartupLine;

TEST(SmolLm2Cli, ChatGenerationPlainEqualsSpeculative) {
  ASSERT_NE(testing::SmolLm2Gguf(), nullptr);
  const std::string base = "generate --model " + SmolLm2Path() +
                           " --chat --prompt 'What is the capital of France?' --steps 16 --json";
  const CliRun plain = RunCli(Exact(base));
  ASSERT_EQ(plain.exit_code, 0) << plain.out;
  const auto j = nlohmann::json::parse(plain.out);
  EXPECT_NE(j["text"].get<std::string>().find("Paris"), std::string::npos) << j["text"];
  EXPECT_EQ(j["prompt_tokens"][0], 1);  // <|im_start|>
  const CliRun spec = RunCli(Exact(base + " --draft 3 --kv-format q8_0:q8_0 --layout paged"));
  ASSERT_EQ(spec.exit_code, 0) << spec.out;
  const auto s = nlohmann::json::parse(spec.out);
  EXPECT_EQ(s["kv_format"], "q8_0:q8_0");
  // A q8_0 cache may pick other tokens than f32 in principle; for this short
  // answer it does not, and the draft never changes the output.
  EXPECT_EQ(s["generated_tokens"], j["generated_tokens"]);

  const CliRun ids = RunCli("generate --model " + SmolLm2Path() + " --prompt-ids 504,3458,282 --steps 4 --json");
  ASSERT_EQ(ids.exit_code, 0) << ids.out;
  EXPECT_EQ(nlohmann::json::parse(ids.out)["prompt_tokens"], nlohmann::json::parse("[504,3458,282]"));
  EXPECT_EQ(RunCli("generate --model " + SmolLm2Path() + " --prompt-ids 1,x --steps 2").exit_code, 2);
}

// --matmul int8 and bf16 run their products (and say so); their own
// speculative run still equals their plain one; a bad name is a usage error.
// perplexity --matmul scores them against the exact products: an f32 cache
// is no longer its own reference (KL > 0), while the reference's perplexity
// is the exact run's.
TEST(SmolLm2Cli, ApproximateMatMulInputs) {
  const std::string ppl = "perplexity --model " + SmolLm2Path() +
                          " --text-file /usr/share/common-licenses/GPL-3 --max-tokens 48 --chunk 16"
                          " --formats f32:f32 --json";
  const CliRun exact = RunCli(ppl);
  ASSERT_EQ(exact.exit_code, 0) << exact.out;
  const auto je = nlohmann::json::parse(exact.out)[0];
  EXPECT_EQ(je["kl_vs_f32"].get<double>(), 0.0);
  for (const std::string name : {"int8", "bf16"}) {
    SCOPED_TRACE(name);
    const std::string base = "generate --model " + SmolLm2Path() +
                             " --prompt-ids 504,3458,282,1116 --steps 8 --json --kv-format f32 --matmul " + name;
    const CliRun plain = RunCli(base);
    ASSERT_EQ(plain.exit_code, 0) << plain.out;
    const nlohmann::json j = nlohmann::json::parse(plain.out);
    EXPECT_EQ(j["matmul"], name);
    const CliRun spec = RunCli(base + " --draft 3");
    ASSERT_EQ(spec.exit_code, 0) << spec.out;
    EXPECT_EQ(nlohmann::json::parse(spec.out)["generated_tokens"], j["generated_tokens"]);
    const CliRun approx = RunCli(ppl + " --matmul " + name);
    ASSERT_EQ(approx.exit_code, 0) << approx.out;
    const auto ja = nlohmann::json::parse(approx.out)[0];
    EXPECT_GT(ja["kl_vs_f32"].get<double>(), 0.0);
    EXPECT_LT(ja["kl_vs_f32"].get<double>(), 0.05);
    EXPECT_EQ(ja["f32_mean_nll"], je["mean_nll"]);
  }
  const CliRun bad = RunCli("generate --model " + SmolLm2Path() + " --prompt-ids 1 --steps 1 --matmul int4");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(bad.out, "");
}

// Without flags: a bf16 cache and the products `--matmul auto` picks on
// this CPU, said in generate's JSON ("choice") and header and serve's
// startup line; the same tokens as those flags given. --kv-format f32
// --matmul f32 is the exact path, said without "(default)".
TEST(SmolLm2Cli, DefaultsAreABf16CacheAndTheAutoProducts) {
  ASSERT_NE(testing::SmolLm2Gguf(), nullptr);
  const MatMulChoice pick = AutoMatMulInputs();
  const std::string products = std::string(MatMulInputsName(pick.inputs));
  EXPECT_FALSE(pick.why.empty());
  EXPECT_EQ(ParseMatMulInputs("auto").value(), pick.inputs);
  const std::string said = "products " + products + " (auto: " + std::string(pick.why) + ")";
  const std::string base = "generate --model " + SmolLm2Path() + " --prompt-ids 504,3458,282,1116 --steps 6 --json";
  const CliRun plain = RunCli(base);
  ASSERT_EQ(plain.exit_code, 0) << plain.out;
  const auto j = nlohmann::json::parse(plain.out);
  EXPECT_EQ(j["kv_format"], "bf16:bf16");
  EXPECT_EQ(j["matmul"], products);
  EXPECT_EQ(j["choice"], "kv bf16:bf16 (default), " + said);
  const CliRun named = RunCli(base + " --kv-format bf16 --matmul " + products);
  ASSERT_EQ(named.exit_code, 0) << named.out;
  EXPECT_EQ(nlohmann::json::parse(named.out)["generated_tokens"], j["generated_tokens"]);
  EXPECT_EQ(nlohmann::json::parse(named.out)["choice"], "kv bf16:bf16, products " + products);
  const CliRun header = RunCliWithStderr("generate --model " + SmolLm2Path() + " --prompt-ids 504,3458 --steps 1");
  ASSERT_EQ(header.exit_code, 0) << header.out;
  EXPECT_NE(header.out.find("kvcache generate: kv bf16:bf16 (default), " + said), std::string::npos) << header.out;

  const std::string serve = "--model " + SmolLm2Path() + " --context 256 --pool-mib 16 --threads 1";
  const std::string line = ServeStartupLine(serve);
  EXPECT_NE(line.find("listening on http://127.0.0.1:"), std::string::npos) << line;
  EXPECT_NE(line.find("context 256, kv bf16 (default), " + said + ")"), std::string::npos) << line;
  const std::string exact = ServeStartupLine(serve + " --kv-format f32 --matmul f32");
  EXPECT_NE(exact.find("context 256, kv f32, products f32)"), std::string::npos) << exact;
}

// serve takes per-group formats as generate does; SmolLM2 has no
// sliding-window layers, so the engine refuses them, saying why, and serve
// exits non-zero before listening. A group name that is neither global nor
// local is named.
TEST(SmolLm2Cli, ServeRefusesPerGroupFormatsWithoutWindowLayers) {
  ASSERT_NE(testing::SmolLm2Gguf(), nullptr);
  const std::string serve = "serve --port 0 --model " + SmolLm2Path() + " --context 256 --pool-mib 16 --kv-format ";
  const CliRun groups = RunCliWithStderr(serve + "global=bf16,local=q8_0");
  EXPECT_NE(groups.exit_code, 0);
  EXPECT_EQ(groups.out.find("listening"), std::string::npos) << groups.out;
  EXPECT_NE(groups.out.find("per-group formats (global=...,local=...) need a model with sliding-window layers"),
            std::string::npos)
      << groups.out;
  const CliRun typo = RunCliWithStderr(serve + "globl=bf16,local=q8_0");
  EXPECT_NE(typo.exit_code, 0);
  EXPECT_NE(typo.out.find("globl"), std::string::npos) << typo.out;
  EXPECT_NE(typo.out.find("names no layer group"), std::string::npos) << typo.out;
}

// Token 173 is the lone byte 0xE2 (the start of a 3-byte character): the JSON
// text must still be valid UTF-8 (it aborted with a json type_error before).
TEST(SmolLm2Cli, JsonTextEndingInsideACharacterIsValid) {
  ASSERT_NE(testing::SmolLm2Gguf(), nullptr);
  const CliRun r =
      RunCli("generate --model " + SmolLm2Path() + " --prompt-ids 1,173 --steps 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_NE(j["text"].get<std::string>().find("\xEF\xBF\xBD"), std::string::npos)  // U+FFFD
      << j["text"];
}

TEST(SmolLm2Cli, PerplexityFormatsAndLogprobs) {
  ASSERT_NE(testing::SmolLm2Gguf(), nullptr);
  const std::string npy = ::testing::TempDir() + "smollm_lp.npy";
  const CliRun r = RunCli("perplexity --model " + SmolLm2Path() +
                          " --text-file /usr/share/common-licenses/GPL-3 --max-tokens 48 --chunk 16"
                          " --formats f32:f32,q8_0:q8_0,turbo3:turbo3 --json --logprobs-out " + npy);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), 3u);
  EXPECT_EQ(j[0]["kv_format"], "f32:f32");
  EXPECT_EQ(j[0]["kl_vs_f32"].get<double>(), 0.0);
  EXPECT_EQ(j[0]["num_predictions"], 47);
  for (int i = 1; i < 3; ++i) {
    EXPECT_GT(j[i]["kl_vs_f32"].get<double>(), 0.0) << j[i];
    EXPECT_EQ(j[i]["f32_mean_nll"], j[0]["mean_nll"]);
  }
  EXPECT_LT(j[1]["kl_vs_f32"].get<double>(), j[2]["kl_vs_f32"].get<double>());  // q8_0 beats turbo3
  EXPECT_EQ(j[2]["k_bits_per_value"].get<double>(), kvcache::BitsPerValue(kvcache::Format::kTurbo3, 64));
  // The f32 log-probabilities average to minus the mean NLL.
  auto a = ReadNpy(::testing::TempDir() + "smollm_lp.f32_f32.npy");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_EQ(a->shape, std::vector<uint64_t>{47});
  double sum = 0;
  for (float x : a->data) sum += x;
  EXPECT_NEAR(-sum / 47, j[0]["mean_nll"].get<double>(), 1e-5);
  EXPECT_TRUE(ReadNpy(::testing::TempDir() + "smollm_lp.turbo3_turbo3.npy").ok());
}

TEST(SmolLm2Cli, BrokenGgufFailsWithItsReason) {
  const std::string path = ::testing::TempDir() + "broken.gguf";
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fwrite("GGUF\x03\0\0\0", 1, 8, f);  // header cut after the version
  std::fclose(f);
  const CliRun r = RunCliWithStderr("generate --model " + path + " --prompt x");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("truncated header"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace kvcache::model
