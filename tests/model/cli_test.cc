// `kvcache generate` / `kvcache perplexity` end to end through the binary,
// and the demo report function.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "kvcache/simd.h"
#include "model_fixture.h"
#include "tools/demo_report.h"
#include "tools/passkey_rule.h"

namespace kvcache::model {
namespace {

using ::kvcache::testing::CliRun;
using ::kvcache::testing::Exact;
using ::kvcache::testing::RunCli;
using ::kvcache::testing::RunCliWithStderr;

std::string ModelArgs() {
  const std::string dir = testing::ModelDir();
  return "--model " + dir + "stories260K_v1.bin --tokenizer " + dir + "tokenizer.bin";
}

// The cache backend when built, else the naive reference.
std::string BackendArg() {
  KvBackendOptions o;
  AttentionShape shape{1, 1, 1, 8, 16, {}};
  return CreateKvBackend(shape, o).ok() ? "--backend cache" : "--backend naive";
}

TEST(Cli, GenerateJsonWithAndWithoutDraft) {
  const std::string base = Exact("generate " + ModelArgs() + " " + BackendArg() +
                                 " --prompt 'Once upon a time' --steps 40 --json");
  CliRun plain = RunCli(base);
  ASSERT_EQ(plain.exit_code, 0) << plain.out;
  auto j = nlohmann::json::parse(plain.out);
  EXPECT_EQ(j["prompt_tokens"].size(), 5u);
  EXPECT_EQ(j["prompt_tokens"][0], 1);
  EXPECT_EQ(j["generated_tokens"].size(), 40u);
  EXPECT_GT(j["tokens_per_second"].get<double>(), 0.0);
  EXPECT_EQ(j["text"].get<std::string>().rfind("Once upon a time, there was a little girl", 0), 0u);

  CliRun spec = RunCli(base + " --draft 4 --layout paged");
  ASSERT_EQ(spec.exit_code, 0) << spec.out;
  auto s = nlohmann::json::parse(spec.out);
  EXPECT_EQ(s["generated_tokens"], j["generated_tokens"]);
  EXPECT_GE(s["acceptance_rate"].get<double>(), 0.0);
  EXPECT_LE(s["acceptance_rate"].get<double>(), 1.0);
}

TEST(Cli, PerplexityJsonAndUnsupportedFormats) {
  const std::string base = "perplexity " + ModelArgs() + " " + BackendArg() +
                           " --prompt 'Tom and Sue went to the park. They played on the swings.'"
                           " --json --kv-format ";
  CliRun f32 = RunCli(base + "f32");
  ASSERT_EQ(f32.exit_code, 0) << f32.out;
  auto j = nlohmann::json::parse(f32.out);
  EXPECT_TRUE(j["supported"].get<bool>());
  EXPECT_EQ(j["kl_vs_f32"].get<double>(), 0.0);
  EXPECT_EQ(j["top1_agree_vs_f32"].get<double>(), 1.0);
  EXPECT_GT(j["perplexity"].get<double>(), 1.0);

  for (const char* f : {"q4_0", "turbo4", "bf16:q8_0"}) {
    CliRun r = RunCli(base + f);
    EXPECT_EQ(r.exit_code, 3) << f;
    auto u = nlohmann::json::parse(r.out);
    EXPECT_FALSE(u["supported"].get<bool>()) << f;
    EXPECT_EQ(u["status"], "unsupported");
    EXPECT_NE(u["error"].get<std::string>().find("head_dim"), std::string::npos);
  }
  // Usage errors: no text, a bad format name, a missing model file.
  EXPECT_NE(RunCli("perplexity " + ModelArgs() + " --json").exit_code, 0);
  EXPECT_EQ(RunCli(base + "f33").exit_code, 2);
  EXPECT_EQ(RunCli("generate --model /nonexistent --tokenizer /nonexistent --prompt x").exit_code,
            2);
}

TEST(Cli, PerplexityKvVariantsOnTheNaiveBackend) {
  const std::string base = "perplexity " + ModelArgs() +
                           " --prompt 'Tom and Sue went to the park. They played on the swings.'"
                           " --json --backend naive --formats ";
  CliRun r = RunCli(base + "bf16+s2+r4,kc4:bf16,f32");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 3u);
  EXPECT_EQ(j[0]["kv_format"], "bf16:bf16+s2+r4");
  EXPECT_EQ(j[1]["kv_format"], "kc4:bf16");
  EXPECT_DOUBLE_EQ(j[1]["k_bits_per_value"].get<double>(), ((8192 - 15) * 6.0 + 15 * 16) / 8192);
  EXPECT_GT(j[1]["kl_vs_f32"].get<double>(), 0.0);
  EXPECT_EQ(j[2]["kl_vs_f32"].get<double>(), 0.0);  // f32 equals the reference
  // Unknown options, windows that do not fit, variants on the cache backend.
  EXPECT_EQ(RunCli(base + "bf16+zz").exit_code, 2);
  EXPECT_EQ(RunCli(base + "bf16+s4+r100000").exit_code, 2);
  EXPECT_EQ(RunCli("perplexity " + ModelArgs() + " --prompt 'Tom went' --backend cache --kv-format bf16+s4").exit_code,
            2);
}

TEST(Cli, BenchStepJsonIsConsistentPerFormatAndStreamCount) {
  CliRun r = RunCli("bench step " + ModelArgs() +
                    " --kv-formats f32,bf16 --streams 1,3 --context 40 --shared 24 --steps 2 --matmul f32 --threads 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["context"], 40);
  EXPECT_EQ(j["shared"], 24);
  ASSERT_EQ(j["results"].size(), 4u);
  const char* formats[] = {"f32", "f32", "bf16", "bf16"};
  const uint32_t streams[] = {1, 3, 1, 3};
  for (size_t i = 0; i < 4; ++i) {
    const auto& row = j["results"][i];
    EXPECT_EQ(row["kv_format"], formats[i]);
    EXPECT_EQ(row["streams"], streams[i]);
    const double step_ms = row["step_ms"].get<double>();
    ASSERT_GT(step_ms, 0.0);
    EXPECT_NEAR(row["tokens_per_s"].get<double>(), streams[i] * 1e3 / step_ms, 1e-6 * streams[i] * 1e3 / step_ms);
    EXPECT_NEAR(row["ms_per_token"].get<double>(), step_ms / streams[i], 1e-9 * step_ms);
    const double p = row["products_share"].get<double>(), a = row["attention_share"].get<double>();
    EXPECT_GT(p, 0.0);
    EXPECT_GT(a, 0.0);
    EXPECT_LE(p + a, 1.0);
    EXPECT_NEAR(row["other_share"].get<double>(), 1.0 - p - a, 1e-9);
  }
  // stories260K: 5 layers, 4 kv heads of 8 values; K and V per token.
  EXPECT_EQ(j["results"][0]["kv_bytes_per_token"], 5u * 4 * 8 * 2 * 4);
  EXPECT_EQ(j["results"][2]["kv_bytes_per_token"], 5u * 4 * 8 * 2 * 2);
  for (const auto& row : j["results"]) {
    EXPECT_EQ(row["fill_tokens"], 16);
    EXPECT_GT(row["fill_tokens_per_s"].get<double>(), 0.0);
    EXPECT_FALSE(row.contains("prefill_tokens"));  // no --prefill
  }
}

TEST(Cli, BenchStepTimesAPrefillAtDepth) {
  CliRun r = RunCli("bench step " + ModelArgs() +
                    " --kv-formats bf16 --streams 1,2 --context 40 --shared 8 --steps 1 --prefill 24 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["prefill"], 24);
  ASSERT_EQ(j["results"].size(), 2u);
  for (const auto& row : j["results"]) {
    EXPECT_EQ(row["prefill_tokens"], 24);
    const double ms = row["prefill_ms"].get<double>();
    ASSERT_GT(ms, 0.0);
    EXPECT_NEAR(row["prefill_tokens_per_s"].get<double>(), 24e3 / ms, 1e-6 * 24e3 / ms);
    EXPECT_EQ(row["fill_tokens"], 32);
  }
}

TEST(Cli, BenchStepBadOptionsFailCleanly) {
  const std::string base = "bench step " + ModelArgs() + " --steps 1 ";
  for (const char* bad : {"--context 40 --shared 40", "--streams 0", "--streams 2,x", "--kv-formats nope",
                          "--context 100000", "--matmul int3", "--kv-formats f32 --threads 0",
                          "--context 500 --prefill 100", "--prefill 70000"}) {
    CliRun r = RunCli(base + bad);
    EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.out;
    EXPECT_TRUE(r.out.empty()) << bad << ": " << r.out;
  }
}

// kvcache passkey --prompt-key: the prompt of one key at each depth, as ids.
// Every prompt has the same length, at most --context, BOS first and the
// question last; the deeper prompt starts with the shallower one's filler
// and holds the same key sentence further in, whole passes of the filler
// later. A key too long for the context, or a context too short for the
// question, fails cleanly.
TEST(Cli, PasskeyPrintsEachDepthsPromptAsIds) {
  CliRun r = RunCli("passkey " + ModelArgs() + " --context 400 --depths 0,0.25,0.5 --prompt-key 12345");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["prompts"].size(), 3u);
  const std::vector<int> z = j["prompts"][0]["ids"], a = j["prompts"][1]["ids"], b = j["prompts"][2]["ids"];
  ASSERT_LE(a.size(), 400u);
  ASSERT_EQ(b.size(), a.size());
  ASSERT_EQ(z.size(), a.size());
  EXPECT_EQ(a[0], 1);
  EXPECT_TRUE(std::equal(a.end() - 8, a.end(), b.end() - 8));
  // At depth 0 the key's sentence follows BOS; deeper, it stands whole
  // passes of the filler later: a's one pass, b's more.
  const auto key_at = [&z](const std::vector<int>& p) {
    return static_cast<size_t>(std::search(p.begin(), p.end(), z.begin() + 1, z.begin() + 11) - p.begin());
  };
  EXPECT_EQ(key_at(z), 1u);
  const size_t at = key_at(a), at_b = key_at(b);
  ASSERT_LT(at + 10, a.size());
  ASSERT_LT(at, at_b);
  const size_t pass = at - 1;
  EXPECT_EQ((at_b - 1) % pass, 0u);
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + at, b.begin()));  // the shared prefix
  for (size_t i = 1 + pass; i < at_b; ++i) EXPECT_EQ(b[i], b[i - pass]) << i;
  EXPECT_EQ(RunCli("passkey " + ModelArgs() + " --context 200 --prompt-key " + std::string(400, '7')).exit_code,
            2);
  EXPECT_EQ(RunCli("passkey " + ModelArgs() + " --context 10 --prompt-key 12345").exit_code, 2);
}

