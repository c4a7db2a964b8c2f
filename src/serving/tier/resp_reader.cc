// RespReader (resp_reader.h): an incremental RESP2 reply parser whose bulk
// payloads are read straight into their final buffers.
#include "serving/tier/resp_reader.h"

#include <algorithm>
#include <charconv>
#include <cstring>

namespace kvcache {

RespReader::RespReader(size_t max_bulk, size_t staging_bytes)
    : max_bulk_(max_bulk), staging_(std::max<size_t>(staging_bytes, 16)) {}

bool RespReader::Fail(std::string why) {
  failed_ = true;
  error_ = std::move(why);
  bulk_.reset();
  in_payload_ = want_crlf_ = false;
  return false;
}

std::span<uint8_t> RespReader::ReadBuffer() {
  if (failed_) return {};
  if (in_payload_ && begin_ == end_) {
    return {bulk_->mutable_data() + bulk_filled_, bulk_len_ - bulk_filled_};
  }
  if (begin_ > 0) {  // keep the unparsed tail (a partial line) at the front
    std::memmove(staging_.data(), staging_.data() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  return {staging_.data() + end_, staging_.size() - end_};
}

bool RespReader::Commit(size_t n) {
  if (failed_) return false;
  if (in_payload_ && begin_ == end_) {  // ReadBuffer() was the payload
    if (n > bulk_len_ - bulk_filled_) return Fail("commit past the bulk payload");
    bulk_filled_ += n;
    if (bulk_filled_ == bulk_len_) {
      in_payload_ = false;
      want_crlf_ = true;
    }
    return true;
  }
  if (n > staging_.size() - end_) return Fail("commit past the staging buffer");
  end_ += n;
  return ParseStaging();
}

bool RespReader::Feed(std::span<const uint8_t> bytes) {
  while (!bytes.empty()) {
    const std::span<uint8_t> b = ReadBuffer();
    if (b.empty()) return false;
    const size_t n = std::min(b.size(), bytes.size());
    std::memcpy(b.data(), bytes.data(), n);
    if (!Commit(n)) return false;
    bytes = bytes.subspan(n);
  }
  return !failed_;
}

bool RespReader::Pop(RespReply* out) {
  if (done_.empty()) return false;
  *out = std::move(done_.front());
  done_.pop_front();
  return true;
}

bool RespReader::ParseStaging() {
  for (;;) {
    if (in_payload_) {
      // Payload bytes that arrived in the staging buffer with their header.
      const size_t n = std::min(end_ - begin_, bulk_len_ - bulk_filled_);
      std::memcpy(bulk_->mutable_data() + bulk_filled_, staging_.data() + begin_, n);
      bulk_filled_ += n;
      begin_ += n;
      if (bulk_filled_ < bulk_len_) break;  // the rest is read into the blob itself
      in_payload_ = false;
      want_crlf_ = true;
    }
    if (want_crlf_) {
      if (end_ - begin_ < 2) break;
      if (staging_[begin_] != '\r' || staging_[begin_ + 1] != '\n') {
        return Fail("bulk payload not followed by CRLF");
      }
      begin_ += 2;
      want_crlf_ = false;
      RespReply r;
      r.type = RespReply::Type::kBulk;
      r.bulk = std::move(bulk_);
      done_.push_back(std::move(r));
      continue;
    }
    if (begin_ == end_) break;
    const uint8_t* p = staging_.data() + begin_;
    const size_t avail = end_ - begin_;
    const void* nl = std::memchr(p, '\n', avail);
    if (nl == nullptr) {
      if (avail == staging_.size()) return Fail("reply line longer than the staging buffer");
      break;
    }
    const size_t line_end = static_cast<size_t>(static_cast<const uint8_t*>(nl) - p);  // at '\n'
    if (line_end < 2 || p[line_end - 1] != '\r') return Fail("reply line not ended by CRLF");
    const char* body = reinterpret_cast<const char*>(p + 1);
    const size_t body_len = line_end - 2;  // without the type byte and CRLF
    const uint8_t type = p[0];
    begin_ += line_end + 1;
    RespReply r;
    switch (type) {
      case '+':
      case '-':
        r.type = type == '+' ? RespReply::Type::kStatus : RespReply::Type::kError;
        r.text.assign(body, body_len);
        done_.push_back(std::move(r));
        break;
      case ':':
      case '$': {
        int64_t v = 0;
        const auto [end, ec] = std::from_chars(body, body + body_len, v);
        if (body_len == 0 || ec != std::errc() || end != body + body_len) {
          return Fail("bad integer or length");
        }
        if (type == ':') {
          r.type = RespReply::Type::kInteger;
          r.integer = v;
          done_.push_back(std::move(r));
        } else if (v == -1) {
          r.type = RespReply::Type::kNil;
          done_.push_back(std::move(r));
        } else if (v < 0 || static_cast<uint64_t>(v) > max_bulk_) {
          return Fail("bulk length out of range");
        } else {
          bulk_len_ = static_cast<size_t>(v);
          bulk_filled_ = 0;
          bulk_ = std::make_shared<TierBlob>(bulk_len_);
          in_payload_ = true;
        }
        break;
      }
      default:
        return Fail("unsupported reply type");
    }
  }
  if (begin_ == end_) begin_ = end_ = 0;
  return true;
}

}  // namespace kvcache
