// Tokenized prompts and the pieces of generated tokens (engine_text.h).
#include "engine/engine_text.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace kvcache::engine {
namespace {

// The ids of a text or chat prompt; *fault set on failure.
Result<std::vector<int32_t>> Tokenize(const model::LoadedModel& model, const RequestParams& p,
                                      SubmitFault* fault) {
  // A text prompt (a completion's) reads special-token texts as their tokens:
  // a base model's client writes the turn format out itself.
  auto ids = p.prompt_text ? model.Encode(*p.prompt_text, /*parse_special=*/true) : model.EncodeChat(p.messages);
  if (!ids.ok()) {
    *fault = ids.status().code() == StatusCode::kUnimplemented ? SubmitFault::kNoChatTemplate
                                                               : SubmitFault::kPromptEncoding;
    return ids.status();
  }
  if (ids->empty()) {
    *fault = SubmitFault::kPromptEmpty;
    return Status::InvalidArgument("the prompt encodes to no tokens");
  }
  return ids;
}

}  // namespace

Status PreparePrompt(const model::LoadedModel& model, RequestParams* p, SubmitFault* fault) {
  const model::ModelConfig& c = model.model().config();
  const bool text = p->prompt_text.has_value(), chat = !p->messages.empty();
  if (int{text} + int{chat} + int{!p->prompt.empty()} > 1) {
    *fault = SubmitFault::kPrompt;
    return Status::InvalidArgument("request: give the prompt as ids, text or messages, not several");
  }
  if (text || chat) {
    KV_ASSIGN_OR_RETURN(p->prompt, Tokenize(model, *p, fault));
    p->prompt_text.reset();
    p->messages.clear();
    if (p->prompt.size() < c.max_seq_len) {
      p->max_tokens = std::min(p->max_tokens, c.max_seq_len - static_cast<uint32_t>(p->prompt.size()));
    }
  }
  if (p->prompt.empty()) {
    *fault = SubmitFault::kPromptEmpty;
    return Status::InvalidArgument("request: empty prompt");
  }
  for (int32_t t : p->prompt) {
    if (t < 0 || static_cast<uint32_t>(t) >= c.vocab_size) {
      *fault = SubmitFault::kPrompt;
      return Status::InvalidArgument("request: token " + std::to_string(t) + " is outside the vocabulary (" +
                                     std::to_string(c.vocab_size) + ")");
    }
  }
  if (p->prompt.size() + 1 > c.max_seq_len) {
    *fault = SubmitFault::kPromptTooLong;
    return Status::InvalidArgument("the prompt has " + std::to_string(p->prompt.size()) +
                                   " tokens; the context holds " + std::to_string(c.max_seq_len) +
                                   " (prompt + at least one generated token)");
  }
  return Status::Ok();
}

std::string Piece(const model::LoadedModel& model, int32_t prev, int32_t t) {
  auto piece = model.DecodePiece(prev, t);
  return piece.ok() ? std::move(*piece) : std::string();
}

void SetPieces(const model::LoadedModel& model, int32_t prev, TokenOut* out) {
  out->piece = Piece(model, prev, out->token);
  for (TokenLogprob& top : out->top) top.piece = Piece(model, prev, top.token);
}

}  // namespace kvcache::engine
