// RespReader (serving/tier/resp_reader.h): RedisTier's reply reader.
#include "serving/tier/resp_reader.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace kvcache {
namespace {

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

TEST(RespReader, PipelinedRepliesParseToTheirValues) {
  RespReader r(1 << 20, 16);  // a tiny staging buffer: every line crosses reads
  const std::string value(5000, 'v');
  ASSERT_TRUE(r.Feed(Bytes("+OK\r\n$5000\r\n" + value + "\r\n$-1\r\n:42\r\n-ERR no\r\n$0\r\n\r\n")));
  RespReply x;
  ASSERT_TRUE(r.Pop(&x));
  EXPECT_EQ(x.type, RespReply::Type::kStatus);
  EXPECT_EQ(x.text, "OK");
  ASSERT_TRUE(r.Pop(&x));
  ASSERT_EQ(x.type, RespReply::Type::kBulk);
  EXPECT_EQ(std::string(x.bulk->begin(), x.bulk->end()), value);
  ASSERT_TRUE(r.Pop(&x));
  EXPECT_EQ(x.type, RespReply::Type::kNil);
  ASSERT_TRUE(r.Pop(&x));
  EXPECT_EQ(x.type, RespReply::Type::kInteger);
  EXPECT_EQ(x.integer, 42);
  ASSERT_TRUE(r.Pop(&x));
  EXPECT_EQ(x.type, RespReply::Type::kError);
  EXPECT_EQ(x.text, "ERR no");
  ASSERT_TRUE(r.Pop(&x));
  ASSERT_EQ(x.type, RespReply::Type::kBulk);
  EXPECT_EQ(x.bulk->size(), 0u);
  EXPECT_FALSE(r.Pop(&x));
  EXPECT_FALSE(r.failed());
}

TEST(RespReader, ABulkPayloadIsReadStraightIntoItsBlob) {
  RespReader r;
  const std::string head = "$100000\r\nabc";
  std::span<uint8_t> b = r.ReadBuffer();
  std::memcpy(b.data(), head.data(), head.size());
  ASSERT_TRUE(r.Commit(head.size()));
  // The rest of the payload: the blob's own memory, exactly what is missing.
  b = r.ReadBuffer();
  ASSERT_EQ(b.size(), 100000u - 3);
  std::memset(b.data(), 'z', b.size());
  ASSERT_TRUE(r.Commit(b.size()));
  ASSERT_TRUE(r.Feed(Bytes("\r\n")));
  RespReply x;
  ASSERT_TRUE(r.Pop(&x));
  ASSERT_EQ(x.type, RespReply::Type::kBulk);
  EXPECT_EQ(x.bulk->data() + 3, b.data());  // no copy: the reply is that memory
  EXPECT_EQ(std::string(x.bulk->begin(), x.bulk->begin() + 4), "abcz");
}

TEST(RespReader, ProtocolErrorsStopTheReaderForGood) {
  for (const std::string bad : {"*1\r\n", "$3\r\nabcXY", "$-2\r\n", ":12a\r\n", "+OK\n",
                                "$99999999999\r\n", "\r\n"}) {
    RespReader r(1 << 20);
    EXPECT_FALSE(r.Feed(Bytes(bad))) << bad;
    EXPECT_TRUE(r.failed()) << bad;
    EXPECT_TRUE(r.ReadBuffer().empty());
    EXPECT_FALSE(r.Feed(Bytes("+OK\r\n")));
  }
  RespReader r(1 << 20, 16);
  EXPECT_FALSE(r.Feed(Bytes("-" + std::string(40, 'E') + "\r\n")));  // longer than staging
  RespReader cut;
  EXPECT_TRUE(cut.Feed(Bytes("$10\r\nabc")));  // incomplete is not an error
  RespReply x;
  EXPECT_FALSE(cut.Pop(&x));
}

}  // namespace
}  // namespace kvcache
