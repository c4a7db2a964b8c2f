// Fuzz target `bpe`: the byte-level BPE tokenizer (model/tokenizer/bpe_tokenizer.cc)
// encoding and decoding arbitrary bytes, and the ChatML template
// (model/tokenizer/chat_template.cc) on outside text.
//
// The tokenizers are built once, through BpeTokenizer::Create, from a
// vocabulary the harness trains itself: the 256 byte tokens, four special
// tokens (three control, one user-defined) and 320 merges learnt by naive
// BPE training over a fixed text (English, code, French, German, Greek,
// Chinese, emoji: merges inside multi-byte characters too). One tokenizer
// per pre-tokenizer ("gpt2", "smollm").
//
// Input: byte 0 picks the mode (bit 0: pre-tokenizer; bits 1..2: encode /
// chat template / both; bits 3..4: encode plain / parse_special / with
// BOS+EOS / plain); the rest is the text. Properties:
//   - PreTokenize's chunks tile the text exactly (concatenated, they are it);
//   - Encode without special parsing never fails here (every byte has a
//     token), yields ids inside the vocabulary, no special token, and
//     exactly the ids of a naive reference (each chunk from single bytes,
//     the adjacent pair of lowest rank merged first, leftmost on ties) when
//     no chunk is over 128 bytes;
//   - with parse_special (and BOS/EOS) likewise inside the vocabulary,
//     every special id only where its text stands in the input, BOS first
//     and EOS last;
//   - Decode(Encode(x)) == x, byte for byte, in every mode (BOS/EOS decode
//     as their text); ids outside the vocabulary are refused;
//   - ChatTemplate::FromJinja on the raw text is Unimplemented unless it is
//     one of the two ChatML forms; the SmolLM2 form with a system prompt
//     taken from the input is accepted exactly when the prompt is allowed
//     (non-empty, no quote, backslash or "<|"), and gives that prompt back;
//     a conversation rendered from the input's pieces encodes (parse_special)
//     and decodes back to the rendered text, with one <|im_start|> token per
//     turn when no content holds a special token's text.
// Thread safety: see fuzz_target.h.
#include <algorithm>
#include <cstring>
#include <map>
#include <unordered_map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fuzz/fuzz_target.h"
#include "fuzz/tokenizer_training_text.h"
#include "model/tokenizer/bpe_tokenizer.h"
#include "model/tokenizer/chat_template.h"
#include "model/tokenizer/unicode_classes.h"

