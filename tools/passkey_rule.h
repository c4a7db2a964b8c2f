// The pass key's rules (kvcache passkey): how a prompt is laid out, and
// when an answer finds its key.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

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

// A prompt is BOS, `before` whole passes of the filler, the key's sentence,
// the other passes (of `passes` in all), the question: it is cut only
// between passes, never inside a sentence, so the key's sentence and the
// question always follow a whole one.

// How many whole passes of a `pass`-token filler fit a prompt of at most
// `context` tokens beside `fixed` others (BOS, the question, the room set
// aside for the key's sentence); 0 where not even one does.
inline size_t PasskeyPasses(size_t context, size_t fixed, size_t pass) {
  return pass == 0 || fixed > context ? 0 : (context - fixed) / pass;
}

// BOS and the first `before` passes: the part every trial at a depth shares.
inline std::vector<int32_t> PasskeyPrefix(const std::vector<int32_t>& bos, const std::vector<int32_t>& filler,
                                          size_t before) {
  std::vector<int32_t> prefix(bos);
  for (size_t i = 0; i < before; ++i) prefix.insert(prefix.end(), filler.begin(), filler.end());
  return prefix;
}

// The rest of the prompt: the key's sentence, the passes after it, the
// question.
inline std::vector<int32_t> PasskeyRest(const std::vector<int32_t>& sentence, const std::vector<int32_t>& filler,
                                        size_t passes, size_t before, const std::vector<int32_t>& question) {
  std::vector<int32_t> rest(sentence);
  for (size_t i = before; i < passes; ++i) rest.insert(rest.end(), filler.begin(), filler.end());
  rest.insert(rest.end(), question.begin(), question.end());
  return rest;
}

}  // namespace kvcache::tools