// kvcache passkey --answer-tokens N: every trial answers with exactly N
// greedy tokens (stop at EOS off), their ids and N itself in the JSON; the
// first tokens of a longer answer are the shorter one's (greedy); a trial
// is found when its answer's text holds the key as a whole number. 0, or
// more than the command allows, is a clean error.
TEST(Cli, PasskeyAnswersWithTheGivenNumberOfTokens) {
  const std::string base = "passkey " + ModelArgs() + " --context 200 --depths 0.5 --trials 3 --json";
  CliRun shorter = RunCli(base + " --answer-tokens 3");
  CliRun longer = RunCli(base + " --answer-tokens 6");
  ASSERT_EQ(shorter.exit_code, 0) << shorter.out;
  ASSERT_EQ(longer.exit_code, 0) << longer.out;
  const auto a = nlohmann::json::parse(shorter.out), b = nlohmann::json::parse(longer.out);
  EXPECT_EQ(a["answer_tokens"].get<int>(), 3);
  EXPECT_EQ(b["answer_tokens"].get<int>(), 6);
  const auto& ra = a["results"][0]["answers"];
  const auto& rb = b["results"][0]["answers"];
  ASSERT_EQ(ra.size(), 3u);
  ASSERT_EQ(rb.size(), 3u);
  for (size_t t = 0; t < 3; ++t) {
    const std::vector<int> ia = ra[t]["answer_ids"], ib = rb[t]["answer_ids"];
    ASSERT_EQ(ia.size(), 3u);
    ASSERT_EQ(ib.size(), 6u);
    EXPECT_TRUE(std::equal(ia.begin(), ia.end(), ib.begin())) << "trial " << t;
    EXPECT_EQ(ra[t]["key"], rb[t]["key"]);
    // found: one of the answer's runs of digits is the key.
    for (const auto* r : {&ra[t], &rb[t]}) {
      const std::string key = (*r)["key"], text = (*r)["answer"];
      bool whole = false;
      const std::regex digits("[0-9]+");
      for (auto it = std::sregex_iterator(text.begin(), text.end(), digits); it != std::sregex_iterator(); ++it) {
        whole = whole || it->str() == key;
      }
      EXPECT_EQ((*r)["found"].get<bool>(), whole) << "trial " << t << ": " << text;
    }
  }
  EXPECT_EQ(RunCli(base + " --answer-tokens 0").exit_code, 2);
  EXPECT_EQ(RunCli(base + " --answer-tokens 100000").exit_code, 2);
}

