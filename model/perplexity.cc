// Teacher-forced NLL, KL and top-1 agreement.
#include "model/perplexity.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "model/generate.h"

namespace kvcache::model {

double LogSumExp(std::span<const float> logits) {
  double mx = logits[0];
  for (float x : logits) mx = std::max(mx, static_cast<double>(x));
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - mx);
  return mx + std::log(sum);
}

double KlDivergence(std::span<const float> ref, std::span<const float> x) {
  const double lse_ref = LogSumExp(ref), lse_x = LogSumExp(x);
  double kl = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double lp = ref[i] - lse_ref, lq = x[i] - lse_x;
    kl += std::exp(lp) * (lp - lq);
  }
  return std::max(kl, 0.0);
}

Result<PerplexityResult> Perplexity(Decoder& decoder, KvBackend& kv, KvBackend* ref,
                                    std::span<const int32_t> tokens,
                                    const PerplexityOptions& options) {
  if (options.chunk_tokens == 0) return Status::InvalidArgument("perplexity: chunk_tokens is 0");
  if (tokens.size() < 2) {
    return Status::InvalidArgument("perplexity: needs at least 2 tokens, got " +
                                   std::to_string(tokens.size()));
  }
  if (kv.num_tokens() != 0 || (ref && ref->num_tokens() != 0)) {
    return Status::FailedPrecondition("perplexity: backends must start empty");
  }
  const uint32_t vocab = decoder.config().vocab_size;
  // The last token predicts nothing: feed tokens[0 .. size-1).
  const size_t n_feed = tokens.size() - 1;
  std::vector<float> logits, ref_logits;
  PerplexityResult r;
  double nll = 0, ref_nll = 0, kl = 0;
  uint32_t agree = 0;
  for (size_t start = 0; start < n_feed; start += options.chunk_tokens) {
    const size_t n = std::min<size_t>(options.chunk_tokens, n_feed - start);
    const auto chunk = tokens.subspan(start, n);
    logits.resize(n * vocab);
    KV_RETURN_IF_ERROR(decoder.Forward(chunk, kv, logits));
    if (ref) {
      ref_logits.resize(n * vocab);
      KV_RETURN_IF_ERROR(decoder.Forward(chunk, *ref, ref_logits));
    }
    for (size_t i = 0; i < n; ++i) {
      const int32_t next = tokens[start + i + 1];
      const auto row = std::span<const float>(logits).subspan(i * vocab, vocab);
      nll += LogSumExp(row) - row[next];
      if (ref) {
        const auto ref_row = std::span<const float>(ref_logits).subspan(i * vocab, vocab);
        ref_nll += LogSumExp(ref_row) - ref_row[next];
        kl += KlDivergence(ref_row, row);
        agree += Argmax(row) == Argmax(ref_row);
      }
    }
  }
  r.num_predictions = static_cast<uint32_t>(tokens.size() - 1);
  const double n = r.num_predictions;
  r.mean_nll = nll / n;
  r.perplexity = std::exp(r.mean_nll);
  if (ref) {
    r.ref_mean_nll = ref_nll / n;
    r.kl_vs_ref = kl / n;
    r.top1_agree_vs_ref = agree / n;
  }
  return r;
}

Result<FormatEvaluation> EvaluateFormat(Decoder& decoder, std::span<const int32_t> tokens,
                                        const KvBackendOptions& backend,
                                        const PerplexityOptions& options) {
  FormatEvaluation e;
  const uint32_t head_dim = decoder.config().head_dim();
  for (Format f : {backend.formats.k, backend.formats.v}) {
    Status s = CheckHeadDim(f, head_dim);
    if (!s.ok()) {
      e.state = FormatEvaluation::State::kUnsupported;
      e.message = s.message();
      return e;
    }
  }
  auto classify = [&](const Status& s) {
    if (s.code() != StatusCode::kUnimplemented) return false;
    e.state = FormatEvaluation::State::kUnavailable;
    e.message = s.message();
    return true;
  };
  auto kv = CreateKvBackend(decoder.attention_shape(), backend);
  if (!kv.ok()) {
    if (classify(kv.status())) return e;
    return kv.status();
  }
  KvBackendOptions ref_options = backend;
  ref_options.formats = FormatPair{};
  KV_ASSIGN_OR_RETURN(auto ref, CreateKvBackend(decoder.attention_shape(), ref_options));
  auto r = Perplexity(decoder, **kv, ref.get(), tokens, options);
  if (!r.ok()) {
    if (classify(r.status())) return e;
    return r.status();
  }
  e.result = *r;
  return e;
}

std::string_view FormatEvaluationStateName(FormatEvaluation::State state) {
  switch (state) {
    case FormatEvaluation::State::kOk: return "ok";
    case FormatEvaluation::State::kUnsupported: return "unsupported";
    case FormatEvaluation::State::kUnavailable: return "not available";
  }
  return "?";
}

}  // namespace kvcache::model
