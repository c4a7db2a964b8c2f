// RedisTier (tier_store.h): one connection (hiredis connects it, non-blocking),
// driven by our own poll loop so that every round trip has an absolute
// deadline, our own RESP2 writer and our own reply reader.
//
// Why not hiredis's buffers: hiredis 0.14 formats a SET's value into its
// output buffer (a copy), and its reader copies every bulk reply from the
// socket into its buffer, then into the reply object (which we copied once
// more into our own vector). Here a command's value is written from the
// caller's object with sendmsg (iovecs), and a GET's bulk payload is read by
// read() straight into the uninitialized TierBlob it is returned in
// (RespReader, serving/tier/resp_reader.h: also the seam fuzz/redis_reply_fuzz.cc feeds).
//
// A round trip writes up to max_batch commands (GET, EXISTS or SET, one per
// key: pipelined) at once, then reads exactly that many replies, each wait
// bounded by what is left of the deadline. Any transport fault
// (refused connect, reset, a reply cut short, a protocol error, the deadline)
// drops the connection, answers the remaining keys with a miss (kTimeout for
// the deadline, kUnavailable otherwise) and keeps the tier down for a backoff
// (doubling from options.backoff to options.max_backoff, reset by a success):
// calls while it is down answer kUnavailable at once, without waiting. An
// error reply (-ERR, -OOM) is a miss for that key only; the stream stays in
// step. A nil reply ($-1) is kAbsent.
//
// Thread safety: a mutex serializes calls on the one connection.
#include <limits.h>
#include <poll.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <hiredis/hiredis.h>

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cstring>
#include <mutex>

#include <fmt/format.h>

#include "kvcache/serving/tier_store.h"
#include "serving/tier/resp_reader.h"

namespace kvcache {

Result<RedisEndpoint> ParseRedisUrl(std::string_view url) {
  const std::string_view scheme = "redis://";
  auto bad = [&](std::string_view why) {
    return Status::InvalidArgument(
        fmt::format("redis url '{}': {} (expected redis://[:password@]host[:port][/db])", url, why));
  };
  if (!url.starts_with(scheme)) return bad("not redis://");
  std::string_view rest = url.substr(scheme.size());
  RedisEndpoint ep;
  if (const size_t at = rest.rfind('@'); at != std::string_view::npos) {
    std::string_view auth = rest.substr(0, at);
    if (!auth.starts_with(':')) return bad("user names are not supported");
    ep.password = std::string(auth.substr(1));
    rest = rest.substr(at + 1);
  }
  if (const size_t slash = rest.find('/'); slash != std::string_view::npos) {
    const std::string_view db = rest.substr(slash + 1);
    auto [p, ec] = std::from_chars(db.data(), db.data() + db.size(), ep.db);
    if (db.empty() || ec != std::errc() || p != db.data() + db.size() || ep.db < 0) {
      return bad("bad db number");
    }
    rest = rest.substr(0, slash);
  }
  if (const size_t colon = rest.rfind(':'); colon != std::string_view::npos) {
    const std::string_view port = rest.substr(colon + 1);
    auto [p, ec] = std::from_chars(port.data(), port.data() + port.size(), ep.port);
    if (port.empty() || ec != std::errc() || p != port.data() + port.size() || ep.port <= 0 ||
        ep.port > 65535) {
      return bad("bad port");
    }
    rest = rest.substr(0, colon);
  }
  if (rest.empty()) return bad("no host");
  ep.host = std::string(rest);
  return ep;
}

namespace {

using Clock = std::chrono::steady_clock;

using Reply = RespReply;
using RType = RespReply::Type;

// Arguments longer than this are sent from the caller's memory (an iovec of
// their own) instead of being copied into the command text.
constexpr size_t kInlineArg = 4096;

enum class Fault { kNone, kTimeout, kUnavailable };

class RedisTier final : public Tier {
 public:
  RedisTier(const RedisTierOptions& o, RedisEndpoint ep)
      : o_(o), ep_(std::move(ep)), backoff_(o.backoff) {}
  ~RedisTier() override { Drop(); }
  std::string name() const override { return "redis"; }

  std::vector<std::optional<TierMiss>> Exists(std::span<const std::string> keys) override {
    std::vector<std::optional<TierMiss>> out(keys.size());
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t b = 0; b < keys.size(); b += o_.max_batch) {
      const size_t n = std::min(o_.max_batch, keys.size() - b);
      std::vector<std::vector<std::string_view>> cmds(n);
      for (size_t i = 0; i < n; ++i) cmds[i] = {"EXISTS", keys[b + i]};
      std::vector<Reply> replies;
      const Fault f = RoundTrip(cmds, &replies);
      for (size_t i = 0; i < n; ++i) {
        if (f != Fault::kNone) {
          out[b + i] = f == Fault::kTimeout ? TierMiss::kTimeout : TierMiss::kUnavailable;
        } else if (replies[i].type != RType::kInteger) {
          out[b + i] = TierMiss::kUnavailable;
        } else if (replies[i].integer != 1) {
          out[b + i] = TierMiss::kAbsent;
        }
      }
    }
    return out;
  }

