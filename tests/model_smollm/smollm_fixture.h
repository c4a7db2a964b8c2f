// Shared by the SmolLM2 tests: the GGUF file fetched by scripts/fetch_model.sh
// (./run.sh test runs it first), opened once per binary. A test that cannot
// get the model fails saying so; it is never skipped.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "model/gguf.h"
#include "model/model_store.h"

namespace kvcache::model::testing {

inline const GgufFile* SmolLm2Gguf() {
  static std::unique_ptr<GgufFile> file;
  static std::string error;
  static bool once = [] {
    auto f = GgufFile::Open(SmolLm2Path());
    if (f.ok()) {
      file = std::move(f).value();
    } else {
      error = f.status().ToString();
    }
    return true;
  }();
  (void)once;
  EXPECT_NE(file, nullptr) << "SmolLM2 is not available (" << error
                           << "); fetch it with scripts/fetch_model.sh (KVCACHE_MODEL_DIR overrides the folder)";
  return file.get();
}

}  // namespace kvcache::model::testing
