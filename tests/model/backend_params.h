// The KV backends the model tests run on: the naive reference and the
// kvcache cache in its layouts. A backend that is not built yet makes the
// test skip rather than fail.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/kv/kv_factory.h"

namespace kvcache::model::testing {

struct BackendParam {
  std::string name;
  KvBackendOptions options;
};

inline void PrintTo(const BackendParam& p, std::ostream* os) { *os << p.name; }

inline std::vector<BackendParam> AllBackends() {
  std::vector<BackendParam> out;
  KvBackendOptions o;
  o.kind = BackendKind::kNaive;
  out.push_back({"naive", o});
  o.kind = BackendKind::kCache;
  o.layout = CacheLayout::kContiguous;
  out.push_back({"contiguous", o});
  o.layout = CacheLayout::kPaged;
  o.block_size = 16;
  out.push_back({"paged16", o});
  o.block_size = 4;
  out.push_back({"paged4", o});
  return out;
}

inline std::string BackendName(const ::testing::TestParamInfo<BackendParam>& info) {
  return info.param.name;
}

// Creates a backend or skips the test if it is not built yet.
#define KV_CREATE_OR_SKIP(var, shape, options)                                      \
  auto var##_result = CreateKvBackend((shape), (options));                          \
  if (!var##_result.ok() && var##_result.status().code() == StatusCode::kUnimplemented) \
    GTEST_SKIP() << var##_result.status().ToString();                              \
  ASSERT_TRUE(var##_result.ok()) << var##_result.status().ToString();              \
  std::unique_ptr<KvBackend> var = std::move(var##_result).value()

}  // namespace kvcache::model::testing