// kvcache passkey records what the cache spends at the prompt's length:
// the mean bits of a stored value (the precision window's bf16 rows kept
// beside their format rows: 16 bits more for each of them), and with an
// eviction policy the positions its budget keeps.
TEST(Cli, PasskeyRecordsWhatTheCacheSpends) {
  const std::string base = "passkey " + ModelArgs() + " --context 200 --depths 0.5 --trials 1 --json";
  CliRun windowed = RunCli(base + " --kv-format fp8_e4m3+s4+r20");
  ASSERT_EQ(windowed.exit_code, 0) << windowed.out;
  const auto w = nlohmann::json::parse(windowed.out);
  const double tokens = w["results"][0]["answers"][0]["prompt_tokens"].get<double>();
  ASSERT_GT(tokens, 24.0);
  EXPECT_DOUBLE_EQ(w["cache_bits_per_value"].get<double>(), 8.0 + 24.0 * 16.0 / tokens);
  EXPECT_FALSE(w.contains("kept_positions"));
  for (const auto& [eviction, kept] : {std::pair{"h2o:100,20", 100}, std::pair{"streaming:4,60", 64}}) {
    CliRun evicting = RunCli(base + " --kv-format bf16 --layout contiguous --eviction " + eviction);
    ASSERT_EQ(evicting.exit_code, 0) << evicting.out;
    const auto e = nlohmann::json::parse(evicting.out);
    EXPECT_EQ(e["cache_bits_per_value"].get<double>(), 16.0) << eviction;
    EXPECT_EQ(e["kept_positions"].get<int>(), kept) << eviction;
  }
}

