// The serving engine: many requests on one model and one block pool, run by
// continuous batching. The HTTP front (`kvcache serve`) and the load tests
// sit on this; nothing here knows about HTTP or JSON.
//
// A request is a prompt and its generation limits. The prompt is token ids,
// or text (or a chat) that the engine tokenizes with the model's tokenizer;
// what comes back is text as well as ids, so a front end never needs the
// tokenizer. Submit queues it and returns a RequestStream the caller reads
// its tokens from. One
// background thread runs steps: each step admits waiting requests while the
// pool can reserve their blocks (adopting the prefix cache's and the tiers'
// blocks for the prompt's leading full blocks), then runs ONE batched
// forward pass (model::Decoder::ForwardBatch) over every running request's
// new tokens -- a decode token for each generating request, a chunk of the
// prompt for each prefilling one -- within max_batch_tokens, samples the
// next token of every request whose prompt is done, and publishes blocks to
// the prefix cache (and so the tiers) as they fill.
//
// Batch invariance: the logits a request gets do not depend on what else is
// in the step or on the thread count, so a greedy request gives the same
// tokens as `kvcache generate` on the same prompt, under any load. (Exactly
// so for f32 K/V, whose attention is exact whatever the query block: the
// engine may cut a prompt into chunks where generate runs it whole, and the
// chunks of the other formats can round differently, as can their
// calibration from the first chunk's rows.)
//
// Shared prefixes arriving together: a waiting request whose leading full
// prompt blocks are being prefilled by a running request (the same chain
// hashes, not yet published) is held back -- it stays waiting and later
// requests may pass it -- until that request has published them; it is then
// admitted adopting them, instead of prefilling the same prefix side by side.
// The hold ends as soon as the running request publishes those blocks,
// finishes, is cancelled or preempted, or stops publishing (a duplicate), or
// when its prefill has not moved for four steps (the step's token budget
// going to decodes): then the waiting request is admitted as any other.
// A request waiting for blocks is admitted (and its prefix looked up) once
// the pool can meet its reservation.
//
// When the pool runs out mid-generation the youngest running request is
// preempted: its blocks are freed (full blocks stay in the prefix cache and
// the tiers), it goes back to the front of the queue and later resumes by
// recomputing (or re-adopting) its prompt plus the tokens it already
// produced; its stream sees nothing of it but a pause. No request is lost.
//
// Sampling: temperature <= 0 is greedy (lowest id on ties). Otherwise
// top_k, then top_p (smallest set whose mass >= top_p), then one draw from a
// generator seeded by `seed` (a request with the same seed and prompt gets
// the same tokens whatever the load) or, without a seed, by the request id.
//
// A request ends at max_tokens (kLength), at a stop token of the model or a
// stop string (kStop; the stop string itself is not emitted), at the end of
// the model's context (kLength), on Cancel (kCancelled: its blocks are freed
// at the next step boundary), or on an internal error (kError).
//
// Thread safety: Submit, Metrics and Shutdown may be called from any thread;
// a RequestStream is read by one thread at a time, Cancel from any.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kvcache/cache.h"
#include "kvcache/format.h"
#include "kvcache/status.h"
#include "model/decoder/loaded_model.h"
#include "model/tokenizer/chat_template.h"

