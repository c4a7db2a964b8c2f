// The OpenAI JSON layer of `kvcache serve`: request parsing and validation
// (every field's type and range, hostile bodies), and the response, chunk
// and error objects against hand-written expectations.
#include "server/openai_json.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

namespace kvcache::server {
namespace {

using json = nlohmann::json;

CompletionRequest ParseOk(std::string_view body, Endpoint e = Endpoint::kChat) {
  ParseResult r = ParseCompletionRequest(body, e);
  EXPECT_TRUE(r.request.has_value()) << body << " -> " << r.error.message;
  return r.request.value_or(CompletionRequest{});
}

ApiError ParseBad(std::string_view body, Endpoint e = Endpoint::kChat) {
  ParseResult r = ParseCompletionRequest(body, e);
  EXPECT_FALSE(r.request.has_value()) << body;
  return r.error;
}

TEST(OpenAiJson, ChatRequestFields) {
  CompletionRequest r = ParseOk(R"({"model": "m", "messages": [
      {"role": "system", "content": "be brief"},
      {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]}],
      "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "seed": -3,
      "stop": ["\n", "END"], "stream": true, "stream_options": {"include_usage": true},
      "logprobs": true, "top_logprobs": 3, "n": 1, "presence_penalty": 0, "user": "x"})");
  EXPECT_EQ(r.endpoint, Endpoint::kChat);
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "hi there");
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.max_tokens, 7u);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.top_k, 40u);
  EXPECT_EQ(r.sampling.seed, static_cast<uint64_t>(int64_t{-3}));
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 3u);
}

TEST(OpenAiJson, DefaultsAndAliases) {
  CompletionRequest r = ParseOk(R"({"messages": [{"role": "developer", "content": "x"}],
      "max_tokens": 5, "max_completion_tokens": 9, "temperature": null, "stop": "S"})");
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.max_tokens, 9u);  // the newer name wins
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.0f);
  EXPECT_FALSE(r.sampling.seed.has_value());
  EXPECT_EQ(r.stop, std::vector<std::string>{"S"});
  EXPECT_FALSE(r.stream);
  CompletionRequest c = ParseOk(R"({"prompt": ["once upon"], "logprobs": 2})", Endpoint::kCompletions);
  EXPECT_EQ(c.prompt, "once upon");
  EXPECT_TRUE(c.logprobs);
  EXPECT_EQ(c.top_logprobs, 2u);
  EXPECT_FALSE(ParseOk(R"({"prompt": "a"})", Endpoint::kCompletions).max_tokens.has_value());
}

TEST(OpenAiJson, FieldErrorsNameTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"messages": []})", "messages"},
      {R"({"messages": "hi"})", "messages"},
      {R"({"messages": [{"role": "tool", "content": "x"}]})", "messages"},
      {R"({"messages": [{"role": "user"}]})", "messages"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", "messages"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0})", "max_tokens"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": "9"})", "max_tokens"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 2.5})", "max_tokens"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 99999999999999999999})", "max_tokens"},
      {R"({"messages": [{"role": "user", "content": "x"}], "temperature": 3})", "temperature"},
      {R"({"messages": [{"role": "user", "content": "x"}], "temperature": true})", "temperature"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_p": 0})", "top_p"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_k": -2})", "top_k"},
      {R"({"messages": [{"role": "user", "content": "x"}], "seed": 1e300})", "seed"},
      {R"({"messages": [{"role": "user", "content": "x"}], "n": 2})", "n"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stop": [1]})", "stop"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stop": ["a","b","c","d","e","f","g","h","i"]})", "stop"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stream": "yes"})", "stream"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stream_options": 1})", "stream_options"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", "top_logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21})", "top_logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "frequency_penalty": 1})", "frequency_penalty"},
      {R"({"messages": [{"role": "user", "content": "x"}], "model": 5})", "model"},
  };
  for (const auto& [body, param] : cases) {
    ApiError e = ParseBad(body);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.param, param) << body;
    EXPECT_EQ(e.type, "invalid_request_error");
  }
  EXPECT_EQ(ParseBad(R"({"prompt": 3})", Endpoint::kCompletions).param, "prompt");
  EXPECT_EQ(ParseBad(R"({"prompt": "x", "logprobs": true})", Endpoint::kCompletions).param, "logprobs");
}