// Every answer names the code that computed it: the dispatch SIMD target.
// The tiny model is a llama2.c checkpoint, whose products are f32 whatever
// --matmul says, so no answer names a bf16 kernel even with --matmul bf16
// (the Gemma tests check the GGUF case, where it does).
TEST(Cli, PasskeyAnswersNameTheCodeTheyRanOn) {
  const std::string base = "passkey " + ModelArgs() + " --context 200 --depths 0.5 --trials 2 --json";
  for (const char* matmul : {"f32", "bf16"}) {
    CliRun run = RunCli(base + " --matmul " + matmul);
    ASSERT_EQ(run.exit_code, 0) << run.out;
    const auto answers = nlohmann::json::parse(run.out)["results"][0]["answers"];
    ASSERT_EQ(answers.size(), 2u) << matmul;
    for (const auto& a : answers) {
      EXPECT_EQ(a.value("simd_target", std::string()), kvcache::SimdTarget()) << matmul;
      EXPECT_FALSE(a.contains("bf16_kernel")) << matmul;
    }
  }
}

// With an eviction policy each answer records which positions of the key's
// sentence every bounded layer's heads still attend to after the answer
// ('+' kept): StreamingLLM its sinks and the last WINDOW of the positions
// the cache holds (the prompt and every answer token but the last); H2O
// the rows each head holds. Without a policy there is nothing to record.
TEST(Cli, PasskeyRecordsWhichOfTheKeysPositionsEvictionKept) {
  const std::string base = "passkey " + ModelArgs() + " --context 200 --trials 1 --json --layout contiguous";
  for (const char* depth : {"0", "0.5", "1"}) {
    CliRun run = RunCli(base + " --depths " + depth + " --eviction streaming:4,60");
    ASSERT_EQ(run.exit_code, 0) << run.out;
    const auto j = nlohmann::json::parse(run.out);
    const auto& a = j["results"][0]["answers"][0];
    const size_t at = a["key_at"], held = a["prompt_tokens"].get<size_t>() + j["answer_tokens"].get<size_t>() - 1;
    const auto& kept = a["key_rows_kept"];
    ASSERT_EQ(kept.size(), 5u * 4u) << depth;  // every layer and kv head of the tiny model
    const size_t n = kept["0/0"].get<std::string>().size();
    std::string want;
    for (size_t p = at; p < at + n; ++p) want += p < 4 || p + 60 >= held ? '+' : '-';
    for (const auto& [name, rows] : kept.items()) EXPECT_EQ(rows, want) << depth << " " << name;
  }
  CliRun h2o = RunCli(base + " --depths 0.5 --eviction h2o:100,20");
  ASSERT_EQ(h2o.exit_code, 0) << h2o.out;
  const auto doc = nlohmann::json::parse(h2o.out);
  const auto& kept = doc["results"][0]["answers"][0]["key_rows_kept"];
  ASSERT_EQ(kept.size(), 5u * 4u);
  bool some_evicted = false;
  for (const auto& [name, rows] : kept.items()) {
    const std::string r = rows;
    EXPECT_EQ(r.size(), kept["0/0"].get<std::string>().size()) << name;
    EXPECT_EQ(r.find_first_not_of("+-"), std::string::npos) << name;
    some_evicted = some_evicted || r.find('-') != std::string::npos;
  }
  EXPECT_TRUE(some_evicted);  // 100 of the 188 positions kept: the key's sentence loses some rows
  CliRun none = RunCli(base + " --depths 0.5");
  ASSERT_EQ(none.exit_code, 0) << none.out;
  EXPECT_FALSE(nlohmann::json::parse(none.out)["results"][0]["answers"][0].contains("key_rows_kept"));
}

