// Teacher-forced evaluation of the decoder with a given KV backend: mean
// negative log-likelihood of each next token, and how far the next-token
// distributions move from a reference (the f32 cache).
//
// Tokens are fed as a first pass of prefill_tokens (a prompt), then passes
// of chunk_tokens (1 = decode steps, the default); either way every
// prediction reads the K/V of all earlier positions (and its own) back from
// the backend's storage format. The split matters only for formats the cache
// calibrates from the rows of a head's first append (see cache.h): pure
// decode steps calibrate on the first token (BOS) alone. Sums are in double.
//
// Scores can start late: with score_from = N only the predictions made at
// positions >= N (of tokens N + 1 ..) are scored, the earlier positions being
// context (as llama-perplexity scores the second half of each chunk), so a
// long text's KL is not diluted by its easy early positions; the scores over
// every position are kept beside them.
//
// EvaluateFormats and EvaluateVariants run the reference and every candidate
// in lockstep, pass by pass, scoring each pass's logits and dropping them:
// memory is a pass's logits per backend, not the whole text's (Gemma 3's
// 262,144-token vocabulary makes a 32k text's logits 34 GB).
//
// Thread safety: one call per Decoder and backend at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvcache/format.h"
#include "kvcache/status.h"
#include "model/decoder/decoder.h"
#include "model/kv/kv_backend.h"
#include "model/kv/kv_factory.h"
#include "model/kv/kv_variant.h"

namespace kvcache::model {

struct PerplexityOptions {
  uint32_t prefill_tokens = 0;  // tokens of the first pass (0 = no separate prefill)
  uint32_t chunk_tokens = 1;    // tokens per later Forward pass, >= 1
  // Cache capacity for EvaluateFormats' backends (0 = the model's
  // max_seq_len; the CLI sizes it to the text).
  uint32_t max_seq_len = 0;
  // Predictions at positions < score_from are context, not scored (the
  // scores over every position are in PerplexityResult::all_positions).
  uint32_t score_from = 0;
  // Called after each Forward pass with the positions fed so far and the
  // total (progress output); may be empty.
  std::function<void(size_t done, size_t total)> on_progress;
  // The decoder that computes the f32 reference of EvaluateFormats and
  // EvaluateVariants; null: the scored decoder itself. Another decoder
  // measures what the scored one's products cost (int8 inputs against exact
  // ones); an f32:f32 entry is then scored, not taken as the reference.
  Decoder* reference_decoder = nullptr;
};

// The logits after each of tokens[0 .. size-1) ([size-1][vocab]): what
// predicts tokens[1 ..]. kv must be empty; tokens.size() >= 2.
Result<std::vector<float>> TeacherForcedLogits(Decoder& decoder, KvBackend& kv,
                                               std::span<const int32_t> tokens,
                                               const PerplexityOptions& options = {});

// Scores over a range of predictions.
struct ScoreStats {
  uint32_t num_predictions = 0;
  double mean_nll = 0;    // nats per token
  double perplexity = 0;  // exp(mean_nll)
  // Only with reference logits: mean KL(p_ref || p) in nats, the fraction of
  // positions whose argmax agrees, and the reference's own mean NLL.
  double kl_vs_ref = 0;
  double top1_agree_vs_ref = 0;
  double ref_mean_nll = 0;
};

struct PerplexityResult : ScoreStats {
  // The ScoreStats above cover the predictions at positions >= score_from
  // (scored_from); these every prediction (tokens.size() - 1).
  uint32_t scored_from = 0;
  ScoreStats all_positions;
  // log p(tokens[i + 1]) under the scored logits, for every prediction.
  std::vector<float> logprobs;
};

// Adds up predictions one at a time (in position order) into a
// PerplexityResult.
class LogitScorer {
 public:
  LogitScorer(uint32_t vocab, uint32_t num_predictions, uint32_t score_from);
  // The logits at position i (predicting `next`), and the reference's (or empty).
  void Add(uint32_t i, std::span<const float> row, int32_t next, std::span<const float> ref_row);
  PerplexityResult Finish() const;

