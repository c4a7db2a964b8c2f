// The README's "Pool and caches" example, compiled and run (smaller pool).
#include <gtest/gtest.h>

#include <vector>

#include "kvcache/cache.h"

namespace kvcache {
namespace {

Status ReadmeExample() {
  const uint32_t prompt_len = 20, max_new = 12;
  auto geometry = *Geometry::Create({.n_layers = 32, .n_kv_heads = 8, .head_dim = 128});
  auto formats = *ParseFormatPair("bf16:turbo4");
  auto pool = *BlockPool::Create(
      geometry, formats, {.num_blocks = BlockPool::BlocksForBytes(geometry, formats, 1ull << 26)});

  auto seq = SequenceCache::CreatePaged(pool, {.reserve_tokens = prompt_len + max_new});
  if (!seq.ok()) return seq.status();

  const size_t per_token = size_t{geometry.n_layers()} * geometry.kv_dim();
  std::vector<float> prompt_k(prompt_len * per_token, 0.5f), prompt_v = prompt_k;
  std::vector<float> step_k(per_token, -0.25f), step_v = step_k;
  KV_RETURN_IF_ERROR(seq->Append(prompt_k, prompt_v));
  KV_RETURN_IF_ERROR(seq->Append(step_k, step_v));
  auto view = seq->View(0);
  if (!view.ok() || view->num_tokens != prompt_len + 1) return Status::Internal("view");

  auto sample = seq->Fork();
  if (!sample.ok()) return sample.status();
  KV_RETURN_IF_ERROR(sample->TruncateLast(3));

  seq->Release();
  sample->Release();
  if (pool->num_used_blocks() != 0 || pool->num_reserved_blocks() != 0) {
    return Status::Internal("leak");
  }
  return pool->CheckInvariants();
}

TEST(ReadmeExampleTest, Runs) {
  const Status s = ReadmeExample();
  if (s.code() == StatusCode::kUnimplemented) GTEST_SKIP() << s.ToString();
  EXPECT_TRUE(s.ok()) << s.ToString();
}

}  // namespace
}  // namespace kvcache
