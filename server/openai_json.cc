// The OpenAI request parser and response builders (see openai_json.h).
#include "server/openai_json.h"

#include <cmath>
#include <limits>

namespace kvcache::server {
namespace {

using json = nlohmann::json;

// The deepest [ / { nesting in `body`, strings skipped; stops counting
// past `limit` (the parser never sees a deeper document).
size_t NestingDepth(std::string_view body, size_t limit) {
  size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : body) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) return deepest;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

// The field `key` of object `j`, or nullptr when absent or null.
const json* Field(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string TypeError(const char* key, const char* want) {
  return std::string("'") + key + "' must be " + want;
}

// A number field within [lo, hi] ((lo, hi] when lo_open); false (and *err)
// when mistyped or out of range.
bool ReadNumber(const json& j, const char* key, double lo, double hi, std::optional<double>* out,
                ApiError* err, bool lo_open = false) {
  const json* f = Field(j, key);
  if (f == nullptr) return true;
  if (!f->is_number()) {
    *err = BadRequest(TypeError(key, "a number"), key, "invalid_type");
    return false;
  }
  const double v = f->get<double>();
  if (!std::isfinite(v) || v < lo || (lo_open && v == lo) || v > hi) {
    *err = BadRequest("'" + std::string(key) + "' must be in " + (lo_open ? "(" : "[") + json(lo).dump() + ", " +
                          json(hi).dump() + "]",
                      key, "invalid_value");
    return false;
  }
  *out = v;
  return true;
}

// An integer field within [lo, hi].
bool ReadInteger(const json& j, const char* key, int64_t lo, uint64_t hi, std::optional<int64_t>* out,
                 ApiError* err) {
  const json* f = Field(j, key);
  if (f == nullptr) return true;
  if (!f->is_number_integer()) {
    *err = BadRequest(TypeError(key, "an integer"), key, "invalid_type");
    return false;
  }
  bool ok;
  int64_t v = 0;
  if (f->is_number_unsigned()) {
    const uint64_t u = f->get<uint64_t>();
    ok = u <= hi && u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    v = ok ? static_cast<int64_t>(u) : 0;
  } else {
    v = f->get<int64_t>();
    ok = v >= lo && (v < 0 || static_cast<uint64_t>(v) <= hi);
  }
  if (!ok || v < lo) {
    *err = BadRequest("'" + std::string(key) + "' must be an integer in [" + std::to_string(lo) + ", " +
                          std::to_string(hi) + "]",
                      key, "invalid_value");
    return false;
  }
  *out = v;
  return true;
}

bool ReadBool(const json& j, const char* key, bool* out, ApiError* err) {
  const json* f = Field(j, key);
  if (f == nullptr) return true;
  if (!f->is_boolean()) {
    *err = BadRequest(TypeError(key, "a boolean"), key, "invalid_type");
    return false;
  }
  *out = f->get<bool>();
  return true;
}

// A message's content: a string, or a list of {"type": "text", "text": ...} parts.
bool ReadContent(const json& m, std::string* out, ApiError* err) {
  const json* c = Field(m, "content");
  if (c == nullptr) {
    *err = BadRequest("each message needs a 'content'", "messages", "invalid_type");
    return false;
  }
  if (c->is_string()) {
    *out = c->get<std::string>();
    return true;
  }
  if (!c->is_array()) {
    *err = BadRequest("a message's 'content' must be a string or a list of text parts", "messages",
                      "invalid_type");
    return false;
  }
  for (const json& part : *c) {
    const json* type = part.is_object() ? Field(part, "type") : nullptr;
    const json* text = part.is_object() ? Field(part, "text") : nullptr;
    if (type == nullptr || !type->is_string() || type->get<std::string>() != "text" || text == nullptr ||
        !text->is_string()) {
      *err = BadRequest("only text content parts ({\"type\": \"text\", \"text\": ...}) are supported",
                        "messages", "invalid_content");
      return false;
    }
    *out += text->get<std::string>();
  }
  return true;
}

bool ReadMessages(const json& j, CompletionRequest* r, ApiError* err) {
  const json* ms = Field(j, "messages");
  if (ms == nullptr || !ms->is_array() || ms->empty()) {
    *err = BadRequest("'messages' must be a non-empty list", "messages",
                      ms == nullptr ? "missing_field" : "invalid_type");
    return false;
  }
  for (const json& m : *ms) {
    const json* role = m.is_object() ? Field(m, "role") : nullptr;
    if (role == nullptr || !role->is_string()) {
      *err = BadRequest("each message must be an object with a string 'role'", "messages", "invalid_type");
      return false;
    }
    std::string name = role->get<std::string>();
    if (name == "developer") name = "system";  // the newer name of the system role
    if (name != "system" && name != "user" && name != "assistant") {
      *err = BadRequest("unsupported message role '" + name + "' (system, developer, user, assistant)",
                        "messages", "invalid_value");
      return false;
    }
    engine::ChatMessage out{name, ""};
    if (!ReadContent(m, &out.content, err)) return false;
    r->messages.push_back(std::move(out));
  }
  return true;
}

bool ReadPrompt(const json& j, CompletionRequest* r, ApiError* err) {
  const json* p = Field(j, "prompt");
  if (p != nullptr && p->is_array() && p->size() == 1 && (*p)[0].is_string()) p = &(*p)[0];
  if (p == nullptr || !p->is_string()) {
    *err = BadRequest("'prompt' must be a string", "prompt", p == nullptr ? "missing_field" : "invalid_type");
    return false;
  }
  r->prompt = p->get<std::string>();
  return true;
}

bool ReadStop(const json& j, CompletionRequest* r, ApiError* err) {
  const json* s = Field(j, "stop");
  if (s == nullptr) return true;
  if (s->is_string()) {
    if (!s->get<std::string>().empty()) r->stop.push_back(s->get<std::string>());
    return true;
  }
  if (!s->is_array() || s->size() > kMaxStopStrings) {
    *err = BadRequest("'stop' must be a string or a list of at most 8 strings", "stop", "invalid_type");
    return false;
  }
  for (const json& x : *s) {
    if (!x.is_string() || x.get<std::string>().empty()) {
      *err = BadRequest("each 'stop' entry must be a non-empty string", "stop", "invalid_type");
      return false;
    }
    r->stop.push_back(x.get<std::string>());
  }
  return true;
}

bool ReadSampling(const json& j, CompletionRequest* r, ApiError* err) {
  std::optional<double> temperature, top_p;
  std::optional<int64_t> top_k, seed;
  if (!ReadNumber(j, "temperature", 0.0, 2.0, &temperature, err) ||
      !ReadNumber(j, "top_p", 0.0, 1.0, &top_p, err, /*lo_open=*/true) ||
      !ReadInteger(j, "top_k", -1, std::numeric_limits<uint32_t>::max(), &top_k, err) ||
      !ReadInteger(j, "seed", std::numeric_limits<int64_t>::min(),
                   static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), &seed, err)) {
    return false;
  }
  if (temperature) r->sampling.temperature = static_cast<float>(*temperature);
  if (top_p) r->sampling.top_p = static_cast<float>(*top_p);
  if (top_k && *top_k > 0) r->sampling.top_k = static_cast<uint32_t>(*top_k);  // -1 / 0: all
  if (seed) r->sampling.seed = static_cast<uint64_t>(*seed);
  return true;
}

// max_tokens / max_completion_tokens (the newer name wins), n, the penalties.
bool ReadLimits(const json& j, CompletionRequest* r, ApiError* err) {
  std::optional<int64_t> max_tokens, max_completion_tokens, n;
  const uint64_t kMax = std::numeric_limits<uint32_t>::max();
  if (!ReadInteger(j, "max_tokens", 1, kMax, &max_tokens, err) ||
      !ReadInteger(j, "max_completion_tokens", 1, kMax, &max_completion_tokens, err) ||
      !ReadInteger(j, "n", 1, 128, &n, err)) {
    return false;
  }
  if (max_completion_tokens) max_tokens = max_completion_tokens;
  if (max_tokens) r->max_tokens = static_cast<uint32_t>(*max_tokens);
  if (n && *n != 1) {
    *err = BadRequest("only n = 1 is supported", "n", "invalid_value");
    return false;
  }
  for (const char* key : {"frequency_penalty", "presence_penalty"}) {
    std::optional<double> v;
    if (!ReadNumber(j, key, -2.0, 2.0, &v, err)) return false;
    if (v && *v != 0.0) {
      *err = BadRequest(std::string("'") + key + "' is not supported (only 0)", key, "unsupported_value");
      return false;
    }
  }
  return true;
}

bool ReadStreamOptions(const json& j, CompletionRequest* r, ApiError* err) {
  if (!ReadBool(j, "stream", &r->stream, err) || !ReadBool(j, "ignore_eos", &r->ignore_eos, err)) return false;
  const json* so = Field(j, "stream_options");
  if (so == nullptr) return true;
  if (!so->is_object()) {
    *err = BadRequest(TypeError("stream_options", "an object"), "stream_options", "invalid_type");
    return false;
  }
  return ReadBool(*so, "include_usage", &r->include_usage, err);
}

// chat: logprobs bool + top_logprobs int; completions: logprobs int (the top count).
bool ReadLogprobs(const json& j, CompletionRequest* r, ApiError* err) {
  std::optional<int64_t> top;
  if (r->endpoint == Endpoint::kChat) {
    if (!ReadBool(j, "logprobs", &r->logprobs, err) ||
        !ReadInteger(j, "top_logprobs", 0, kMaxTopLogprobs, &top, err)) {
      return false;
    }
    if (top && !r->logprobs) {
      *err = BadRequest("'top_logprobs' needs 'logprobs': true", "top_logprobs", "invalid_value");
      return false;
    }
  } else {
    if (!ReadInteger(j, "logprobs", 0, kMaxTopLogprobs, &top, err)) return false;
    r->logprobs = top.has_value();
  }
  r->top_logprobs = top ? static_cast<uint32_t>(*top) : 0;
  return true;
}

bool ReadModel(const json& j, CompletionRequest* r, ApiError* err) {
  const json* m = Field(j, "model");
  if (m == nullptr) return true;
  if (!m->is_string()) {
    *err = BadRequest(TypeError("model", "a string"), "model", "invalid_type");
    return false;
  }
  r->model = m->get<std::string>();
  return true;
}

}  // namespace