namespace {
using namespace kvcache;
using namespace kvcache::model;

using kvcache::fuzz::kTokenizerTrainingText;

const char* const kControl[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
const char* const kUserDefined = "<think>";
constexpr int kMerges = 320;

// GPT-2's byte alphabet, written out the plain way.
std::string MapBytes(std::string_view bytes) {
  static const std::vector<char32_t> table = [] {
    std::vector<char32_t> t(256);
    char32_t next = 256;
    for (int i = 0; i < 256; ++i) {
      const bool self = (i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174 && i <= 255);
      t[i] = self ? static_cast<char32_t>(i) : next++;
    }
    return t;
  }();
  std::string s;
  for (unsigned char c : bytes) AppendUtf8(table[c], &s);
  return s;
}

struct Fixture {
  BpeVocab vocab;
  std::map<std::string, int32_t> id_of;  // raw bytes -> id (ordinary tokens)
  // (left id, right id) -> (rank, result id), for the reference.
  std::unordered_map<uint64_t, std::pair<int, int32_t>> merge_of;
  std::vector<BpeTokenizer> tok;  // [0] gpt2, [1] smollm

  void Add(const std::string& bytes) {
    if (id_of.count(bytes)) return;
    id_of[bytes] = static_cast<int32_t>(vocab.tokens.size());
    vocab.tokens.push_back(MapBytes(bytes));
    vocab.token_types.push_back(kTokenTypeNormal);
  }

  Fixture() {
    for (int b = 0; b < 256; ++b) Add(std::string(1, static_cast<char>(b)));
    for (const char* s : kControl) {
      vocab.tokens.push_back(s);
      vocab.token_types.push_back(kTokenTypeControl);
    }
    vocab.tokens.push_back(kUserDefined);
    vocab.token_types.push_back(kTokenTypeUserDefined);
    // Naive BPE training: chunks of the text, the most frequent adjacent
    // pair (lexicographically first on ties) merged everywhere, repeatedly.
    std::vector<std::vector<std::string>> words;
    for (std::string_view c :
         BpeTokenizer::PreTokenize(PreTokenizer::kGpt2, kTokenizerTrainingText)) {
      std::vector<std::string> w;
      for (char ch : c) w.emplace_back(1, ch);
      words.push_back(std::move(w));
    }
    for (int m = 0; m < kMerges; ++m) {
      std::map<std::pair<std::string, std::string>, int> count;
      for (const auto& w : words) {
        for (size_t i = 0; i + 1 < w.size(); ++i) ++count[{w[i], w[i + 1]}];
      }
      if (count.empty()) break;
      auto best = count.begin();
      for (auto it = count.begin(); it != count.end(); ++it) {
        if (it->second > best->second) best = it;
      }
      const auto pair = best->first;
      const int rank = static_cast<int>(vocab.merges.size());
      vocab.merges.push_back(MapBytes(pair.first) + " " + MapBytes(pair.second));
      Add(pair.first + pair.second);
      merge_of.emplace(Key(id_of.at(pair.first), id_of.at(pair.second)),
                       std::pair{rank, id_of.at(pair.first + pair.second)});
      for (auto& w : words) {
        std::vector<std::string> out;
        for (size_t i = 0; i < w.size(); ++i) {
          if (i + 1 < w.size() && w[i] == pair.first && w[i + 1] == pair.second) {
            out.push_back(w[i] + w[i + 1]);
            ++i;
          } else {
            out.push_back(w[i]);
          }
        }
        w = std::move(out);
      }
    }
    FUZZ_CHECK(vocab.merges.size() == static_cast<size_t>(kMerges));
    vocab.bos_id = 256;  // <|endoftext|>
    vocab.eos_id = 258;  // <|im_end|>
    for (const char* pre : {"gpt2", "smollm"}) {
      BpeVocab v = vocab;
      v.pre = pre;
      auto t = BpeTokenizer::Create(std::move(v));
      FUZZ_CHECK_MSG(t.ok(), "%s", t.status().ToString().c_str());
      tok.push_back(std::move(t).value());
    }
  }

  static uint64_t Key(int32_t l, int32_t r) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
  }
  // The reference: one chunk merged the slow, obvious way (O(n^2)): byte
  // tokens (id = byte), then the adjacent pair of lowest rank, leftmost.
  void ReferenceChunk(std::string_view chunk, std::vector<int32_t>* out) const {
    std::vector<int32_t> p;
    for (unsigned char ch : chunk) p.push_back(ch);
    for (;;) {
      int best = -1;
      size_t at = 0;
      int32_t result = -1;
      for (size_t i = 0; i + 1 < p.size(); ++i) {
        auto it = merge_of.find(Key(p[i], p[i + 1]));
        if (it != merge_of.end() && (best < 0 || it->second.first < best)) {
          best = it->second.first;
          result = it->second.second;
          at = i;
        }
      }
      if (best < 0) break;
      p[at] = result;
      p.erase(p.begin() + static_cast<std::ptrdiff_t>(at) + 1);
    }
    out->insert(out->end(), p.begin(), p.end());
  }
};

const Fixture& F() {
  static const Fixture f;
  return f;
}

std::string DecodeOrDie(const BpeTokenizer& t, const std::vector<int32_t>& ids) {
  auto d = t.Decode(ids);
  FUZZ_CHECK_MSG(d.ok(), "%s", d.status().ToString().c_str());
  return std::move(d).value();
}

void CheckIds(const BpeTokenizer& t, const std::vector<int32_t>& ids) {
  for (int32_t id : ids) FUZZ_CHECK(id >= 0 && static_cast<uint32_t>(id) < t.vocab_size());
}

// Special-token parsing (with BOS and EOS if `ends`).
void FuzzSpecial(const BpeTokenizer& t, std::string_view text, bool ends) {
  BpeEncodeOptions o;
  o.parse_special = true;
  o.bos = ends;
  o.eos = ends;
  auto sp = t.Encode(text, o);
  FUZZ_CHECK_MSG(sp.ok(), "%s", sp.status().ToString().c_str());
  CheckIds(t, *sp);
  std::string expect(text);
  if (ends) {
    FUZZ_CHECK(sp->size() >= 2 && sp->front() == t.bos_id() && sp->back() == t.eos_id());
    expect = std::string(kControl[0]) + expect + kControl[2];
  }
  FUZZ_CHECK(DecodeOrDie(t, *sp) == expect);
  // A special id stands where its text is; none when the text holds none
  // (then the ids are the plain encoding's).
  bool any_special_text = false;
  for (const char* s : {kControl[0], kControl[1], kControl[2], kUserDefined}) {
    any_special_text |= text.find(s) != std::string_view::npos;
  }
  size_t specials = 0;
  for (int32_t id : *sp) specials += t.is_special(id);
  if (!any_special_text) {
    FUZZ_CHECK(specials == (ends ? 2u : 0u));
    if (!ends) {
      auto plain = t.Encode(text);
      FUZZ_CHECK(plain.ok() && *sp == *plain);
    }
  }
}

// variant 1: parse_special; 2: parse_special with BOS and EOS; else plain.
void FuzzEncode(const BpeTokenizer& t, PreTokenizer pre, std::string_view text, int variant) {
  const Fixture& f = F();
  // Chunks tile the text.
  const std::vector<std::string_view> chunks = BpeTokenizer::PreTokenize(pre, text);
  size_t pos = 0;
  for (std::string_view c : chunks) {
    FUZZ_CHECK(!c.empty());
    FUZZ_CHECK(c.data() == text.data() + pos);
    pos += c.size();
  }
  FUZZ_CHECK(pos == text.size());

  if (variant == 1 || variant == 2) return FuzzSpecial(t, text, variant == 2);
  // Plain: no specials, exactly the reference, round trip.
  auto plain = t.Encode(text);
  FUZZ_CHECK_MSG(plain.ok(), "%s", plain.status().ToString().c_str());
  CheckIds(t, *plain);
  for (int32_t id : *plain) FUZZ_CHECK(!t.is_special(id));
  FUZZ_CHECK(DecodeOrDie(t, *plain) == text);
  if (text.size() <= 2048) {
    std::vector<int32_t> ref;
    bool comparable = true;
    for (std::string_view c : chunks) {
      if (c.size() > 128) {
        comparable = false;
        break;
      }
      f.ReferenceChunk(c, &ref);
    }
    if (comparable) {
      FUZZ_CHECK_MSG(ref == *plain, "reference %zu ids, tokenizer %zu ids", ref.size(),
                     plain->size());
    }
  }

  // Out-of-vocabulary ids are refused, nothing decoded.
  std::vector<int32_t> bad = *plain;
  bad.push_back(static_cast<int32_t>(t.vocab_size()));
  FUZZ_CHECK(t.Decode(bad).status().code() == StatusCode::kInvalidArgument);
  bad.back() = -1;
  FUZZ_CHECK(t.Decode(bad).status().code() == StatusCode::kInvalidArgument);
}

using namespace chatml;

void FuzzChat(const BpeTokenizer& t, std::string_view text) {
  // The raw text as a template: only the two ChatML forms are accepted.
  auto raw = ChatTemplate::FromJinja(text);
  if (!raw.ok()) {
    FUZZ_CHECK(raw.status().code() == StatusCode::kUnimplemented);
  } else {
    FUZZ_CHECK(text.starts_with(kLoopOpen) && text.ends_with(kBody));
  }
  // The input as the default system prompt (up to the first 0x00).
  const std::string_view system = text.substr(0, text.find('\0'));
  const std::string jinja = std::string(kLoopOpen) + std::string(kDefaultOpen) +
                            std::string(system) + std::string(kDefaultClose) + std::string(kBody);
  const bool allowed = !system.empty() && system.find_first_of("'\\") == std::string_view::npos &&
                       system.find("<|") == std::string_view::npos;
  auto tmpl = ChatTemplate::FromJinja(jinja);
  FUZZ_CHECK(tmpl.ok() == allowed);
  if (tmpl.ok()) {
    FUZZ_CHECK(tmpl->has_default_system() && tmpl->default_system() == system);
  } else {
    FUZZ_CHECK(tmpl.status().code() == StatusCode::kUnimplemented);
  }
  auto plain_form = ChatTemplate::FromJinja(std::string(kLoopOpen) + std::string(kBody));
  FUZZ_CHECK(plain_form.ok() && !plain_form->has_default_system());

  // A conversation from the input: pieces separated by 0x00 alternate
  // role, content.
  std::vector<ChatMessage> messages;
  std::vector<std::string_view> pieces;
  for (size_t start = 0;;) {
    const size_t z = text.find('\0', start);
    pieces.push_back(text.substr(start, z == std::string_view::npos ? z : z - start));
    if (z == std::string_view::npos) break;
    start = z + 1;
  }
  for (size_t i = 0; i + 1 < pieces.size(); i += 2) {
    messages.push_back({std::string(pieces[i]), std::string(pieces[i + 1])});
  }
  const ChatTemplate chat = tmpl.ok() ? std::move(tmpl).value() : ChatTemplate::ChatMl("");
  for (bool gen : {false, true}) {
    const std::string rendered = chat.Render(messages, gen);
    const size_t turns = messages.size() + gen +
                         (chat.has_default_system() && !messages.empty() &&
                          messages[0].role != "system");
    BpeEncodeOptions o;
    o.parse_special = true;
    auto ids = t.Encode(rendered, o);
    FUZZ_CHECK_MSG(ids.ok(), "%s", ids.status().ToString().c_str());
    CheckIds(t, *ids);
    FUZZ_CHECK(DecodeOrDie(t, *ids) == rendered);
    // Every special token's text starts with '<': without one in the
    // input, only the template's own markers are special.
    if (text.find('<') == std::string_view::npos) {
      const int32_t start = *t.SpecialId(kControl[1]);
      FUZZ_CHECK(static_cast<size_t>(std::count(ids->begin(), ids->end(), start)) == turns);
      if (turns > 0) FUZZ_CHECK(ids->front() == start);
    }
  }
}

}  // namespace

KVCACHE_FUZZ_TARGET(bpe) {
  const Fixture& f = F();
  if (size < 1) return 0;
  const int pre = data[0] & 1;
  const int mode = (data[0] >> 1) & 3;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const BpeTokenizer& t = f.tok[pre];
  FUZZ_CHECK(t.pre_tokenizer() == (pre ? PreTokenizer::kSmollm : PreTokenizer::kGpt2));
  if (mode != 1) FuzzEncode(t, t.pre_tokenizer(), text, (data[0] >> 3) & 3);
  if (mode != 0) FuzzChat(t, text);
  return 0;
}
