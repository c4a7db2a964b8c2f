// Distortion metrics: see metrics.h.
#include "tools/support/eval/metrics.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>

namespace kvcache::eval {

double Nmse(std::span<const float> ref, std::span<const float> test) {
  assert(ref.size() == test.size());
  double err = 0, energy = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(test[i]) - ref[i];
    err += d * d;
    energy += static_cast<double>(ref[i]) * ref[i];
  }
  if (energy == 0) return err == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  return err / energy;
}

void HeadAttention(std::span<const float> q, const float* keys, const float* values, size_t tokens,
                   size_t row_stride, std::span<double> log_p, std::span<double> out) {
  const size_t d = q.size();
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  double max_s = -std::numeric_limits<double>::infinity();
  for (size_t t = 0; t < tokens; ++t) {
    const float* k = keys + t * row_stride;
    double s = 0;
    for (size_t c = 0; c < d; ++c) s += static_cast<double>(q[c]) * k[c];
    log_p[t] = s * scale;
    max_s = std::max(max_s, log_p[t]);
  }
  double sum = 0;
  for (size_t t = 0; t < tokens; ++t) sum += std::exp(log_p[t] - max_s);
  const double log_z = max_s + std::log(sum);
  std::fill(out.begin(), out.end(), 0.0);
  for (size_t t = 0; t < tokens; ++t) {
    log_p[t] -= log_z;
    const double p = std::exp(log_p[t]);
    const float* v = values + t * row_stride;
    for (size_t c = 0; c < d; ++c) out[c] += p * v[c];
  }
}

void AttentionStats::Add(std::span<const double> log_p_ref, std::span<const double> out_ref,
                         std::span<const double> log_p_test, std::span<const double> out_test) {
  double err2 = 0, ref2 = 0, test2 = 0, dot = 0;
  for (size_t c = 0; c < out_ref.size(); ++c) {
    const double d = out_test[c] - out_ref[c];
    err2 += d * d;
    ref2 += out_ref[c] * out_ref[c];
    test2 += out_test[c] * out_test[c];
    dot += out_ref[c] * out_test[c];
  }
  rel_err_ += ref2 > 0 ? std::sqrt(err2 / ref2) : (err2 > 0 ? 1.0 : 0.0);
  cosine_ += (ref2 > 0 && test2 > 0) ? dot / std::sqrt(ref2 * test2) : (err2 == 0 ? 1.0 : 0.0);
  double kl = 0;
  for (size_t t = 0; t < log_p_ref.size(); ++t) {
    const double p = std::exp(log_p_ref[t]);
    if (p > 0) kl += p * (log_p_ref[t] - log_p_test[t]);
  }
  kl_ += std::max(kl, 0.0);
  const auto argmax_ref = std::max_element(log_p_ref.begin(), log_p_ref.end()) - log_p_ref.begin();
  const auto argmax_test = std::max_element(log_p_test.begin(), log_p_test.end()) - log_p_test.begin();
  top1_ += argmax_ref == argmax_test ? 1.0 : 0.0;
  ++count_;
}

AttentionSummary AttentionStats::Summary() const {
  AttentionSummary s;
  s.count = count_;
  if (count_ == 0) return s;
  const double n = static_cast<double>(count_);
  s.rel_err = rel_err_ / n;
  s.cosine = cosine_ / n;
  s.kl = kl_ / n;
  s.top1_agree = top1_ / n;
  return s;
}

}  // namespace kvcache::eval
