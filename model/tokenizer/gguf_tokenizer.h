// The tokenizer a GGUF file describes, whichever kind it is:
// tokenizer.ggml.model "gpt2" is the byte-level BPE (bpe_tokenizer.h),
// "llama" the SentencePiece BPE (spm_tokenizer.h). One interface over the
// two for the model loader and the CLI.
//
// Thread safety: immutable after FromGguf; share it freely.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kvcache/status.h"
#include "model/tokenizer/bpe_tokenizer.h"
#include "model/tokenizer/spm_tokenizer.h"

namespace kvcache::model {

class GgufFile;

class GgufTokenizer {
 public:
  explicit GgufTokenizer(BpeTokenizer bpe) : tok_(std::move(bpe)) {}
  explicit GgufTokenizer(SpmTokenizer spm) : tok_(std::move(spm)) {}
  // By tokenizer.ggml.model (NotFound when absent, Unimplemented naming any
  // other value): "gpt2" is BpeTokenizer::FromGguf, its errors as they are;
  // "llama" a SentencePiece vocabulary from the keys tokens (required,
  // NotFound naming it), scores, token_type, bos/eos_token_id (llama.cpp's
  // defaults 1 and 2 when absent), add_bos_token (default true),
  // add_space_prefix (default true) and chat_template. Errors name the key
  // and the file.
  static Result<GgufTokenizer> FromGguf(const GgufFile& file);

  // The kind inside: one of these is non-null.
  const BpeTokenizer* bpe() const { return std::get_if<BpeTokenizer>(&tok_); }
  const SpmTokenizer* spm() const { return std::get_if<SpmTokenizer>(&tok_); }
  // "gpt2" or "llama", as tokenizer.ggml.model names it.
  std::string_view model_name() const { return bpe() != nullptr ? "gpt2" : "llama"; }

  uint32_t vocab_size() const {
    return std::visit([](const auto& t) { return t.vocab_size(); }, tok_);
  }
  int32_t bos_id() const {
    return std::visit([](const auto& t) { return t.bos_id(); }, tok_);
  }
  int32_t eos_id() const {
    return std::visit([](const auto& t) { return t.eos_id(); }, tok_);
  }
  bool add_bos() const {
    return std::visit([](const auto& t) { return t.add_bos(); }, tok_);
  }
  const std::string& chat_template() const {
    return std::visit([](const auto& t) -> const std::string& { return t.chat_template(); },
                      tok_);
  }
  bool is_special(int32_t id) const {
    return std::visit([id](const auto& t) { return t.is_special(id); }, tok_);
  }
  Result<int32_t> SpecialId(std::string_view text) const {
    return std::visit([text](const auto& t) { return t.SpecialId(text); }, tok_);
  }
  Result<std::vector<int32_t>> Encode(std::string_view text,
                                      const BpeEncodeOptions& options = {}) const {
    return std::visit([&](const auto& t) { return t.Encode(text, options); }, tok_);
  }
  Result<std::string> DecodeToken(int32_t id) const {
    return std::visit([id](const auto& t) { return t.DecodeToken(id); }, tok_);
  }
  Result<std::string> Decode(std::span<const int32_t> ids) const {
    return std::visit([ids](const auto& t) { return t.Decode(ids); }, tok_);
  }

 private:
  std::variant<BpeTokenizer, SpmTokenizer> tok_;
};

}  // namespace kvcache::model
