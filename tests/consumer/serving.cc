// A downstream program of the serving layer: a pool and a prefix cache over
// it, through the installed public headers.
#include <cstdio>

#include "kvcache/pool.h"
#include "kvcache/serving/prefix_cache.h"

int main() {
  auto g = kvcache::Geometry::Create({.n_layers = 2, .n_kv_heads = 2, .head_dim = 64, .block_size = 16});
  if (!g.ok()) return 1;
  auto pool = kvcache::BlockPool::Create(*g, {kvcache::Format::kBF16, kvcache::Format::kBF16},
                                         {.num_blocks = 8});
  if (!pool.ok()) return 2;
  auto prefix = kvcache::PrefixCache::Create(*pool);
  if (!prefix.ok()) return 3;
  std::printf("consumer_serving ok: %u blocks, prefix cache of block size %u\n",
              (*pool)->num_blocks(), (*prefix)->block_size());
  return 0;
}
