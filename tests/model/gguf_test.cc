// The GGUF reader on files the tests write: every metadata type, typed
// accessors and their errors, tensor lookup and shapes, dequantization
// (hand-computed values, and every SIMD target bit-identical to the scalar
// reference), and broken files (each must fail with a message naming what,
// never crash: every truncation length is tried).
#include "model/io/gguf.h"

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstring>
#include <random>
#include <unistd.h>
#include <string>
#include <vector>

#include "model/gguf_writer.h"
#include "model/tensor/gguf_dequant.h"

namespace kvcache::model {
namespace {

using testing::GgufWriter;

// One file per test and process (a parallel run must not rewrite a file
// another process has mapped).
std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "gguf_test_" + std::to_string(::getpid()) + "_" + name;
}

Result<std::unique_ptr<GgufFile>> OpenBytes(const std::string& name, const std::vector<uint8_t>& b) {
  const std::string p = TempPath(name);
  if (!testing::WriteFile(p, b)) return Status::IoError("cannot write " + p);
  return GgufFile::Open(p);
}

void PutU16(std::vector<uint8_t>& b, uint16_t v) {
  b.push_back(static_cast<uint8_t>(v));
  b.push_back(static_cast<uint8_t>(v >> 8));
}

// Q4_1 block: d = 0.5 (0x3800), m = -1 (0xBC00), nibbles j -> low j%16, high 15-j%16.
std::vector<uint8_t> Q41Block() {
  std::vector<uint8_t> b;
  PutU16(b, 0x3800);
  PutU16(b, 0xBC00);
  for (int j = 0; j < 16; ++j) b.push_back(static_cast<uint8_t>(j | ((15 - j) << 4)));
  return b;
}
// Q8_0 block: d = 0.25 (0x3400), q = j - 16.
std::vector<uint8_t> Q80Block() {
  std::vector<uint8_t> b;
  PutU16(b, 0x3400);
  for (int j = 0; j < 32; ++j) b.push_back(static_cast<uint8_t>(static_cast<int8_t>(j - 16)));
  return b;
}

GgufWriter GoodWriter() {
  GgufWriter w;
  w.KvStr("general.architecture", "llama");
  w.KvRaw("t.u8", 0, {200});
  w.KvRaw("t.i8", 1, {0xFE});  // -2
  w.KvRaw("t.u16", 2, GgufWriter::Bytes(uint16_t{65000}));
  w.KvRaw("t.i16", 3, GgufWriter::Bytes(int16_t{-300}));
  w.KvU32("t.u32", 4000000000u);
  w.KvI32("t.i32", -7);
  w.KvF32("t.f32", 1.5f);
  w.KvBool("t.bool", true);
  w.KvU64("t.u64", 1ull << 40);
  w.KvRaw("t.i64", 11, GgufWriter::Bytes(int64_t{-5}));
  w.KvF64("t.f64", 0.125);
  w.KvStrArray("t.strs", {"a", "", "h\xC3\xA9llo"});
  w.KvI32Array("t.ints", {3, -1, 2});
  w.KvF32Array("t.floats", {0.5f, -2.0f});
  {  // [[1, 2], [3]] as an array of arrays of uint8
    std::vector<uint8_t> v;
    GgufWriter::Pod(v, uint32_t{9});
    GgufWriter::Pod(v, uint64_t{2});
    GgufWriter::Pod(v, uint32_t{0});
    GgufWriter::Pod(v, uint64_t{2});
    v.push_back(1);
    v.push_back(2);
    GgufWriter::Pod(v, uint32_t{0});
    GgufWriter::Pod(v, uint64_t{1});
    v.push_back(3);
    w.KvRaw("t.nested", 9, v);
  }
  std::vector<uint8_t> f32;
  for (float x : {1.0f, -2.5f, 3.25f, 0.0f}) GgufWriter::Pod(f32, x);
  w.AddTensor({"norm", {4}, 0, f32});
  std::vector<uint8_t> f16;
  for (uint16_t h : {0x3C00, 0xC000, 0x0001, 0x7C00}) PutU16(f16, h);  // 1, -2, 2^-24, inf
  w.AddTensor({"half", {4}, 1, f16});
  std::vector<uint8_t> q41 = Q41Block();
  const std::vector<uint8_t> q41b = Q41Block();
  q41.insert(q41.end(), q41b.begin(), q41b.end());
  w.AddTensor({"q41", {32, 2}, 3, q41});
  w.AddTensor({"q80", {32, 1}, 8, Q80Block()});
  return w;
}

TEST(Gguf, ReadsEveryMetadataType) {
  auto f = OpenBytes("good", GoodWriter().Build());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const GgufFile& g = **f;
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.alignment(), 32u);
  EXPECT_EQ(g.metadata().size(), 16u);
  EXPECT_EQ(*g.GetString("general.architecture"), "llama");
  EXPECT_EQ(*g.GetU32("t.u8"), 200u);
  EXPECT_EQ(*g.GetInt("t.i8"), -2);
  EXPECT_EQ(*g.GetU32("t.u16"), 65000u);
  EXPECT_EQ(*g.GetInt("t.i16"), -300);
  EXPECT_EQ(*g.GetU32("t.u32"), 4000000000u);
  EXPECT_EQ(*g.GetInt("t.i32"), -7);
  EXPECT_EQ(*g.GetF32("t.f32"), 1.5f);
  EXPECT_TRUE(*g.GetBool("t.bool"));
  EXPECT_EQ(*g.GetInt("t.u64"), int64_t{1} << 40);
  EXPECT_EQ(*g.GetInt("t.i64"), -5);
  EXPECT_EQ(*g.GetF32("t.f64"), 0.125f);
  EXPECT_EQ(*g.GetStringArray("t.strs"), (std::vector<std::string>{"a", "", "h\xC3\xA9llo"}));
  EXPECT_EQ(*g.GetI32Array("t.ints"), (std::vector<int32_t>{3, -1, 2}));
  EXPECT_EQ(*g.GetF32Array("t.floats"), (std::vector<float>{0.5f, -2.0f}));
  const GgufValue* n = g.Find("t.nested");
  ASSERT_NE(n, nullptr);
  ASSERT_EQ(n->type, GgufType::kArray);
  ASSERT_EQ(n->element_type, GgufType::kArray);
  ASSERT_EQ(n->array.size(), 2u);
  ASSERT_EQ(n->array[0].array.size(), 2u);
  EXPECT_EQ(n->array[0].array[1].u, 2u);
  EXPECT_EQ(n->array[1].array[0].u, 3u);
}

