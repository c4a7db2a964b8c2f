// The llama2.c tokenizer: a vocabulary of byte strings with merge scores.
//
// File layout (little-endian): int32 max_token_length, then for each of
// vocab_size tokens (vocab_size comes from the model, not the file): float32
// score, int32 byte length (0 <= len <= max_token_length), the bytes.
//
// Encode is llama2.c's: optional BOS, a leading " " token for non-empty text
// (sentencepiece's dummy prefix), each UTF-8 code point as its own token or,
// when the vocabulary lacks it, byte-fallback tokens <0xXX> (id = byte + 3),
// then repeatedly merge the adjacent pair whose concatenation is in the
// vocabulary with the highest score (leftmost on ties) until none is left.
// Decode drops BOS/EOS, strips the dummy-prefix space after BOS and turns
// <0xXX> pieces back into their byte.
//
// Thread safety: immutable after Load; share it freely.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvcache/status.h"

namespace kvcache::model {

inline constexpr int32_t kBosToken = 1;
inline constexpr int32_t kEosToken = 2;

struct EncodeOptions {
  bool bos = true;  // prepend BOS (token 1)
  bool eos = false;  // append EOS (token 2)
};

class Tokenizer {
 public:
  // Parses a tokenizer file held in memory. Corruption when it is truncated,
  // has trailing bytes, a negative or oversized length, or lacks the byte
  // fallback tokens; InvalidArgument for vocab_size < 259.
  static Result<Tokenizer> Parse(std::span<const uint8_t> bytes, uint32_t vocab_size);
  static Result<Tokenizer> Load(const std::string& path, uint32_t vocab_size);

  uint32_t vocab_size() const { return static_cast<uint32_t>(pieces_.size()); }
  const std::string& piece(int32_t id) const { return pieces_[id]; }
  float score(int32_t id) const { return scores_[id]; }

  std::vector<int32_t> Encode(std::string_view text, const EncodeOptions& options = {}) const;

  // The bytes token `id` stands for when it follows `prev` (llama2.c's
  // decode): empty for BOS/EOS, the leading space dropped right after BOS,
  // <0xXX> as its byte. InvalidArgument for an id outside the vocabulary.
  Result<std::string> DecodeToken(int32_t prev, int32_t id) const;
  // The text of a whole sequence (each token decoded after its predecessor;
  // the first after an implicit BOS). Decode(Encode(s)) == s.
  Result<std::string> Decode(std::span<const int32_t> ids) const;

 private:
  Tokenizer() = default;
  int32_t Lookup(std::string_view s) const;  // -1 when absent

  uint32_t max_token_length_ = 0;
  std::vector<std::string> pieces_;  // [vocab]
  std::vector<float> scores_;        // [vocab]
  std::unordered_map<std::string, int32_t> ids_;  // piece -> lowest id with it
};

}  // namespace kvcache::model