TEST(OpenAiJson, HostileBodiesAreErrorsNotCrashes) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string bodies[] = {
      "", "{", "{\"messages\": [", "null", "[]", "42", "\"str\"", "{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}",
      "{\"messages\": 1e999999}", deep, "{\"a\":" + deep + "}", std::string("{\"x\":\"\0\"}", 9),
      "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]} trailing",
  };
  for (const std::string& b : bodies) {
    ApiError e = ParseBad(b);
    EXPECT_EQ(e.status, 400);
    EXPECT_FALSE(e.message.empty());
    // The error object itself is valid JSON, whatever the input was.
    json parsed = json::parse(ErrorBody(e));
    EXPECT_EQ(parsed["error"]["type"], "invalid_request_error");
  }
}

// Random byte strings and random mutations of a valid body: every outcome
// is a request or a 400, never an exception.
TEST(OpenAiJson, RandomBodiesNeverThrow) {
  const std::string valid = R"({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4,
      "temperature": 0.7, "stop": ["x"], "stream": true, "logprobs": true, "top_logprobs": 2})";
  std::mt19937 rng(7);
  int accepted = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string b = valid;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < edits; ++k) {
      const size_t pos = rng() % b.size();
      switch (rng() % 3) {
        case 0: b[pos] = static_cast<char>(rng() % 256); break;
        case 1: b.erase(pos, 1 + rng() % 8); break;
        default: b.insert(pos, 1, "{}[]\",:0e-9tfn\\"[rng() % 15]); break;
      }
      if (b.empty()) b = "{";
    }
    ParseResult r = ParseCompletionRequest(b, i % 2 ? Endpoint::kChat : Endpoint::kCompletions);
    if (r.request) {
      ++accepted;
    } else {
      EXPECT_EQ(r.error.status, 400);
    }
  }
  EXPECT_LT(accepted, 3000);
}

TEST(OpenAiJson, ErrorObjects) {
  json e = json::parse(ErrorBody(BadRequest("bad", "max_tokens", "invalid_value")));
  EXPECT_EQ(e, json::parse(R"({"error": {"message": "bad", "type": "invalid_request_error",
                                        "param": "max_tokens", "code": "invalid_value"}})"));
  json n = json::parse(ErrorBody(ErrorForHttpStatus(404)));
  EXPECT_TRUE(n["error"]["param"].is_null());
  EXPECT_EQ(ErrorForHttpStatus(413).status, 413);
  EXPECT_EQ(ErrorForHttpStatus(405).code, "method_not_allowed");
  EXPECT_EQ(ErrorForHttpStatus(401).code, "invalid_api_key");
  EXPECT_EQ(ErrorFromStatus(Status::InvalidArgument("x")).status, 400);
  EXPECT_EQ(ErrorFromStatus(Status(StatusCode::kCapacityExceeded, "full")).status, 503);
  EXPECT_EQ(ErrorFromStatus(Status(StatusCode::kPoolExhausted, "full")).status, 503);
  EXPECT_EQ(ErrorFromStatus(Status::FailedPrecondition("down")).status, 503);
  EXPECT_EQ(ErrorFromStatus(Status::Internal("bug")).status, 500);
}

// A prompt Submit refused names its field and reason, as the HTTP layer's
// own tokenizing did; other refusals map as their Status.
TEST(OpenAiJson, SubmitErrors) {
  using engine::SubmitFault;
  struct Case {
    Status status;
    SubmitFault fault;
    Endpoint endpoint;
    int http;
    const char* param;
    const char* code;
  };
  const Status bad = Status::InvalidArgument("no");
  const Case cases[] = {
      {Status::Unimplemented("no template"), SubmitFault::kNoChatTemplate, Endpoint::kChat, 400, "messages",
       "no_chat_template"},
      {bad, SubmitFault::kPromptTooLong, Endpoint::kChat, 400, "messages", "context_length_exceeded"},
      {bad, SubmitFault::kPromptTooLong, Endpoint::kCompletions, 400, "prompt", "context_length_exceeded"},
      {bad, SubmitFault::kPromptEmpty, Endpoint::kCompletions, 400, "prompt", "empty_prompt"},
      {bad, SubmitFault::kPromptEncoding, Endpoint::kChat, 400, "messages", ""},
      {bad, SubmitFault::kPromptEncoding, Endpoint::kCompletions, 400, "prompt", ""},
      {bad, SubmitFault::kParams, Endpoint::kChat, 400, "", ""},
      {Status(StatusCode::kCapacityExceeded, "full"), SubmitFault::kEngine, Endpoint::kChat, 503, "", "queue_full"},
      {Status::FailedPrecondition("down"), SubmitFault::kEngine, Endpoint::kChat, 503, "", "shutting_down"},
  };
  for (const Case& c : cases) {
    const ApiError e = ErrorFromSubmit(c.status, c.fault, c.endpoint);
    EXPECT_EQ(e.status, c.http) << c.status.ToString();
    EXPECT_EQ(e.message, c.status.message());
    EXPECT_EQ(e.param, c.param) << c.status.ToString();
    EXPECT_EQ(e.code, c.code) << c.status.ToString();
  }
}