TEST(Gguf, AccessorErrorsNameTheKey) {
  auto f = OpenBytes("good2", GoodWriter().Build());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const GgufFile& g = **f;
  auto missing = g.GetU32("llama.block_count");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("llama.block_count"), std::string::npos);
  auto wrong = g.GetString("t.u32");
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("'t.u32' is uint32, not string"), std::string::npos)
      << wrong.status().message();
  EXPECT_EQ(g.GetU32("t.i32").status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(g.GetU32("t.u64").status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(g.GetF32("t.u32").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(g.GetBool("t.u8").status().code(), StatusCode::kInvalidArgument);
  auto arr = g.GetStringArray("t.ints");
  ASSERT_FALSE(arr.ok());
  EXPECT_NE(arr.status().message().find("array of int32, not array of string"), std::string::npos)
      << arr.status().message();
  EXPECT_EQ(g.GetI32Array("t.strs").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(g.GetI32Array("t.u32").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(g.GetF32Array("t.ints").status().code(), StatusCode::kInvalidArgument);
}

TEST(Gguf, TensorsAndDequantizedValues) {
  auto f = OpenBytes("good3", GoodWriter().Build());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const GgufFile& g = **f;
  ASSERT_EQ(g.tensors().size(), 4u);
  auto q = g.FindTensor("q41");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ((*q)->rows(), 2u);
  EXPECT_EQ((*q)->cols(), 32u);
  EXPECT_EQ((*q)->row_bytes(), 20u);
  EXPECT_EQ((*q)->num_bytes, 40u);
  EXPECT_EQ((*q)->offset % 32, 0u);

  EXPECT_EQ(*g.ReadF32("norm", {4}), (std::vector<float>{1.0f, -2.5f, 3.25f, 0.0f}));
  const std::vector<float> h = *g.ReadF32("half", {4});
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], -2.0f);
  EXPECT_EQ(h[2], std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(h[3]));
  const std::vector<float> v = *g.ReadF32("q41", {32, 2});
  for (int r = 0; r < 2; ++r) {
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(v[r * 32 + j], j * 0.5f - 1.0f);
      EXPECT_EQ(v[r * 32 + 16 + j], (15 - j) * 0.5f - 1.0f);
    }
  }
  const std::vector<float> e = *g.ReadF32("q80", {32, 1});
  for (int j = 0; j < 32; ++j) EXPECT_EQ(e[j], (j - 16) * 0.25f);

  auto shape = g.ReadF32("q41", {32, 3});
  ASSERT_FALSE(shape.ok());
  EXPECT_EQ(shape.status().code(), StatusCode::kCorruption);
  EXPECT_NE(shape.status().message().find("'q41' has shape [32, 2]"), std::string::npos)
      << shape.status().message();
  EXPECT_EQ(g.FindTensor("nope").status().code(), StatusCode::kNotFound);
}

TEST(Gguf, Version2AndCustomAlignment) {
  GgufWriter w = GoodWriter();
  w.KvU32("general.alignment", 64);
  auto f = OpenBytes("v2", w.Build(2, 64));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->version(), 2u);
  EXPECT_EQ((*f)->alignment(), 64u);
  EXPECT_EQ((*f)->data_offset() % 64, 0u);
  EXPECT_EQ(*(*f)->ReadF32("norm", {4}), (std::vector<float>{1.0f, -2.5f, 3.25f, 0.0f}));
}

