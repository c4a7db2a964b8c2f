// Character classes by binary search over the generated range table, UTF-8
// decoding and lossy repair.
#include "model/tokenizer/unicode_classes.h"

#include <algorithm>
#include <iterator>

namespace kvcache::model {
namespace {

struct ClassRange {
  char32_t first;
  char32_t last;
  CharClass cls;
};

constexpr ClassRange kRanges[] = {
#include "model/tokenizer/unicode_classes_table.inc"
};

bool IsWhiteSpace(char32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  switch (cp) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

// Length of the longest prefix of text[pos..] that starts a well-formed
// sequence (Unicode table 3-7), and whether it is complete.
struct Prefix {
  uint8_t len;
  bool complete;
  char32_t cp;
};

Prefix ScanUtf8(std::string_view text, size_t pos) {
  const auto b0 = static_cast<uint8_t>(text[pos]);
  if (b0 < 0x80) return {1, true, b0};
  uint8_t need;
  char32_t cp;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1, cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2, cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3, cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // <= U+10FFFF
  } else {
    return {0, false, 0};  // never a lead byte
  }
  uint8_t len = 1;
  for (uint8_t k = 0; k < need; ++k) {
    if (pos + len >= text.size()) return {len, false, 0};
    const auto b = static_cast<uint8_t>(text[pos + len]);
    const uint8_t l = k == 0 ? lo : 0x80, h = k == 0 ? hi : 0xBF;
    if (b < l || b > h) return {len, false, 0};
    cp = (cp << 6) | (b & 0x3F);
    ++len;
  }
  return {len, true, cp};
}

}  // namespace

CharClass ClassOf(char32_t cp) {
  if (cp < 0x80) {
    if (IsWhiteSpace(cp)) return CharClass::kSpace;
    if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return CharClass::kLetter;
    return cp >= '0' && cp <= '9' ? CharClass::kNumber : CharClass::kOther;
  }
  if (IsWhiteSpace(cp)) return CharClass::kSpace;
  auto it = std::upper_bound(std::begin(kRanges), std::end(kRanges), cp,
                             [](char32_t c, const ClassRange& r) { return c < r.first; });
  if (it == std::begin(kRanges)) return CharClass::kOther;
  --it;
  return cp <= it->last ? it->cls : CharClass::kOther;
}

Utf8Char DecodeUtf8(std::string_view text, size_t pos) {
  const Prefix p = ScanUtf8(text, pos);
  if (p.complete) return {p.cp, p.len, true};
  return {static_cast<uint8_t>(text[pos]), 1, false};
}

std::string SanitizeUtf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    const Prefix p = ScanUtf8(bytes, pos);
    if (p.complete) {
      out.append(bytes.substr(pos, p.len));
      pos += p.len;
    } else {
      out.append("\xEF\xBF\xBD");  // U+FFFD for the maximal invalid subpart
      pos += std::max<uint8_t>(p.len, 1);
    }
  }
  return out;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace kvcache::model
