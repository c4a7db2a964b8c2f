// Teacher-forced NLL, KL and top-1 agreement.
#include "model/generate/perplexity.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "model/generate/generate.h"
#include "model/kv/naive_kv.h"

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

Result<std::vector<float>> TeacherForcedLogits(Decoder& decoder, KvBackend& kv,
                                               std::span<const int32_t> tokens,
                                               const PerplexityOptions& options) {
  if (options.chunk_tokens == 0) return Status::InvalidArgument("perplexity: chunk_tokens is 0");
  if (tokens.size() < 2) {
    return Status::InvalidArgument("perplexity: needs at least 2 tokens, got " +
                                   std::to_string(tokens.size()));
  }
  if (kv.num_tokens() != 0) return Status::FailedPrecondition("perplexity: kv must start empty");
  const size_t vocab = decoder.config().vocab_size;
  const size_t n_feed = tokens.size() - 1;  // the last token predicts nothing
  std::vector<float> logits(n_feed * vocab);
  for (size_t start = 0, n = 0; start < n_feed; start += n) {
    n = std::min<size_t>(start == 0 && options.prefill_tokens > 0 ? options.prefill_tokens
                                                                   : options.chunk_tokens,
                         n_feed - start);
    KV_RETURN_IF_ERROR(decoder.Forward(tokens.subspan(start, n), kv,
                                       std::span<float>(logits).subspan(start * vocab, n * vocab)));
    if (options.on_progress) options.on_progress(start + n, n_feed);
  }
  return logits;
}

PerplexityResult ScoreLogits(std::span<const float> logits, std::span<const int32_t> tokens,
                             uint32_t vocab, std::span<const float> ref_logits) {
  PerplexityResult r;
  r.num_predictions = static_cast<uint32_t>(tokens.size() - 1);
  double nll = 0, ref_nll = 0, kl = 0;
  uint32_t agree = 0;
  r.logprobs.resize(r.num_predictions);
  for (size_t i = 0; i < r.num_predictions; ++i) {
    const int32_t next = tokens[i + 1];
    const auto row = logits.subspan(i * vocab, vocab);
    const double token_nll = LogSumExp(row) - row[next];
    r.logprobs[i] = static_cast<float>(-token_nll);
    nll += token_nll;
    if (!ref_logits.empty()) {
      const auto ref_row = ref_logits.subspan(i * vocab, vocab);
      ref_nll += LogSumExp(ref_row) - ref_row[next];
      kl += KlDivergence(ref_row, row);
      agree += Argmax(row) == Argmax(ref_row);
    }
  }
  const double n = r.num_predictions;
  r.mean_nll = nll / n;
  r.perplexity = std::exp(r.mean_nll);
  if (!ref_logits.empty()) {
    r.ref_mean_nll = ref_nll / n;
    r.kl_vs_ref = kl / n;
    r.top1_agree_vs_ref = agree / n;
  }
  return r;
}

Result<PerplexityResult> Perplexity(Decoder& decoder, KvBackend& kv, KvBackend* ref,
                                    std::span<const int32_t> tokens,
                                    const PerplexityOptions& options) {
  KV_ASSIGN_OR_RETURN(std::vector<float> logits, TeacherForcedLogits(decoder, kv, tokens, options));
  std::vector<float> ref_logits;
  if (ref) {
    Decoder& ref_decoder = options.reference_decoder ? *options.reference_decoder : decoder;
    KV_ASSIGN_OR_RETURN(ref_logits, TeacherForcedLogits(ref_decoder, *ref, tokens, options));
  }
  return ScoreLogits(logits, tokens, decoder.config().vocab_size, ref_logits);
}

std::string_view FormatEvaluationStateName(FormatEvaluation::State state) {
  switch (state) {
    case FormatEvaluation::State::kOk: return "ok";
    case FormatEvaluation::State::kUnsupported: return "unsupported";
    case FormatEvaluation::State::kUnavailable: return "not available";
  }
  return "?";
}