TEST(Gguf, UnsupportedTypeIsReadButNotDecoded) {
  GgufWriter w;
  w.AddTensor({"k5", {256}, 13, std::vector<uint8_t>(176, 0)});
  auto f = OpenBytes("q5k", w.Build());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  auto r = (*f)->ReadF32("k5", {256});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(r.status().message().find("'k5' has type Q5_K"), std::string::npos) << r.status().message();
}

// Expects a Corruption whose message holds `want`.
void ExpectCorrupt(const std::string& name, const std::vector<uint8_t>& bytes, const std::string& want) {
  auto f = OpenBytes(name, bytes);
  ASSERT_FALSE(f.ok()) << name;
  EXPECT_EQ(f.status().code(), StatusCode::kCorruption) << f.status().ToString();
  EXPECT_NE(f.status().message().find(want), std::string::npos) << f.status().message();
}

TEST(Gguf, BrokenFilesFailNamingWhat) {
  std::vector<uint8_t> good = GoodWriter().Build();
  {
    auto b = good;
    b[0] = 'X';
    ExpectCorrupt("magic", b, "bad magic");
  }
  ExpectCorrupt("v1", GoodWriter().Build(1), "version 1 is not supported");
  {
    GgufWriter w;
    w.AddTensor({"t", {4}, 0, std::vector<uint8_t>(16, 0), 64});
    ExpectCorrupt("offset", w.Build(), "tensor 't' F32 [4] at data offset 64 needs 16 bytes");
  }
  {
    GgufWriter w;
    w.AddTensor({"t", {4}, 0, std::vector<uint8_t>(16, 0), 8});
    ExpectCorrupt("unaligned", w.Build(), "offset 8 is not a multiple of the alignment 32");
  }
  {
    GgufWriter w;
    w.AddTensor({"t", {4}, 99, std::vector<uint8_t>(16, 0)});
    ExpectCorrupt("type", w.Build(), "unknown ggml type 99");
  }
  {
    GgufWriter w;
    w.AddTensor({"t", {48}, 3, std::vector<uint8_t>(40, 0)});
    ExpectCorrupt("blocks", w.Build(), "not a multiple of the block size 32");
  }
  {
    GgufWriter w;
    w.AddTensor({"t", {1, 1, 1, 1, 1}, 0, std::vector<uint8_t>(4, 0)});
    ExpectCorrupt("dims", w.Build(), "has 5 dims");
  }
  {
    GgufWriter w;
    w.AddTensor({"t", {0}, 0, {}});
    ExpectCorrupt("zerodim", w.Build(), "bad dims [0]");
  }
  {
    GgufWriter w;
    w.AddTensor({"t", {4}, 0, std::vector<uint8_t>(16, 0)});
    w.AddTensor({"t", {4}, 0, std::vector<uint8_t>(16, 0)});
    ExpectCorrupt("duptensor", w.Build(), "duplicate tensor 't'");
  }
  {
    GgufWriter w;
    w.KvU32("a", 1);
    w.KvU32("a", 2);
    ExpectCorrupt("dupkey", w.Build(), "duplicate metadata key 'a'");
  }
  {
    GgufWriter w;
    std::vector<uint8_t> v;
    GgufWriter::Pod(v, uint32_t{4});
    GgufWriter::Pod(v, uint64_t{1} << 60);
    w.KvRaw("huge", 9, v);
    ExpectCorrupt("hugearray", w.Build(), "runs past the end");
  }
  {
    GgufWriter w;
    w.KvRaw("b", 7, {2});
    ExpectCorrupt("bool", w.Build(), "bool value 2");
  }
  {
    GgufWriter w;
    w.KvRaw("x", 13, {0, 0, 0, 0});
    ExpectCorrupt("valtype", w.Build(), "unknown value type 13");
  }
  {
    GgufWriter w;
    w.KvU32("general.alignment", 24);
    ExpectCorrupt("align", w.Build(), "general.alignment");
  }
  {
    std::vector<uint8_t> v;
    for (int d = 0; d < 10; ++d) {
      GgufWriter::Pod(v, uint32_t{9});
      GgufWriter::Pod(v, uint64_t{1});
    }
    GgufWriter w;
    w.KvRaw("deep", 9, v);
    ExpectCorrupt("deep", w.Build(), "nested deeper");
  }
  ExpectCorrupt("empty", {}, "bad magic");
}