ApiError BadRequest(std::string message, std::string param, std::string code) {
  return ApiError{400, std::move(message), "invalid_request_error", std::move(param), std::move(code)};
}

std::string ErrorBody(const ApiError& e) {
  json inner = {{"message", e.message}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) inner["param"] = e.param;
  if (!e.code.empty()) inner["code"] = e.code;
  return Dump(json{{"error", inner}});
}

ApiError ErrorFromStatus(const Status& status) {
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
      return BadRequest(status.message());
    case StatusCode::kPoolExhausted:
    case StatusCode::kCapacityExceeded:
      return ApiError{503, status.message(), "server_overloaded", "", "queue_full"};
    case StatusCode::kFailedPrecondition:
      return ApiError{503, status.message(), "server_unavailable", "", "shutting_down"};
    default:
      return ApiError{500, status.message(), "server_error", "", ""};
  }
}

ApiError ErrorFromSubmit(const Status& status, engine::SubmitFault fault, Endpoint endpoint) {
  const char* field = endpoint == Endpoint::kChat ? "messages" : "prompt";
  switch (fault) {
    case engine::SubmitFault::kNoChatTemplate:
      return BadRequest(status.message(), "messages", "no_chat_template");
    case engine::SubmitFault::kPromptEncoding:
      return BadRequest(status.message(), field);
    case engine::SubmitFault::kPromptEmpty:
      return BadRequest(status.message(), "prompt", "empty_prompt");
    case engine::SubmitFault::kPromptTooLong:
      return BadRequest(status.message(), field, "context_length_exceeded");
    default:
      return ErrorFromStatus(status);
  }
}

