// Byte-level BPE on small hand-made vocabularies (no model file needed):
// the byte alphabet, the pre-tokenizer's chunks, merge order against a naive
// O(n^2) reference on random merge tables, special tokens, round trips of
// arbitrary bytes, and every construction/encode/decode error. The UTF-8
// helpers and the ChatML template are tested here as well.
#include "model/tokenizer/bpe_tokenizer.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "model/gpt2_bytes.h"
#include "model/tokenizer/chat_template.h"
#include "model/tokenizer/unicode_classes.h"

namespace kvcache::model {
namespace {

using testing::MapByte;

std::string MapBytes(std::string_view bytes) {
  std::string s;
  for (unsigned char c : bytes) s += MapByte(c);
  return s;
}

// 256 byte tokens (ids 0..255 = the byte), then the given specials, then
// the merge results in merge order.
using Merges = std::vector<std::pair<std::string, std::string>>;

struct TinyVocab {
  BpeVocab vocab;
  std::map<std::string, int32_t> id_of;  // raw bytes -> id

  TinyVocab(const std::vector<std::pair<std::string, std::string>>& merges,
            const std::vector<std::string>& specials = {}) {
    for (int b = 0; b < 256; ++b) Add(std::string(1, static_cast<char>(b)), kTokenTypeNormal);
    for (const auto& s : specials) {
      id_of[s] = static_cast<int32_t>(vocab.tokens.size());
      vocab.tokens.push_back(s);
      vocab.token_types.push_back(kTokenTypeControl);
    }
    for (const auto& [l, r] : merges) {
      vocab.merges.push_back(MapBytes(l) + " " + MapBytes(r));
      if (!id_of.count(l + r)) Add(l + r, kTokenTypeNormal);
    }
  }
  void Add(const std::string& bytes, int32_t type) {
    id_of[bytes] = static_cast<int32_t>(vocab.tokens.size());
    vocab.tokens.push_back(MapBytes(bytes));
    vocab.token_types.push_back(type);
  }
  BpeTokenizer Build() const {
    auto t = BpeTokenizer::Create(vocab);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return std::move(t).value();
  }
};

std::vector<std::string> Chunks(PreTokenizer pre, std::string_view text) {
  std::vector<std::string> out;
  for (auto v : BpeTokenizer::PreTokenize(pre, text)) out.emplace_back(v);
  return out;
}

using Strs = std::vector<std::string>;

TEST(BpePreTokenize, Gpt2Pattern) {
  const auto g = PreTokenizer::kGpt2;
  EXPECT_EQ(Chunks(g, "Hello world"), (Strs{"Hello", " world"}));
  EXPECT_EQ(Chunks(g, "I'm here's it'll we've they're I'd don't"),
            (Strs{"I", "'m", " here", "'s", " it", "'ll", " we", "'ve", " they", "'re", " I", "'d",
                  " don", "'t"}));
  EXPECT_EQ(Chunks(g, "DON'T o'clock"),
            (Strs{"DON", "'", "T", " o", "'", "clock"}));  // lower case only
  EXPECT_EQ(Chunks(g, "a   b"), (Strs{"a", "  ", " b"}));
  EXPECT_EQ(Chunks(g, "a\n\nb"), (Strs{"a", "\n", "\n", "b"}));
  EXPECT_EQ(Chunks(g, "a \t b"), (Strs{"a", " \t", " b"}));
  EXPECT_EQ(Chunks(g, "\tx"), (Strs{"\t", "x"}));
  EXPECT_EQ(Chunks(g, "end  "), (Strs{"end", "  "}));
  EXPECT_EQ(Chunks(g, "x 123 y"), (Strs{"x", " 123", " y"}));
  EXPECT_EQ(Chunks(g, "!!! ?x"), (Strs{"!!!", " ?", "x"}));
  EXPECT_EQ(Chunks(g, "caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87"),  // café 中文
            (Strs{"caf\xC3\xA9", " \xE4\xB8\xAD\xE6\x96\x87"}));
  EXPECT_EQ(Chunks(g,
                   "a\xC2\xA0"
                   "b"),
            (Strs{"a", "\xC2\xA0", "b"}));               // NBSP is \s
  EXPECT_EQ(Chunks(g, "x\x1C."), (Strs{"x", "\x1C."}));  // U+001C is not
  EXPECT_EQ(Chunks(g, " "), (Strs{" "}));
  EXPECT_TRUE(Chunks(g, "").empty());
}

TEST(BpePreTokenize, SmollmSplitsEveryDigit) {
  const auto s = PreTokenizer::kSmollm;
  EXPECT_EQ(Chunks(s, "x 123 y"), (Strs{"x", " ", "1", "2", "3", " y"}));
  EXPECT_EQ(Chunks(s, "abc42def"), (Strs{"abc", "4", "2", "def"}));
  EXPECT_EQ(Chunks(s, "3.14"), (Strs{"3", ".", "1", "4"}));
  // Each piece between digits is split on its own: "  " before a digit
  // stays whole (the lookahead cannot see the digit).
  EXPECT_EQ(Chunks(s, "a  1"), (Strs{"a", "  ", "1"}));
  EXPECT_EQ(Chunks(s, "x\xC2\xB2"), (Strs{"x", "\xC2\xB2"}));  // superscript two is \p{N}
}

TEST(BpePreTokenize, InvalidUtf8IsOneOtherCharacterPerByte) {
  const auto g = PreTokenizer::kGpt2;
  EXPECT_EQ(Chunks(g,
                   "a\xFF"
                   "b"),
            (Strs{"a", "\xFF", "b"}));
  EXPECT_EQ(Chunks(g, "\xFF\xFE!"), (Strs{"\xFF\xFE!"}));
  EXPECT_EQ(Chunks(g, "ab \xC3"), (Strs{"ab", " \xC3"}));  // truncated é
}

TEST(BpeTokenizer, MergesLowestRankFirstLeftmostOnTies) {
  TinyVocab v({{"l", "l"}, {"h", "e"}, {"he", "ll"}, {"hell", "o"}, {"a", "a"}, {" ", "w"}});
  const BpeTokenizer t = v.Build();
  EXPECT_EQ(*t.Encode("hello"), (std::vector<int32_t>{v.id_of["hello"]}));
  EXPECT_EQ(*t.Encode("aaa"), (std::vector<int32_t>{v.id_of["aa"], 'a'}));
  EXPECT_EQ(*t.Encode("aaaa"), (std::vector<int32_t>{v.id_of["aa"], v.id_of["aa"]}));
  EXPECT_EQ(*t.Encode("hel wo"), (std::vector<int32_t>{v.id_of["he"], 'l', v.id_of[" w"], 'o'}));
  EXPECT_EQ(*t.Encode(" "), (std::vector<int32_t>{' '}));
  EXPECT_TRUE(t.Encode("")->empty());
}

// The obviously-correct reference: scan every adjacent pair, merge the one
// of lowest rank (leftmost on ties), repeat.
std::vector<int32_t> NaiveBpe(const TinyVocab& v,
                              const std::map<std::pair<int32_t, int32_t>, int>& rank,
                              std::string_view chunk) {
  std::vector<std::string> parts;
  for (char c : chunk) parts.emplace_back(1, c);
  for (;;) {
    int best = INT32_MAX;
    size_t at = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      auto it = rank.find({v.id_of.at(parts[i]), v.id_of.at(parts[i + 1])});
      if (it != rank.end() && it->second < best) best = it->second, at = i;
    }
    if (best == INT32_MAX) break;
    parts[at] += parts[at + 1];
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
  std::vector<int32_t> ids;
  for (const auto& p : parts) ids.push_back(v.id_of.at(p));
  return ids;
}

TEST(BpeTokenizer, MatchesNaiveReferenceOnRandomMergeTables) {
  std::mt19937 rng(16);
  const std::string alphabet = "abc ";
  for (int table = 0; table < 20; ++table) {
    std::vector<std::string> known = {"a", "b", "c", " "};
    std::vector<std::pair<std::string, std::string>> merges;
    std::set<std::string> made(known.begin(), known.end());
    while (merges.size() < 40) {
      const std::string& l = known[rng() % known.size()];
      const std::string& r = known[rng() % known.size()];
      if (l.size() + r.size() > 8 ||
          std::find(merges.begin(), merges.end(), std::pair{l, r}) != merges.end())
        continue;
      merges.emplace_back(l, r);
      if (made.insert(l + r).second) known.push_back(l + r);
    }
    TinyVocab v(merges);
    const BpeTokenizer t = v.Build();
    std::map<std::pair<int32_t, int32_t>, int> rank;
    for (size_t i = 0; i < merges.size(); ++i) {
      rank.emplace(std::pair{v.id_of.at(merges[i].first), v.id_of.at(merges[i].second)},
                   static_cast<int>(i));
    }
    for (int trial = 0; trial < 50; ++trial) {
      std::string text;
      const size_t len = rng() % 40;
      for (size_t i = 0; i < len; ++i) text += alphabet[rng() % alphabet.size()];
      std::vector<int32_t> want;
      for (auto chunk : BpeTokenizer::PreTokenize(PreTokenizer::kGpt2, text)) {
        auto ids = NaiveBpe(v, rank, chunk);
        want.insert(want.end(), ids.begin(), ids.end());
      }
      auto got = t.Encode(text);
      ASSERT_TRUE(got.ok());
      ASSERT_EQ(*got, want) << "table " << table << " text '" << text << "'";
      ASSERT_EQ(*t.Decode(*got), text);
    }
  }
}

TEST(BpeTokenizer, SpecialTokensOnlyWhenAllowedLongestFirst) {
  TinyVocab v({{"<", "|"}}, {"<|x|>", "<|x|>y", "<|end|>"});
  const BpeTokenizer t = v.Build();
  const int32_t x = v.id_of["<|x|>"], xy = v.id_of["<|x|>y"], end = v.id_of["<|end|>"];
  EXPECT_TRUE(t.is_special(x));
  EXPECT_FALSE(t.is_special('a'));
  EXPECT_FALSE(t.is_special(-1));
  EXPECT_FALSE(t.is_special(static_cast<int32_t>(t.vocab_size())));
  EXPECT_EQ(*t.SpecialId("<|end|>"), end);
  EXPECT_EQ(t.SpecialId("<|nope|>").status().code(), StatusCode::kNotFound);
  const BpeEncodeOptions special{.parse_special = true};
  EXPECT_EQ(*t.Encode("a<|x|>yb<|x|><|end|>", special),
            (std::vector<int32_t>{'a', xy, 'b', x, end}));
  EXPECT_EQ(*t.Encode("<|x", special), (std::vector<int32_t>{v.id_of["<|"], 'x'}));
  // Without parse_special the text is ordinary bytes.
  EXPECT_EQ(*t.Encode("<|end|>"), (std::vector<int32_t>{v.id_of["<|"], 'e', 'n', 'd', '|', '>'}));
  // The text before a special token is pre-tokenized on its own.
  EXPECT_EQ(*t.Encode("a  <|end|>", special), (std::vector<int32_t>{'a', ' ', ' ', end}));
  EXPECT_EQ(*t.Decode(std::vector<int32_t>{'a', xy, end}), "a<|x|>y<|end|>");
}

TEST(BpeTokenizer, BosEosOptions) {
  TinyVocab v({}, {"<s>", "</s>"});
  v.vocab.bos_id = v.id_of["<s>"];
  v.vocab.eos_id = v.id_of["</s>"];
  const BpeTokenizer t = v.Build();
  EXPECT_EQ(*t.Encode("a", {.bos = true, .eos = true}),
            (std::vector<int32_t>{v.id_of["<s>"], 'a', v.id_of["</s>"]}));
  EXPECT_EQ(*t.Encode("", {.bos = true}), (std::vector<int32_t>{v.id_of["<s>"]}));
  const BpeTokenizer none = TinyVocab({}).Build();
  EXPECT_EQ(none.Encode("a", {.bos = true}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(none.Encode("a", {.eos = true}).status().code(), StatusCode::kInvalidArgument);
}

TEST(BpeTokenizer, RoundTripsArbitraryBytes) {
  TinyVocab v({{"a", "b"}, {"\xC3", "\xA9"}, {" ", "ab"}, {"\xFF", "\xFE"}});
  const BpeTokenizer t = v.Build();
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    std::string text(rng() % 64, '\0');
    for (char& c : text)
      c = static_cast<char>(trial % 2 ? rng() % 256 : "ab \xC3\xA9\xFF\xFE\n1"[rng() % 9]);
    for (bool special : {false, true}) {
      auto ids = t.Encode(text, {.parse_special = special});
      ASSERT_TRUE(ids.ok());
      ASSERT_EQ(*t.Decode(*ids), text);
    }
  }
}

TEST(BpeTokenizer, ByteWithoutTokenIsAnError) {
  TinyVocab v({});
  v.vocab.tokens[4] = MapBytes("\x04\x04");  // byte 0x04 has no single token now
  const BpeTokenizer t = v.Build();
  auto r = t.Encode("ab\x04");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("0x04 at offset 2"), std::string::npos)
      << r.status().message();
}

TEST(BpeTokenizer, TextOverTheLimitIsAnError) {
  const BpeTokenizer t = TinyVocab(Merges{}).Build();
  // Address space only (never touched: the length is checked first).
  const size_t n = BpeTokenizer::kMaxTextBytes + 1;
  void* p = mmap(nullptr, n, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  auto r = t.Encode(std::string_view(static_cast<const char*>(p), n));
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  munmap(p, n);
}

TEST(BpeTokenizer, DecodeRejectsBadIds) {
  const BpeTokenizer t = TinyVocab(Merges{{"a", "b"}}).Build();
  EXPECT_EQ(t.vocab_size(), 257u);
  EXPECT_EQ(*t.DecodeToken(256), "ab");
  for (int32_t bad : {-1, 257, INT32_MAX, INT32_MIN}) {
    EXPECT_EQ(t.DecodeToken(bad).status().code(), StatusCode::kInvalidArgument) << bad;
    auto r = t.Decode(std::vector<int32_t>{'a', bad});
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("at position 1"), std::string::npos);
  }
  EXPECT_EQ(*t.Decode(std::vector<int32_t>{}), "");
}

TEST(BpeTokenizer, CreateRejectsMalformedVocabularies) {
  auto code = [](const BpeVocab& v) { return BpeTokenizer::Create(v).status().code(); };
  const TinyVocab good(Merges{{"a", "b"}});
  EXPECT_TRUE(BpeTokenizer::Create(good.vocab).ok());
  EXPECT_EQ(code(BpeVocab{}), StatusCode::kInvalidArgument);
  auto with = [&](auto edit) {
    BpeVocab v = good.vocab;
    edit(v);
    return code(v);
  };
  EXPECT_EQ(with([](BpeVocab& v) { v.token_types.pop_back(); }), StatusCode::kCorruption);
  EXPECT_EQ(with([](BpeVocab& v) { v.tokens[5] = " raw space"; }), StatusCode::kCorruption);
  EXPECT_EQ(with([](BpeVocab& v) { v.tokens[5] = "\xFF"; }), StatusCode::kCorruption);
  EXPECT_EQ(with([](BpeVocab& v) { v.tokens[5] = ""; }), StatusCode::kCorruption);
  EXPECT_EQ(with([](BpeVocab& v) { v.merges.push_back("ab"); }), StatusCode::kCorruption);
  EXPECT_EQ(with([](BpeVocab& v) { v.merges.push_back("a b c"); }), StatusCode::kCorruption);
  EXPECT_EQ(with([](BpeVocab& v) { v.merges.push_back("a "); }), StatusCode::kCorruption);
  EXPECT_EQ(with([](BpeVocab& v) { v.merges.push_back("b a"); }),
            StatusCode::kCorruption);  // "ba" absent
  EXPECT_EQ(with([](BpeVocab& v) { v.merges.push_back("abab a"); }), StatusCode::kCorruption);
  EXPECT_EQ(with([](BpeVocab& v) { v.bos_id = 257; }), StatusCode::kCorruption);
  EXPECT_EQ(with([](BpeVocab& v) { v.eos_id = -2; }), StatusCode::kCorruption);
  EXPECT_EQ(with([](BpeVocab& v) { v.pre = "llama3"; }), StatusCode::kUnimplemented);
  EXPECT_EQ(with([](BpeVocab& v) { v.pre = "smollm"; }), StatusCode::kOk);
}

TEST(UnicodeClasses, Samples) {
  EXPECT_EQ(ClassOf('a'), CharClass::kLetter);
  EXPECT_EQ(ClassOf('Z'), CharClass::kLetter);
  EXPECT_EQ(ClassOf('7'), CharClass::kNumber);
  EXPECT_EQ(ClassOf(' '), CharClass::kSpace);
  EXPECT_EQ(ClassOf('\n'), CharClass::kSpace);
  EXPECT_EQ(ClassOf(0x0B), CharClass::kSpace);
  EXPECT_EQ(ClassOf('!'), CharClass::kOther);
  EXPECT_EQ(ClassOf('\''), CharClass::kOther);
  EXPECT_EQ(ClassOf(0x1C), CharClass::kOther);
  EXPECT_EQ(ClassOf(0xE9), CharClass::kLetter);    // é
  EXPECT_EQ(ClassOf(0x4E2D), CharClass::kLetter);  // 中
  EXPECT_EQ(ClassOf(0xAC00), CharClass::kLetter);  // 가
  EXPECT_EQ(ClassOf(0xB2), CharClass::kNumber);    // ²
  EXPECT_EQ(ClassOf(0x216B), CharClass::kNumber);  // Ⅻ (Nl)
  EXPECT_EQ(ClassOf(0xFF11), CharClass::kNumber);  // fullwidth 1
  EXPECT_EQ(ClassOf(0xA0), CharClass::kSpace);
  EXPECT_EQ(ClassOf(0x3000), CharClass::kSpace);
  EXPECT_EQ(ClassOf(0x2028), CharClass::kSpace);
  EXPECT_EQ(ClassOf(0x200B), CharClass::kOther);    // zero width space is not White_Space
  EXPECT_EQ(ClassOf(0x0301), CharClass::kOther);    // combining acute (Mn)
  EXPECT_EQ(ClassOf(0x1F600), CharClass::kOther);   // emoji
  EXPECT_EQ(ClassOf(0x20000), CharClass::kLetter);  // CJK extension B
  EXPECT_EQ(ClassOf(0x10FFFF), CharClass::kOther);
}

TEST(Utf8, DecodeAndSanitize) {
  const std::string s = "a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80";
  Utf8Char c = DecodeUtf8(s, 1);
  EXPECT_TRUE(c.valid);
  EXPECT_EQ(c.cp, 0xE9u);
  EXPECT_EQ(c.bytes, 2);
  EXPECT_EQ(DecodeUtf8(s, 3).cp, 0x4E2Du);
  EXPECT_EQ(DecodeUtf8(s, 6).cp, 0x1F600u);
  for (const char* bad :
       {"\x80", "\xC0\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xE2\x82", "\xFF"}) {
    Utf8Char b = DecodeUtf8(bad, 0);
    EXPECT_FALSE(b.valid) << bad;
    EXPECT_EQ(b.bytes, 1);
  }
  EXPECT_EQ(SanitizeUtf8(s), s);
  // Unicode's example of maximal-subpart replacement (as Python's
  // errors="replace" gives it), and a few more.
  EXPECT_EQ(SanitizeUtf8("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64"),
            "a\uFFFD\uFFFD\uFFFD"
            "b\uFFFD"
            "c\uFFFD\uFFFD"
            "d");
  EXPECT_EQ(SanitizeUtf8("\xED\xA0\x80|\xC0\x80|\xF4\x90\x80\x80|\xF0\x9F\x98|\xE2\x82"),
            "\uFFFD\uFFFD\uFFFD|\uFFFD\uFFFD|\uFFFD\uFFFD\uFFFD\uFFFD|\uFFFD|\uFFFD");
  EXPECT_EQ(SanitizeUtf8(""), "");
}

constexpr std::string_view kChatMlWithDefault =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nBe brief.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
constexpr std::string_view kChatMlPlain =
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

TEST(ChatTemplate, RecognisesChatMlAndRendersIt) {
  auto t = ChatTemplate::FromJinja(kChatMlWithDefault);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_TRUE(t->has_default_system());
  EXPECT_EQ(t->default_system(), "Be brief.");
  const std::vector<ChatMessage> user = {{"user", "Hi"}};
  EXPECT_EQ(t->Render(user, true),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");
  const std::vector<ChatMessage> sys = {{"system", "S"}, {"user", "U"}, {"assistant", "A"}};
  EXPECT_EQ(t->Render(sys, false),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
            "<|im_start|>assistant\nA<|im_end|>\n");
  EXPECT_EQ(t->Render({}, true), "<|im_start|>assistant\n");

  auto plain = ChatTemplate::FromJinja(kChatMlPlain);
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->has_default_system());
  EXPECT_EQ(plain->Render(user, false), "<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplate, RejectsOtherTemplates) {
  const std::string with(kChatMlWithDefault);
  for (std::string bad : {
           std::string(""),
           std::string(
               "{{ bos_token }}{% for message in messages %}{{ message['content'] }}{% endfor %}"),
           with.substr(0, with.size() - 1),  // truncated
           " " + with,                       // different whitespace
           std::string(kChatMlPlain) + "x",
           [&] {
             std::string s = with;
             s.replace(s.find("Be brief."), 9, "It's");
             return s;
           }(),
           [&] {
             std::string s = with;
             s.replace(s.find("Be brief."), 9, "");
             return s;
           }(),
       }) {
    auto t = ChatTemplate::FromJinja(bad);
    EXPECT_EQ(t.status().code(), StatusCode::kUnimplemented) << bad;
  }
}

TEST(ChatTemplate, GemmaTurns) {
  const ChatTemplate t = ChatTemplate::Gemma();
  EXPECT_EQ(t.kind(), ChatTemplate::Kind::kGemma);
  // The system message opens the first turn; "assistant" is "model";
  // contents are trimmed (the system's is not).
  const std::vector<ChatMessage> conversation = {
      {"system", "Be brief."}, {"user", " Hi\n"}, {"assistant", "Hello!"}, {"user", "Name a colour."}};
  EXPECT_TRUE(t.Check(conversation).ok());
  EXPECT_EQ(t.Render(conversation, true),
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
            "<start_of_turn>model\nHello!<end_of_turn>\n"
            "<start_of_turn>user\nName a colour.<end_of_turn>\n"
            "<start_of_turn>model\n");
  const std::vector<ChatMessage> user = {{"user", "Hi"}};
  EXPECT_EQ(t.Render(user, false), "<bos><start_of_turn>user\nHi<end_of_turn>\n");
  EXPECT_EQ(t.Render({}, true), "<bos><start_of_turn>model\n");
  // Turns must alternate user / assistant after the optional system message.
  for (const std::vector<ChatMessage>& bad : std::vector<std::vector<ChatMessage>>{
           {{"assistant", "A"}},
           {{"user", "U"}, {"user", "U"}},
           {{"system", "S"}, {"assistant", "A"}},
           {{"user", "U"}, {"assistant", "A"}, {"assistant", "A"}},
       }) {
    EXPECT_EQ(t.Check(bad).code(), StatusCode::kInvalidArgument) << bad.size();
  }
  // ChatML holds any order.
  auto chatml = ChatTemplate::FromJinja(kChatMlPlain);
  ASSERT_TRUE(chatml.ok());
  EXPECT_EQ(chatml->kind(), ChatTemplate::Kind::kChatMl);
  const std::vector<ChatMessage> twice = {{"user", "U"}, {"user", "U"}};
  EXPECT_TRUE(chatml->Check(twice).ok());
}

}  // namespace
}  // namespace kvcache::model