// Every strict prefix of a good file must be rejected (no crash, no read
// past the end); the message names the file.
TEST(Gguf, EveryTruncationIsAnError) {
  const std::vector<uint8_t> good = GoodWriter().Build();
  const std::string p = "trunc.gguf";
  size_t rejected = 0;
  for (size_t n = 0; n < good.size(); ++n) {
    auto f = GgufFile::FromBytes(std::vector<uint8_t>(good.begin(), good.begin() + n), p);
    // Cutting only the zero padding after the last tensor's data keeps the
    // file valid; anything shorter than the last tensor's end must fail.
    if (!f.ok()) {
      ++rejected;
      EXPECT_EQ(f.status().code(), StatusCode::kCorruption) << n;
      EXPECT_NE(f.status().message().find(p), std::string::npos) << f.status().message();
    }
  }
  // The last tensor (q80, 34 bytes) ends the file exactly: every prefix fails.
  EXPECT_EQ(rejected, good.size());
  EXPECT_TRUE(GgufFile::FromBytes(good, p).ok());
  EXPECT_EQ(GgufFile::Open(TempPath("does_not_exist")).status().code(), StatusCode::kIoError);
}

TEST(GgufDequant, RowErrors) {
  std::vector<uint8_t> src(40, 0);
  std::vector<float> dst(64);
  EXPECT_EQ(DequantizeRow(GgmlType::kQ4_1, src.data(), 48, dst.data()).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(DequantizeRow(GgmlType::kQ5_K, src.data(), 256, dst.data()).code(),
            StatusCode::kUnimplemented);
  EXPECT_EQ(DequantizeRowScalar(GgmlType::kBF16, src.data(), 4, dst.data()).code(),
            StatusCode::kUnimplemented);
}

// Random blocks with finite scales (and F16 rows of finite values).
std::vector<uint8_t> RandomRows(GgmlType t, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const GgmlTypeSize s = GgmlTypeSizeOf(t);
  std::vector<uint8_t> b(n / s.block_values * s.block_bytes);
  for (uint8_t& x : b) x = static_cast<uint8_t>(rng());
  auto finite_half = [&] { return static_cast<uint16_t>(rng() % 0x7C00 | (rng() & 1) << 15); };
  if (t == GgmlType::kF16) {
    for (size_t i = 0; i < n; ++i) {
      const uint16_t h = finite_half();
      std::memcpy(&b[2 * i], &h, 2);
    }
  } else if (t == GgmlType::kQ4_1 || t == GgmlType::kQ8_0) {
    for (size_t blk = 0; blk < n / 32; ++blk) {
      uint8_t* p = &b[blk * s.block_bytes];
      const uint16_t d = finite_half(), m = finite_half();
      std::memcpy(p, &d, 2);
      if (t == GgmlType::kQ4_1) std::memcpy(p + 2, &m, 2);
    }
  } else if (t == GgmlType::kF32) {
    std::normal_distribution<float> nd;
    for (size_t i = 0; i < n; ++i) {
      const float f = nd(rng);
      std::memcpy(&b[4 * i], &f, 4);
    }
  }
  return b;
}

TEST(GgufDequant, EverySimdTargetMatchesScalar) {
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    for (GgmlType t : {GgmlType::kF32, GgmlType::kF16, GgmlType::kQ4_1, GgmlType::kQ8_0}) {
      for (size_t n : {32u, 64u, 576u, 1536u}) {
        SCOPED_TRACE(GgmlTypeName(t) + " n=" + std::to_string(n));
        const std::vector<uint8_t> src = RandomRows(t, n, 77 + n);
        std::vector<float> want(n, -1.0f), got(n, -2.0f);
        ASSERT_TRUE(DequantizeRowScalar(t, src.data(), n, want.data()).ok());
        ASSERT_TRUE(DequantizeRow(t, src.data(), n, got.data()).ok());
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), n * 4));
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

}  // namespace
}  // namespace kvcache::model
