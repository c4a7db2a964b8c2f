// The real models' tests load each model once per product kind and binary:
// LoadOnce(path, seq_len, inputs) keeps every (path, seq_len, inputs) it
// loaded (a test that asks for a longer context than another gets its own
// copy, whichever test runs first), and fails the calling test with the
// reason (and `hint`) when it cannot load.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "model/decoder/loaded_model.h"

namespace kvcache::model::testing {

inline const LoadedModel* LoadOnce(const std::string& path, uint32_t seq_len, MatMulInputs inputs,
                                   const std::string& hint) {
  struct Loaded {
    std::unique_ptr<LoadedModel> model;
    std::string error;
  };
  static std::map<std::tuple<std::string, uint32_t, MatMulInputs>, Loaded> loaded;
  auto [it, fresh] = loaded.try_emplace({path, seq_len, inputs});
  if (fresh) {
    GgufLoadOptions o;
    o.max_seq_len = seq_len;
    o.matmul_inputs = inputs;
    auto m = LoadedModel::Load(path, "", o);
    if (m.ok()) {
      it->second.model = std::move(m).value();
    } else {
      it->second.error = m.status().ToString();
    }
  }
  EXPECT_NE(it->second.model, nullptr) << path << " is not available (" << it->second.error << "); " << hint;
  return it->second.model.get();
}

}  // namespace kvcache::model::testing
