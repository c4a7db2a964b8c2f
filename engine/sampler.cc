// TokenSampler and the log probabilities.
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

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
    : params_(params), sampler_(model::SamplingOptions{params.temperature, seed}) {}

uint32_t TokenSampler::Keep(std::span<const float> logits) {
  const uint32_t vocab = static_cast<uint32_t>(logits.size());
  uint32_t keep = params_.top_k > 0 ? std::min(params_.top_k, vocab) : vocab;
  order_.resize(vocab);
  for (uint32_t i = 0; i < vocab; ++i) order_[i] = i;
  const MoreLikely more{logits};
  if (keep < vocab) {
    std::partial_sort(order_.begin(), order_.begin() + keep, order_.end(), more);
  } else {
    std::sort(order_.begin(), order_.end(), more);
  }
  if (params_.top_p >= 1.0f) return keep;
  const double t = params_.temperature, top = logits[order_[0]];
  std::vector<double> w(keep);
  double total = 0;
  for (uint32_t i = 0; i < keep; ++i) {
    w[i] = std::exp((static_cast<double>(logits[order_[i]]) - top) / t);
    total += w[i];
  }
  double mass = 0;
  uint32_t n = 0;
  while (n < keep && mass < params_.top_p * total) mass += w[n++];
  return std::max(n, 1u);
}

int32_t TokenSampler::Sample(std::span<const float> logits) {
  if (params_.temperature <= 0.0f) return model::Argmax(logits);
  const bool filtered = (params_.top_k > 0 && params_.top_k < logits.size()) || params_.top_p < 1.0f;
  if (!filtered) return sampler_.Sample(logits);
  const uint32_t keep = Keep(logits);
  masked_.assign(logits.size(), -std::numeric_limits<float>::infinity());
  for (uint32_t i = 0; i < keep; ++i) masked_[order_[i]] = logits[order_[i]];
  const int32_t t = sampler_.Sample(masked_);
  // The draw's rounding fallback is the last id, which may be masked.
  return masked_[t] == -std::numeric_limits<float>::infinity() ? static_cast<int32_t>(order_[0]) : t;
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
                   static_cast<float>(static_cast<double>(logits[ids[i]]) - max - lse), {}});
  }
  return out;
}

}  // namespace kvcache::engine
