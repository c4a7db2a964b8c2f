// The OpenAI wire format of `kvcache serve`: request bodies of
// /v1/chat/completions and /v1/completions parsed and validated into plain
// structs, and the response objects, stream chunks and error objects built
// from the engine's events. Nothing here does I/O or touches the engine; the
// HTTP layer (server/http_server.h) glues the two.
//
// Parsing never throws and never aborts: every nlohmann exception is caught,
// every field's type and range is checked, and a bad body yields an
// ApiError (HTTP status, OpenAI error type, the offending field) instead.
// Serialising replaces invalid UTF-8 with U+FFFD, so no model output can
// make a response unencodable.
//
// Thread safety: free functions over values; call them from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"

namespace kvcache::server {

// An OpenAI error object's contents and the HTTP status it goes with.
enum class Endpoint : uint8_t { kChat, kCompletions };

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field; "" for none (null in JSON)
  std::string code;   // a machine-readable reason; "" for none (null in JSON)
};

ApiError BadRequest(std::string message, std::string param = "", std::string code = "");

// {"error": {"message", "type", "param", "code"}}, serialised.
std::string ErrorBody(const ApiError& error);
// The error a failed Status maps to: InvalidArgument/OutOfRange 400,
// PoolExhausted/CapacityExceeded (the queue is full) and
// FailedPrecondition (shutting down) 503, anything else 500.
ApiError ErrorFromStatus(const Status& status);
// The error a refused Submit maps to: a prompt the model cannot take names
// its field ("messages" or "prompt") and why (no_chat_template,
// empty_prompt, context_length_exceeded); anything else as ErrorFromStatus.
ApiError ErrorFromSubmit(const Status& status, engine::SubmitFault fault, Endpoint endpoint);
// A body for an HTTP status httplib produced itself (no route 404, a body
// over the limit 413, an unreadable request 400, ...).
ApiError ErrorForHttpStatus(int status);

// A validated request: which endpoint, the input (text: the engine
// tokenizes it), and the generation settings.
struct CompletionRequest {
  Endpoint endpoint = Endpoint::kChat;
  std::vector<engine::ChatMessage> messages;  // kChat: non-empty
  std::string prompt;                        // kCompletions
  std::string model;                         // as the client named it ("" if absent)
  std::optional<uint32_t> max_tokens;        // absent: up to the end of the context
  engine::SamplingParams sampling;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;
  uint32_t top_logprobs = 0;
  bool ignore_eos = false;     // extension
};

// Limits on what a request may ask for (the engine's own limits).
inline constexpr size_t kMaxStopStrings = 8;
inline constexpr uint32_t kMaxTopLogprobs = 20;
inline constexpr size_t kMaxJsonDepth = 64;

// Parses and validates a body. Returns the request, or the error to send.
// Accepted fields: model, messages (chat) / prompt (completions: a string
// or a one-string list), max_tokens, max_completion_tokens, temperature
// [0, 2], top_p (0, 1], top_k >= 0 (extension), seed, stop (a string or a
// list of up to 8 non-empty strings), stream, stream_options.include_usage,
// logprobs + top_logprobs [0, 20] (chat) / logprobs [0, 20] (completions),
// n (1 only), ignore_eos (extension); other fields the OpenAI API defines
// are accepted and ignored when they have their neutral value
// (frequency_penalty/presence_penalty 0, ...), and unknown fields are
// ignored, as OpenAI's servers do.
struct ParseResult {
  std::optional<CompletionRequest> request;
  ApiError error;
};
ParseResult ParseCompletionRequest(std::string_view body, Endpoint endpoint);

// Everything a response needs besides the engine's events.
struct ResponseContext {
  Endpoint endpoint = Endpoint::kChat;
  std::string id;       // "chatcmpl-..." / "cmpl-..."
  int64_t created = 0;  // unix seconds
  std::string model;    // the served model's name
};

// One generated token's log probabilities, with the token texts resolved.
struct LogprobEntry {
  std::string token;   // the token's bytes (may be part of a character)
  float logprob = 0;
  std::vector<std::pair<std::string, float>> top;  // most likely first
};

// The final text, finish reason and usage of a finished request.
struct Completion {
  std::string text;
  std::string finish_reason;  // "stop", "length", "cancelled", "error"
  engine::Usage usage;
  bool logprobs = false;
  std::vector<LogprobEntry> entries;
};

std::string_view FinishReasonString(engine::FinishReason reason);

nlohmann::json UsageJson(const engine::Usage& usage);
// The `stream: false` response object.
nlohmann::json CompletionJson(const ResponseContext& ctx, const Completion& completion);
// One stream chunk: `text` (with `entries` its tokens' log probabilities
// when requested); `finish_reason` empty for none (null); `role` sets the
// chat delta's role (the first chunk). include_usage adds "usage": null.
nlohmann::json ChunkJson(const ResponseContext& ctx, std::string_view text, bool role,
                         std::string_view finish_reason, bool logprobs,
                         const std::vector<LogprobEntry>& entries, bool include_usage);
// The last chunk of include_usage: no choices, the usage.
nlohmann::json UsageChunkJson(const ResponseContext& ctx, const engine::Usage& usage);

// The JSON text of `j`, invalid UTF-8 replaced (never throws).
std::string Dump(const nlohmann::json& j);
// "data: <json>\n\n" and the terminator "data: [DONE]\n\n".
std::string SseEvent(const nlohmann::json& j);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// GET /v1/models: one model.
nlohmann::json ModelsJson(const std::string& model, int64_t created);

}  // namespace kvcache::server
