// Status, Result and Geometry validation.
#include "kvcache/geometry.h"
#include "kvcache/status.h"

#include <gtest/gtest.h>

namespace kvcache {
namespace {

Result<int> Half(int x) {
  if (x % 2 != 0) return Status::InvalidArgument("odd");
  return x / 2;
}

Result<int> Quarter(int x) {
  KV_ASSIGN_OR_RETURN(int h, Half(x));
  KV_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

TEST(Status, OkAndErrors) {
  EXPECT_TRUE(Status::Ok().ok());
  EXPECT_EQ(Status::Ok().ToString(), "OK");
  Status s = Status::PoolExhausted("need 3 blocks, 1 free");
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(s.IsPoolExhausted());
  EXPECT_EQ(s.ToString(), "PoolExhausted: need 3 blocks, 1 free");
}

TEST(Result, PropagatesErrors) {
  EXPECT_EQ(*Quarter(8), 2);
  auto r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

TEST(Geometry, AcceptsSaneValues) {
  auto g = Geometry::Create({.n_layers = 32, .n_kv_heads = 8, .head_dim = 128, .block_size = 16});
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->kv_dim(), 1024u);
  EXPECT_EQ(g->ToString(), "L=32 KVH=8 D=128 B=16");
}

TEST(Geometry, RejectsNonsenseNamingTheField) {
  struct Case {
    GeometryOptions o;
    const char* field;
  } cases[] = {
      {{0, 8, 128, 16}, "n_layers"},
      {{32, 0, 128, 16}, "n_kv_heads"},
      {{32, 8, 0, 16}, "head_dim"},
      {{32, 8, 128, 0}, "block_size"},
      {{32, 8, 5000, 16}, "head_dim"},
      {{2000, 8, 128, 16}, "n_layers"},
  };
  for (const auto& c : cases) {
    auto g = Geometry::Create(c.o);
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(g.status().message().find(c.field), std::string::npos) << g.status().message();
  }
}

}  // namespace
}  // namespace kvcache
