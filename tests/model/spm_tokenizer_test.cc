// SentencePiece BPE on small hand-made vocabularies (no model file needed):
// merge order by score against a naive O(n^2) reference on random
// vocabularies, spaces and the space prefix, byte fallback for missing
// characters and invalid UTF-8, special tokens (which are cut, in which
// order), BOS/EOS, round trips of arbitrary bytes, every construction,
// encode and decode error, and GgufTokenizer's choice of kind.
#include "model/tokenizer/spm_tokenizer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "fuzz/spm_reference.h"
#include "model/gguf_writer.h"
#include "model/io/gguf.h"
#include "model/tokenizer/gguf_tokenizer.h"

namespace kvcache::model {
namespace {

const std::string kSpace = "\xE2\x96\x81";  // U+2581

// "<unk>" (unknown), "<s>" (control, BOS 1), "</s>" (control, EOS 2), the
// 256 byte tokens <0xNN> (ids 3..258), then what Add appends.
struct TinySpm {
  SpmVocab vocab;
  std::map<std::string, int32_t> id_of;

  TinySpm() {
    Add("<unk>", 0, kTokenTypeUnknown);
    Add("<s>", 0, kTokenTypeControl);
    Add("</s>", 0, kTokenTypeControl);
    for (int b = 0; b < 256; ++b) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "<0x%02X>", b);
      Add(hex, 0, kTokenTypeByte);
    }
    vocab.bos_id = 1;
    vocab.eos_id = 2;
  }
  int32_t Add(const std::string& piece, float score, int32_t type = kTokenTypeNormal) {
    const int32_t id = static_cast<int32_t>(vocab.tokens.size());
    id_of[piece] = id;
    vocab.tokens.push_back(piece);
    vocab.scores.push_back(score);
    vocab.token_types.push_back(type);
    return id;
  }
  int32_t Byte(uint8_t b) const { return 3 + b; }
  SpmTokenizer Build() const {
    auto t = SpmTokenizer::Create(vocab);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return std::move(t).value();
  }
};

// The reference encoding (fuzz/spm_reference.h) of a text without special tokens.
std::vector<int32_t> NaiveSpm(const TinySpm& v, std::string_view text) {
  return fuzz::ReferenceSpmRun({&v.id_of, &v.vocab.scores}, text, /*space_prefix=*/false);
}

TEST(SpmTokenizer, MergesHighestScoreFirstLeftmostOnTies) {
  TinySpm v;
  const int32_t a = v.Add("a", -1), b = v.Add("b", -2);
  const int32_t ab = v.Add("ab", -5), ba = v.Add("ba", -4), aa = v.Add("aa", -3);
  const SpmTokenizer t = v.Build();
  EXPECT_EQ(*t.Encode("aba"), (std::vector<int32_t>{a, ba}));  // "ba" outscores "ab"
  EXPECT_EQ(*t.Encode("ab"), (std::vector<int32_t>{ab}));
  EXPECT_EQ(*t.Encode("aaa"), (std::vector<int32_t>{aa, a}));  // tie: the leftmost pair
  EXPECT_EQ(*t.Encode("b"), (std::vector<int32_t>{b}));
  EXPECT_EQ(*t.Encode(""), (std::vector<int32_t>{}));
}

TEST(SpmTokenizer, MatchesNaiveReferenceOnRandomVocabularies) {
  std::mt19937 rng(7);
  // 'd' and "é" are never pieces: byte fallback.
  const std::vector<std::string> alphabet = {"a", "b", "c", " ", "d", "\xC3\xA9", "\xE6\x97\xA5"};
  for (int table = 0; table < 20; ++table) {
    TinySpm v;
    std::vector<std::string> known = {"a", "b", "c", kSpace, "\xE6\x97\xA5"};
    for (const auto& k : known) v.Add(k, -100.0f - static_cast<float>(rng() % 50));
    while (known.size() < 45) {
      const std::string p = known[rng() % known.size()] + known[rng() % known.size()];
      if (p.size() > 10 || v.id_of.count(p)) continue;
      // Coarse scores, so that ties happen.
      v.Add(p, -static_cast<float>(rng() % 8));
      known.push_back(p);
    }
    const SpmTokenizer t = v.Build();
    for (int trial = 0; trial < 50; ++trial) {
      std::string text;
      const size_t len = rng() % 40;
      for (size_t i = 0; i < len; ++i) text += alphabet[rng() % alphabet.size()];
      auto got = t.Encode(text);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      ASSERT_EQ(*got, NaiveSpm(v, text)) << "table " << table << " text '" << text << "'";
      ASSERT_EQ(*t.Decode(*got), text);
    }
  }
}

