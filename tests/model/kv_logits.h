// The teacher-forced logits of a token run through a fresh KV backend, for
// tests that compare backends; fails the calling test on an error.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "model/decoder/decoder.h"
#include "model/generate/perplexity.h"
#include "model/kv/kv_factory.h"

namespace kvcache::model::testing {

inline std::vector<float> KvLogits(Decoder& d, const KvBackendOptions& kv_options, std::span<const int32_t> tokens,
                                   uint32_t chunk) {
  auto kv = CreateKvBackend(d.attention_shape(), kv_options);
  EXPECT_TRUE(kv.ok()) << kv.status().ToString();
  if (!kv.ok()) return {};
  PerplexityOptions p;
  p.chunk_tokens = chunk;
  auto l = TeacherForcedLogits(d, **kv, tokens, p);
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  return l.ok() ? std::move(l).value() : std::vector<float>{};
}

}  // namespace kvcache::model::testing
