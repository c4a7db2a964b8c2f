// Byte-level BPE: vocabulary indexing, the hand-written pre-tokenizer, heap
// merging, decode. See bpe_tokenizer.h for the contract.
#include "model/tokenizer/bpe_tokenizer.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <functional>

#include "model/tokenizer/unicode_classes.h"

namespace kvcache::model {
namespace {

// GPT-2's byte <-> unicode alphabet: bytes '!'..'~', 0xA1..0xAC, 0xAE..0xFF
// stand for themselves; the other 68 bytes, in increasing order, for
// U+0100, U+0101, ...
struct ByteAlphabet {
  std::array<char32_t, 256> byte_to_cp{};
  std::array<int16_t, 0x144> cp_to_byte{};  // -1 where no byte maps

  ByteAlphabet() {
    cp_to_byte.fill(-1);
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool self = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      byte_to_cp[b] = self ? static_cast<char32_t>(b) : next++;
      cp_to_byte[byte_to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteAlphabet& Alphabet() {
  static const ByteAlphabet alphabet;
  return alphabet;
}

// The raw bytes an ordinary token's text stands for; false when it holds a
// character outside the alphabet (or invalid UTF-8).
bool UnmapToken(std::string_view text, std::string* bytes) {
  const ByteAlphabet& a = Alphabet();
  bytes->clear();
  for (size_t pos = 0; pos < text.size();) {
    const Utf8Char c = DecodeUtf8(text, pos);
    if (!c.valid || c.cp >= a.cp_to_byte.size() || a.cp_to_byte[c.cp] < 0) return false;
    bytes->push_back(static_cast<char>(a.cp_to_byte[c.cp]));
    pos += c.bytes;
  }
  return true;
}

std::string Printable(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7F && c != '\\' && c != '\'') {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    }
  }
  return "'" + out + "'";
}

struct CharInfo {
  uint32_t offset;  // byte offset in the text
  uint8_t bytes;
  CharClass cls;
  char32_t cp;
};

bool IsContractionAt(const std::vector<CharInfo>& c, size_t i, size_t end, size_t* len) {
  // 's 't 're 've 'm 'll 'd (lower case only, as the pattern is written)
  if (c[i].cp != '\'' || i + 1 >= end) return false;
  const char32_t a = c[i + 1].cp;
  if (a == 's' || a == 't' || a == 'm' || a == 'd') {
    *len = 2;
    return true;
  }
  if (i + 2 < end) {
    const char32_t b = c[i + 2].cp;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
      *len = 3;
      return true;
    }
  }
  return false;
}

// GPT-2's pattern over characters [begin, end) (a lookahead never sees
// past `end`), appending [first, last) character index pairs.
void SplitGpt2(const std::vector<CharInfo>& c, size_t begin, size_t end,
               std::vector<std::pair<size_t, size_t>>* out) {
  size_t i = begin;
  while (i < end) {
    size_t len = 0;
    if (IsContractionAt(c, i, end, &len)) {
      out->emplace_back(i, i + len);
      i += len;
      continue;
    }
    // " ?X+" for X in letters, numbers, other: an optional ' ' then a run.
    const size_t k =
        (c[i].cp == ' ' && i + 1 < end && c[i + 1].cls != CharClass::kSpace) ? i + 1 : i;
    const CharClass cls = c[k].cls;
    if (cls != CharClass::kSpace) {
      size_t j = k + 1;
      while (j < end && c[j].cls == cls) ++j;
      out->emplace_back(i, j);
      i = j;
      continue;
    }
    // \s+(?!\S) then \s+: a whitespace run, less its last character when a
    // non-space follows and the run is longer than one.
    size_t r = i + 1;
    while (r < end && c[r].cls == CharClass::kSpace) ++r;
    const size_t stop = (r < end && r - i >= 2) ? r - 1 : r;
    out->emplace_back(i, stop);
    i = stop;
  }
}

}  // namespace

std::vector<std::string_view> BpeTokenizer::PreTokenize(PreTokenizer pre, std::string_view text) {
  std::vector<CharInfo> chars;
  chars.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const Utf8Char u = DecodeUtf8(text, pos);
    chars.push_back({static_cast<uint32_t>(pos), u.bytes,
                     u.valid ? ClassOf(u.cp) : CharClass::kOther, u.valid ? u.cp : 0xFFFFFFFFu});
    pos += u.bytes;
  }
  std::vector<std::pair<size_t, size_t>> spans;
  if (pre == PreTokenizer::kSmollm) {
    size_t begin = 0;
    for (size_t i = 0; i < chars.size(); ++i) {
      if (chars[i].cls != CharClass::kNumber) continue;
      SplitGpt2(chars, begin, i, &spans);
      spans.emplace_back(i, i + 1);
      begin = i + 1;
    }
    SplitGpt2(chars, begin, chars.size(), &spans);
  } else {
    SplitGpt2(chars, 0, chars.size(), &spans);
  }
  std::vector<std::string_view> out;
  out.reserve(spans.size());
  for (auto [first, last] : spans) {
    const size_t b = chars[first].offset;
    const size_t e = chars[last - 1].offset + chars[last - 1].bytes;
    out.push_back(text.substr(b, e - b));
  }
  return out;
}

