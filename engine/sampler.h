// The engine's per-request token choice: greedy, or temperature with top_k
// and top_p and a seeded draw; and the log probabilities a request may ask
// for. See engine.h's file comment for the contract.
//
// Greedy is model::Argmax (lowest id on ties), so a greedy request picks what
// model::Generate picks. Otherwise the distribution is softmax(logits / T)
// in double; top_k keeps the k most likely (ties: lower id first), top_p then
// keeps the smallest most-likely-first prefix whose mass reaches top_p; one
// uniform draw from a xorshift64* stream over the kept, renormalized mass.
// The stream is the request's own, so the tokens do not depend on the load.
//
// Thread safety: a TokenSampler is used by one thread at a time.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/engine.h"

namespace kvcache::engine {

class TokenSampler {
 public:
  // seed: the request's (params.seed, or its id when none).
  TokenSampler(const SamplingParams& params, uint64_t seed);
  int32_t Sample(std::span<const float> logits);

 private:
  double NextUniform();  // [0, 1)
  SamplingParams params_;
  uint64_t state_;
  std::vector<uint32_t> order_;
  std::vector<double> probs_;
};

// LogprobOf: log_softmax(logits)[token]. TopLogprobs: the `top` most likely
// tokens with theirs, most likely first (ties: lower id first); none for 0.
float LogprobOf(std::span<const float> logits, int32_t token);
std::vector<TokenLogprob> TopLogprobs(std::span<const float> logits, uint32_t top);

}  // namespace kvcache::engine