TEST(SpmTokenizer, SpacesAndTheSpacePrefix) {
  TinySpm v;
  const int32_t sp = v.Add(kSpace, -10), a = v.Add("a", -1), spa = v.Add(kSpace + "a", -2);
  const int32_t ctl = v.Add("<c>", 0, kTokenTypeControl);
  SpmTokenizer plain = v.Build();
  EXPECT_EQ(*plain.Encode("a a"), (std::vector<int32_t>{a, spa}));
  EXPECT_EQ(*plain.Encode("  a"), (std::vector<int32_t>{sp, spa}));
  EXPECT_EQ(*plain.Decode(std::vector<int32_t>{sp, spa}), "  a");
  // Tabs and newlines stay as they are (here: byte fallback).
  EXPECT_EQ(*plain.Encode("\t\n"), (std::vector<int32_t>{v.Byte('\t'), v.Byte('\n')}));

  v.vocab.add_space_prefix = true;
  const SpmTokenizer prefixed = v.Build();
  EXPECT_TRUE(prefixed.add_space_prefix());
  EXPECT_EQ(*prefixed.Encode("a a"), (std::vector<int32_t>{spa, spa}));
  // A space in front after a special token as well.
  EXPECT_EQ(*prefixed.Encode("a<c>a", {.parse_special = true}),
            (std::vector<int32_t>{spa, ctl, spa}));
  EXPECT_EQ(*prefixed.Encode(""), (std::vector<int32_t>{}));
  // Decode drops the prefix of the first token (after a leading BOS).
  EXPECT_EQ(*prefixed.Decode(std::vector<int32_t>{spa, spa}), "a a");
  EXPECT_EQ(*prefixed.Decode(std::vector<int32_t>{1, spa}), "<s>a");
}

TEST(SpmTokenizer, ByteFallbackAndInvalidUtf8) {
  TinySpm v;
  const int32_t a = v.Add("a", -1);
  const int32_t e_acute = v.Add("\xC3\xA9", -1);
  const SpmTokenizer t = v.Build();
  // A character the vocabulary lacks: its bytes.
  EXPECT_EQ(*t.Encode("\xE6\x97\xA5" "a"),
            (std::vector<int32_t>{v.Byte(0xE6), v.Byte(0x97), v.Byte(0xA5), a}));
  EXPECT_EQ(*t.Encode("\xC3\xA9"), (std::vector<int32_t>{e_acute}));
  // A lead byte takes the bytes after it, whatever they are (as llama.cpp
  // splits); a lone continuation byte is one symbol.
  EXPECT_EQ(*t.Encode("\xC3" "a"), (std::vector<int32_t>{v.Byte(0xC3), v.Byte('a')}));
  EXPECT_EQ(*t.Encode("\x80" "a"), (std::vector<int32_t>{v.Byte(0x80), a}));
  EXPECT_EQ(*t.Encode("a\xF0"), (std::vector<int32_t>{a, v.Byte(0xF0)}));
  EXPECT_EQ(*t.Encode("\xFF\xFF"), (std::vector<int32_t>{v.Byte(0xFF), v.Byte(0xFF)}));
  EXPECT_EQ(*t.Decode(std::vector<int32_t>{v.Byte(0xC3), v.Byte(0xA9)}), "\xC3\xA9");
}