Result<BpeTokenizer> BpeTokenizer::Create(BpeVocab vocab) {
  const size_t n = vocab.tokens.size();
  if (n == 0) return Status::InvalidArgument("BPE vocabulary is empty");
  if (n > static_cast<size_t>(INT32_MAX) || vocab.merges.size() > static_cast<size_t>(INT32_MAX)) {
    return Status::InvalidArgument("BPE vocabulary or merge list has over 2^31 entries");
  }
  if (!vocab.token_types.empty() && vocab.token_types.size() != n) {
    return Status::Corruption("BPE token_type has " + std::to_string(vocab.token_types.size()) +
                              " entries for " + std::to_string(n) + " tokens");
  }
  BpeTokenizer t;
  if (vocab.pre == "gpt2") {
    t.pre_ = PreTokenizer::kGpt2;
  } else if (vocab.pre == "smollm") {
    t.pre_ = PreTokenizer::kSmollm;
  } else {
    return Status::Unimplemented("BPE pre-tokenizer '" + vocab.pre +
                                 "' is not supported (supported: gpt2, smollm)");
  }
  KV_RETURN_IF_ERROR(t.TakeSpecials(vocab, "BPE"));
  KV_RETURN_IF_ERROR(t.AddTokens(vocab));
  KV_RETURN_IF_ERROR(t.AddMerges(vocab.merges));
  t.IndexSpecials();
  return t;
}

Status BpeTokenizer::AddTokens(const BpeVocab& vocab) {
  const size_t n = vocab.tokens.size();
  token_bytes_.resize(n);
  special_.assign(n, false);
  byte_token_.fill(-1);
  ordinary_ids_.reserve(n);
  for (size_t id = 0; id < n; ++id) {
    const int32_t type = vocab.token_types.empty() ? kTokenTypeNormal : vocab.token_types[id];
    if (type == kTokenTypeControl || type == kTokenTypeUserDefined) {
      if (vocab.tokens[id].empty()) {
        return Status::Corruption("BPE special token " + std::to_string(id) + " is empty");
      }
      special_[id] = true;
      token_bytes_[id] = vocab.tokens[id];
      continue;
    }
    if (!UnmapToken(vocab.tokens[id], &token_bytes_[id]) || token_bytes_[id].empty()) {
      return Status::Corruption("BPE token " + std::to_string(id) + " " +
                                Printable(vocab.tokens[id]) + " is not in GPT-2's byte alphabet");
    }
    const int32_t id32 = static_cast<int32_t>(id);
    ordinary_ids_.emplace(token_bytes_[id], id32);  // keeps the lowest id
    if (token_bytes_[id].size() == 1) {
      auto& slot = byte_token_[static_cast<uint8_t>(token_bytes_[id][0])];
      if (slot < 0) slot = id32;
    }
  }
  return Status::Ok();
}

Status BpeTokenizer::AddMerges(const std::vector<std::string>& merges) {
  size_t slots = 16;
  while (slots < 2 * merges.size()) slots *= 2;
  merge_slots_.assign(slots, MergeSlot{kEmptyKey, 0, 0});
  merge_shift_ = 64 - std::countr_zero(slots);
  std::string left_bytes, right_bytes;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const std::string& m = merges[rank];
    const size_t sp = m.find(' ');
    auto bad = [&](const std::string& why) {
      return Status::Corruption("BPE merge " + std::to_string(rank) + " " + Printable(m) + " " +
                                why);
    };
    if (sp == std::string::npos || sp == 0 || sp + 1 == m.size() ||
        m.find(' ', sp + 1) != std::string::npos) {
      return bad("is not two tokens separated by one space");
    }
    if (!UnmapToken(std::string_view(m).substr(0, sp), &left_bytes) ||
        !UnmapToken(std::string_view(m).substr(sp + 1), &right_bytes)) {
      return bad("is not in GPT-2's byte alphabet");
    }
    auto l = ordinary_ids_.find(left_bytes);
    auto r = ordinary_ids_.find(right_bytes);
    auto res = ordinary_ids_.find(left_bytes + right_bytes);
    if (l == ordinary_ids_.end() || r == ordinary_ids_.end())
      return bad("joins a token not in the vocabulary");
    if (res == ordinary_ids_.end()) return bad("makes a token not in the vocabulary");
    InsertMerge(PairKey(l->second, r->second), static_cast<int32_t>(rank),
                res->second);  // a repeated pair keeps its first rank
  }
  return Status::Ok();
}

void BpeTokenizer::IndexSpecials() {
  for (size_t id = 0; id < token_bytes_.size(); ++id) {
    if (special_[id]) {
      specials_by_byte_[static_cast<uint8_t>(token_bytes_[id][0])].push_back(
          static_cast<int32_t>(id));
    }
  }
  for (auto& list : specials_by_byte_) {
    std::stable_sort(list.begin(), list.end(), [&](int32_t a, int32_t b) {
      return token_bytes_[a].size() > token_bytes_[b].size();
    });
  }
}

