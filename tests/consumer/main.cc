// A downstream program: uses the installed kvcache through its public headers.
#include <cstdio>

#include "kvcache/codec.h"
#include "kvcache/format.h"
#include "kvcache/geometry.h"

int main() {
  auto g = kvcache::Geometry::Create({.n_layers = 2, .n_kv_heads = 2, .head_dim = 64, .block_size = 16});
  if (!g.ok()) return 1;
  auto codec = kvcache::RowCodec::Create(kvcache::Format::kF32, 64, kvcache::Side::kKey);
  if (!codec.ok()) return 2;
  std::printf("consumer ok: %s, f32 row %zu bytes\n", g->ToString().c_str(), codec->row_bytes());
  return 0;
}
