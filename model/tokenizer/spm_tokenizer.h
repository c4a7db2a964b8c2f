// SentencePiece-style BPE: the tokenizer that GGUF files describe with
// tokenizer.ggml.model = "llama" (Llama 2, Gemma 3: pieces with scores, no
// merge list).
//
// Vocabulary: each piece is UTF-8 text with U+2581 ("▁") for a space;
// tokens of type byte (6) are "<0xNN>" and stand for one byte; control (3),
// user-defined (4) and unknown (2) tokens are literal text ("<bos>",
// "<start_of_turn>", "\n\n").
//
// Encode (llama.cpp's SPM path):
//  1. Special tokens are cut out of the text first: user-defined tokens
//     always, control and unknown tokens with parse_special. Longest token
//     first (equal lengths: lower id first), each at every leftmost
//     non-overlapping occurrence in the text not yet cut (a byte trie
//     finds which occur; each of those scans the uncut spans).
//  2. Each run of plain text between them, with a space in front when
//     add_space_prefix and it starts the text or follows a special token,
//     has its spaces replaced by "▁" and is split into characters by the
//     lead byte alone (0xC0..0xDF two bytes, 0xE0..0xEF three, 0xF0..0xFF
//     four, anything else one; cut at the end of the run; continuation
//     bytes are not checked, as llama.cpp does not).
//  3. Repeatedly the adjacent pair whose concatenation is a piece (any
//     type) with the highest score is merged, leftmost on ties, until none
//     is left (a heap: O(n log n) in the run's characters).
//  4. A symbol that is a piece is that token; any other (a character the
//     vocabulary lacks, invalid UTF-8) becomes one byte token per byte:
//     "<0xNN>", else the piece of that single byte; InvalidArgument naming
//     the byte and its offset when neither exists.
// Optional BOS first and EOS last.
//
// Decode: normal pieces with "▁" back to spaces, byte tokens as their byte,
// every other token as its text; with add_space_prefix the leading space of
// the first token (the one after a leading BOS) is dropped. The result need
// not be valid UTF-8 (byte tokens): SanitizeUtf8 it for display.
// Decode(Encode(s)) == s when add_space_prefix is off, for valid UTF-8
// (an invalid lead byte right before a space takes part of its "▁", which
// then decodes as those bytes) that holds no "▁" of its own (it decodes as
// a space) and no "<0xNN>" merging could turn into a byte token.
//
// Thread safety: immutable after Create/FromGguf; share it freely.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvcache/status.h"
#include "model/tokenizer/vocab_base.h"

namespace kvcache::model {

// Everything a SentencePiece tokenizer is built from (the GGUF keys):
// VocabBase's, and
struct SpmVocab : VocabBase {
  std::vector<float> scores;      // [vocab] tokenizer.ggml.scores; empty: all 0
  bool add_space_prefix = false;  // tokenizer.ggml.add_space_prefix
};

// (bos_id, eos_id, add_bos, chat_template: VocabSpecials'; from a GGUF
// file: GgufTokenizer::FromGguf)
class SpmTokenizer : public VocabSpecials {
 public:
  // Validates and indexes `vocab`. Corruption (naming the id) for an empty
  // or repeated piece, a byte token that is not "<0xNN>", scores or
  // token_types of the wrong length, or a BOS/EOS id outside the
  // vocabulary; InvalidArgument for an empty vocabulary.
  static Result<SpmTokenizer> Create(SpmVocab vocab);

  uint32_t vocab_size() const { return static_cast<uint32_t>(pieces_.size()); }
  bool add_space_prefix() const { return add_space_prefix_; }
  // REQUIRES 0 <= id < vocab_size().
  const std::string& piece(int32_t id) const { return pieces_[id]; }
  float score(int32_t id) const { return scores_[id]; }
  int32_t token_type(int32_t id) const { return types_[id]; }
  // True for control, user-defined and unknown tokens (false outside the vocabulary).
  bool is_special(int32_t id) const;
  // The id of the control/user-defined/unknown token with exactly this
  // text; NotFound otherwise.
  Result<int32_t> SpecialId(std::string_view text) const;
  // The id of the piece with exactly this text (any type); -1 when none.
  int32_t Find(std::string_view text) const;

  // InvalidArgument for text longer than kMaxTextBytes, a missing BOS/EOS
  // asked for, or a byte without a token (naming it and its offset).
  static constexpr size_t kMaxTextBytes = size_t{1} << 29;
  Result<std::vector<int32_t>> Encode(std::string_view text,
                                      const TextEncodeOptions& options = {}) const;
  // The bytes of token `id` (no prefix-space handling); InvalidArgument
  // outside the vocabulary.
  Result<std::string> DecodeToken(int32_t id) const;
  // The bytes of a whole sequence; InvalidArgument naming the position of
  // the first id outside the vocabulary (and nothing decoded).
  Result<std::string> Decode(std::span<const int32_t> ids) const;

 private:
  SpmTokenizer() = default;
  struct Scratch;  // per-Encode buffers, reused across runs of plain text
  Status IndexPieces();
  void IndexSpecials();
  // Appends the tokens of one run of plain text (step 2 to 4); `offset` is
  // where it starts in the caller's text (for errors).
  Status EncodeRun(std::string_view run, bool space_prefix, size_t offset, Scratch* scratch,
                   std::vector<int32_t>* out) const;
  // The special tokens cut out of `text` (step 1), as (offset, id) in text order.
  std::vector<std::pair<size_t, int32_t>> CutSpecials(std::string_view text,
                                                      bool parse_special) const;

  std::vector<std::string> pieces_;  // [vocab]
  std::vector<float> scores_;        // [vocab]
  std::vector<int32_t> types_;       // [vocab]
  // Piece -> id: open addressing on the piece text (linear probing,
  // power-of-two size, at most half full), -1 where free.
  std::vector<int32_t> slots_;
  std::array<int32_t, 256> byte_token_{};  // token of each byte, -1 when none
  // The special tokens as a byte trie (node 0 the root): each node's
  // children as (byte, node) pairs and the token ending there (-1 none).
  struct TrieNode {
    std::vector<std::pair<uint8_t, int32_t>> children;
    int32_t token = -1;
  };
  std::vector<TrieNode> trie_;
  std::vector<int32_t> special_rank_;  // [vocab] cutting order (0 first); -1 not special
  std::vector<int32_t> specials_;      // the special tokens in cutting order
  bool add_space_prefix_ = false;
};

}  // namespace kvcache::model
