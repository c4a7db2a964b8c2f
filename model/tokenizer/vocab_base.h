// What the GGUF tokenizers (byte-level BPE, SentencePiece) share: the token
// type codes, the encode options, the fields every GGUF vocabulary has, and
// the base class that keeps a vocabulary's special-token facts and checks
// an encode request against them.
//
// Thread safety: immutable after construction; share it freely.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvcache/status.h"

namespace kvcache::model {

// GGUF tokenizer.ggml.token_type codes.
enum GgufTokenType : int32_t {
  kTokenTypeNormal = 1,
  kTokenTypeUnknown = 2,
  kTokenTypeControl = 3,
  kTokenTypeUserDefined = 4,
  kTokenTypeUnused = 5,
  kTokenTypeByte = 6,
};

struct TextEncodeOptions {
  bool bos = false;            // prepend BOS (InvalidArgument when there is none)
  bool eos = false;            // append EOS (likewise)
  bool parse_special = false;  // control/user-defined token texts in `text` become those tokens
};

// The keys every GGUF vocabulary has.
struct VocabBase {
  std::vector<std::string> tokens;   // [vocab] tokenizer.ggml.tokens
  std::vector<int32_t> token_types;  // [vocab] tokenizer.ggml.token_type; empty: all normal
  int32_t bos_id = -1;               // -1: none
  int32_t eos_id = -1;               // -1: none
  bool add_bos = false;              // tokenizer.ggml.add_bos_token
  std::string chat_template;         // tokenizer.chat_template ("" when absent)
};

class VocabSpecials {
 public:
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  bool add_bos() const { return add_bos_; }
  const std::string& chat_template() const { return chat_template_; }

 protected:
  // Takes BOS, EOS, add_bos and the chat template (moved) from `vocab`;
  // Corruption ("<kind> special token id ...") when BOS or EOS is outside
  // the vocabulary.
  Status TakeSpecials(VocabBase& vocab, std::string_view kind);
  // The start of an encoding: room for the ids, BOS when asked for.
  // InvalidArgument, naming `kind`, for text over max_bytes or a BOS/EOS
  // asked for that the vocabulary lacks.
  Result<std::vector<int32_t>> BeginIds(std::string_view kind, size_t text_bytes,
                                        size_t max_bytes, const TextEncodeOptions& options) const;

  // InvalidArgument unless 0 <= id < vocab_size ("token id X [at position
  // P] is outside the vocabulary of N"; the position when one is given).
  static Status CheckId(int32_t id, uint32_t vocab_size, size_t position = SIZE_MAX);

  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  bool add_bos_ = false;
  std::string chat_template_;
};

}  // namespace kvcache::model
