// Fuzz target `redis_reply`: RedisTier's reply reader (private:
// src/serving/tier/resp_reader.h) on arbitrary server bytes, fed in arbitrary
// pieces through ReadBuffer/Commit (the socket path: bulk payloads land in
// their blobs).
//
// Input: byte 0 picks the mode and the staging buffer's size, byte 1 seeds
// the piece sizes; the rest is
//   mode 0: raw server bytes. Property: the replies (and whether the stream
//           failed) are exactly what a whole-buffer reference parser below
//           finds, whatever the pieces; nothing is read or written outside
//           the buffers (ASan).
//   mode 1: a description of a well-formed pipelined reply stream (each
//           byte a reply kind, payload lengths from the next bytes). The
//           stream is encoded, fed in pieces, and must parse to exactly
//           those replies, with no failure.
// Thread safety: see fuzz_target.h.
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_target.h"
#include "serving/tier/resp_reader.h"

namespace {

using kvcache::RespReader;
using kvcache::RespReply;
using Type = RespReply::Type;

constexpr size_t kMaxBulk = 1 << 20;

struct Ref {
  Type type = Type::kNil;
  int64_t integer = 0;
  std::string text;  // status/error text, or the bulk's bytes
};

// Decimal int64: an optional '-', then digits (leading zeros allowed), no overflow.
bool ParseInt(std::string_view s, int64_t* v) {
  const bool neg = !s.empty() && s[0] == '-';
  size_t i = neg ? 1 : 0;
  if (i == s.size()) return false;
  const uint64_t limit = neg ? uint64_t{1} << 63 : (uint64_t{1} << 63) - 1;
  uint64_t x = 0;
  for (; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
    const uint64_t d = static_cast<uint64_t>(s[i] - '0');
    if (x > (limit - d) / 10) return false;
    x = x * 10 + d;
  }
  *v = neg ? static_cast<int64_t>(0 - x) : static_cast<int64_t>(x);
  return true;
}

// The reference: the whole stream at once. Sets *failed if the stream is
// malformed where it stops (an incomplete last reply is not a failure).
std::vector<Ref> Reference(std::string_view s, size_t staging, bool* failed) {
  std::vector<Ref> out;
  *failed = false;
  size_t p = 0;
  while (p < s.size()) {
    const size_t nl = s.find('\n', p);
    if (nl == std::string_view::npos) {
      *failed = s.size() - p >= staging;  // a line that cannot fit the staging buffer
      return out;
    }
    if (nl + 1 - p > staging) {
      *failed = true;
      return out;
    }
    if (nl - p < 2 || s[nl - 1] != '\r') {
      *failed = true;
      return out;
    }
    const char type = s[p];
    const std::string_view body = s.substr(p + 1, nl - 1 - (p + 1));
    p = nl + 1;
    Ref r;
    r.type = Type::kNil;
    if (type == '+' || type == '-') {
      r.type = type == '+' ? Type::kStatus : Type::kError;
      r.text = std::string(body);
    } else if (type == ':' || type == '$') {
      int64_t v;
      if (!ParseInt(body, &v)) {
        *failed = true;
        return out;
      }
      if (type == ':') {
        r.type = Type::kInteger;
        r.integer = v;
      } else if (v == -1) {
        r.type = Type::kNil;
      } else if (v < 0 || static_cast<uint64_t>(v) > kMaxBulk) {
        *failed = true;
        return out;
      } else {
        const size_t n = static_cast<size_t>(v);
        if (s.size() - p < n) return out;  // incomplete
        r.type = Type::kBulk;
        r.text = std::string(s.substr(p, n));
        p += n;
        if (s.size() - p < 2) return out;  // incomplete
        if (s[p] != '\r' || s[p + 1] != '\n') {
          *failed = true;
          return out;
        }
        p += 2;
      }
    } else {
      *failed = true;
      return out;
    }
    out.push_back(std::move(r));
  }
  return out;
}

// Feeds `s` through ReadBuffer/Commit in pieces whose sizes come from `seed`.
std::vector<RespReply> Feed(RespReader& reader, std::string_view s, uint32_t seed) {
  std::vector<RespReply> out;
  size_t p = 0;
  while (p < s.size()) {
    const std::span<uint8_t> buf = reader.ReadBuffer();
    if (buf.empty()) {
      FUZZ_CHECK(reader.failed());
      break;
    }
    seed = seed * 1103515245u + 12345u;
    const size_t want = 1 + (seed >> 16) % 4096;
    const size_t n = std::min({buf.size(), s.size() - p, want});
    std::memcpy(buf.data(), s.data() + p, n);
    p += n;
    const bool ok = reader.Commit(n);
    FUZZ_CHECK(ok == !reader.failed());
    RespReply r;
    while (reader.Pop(&r)) out.push_back(std::move(r));
    if (!ok) break;
  }
  return out;
}

bool Same(const RespReply& a, const Ref& b) {
  if (a.type != b.type) return false;
  switch (a.type) {
    case Type::kStatus:
    case Type::kError:
      return a.text == b.text;
    case Type::kInteger:
      return a.integer == b.integer;
    case Type::kNil:
      return a.bulk == nullptr;
    case Type::kBulk:
      return a.bulk != nullptr && a.bulk->size() == b.text.size() &&
             std::memcmp(a.bulk->data(), b.text.data(), b.text.size()) == 0;
  }
  return false;
}

// Encodes a well-formed stream described by `d`.
std::string WellFormed(std::string_view d, std::vector<Ref>* want) {
  std::string s;
  size_t i = 0;
  while (i < d.size()) {
    const uint8_t k = static_cast<uint8_t>(d[i++]);
    const size_t arg = i < d.size() ? static_cast<uint8_t>(d[i++]) : 0;
    Ref r;
    r.type = Type::kNil;
    switch (k % 5) {
      case 0:
        r.type = Type::kStatus;
        r.text.assign("OK").append(arg % 8, 'k');
        s.append("+").append(r.text).append("\r\n");
        break;
      case 1:
        r.type = Type::kError;
        r.text.assign("ERR wrong ").append(std::to_string(arg));
        s.append("-").append(r.text).append("\r\n");
        break;
      case 2:
        r.type = Type::kInteger;
        r.integer = static_cast<int64_t>(arg) - 128;
        s.append(":").append(std::to_string(r.integer)).append("\r\n");
        break;
      case 3:
        s += "$-1\r\n";
        break;
      default: {  // a bulk of up to ~24 KiB of patterned bytes, CRLFs included
        r.type = Type::kBulk;
        const size_t n = (k / 5 % 4 == 0) ? arg * 97 : arg;
        static const std::string kPattern = [] {
          std::string p(256 * 97 + 8, 'x');
          for (size_t j = 0; j < p.size(); ++j) p[j] = "\r\n$+-:*x"[(j * 7) % 8];
          return p;
        }();
        r.text = kPattern.substr(arg % 8, n);
        s.append("$").append(std::to_string(n)).append("\r\n").append(r.text).append("\r\n");
        break;
      }
    }
    want->push_back(std::move(r));
  }
  return s;
}

}  // namespace

