// Workloads: JSONL parsing (and its error messages), generators.
#include <gtest/gtest.h>

#include <fstream>

#include "kvcache/serving/workload.h"

namespace kvcache {
namespace {

TEST(WorkloadJsonl, ParsesBothPromptForms) {
  const std::string text =
      "{\"prompt_tokens\": [1, 2, 3], \"max_new_tokens\": 4, \"arrival\": 2.5}\n"
      "\n"
      "{\"prefix_id\": \"sys\", \"prompt_len\": 40, \"prefix_len\": 32, \"max_new_tokens\": 8,"
      " \"arrival\": 0, \"n\": 3, \"namespace\": \"t1\", \"id\": 77}\r\n"
      "{\"prefix_id\": \"sys\", \"prompt_len\": 36, \"max_new_tokens\": 8, \"arrival\": 1,"
      " \"output_tokens\": [5, 6]}\n";
  Result<std::vector<Request>> r = ParseWorkloadJsonl(text);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 3u);
  const Request& a = (*r)[0];  // sorted by arrival
  EXPECT_EQ(a.id, 77u);
  EXPECT_EQ(a.prompt.size(), 40u);
  EXPECT_EQ(a.num_samples, 3u);
  EXPECT_EQ(a.salt, "t1");
  const Request& b = (*r)[1];
  EXPECT_EQ(b.id, 3u);  // line 4
  EXPECT_EQ(b.output, (std::vector<TokenId>{5, 6}));
  // The same prefix_id gives the same tokens up to the shorter prefix_len.
  EXPECT_TRUE(std::equal(a.prompt.begin(), a.prompt.begin() + 32, b.prompt.begin()));
  // a's tokens after its prefix_len are its own.
  EXPECT_NE(std::vector<TokenId>(a.prompt.begin() + 32, a.prompt.begin() + 36),
            std::vector<TokenId>(b.prompt.begin() + 32, b.prompt.begin() + 36));
  const Request& c = (*r)[2];
  EXPECT_EQ(c.prompt, (std::vector<TokenId>{1, 2, 3}));
  EXPECT_EQ(c.max_new_tokens, 4u);
  EXPECT_DOUBLE_EQ(c.arrival, 2.5);
}

struct BadLine {
  const char* line;
  const char* expect;  // substring of the error after "line 3: "
};

TEST(WorkloadJsonl, RejectsMalformedLinesWithLineAndField) {
  const std::string good = "{\"prompt_tokens\": [1], \"max_new_tokens\": 1, \"arrival\": 0}\n";
  const BadLine cases[] = {
      {"{\"prompt_tokens\": [1], \"max_new_tokens\": 1", "not valid JSON"},
      {"[1, 2]", "not a JSON object"},
      {"{\"max_new_tokens\": 1, \"arrival\": 0}", "field prompt_tokens"},
      {"{\"prompt_tokens\": [1], \"prefix_id\": \"a\", \"prompt_len\": 3, \"max_new_tokens\": 1, \"arrival\": 0}", "field prompt_tokens"},
      {"{\"prompt_tokens\": [], \"max_new_tokens\": 1, \"arrival\": 0}", "field prompt_tokens: must not be empty"},
      {"{\"prompt_tokens\": [1, -2], \"max_new_tokens\": 1, \"arrival\": 0}", "field prompt_tokens: element 1"},
      {"{\"prompt_tokens\": [1, 4294967296], \"max_new_tokens\": 1, \"arrival\": 0}", "field prompt_tokens: element 1"},
      {"{\"prompt_tokens\": \"abc\", \"max_new_tokens\": 1, \"arrival\": 0}", "field prompt_tokens"},
      {"{\"prompt_tokens\": [1], \"arrival\": 0}", "field max_new_tokens: required"},
      {"{\"prompt_tokens\": [1], \"max_new_tokens\": 0, \"arrival\": 0}", "field max_new_tokens"},
      {"{\"prompt_tokens\": [1], \"max_new_tokens\": 2.5, \"arrival\": 0}", "field max_new_tokens"},
      {"{\"prompt_tokens\": [1], \"max_new_tokens\": 1}", "field arrival: required"},
      {"{\"prompt_tokens\": [1], \"max_new_tokens\": 1, \"arrival\": -1}", "field arrival"},
      {"{\"prompt_tokens\": [1], \"max_new_tokens\": 1, \"arrival\": \"now\"}", "field arrival"},
      {"{\"prefix_id\": \"a\", \"max_new_tokens\": 1, \"arrival\": 0}", "field prompt_len: required"},
      {"{\"prefix_id\": \"a\", \"prompt_len\": 4, \"prefix_len\": 5, \"max_new_tokens\": 1, \"arrival\": 0}", "field prefix_len"},
      {"{\"prefix_id\": [1], \"prompt_len\": 4, \"max_new_tokens\": 1, \"arrival\": 0}", "field prefix_id"},
      {"{\"prompt_tokens\": [1], \"prompt_len\": 4, \"max_new_tokens\": 1, \"arrival\": 0}", "field prompt_len"},
      {"{\"prompt_tokens\": [1], \"max_new_tokens\": 1, \"arrival\": 0, \"n\": 0}", "field n"},
      {"{\"prompt_tokens\": [1], \"max_new_tokens\": 1, \"arrival\": 0, \"namespace\": 3}", "field namespace"},
      {"{\"prompt_tokens\": [1], \"max_new_tokens\": 1, \"arrival\": 0, \"output_tokens\": [1, 2]}", "field output_tokens"},
      {"{\"prompt_tokens\": [1], \"max_new_tokens\": 1, \"arival\": 0}", "field arival: unknown field"},
  };
  for (const BadLine& c : cases) {
    SCOPED_TRACE(c.line);
    Result<std::vector<Request>> r = ParseWorkloadJsonl(good + "\n" + c.line + "\n" + good);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message().rfind("line 3: ", 0), 0u) << r.status().message();
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos) << r.status().message();
  }
  EXPECT_FALSE(ParseWorkloadJsonl("\n \n").ok());  // no requests
}

