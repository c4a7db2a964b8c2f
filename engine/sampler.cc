// TokenSampler and the log probabilities.
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "model/generate/generate.h"

namespace kvcache::engine {
namespace {

// max and log(sum(exp(x - max))) of the logits: log_softmax(x) = x - max - lse.
void LogNormalizer(std::span<const float> logits, double* max, double* lse) {
  float m = logits[0];
  for (float x : logits) m = std::max(m, x);
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - m);
  *max = m;
  *lse = std::log(sum);
}

// Orders ids most likely first (higher logit), lower id first on ties.
struct MoreLikely {
  std::span<const float> logits;
  bool operator()(uint32_t a, uint32_t b) const {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  }
};

}  // namespace

TokenSampler::TokenSampler(const SamplingParams& params, uint64_t seed)
    : params_(params), state_(seed ^ 0x9e3779b97f4a7c15ull) {
  if (state_ == 0) state_ = 1;
}

double TokenSampler::NextUniform() {
  state_ ^= state_ >> 12;
  state_ ^= state_ << 25;
  state_ ^= state_ >> 27;
  const uint64_t r = state_ * 0x2545f4914f6cdd1dull;
  return static_cast<double>(r >> 11) * (1.0 / 9007199254740992.0);
}

int32_t TokenSampler::Sample(std::span<const float> logits) {
  if (params_.temperature <= 0.0f) return model::Argmax(logits);
  const uint32_t vocab = static_cast<uint32_t>(logits.size());
  // The candidates, most likely first: the order of logits / T is that of the logits.
  uint32_t keep = params_.top_k > 0 ? std::min(params_.top_k, vocab) : vocab;
  order_.resize(vocab);
  for (uint32_t i = 0; i < vocab; ++i) order_[i] = i;
  const MoreLikely more{logits};
  if (keep < vocab) {
    std::partial_sort(order_.begin(), order_.begin() + keep, order_.end(), more);
  } else {
    std::sort(order_.begin(), order_.end(), more);
  }
  const double t = params_.temperature;
  const double top = logits[order_[0]];
  probs_.resize(keep);
  double total = 0;
  for (uint32_t i = 0; i < keep; ++i) {
    probs_[i] = std::exp((static_cast<double>(logits[order_[i]]) - top) / t);
    total += probs_[i];
  }
  if (params_.top_p < 1.0f) {
    double mass = 0;
    uint32_t n = 0;
    while (n < keep && mass < params_.top_p * total) mass += probs_[n++];
    keep = std::max(n, 1u);
    total = mass > 0 ? mass : probs_[0];
  }
  const double r = NextUniform() * total;
  double cdf = 0;
  for (uint32_t i = 0; i < keep; ++i) {
    cdf += probs_[i];
    if (r < cdf) return static_cast<int32_t>(order_[i]);
  }
  return static_cast<int32_t>(order_[keep - 1]);  // rounding left r >= the total
}

float LogprobOf(std::span<const float> logits, int32_t token) {
  double max = 0, lse = 0;
  LogNormalizer(logits, &max, &lse);
  return static_cast<float>(static_cast<double>(logits[token]) - max - lse);
}

std::vector<TokenLogprob> TopLogprobs(std::span<const float> logits, uint32_t top) {
  std::vector<TokenLogprob> out;
  if (top == 0) return out;
  double max = 0, lse = 0;
  LogNormalizer(logits, &max, &lse);
  const uint32_t vocab = static_cast<uint32_t>(logits.size());
  top = std::min(top, vocab);
  std::vector<uint32_t> ids(vocab);
  for (uint32_t i = 0; i < vocab; ++i) ids[i] = i;
  std::partial_sort(ids.begin(), ids.begin() + top, ids.end(), MoreLikely{logits});
  for (uint32_t i = 0; i < top; ++i) {
    out.push_back({static_cast<int32_t>(ids[i]),
                   static_cast<float>(static_cast<double>(logits[ids[i]]) - max - lse)});
  }
  return out;
}

}  // namespace kvcache::engine
