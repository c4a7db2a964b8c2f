// StopText: stop strings and the UTF-8 hold-back.
#include "engine/stop_text.h"

#include <algorithm>

namespace kvcache::engine {

size_t IncompleteUtf8Tail(std::string_view text) {
  // Walk back over at most 3 continuation bytes to a lead byte.
  const size_t n = text.size();
  for (size_t back = 1; back <= std::min<size_t>(4, n); ++back) {
    const unsigned char c = static_cast<unsigned char>(text[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation
    size_t want = 1;
    if ((c & 0xE0) == 0xC0) {
      want = 2;
    } else if ((c & 0xF0) == 0xE0) {
      want = 3;
    } else if ((c & 0xF8) == 0xF0) {
      want = 4;
    }
    return want > back ? back : 0;
  }
  return 0;  // only continuation bytes: malformed, release them
}

size_t StopText::HoldBack() const {
  size_t hold = IncompleteUtf8Tail(held_);
  for (const std::string& s : stops_) {
    // The longest proper prefix of s that ends held_.
    for (size_t len = std::min(s.size() - 1, held_.size()); len > hold; --len) {
      if (std::string_view(held_).substr(held_.size() - len) == std::string_view(s).substr(0, len)) {
        hold = len;
        break;
      }
    }
  }
  return hold;
}

std::string StopText::Add(std::string_view piece, bool* stopped) {
  *stopped = stopped_;
  if (stopped_) return {};
  held_.append(piece);
  size_t cut = std::string::npos;
  for (const std::string& s : stops_) cut = std::min(cut, held_.find(s));
  std::string out;
  if (cut != std::string::npos) {
    out = held_.substr(0, cut);
    held_.clear();
    stopped_ = true;
    *stopped = true;
    return out;
  }
  const size_t release = held_.size() - HoldBack();
  out = held_.substr(0, release);
  held_.erase(0, release);
  return out;
}

std::string StopText::TakeHeld() {
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace kvcache::engine
