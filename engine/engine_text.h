// The text side of the engine's requests: a text or chat prompt turned into
// ids with the model's tokenizer (and every prompt checked), and the pieces
// of text each generated token and its top alternatives stand for.
//
// Thread safety: free functions over a LoadedModel, which is immutable;
// call them from any thread.
#pragma once

#include <cstdint>
#include <string>

#include "engine/engine.h"
#include "kvcache/status.h"
#include "model/decoder/loaded_model.h"

namespace kvcache::engine {

// Replaces a text or chat prompt by its ids (cutting max_tokens to the room
// the context leaves), then checks the ids: exactly one form given,
// non-empty, in the vocabulary, prompt + 1 within the context. On failure
// *fault says what was wrong (engine.h, SubmitFault).
Status PreparePrompt(const model::LoadedModel& model, RequestParams* params, SubmitFault* fault);

// The text token t adds after token prev ("" where the tokenizer has none).
std::string Piece(const model::LoadedModel& model, int32_t prev, int32_t t);

// Sets out's piece and its top entries' pieces, each after token prev.
void SetPieces(const model::LoadedModel& model, int32_t prev, TokenOut* out);

}  // namespace kvcache::engine