ApiError ErrorForHttpStatus(int status) {
  switch (status) {
    case 404:
      return ApiError{404, "no such route", "invalid_request_error", "", "not_found"};
    case 405:
      return ApiError{405, "method not allowed on this route", "invalid_request_error", "", "method_not_allowed"};
    case 408:
      return ApiError{408, "the request header did not arrive in time", "invalid_request_error", "",
                      "request_timeout"};
    case 413:
      return ApiError{413, "the request body is larger than the server accepts", "invalid_request_error", "",
                      "payload_too_large"};
    case 401:
      return ApiError{401, "missing or wrong API key (Authorization: Bearer KEY)", "invalid_request_error", "",
                      "invalid_api_key"};
    default:
      if (status >= 500) return ApiError{status, "internal server error", "server_error", "", ""};
      return ApiError{status, "malformed HTTP request", "invalid_request_error", "", "bad_request"};
  }
}

ParseResult ParseCompletionRequest(std::string_view body, Endpoint endpoint) {
  ParseResult out;
  if (NestingDepth(body, kMaxJsonDepth) > kMaxJsonDepth) {
    out.error = BadRequest("the JSON body nests deeper than 64 levels", "", "invalid_json");
    return out;
  }
  json j;
  try {
    j = json::parse(body.begin(), body.end());
  } catch (const json::exception& e) {
    out.error = BadRequest(std::string("the body is not valid JSON: ") + e.what(), "", "invalid_json");
    return out;
  }
  if (!j.is_object()) {
    out.error = BadRequest("the body must be a JSON object", "", "invalid_json");
    return out;
  }
  CompletionRequest r;
  r.endpoint = endpoint;
  ApiError& err = out.error;
  try {
    const bool ok = (endpoint == Endpoint::kChat ? ReadMessages(j, &r, &err) : ReadPrompt(j, &r, &err)) &&
                    ReadModel(j, &r, &err) && ReadLimits(j, &r, &err) && ReadSampling(j, &r, &err) &&
                    ReadStop(j, &r, &err) && ReadStreamOptions(j, &r, &err) && ReadLogprobs(j, &r, &err);
    if (ok) out.request = std::move(r);
  } catch (const json::exception& e) {  // a type check missed: still a 400, never a crash
    out.error = BadRequest(std::string("malformed request: ") + e.what(), "", "invalid_request");
  }
  return out;
}

