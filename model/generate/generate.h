// Text generation on the reference decoder: prefill, then sample one token
// at a time -- or, with speculative decoding, draft several tokens by n-gram
// lookup in the context and verify them with one multi-token pass.
//
// Drafts. kNgram: the tokens that followed the latest earlier occurrence of
// the context's last ngram_max .. 1 tokens (free, good on repetitive text).
// kEarlyExit: the model's own greedy guesses from its first draft_layers
// layers (then the final norm and classifier), run as partial-depth passes on
// the same cache -- those layers' K/V are exactly the full model's -- and
// truncated away before the verify pass.
//
// Speculative decoding. The pending token plus k drafted tokens run as one
// Forward pass (one multi-token attention call per layer); the target's
// choice at each position is sampled in order exactly as plain decoding would
// (same sampler, same random stream), drafts are accepted while they match,
// the first mismatch is replaced by the target's choice, and the cache is
// truncated back to the accepted positions. So the output is token for token
// the output of plain decoding (for greedy and for seeded sampling) whenever
// the multi-token pass computes the same logits as single-token passes.
//
// Thread safety: one Generate call per Decoder and KvBackend at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "kvcache/status.h"
#include "model/decoder/decoder.h"
#include "model/kv/kv_backend.h"
#include "model/tokenizer/tokenizer.h"

namespace kvcache::model {

struct SamplingOptions {
  float temperature = 0.0f;  // <= 0: greedy (argmax, lowest id on ties)
  uint64_t seed = 0;
};

// Deterministic sampler: softmax(logits / temperature) and one draw from a
// seeded xorshift64* stream per sampled token (none when greedy).
class Sampler {
 public:
  explicit Sampler(const SamplingOptions& options);
  int32_t Sample(std::span<const float> logits);

 private:
  double NextUniform();  // [0, 1)
  float temperature_;
  uint64_t state_;
  std::vector<float> probs_;
};

int32_t Argmax(std::span<const float> logits);

enum class DraftKind : uint8_t { kNgram, kEarlyExit };

struct GenerateOptions {
  uint32_t max_new_tokens = 128;
  SamplingOptions sampling;
  // Speculative decoding: tokens drafted per verify pass (0 = off).
  uint32_t draft_tokens = 0;
  DraftKind draft_kind = DraftKind::kNgram;
  uint32_t ngram_max = 3;     // kNgram
  uint32_t draft_layers = 2;  // kEarlyExit: 1 .. n_layers - 1
  // > 0: the uncached prompt runs in passes of at most this many tokens
  // (a backend with a largest pass: HybridKv's max_chunk_tokens); 0: one pass.
  uint32_t prefill_chunk_tokens = 0;
  bool stop_at_eos = true;  // stop at any of stop_tokens (not emitted)
  std::vector<int32_t> stop_tokens = {kBosToken, kEosToken};  // llama2.c's; GGUF: LoadedModel::stop_tokens
  // Called with each generated token as soon as it is accepted.
  std::function<void(int32_t)> on_token;
  // Called with every distribution a token is sampled from, in order, before
  // the draw: the prefill's last position first (logits dumps, e.g. generate
  // --logits-out; a stop token's distribution included).
  std::function<void(std::span<const float>)> on_logits;
};

struct GenerateResult {
  std::vector<int32_t> tokens;      // generated ids (the prompt not included)
  uint32_t prompt_tokens = 0;       // prompt tokens run in the prefill
  uint32_t forward_passes = 0;      // decode passes after the prefill
  uint32_t drafted_tokens = 0;      // tokens proposed by the draft
  uint32_t accepted_tokens = 0;     // of those, accepted
  double prefill_seconds = 0;
  double decode_seconds = 0;
  double acceptance_rate() const {
    return drafted_tokens ? static_cast<double>(accepted_tokens) / drafted_tokens : 0.0;
  }
};

// Generates after `prompt`. kv must hold a (possibly empty) strict prefix of
// the prompt's positions -- a forked cache holding a shared prefix is fine --
// and the rest of the prompt is prefilled in one pass. Stops after
// max_new_tokens, at BOS/EOS (with stop_at_eos) or at max_seq_len.
Result<GenerateResult> Generate(Decoder& decoder, KvBackend& kv, std::span<const int32_t> prompt,
                                const GenerateOptions& options);

// Runs `tokens` into kv in passes of at most `chunk` tokens (a prompt's
// prefill when the whole of it does not go in one pass), discarding the
// logits but the last token's, which go to last_logits if it is not empty
// ([vocab]).
Status PrefillInChunks(Decoder& decoder, KvBackend& kv, std::span<const int32_t> tokens, uint32_t chunk,
                       std::span<float> last_logits = {});

// The n-gram draft: up to max_tokens tokens that followed the latest earlier
// occurrence of the longest suffix (ngram_max down to 1 tokens) of `context`.
std::vector<int32_t> NgramDraft(std::span<const int32_t> context, uint32_t ngram_max,
                                uint32_t max_tokens);

}  // namespace kvcache::model