TEST(SpmTokenizer, RoundTripsArbitraryBytes) {
  TinySpm v;
  v.Add("a", -1);
  v.Add(kSpace, -2);
  v.Add(kSpace + "a", -3);
  v.Add("\xC3\xA9", -1);
  v.Add("<c>", 0, kTokenTypeControl);
  v.Add("\n\n", 0, kTokenTypeUserDefined);
  const SpmTokenizer t = v.Build();
  std::mt19937 rng(3);
  // Any bytes but spaces (an invalid lead byte takes the bytes after it:
  // before a space, part of its mark, and the space comes back as bytes of
  // U+2581), and valid UTF-8 with spaces.
  const std::vector<std::string> chars = {"<c>", " ", "\n", "a", "\xC3\xA9", "\xE6\x97\xA5",
                                          "\xF0\x9F\x98\x80"};
  for (int trial = 0; trial < 600; ++trial) {
    std::string text;
    const size_t len = rng() % 24;
    for (size_t i = 0; i < len; ++i) {
      const uint32_t r = rng() % 8;
      if (trial % 2 == 0) {
        text += chars[rng() % chars.size()];
      } else if (r == 0) {
        text += "<c>";
      } else if (r == 1) {
        text += "\n";
      } else {
        const char c = static_cast<char>(rng() % 256);
        text.push_back(c == ' ' ? '.' : c);
      }
    }
    for (bool special : {false, true}) {
      auto ids = t.Encode(text, {.parse_special = special});
      ASSERT_TRUE(ids.ok()) << ids.status().ToString();
      auto back = t.Decode(*ids);
      ASSERT_TRUE(back.ok());
      EXPECT_EQ(*back, text);
    }
  }
}

TEST(SpmTokenizer, SpecialTokensWhichAndInWhichOrder) {
  TinySpm v;
  const int32_t a = v.Add("a", -1), c = v.Add("c", -1), d = v.Add("d", -1);
  const int32_t ab = v.Add("ab", 0, kTokenTypeControl);
  const int32_t bcd = v.Add("bcd", 0, kTokenTypeControl);
  const int32_t nl = v.Add("\n", 0, kTokenTypeUserDefined);
  const int32_t nl2 = v.Add("\n\n", 0, kTokenTypeUserDefined);
  const SpmTokenizer t = v.Build();
  EXPECT_TRUE(t.is_special(ab));
  EXPECT_TRUE(t.is_special(0));  // unknown
  EXPECT_FALSE(t.is_special(a));
  EXPECT_FALSE(t.is_special(-1));
  EXPECT_EQ(*t.SpecialId("bcd"), bcd);
  EXPECT_EQ(t.SpecialId("a").status().code(), StatusCode::kNotFound);
  // Control tokens only with parse_special; the longest token is cut first
  // everywhere, then the shorter ones in what is left.
  EXPECT_EQ(*t.Encode("abcd", {.parse_special = true}), (std::vector<int32_t>{a, bcd}));
  EXPECT_EQ(*t.Encode("abab", {.parse_special = true}), (std::vector<int32_t>{ab, ab}));
  EXPECT_EQ(*t.Encode("bcd", {.parse_special = false}),
            (std::vector<int32_t>{v.Byte('b'), c, d}));
  // Merging may still make a special token's piece (as llama.cpp's does).
  EXPECT_EQ(*t.Encode("ab", {.parse_special = false}), (std::vector<int32_t>{ab}));
  EXPECT_EQ(*t.Encode("<unk>", {.parse_special = true}), (std::vector<int32_t>{0}));
  // User-defined tokens always; leftmost non-overlapping, longest first.
  EXPECT_EQ(*t.Encode("c\n\n\nd"), (std::vector<int32_t>{c, nl2, nl, d}));
  EXPECT_EQ(*t.Encode("\n\n\n\n"), (std::vector<int32_t>{nl2, nl2}));
}

TEST(SpmTokenizer, BosEosOptions) {
  TinySpm v;
  const int32_t a = v.Add("a", -1);
  const SpmTokenizer t = v.Build();
  EXPECT_EQ(*t.Encode("a", {.bos = true, .eos = true}), (std::vector<int32_t>{1, a, 2}));
  EXPECT_EQ(*t.Encode("", {.bos = true}), (std::vector<int32_t>{1}));
  v.vocab.bos_id = -1;
  const SpmTokenizer none = v.Build();
  EXPECT_EQ(none.Encode("a", {.bos = true}).status().code(), StatusCode::kInvalidArgument);
}

TEST(SpmTokenizer, ByteWithoutTokenIsAnError) {
  SpmVocab v;
  v.tokens = {"<unk>", "<s>", "</s>", "a", "\xE2\x96\x81"};
  const SpmTokenizer t = *SpmTokenizer::Create(v);
  EXPECT_EQ(*t.Encode("a a"), (std::vector<int32_t>{3, 4, 3}));
  auto bad = t.Encode("a b");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("0x62 at offset 2"), std::string::npos)
      << bad.status().ToString();
  // Without "<0xNN>" the piece of the byte itself is the fallback.
  v.tokens.push_back("\xC3");
  v.tokens.push_back("\x80");
  const SpmTokenizer t2 = *SpmTokenizer::Create(v);
  EXPECT_EQ(*t2.Encode("\xC3\x80" "a"), (std::vector<int32_t>{5, 6, 3}));
}

