// Shared test fixture: stories260K and its tokenizer, loaded once per binary
// from the repository's testdata/ (KVCACHE_TESTDATA_DIR).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "model/io/checkpoint.h"
#include "model/tokenizer/tokenizer.h"
#include "tools/demo_report.h"

namespace kvcache::model::testing {

inline const std::string& ModelDir() {
  static const std::string dir = std::string(KVCACHE_TESTDATA_DIR) + "/stories260K/";
  return dir;
}

struct Loaded {
  Model model;
  Tokenizer tokenizer;
};

// Loads once; fails the calling test if the files are missing.
inline const Loaded* Stories260K() {
  static std::unique_ptr<Loaded> loaded = [] {
    auto m = LoadModel(ModelDir() + "stories260K_v1.bin");
    if (!m.ok()) return std::unique_ptr<Loaded>();
    auto t = Tokenizer::Load(ModelDir() + "tokenizer.bin", m->config().vocab_size);
    if (!t.ok()) return std::unique_ptr<Loaded>();
    return std::unique_ptr<Loaded>(new Loaded{std::move(m).value(), std::move(t).value()});
  }();
  EXPECT_NE(loaded, nullptr) << "cannot load stories260K from " << ModelDir();
  return loaded.get();
}

// The demo's short story (written for this project, not from a data set).
inline const char* const kStoryText = tools::DemoStoryText().data();

}  // namespace kvcache::model::testing