// kvcache passkey --out F keeps the document in F (complete at the end);
// --resume continues a stopped one: a document cut inside the second
// depth, resumed (with other --threads and --chunk), is the whole run's,
// answer for answer, and the trials it holds are kept, not run again. F
// is never overwritten without --resume, and a document of other settings (trials,
// seed), a key the seed does not draw, or --resume without --out is a
// clean error that leaves F as it was.
TEST(Cli, PasskeyResumesAStoppedRunFromItsDocument) {
  const std::string dir = ::testing::TempDir() + "kvcache_passkey_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string whole = dir + "/whole.json", part = dir + "/part.json";
  const std::string common = "passkey " + ModelArgs() + " --context 200 --depths 0.25,0.5 --json";
  const std::string base = common + " --trials 3";
  auto read = [](const std::string& path) {
    std::ifstream f(path);
    return nlohmann::json::parse(f, nullptr, false);
  };
  CliRun full = RunCli(base + " --out " + whole);
  ASSERT_EQ(full.exit_code, 0) << full.out;
  const nlohmann::json want = read(whole);
  ASSERT_TRUE(want.is_object());
  EXPECT_EQ(want, nlohmann::json::parse(full.out));
  EXPECT_TRUE(want["complete"].get<bool>());
  EXPECT_EQ(want["seed"].get<int>(), 1);
  EXPECT_EQ(want["prompt"], "whole filler passes");
  ASSERT_EQ(want["results"].size(), 2u);
  EXPECT_EQ(want["cache_bits_per_value"].get<double>(), 32.0);  // f32, every layer
  EXPECT_FALSE(want.contains("kept_positions"));  // no eviction

  // Stopped after the second depth's first trial, as the file would be.
  nlohmann::json cut = want;
  cut["complete"] = false;
  auto& answers = cut["results"][1]["answers"];
  answers.erase(answers.begin() + 1, answers.end());
  cut["results"][1]["found"] = answers[0]["found"].get<bool>() ? 1 : 0;
  auto write = [&](const nlohmann::json& doc) { std::ofstream(part) << doc.dump(2); };
  write(cut);
  CliRun resumed = RunCli(base + " --out " + part + " --resume --threads 1 --chunk 64");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out;
  EXPECT_EQ(read(part), want);
  EXPECT_EQ(nlohmann::json::parse(resumed.out), want);
  // A kept trial is not run again: its answer stays as the file has it.
  nlohmann::json marked = cut;
  marked["results"][0]["answers"][0]["answer"] = "kept as written";
  write(marked);
  ASSERT_EQ(RunCli(base + " --out " + part + " --resume").exit_code, 0);
  nlohmann::json want_marked = want;
  want_marked["results"][0]["answers"][0]["answer"] = "kept as written";
  EXPECT_EQ(read(part), want_marked);

  // A finished document from before the cache's figures were recorded
  // gains them when resumed, and nothing else changes.
  nlohmann::json bare = want;
  bare.erase("cache_bits_per_value");
  write(bare);
  ASSERT_EQ(RunCli(base + " --out " + part + " --resume").exit_code, 0);
  EXPECT_EQ(read(part), want);

  // Errors leave the file as it was.
  write(cut);
  for (const std::string& args : {base + " --out " + part,                          // exists, no --resume
                                  common + " --trials 4 --out " + part + " --resume",  // other settings
                                  base + " --out " + part + " --resume --seed 2",
                                  base + " --resume"}) {                             // no --out
    CliRun bad = RunCliWithStderr(args);
    EXPECT_EQ(bad.exit_code, 2) << args << ": " << bad.out;
    EXPECT_NE(bad.out.find("passkey"), std::string::npos) << bad.out;
    EXPECT_EQ(read(part), cut) << args;
  }
  nlohmann::json wrong_key = cut;
  wrong_key["results"][0]["answers"][2]["key"] = "12345";
  write(wrong_key);
  CliRun bad = RunCliWithStderr(base + " --out " + part + " --resume");
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  EXPECT_NE(bad.out.find("trial 3 at depth 0.25 has key \"12345\""), std::string::npos) << bad.out;
  EXPECT_EQ(read(part), wrong_key);
  // A document of the earlier prompts (cut at any token, no "prompt") is
  // not continued with these.
  nlohmann::json earlier = cut;
  earlier.erase("prompt");
  write(earlier);
  bad = RunCliWithStderr(base + " --out " + part + " --resume");
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  EXPECT_NE(bad.out.find("earlier prompts"), std::string::npos) << bad.out;
  EXPECT_EQ(read(part), earlier);
  std::filesystem::remove_all(dir);
}

