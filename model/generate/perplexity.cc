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

LogitScorer::LogitScorer(uint32_t vocab, uint32_t num_predictions, uint32_t score_from)
    : vocab_(vocab), score_from_(score_from), logprobs_(num_predictions) {}

void LogitScorer::Add(uint32_t i, std::span<const float> row, int32_t next, std::span<const float> ref_row) {
  const double token_nll = LogSumExp(row) - row[next];
  logprobs_[i] = static_cast<float>(-token_nll);
  with_ref_ = !ref_row.empty();
  double ref_nll = 0, kl = 0;
  bool agree = false;
  if (with_ref_) {
    ref_nll = LogSumExp(ref_row) - ref_row[next];
    kl = KlDivergence(ref_row, row);
    agree = Argmax(row) == Argmax(ref_row);
  }
  for (Sums* s : {&all_, i >= score_from_ ? &from_ : nullptr}) {
    if (s == nullptr) continue;
    s->nll += token_nll;
    s->ref_nll += ref_nll;
    s->kl += kl;
    s->agree += agree;
    ++s->n;
  }
}

ScoreStats LogitScorer::Sums::Stats(bool with_ref) const {
  ScoreStats r;
  r.num_predictions = n;
  if (n == 0) return r;
  r.mean_nll = nll / n;
  r.perplexity = std::exp(r.mean_nll);
  if (with_ref) {
    r.ref_mean_nll = ref_nll / n;
    r.kl_vs_ref = kl / n;
    r.top1_agree_vs_ref = static_cast<double>(agree) / n;
  }
  return r;
}

PerplexityResult LogitScorer::Finish() const {
  PerplexityResult r;
  static_cast<ScoreStats&>(r) = from_.Stats(with_ref_);
  r.scored_from = score_from_;
  r.all_positions = all_.Stats(with_ref_);
  r.logprobs = logprobs_;
  return r;
}

PerplexityResult ScoreLogits(std::span<const float> logits, std::span<const int32_t> tokens,
                             uint32_t vocab, std::span<const float> ref_logits, uint32_t score_from) {
  const uint32_t n = static_cast<uint32_t>(tokens.size() - 1);
  LogitScorer scorer(vocab, n, score_from);
  for (uint32_t i = 0; i < n; ++i) {
    scorer.Add(i, logits.subspan(size_t{i} * vocab, vocab), tokens[i + 1],
               ref_logits.empty() ? std::span<const float>() : ref_logits.subspan(size_t{i} * vocab, vocab));
  }
  return scorer.Finish();
}

Result<std::vector<PerplexityResult>> ScoreInLockstep(Decoder& decoder, std::span<KvBackend* const> kvs,
                                                      Decoder& ref_decoder, KvBackend& ref,
                                                      std::span<const int32_t> tokens,
                                                      const PerplexityOptions& options,
                                                      std::vector<Status>* failed) {
  if (options.chunk_tokens == 0) return Status::InvalidArgument("perplexity: chunk_tokens is 0");
  if (tokens.size() < 2) {
    return Status::InvalidArgument("perplexity: needs at least 2 tokens, got " + std::to_string(tokens.size()));
  }
  if (ref.num_tokens() != 0) return Status::FailedPrecondition("perplexity: kv must start empty");
  for (KvBackend* kv : kvs) {
    if (kv != nullptr && kv->num_tokens() != 0) return Status::FailedPrecondition("perplexity: kv must start empty");
  }
  const uint32_t vocab = decoder.config().vocab_size;
  const size_t n_feed = tokens.size() - 1;
  std::vector<LogitScorer> scorers(kvs.size(), LogitScorer(vocab, static_cast<uint32_t>(n_feed), options.score_from));
  failed->assign(kvs.size(), Status::Ok());
  std::vector<float> ref_logits, logits;
  for (size_t start = 0, n = 0; start < n_feed; start += n) {
    n = std::min<size_t>(start == 0 && options.prefill_tokens > 0 ? options.prefill_tokens : options.chunk_tokens,
                         n_feed - start);
    const std::span<const int32_t> pass = tokens.subspan(start, n);
    ref_logits.resize(n * vocab);
    KV_RETURN_IF_ERROR(ref_decoder.Forward(pass, ref, ref_logits));
    for (size_t b = 0; b < kvs.size(); ++b) {
      if (!(*failed)[b].ok()) continue;
      const std::vector<float>* rows = &ref_logits;
      if (kvs[b] != nullptr) {
        logits.resize(n * vocab);
        Status s = decoder.Forward(pass, *kvs[b], logits);
        if (s.code() == StatusCode::kUnimplemented) {
          (*failed)[b] = s;
          continue;
        }
        KV_RETURN_IF_ERROR(s);
        rows = &logits;
      }
      for (size_t i = 0; i < n; ++i) {
        scorers[b].Add(static_cast<uint32_t>(start + i), std::span<const float>(*rows).subspan(i * vocab, vocab),
                       tokens[start + i + 1], std::span<const float>(ref_logits).subspan(i * vocab, vocab));
      }
    }
    if (options.on_progress) options.on_progress(start + n, n_feed);
  }
  std::vector<PerplexityResult> out;
  for (const LogitScorer& s : scorers) out.push_back(s.Finish());
  return out;
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
  return ScoreLogits(logits, tokens, decoder.config().vocab_size, ref_logits, options.score_from);
}

std::string_view FormatEvaluationStateName(FormatEvaluation::State state) {
  switch (state) {
    case FormatEvaluation::State::kOk: return "ok";
    case FormatEvaluation::State::kUnsupported: return "unsupported";
    case FormatEvaluation::State::kUnavailable: return "not available";
  }
  return "?";
}

