// Fuzz target `spm`: the SentencePiece tokenizer
// (model/tokenizer/spm_tokenizer.cc) encoding and decoding arbitrary bytes.
//
// The vocabulary is built once in the harness, through SpmTokenizer::Create:
// "<unk>" (unknown), "<s>" / "</s>" / "<start_of_turn>" / "<end_of_turn>"
// (control), "\n\n" / "<b>" / "\n" (user-defined), the 256 byte tokens
// <0xNN>, every character of a fixed text (fuzz/tokenizer_training_text.h;
// spaces as U+2581) and its 400 most frequent substrings of two to eight
// characters, scored by frequency in groups of three equal scores (so that
// ties happen). Two tokenizers: without and with add_space_prefix.
//
// Input: byte 0 picks the mode (bit 0: add_space_prefix; bits 1..2: plain /
// parse_special / parse_special with BOS+EOS / plain with BOS); the rest is
// the text. Properties:
//   - Encode never fails here (every byte has a token) and yields ids
//     inside the vocabulary; BOS first and EOS last when asked for;
//   - the ids are exactly a naive reference's when the text is at most 512
//     bytes: special tokens cut the llama.cpp way (each special token,
//     longest first, split out of every text fragment with find), each
//     fragment's characters merged by the obvious O(n^2) loop (the best
//     score, leftmost), symbols that are no piece as byte tokens;
//   - without add_space_prefix, Decode(Encode(x)) == x in every mode (BOS
//     and EOS decode as their text) unless x holds a U+2581 (it decodes as
//     a space) or an invalid lead byte takes part of a space's U+2581 (x
//     not valid UTF-8 and holding a space);
//   - ids outside the vocabulary are refused by Decode.
// Thread safety: see fuzz_target.h.
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "fuzz/fuzz_target.h"
#include "fuzz/spm_reference.h"
#include "fuzz/tokenizer_training_text.h"
#include "model/tokenizer/spm_tokenizer.h"
#include "model/tokenizer/unicode_classes.h"

namespace {
using namespace kvcache;
using namespace kvcache::model;

using kvcache::fuzz::kSpaceMark;
using kvcache::fuzz::kTokenizerTrainingText;
constexpr int kLearnt = 400;

struct Fixture {
  SpmVocab vocab;
  std::map<std::string, int32_t> id_of;
  std::vector<int32_t> specials;  // cutting order: longest first, then lower id
  std::vector<SpmTokenizer> tok;  // [0] no space prefix, [1] space prefix

  void Add(const std::string& piece, float score, int32_t type) {
    if (id_of.count(piece)) return;
    id_of[piece] = static_cast<int32_t>(vocab.tokens.size());
    vocab.tokens.push_back(piece);
    vocab.scores.push_back(score);
    vocab.token_types.push_back(type);
  }

