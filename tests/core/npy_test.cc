// .npy reader/writer: round trips for every version and dtype, a byte-exact
// file as NumPy writes it, and every error path on hand-built files.
#include "kvcache/npy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>

namespace kvcache {
namespace {

std::vector<uint8_t> Bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

// A v1.0 file with the given header dict (padded like NumPy) and data bytes.
std::vector<uint8_t> HandBuilt(const std::string& dict, const std::vector<uint8_t>& data, uint8_t major = 1) {
  std::string header = dict;
  const size_t prefix = major == 1 ? 10 : 12;
  while ((prefix + header.size() + 1) % 64 != 0) header.push_back(' ');
  header.push_back('\n');
  std::vector<uint8_t> out = Bytes(std::string("\x93NUMPY", 6));
  out.push_back(major);
  out.push_back(0);
  const size_t len_bytes = major == 1 ? 2 : 4;
  for (size_t i = 0; i < len_bytes; ++i) out.push_back(static_cast<uint8_t>(header.size() >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

std::vector<uint8_t> F32Bytes(std::initializer_list<float> v) {
  std::vector<uint8_t> out(v.size() * 4);
  std::memcpy(out.data(), std::data(v), out.size());
  return out;
}

TEST(Npy, ReadsWhatNumpyWrites) {
  // np.save of np.arange(6, dtype='<f4').reshape(2, 3): a 128-byte header block.
  const auto file = HandBuilt("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
                              F32Bytes({0, 1, 2, 3, 4, 5}));
  ASSERT_EQ(file.size(), 128u + 24u);
  auto a = ParseNpy(file);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->shape, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(a->data, (std::vector<float>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(a->stored_dtype, NpyDtype::kF32);
  // The writer produces exactly these bytes.
  const std::vector<uint64_t> shape = {2, 3};
  const std::vector<float> data = {0, 1, 2, 3, 4, 5};
  auto encoded = EncodeNpy(shape, data);
  ASSERT_TRUE(encoded.ok());
  EXPECT_EQ(*encoded, file);
}

TEST(Npy, RoundTripsEveryVersionAndDtype) {
  const std::vector<float> data = {0.0f, -1.5f, 3.25f, 65504.0f, 1e-7f, -0.0f};
  for (uint8_t version : {1, 2, 3}) {
    for (NpyDtype dtype : {NpyDtype::kF32, NpyDtype::kF16}) {
      for (std::vector<uint64_t> shape : {std::vector<uint64_t>{6}, {1, 2, 3}, {3, 2, 1}}) {
        auto bytes = EncodeNpy(shape, data, {dtype, version});
        ASSERT_TRUE(bytes.ok());
        EXPECT_EQ(bytes->size() % 2, 0u);
        auto a = ParseNpy(*bytes);
        ASSERT_TRUE(a.ok()) << a.status().ToString();
        EXPECT_EQ(a->shape, shape);
        EXPECT_EQ(a->stored_dtype, dtype);
        ASSERT_EQ(a->data.size(), data.size());
        for (size_t i = 0; i < data.size(); ++i) {
          if (dtype == NpyDtype::kF32) {
            EXPECT_EQ(a->data[i], data[i]);
          } else {
            EXPECT_NEAR(a->data[i], data[i], std::abs(data[i]) * 1e-3 + 6e-8) << i;
          }
        }
      }
    }
  }
}

TEST(Npy, HalfDecodingIsExact) {
  // 0x3C00 = 1, 0xC000 = -2, 0x0001 = 2^-24, 0x7BFF = 65504, 0x7C00 = inf, 0x3555 ~ 1/3.
  const std::vector<uint8_t> data = {0x00, 0x3C, 0x00, 0xC0, 0x01, 0x00, 0xFF, 0x7B, 0x00, 0x7C, 0x55, 0x35};
  auto a = ParseNpy(HandBuilt("{'descr': '<f2', 'fortran_order': False, 'shape': (6,), }", data));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->data[0], 1.0f);
  EXPECT_EQ(a->data[1], -2.0f);
  EXPECT_EQ(a->data[2], std::ldexp(1.0f, -24));
  EXPECT_EQ(a->data[3], 65504.0f);
  EXPECT_TRUE(std::isinf(a->data[4]));
  EXPECT_EQ(a->data[5], 0.333251953125f);
}

TEST(Npy, HalfEncodingRoundsToNearestEven) {
  // 1 + 2^-11 is a tie between 1 and 1 + 2^-10: even is 1. 1 + 3*2^-11 -> 1 + 2^-9.
  const std::vector<float> data = {1.0f + std::ldexp(1.0f, -11), 1.0f + 3 * std::ldexp(1.0f, -11), 70000.0f,
                                   std::ldexp(1.0f, -25)};
  const std::vector<uint64_t> shape = {4};
  auto bytes = EncodeNpy(shape, data, {NpyDtype::kF16, 1});
  ASSERT_TRUE(bytes.ok());
  auto a = ParseNpy(*bytes);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->data[0], 1.0f);
  EXPECT_EQ(a->data[1], 1.0f + std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isinf(a->data[2]));
  EXPECT_EQ(a->data[3], 0.0f);  // 2^-25 is a tie between 0 and 2^-24: even is 0
}

TEST(Npy, AcceptsDoubleQuotesScalarsAndAnyKeyOrder) {
  auto a = ParseNpy(HandBuilt("{\"shape\": (), \"fortran_order\": False, \"descr\": \"<f4\"}", F32Bytes({7})));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_TRUE(a->shape.empty());
  EXPECT_EQ(a->data, std::vector<float>{7});
}

void ExpectError(const std::vector<uint8_t>& bytes, StatusCode code, const std::string& needle) {
  auto a = ParseNpy(bytes);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), code) << a.status().ToString();
  EXPECT_NE(a.status().message().find(needle), std::string::npos) << a.status().message();
}

const char kGood[] = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";

TEST(Npy, BadMagic) {
  auto file = HandBuilt(kGood, F32Bytes({1, 2}));
  file[1] = 'X';
  ExpectError(file, StatusCode::kCorruption, "magic");
  ExpectError({}, StatusCode::kCorruption, "magic");
  ExpectError(Bytes("hello"), StatusCode::kCorruption, "magic");
}

TEST(Npy, UnsupportedVersion) {
  auto file = HandBuilt(kGood, F32Bytes({1, 2}));
  file[6] = 4;
  ExpectError(file, StatusCode::kInvalidArgument, "version 4");
}

TEST(Npy, UnsupportedDtypes) {
  for (const char* descr : {"<f8", ">f4", "<i4", "|u1", "|O", "<c8"}) {
    const std::string dict = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (2,), }";
    ExpectError(HandBuilt(dict, F32Bytes({1, 2})), StatusCode::kInvalidArgument, "unsupported dtype");
  }
}

TEST(Npy, FortranOrder) {
  ExpectError(HandBuilt("{'descr': '<f4', 'fortran_order': True, 'shape': (1, 2), }", F32Bytes({1, 2})),
              StatusCode::kInvalidArgument, "fortran_order");
}

TEST(Npy, TruncatedData) {
  auto file = HandBuilt("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", F32Bytes({1, 2}));
  ExpectError(file, StatusCode::kCorruption, "truncated data");
  file = HandBuilt(kGood, F32Bytes({1, 2}));
  file.pop_back();
  ExpectError(file, StatusCode::kCorruption, "truncated data");
}

TEST(Npy, TrailingData) {
  ExpectError(HandBuilt(kGood, F32Bytes({1, 2, 3})), StatusCode::kCorruption, "after the data");
}

TEST(Npy, TruncatedHeader) {
  auto file = HandBuilt(kGood, {});
  file.resize(40);
  ExpectError(file, StatusCode::kCorruption, "truncated header");
  file.resize(9);
  ExpectError(file, StatusCode::kCorruption, "truncated header length");
  // Version 2 needs a 4-byte length.
  auto v2 = HandBuilt(kGood, {}, 2);
  v2.resize(10);
  ExpectError(v2, StatusCode::kCorruption, "truncated header length");
}

TEST(Npy, HeaderGarbage) {
  const std::vector<std::string> bad = {
      "garbage",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), } junk",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)",
      "{'descr': '<f4' 'fortran_order': False, 'shape': (2,)}",
      "{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,)}",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2 3)}",
      "{'descr: '<f4', 'fortran_order': False, 'shape': (2,)}",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999,)}",
      "{'descr': '<f4', 'fortran_order': False}",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'extra': 1}",
      "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}",
      "{'descr': (2,), 'fortran_order': False, 'shape': (2,)}",
      "{'descr': '<f4', 'fortran_order': 'no', 'shape': (2,)}",
      "{'descr': '<f4', 'fortran_order': False, 'shape': '2'}",
  };
  for (const std::string& dict : bad) {
    auto a = ParseNpy(HandBuilt(dict, F32Bytes({1, 2})));
    ASSERT_FALSE(a.ok()) << dict;
    EXPECT_EQ(a.status().code(), StatusCode::kCorruption) << dict << ": " << a.status().ToString();
    EXPECT_NE(a.status().message().find("header"), std::string::npos) << a.status().message();
  }
}

TEST(Npy, ShapeTooLarge) {
  ExpectError(HandBuilt("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", {}),
              StatusCode::kInvalidArgument, "too large");
}

TEST(Npy, WriterRejectsShapeMismatchAndBadVersion) {
  const std::vector<uint64_t> shape = {2, 2};
  const std::vector<float> data = {1, 2, 3};
  auto a = EncodeNpy(shape, data);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
  const std::vector<float> four = {1, 2, 3, 4};
  EXPECT_FALSE(EncodeNpy(shape, four, {NpyDtype::kF32, 4}).ok());
}

TEST(Npy, FileRoundTripAndMissingFile) {
  const std::string path = testing::TempDir() + "/npy_test_roundtrip.npy";
  const std::vector<uint64_t> shape = {2, 1, 2};
  const std::vector<float> data = {1, 2, 3, 4};
  ASSERT_TRUE(WriteNpy(path, shape, data).ok());
  auto a = ReadNpy(path);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->data, data);
  std::filesystem::remove(path);
  auto missing = ReadNpy(path);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kIoError);
  EXPECT_FALSE(WriteNpy("/nonexistent-dir/x.npy", shape, data).ok());
}

}  // namespace
}  // namespace kvcache
