// The engine's per-request token choice: greedy, or temperature with top_k
// and top_p and a seeded draw; and the log probabilities a request may ask
// for. See engine.h's file comment for the contract.
//
// Greedy is model::Argmax (lowest id on ties), so a greedy request picks what
// model::Generate picks. Otherwise top_k keeps the k most likely tokens
// (ties: lower id first), top_p then keeps the smallest most-likely-first
// prefix of those whose mass under softmax(logits / T) reaches top_p, the
// others are masked to -inf, and the draw is model::Sampler's (softmax(logits
// / T), one uniform from its seeded xorshift64* stream): without top_k and
// top_p a request samples exactly what `kvcache generate --temperature T
// --seed S` samples. The stream is the request's own, so its tokens do not
// depend on the load.
//
// Thread safety: a TokenSampler is used by one thread at a time.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/engine.h"
#include "model/generate/generate.h"

namespace kvcache::engine {

class TokenSampler {
 public:
  // seed: the request's (params.seed, or its id when none).
  TokenSampler(const SamplingParams& params, uint64_t seed);
  int32_t Sample(std::span<const float> logits);

 private:
  // How many of order_ (sorted most likely first) top_k and top_p keep.
  uint32_t Keep(std::span<const float> logits);
  SamplingParams params_;
  model::Sampler sampler_;
  std::vector<uint32_t> order_;
  std::vector<float> masked_;
};
// LogprobOf: log_softmax(logits)[token]. TopLogprobs: the `top` most likely
// tokens with theirs, most likely first (ties: lower id first); none for 0.
float LogprobOf(std::span<const float> logits, int32_t token);
std::vector<TokenLogprob> TopLogprobs(std::span<const float> logits, uint32_t top);

}  // namespace kvcache::engine
