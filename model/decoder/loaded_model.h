// A model and its tokenizer as the CLI names them: a GGUF file (the
// tokenizer and chat template from its metadata; --tokenizer unused) or a
// llama2.c checkpoint with its tokenizer.bin. One text interface over the
// two tokenizers, so generate / perplexity / the demo do not care which.
//
// Thread safety: immutable after Load; share it freely.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvcache/status.h"
#include "model/decoder/gguf_model.h"
#include "model/io/checkpoint.h"
#include "model/tokenizer/chat_template.h"
#include "model/tokenizer/gguf_tokenizer.h"
#include "model/tokenizer/tokenizer.h"

namespace kvcache::model {

class LoadedModel {
 public:
  // A GGUF file is recognised by its magic; anything else is read as a
  // llama2.c checkpoint, which needs tokenizer_path (InvalidArgument if
  // empty). Errors name the file.
  static Result<std::unique_ptr<LoadedModel>> Load(const std::string& model_path,
                                                   const std::string& tokenizer_path,
                                                   const GgufLoadOptions& options = {});

  const Model& model() const { return model_; }
  bool is_gguf() const { return bpe_.has_value(); }

  // Plain text to ids: llama2.c with BOS; GGUF with BOS iff the file says
  // add_bos_token, and special-token texts (Gemma's "<start_of_turn>",
  // ChatML's "<|im_start|>") kept as text, or with `parse_special` read as
  // their tokens (a prompt that writes a chat format out itself, as
  // llama.cpp and vLLM read a completion's prompt).
  Result<std::vector<int32_t>> Encode(std::string_view text, bool parse_special = false) const;
  // One user turn in the model's chat template, with the generation prompt
  // (GGUF with a ChatML template, or a Gemma 3 file without a template,
  // which gets Gemma's turn format: Unimplemented otherwise).
  Result<std::vector<int32_t>> EncodeChat(std::string_view user_message) const;
  // A whole conversation (system / user / assistant turns, in order) in the
  // chat template, with the generation prompt; same conditions, and
  // InvalidArgument for turns the format cannot hold (ChatTemplate::Check).
  Result<std::vector<int32_t>> EncodeChat(std::span<const ChatMessage> messages) const;
  Result<std::string> Decode(std::span<const int32_t> ids) const;
  // The text token t adds after token prev (streaming output).
  Result<std::string> DecodePiece(int32_t prev, int32_t t) const;
  // Tokens that end a generation (llama2.c: BOS, EOS; GGUF: its EOS and
  // BOS, and for Gemma 3 also <end_of_turn>).
  std::vector<int32_t> stop_tokens() const;

 private:
  LoadedModel(Model model) : model_(std::move(model)) {}
  // The chat format of this model (see EncodeChat).
  Result<ChatTemplate> Template() const;
  Model model_;
  std::optional<Tokenizer> llama2c_;
  std::optional<GgufTokenizer> bpe_;
};

}  // namespace kvcache::model
