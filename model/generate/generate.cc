// Sampling, n-gram drafting and the generate loop.
#include "model/generate/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include "model/tensor/ops.h"

namespace kvcache::model {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The early-exit draft: k greedy guesses from the first n_layers layers,
// fed one at a time as partial-depth passes after the pending token, then
// truncated away so kv holds what it held before.
Result<std::vector<int32_t>> EarlyExitDraft(Decoder& decoder, KvBackend& kv, int32_t pending,
                                            uint32_t n_layers, uint32_t k) {
  const uint32_t before = kv.num_tokens();
  std::vector<float> logits(decoder.config().vocab_size);
  std::vector<int32_t> draft;
  ForwardOptions partial;
  partial.n_layers = n_layers;
  int32_t x = pending;
  for (uint32_t i = 0; i < k; ++i) {
    Status s = decoder.Forward(std::span<const int32_t>(&x, 1), kv, logits, partial);
    if (!s.ok()) {
      (void)kv.Truncate(before);
      return s;
    }
    x = Argmax(logits);
    draft.push_back(x);
  }
  KV_RETURN_IF_ERROR(kv.Truncate(before));
  return draft;
}

}  // namespace

int32_t Argmax(std::span<const float> logits) {
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

Sampler::Sampler(const SamplingOptions& options)
    : temperature_(options.temperature), state_(options.seed ^ 0x9e3779b97f4a7c15ull) {
  if (state_ == 0) state_ = 1;
}

double Sampler::NextUniform() {
  state_ ^= state_ >> 12;
  state_ ^= state_ << 25;
  state_ ^= state_ >> 27;
  const uint64_t r = state_ * 0x2545f4914f6cdd1dull;
  return static_cast<double>(r >> 11) * (1.0 / 9007199254740992.0);
}

int32_t Sampler::Sample(std::span<const float> logits) {
  if (temperature_ <= 0.0f) return Argmax(logits);
  probs_.assign(logits.begin(), logits.end());
  for (float& p : probs_) p /= temperature_;
  Softmax(probs_.data(), static_cast<uint32_t>(probs_.size()));
  const double r = NextUniform();
  double cdf = 0;
  for (size_t i = 0; i < probs_.size(); ++i) {
    cdf += probs_[i];
    if (r < cdf) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(probs_.size() - 1);  // rounding left r >= the total
}

std::vector<int32_t> NgramDraft(std::span<const int32_t> context, uint32_t ngram_max,
                                uint32_t max_tokens) {
  const size_t n = context.size();
  for (size_t g = std::min<size_t>(ngram_max, n > 0 ? n - 1 : 0); g >= 1; --g) {
    const auto suffix = context.subspan(n - g);
    // Latest start s < n - g whose g tokens equal the suffix.
    for (size_t s = n - g; s-- > 0;) {
      if (std::equal(suffix.begin(), suffix.end(), context.begin() + s)) {
        const size_t from = s + g;
        const size_t take = std::min<size_t>(max_tokens, n - from);
        return std::vector<int32_t>(context.begin() + from, context.begin() + from + take);
      }
    }
  }
  return {};
}

namespace {

// The tokens drafted after context for the next pass, generated tokens
// already emitted: no more than fit before max_seq_len (the pass covers
// positions size-1 .. size-1+k) and the token budget (drafting past it is
// wasted).
Result<std::vector<int32_t>> Draft(Decoder& decoder, KvBackend& kv,
                                   const std::vector<int32_t>& context, size_t generated,
                                   const GenerateOptions& options) {
  const size_t room = std::min<size_t>(decoder.config().max_seq_len - context.size(),
                                       options.max_new_tokens - generated - 1);
  const uint32_t want = static_cast<uint32_t>(std::min<size_t>(options.draft_tokens, room));
  if (options.draft_kind == DraftKind::kNgram) return NgramDraft(context, options.ngram_max, want);
  if (want == 0) return std::vector<int32_t>{};
  return EarlyExitDraft(decoder, kv, context.back(), options.draft_layers, want);
}

}  // namespace

Status PrefillInChunks(Decoder& decoder, KvBackend& kv, std::span<const int32_t> tokens, uint32_t chunk,
                       std::span<float> last_logits) {
  if (chunk == 0) return Status::InvalidArgument("prefill: chunk is 0");
  std::vector<float> scratch;
  if (last_logits.empty()) {
    scratch.resize(decoder.config().vocab_size);
    last_logits = scratch;
  }
  for (size_t i = 0; i < tokens.size(); i += chunk) {
    const size_t n = std::min<size_t>(chunk, tokens.size() - i);
    KV_RETURN_IF_ERROR(decoder.Forward(tokens.subspan(i, n), kv, last_logits));
  }
  return Status::Ok();
}

Result<GenerateResult> Generate(Decoder& decoder, KvBackend& kv, std::span<const int32_t> prompt,
                                const GenerateOptions& options) {
  const ModelConfig& c = decoder.config();
  const uint32_t vocab = c.vocab_size;
  const uint32_t cached = kv.num_tokens();
  if (prompt.empty() || cached >= prompt.size()) {
    return Status::InvalidArgument("generate: the prompt (" + std::to_string(prompt.size()) +
                                   " tokens) must extend the " + std::to_string(cached) +
                                   " cached positions");
  }
  if (options.draft_tokens > 0 && options.draft_kind == DraftKind::kEarlyExit &&
      (options.draft_layers == 0 || options.draft_layers >= c.n_layers)) {
    return Status::InvalidArgument("generate: draft_layers " + std::to_string(options.draft_layers) +
                                   " must be in [1, " + std::to_string(c.n_layers - 1) + "]");
  }
  GenerateResult result;
  Sampler sampler(options.sampling);
  std::vector<float> logits(vocab);

  auto t0 = std::chrono::steady_clock::now();
  result.prompt_tokens = static_cast<uint32_t>(prompt.size() - cached);
  if (options.prefill_chunk_tokens > 0) {
    KV_RETURN_IF_ERROR(PrefillInChunks(decoder, kv, prompt.subspan(cached), options.prefill_chunk_tokens, logits));
  } else {
    KV_RETURN_IF_ERROR(decoder.Forward(prompt.subspan(cached), kv, logits));
  }
  result.prefill_seconds = SecondsSince(t0);

  t0 = std::chrono::steady_clock::now();
  std::vector<int32_t> context(prompt.begin(), prompt.end());
  // Invariant at the top of the loop: kv holds context[0 .. size-1); `logits`
  // ([k+1][vocab]) are the predictions after context's last positions.
  bool done = false;
  auto emit = [&](int32_t t) {
    if (options.stop_at_eos &&
        std::find(options.stop_tokens.begin(), options.stop_tokens.end(), t) != options.stop_tokens.end()) {
      done = true;
      return;
    }
    context.push_back(t);
    result.tokens.push_back(t);
    if (options.on_token) options.on_token(t);
    if (result.tokens.size() >= options.max_new_tokens || context.size() >= c.max_seq_len) {
      done = true;
    }
  };
  if (options.max_new_tokens == 0) return result;
  auto sample = [&](std::span<const float> dist) {
    if (options.on_logits) options.on_logits(dist);
    return sampler.Sample(dist);
  };
  emit(sample(logits));
  std::vector<int32_t> pass;
  while (!done) {
    pass.assign(1, context.back());
    if (options.draft_tokens > 0) {
      KV_ASSIGN_OR_RETURN(const std::vector<int32_t> draft,
                          Draft(decoder, kv, context, result.tokens.size(), options));
      pass.insert(pass.end(), draft.begin(), draft.end());
      result.drafted_tokens += static_cast<uint32_t>(draft.size());
    }
    const size_t k = pass.size() - 1;
    logits.resize((k + 1) * vocab);
    KV_RETURN_IF_ERROR(decoder.Forward(pass, kv, logits));
    ++result.forward_passes;
    for (size_t i = 0; i <= k && !done; ++i) {
      const int32_t t = sample(std::span<const float>(logits).subspan(i * vocab, vocab));
      emit(t);
      if (i == k || t != pass[i + 1]) break;
      ++result.accepted_tokens;
    }
    if (!done) KV_RETURN_IF_ERROR(kv.Truncate(static_cast<uint32_t>(context.size() - 1)));
  }
  result.decode_seconds = SecondsSince(t0);
  return result;
}

}  // namespace kvcache::model
