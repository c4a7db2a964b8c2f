// Shared by the SmolLM2 tests: the GGUF file fetched by scripts/fetch_model.sh
// (./run.sh test runs it first), opened once per binary. A test that cannot
// get the model fails saying so; it is never skipped.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "model/io/gguf.h"
#include "model/io/model_store.h"

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

#include <fstream>
#include <sstream>
#include <vector>

#include "loaded_models.h"
#include "model/decoder/loaded_model.h"

namespace kvcache::model::testing {

// Capacity the SmolLM2 tests load the model with (the caches size to it).
inline constexpr uint32_t kSmolTestSeqLen = 640;

// SmolLM2 with its tokenizer, loaded once per input mode (weights as
// stored; exact f32 products, the integer-lane int8 path or the bf16
// products); fails the
// calling test with the reason when it cannot be loaded.
inline const LoadedModel* SmolLm2(MatMulInputs inputs = MatMulInputs::kF32) {
  return LoadOnce(SmolLm2Path(), kSmolTestSeqLen, inputs,
                  "fetch it with scripts/fetch_model.sh (KVCACHE_MODEL_DIR overrides the folder)");
}

inline std::vector<int32_t> Gpl3Tokens(const LoadedModel& m, size_t n) {
  std::ifstream in("/usr/share/common-licenses/GPL-3", std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read /usr/share/common-licenses/GPL-3";
  std::ostringstream ss;
  ss << in.rdbuf();
  // ~4.5 bytes a token: read a little more than needed.
  auto ids = m.Encode(ss.str().substr(0, n * 8));
  EXPECT_TRUE(ids.ok()) << ids.status().ToString();
  std::vector<int32_t> out = ids.ok() ? std::move(ids).value() : std::vector<int32_t>{};
  EXPECT_GE(out.size(), n);
  if (out.size() > n) out.resize(n);
  return out;
}

}  // namespace kvcache::model::testing