// The pass key's rule: the key counts where it stands as a whole number,
// not inside a longer one; a wrong number before it does not hide it.
TEST(Cli, PasskeyFindsTheKeyOnlyAsAWholeNumber) {
  EXPECT_TRUE(tools::AnswerHoldsKey(" 47531. Remember it.", "47531"));
  EXPECT_TRUE(tools::AnswerHoldsKey(" the pass key. 47531 is", "47531"));
  EXPECT_TRUE(tools::AnswerHoldsKey("47531", "47531"));
  EXPECT_TRUE(tools::AnswerHoldsKey(" 4753. 47531 is", "47531"));
  EXPECT_TRUE(tools::AnswerHoldsKey(" 475312 or 47531", "47531"));  // a later whole occurrence
  EXPECT_FALSE(tools::AnswerHoldsKey(" 232088. Remember it. 2308", "23208"));
  EXPECT_FALSE(tools::AnswerHoldsKey(" 147531", "47531"));
  EXPECT_FALSE(tools::AnswerHoldsKey(" 4753", "47531"));
  EXPECT_FALSE(tools::AnswerHoldsKey("4753147531", "47531"));
  EXPECT_FALSE(tools::AnswerHoldsKey("", "47531"));
  EXPECT_FALSE(tools::AnswerHoldsKey(" 47531", ""));
}

