// The text side of a request's output: each generated token's piece is
// appended, and what may be shown is released while the rest is held back --
// the longest tail that could still begin a stop string, and a trailing
// incomplete UTF-8 character. When a stop string appears, the text before
// its first occurrence is released and the rest (the stop string included)
// is dropped.
//
// Thread safety: one thread at a time.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kvcache::engine {

class StopText {
 public:
  explicit StopText(std::vector<std::string> stops) : stops_(std::move(stops)) {}

  // Appends a piece; returns the text released by it. Sets *stopped when a
  // stop string completed (nothing more is ever released then).
  std::string Add(std::string_view piece, bool* stopped);
  // The held-back text, released at the end of a request not ended by a
  // stop string.
  std::string TakeHeld();

 private:
  // Bytes at the end of held_ that may not be released yet.
  size_t HoldBack() const;
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

// The length of the trailing incomplete UTF-8 sequence of text (0 .. 3).
size_t IncompleteUtf8Tail(std::string_view text);

}  // namespace kvcache::engine