 private:
  struct Sums {
    double nll = 0, ref_nll = 0, kl = 0;
    uint32_t n = 0, agree = 0;
    ScoreStats Stats(bool with_ref) const;
  };
  uint32_t vocab_, score_from_;
  bool with_ref_ = false;
  Sums from_, all_;
  std::vector<float> logprobs_;
};

// Scores logits ([size-1][vocab], from TeacherForcedLogits) against tokens,
// and against ref_logits (same shape) unless empty.
PerplexityResult ScoreLogits(std::span<const float> logits, std::span<const int32_t> tokens,
                             uint32_t vocab, std::span<const float> ref_logits = {},
                             uint32_t score_from = 0);

// Runs `tokens` through the reference backend `ref` (on ref_decoder) and
// every backend of `kvs` (on decoder) in lockstep, pass by pass, scoring each
// against the reference. A null entry of kvs is scored as the reference
// itself (its logits are the reference's). Every backend must start empty.
// A backend that fails with Unimplemented is dropped (its status in
// `failed`, one entry per backend; other errors end the run).
Result<std::vector<PerplexityResult>> ScoreInLockstep(Decoder& decoder, std::span<KvBackend* const> kvs,
                                                      Decoder& ref_decoder, KvBackend& ref,
                                                      std::span<const int32_t> tokens,
                                                      const PerplexityOptions& options,
                                                      std::vector<Status>* failed);

// TeacherForcedLogits on kv (and ref, if not null) + ScoreLogits.
Result<PerplexityResult> Perplexity(Decoder& decoder, KvBackend& kv, KvBackend* ref,
                                    std::span<const int32_t> tokens,
                                    const PerplexityOptions& options = {});

// One format measured against the f32 cache of the same backend and layout.
struct FormatEvaluation {
  enum class State : uint8_t {
    kOk,
    kUnsupported,  // the format cannot take this model's head_dim
    kUnavailable,  // the format is not implemented (yet) in this build
  };
  FormatPair formats;
  State state = State::kOk;
  std::string message;  // why, when not kOk
  PerplexityResult result;
};
std::string_view FormatEvaluationStateName(FormatEvaluation::State state);

// Evaluates every format pair on `backend` (its formats field is ignored),
// computing the f32 reference once (an f32:f32 pair in the list reuses it).
// With backend.eviction the reference is still the full f32 cache: KL and
// top-1 measure eviction and format together. Errors other than "unsupported" /
// "unavailable" are returned as a Status.
Result<std::vector<FormatEvaluation>> EvaluateFormats(Decoder& decoder,
                                                      std::span<const int32_t> tokens,
                                                      const KvBackendOptions& backend,
                                                      std::span<const FormatPair> formats,
                                                      const PerplexityOptions& options = {});
// Any backends (each its own options: formats, per-group formats, precision
// window, eviction) against one f32 reference with the first one's layout
// and block size that keeps every position in every layer. Entry i's
// FormatEvaluation::formats is backends[i].formats.
Result<std::vector<FormatEvaluation>> EvaluateBackends(Decoder& decoder, std::span<const int32_t> tokens,
                                                       std::span<const KvBackendOptions> backends,
                                                       const PerplexityOptions& options = {});
// Mean bits per stored K/V value of a cache with these options at
// `positions` positions: every layer's rows counted (a full layer's
// `positions`, a sliding-window layer's min(positions, its window)), each at
// its group's format (and the precision window's bf16 rows in the full
// layers, CacheWindowBits). Eviction is not counted.
VariantBits CacheBits(const AttentionShape& shape, const KvBackendOptions& options, uint32_t positions);

// The same for one format pair (backend.formats).
Result<FormatEvaluation> EvaluateFormat(Decoder& decoder, std::span<const int32_t> tokens,
                                        const KvBackendOptions& backend,
                                        const PerplexityOptions& options = {});

// Storage variants (model/kv/kv_variant.h) on the naive reference backend,
// each against one naive f32 run; or, with `cache` (a kCache backend: its
// layout and block size), on the cache itself, each variant a format pair
// with its precision window (CacheWindowOf), against one f32 run of that
// cache. Errors (a variant the model's shape or the cache cannot take
// included) are returned as a Status before anything is evaluated.
struct VariantEvaluation {
  KvVariant variant;
  PerplexityResult result;
};
Result<std::vector<VariantEvaluation>> EvaluateVariants(Decoder& decoder,
                                                        std::span<const int32_t> tokens,
                                                        std::span<const KvVariant> variants,
                                                        const PerplexityOptions& options = {},
                                                        const KvBackendOptions* cache = nullptr);

// Log-softmax helpers on one row of logits (double accumulation).
double LogSumExp(std::span<const float> logits);
// KL(softmax(ref) || softmax(x)).
double KlDivergence(std::span<const float> ref, std::span<const float> x);

}  // namespace kvcache::model