std::string_view FinishReasonString(engine::FinishReason reason) {
  switch (reason) {
    case engine::FinishReason::kStop:
      return "stop";
    case engine::FinishReason::kLength:
      return "length";
    case engine::FinishReason::kCancelled:
      return "cancelled";
    case engine::FinishReason::kError:
      return "error";
  }
  return "error";
}

json UsageJson(const engine::Usage& u) {
  return json{{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

namespace {

json BytesOf(const std::string& s) {
  json bytes = json::array();
  for (unsigned char c : s) bytes.push_back(static_cast<int>(c));
  return bytes;
}

// chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}
json ChatLogprobs(const std::vector<LogprobEntry>& entries) {
  json content = json::array();
  for (const LogprobEntry& e : entries) {
    json top = json::array();
    for (const auto& [tok, lp] : e.top) {
      top.push_back({{"token", tok}, {"logprob", lp}, {"bytes", BytesOf(tok)}});
    }
    content.push_back({{"token", e.token}, {"logprob", e.logprob}, {"bytes", BytesOf(e.token)},
                       {"top_logprobs", top}});
  }
  return json{{"content", content}, {"refusal", nullptr}};
}

// completions: {"tokens", "token_logprobs", "top_logprobs": [{tok: lp}], "text_offset"}
json CompletionLogprobs(const std::vector<LogprobEntry>& entries, size_t first_offset) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  size_t offset = first_offset;
  for (const LogprobEntry& e : entries) {
    tokens.push_back(e.token);
    lps.push_back(e.logprob);
    json top = json::object();
    for (const auto& [tok, lp] : e.top) top[tok] = lp;
    tops.push_back(top);
    offsets.push_back(offset);
    offset += e.token.size();
  }
  return json{{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json LogprobsJson(Endpoint endpoint, bool logprobs, const std::vector<LogprobEntry>& entries) {
  if (!logprobs) return nullptr;
  return endpoint == Endpoint::kChat ? ChatLogprobs(entries) : CompletionLogprobs(entries, 0);
}

json Envelope(const ResponseContext& ctx, bool chunk) {
  const char* object = ctx.endpoint == Endpoint::kChat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                       : "text_completion";
  return json{{"id", ctx.id}, {"object", object}, {"created", ctx.created}, {"model", ctx.model},
              {"system_fingerprint", nullptr}};
}

}  // namespace

json CompletionJson(const ResponseContext& ctx, const Completion& c) {
  json out = Envelope(ctx, false);
  json choice = {{"index", 0}, {"finish_reason", c.finish_reason},
                 {"logprobs", LogprobsJson(ctx.endpoint, c.logprobs, c.entries)}};
  if (ctx.endpoint == Endpoint::kChat) {
    choice["message"] = {{"role", "assistant"}, {"content", c.text}, {"refusal", nullptr}};
  } else {
    choice["text"] = c.text;
  }
  out["choices"] = json::array({choice});
  out["usage"] = UsageJson(c.usage);
  return out;
}

json ChunkJson(const ResponseContext& ctx, std::string_view text, bool role, std::string_view finish_reason,
               bool logprobs, const std::vector<LogprobEntry>& entries, bool include_usage) {
  json out = Envelope(ctx, true);
  json choice = {{"index", 0}, {"logprobs", LogprobsJson(ctx.endpoint, logprobs, entries)},
                 {"finish_reason", nullptr}};
  if (!finish_reason.empty()) choice["finish_reason"] = finish_reason;
  if (ctx.endpoint == Endpoint::kChat) {
    json delta = json::object();
    if (role) delta["role"] = "assistant";
    if (!text.empty() || role) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  out["choices"] = json::array({choice});
  if (include_usage) out["usage"] = nullptr;
  return out;
}

json UsageChunkJson(const ResponseContext& ctx, const engine::Usage& usage) {
  json out = Envelope(ctx, true);
  out["choices"] = json::array();
  out["usage"] = UsageJson(usage);
  return out;
}

std::string Dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string SseEvent(const json& j) {
  return "data: " + Dump(j) + "\n\n";
}

json ModelsJson(const std::string& model, int64_t created) {
  return json{{"object", "list"},
              {"data", json::array({{{"id", model}, {"object", "model"}, {"created", created},
                                     {"owned_by", "kvcache"}}})}};
}

}  // namespace kvcache::server