  std::vector<TierGet> Load(std::span<const std::string> keys) override {
    std::vector<TierGet> out(keys.size());
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t b = 0; b < keys.size(); b += o_.max_batch) {
      const size_t n = std::min(o_.max_batch, keys.size() - b);
      std::vector<std::vector<std::string_view>> cmds(n);
      for (size_t i = 0; i < n; ++i) cmds[i] = {"GET", keys[b + i]};
      std::vector<Reply> replies;
      const Fault f = RoundTrip(cmds, &replies);
      for (size_t i = 0; i < n; ++i) {
        TierGet& g = out[b + i];
        if (f != Fault::kNone) {
          g.miss = f == Fault::kTimeout ? TierMiss::kTimeout : TierMiss::kUnavailable;
        } else if (replies[i].type == RType::kBulk) {
          g.bytes = std::move(replies[i].bulk);  // read straight into this blob: no copy
        } else {
          g.miss = replies[i].type == RType::kNil ? TierMiss::kAbsent : TierMiss::kUnavailable;
        }
      }
    }
    return out;
  }

  size_t Store(std::span<const TierPut> puts) override {
    size_t stored = 0;
    std::lock_guard<std::mutex> lock(mu_);
    const std::string ttl = std::to_string(o_.ttl_ms);
    for (size_t b = 0; b < puts.size(); b += o_.max_batch) {
      const size_t n = std::min(o_.max_batch, puts.size() - b);
      std::vector<std::vector<std::string_view>> cmds(n);
      for (size_t i = 0; i < n; ++i) {
        const TierPut& p = puts[b + i];
        const std::string_view value(reinterpret_cast<const char*>(p.bytes->data()), p.bytes->size());
        cmds[i] = {"SET", p.key, value};
        if (o_.ttl_ms > 0) {
          cmds[i].push_back("PX");
          cmds[i].push_back(ttl);
        }
      }
      std::vector<Reply> replies;
      const Fault f = RoundTrip(cmds, &replies);
      for (size_t i = 0; i < n; ++i) {
        if (f == Fault::kNone && replies[i].type == RType::kStatus) {
          ++stored;
        } else {
          ++store_failures_;
        }
      }
    }
    return stored;
  }

