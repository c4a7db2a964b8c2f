// llama2.c tokenizer: parsing, BPE-style encode by score, decode.
#include "model/tokenizer/tokenizer.h"

#include <cstring>

#include "model/io/checkpoint.h"

namespace kvcache::model {
namespace {

constexpr uint32_t kByteFallbackBase = 3;  // <0x00> is token 3
constexpr uint32_t kMaxTokenLength = 1 << 16;

}  // namespace

Result<Tokenizer> Tokenizer::Parse(std::span<const uint8_t> bytes, uint32_t vocab_size) {
  if (vocab_size < kByteFallbackBase + 256) {
    return Status::InvalidArgument("tokenizer vocab_size " + std::to_string(vocab_size) +
                                   " is too small for byte fallback (needs >= 259)");
  }
  size_t off = 0;
  auto read = [&](void* dst, size_t n) {
    if (bytes.size() - off < n) return false;
    std::memcpy(dst, bytes.data() + off, n);
    off += n;
    return true;
  };
  Tokenizer t;
  int32_t max_len;
  if (!read(&max_len, 4)) return Status::Corruption("tokenizer truncated: no header");
  if (max_len <= 0 || static_cast<uint32_t>(max_len) > kMaxTokenLength) {
    return Status::Corruption("tokenizer max_token_length " + std::to_string(max_len) +
                              " is out of range");
  }
  t.max_token_length_ = max_len;
  t.pieces_.reserve(vocab_size);
  t.scores_.reserve(vocab_size);
  for (uint32_t i = 0; i < vocab_size; ++i) {
    float score;
    int32_t len;
    if (!read(&score, 4) || !read(&len, 4)) {
      return Status::Corruption("tokenizer truncated at token " + std::to_string(i) + " of " +
                                std::to_string(vocab_size));
    }
    if (len < 0 || static_cast<uint32_t>(len) > t.max_token_length_) {
      return Status::Corruption("tokenizer token " + std::to_string(i) + " has length " +
                                std::to_string(len) + " (max_token_length " +
                                std::to_string(max_len) + ")");
    }
    std::string piece(static_cast<size_t>(len), '\0');
    if (!read(piece.data(), piece.size())) {
      return Status::Corruption("tokenizer truncated inside token " + std::to_string(i));
    }
    t.pieces_.push_back(std::move(piece));
    t.scores_.push_back(score);
  }
  if (off != bytes.size()) {
    return Status::Corruption("tokenizer has " + std::to_string(bytes.size() - off) +
                              " trailing bytes after " + std::to_string(vocab_size) +
                              " tokens: vocab size mismatch?");
  }
  for (uint32_t i = 0; i < vocab_size; ++i) t.ids_.emplace(t.pieces_[i], static_cast<int32_t>(i));
  for (uint32_t b = 0; b < 256; ++b) {
    char want[8];
    std::snprintf(want, sizeof want, "<0x%02X>", b);
    if (t.pieces_[kByteFallbackBase + b] != want) {
      return Status::Corruption("tokenizer token " + std::to_string(kByteFallbackBase + b) +
                                " is not the byte fallback " + want);
    }
  }
  return t;
}

Result<Tokenizer> Tokenizer::Load(const std::string& path, uint32_t vocab_size) {
  KV_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFileBytes(path));
  auto t = Parse(bytes, vocab_size);
  if (!t.ok()) return Status(t.status().code(), path + ": " + t.status().message());
  return t;
}

int32_t Tokenizer::Lookup(std::string_view s) const {
  auto it = ids_.find(std::string(s));
  return it == ids_.end() ? -1 : it->second;
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, const EncodeOptions& options) const {
  std::vector<int32_t> tokens;
  if (options.bos) tokens.push_back(kBosToken);
  std::vector<int32_t> work;  // the tokens being merged
  if (!text.empty()) {
    const int32_t space = Lookup(" ");
    if (space >= 0) work.push_back(space);
  }
  // One token per UTF-8 code point (a lead byte and up to 3 continuation
  // bytes), or its bytes as fallback tokens.
  size_t i = 0;
  while (i < text.size()) {
    size_t j = i + 1;
    while (j < text.size() && j - i < 4 &&
           (static_cast<uint8_t>(text[j]) & 0xC0) == 0x80) {
      ++j;
    }
    const int32_t id = Lookup(text.substr(i, j - i));
    if (id >= 0) {
      work.push_back(id);
    } else {
      for (size_t k = i; k < j; ++k) {
        work.push_back(static_cast<int32_t>(kByteFallbackBase + static_cast<uint8_t>(text[k])));
      }
    }
    i = j;
  }
  // Greedy merging: the best-scoring adjacent pair first, leftmost on ties.
  std::string pair;
  while (true) {
    float best_score = 0;
    int32_t best_id = -1;
    size_t best_idx = 0;
    for (size_t k = 0; k + 1 < work.size(); ++k) {
      pair = pieces_[work[k]];
      pair += pieces_[work[k + 1]];
      const int32_t id = Lookup(pair);
      if (id >= 0 && (best_id < 0 || scores_[id] > best_score)) {
        best_score = scores_[id];
        best_id = id;
        best_idx = k;
      }
    }
    if (best_id < 0) break;
    work[best_idx] = best_id;
    work.erase(work.begin() + static_cast<std::ptrdiff_t>(best_idx) + 1);
  }
  tokens.insert(tokens.end(), work.begin(), work.end());
  if (options.eos) tokens.push_back(kEosToken);
  return tokens;
}

Result<std::string> Tokenizer::DecodeToken(int32_t prev, int32_t id) const {
  if (id < 0 || static_cast<uint32_t>(id) >= pieces_.size()) {
    return Status::InvalidArgument("token id " + std::to_string(id) + " is outside the vocabulary");
  }
  if (id == kBosToken || id == kEosToken) return std::string();
  if (static_cast<uint32_t>(id) >= kByteFallbackBase &&
      static_cast<uint32_t>(id) < kByteFallbackBase + 256) {
    return std::string(1, static_cast<char>(id - kByteFallbackBase));
  }
  std::string_view piece = pieces_[id];
  if (prev == kBosToken && !piece.empty() && piece[0] == ' ') piece.remove_prefix(1);
  return std::string(piece);
}

Result<std::string> Tokenizer::Decode(std::span<const int32_t> ids) const {
  std::string out;
  int32_t prev = kBosToken;
  for (int32_t id : ids) {
    KV_ASSIGN_OR_RETURN(std::string s, DecodeToken(prev, id));
    out += s;
    prev = id;
  }
  return out;
}

}  // namespace kvcache::model
