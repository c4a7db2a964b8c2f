// Distortion metrics for `kvcache eval`: reconstruction error of rows and the
// error a quantized K/V cache causes in softmax attention.
//
// Reference attention for one query q [D] over T rows of one kv head:
//   s_t = <q, k_t> / sqrt(D),  p = softmax(s),  o = sum_t p_t v_t,
// computed in double. AttentionStats compares a reference (p, o) with the
// quantized one per (query, query head) and averages over them.
//
// Thread safety: pure functions; an AttentionStats is not shared.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace kvcache::eval {

// sum (test - ref)^2 / sum ref^2; 0 if both are all zero, inf if only ref is.
// REQUIRES: equal sizes.
double Nmse(std::span<const float> ref, std::span<const float> test);

// One head's attention. keys/values point at row 0 of the head; consecutive
// rows are row_stride floats apart. log_p [tokens] receives log softmax,
// out [head_dim] the output.
void HeadAttention(std::span<const float> q, const float* keys, const float* values, size_t tokens,
                   size_t row_stride, std::span<double> log_p, std::span<double> out);

struct AttentionSummary {
  double rel_err = 0;     // mean ||o_q - o|| / ||o||
  double cosine = 0;      // mean cos(o_q, o)
  double kl = 0;          // mean KL(p || p_q), nats
  double top1_agree = 0;  // fraction with argmax p == argmax p_q
  size_t count = 0;
};

class AttentionStats {
 public:
  // One query: reference and quantized log-probabilities [tokens] and outputs [D].
  void Add(std::span<const double> log_p_ref, std::span<const double> out_ref,
           std::span<const double> log_p_test, std::span<const double> out_test);
  AttentionSummary Summary() const;

 private:
  double rel_err_ = 0, cosine_ = 0, kl_ = 0, top1_ = 0;
  size_t count_ = 0;
};

}  // namespace kvcache::eval
