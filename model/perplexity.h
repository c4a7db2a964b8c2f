// Teacher-forced evaluation of the decoder with a given KV backend: mean
// negative log-likelihood of each next token, and how far the next-token
// distributions move from a reference backend (the f32 cache).
//
// Tokens are fed in passes of chunk_tokens (1 = decode steps, the default);
// either way every prediction reads the K/V of all earlier positions (and its
// own) back from the backend's storage format. The chunking matters only for
// formats the cache calibrates from the rows of a head's first append (see
// cache.h): decode steps calibrate on the first token alone. Sums are in
// double.
//
// Thread safety: one call per Decoder and backends at a time.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "kvcache/status.h"
#include "model/decoder.h"
#include "model/kv_backend.h"
#include "model/kv_factory.h"

namespace kvcache::model {

struct PerplexityResult {
  uint32_t num_predictions = 0;  // tokens.size() - 1
  double mean_nll = 0;           // nats per token
  double perplexity = 0;         // exp(mean_nll)
  // Only with a reference backend: mean KL(p_ref || p) in nats, and the
  // fraction of positions whose argmax agrees with the reference's.
  double kl_vs_ref = 0;
  double top1_agree_vs_ref = 0;
  // Ref's own mean NLL (with a reference backend).
  double ref_mean_nll = 0;
};

struct PerplexityOptions {
  uint32_t chunk_tokens = 1;  // tokens per Forward pass, >= 1
};

// tokens: at least 2 (usually BOS + text). kv (and ref) must be empty.
Result<PerplexityResult> Perplexity(Decoder& decoder, KvBackend& kv, KvBackend* ref,
                                    std::span<const int32_t> tokens,
                                    const PerplexityOptions& options = {});

// One format measured against the f32 cache of the same backend and layout.
struct FormatEvaluation {
  enum class State : uint8_t {
    kOk,
    kUnsupported,   // the format cannot take this model's head_dim
    kUnavailable,   // the format is not implemented (yet) in this build
  };
  State state = State::kOk;
  std::string message;  // why, when not kOk
  PerplexityResult result;
};
// Errors other than "unsupported"/"unavailable" (I/O, internal) are returned
// as a Status.
Result<FormatEvaluation> EvaluateFormat(Decoder& decoder, std::span<const int32_t> tokens,
                                        const KvBackendOptions& backend,
                                        const PerplexityOptions& options = {});
std::string_view FormatEvaluationStateName(FormatEvaluation::State state);

// Log-softmax helpers on one row of logits (double accumulation).
double LogSumExp(std::span<const float> logits);
// KL(softmax(ref) || softmax(x)).
double KlDivergence(std::span<const float> ref, std::span<const float> x);

}  // namespace kvcache::model