namespace kvcache::engine {

struct EngineOptions {
  FormatPair formats;                // the K:V format of every sequence (the full layers')
  // The sliding-window layers' K:V format when it differs from `formats`
  // (a model with sliding-window layers only; InvalidArgument otherwise).
  std::optional<FormatPair> local_formats;
  // Sinks and recent positions of every sequence also kept as bf16 rows
  // (cache.h, PrecisionWindow; per-sequence memory outside the pool). The
  // sinks' rows travel with the published prefix (prefix cache and tiers,
  // WindowSinks), so a request that adopts cached blocks covering them reads
  // the same bf16 sinks as when run uncached. The recent positions inside
  // adopted blocks are read in the format: with recent > 0 a cached
  // request's answer can differ from the same request run uncached while
  // its recent positions reach into the adopted blocks (each is
  // deterministic); with sinks only it is the same.
  PrecisionWindow window;
  uint32_t block_size = 16;          // paged blocks, tokens
  uint64_t pool_bytes = 256ull << 20;  // the block pool's size in bytes (K and V, all layers)
  // A model with sliding-window layers: the sequence length at which its two
  // pools (full and window layers) hold the same number of sequences
  // (KvManagerOptions::pool_balance_tokens; 0: the context).
  uint32_t pool_balance_tokens = 4096;
  uint32_t max_batch_tokens = 256;   // tokens per step (decodes + prefill chunks)
  uint32_t max_running = 64;         // requests in one step
  uint32_t max_waiting = 256;        // queued requests beyond which Submit says ResourceExhausted
  uint32_t threads = 2;              // the decoder's threads (the step thread included)
  bool prefix_cache = true;          // reuse and publish full prompt blocks
  // Offload tiers, spelled as `kvcache generate --tiers` takes them
  // ("host:512M,disk:/path:2G,redis:127.0.0.1:6379"); empty: none.
  // Tiers need the prefix cache.
  std::string tiers;
  // The model's fingerprint for the tiers' compatibility digest
  // (model::ModelFingerprint of its file: blocks are never served to
  // another model); required with tiers.
  std::string model_id;
};

struct SamplingParams {
  float temperature = 0.0f;  // <= 0: greedy
  float top_p = 1.0f;        // (0, 1]
  uint32_t top_k = 0;        // 0: all
  std::optional<uint64_t> seed;
};

// One turn of a chat prompt: role "system", "user" or "assistant", and its text.
using ChatMessage = model::ChatMessage;

struct RequestParams {
  // The prompt, in exactly one of three forms:
  //   prompt       token ids, each in the vocabulary;
  //   prompt_text  text, tokenized as the model wants it (llama2.c: with
  //                BOS; GGUF: with BOS iff the file says add_bos_token;
  //                special-token texts read as their tokens, as llama.cpp
  //                and vLLM read a completion's prompt);
  //   messages     a chat (non-empty), rendered in the model's chat template
  //                with the assistant's generation prompt, then tokenized
  //                (a model without a ChatML template: Unimplemented).
  // A text or chat prompt is replaced by its ids: usage counts them.
  std::vector<int32_t> prompt;
  std::optional<std::string> prompt_text;
  std::vector<ChatMessage> messages;
  // >= 1. For a text or chat prompt a larger value than the context leaves
  // room for is cut to that room; for any prompt, the request ends at the
  // end of the context (kLength) whatever is asked.
  uint32_t max_tokens = 16;
  SamplingParams sampling;
  std::vector<std::string> stop;  // stop strings (at most 8, each non-empty)
  bool ignore_eos = false;        // keep going past the model's stop tokens
  // Log probabilities: of the chosen token, and of the top_logprobs most
  // likely ones (0 .. 20) at each position.
  bool logprobs = false;
  uint32_t top_logprobs = 0;
};

enum class FinishReason : uint8_t { kStop, kLength, kCancelled, kError };
std::string_view FinishReasonName(FinishReason reason);  // "stop", "length", "cancelled", "error"

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
  // The token's text after the one before it (model::LoadedModel::
  // DecodePiece; its bytes, possibly part of a UTF-8 character).
  std::string piece;
};

// One generated token and the text it adds (may be empty while a multi-byte
// character or a possible stop string is held back; the held text comes with
// a later token or the final event).
struct TokenOut {
  int32_t token = 0;
  std::string text;
  float logprob = 0;                    // when RequestParams::logprobs
  std::vector<TokenLogprob> top;        // top_logprobs entries, most likely first, each with its piece
  // The token's own text (as TokenLogprob::piece), whatever is held back.
  std::string piece;
};

struct Usage {
  uint32_t prompt_tokens = 0;
  uint32_t completion_tokens = 0;
  uint32_t cached_tokens = 0;  // prompt tokens adopted from the pool's prefix cache or a tier
};

struct StreamEvent {
  std::vector<TokenOut> tokens;  // new tokens since the last event (may be empty in the final one)
  std::string text_tail;         // held-back text released at the end (final event only)
  bool finished = false;
  FinishReason finish_reason = FinishReason::kStop;
  Status error;  // kError only
  Usage usage;   // final event only
};

class RequestStream {
 public:
  virtual ~RequestStream() = default;
  virtual uint64_t id() const = 0;
  // Waits up to `timeout` for the next event; false on timeout. After the
  // finished event, returns false at once.
  virtual bool Next(StreamEvent* out, std::chrono::milliseconds timeout) = 0;
  // Ends the request (kCancelled) if it has not finished; its blocks go back
  // to the pool at the next step boundary. Idempotent. Dropping the last
  // reference to a stream cancels its request too.
  virtual void Cancel() = 0;
};