Result<std::vector<FormatEvaluation>> EvaluateBackends(Decoder& decoder, std::span<const int32_t> tokens,
                                                       std::span<const KvBackendOptions> backends,
                                                       const PerplexityOptions& options) {
  if (backends.empty()) return Status::InvalidArgument("perplexity: no backend to evaluate");
  const uint32_t head_dim = decoder.config().head_dim();
  AttentionShape shape = decoder.attention_shape();
  if (options.max_seq_len != 0) shape.max_seq_len = std::min(shape.max_seq_len, options.max_seq_len);
  // The reference: f32, every position kept, one format for every layer.
  KvBackendOptions r = backends[0];
  r.formats = FormatPair{};
  r.local_formats.reset();
  r.window = PrecisionWindow{};
  r.eviction = EvictionSpec{};
  std::vector<FormatEvaluation> out(backends.size());
  std::vector<std::unique_ptr<KvBackend>> owned;
  std::vector<KvBackend*> kvs;
  std::vector<size_t> index;  // out[] of each backend run
  for (size_t f = 0; f < backends.size(); ++f) {
    FormatEvaluation& e = out[f];
    const KvBackendOptions& o = backends[f];
    e.formats = o.formats;
    Status fits = CheckHeadDim(o.formats.k, head_dim);
    if (fits.ok()) fits = CheckHeadDim(o.formats.v, head_dim);
    if (fits.ok() && o.local_formats) fits = CheckHeadDim(o.local_formats->k, head_dim);
    if (fits.ok() && o.local_formats) fits = CheckHeadDim(o.local_formats->v, head_dim);
    if (!fits.ok()) {
      e.state = FormatEvaluation::State::kUnsupported;
      e.message = fits.message();
      continue;
    }
    const bool is_reference = o.formats == FormatPair{} && !o.eviction.enabled() && !o.local_formats &&
                              !o.window.enabled() && o.layout == r.layout && o.kind == r.kind &&
                              options.reference_decoder == nullptr;
    if (is_reference) {
      index.push_back(f);
      kvs.push_back(nullptr);  // the reference itself
      continue;
    }
    auto kv = CreateKvBackend(shape, o);
    if (!kv.ok()) {
      if (kv.status().code() != StatusCode::kUnimplemented) return kv.status();
      e.state = FormatEvaluation::State::kUnavailable;
      e.message = kv.status().message();
      continue;
    }
    index.push_back(f);
    owned.push_back(std::move(kv).value());
    kvs.push_back(owned.back().get());
  }
  if (kvs.empty()) return out;
  KV_ASSIGN_OR_RETURN(auto ref, CreateKvBackend(shape, r));
  Decoder& ref_decoder = options.reference_decoder ? *options.reference_decoder : decoder;
  std::vector<Status> failed;
  KV_ASSIGN_OR_RETURN(std::vector<PerplexityResult> results,
                      ScoreInLockstep(decoder, kvs, ref_decoder, *ref, tokens, options, &failed));
  for (size_t b = 0; b < index.size(); ++b) {
    FormatEvaluation& e = out[index[b]];
    if (!failed[b].ok()) {
      e.state = FormatEvaluation::State::kUnavailable;
      e.message = failed[b].message();
    } else {
      e.result = std::move(results[b]);
    }
  }
  return out;
}

Result<std::vector<FormatEvaluation>> EvaluateFormats(Decoder& decoder,
                                                      std::span<const int32_t> tokens,
                                                      const KvBackendOptions& backend,
                                                      std::span<const FormatPair> formats,
                                                      const PerplexityOptions& options) {
  std::vector<KvBackendOptions> backends(formats.size(), backend);
  for (size_t f = 0; f < formats.size(); ++f) backends[f].formats = formats[f];
  if (backends.empty()) return std::vector<FormatEvaluation>{};
  return EvaluateBackends(decoder, tokens, backends, options);
}

VariantBits CacheBits(const AttentionShape& shape, const KvBackendOptions& options, uint32_t positions) {
  KvVariant global;
  global.formats = options.formats;
  global.sinks = options.window.sinks;
  global.recent = options.window.recent;
  const VariantBits g = CacheWindowBits(global, shape.head_dim, positions);
  const FormatPair local = options.local_formats.value_or(options.formats);
  const VariantBits l{BitsPerValue(local.k, shape.head_dim), BitsPerValue(local.v, shape.head_dim)};
  double rows_g = 0, rows_l = 0;
  for (uint32_t layer = 0; layer < shape.n_layers; ++layer) {
    const uint32_t w = shape.window(layer);
    if (w == 0) {
      rows_g += positions;
    } else {
      rows_l += std::min(positions, w);
    }
  }
  const double rows = rows_g + rows_l;
  if (rows == 0) return g;
  return {(g.k * rows_g + l.k * rows_l) / rows, (g.v * rows_g + l.v * rows_l) / rows};
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
  std::vector<KvBackend*> kvs;
  for (auto& b : backends) kvs.push_back(b.get());
  std::vector<Status> failed;
  KV_ASSIGN_OR_RETURN(std::vector<PerplexityResult> results,
                      ScoreInLockstep(decoder, kvs, ref_decoder, *ref, tokens, options, &failed));
  std::vector<VariantEvaluation> out;
  for (size_t i = 0; i < variants.size(); ++i) {
    KV_RETURN_IF_ERROR(failed[i]);
    out.push_back({variants[i], std::move(results[i])});
  }
  return out;
}

}  // namespace kvcache::model