// The pass key's prompt is cut only between passes of the filler: for every
// depth the key's sentence starts right after a whole pass and the question
// right after the last, and the prefix a depth's trials share is the
// prompt's start.
TEST(Cli, PasskeyPromptsCutOnlyBetweenPassesOfTheFiller) {
  const std::vector<int32_t> bos = {1}, filler = {10, 11, 12}, sentence = {20, 21}, question = {30, 31};
  // 1 + 2 + 2 + 3 * passes <= 20: 5 passes.
  const size_t passes = tools::PasskeyPasses(20, bos.size() + question.size() + 2, filler.size());
  ASSERT_EQ(passes, 5u);
  EXPECT_EQ(tools::PasskeyPasses(7, 5, 3), 0u);  // not one pass fits
  EXPECT_EQ(tools::PasskeyPasses(8, 5, 3), 1u);
  // Written out by hand for 0, 1 and all 5 passes before the key.
  const std::vector<std::pair<size_t, std::vector<int32_t>>> cases = {
      {0, {1, 20, 21, 10, 11, 12, 10, 11, 12, 10, 11, 12, 10, 11, 12, 10, 11, 12, 30, 31}},
      {1, {1, 10, 11, 12, 20, 21, 10, 11, 12, 10, 11, 12, 10, 11, 12, 10, 11, 12, 30, 31}},
      {5, {1, 10, 11, 12, 10, 11, 12, 10, 11, 12, 10, 11, 12, 10, 11, 12, 20, 21, 30, 31}}};
  for (const auto& [before, want] : cases) {
    std::vector<int32_t> prompt = tools::PasskeyPrefix(bos, filler, before);
    EXPECT_EQ(prompt.size(), 1 + 3 * before);
    const std::vector<int32_t> rest = tools::PasskeyRest(sentence, filler, passes, before, question);
    prompt.insert(prompt.end(), rest.begin(), rest.end());
    EXPECT_EQ(prompt, want) << before;
    EXPECT_EQ(prompt.size(), 1 + 2 + 3 * passes + 2u);
  }
}

TEST(DemoReport, PrintsStoryAndTable) {
  tools::DemoReportOptions o;
  o.model_path = testing::ModelDir() + "stories260K_v1.bin";
  o.tokenizer_path = testing::ModelDir() + "tokenizer.bin";
  o.story_tokens = 40;
  o.text = "Tom and Sue went to the park. They played on the swings and ate ice cream.";
  o.formats = {*ParseFormatPair("f32"), *ParseFormatPair("bf16"), *ParseFormatPair("q4_0")};
  o.backend.kind = BackendArg() == "--backend cache" ? BackendKind::kCache : BackendKind::kNaive;
  char* buf = nullptr;
  size_t size = 0;
  FILE* mem = open_memstream(&buf, &size);
  ASSERT_NE(mem, nullptr);
  Status s = tools::PrintDemoReport(o, mem);
  std::fclose(mem);
  const std::string text(buf, size);
  std::free(buf);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_NE(text.find("Once upon a time, there was a little girl named Lily"), std::string::npos)
      << text;
  EXPECT_NE(text.find("identical output"), std::string::npos) << text;
  EXPECT_NE(text.find("f32:f32"), std::string::npos);
  EXPECT_NE(text.find("bf16:bf16"), std::string::npos);
  EXPECT_NE(text.find("unsupported: format q4_0"), std::string::npos) << text;
}

}  // namespace
}  // namespace kvcache::model
