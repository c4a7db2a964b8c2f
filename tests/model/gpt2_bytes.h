// GPT-2's byte alphabet for the BPE tokenizer tests, written out the plain
// way (independently of the tokenizer's own table).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/tokenizer/unicode_classes.h"

namespace kvcache::model::testing {

// The UTF-8 text of byte b's character in GPT-2's byte alphabet.
inline std::string MapByte(uint8_t b) {
  static const std::vector<char32_t> table = [] {
    std::vector<char32_t> t(256);
    char32_t next = 256;
    for (int i = 0; i < 256; ++i) {
      bool self = (i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174 && i <= 255);
      t[i] = self ? i : next++;
    }
    return t;
  }();
  std::string s;
  AppendUtf8(table[b], &s);
  return s;
}

}  // namespace kvcache::model::testing