Result<std::vector<FormatEvaluation>> EvaluateFormats(Decoder& decoder,
                                                      std::span<const int32_t> tokens,
                                                      const KvBackendOptions& backend,
                                                      std::span<const FormatPair> formats,
                                                      const PerplexityOptions& options) {
  const uint32_t head_dim = decoder.config().head_dim();
  const uint32_t vocab = decoder.config().vocab_size;
  KvBackendOptions o = backend;
  AttentionShape shape = decoder.attention_shape();
  if (options.max_seq_len != 0) shape.max_seq_len = std::min(shape.max_seq_len, options.max_seq_len);
  // The f32 reference, computed on the first format that needs it.
  std::vector<float> ref_logits;
  auto reference = [&]() -> Status {
    if (!ref_logits.empty()) return Status::Ok();
    o.formats = FormatPair{};
    o.eviction = EvictionSpec{};  // the reference keeps every position
    KV_ASSIGN_OR_RETURN(auto ref, CreateKvBackend(shape, o));
    o.eviction = backend.eviction;
    Decoder& ref_decoder = options.reference_decoder ? *options.reference_decoder : decoder;
    KV_ASSIGN_OR_RETURN(ref_logits, TeacherForcedLogits(ref_decoder, *ref, tokens, options));
    return Status::Ok();
  };
  std::vector<FormatEvaluation> out;
  for (FormatPair pair : formats) {
    FormatEvaluation e;
    e.formats = pair;
    Status fits = CheckHeadDim(pair.k, head_dim);
    if (fits.ok()) fits = CheckHeadDim(pair.v, head_dim);
    if (!fits.ok()) {
      e.state = FormatEvaluation::State::kUnsupported;
      e.message = fits.message();
      out.push_back(std::move(e));
      continue;
    }
    Result<std::vector<float>> logits = Status::Internal("unset");
    if (Status s = reference(); !s.ok()) {
      logits = s;
    } else if (pair == FormatPair{} && !backend.eviction.enabled() && options.reference_decoder == nullptr) {
      logits = ref_logits;  // f32:f32 is the reference itself
    } else {
      o.formats = pair;
      auto kv = CreateKvBackend(shape, o);
      logits = kv.ok() ? TeacherForcedLogits(decoder, **kv, tokens, options) : kv.status();
    }
    if (!logits.ok()) {
      if (logits.status().code() != StatusCode::kUnimplemented) return logits.status();
      e.state = FormatEvaluation::State::kUnavailable;
      e.message = logits.status().message();
    } else {
      e.result = ScoreLogits(*logits, tokens, vocab, ref_logits);
    }
    out.push_back(std::move(e));
  }
  return out;
}

Result<FormatEvaluation> EvaluateFormat(Decoder& decoder, std::span<const int32_t> tokens,
                                        const KvBackendOptions& backend,
                                        const PerplexityOptions& options) {
  const FormatPair pair[1] = {backend.formats};
  KV_ASSIGN_OR_RETURN(std::vector<FormatEvaluation> all,
                      EvaluateFormats(decoder, tokens, backend, pair, options));
  return std::move(all[0]);
}

Result<std::vector<VariantEvaluation>> EvaluateVariants(Decoder& decoder,
                                                        std::span<const int32_t> tokens,
                                                        std::span<const KvVariant> variants,
                                                        const PerplexityOptions& options,
                                                        const KvBackendOptions* cache) {
  AttentionShape shape = decoder.attention_shape();
  if (options.max_seq_len != 0) shape.max_seq_len = std::min(shape.max_seq_len, options.max_seq_len);
  // The cache's backends for a variant (or the f32 reference: window none).
  auto on_cache = [&](FormatPair formats, PrecisionWindow window) {
    KvBackendOptions o = *cache;
    o.formats = formats;
    o.window = window;
    return CreateKvBackend(shape, o);
  };
  std::vector<std::unique_ptr<KvBackend>> backends;
  for (const KvVariant& v : variants) {  // every variant checked before the first run
    if (cache != nullptr) {
      KV_ASSIGN_OR_RETURN(PrecisionWindow window, CacheWindowOf(v));
      KV_ASSIGN_OR_RETURN(auto kv, on_cache(v.formats, window));
      backends.push_back(std::move(kv));
    } else {
      KV_ASSIGN_OR_RETURN(auto kv, NaiveKv::CreateVariant(shape, v));
      backends.push_back(std::move(kv));
    }
  }
  std::unique_ptr<KvBackend> ref;
  if (cache != nullptr) {
    KV_ASSIGN_OR_RETURN(ref, on_cache(FormatPair{}, PrecisionWindow{}));
  } else {
    KV_ASSIGN_OR_RETURN(ref, NaiveKv::Create(shape, FormatPair{}));
  }
  Decoder& ref_decoder = options.reference_decoder ? *options.reference_decoder : decoder;
  KV_ASSIGN_OR_RETURN(std::vector<float> ref_logits, TeacherForcedLogits(ref_decoder, *ref, tokens, options));
  ref.reset();
  std::vector<VariantEvaluation> out;
  for (size_t i = 0; i < variants.size(); ++i) {
    KV_ASSIGN_OR_RETURN(std::vector<float> logits,
                        TeacherForcedLogits(decoder, *backends[i], tokens, options));
    backends[i].reset();
    out.push_back({variants[i], ScoreLogits(logits, tokens, decoder.config().vocab_size, ref_logits)});
  }
  return out;
}

}  // namespace kvcache::model
