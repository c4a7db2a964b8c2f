// The SentencePiece encoding of one run of plain text, the slow, obvious
// way (O(n^2)): spaces as U+2581, characters split by the lead byte alone
// (as llama.cpp splits), then the adjacent pair whose concatenation is a
// piece with the best score merged, leftmost on ties, until none is left;
// symbols that are no piece as their bytes' "<0xNN>" tokens. The reference
// of the spm fuzz target and of tests/model/spm_tokenizer_test.cc.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace kvcache::fuzz {

inline constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581

// Piece text -> id, and the score of each id.
struct SpmPieces {
  const std::map<std::string, int32_t>* id_of;
  const std::vector<float>* scores;
};

// `run` with its spaces as U+2581 (and one in front with space_prefix).
inline std::string EscapeSpaces(std::string_view run, bool space_prefix) {
  std::string text(space_prefix ? kSpaceMark : "");
  for (char c : run) {
    if (c == ' ') {
      text += kSpaceMark;
    } else {
      text.push_back(c);
    }
  }
  return text;
}

// Characters by the lead byte alone, the last cut at the end.
inline std::vector<std::string> SplitByLeadByte(std::string_view text) {
  std::vector<std::string> sym;
  for (size_t i = 0; i < text.size();) {
    const uint8_t b = static_cast<uint8_t>(text[i]);
    const size_t len = std::min<size_t>(b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1,
                                        text.size() - i);
    sym.emplace_back(text.substr(i, len));
    i += len;
  }
  return sym;
}

inline std::vector<int32_t> ReferenceSpmRun(const SpmPieces& pieces, std::string_view run,
                                            bool space_prefix) {
  std::vector<std::string> sym = SplitByLeadByte(EscapeSpaces(run, space_prefix));
  for (;;) {
    int best = -1;
    float best_score = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      auto it = pieces.id_of->find(sym[i] + sym[i + 1]);
      if (it == pieces.id_of->end()) continue;
      const float s = (*pieces.scores)[it->second];
      if (best < 0 || s > best_score) {
        best = static_cast<int>(i);
        best_score = s;
      }
    }
    if (best < 0) break;
    sym[best] += sym[best + 1];
    sym.erase(sym.begin() + best + 1);
  }
  std::vector<int32_t> ids;
  for (const std::string& s : sym) {
    auto it = pieces.id_of->find(s);
    if (it != pieces.id_of->end()) {
      ids.push_back(it->second);
      continue;
    }
    for (unsigned char c : s) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "<0x%02X>", c);
      ids.push_back(pieces.id_of->at(hex));
    }
  }
  return ids;
}

}  // namespace kvcache::fuzz