  void Erase(std::span<const std::string> keys) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t b = 0; b < keys.size(); b += o_.max_batch) {
      const size_t n = std::min(o_.max_batch, keys.size() - b);
      std::vector<std::vector<std::string_view>> cmds(n);
      for (size_t i = 0; i < n; ++i) cmds[i] = {"DEL", keys[b + i]};
      std::vector<Reply> replies;
      RoundTrip(cmds, &replies);
    }
  }

  TierUsage usage() const override {
    std::lock_guard<std::mutex> lock(mu_);
    TierUsage u;
    u.store_failures = store_failures_;
    return u;
  }

 private:
  void Drop() {
    if (c_ != nullptr) redisFree(c_);
    c_ = nullptr;
    reader_ = RespReader();  // a new connection starts a new reply stream
    out_.clear();
    iov_.clear();
  }

  Fault Fail(Fault f) {
    Drop();
    down_until_ = Clock::now() + backoff_;
    backoff_ = std::min(backoff_ * 2, o_.max_backoff);
    return f;
  }

  // Waits for `events` on the socket until `deadline`; false on timeout/error.
  bool Wait(short events, Clock::time_point deadline, bool* timed_out) {
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) {
        *timed_out = true;
        return false;
      }
      pollfd p{c_->fd, events, 0};
      const int r = ::poll(&p, 1, static_cast<int>(left.count()));
      if (r > 0) return (p.revents & (events | POLLHUP | POLLERR)) != 0;
      if (r < 0 && errno != EINTR) return false;
    }
  }

  // Sends the appended commands (out_ and pieces_) and reads `n` replies.
  Fault Exchange(size_t n, Clock::time_point deadline, std::vector<Reply>* replies) {
    bool timed_out = false;
    iov_.clear();
    for (const Piece& pc : pieces_) {
      const uint8_t* base = pc.ext != nullptr ? pc.ext : reinterpret_cast<const uint8_t*>(out_.data()) + pc.off;
      iov_.push_back({const_cast<uint8_t*>(base), pc.len});  // pieces are never empty
    }
    pieces_.clear();
    size_t first = 0;
    while (first < iov_.size()) {
      msghdr msg{};
      msg.msg_iov = iov_.data() + first;
      msg.msg_iovlen = std::min<size_t>(iov_.size() - first, IOV_MAX);
      const ssize_t w = ::sendmsg(c_->fd, &msg, MSG_NOSIGNAL);
      if (w < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return Fault::kUnavailable;
        if (!Wait(POLLOUT, deadline, &timed_out)) {
          return timed_out ? Fault::kTimeout : Fault::kUnavailable;
        }
        continue;
      }
      size_t left = static_cast<size_t>(w);
      while (left > 0 && first < iov_.size()) {
        iovec& v = iov_[first];
        const size_t k = std::min(left, v.iov_len);
        v.iov_base = static_cast<uint8_t*>(v.iov_base) + k;
        v.iov_len -= k;
        left -= k;
        if (v.iov_len == 0) ++first;
      }
    }
    out_.clear();  // only now: the iovecs point into it
    replies->reserve(n);
    while (replies->size() < n) {
      Reply r;
      if (reader_.Pop(&r)) {
        replies->push_back(std::move(r));
        continue;
      }
      // Non-blocking read first (the data is often there), poll only when
      // the socket is empty. In a bulk payload this reads into its blob.
      const std::span<uint8_t> buf = reader_.ReadBuffer();
      if (buf.empty()) return Fault::kUnavailable;
      const ssize_t got = ::read(c_->fd, buf.data(), buf.size());
      if (got < 0 && errno == EINTR) continue;
      if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (!Wait(POLLIN, deadline, &timed_out)) {
          return timed_out ? Fault::kTimeout : Fault::kUnavailable;
        }
        continue;
      }
      if (got <= 0 || !reader_.Commit(static_cast<size_t>(got))) return Fault::kUnavailable;
    }
    return Fault::kNone;
  }

  // Appends one command in RESP (an array of bulk strings): the text to
  // out_, long arguments as pieces of their own pointing at the caller's
  // memory (which outlives the round trip).
  void AppendOne(std::span<const std::string_view> args) {
    size_t mark = out_.size();
    auto flush_text = [&] {
      if (out_.size() > mark) pieces_.push_back({nullptr, mark, out_.size() - mark});
      mark = out_.size();
    };
    fmt::format_to(std::back_inserter(out_), "*{}\r\n", args.size());
    for (std::string_view a : args) {
      fmt::format_to(std::back_inserter(out_), "${}\r\n", a.size());
      if (a.size() > kInlineArg) {
        flush_text();
        pieces_.push_back({reinterpret_cast<const uint8_t*>(a.data()), 0, a.size()});
      } else {
        out_.append(a);
      }
      out_.append("\r\n");
    }
    flush_text();
  }

  void Append(std::span<const std::vector<std::string_view>> cmds) {
    for (const auto& cmd : cmds) AppendOne(cmd);
  }

  Fault Connect(Clock::time_point deadline) {
    c_ = redisConnectNonBlock(ep_.host.c_str(), ep_.port);
    if (c_ == nullptr || c_->err) return Fault::kUnavailable;
    bool timed_out = false;
    if (!Wait(POLLOUT, deadline, &timed_out)) return timed_out ? Fault::kTimeout : Fault::kUnavailable;
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(c_->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
      return Fault::kUnavailable;
    }
    std::vector<std::vector<std::string_view>> setup;
    if (!ep_.password.empty()) setup.push_back({"AUTH", ep_.password});
    const std::string db = std::to_string(ep_.db);
    if (ep_.db != 0) setup.push_back({"SELECT", db});
    if (setup.empty()) return Fault::kNone;
    std::vector<Reply> replies;
    Append(setup);
    if (Fault f = Exchange(setup.size(), deadline, &replies); f != Fault::kNone) return f;
    for (const Reply& r : replies) {
      if (r.type == RType::kError) return Fault::kUnavailable;
    }
    return Fault::kNone;
  }

  // One pipelined round trip under one deadline. REQUIRES mu_ held.
  Fault RoundTrip(std::span<const std::vector<std::string_view>> cmds, std::vector<Reply>* replies) {
    if (c_ == nullptr && Clock::now() < down_until_) return Fault::kUnavailable;
    const Clock::time_point deadline = Clock::now() + o_.deadline;
    if (c_ == nullptr) {
      if (Fault f = Connect(deadline); f != Fault::kNone) return Fail(f);
    }
    Append(cmds);
    if (Fault f = Exchange(cmds.size(), deadline, replies); f != Fault::kNone) return Fail(f);
    backoff_ = o_.backoff;
    return Fault::kNone;
  }

  const RedisTierOptions o_;
  const RedisEndpoint ep_;
  mutable std::mutex mu_;
  redisContext* c_ = nullptr;
  Clock::time_point down_until_{};
  std::chrono::milliseconds backoff_;
  uint64_t store_failures_ = 0;
  // The commands of the round trip being built: text in out_, sent as
  // pieces_ (a range of out_, or ext: a long argument in the caller's memory).
  struct Piece {
    const uint8_t* ext;
    size_t off, len;
  };
  std::string out_;
  std::vector<Piece> pieces_;
  std::vector<iovec> iov_;
  RespReader reader_;
};

}  // namespace

Result<std::unique_ptr<Tier>> NewRedisTier(const RedisTierOptions& options) {
  KV_ASSIGN_OR_RETURN(RedisEndpoint ep, ParseRedisUrl(options.url));
  if (options.max_batch == 0 || options.deadline.count() <= 0) {
    return Status::InvalidArgument("redis tier: max_batch and deadline must be > 0");
  }
  return std::unique_ptr<Tier>(std::make_unique<RedisTier>(options, std::move(ep)));
}

}  // namespace kvcache