  Fixture() {
    Add("<unk>", 0, kTokenTypeUnknown);
    for (const char* s : {"<s>", "</s>", "<start_of_turn>", "<end_of_turn>"}) {
      Add(s, 0, kTokenTypeControl);
    }
    for (const char* s : {"\n\n", "<b>", "\n"}) Add(s, 0, kTokenTypeUserDefined);
    for (int b = 0; b < 256; ++b) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "<0x%02X>", b);
      Add(hex, 0, kTokenTypeByte);
    }
    const std::vector<std::string> chars =
        fuzz::SplitByLeadByte(fuzz::EscapeSpaces(kTokenizerTrainingText, false));
    std::map<std::string, int> count;
    for (size_t i = 0; i < chars.size(); ++i) {
      Add(chars[i], -1000, kTokenTypeNormal);
      std::string s = chars[i];
      for (size_t j = i + 1; j < chars.size() && j < i + 8; ++j) {
        s += chars[j];
        ++count[s];
      }
    }
    std::vector<std::pair<int, std::string>> by_count;
    for (const auto& [s, n] : count) by_count.emplace_back(-n, s);
    std::sort(by_count.begin(), by_count.end());
    for (int i = 0; i < kLearnt && i < static_cast<int>(by_count.size()); ++i) {
      Add(by_count[i].second, -static_cast<float>(i / 3), kTokenTypeNormal);
    }
    vocab.bos_id = 1;
    vocab.eos_id = 2;
    for (size_t id = 0; id < vocab.tokens.size(); ++id) {
      const int32_t type = vocab.token_types[id];
      if (type == kTokenTypeControl || type == kTokenTypeUserDefined ||
          type == kTokenTypeUnknown) {
        specials.push_back(static_cast<int32_t>(id));
      }
    }
    std::stable_sort(specials.begin(), specials.end(), [&](int32_t a, int32_t b) {
      return vocab.tokens[a].size() > vocab.tokens[b].size();
    });
    for (bool prefix : {false, true}) {
      SpmVocab v = vocab;
      v.add_space_prefix = prefix;
      auto t = SpmTokenizer::Create(std::move(v));
      FUZZ_CHECK_MSG(t.ok(), "%s", t.status().ToString().c_str());
      tok.push_back(std::move(t).value());
    }
  }

  // The whole text: special tokens split out of text fragments one token
  // at a time (each at every find() hit, left to right), then the runs.
  std::vector<int32_t> Reference(std::string_view text, bool prefix, bool parse_special) const {
    using Fragment = std::variant<std::string, int32_t>;
    std::vector<Fragment> frags;
    if (!text.empty()) frags.emplace_back(std::string(text));
    for (int32_t id : specials) {
      if (!parse_special && vocab.token_types[id] != kTokenTypeUserDefined) continue;
      const std::string& sp = vocab.tokens[id];
      std::vector<Fragment> next;
      for (const Fragment& f : frags) {
        if (!std::holds_alternative<std::string>(f)) {
          next.push_back(f);
          continue;
        }
        const std::string& s = std::get<std::string>(f);
        size_t from = 0;
        for (size_t hit; (hit = s.find(sp, from)) != std::string::npos; from = hit + sp.size()) {
          if (hit > from) next.emplace_back(s.substr(from, hit - from));
          next.emplace_back(id);
        }
        if (from < s.size()) next.emplace_back(s.substr(from));
      }
      frags = std::move(next);
    }
    std::vector<int32_t> out;
    bool after_special = true;
    for (const Fragment& f : frags) {
      if (std::holds_alternative<int32_t>(f)) {
        out.push_back(std::get<int32_t>(f));
        after_special = true;
      } else {
        const std::vector<int32_t> ids = fuzz::ReferenceSpmRun(
            {&id_of, &vocab.scores}, std::get<std::string>(f), prefix && after_special);
        out.insert(out.end(), ids.begin(), ids.end());
        after_special = false;
      }
    }
    return out;
  }
};

const Fixture& F() {
  static const Fixture f;
  return f;
}

bool ValidUtf8(std::string_view s) {
  for (size_t pos = 0; pos < s.size();) {
    const Utf8Char c = DecodeUtf8(s, pos);
    if (!c.valid) return false;
    pos += c.bytes;
  }
  return true;
}

// One input: the tokenizer with or without the space prefix, the mode (see
// the top), the text.
void FuzzOne(bool prefix, int mode, std::string_view text) {
  const Fixture& f = F();
  const SpmTokenizer& t = f.tok[prefix];
  FUZZ_CHECK(t.add_space_prefix() == prefix);
  TextEncodeOptions o;
  o.parse_special = mode == 1 || mode == 2;
  o.bos = mode >= 2;
  o.eos = mode == 2;
  auto ids = t.Encode(text, o);
  FUZZ_CHECK_MSG(ids.ok(), "%s", ids.status().ToString().c_str());
  for (int32_t id : *ids) FUZZ_CHECK(id >= 0 && static_cast<uint32_t>(id) < t.vocab_size());
  std::vector<int32_t> body = *ids;
  if (o.bos) {
    FUZZ_CHECK(!body.empty() && body.front() == t.bos_id());
    body.erase(body.begin());
  }
  if (o.eos) {
    FUZZ_CHECK(!body.empty() && body.back() == t.eos_id());
    body.pop_back();
  }
  if (text.size() <= 512) {
    const std::vector<int32_t> ref = f.Reference(text, prefix, o.parse_special);
    FUZZ_CHECK_MSG(ref == body, "reference %zu ids, tokenizer %zu ids", ref.size(), body.size());
  }
  if (!prefix && text.find(kSpaceMark) == std::string_view::npos &&
      (ValidUtf8(text) || text.find(' ') == std::string_view::npos)) {
    auto back = t.Decode(*ids);
    FUZZ_CHECK_MSG(back.ok(), "%s", back.status().ToString().c_str());
    std::string expect(text);
    if (o.bos) expect = "<s>" + expect;
    if (o.eos) expect += "</s>";
    FUZZ_CHECK(*back == expect);
  }
  std::vector<int32_t> bad = *ids;
  bad.push_back(static_cast<int32_t>(t.vocab_size()));
  FUZZ_CHECK(t.Decode(bad).status().code() == StatusCode::kInvalidArgument);
  bad.back() = -1;
  FUZZ_CHECK(t.Decode(bad).status().code() == StatusCode::kInvalidArgument);
}

}  // namespace

KVCACHE_FUZZ_TARGET(spm) {
  if (size < 1) return 0;
  FuzzOne(data[0] & 1, (data[0] >> 1) & 3,
          std::string_view(reinterpret_cast<const char*>(data + 1), size - 1));
  return 0;
}
