// When a pass-key answer finds its key (kvcache passkey).
#pragma once

#include <string_view>

namespace kvcache::tools {

// Whether `answer` holds `key` as a whole number: an occurrence of the key
// with no digit right before or after it. " 47531. Remember it." and
// " the pass key. 47531 is" hold 47531; " 475312." and " 147531" do not
// (a plain substring test counted a wrong 6-digit answer as found). A key
// stated again after a wrong first number (" 4753. 47531 is") counts.
inline bool AnswerHoldsKey(std::string_view answer, std::string_view key) {
  if (key.empty()) return false;
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  for (size_t at = answer.find(key); at != std::string_view::npos; at = answer.find(key, at + 1)) {
    const size_t end = at + key.size();
    if ((at == 0 || !digit(answer[at - 1])) && (end == answer.size() || !digit(answer[end]))) return true;
  }
  return false;
}

}  // namespace kvcache::tools
