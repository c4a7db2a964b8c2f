// Measuring a K/V format pair: encode + decode every kv head's rows through
// RowCodec and compare reconstruction and softmax attention with f32.
//
// For each kv head the codec is calibrated on the head's first
// min(tokens, calibration_tokens) rows, then all rows are encoded and decoded.
// Attention runs every query head h against kv head h / (q_heads / kv_heads)
// over all tokens (no causal mask), once over the f32 rows and once over the
// decoded rows.
//
// Thread safety: an Evaluator is not shared between threads.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tools/support/eval/metrics.h"
#include "kvcache/format.h"
#include "kvcache/status.h"

namespace kvcache::eval {

struct EvalData {
  uint32_t tokens = 0, kv_heads = 0, head_dim = 0;
  uint32_t num_queries = 0, q_heads = 0;
  std::vector<float> keys;     // [tokens][kv_heads][head_dim]
  std::vector<float> values;   // [tokens][kv_heads][head_dim]
  std::vector<float> queries;  // [num_queries][q_heads][head_dim]

  // InvalidArgument naming what is inconsistent (sizes, q_heads % kv_heads, zeros).
  Status Validate() const;
};

struct PairResult {
  FormatPair pair;
  double k_bits = 0, v_bits = 0;
  double k_nmse = 0, v_nmse = 0;
  AttentionSummary attention;
};

struct EvalOptions {
  uint32_t calibration_tokens = 256;
};

class Evaluator {
 public:
  // REQUIRES: data.Validate() ok; data outlives the evaluator (it is not
  // copied). Computes the f32 reference attention.
  Evaluator(const EvalData& data, EvalOptions options = {});

  // An error (InvalidArgument for a head_dim the format cannot take,
  // whatever the codec returns otherwise) leaves the evaluator usable.
  Result<PairResult> Evaluate(FormatPair pair);

 private:
  // Decoded rows [tokens][kv_heads][head_dim] of one side in one format, cached.
  Result<const std::vector<float>*> Decoded(Format format, Side side);

  const EvalData& data_;
  EvalOptions options_;
  std::vector<double> ref_log_p_;  // [num_queries * q_heads][tokens]
  std::vector<double> ref_out_;    // [num_queries * q_heads][head_dim]
  std::map<std::pair<Format, Side>, std::vector<float>> decoded_;
};

}  // namespace kvcache::eval
