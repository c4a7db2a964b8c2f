// SentencePiece-style BPE: indexing the pieces, cutting out special tokens,
// merging by score, decode. See spm_tokenizer.h for the contract.
#include "model/tokenizer/spm_tokenizer.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <functional>

namespace kvcache::model {
namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// The length of the character a byte starts, by its high four bits alone
// (continuation bytes and 0xF8..0xFF included), as llama.cpp splits.
size_t LeadLength(uint8_t b) {
  switch (b >> 4) {
    case 0xC:
    case 0xD:
      return 2;
    case 0xE:
      return 3;
    case 0xF:
      return 4;
    default:
      return 1;
  }
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// The byte a "<0xNN>" piece stands for; -1 for any other text.
int BytePieceValue(std::string_view piece) {
  if (piece.size() != 6 || !piece.starts_with("<0x") || piece[5] != '>') return -1;
  const int hi = HexValue(piece[3]);
  const int lo = HexValue(piece[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

std::string HexByte(uint8_t b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02X", b);
  return buf;
}

size_t HashPiece(std::string_view s) { return std::hash<std::string_view>{}(s); }

}  // namespace

Result<SpmTokenizer> SpmTokenizer::Create(SpmVocab vocab) {
  const size_t n = vocab.tokens.size();
  if (n == 0) return Status::InvalidArgument("SentencePiece vocabulary is empty");
  if (n > static_cast<size_t>(INT32_MAX) / 4) {
    return Status::InvalidArgument("SentencePiece vocabulary has over 2^29 pieces");
  }
  if (!vocab.scores.empty() && vocab.scores.size() != n) {
    return Status::Corruption("SentencePiece scores has " + std::to_string(vocab.scores.size()) +
                              " entries for " + std::to_string(n) + " tokens");
  }
  if (!vocab.token_types.empty() && vocab.token_types.size() != n) {
    return Status::Corruption("SentencePiece token_type has " +
                              std::to_string(vocab.token_types.size()) + " entries for " +
                              std::to_string(n) + " tokens");
  }
  SpmTokenizer t;
  KV_RETURN_IF_ERROR(t.TakeSpecials(vocab, "SentencePiece"));
  t.pieces_ = std::move(vocab.tokens);
  t.scores_ = vocab.scores.empty() ? std::vector<float>(n, 0.0f) : std::move(vocab.scores);
  t.types_ = vocab.token_types.empty() ? std::vector<int32_t>(n, kTokenTypeNormal)
                                       : std::move(vocab.token_types);
  KV_RETURN_IF_ERROR(t.IndexPieces());
  t.IndexSpecials();
  t.add_space_prefix_ = vocab.add_space_prefix;
  return t;
}

Status SpmTokenizer::IndexPieces() {
  const size_t n = pieces_.size();
  size_t slots = 16;
  while (slots < 2 * n) slots *= 2;
  slots_.assign(slots, -1);
  for (size_t id = 0; id < n; ++id) {
    const std::string& p = pieces_[id];
    if (p.empty()) {
      return Status::Corruption("SentencePiece token " + std::to_string(id) + " is empty");
    }
    if (types_[id] == kTokenTypeByte && BytePieceValue(p) < 0) {
      return Status::Corruption("SentencePiece byte token " + std::to_string(id) +
                                " is not of the form <0xNN>");
    }
    for (size_t i = HashPiece(p) & (slots - 1);; i = (i + 1) & (slots - 1)) {
      if (slots_[i] < 0) {
        slots_[i] = static_cast<int32_t>(id);
        break;
      }
      if (pieces_[slots_[i]] == p) {
        return Status::Corruption("SentencePiece token " + std::to_string(id) +
                                  " repeats the text of token " + std::to_string(slots_[i]));
      }
    }
  }
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    int32_t id = Find(hex);
    if (id < 0) id = Find(std::string(1, static_cast<char>(b)));
    byte_token_[b] = id;
  }
  return Status::Ok();
}

int32_t SpmTokenizer::Find(std::string_view text) const {
  const size_t mask = slots_.size() - 1;
  for (size_t i = HashPiece(text) & mask;; i = (i + 1) & mask) {
    const int32_t id = slots_[i];
    if (id < 0 || pieces_[id] == text) return id;
  }
}

bool SpmTokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<uint32_t>(id) < vocab_size() && special_rank_[id] >= 0;
}

void SpmTokenizer::IndexSpecials() {
  std::vector<int32_t> specials;
  for (size_t id = 0; id < pieces_.size(); ++id) {
    const int32_t type = types_[id];
    if (type == kTokenTypeControl || type == kTokenTypeUserDefined || type == kTokenTypeUnknown) {
      specials.push_back(static_cast<int32_t>(id));
    }
  }
  std::stable_sort(specials.begin(), specials.end(), [&](int32_t a, int32_t b) {
    return pieces_[a].size() > pieces_[b].size();
  });
  special_rank_.assign(pieces_.size(), -1);
  specials_ = specials;
  trie_.assign(1, TrieNode{});
  for (size_t rank = 0; rank < specials.size(); ++rank) {
    const int32_t id = specials[rank];
    special_rank_[id] = static_cast<int32_t>(rank);
    int32_t node = 0;
    for (char c : pieces_[id]) {
      const uint8_t b = static_cast<uint8_t>(c);
      int32_t next = -1;
      for (auto [byte, child] : trie_[node].children) {
        if (byte == b) next = child;
      }
      if (next < 0) {
        next = static_cast<int32_t>(trie_.size());
        trie_[node].children.emplace_back(b, next);
        trie_.emplace_back();
      }
      node = next;
    }
    trie_[node].token = id;
  }
}

Result<int32_t> SpmTokenizer::SpecialId(std::string_view text) const {
  const int32_t id = Find(text);
  if (id >= 0 && special_rank_[id] >= 0) return id;
  return Status::NotFound("no special token '" + std::string(text) + "'");
}

std::vector<std::pair<size_t, int32_t>> SpmTokenizer::CutSpecials(std::string_view text,
                                                                  bool parse_special) const {
  // Which allowed special tokens occur at all: one pass over the trie.
  std::vector<bool> occurs(specials_.size(), false);
  bool any = false;
  for (size_t pos = 0; pos < text.size(); ++pos) {
    int32_t node = 0;
    for (size_t k = pos; k < text.size(); ++k) {
      const uint8_t b = static_cast<uint8_t>(text[k]);
      int32_t next = -1;
      for (auto [byte, child] : trie_[node].children) {
        if (byte == b) {
          next = child;
          break;
        }
      }
      if (next < 0) break;
      node = next;
      const int32_t id = trie_[node].token;
      if (id >= 0 && (parse_special || types_[id] == kTokenTypeUserDefined)) {
        occurs[special_rank_[id]] = true;
        any = true;
      }
    }
  }
  std::vector<std::pair<size_t, int32_t>> cuts;
  if (!any) return cuts;
  // Those tokens in cutting order, each out of every uncut span of the
  // text at each find() hit from its left (memory: the spans and the cuts).
  std::vector<std::pair<size_t, size_t>> spans = {{0, text.size()}}, next;
  for (size_t rank = 0; rank < specials_.size(); ++rank) {
    if (!occurs[rank]) continue;
    const int32_t id = specials_[rank];
    const std::string& piece = pieces_[id];
    next.clear();
    for (auto [begin, end] : spans) {
      const std::string_view span = text.substr(0, end);
      size_t from = begin;
      for (size_t hit; (hit = span.find(piece, from)) != std::string_view::npos;
           from = hit + piece.size()) {
        if (hit > from) next.emplace_back(from, hit);
        cuts.emplace_back(hit, id);
      }
      if (from < end) next.emplace_back(from, end);
    }
    spans.swap(next);
  }
  std::sort(cuts.begin(), cuts.end());
  return cuts;
}

struct SpmTokenizer::Scratch {
  struct Symbol {
    uint32_t begin;  // byte offset in `text`
    uint32_t n;      // its length in bytes; 0 once merged into its left neighbour
    int32_t prev;
    int32_t next;  // -1 at the ends
  };
  struct Bigram {
    float score;
    int32_t left;
    int32_t right;
    uint32_t size;  // bytes of the pair when pushed (stale once either side grew)
    // The heap's order: the highest score on top, then the leftmost.
    bool operator<(const Bigram& o) const {
      return score < o.score || (score == o.score && left > o.left);
    }
  };
  std::string text;  // the run, spaces as U+2581
  std::vector<Symbol> sym;
  std::vector<Bigram> heap;
};

Status SpmTokenizer::EncodeRun(std::string_view run, bool space_prefix, size_t offset,
                               Scratch* scratch, std::vector<int32_t>* out) const {
  using Bigram = Scratch::Bigram;
  std::string& text = scratch->text;
  text.clear();
  if (space_prefix) text += kSpaceMark;
  for (char c : run) {
    if (c == ' ') {
      text += kSpaceMark;
    } else {
      text.push_back(c);
    }
  }
  auto& sym = scratch->sym;
  sym.clear();
  for (size_t pos = 0; pos < text.size();) {
    const size_t len = std::min(LeadLength(static_cast<uint8_t>(text[pos])), text.size() - pos);
    const int32_t index = static_cast<int32_t>(sym.size());
    sym.push_back({static_cast<uint32_t>(pos), static_cast<uint32_t>(len), index - 1,
                   pos + len == text.size() ? -1 : index + 1});
    pos += len;
  }
  auto& heap = scratch->heap;
  heap.clear();
  auto try_pair = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const uint32_t size = sym[left].n + sym[right].n;
    const int32_t id = Find(std::string_view(text).substr(sym[left].begin, size));
    if (id < 0) return;
    heap.push_back({scores_[id], left, right, size});
    std::push_heap(heap.begin(), heap.end());
  };
  for (size_t i = 1; i < sym.size(); ++i) {
    try_pair(static_cast<int32_t>(i) - 1, static_cast<int32_t>(i));
  }
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const Bigram b = heap.back();
    heap.pop_back();
    Scratch::Symbol& l = sym[b.left];
    Scratch::Symbol& r = sym[b.right];
    if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;  // stale
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = b.left;
    try_pair(l.prev, b.left);
    try_pair(b.left, l.next);
  }
  for (int32_t i = sym.empty() ? -1 : 0; i >= 0; i = sym[i].next) {
    const std::string_view s = std::string_view(text).substr(sym[i].begin, sym[i].n);
    const int32_t id = Find(s);
    if (id >= 0) {
      out->push_back(id);
      continue;
    }
    for (size_t k = 0; k < s.size(); ++k) {
      const uint8_t byte = static_cast<uint8_t>(s[k]);
      if (byte_token_[byte] >= 0) {
        out->push_back(byte_token_[byte]);
        continue;
      }
      // The offset in the caller's text: undo the prefix and the
      // three-byte space marks before this byte.
      const size_t at = sym[i].begin + k;
      size_t escaped = space_prefix ? kSpaceMark.size() : 0, original = 0;
      while (escaped < at && original < run.size()) {
        escaped += run[original] == ' ' ? kSpaceMark.size() : 1;
        ++original;
      }
      return Status::InvalidArgument("SentencePiece cannot encode byte " + HexByte(byte) +
                                     " at offset " + std::to_string(offset + original) +
                                     ": the vocabulary has no token for it");
    }
  }
  return Status::Ok();
}