TEST(OpenAiJson, ChatCompletionObject) {
  ResponseContext ctx{Endpoint::kChat, "chatcmpl-7", 1700000000, "smol"};
  Completion c;
  c.text = "Hi!";
  c.finish_reason = "length";
  c.usage = {10, 3, 4};
  c.logprobs = true;
  c.entries = {{"Hi", -0.5f, {{"Hi", -0.5f}, {"Ho", -1.0f}}}};
  json j = CompletionJson(ctx, c);
  EXPECT_EQ(j["id"], "chatcmpl-7");
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["created"], 1700000000);
  EXPECT_EQ(j["model"], "smol");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Hi!");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"], json::parse(R"({"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13,
                                         "prompt_tokens_details": {"cached_tokens": 4}})"));
  const json& lp = j["choices"][0]["logprobs"]["content"][0];
  EXPECT_EQ(lp["token"], "Hi");
  EXPECT_FLOAT_EQ(lp["logprob"].get<float>(), -0.5f);
  EXPECT_EQ(lp["bytes"], json::parse("[72, 105]"));
  EXPECT_EQ(lp["top_logprobs"][1]["token"], "Ho");
}

TEST(OpenAiJson, TextCompletionObjectAndLogprobs) {
  ResponseContext ctx{Endpoint::kCompletions, "cmpl-1", 5, "m"};
  Completion c;
  c.text = "ab";
  c.finish_reason = "stop";
  c.logprobs = true;
  c.entries = {{"a", -1.0f, {{"a", -1.0f}}}, {"b", -2.0f, {{"b", -2.0f}, {"c", -3.0f}}}};
  json j = CompletionJson(ctx, c);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], "ab");
  EXPECT_FALSE(j["choices"][0].contains("message"));
  const json& lp = j["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], json::parse(R"(["a", "b"])"));
  EXPECT_EQ(lp["token_logprobs"], json::parse("[-1.0, -2.0]"));
  EXPECT_EQ(lp["top_logprobs"][1], json::parse(R"({"b": -2.0, "c": -3.0})"));
  EXPECT_EQ(lp["text_offset"], json::parse("[0, 1]"));
  c.logprobs = false;
  EXPECT_TRUE(CompletionJson(ctx, c)["choices"][0]["logprobs"].is_null());
}

TEST(OpenAiJson, StreamChunks) {
  ResponseContext ctx{Endpoint::kChat, "chatcmpl-2", 9, "m"};
  json first = ChunkJson(ctx, "", true, "", false, {}, true);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"], json::parse(R"({"role": "assistant", "content": ""})"));
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(first.contains("usage") && first["usage"].is_null());
  json mid = ChunkJson(ctx, "tok", false, "", false, {}, false);
  EXPECT_EQ(mid["choices"][0]["delta"], json::parse(R"({"content": "tok"})"));
  EXPECT_FALSE(mid.contains("usage"));
  json last = ChunkJson(ctx, "", false, "stop", false, {}, false);
  EXPECT_EQ(last["choices"][0]["delta"], json::object());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  json usage = UsageChunkJson(ctx, {3, 2, 0});
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 5);
  ResponseContext cc{Endpoint::kCompletions, "cmpl-2", 9, "m"};
  EXPECT_EQ(ChunkJson(cc, "x", false, "", false, {}, false)["choices"][0]["text"], "x");
  EXPECT_EQ(ChunkJson(cc, "x", false, "", false, {}, false)["object"], "text_completion");
  const std::string sse = SseEvent(mid);
  EXPECT_TRUE(sse.starts_with("data: {"));
  EXPECT_TRUE(sse.ends_with("}\n\n"));
  EXPECT_EQ(json::parse(sse.substr(6)), mid);
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
}

TEST(OpenAiJson, InvalidUtf8OutputIsReplaced) {
  ResponseContext ctx{Endpoint::kCompletions, "cmpl-3", 1, "m"};
  Completion c;
  c.text = "ok\xe2\x82";  // a cut-off euro sign
  c.finish_reason = "length";
  json j = json::parse(Dump(CompletionJson(ctx, c)));
  EXPECT_EQ(j["choices"][0]["text"], "ok\xef\xbf\xbd");
}

TEST(OpenAiJson, ModelsList) {
  json j = ModelsJson("smol", 3);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], "smol");
  EXPECT_EQ(j["data"][0]["object"], "model");
}

}  // namespace
}  // namespace kvcache::server