// A snapshot for /metrics.
// One layer group's pool (a full-attention model has one group, "full"; a
// model with sliding-window layers a second, "window").
struct PoolGroupMetrics {
  std::string kind;
  uint64_t total = 0, free = 0, used = 0, cached = 0, reserved = 0;
};

struct EngineMetrics {
  // Every group's pool together, and each group's.
  uint64_t pool_blocks_total = 0, pool_blocks_free = 0, pool_blocks_used = 0, pool_blocks_cached = 0;
  std::vector<PoolGroupMetrics> pool_groups;
  uint64_t requests_running = 0, requests_waiting = 0;
  uint64_t requests_finished = 0, requests_cancelled = 0, preemptions = 0;
  uint64_t prompt_tokens = 0, cached_prompt_tokens = 0, generated_tokens = 0;
  // Prefix-cache lookups: one per admission (a request waiting for blocks
  // is looked up when its reservation can be met, not at every step).
  uint64_t prefix_lookups = 0;
  // Waiting requests held back, at the last admission, for a running
  // request's prefill of the full prompt blocks they share (gauge), and
  // requests ever held so (counter).
  uint64_t requests_held = 0, prefix_holds = 0;
  uint64_t tier_hit_blocks = 0, tier_miss_blocks = 0;
  uint64_t steps = 0;
  // Step wall times: counts of steps at or below each bound (seconds), and
  // their sum; cumulative, Prometheus-style.
  std::vector<double> step_seconds_bounds;
  std::vector<uint64_t> step_seconds_counts;
  double step_seconds_sum = 0;
};

// What Submit refused, for a front end that names the offending input (the
// Status says it in words).
enum class SubmitFault : uint8_t {
  kNone,
  kNoChatTemplate,   // a chat prompt, and the model has no chat template
  kPromptEncoding,   // the text or chat could not be tokenized
  kPromptEmpty,      // no prompt, or a text that tokenizes to no tokens
  kPromptTooLong,    // the prompt leaves no room for a generated token
  kPrompt,           // another fault of the prompt (two forms, an id outside the vocabulary)
  kParams,           // a limit, sampling value or stop string
  kEngine,           // the queue is full or the engine is shut down
};

class Engine {
 public:
  // The model must outlive the engine. InvalidArgument for options that do
  // not fit (a format the model's head_dim cannot take, a pool smaller than
  // one max-length sequence, zero budgets, a bad tier spec).
  static Result<std::unique_ptr<Engine>> Create(const model::LoadedModel& model,
                                                const EngineOptions& options);
  virtual ~Engine() = default;

  // Queues a request. InvalidArgument for bad params (no prompt or more
  // than one form of it, a text that tokenizes to no tokens, an id outside
  // the vocabulary, prompt + 1 beyond the context, max_tokens 0, a sampling
  // value out of range, top_logprobs > 20, more than 8 stop strings or an
  // empty one); Unimplemented for a chat on a model without a chat
  // template; ResourceExhausted -- StatusCode::kCapacityExceeded, status.h
  // has no other code for it -- when max_waiting requests wait already;
  // FailedPrecondition after Shutdown. Nothing is queued on failure. With
  // `fault`, what was wrong is also said as a SubmitFault (kNone on success).
  virtual Result<std::shared_ptr<RequestStream>> Submit(RequestParams params, SubmitFault* fault) = 0;
  Result<std::shared_ptr<RequestStream>> Submit(RequestParams params) { return Submit(std::move(params), nullptr); }

  virtual EngineMetrics Metrics() const = 0;
  virtual const model::LoadedModel& model() const = 0;
  virtual const EngineOptions& options() const = 0;
  // Whether prompts are reused from the prefix cache: options().prefix_cache,
  // except for a model with sliding-window layers whose windows cannot be
  // named by block or whose full layers keep a precision window.
  virtual bool prefix_caching() const = 0;

  // Stops admitting (Submit fails), lets running and waiting requests finish
  // until `deadline` from now, cancels what is left, stops the step thread.
  // Idempotent; the destructor calls it with a zero deadline.
  virtual void Shutdown(std::chrono::milliseconds deadline) = 0;
};

}  // namespace kvcache::engine