bool BpeTokenizer::InsertMerge(uint64_t key, int32_t rank, int32_t result) {
  size_t i = static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> merge_shift_);
  for (;; i = (i + 1) & (merge_slots_.size() - 1)) {
    MergeSlot& s = merge_slots_[i];
    if (s.key == key) return false;
    if (s.key == kEmptyKey) {
      s = {key, rank, result};
      return true;
    }
  }
}

Result<int32_t> BpeTokenizer::SpecialId(std::string_view text) const {
  if (!text.empty()) {
    for (int32_t id : specials_by_byte_[static_cast<uint8_t>(text[0])]) {
      if (token_bytes_[id] == text) return id;
    }
  }
  return Status::NotFound("no special token " + Printable(text));
}

struct BpeTokenizer::Scratch {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;  // -1 at the ends; id -1 once merged into its left neighbour
  };
  struct Candidate {
    int32_t rank;
    int32_t left;  // symbol index (= byte offset of its first byte)
    int32_t left_id;
    int32_t right_id;
    int32_t result;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::vector<Symbol> sym;
  std::vector<Candidate> heap;  // a min-heap by (rank, left)
};

Status BpeTokenizer::EncodeChunk(std::string_view chunk, size_t chunk_offset, Scratch* scratch,
                                 std::vector<int32_t>* out) const {
  using Candidate = Scratch::Candidate;
  const size_t n = chunk.size();
  auto& sym = scratch->sym;
  sym.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = byte_token_[static_cast<uint8_t>(chunk[i])];
    if (id < 0) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "0x%02X", static_cast<uint8_t>(chunk[i]));
      return Status::InvalidArgument(std::string("BPE cannot encode byte ") + buf + " at offset " +
                                     std::to_string(chunk_offset + i) +
                                     ": the vocabulary has no token for it");
    }
    sym[i] = {id, static_cast<int32_t>(i) - 1, i + 1 < n ? static_cast<int32_t>(i) + 1 : -1};
  }
  if (n == 1) {
    out->push_back(sym[0].id);
    return Status::Ok();
  }
  auto& heap = scratch->heap;
  heap.clear();
  const auto later = std::greater<Candidate>();
  auto push = [&](int32_t left) {
    const int32_t right = sym[left].next;
    if (right < 0) return;
    const MergeSlot* m = FindMerge(sym[left].id, sym[right].id);
    if (m == nullptr) return;
    heap.push_back({m->rank, left, sym[left].id, sym[right].id, m->result});
    std::push_heap(heap.begin(), heap.end(), later);
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Candidate c = heap.back();
    heap.pop_back();
    Scratch::Symbol& l = sym[c.left];
    if (l.id != c.left_id || l.next < 0 || sym[l.next].id != c.right_id) continue;  // stale
    const int32_t right = l.next;
    l.id = c.result;
    l.next = sym[right].next;
    if (l.next >= 0) sym[l.next].prev = c.left;
    sym[right].id = -1;
    if (l.prev >= 0) push(l.prev);
    push(c.left);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) out->push_back(sym[i].id);
  return Status::Ok();
}

Status BpeTokenizer::EncodePlain(std::string_view text, size_t offset, Scratch* scratch,
                                 std::vector<int32_t>* out) const {
  for (std::string_view chunk : PreTokenize(pre_, text)) {
    KV_RETURN_IF_ERROR(
        EncodeChunk(chunk, offset + static_cast<size_t>(chunk.data() - text.data()), scratch, out));
  }
  return Status::Ok();
}

Result<std::vector<int32_t>> BpeTokenizer::Encode(std::string_view text,
                                                  const BpeEncodeOptions& options) const {
  KV_ASSIGN_OR_RETURN(std::vector<int32_t> ids, BeginIds("BPE", text.size(), kMaxTextBytes, options));
  Scratch scratch;
  size_t plain_begin = 0;
  if (options.parse_special) {
    for (size_t pos = 0; pos < text.size();) {
      int32_t match = -1;
      for (int32_t id : specials_by_byte_[static_cast<uint8_t>(text[pos])]) {
        if (text.substr(pos).starts_with(token_bytes_[id])) {
          match = id;  // the list is longest first
          break;
        }
      }
      if (match < 0) {
        ++pos;
        continue;
      }
      KV_RETURN_IF_ERROR(
          EncodePlain(text.substr(plain_begin, pos - plain_begin), plain_begin, &scratch, &ids));
      ids.push_back(match);
      pos += token_bytes_[match].size();
      plain_begin = pos;
    }
  }
  KV_RETURN_IF_ERROR(EncodePlain(text.substr(plain_begin), plain_begin, &scratch, &ids));
  if (options.eos) ids.push_back(eos_id_);
  return ids;
}

Result<std::string> BpeTokenizer::DecodeToken(int32_t id) const {
  KV_RETURN_IF_ERROR(CheckId(id, vocab_size()));
  return token_bytes_[id];
}

Result<std::string> BpeTokenizer::Decode(std::span<const int32_t> ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    KV_RETURN_IF_ERROR(CheckId(ids[i], vocab_size(), i));
    out += token_bytes_[ids[i]];
  }
  return out;
}

}  // namespace kvcache::model