KVCACHE_FUZZ_TARGET(redis_reply) {
  if (size < 2) return 0;
  const bool well_formed = data[0] & 1;
  // Staging buffers from 16 bytes (every line boundary case) to the default.
  const size_t staging = (data[0] >> 1) == 127 ? RespReader::kStagingBytes : 16 + (data[0] >> 1) * 3;
  const uint32_t seed = data[1];
  const std::string_view rest(reinterpret_cast<const char*>(data + 2), size - 2);
  if (well_formed) {
    std::vector<Ref> want;
    const std::string s = WellFormed(rest.substr(0, 256), &want);
    // Error and status lines are short; the smallest staging still fits them.
    RespReader big(kMaxBulk, std::max<size_t>(staging, 64));
    const std::vector<RespReply> got = Feed(big, s, seed);
    FUZZ_CHECK(!big.failed());
    FUZZ_CHECK_MSG(got.size() == want.size(), "%zu replies, want %zu", got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) FUZZ_CHECK_MSG(Same(got[i], want[i]), "reply %zu", i);
    return 0;
  }
  bool ref_failed = false;
  const std::vector<Ref> want = Reference(rest, staging, &ref_failed);
  RespReader reader(kMaxBulk, staging);
  const std::vector<RespReply> got = Feed(reader, rest, seed);
  FUZZ_CHECK_MSG(reader.failed() == ref_failed, "reader failed %d, reference %d", reader.failed(),
                 ref_failed);
  FUZZ_CHECK_MSG(got.size() == want.size(), "%zu replies, reference %zu", got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) FUZZ_CHECK_MSG(Same(got[i], want[i]), "reply %zu", i);
  // A failed reader stays failed and offers no buffer.
  if (reader.failed()) FUZZ_CHECK(reader.ReadBuffer().empty() && !reader.Commit(0));
  return 0;
}
