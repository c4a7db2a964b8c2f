// Byte-level BPE: the GPT-2 family tokenizer that GGUF files describe with
// tokenizer.ggml.model = "gpt2" (SmolLM2 and most current small models).
//
// Vocabulary: each ordinary token's text is its bytes written in GPT-2's
// byte-to-unicode alphabet (printable Latin-1 bytes stand for themselves,
// the other 68 bytes for U+0100..U+0143, so ' ' is 'Ġ', '\n' is 'Ċ'); tokens
// of type control (3) or user-defined (4) are literal text ("<|im_end|>")
// and are never produced by merging. Merges are "left right" pairs of token
// texts; the earlier a merge, the higher its priority (rank = index).
//
// Encode: optional BOS; with parse_special, every occurrence of a control or
// user-defined token's text is that token (leftmost, longest first); the
// text between is pre-tokenized and each chunk merged on its own bytes:
// start from one token per byte and repeatedly merge the adjacent pair of
// lowest rank (leftmost on ties) until no ranked pair is left, with a heap
// (O(n log n) in the chunk's bytes). Pre-tokenizers (tokenizer.ggml.pre):
//   "gpt2":   GPT-2's pattern
//             's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   "smollm": each \p{N} character split off on its own first (HF's
//             Digits(individual_digits)), then GPT-2's pattern on every
//             piece between them (llama.cpp's SMOLLM pre-type).
// Both are matched by hand over the classes of model/tokenizer/unicode_classes.h; an
// invalid UTF-8 byte counts as one character of class "other". A byte that
// has no token of its own (SmolLM2 lacks 21: 0x04, 0xC0, 0xF1, 0xF5..0xFF,
// ...) makes Encode fail with InvalidArgument naming it and its offset,
// where HF tokenizers and llama.cpp drop it silently.
//
// Decode: the concatenated bytes of the tokens (control tokens as their
// text); the result need not be valid UTF-8 (a token may end inside a
// character): SanitizeUtf8 it for display.
//
// Thread safety: immutable after Create/FromGguf; share it freely.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvcache/status.h"
#include "model/tokenizer/vocab_base.h"

namespace kvcache::model {

class GgufFile;

enum class PreTokenizer { kGpt2, kSmollm };

// Everything a byte-level BPE tokenizer is built from (the GGUF keys):
// VocabBase's, and
struct BpeVocab : VocabBase {
  std::vector<std::string> merges;  // [merges] tokenizer.ggml.merges, by rank
  std::string pre = "gpt2";         // tokenizer.ggml.pre
};

using BpeEncodeOptions = TextEncodeOptions;

// (bos_id, eos_id, add_bos, chat_template: VocabSpecials')
class BpeTokenizer : public VocabSpecials {
 public:
  // Validates and indexes `vocab`. Corruption (naming the id or merge index)
  // for an ordinary token outside the byte alphabet, a token_types list of
  // the wrong length, a merge that is not "left right" or whose parts or
  // result are not ordinary tokens, or a BOS/EOS id outside the vocabulary;
  // InvalidArgument for an empty vocabulary; Unimplemented for a `pre` other
  // than "gpt2" or "smollm".
  static Result<BpeTokenizer> Create(BpeVocab vocab);
  // Create from a GGUF file's tokenizer.* metadata: tokenizer.ggml.model
  // must be "gpt2" (Unimplemented otherwise); tokens, merges and pre are
  // required (NotFound naming the key), token_type, bos/eos_token_id,
  // add_bos_token and chat_template optional. Errors name the key.
  static Result<BpeTokenizer> FromGguf(const GgufFile& file);

  uint32_t vocab_size() const { return static_cast<uint32_t>(token_bytes_.size()); }
  PreTokenizer pre_tokenizer() const { return pre_; }
  // True for control and user-defined tokens (false outside the vocabulary).
  bool is_special(int32_t id) const {
    return id >= 0 && static_cast<uint32_t>(id) < vocab_size() && special_[id];
  }
  // The id of the control/user-defined token with exactly this text; NotFound otherwise.
  Result<int32_t> SpecialId(std::string_view text) const;

  // InvalidArgument for text longer than kMaxTextBytes or a byte without a
  // token (naming it and its offset); see the file comment.
  static constexpr size_t kMaxTextBytes = size_t{1} << 31;
  Result<std::vector<int32_t>> Encode(std::string_view text,
                                      const BpeEncodeOptions& options = {}) const;
  // The bytes of token `id`; InvalidArgument outside the vocabulary.
  Result<std::string> DecodeToken(int32_t id) const;
  // The bytes of a whole sequence; InvalidArgument naming the position of
  // the first id outside the vocabulary (and nothing decoded).
  Result<std::string> Decode(std::span<const int32_t> ids) const;

  // The pre-tokenizer's chunks of `text` (no special-token matching), as
  // views into `text`. REQUIRES text.size() <= kMaxTextBytes. For tests.
  static std::vector<std::string_view> PreTokenize(PreTokenizer pre, std::string_view text);

 private:
  BpeTokenizer() = default;
  // Merges in an open-addressing table (linear probing, power-of-two size,
  // at most half full): key PairKey(left, right), kEmptyKey where free.
  struct MergeSlot {
    uint64_t key;
    int32_t rank;
    int32_t result;
  };
  static constexpr uint64_t kEmptyKey = ~uint64_t{0};
  static uint64_t PairKey(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  struct Scratch;  // per-Encode buffers, reused across chunks
  // The slot of (left, right), or nullptr when they do not merge.
  const MergeSlot* FindMerge(int32_t left, int32_t right) const {
    const uint64_t key = PairKey(left, right);
    size_t i = static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> merge_shift_);
    for (;; i = (i + 1) & (merge_slots_.size() - 1)) {
      const MergeSlot& s = merge_slots_[i];
      if (s.key == key) return &s;
      if (s.key == kEmptyKey) return nullptr;
    }
  }
  bool InsertMerge(uint64_t key, int32_t rank, int32_t result);  // false if already there
  // Create's steps: the tokens' bytes and lookups (errors for a token
  // outside GPT-2's byte alphabet or an empty special token), the merge
  // table (errors for a malformed merge or one outside the vocabulary), and
  // the special tokens by first byte, longest first.
  Status AddTokens(const BpeVocab& vocab);
  Status AddMerges(const std::vector<std::string>& merges);
  void IndexSpecials();
  Status EncodeChunk(std::string_view chunk, size_t chunk_offset, Scratch* scratch,
                     std::vector<int32_t>* out) const;
  Status EncodePlain(std::string_view text, size_t offset, Scratch* scratch,
                     std::vector<int32_t>* out) const;

  std::vector<std::string> token_bytes_;                   // [vocab] raw bytes of each token
  std::vector<bool> special_;                              // [vocab]
  std::array<int32_t, 256> byte_token_{};                  // id of each single byte, -1 when none
  std::unordered_map<std::string, int32_t> ordinary_ids_;  // bytes -> lowest ordinary id
  std::vector<MergeSlot> merge_slots_;                     // [power of two >= 2 * merges]
  int merge_shift_ = 64;                                   // 64 - log2(merge_slots_.size())
  // Special tokens by their first byte, longest first (for leftmost-longest matching).
  std::array<std::vector<int32_t>, 256> specials_by_byte_;
  PreTokenizer pre_ = PreTokenizer::kGpt2;
};

}  // namespace kvcache::model
