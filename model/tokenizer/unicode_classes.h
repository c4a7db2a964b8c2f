// The little Unicode a byte-level BPE pre-tokenizer needs: UTF-8 decoding
// that never fails (an invalid byte is reported as one byte of its own), the
// character classes of the GPT-2 split pattern (\p{L}, \p{N}, \s, other),
// and lossy UTF-8 repair for showing decoded bytes as text.
//
// Classes: kLetter = general category L* (Lu Ll Lt Lm Lo), kNumber = N* (Nd
// Nl No), from the table scripts/gen_unicode_classes.py generates from
// Python's unicodedata (model/tokenizer/unicode_classes_table.inc, Unicode 14.0);
// kSpace = the White_Space property (U+0009..000D, 0020, 0085, 00A0, 1680,
// 2000..200A, 2028, 2029, 202F, 205F, 3000), which is what Oniguruma's and
// Rust regex's Unicode \s match. Everything else, invalid bytes included, is
// kOther.
//
// Thread safety: pure functions over immutable tables.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvcache::model {

enum class CharClass : uint8_t { kOther = 0, kLetter, kNumber, kSpace };

CharClass ClassOf(char32_t cp);

// One decoded character of a UTF-8 string.
struct Utf8Char {
  char32_t cp = 0;    // the code point; for an invalid byte, the byte itself
  uint8_t bytes = 0;  // its length in bytes (1..4), >= 1 whenever pos < size
  bool valid = false;
};
// The character starting at text[pos] (REQUIRES pos < text.size()). A
// sequence is valid when it is the shortest encoding of a code point that
// is not a surrogate and at most U+10FFFF; otherwise only text[pos] is
// consumed and reported invalid.
Utf8Char DecodeUtf8(std::string_view text, size_t pos);

// `bytes` with each maximal invalid subsequence replaced by U+FFFD (the
// Unicode "maximal subpart" practice, as Python's errors="replace" and
// Rust's String::from_utf8_lossy do).
std::string SanitizeUtf8(std::string_view bytes);

// Appends the UTF-8 encoding of cp (REQUIRES cp <= 0x10FFFF, not a surrogate).
void AppendUtf8(char32_t cp, std::string* out);

}  // namespace kvcache::model