Result<std::vector<int32_t>> SpmTokenizer::Encode(std::string_view text,
                                                  const TextEncodeOptions& options) const {
  KV_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                      BeginIds("SentencePiece", text.size(), kMaxTextBytes, options));
  Scratch scratch;
  size_t begin = 0;
  bool after_special = true;  // the text's start counts as one
  for (auto [pos, id] : CutSpecials(text, options.parse_special)) {
    if (pos > begin) {
      KV_RETURN_IF_ERROR(EncodeRun(text.substr(begin, pos - begin),
                                   add_space_prefix_ && after_special, begin, &scratch, &ids));
    }
    ids.push_back(id);
    after_special = true;
    begin = pos + pieces_[id].size();
  }
  if (begin < text.size()) {
    KV_RETURN_IF_ERROR(
        EncodeRun(text.substr(begin), add_space_prefix_ && after_special, begin, &scratch, &ids));
  }
  if (options.eos) ids.push_back(eos_id_);
  return ids;
}

Result<std::string> SpmTokenizer::DecodeToken(int32_t id) const {
  KV_RETURN_IF_ERROR(CheckId(id, vocab_size()));
  const std::string& p = pieces_[id];
  if (types_[id] == kTokenTypeByte) return std::string(1, static_cast<char>(BytePieceValue(p)));
  if (types_[id] != kTokenTypeNormal) return p;
  std::string out;
  out.reserve(p.size());
  for (size_t pos = 0; pos < p.size();) {
    if (std::string_view(p).substr(pos).starts_with(kSpaceMark)) {
      out.push_back(' ');
      pos += kSpaceMark.size();
    } else {
      out.push_back(p[pos++]);
    }
  }
  return out;
}

Result<std::string> SpmTokenizer::Decode(std::span<const int32_t> ids) const {
  std::string out;
  const size_t first = !ids.empty() && ids[0] == bos_id_ ? 1 : 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    KV_RETURN_IF_ERROR(CheckId(ids[i], vocab_size(), i));
    KV_ASSIGN_OR_RETURN(const std::string piece, DecodeToken(ids[i]));
    std::string_view s = piece;
    if (add_space_prefix_ && i == first && types_[ids[i]] == kTokenTypeNormal &&
        s.starts_with(' ')) {
      s.remove_prefix(1);
    }
    out += s;
  }
  return out;
}

}  // namespace kvcache::model
