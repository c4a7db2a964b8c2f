// RespReader: an incremental reader of RESP2 replies (the Redis protocol),
// the one RedisTier (tier_store.h) reads its server with. Private to
// kvcache_serving; a header of its own so that its test and the fuzz target
// redis_reply (which compiles resp_reader.cc itself) can feed it arbitrary
// server bytes exactly as the tier does.
//
// Replies it understands: simple strings (+OK), errors (-ERR ...), integers
// (:1), bulk strings ($<len>\r\n<len bytes>\r\n) and the nil bulk ($-1).
// Anything else (arrays, RESP3 types, a bad length, a missing CRLF, a line
// longer than the staging buffer, a bulk longer than max_bulk) is a protocol
// error: the reader stops for good (failed()), and the caller drops the
// connection, since the stream can no longer be trusted to be in step.
//
// Zero-copy for large values: while a bulk payload is being read,
// ReadBuffer() is the rest of that payload's own (uninitialized) TierBlob, so
// a socket read() lands the bytes where they stay; otherwise it is the
// reader's small staging buffer, from which header lines are parsed (and the
// first bytes of a payload that arrived with its header are copied once).
//
// Usage (a socket):  span b = r.ReadBuffer(); n = read(fd, b.data(), b.size());
//                    r.Commit(n); while (r.Pop(&reply)) ...
// or (bytes in hand): r.Feed(bytes).
//
// Thread safety: none (one reader per connection, under its lock).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvcache/serving/tier_store.h"

namespace kvcache {

struct RespReply {
  enum class Type : uint8_t { kStatus, kError, kInteger, kNil, kBulk };
  Type type = Type::kNil;
  int64_t integer = 0;
  std::string text;  // kStatus, kError: the line without its type byte
  TierBlobPtr bulk;  // kBulk (possibly empty)
};

class RespReader {
 public:
  static constexpr size_t kDefaultMaxBulk = size_t{1} << 30;
  static constexpr size_t kStagingBytes = size_t{64} << 10;

  explicit RespReader(size_t max_bulk = kDefaultMaxBulk, size_t staging_bytes = kStagingBytes);

  // Where the next bytes from the server go (never empty unless failed()).
  std::span<uint8_t> ReadBuffer();
  // `n` bytes (<= ReadBuffer().size()) were written at ReadBuffer().data():
  // parses them. False (and failed() from then on) on a protocol error.
  bool Commit(size_t n);
  // Copies `bytes` through ReadBuffer/Commit in as many steps as it takes.
  bool Feed(std::span<const uint8_t> bytes);
  // Takes the oldest complete reply; false if none is complete yet.
  bool Pop(RespReply* out);

  bool failed() const { return failed_; }
  const std::string& error() const { return error_; }
  size_t pending_replies() const { return done_.size(); }

 private:
  bool Fail(std::string why);
  // Parses complete lines in the staging buffer; false on a protocol error.
  bool ParseStaging();

  size_t max_bulk_;
  std::vector<uint8_t> staging_;  // [begin_, end_) unparsed bytes
  size_t begin_ = 0, end_ = 0;
  // Inside a bulk: its blob, its length and how much of it is filled; then
  // the CRLF that must follow it.
  std::shared_ptr<TierBlob> bulk_;
  size_t bulk_len_ = 0, bulk_filled_ = 0;
  bool in_payload_ = false;
  bool want_crlf_ = false;
  bool failed_ = false;
  std::string error_;
  std::deque<RespReply> done_;
};

}  // namespace kvcache