TEST(SpmTokenizer, DecodeRejectsBadIds) {
  TinySpm v;
  v.Add("a", -1);
  const SpmTokenizer t = v.Build();
  EXPECT_EQ(t.DecodeToken(-1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t.DecodeToken(static_cast<int32_t>(t.vocab_size())).status().code(),
            StatusCode::kInvalidArgument);
  auto bad = t.Decode(std::vector<int32_t>{259, 100000});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("position 1"), std::string::npos);
  EXPECT_EQ(*t.DecodeToken(3 + 'x'), "x");
  EXPECT_EQ(*t.DecodeToken(1), "<s>");
}

TEST(SpmTokenizer, CreateRejectsMalformedVocabularies) {
  auto code = [](const SpmVocab& v) { return SpmTokenizer::Create(v).status().code(); };
  TinySpm good;
  good.Add("a", -1);
  EXPECT_TRUE(SpmTokenizer::Create(good.vocab).ok());
  EXPECT_EQ(code(SpmVocab{}), StatusCode::kInvalidArgument);
  {
    SpmVocab v = good.vocab;
    v.tokens.push_back("a");  // repeated
    v.scores.push_back(0);
    v.token_types.push_back(kTokenTypeNormal);
    EXPECT_EQ(code(v), StatusCode::kCorruption);
  }
  {
    SpmVocab v = good.vocab;
    v.tokens[259] = "";
    EXPECT_EQ(code(v), StatusCode::kCorruption);
  }
  {
    SpmVocab v = good.vocab;
    v.token_types[259] = kTokenTypeByte;  // "a" is no <0xNN>
    EXPECT_EQ(code(v), StatusCode::kCorruption);
  }
  {
    SpmVocab v = good.vocab;
    v.scores.pop_back();
    EXPECT_EQ(code(v), StatusCode::kCorruption);
  }
  {
    SpmVocab v = good.vocab;
    v.token_types.pop_back();
    EXPECT_EQ(code(v), StatusCode::kCorruption);
  }
  {
    SpmVocab v = good.vocab;
    v.eos_id = 260;
    EXPECT_EQ(code(v), StatusCode::kCorruption);
  }
}

// The tokenizer GgufTokenizer reads from a GGUF file with the given
// tokenizer.ggml.model and a tiny vocabulary.
Result<GgufTokenizer> LoadTiny(const std::string& model) {
  testing::GgufWriter w;
  w.KvStr("tokenizer.ggml.model", model);
  w.KvStrArray("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a", "b", "ab", "\xE2\x96\x81"});
  w.KvF32Array("tokenizer.ggml.scores", {0, 0, 0, -1, -2, -0.5f, -3});
  w.KvI32Array("tokenizer.ggml.token_type", {2, 3, 3, 1, 1, 1, 1});
  w.KvBool("tokenizer.ggml.add_space_prefix", false);
  KV_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::FromBytes(w.Build(), "tiny.gguf"));
  return GgufTokenizer::FromGguf(*file);
}

TEST(GgufTokenizer, PicksTheKindByModel) {
  auto t = LoadTiny("llama");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_NE(t->spm(), nullptr);
  EXPECT_EQ(t->bpe(), nullptr);
  EXPECT_EQ(t->model_name(), "llama");
  EXPECT_EQ(t->vocab_size(), 7u);
  EXPECT_EQ(t->bos_id(), 1);  // llama.cpp's defaults when the keys are absent
  EXPECT_EQ(t->eos_id(), 2);
  EXPECT_TRUE(t->add_bos());
  EXPECT_EQ(*t->Encode("ab a", {.bos = true}), (std::vector<int32_t>{1, 5, 6, 3}));
  EXPECT_EQ(*t->Decode(std::vector<int32_t>{5, 6, 3}), "ab a");

  auto bad = LoadTiny("t5");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(bad.status().message().find("'t5'"), std::string::npos);
}

}  // namespace
}  // namespace kvcache::model
