// The Gemma 3 tests' text: Debian's Apache-2.0 license, tokenized and
// repeated to the length a test needs (the tests need tokens, not meaning).
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "model/decoder/loaded_model.h"

namespace kvcache::model::testing {

// n tokens of the license text starting about `skip_words` words in.
inline std::vector<int32_t> ApacheText(const LoadedModel& m, size_t n, size_t skip_words = 0) {
  std::ifstream in("/usr/share/common-licenses/Apache-2.0");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  if (text.empty()) text = "The quick brown fox jumps over the lazy dog. ";
  std::string all;
  for (;;) {
    all += text;
    if (all.size() < 6 * skip_words) continue;
    auto ids = m.Encode(all.substr(6 * skip_words));
    EXPECT_TRUE(ids.ok()) << ids.status().ToString();
    if (!ids.ok()) return {};
    if (ids->size() >= n) {
      ids->resize(n);
      return *ids;
    }
  }
}

}  // namespace kvcache::model::testing