TEST(WorkloadJsonl, FileErrorsNameThePath) {
  const std::string path = testing::TempDir() + "/bad_workload.jsonl";
  {
    std::ofstream out(path);
    out << "{\"prompt_tokens\": [1], \"max_new_tokens\": 1, \"arrival\": 0}\n{oops}\n";
  }
  Result<std::vector<Request>> r = LoadWorkloadFile(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(path + ": line 2: not valid JSON"), std::string::npos)
      << r.status().message();
  EXPECT_EQ(LoadWorkloadFile(path + ".missing").status().code(), StatusCode::kIoError);
}

TEST(Workload, GeneratorsAreDeterministicAndShaped) {
  for (WorkloadKind kind : {WorkloadKind::kChat, WorkloadKind::kSharedPrefix,
                            WorkloadKind::kParallelSampling}) {
    SCOPED_TRACE(WorkloadKindName(kind));
    WorkloadOptions o;
    o.kind = kind;
    o.num_requests = 50;
    const std::vector<Request> a = GenerateWorkload(o), b = GenerateWorkload(o);
    ASSERT_EQ(a.size(), 50u);
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].prompt, b[i].prompt);
      EXPECT_EQ(a[i].arrival, b[i].arrival);
      EXPECT_FALSE(a[i].prompt.empty());
      EXPECT_LE(a[i].output.size(), a[i].max_new_tokens);
      if (i > 0) {
        EXPECT_LE(a[i - 1].arrival, a[i].arrival);
      }
    }
    EXPECT_EQ(ParseWorkloadKind(WorkloadKindName(kind)).value(), kind);
    o.seed = 2;
    EXPECT_NE(GenerateWorkload(o)[0].prompt, a[0].prompt);
  }
  EXPECT_FALSE(ParseWorkloadKind("nope").ok());
}

TEST(Workload, ChatTurnsExtendThePreviousTurn) {
  WorkloadOptions o;
  o.num_requests = 40;
  const std::vector<Request> w = GenerateWorkload(o);
  // Some request's prompt starts with another's prompt followed by its output.
  size_t continuations = 0;
  for (const Request& a : w) {
    for (const Request& b : w) {
      if (b.prompt.size() > a.prompt.size() + a.output.size() &&
          std::equal(a.prompt.begin(), a.prompt.end(), b.prompt.begin()) &&
          std::equal(a.output.begin(), a.output.end(), b.prompt.begin() + a.prompt.size())) {
        ++continuations;
      }
    }
  }
  EXPECT_GT(continuations, 10u);
}

}  // namespace
}  // namespace kvcache
