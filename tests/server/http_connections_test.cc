// The connections' header wait (server/http_connections.h) on socket pairs:
// where a header ends; the deadlines of a new and of a kept-alive
// connection; connections that send half a header (or nothing) hold no pool
// thread, so a complete request behind them is served at once; a partial
// header is answered with the timeout response and closed at its deadline,
// a silent connection just closed; a kept-alive connection's read-ahead
// next request is served without waiting.
#include "server/http_connections.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kvcache::server {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

TEST(HttpConnections, HeaderEnd) {
  EXPECT_EQ(HeaderEnd(""), std::string_view::npos);
  EXPECT_EQ(HeaderEnd("POST / HTTP/1.1\r\nHost: x\r\n"), std::string_view::npos);
  EXPECT_EQ(HeaderEnd("GET / HTTP/1.1\r\n\r\n"), 18u);
  EXPECT_EQ(HeaderEnd("GET / HTTP/1.1\r\n\r\n{\"a\":1}"), 18u);
  EXPECT_EQ(HeaderEnd("HELLO\r\n\r\n"), 9u);
}

TEST(HttpConnections, Deadlines) {
  const auto t0 = Clock::now();
  HeaderDeadline fresh(t0, /*kept_alive=*/false, milliseconds(100), milliseconds(5000));
  EXPECT_EQ(fresh.deadline(), t0 + milliseconds(100));
  fresh.Received(t0 + milliseconds(50));  // bytes do not extend a new connection's deadline
  EXPECT_EQ(fresh.deadline(), t0 + milliseconds(100));
  EXPECT_FALSE(fresh.Expired(t0 + milliseconds(99)));
  EXPECT_TRUE(fresh.Expired(t0 + milliseconds(100)));

  HeaderDeadline reused(t0, /*kept_alive=*/true, milliseconds(100), milliseconds(5000));
  EXPECT_EQ(reused.deadline(), t0 + milliseconds(5000));  // idle until the first byte
  reused.Received(t0 + milliseconds(3000));
  EXPECT_EQ(reused.deadline(), t0 + milliseconds(3100));  // then the header's deadline
  reused.Received(t0 + milliseconds(3050));
  EXPECT_EQ(reused.deadline(), t0 + milliseconds(3100));
}

// A socket pair: the pool gets one end, the test plays the client on the other.
struct Pair {
  int client = -1, server = -1;
  Pair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    client = fds[0];
    server = fds[1];
  }
  ~Pair() {
    if (client >= 0) ::close(client);
  }
  Pair(const Pair&) = delete;
  Pair& operator=(const Pair&) = delete;
  void Send(const std::string& s) const { ASSERT_EQ(::send(client, s.data(), s.size(), MSG_NOSIGNAL), ssize_t(s.size())); }
  // What the server side writes until it closes (or `timeout` passes: then
  // *closed stays false).
  std::string ReadUntilClosed(milliseconds timeout, bool* closed) const {
    std::string out;
    *closed = false;
    const auto end = Clock::now() + timeout;
    for (;;) {
      const auto left = std::chrono::duration_cast<milliseconds>(end - Clock::now()).count();
      if (left <= 0) return out;
      pollfd p{client, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) <= 0) return out;
      char buf[512];
      const ssize_t n = ::recv(client, buf, sizeof(buf), 0);
      if (n <= 0) {
        *closed = true;
        return out;
      }
      out.append(buf, static_cast<size_t>(n));
    }
  }
};

// pool.waiting_for_header() once it is n, or after a second (the poll
// thread counts after it dispatched or closed a connection).
size_t WaitForWaiting(const ConnectionPool& pool, size_t n) {
  for (int i = 0; i < 100 && pool.waiting_for_header() != n; ++i) std::this_thread::sleep_for(milliseconds(10));
  return pool.waiting_for_header();
}

// A ServeFn that answers "served:<request>" and closes, counting its calls.
struct Recorder {
  std::mutex mu;
  std::vector<std::string> requests;
  std::atomic<int> calls{0};
  bool keep = false;

  ConnectionPool::ServeFn Fn() {
    return [this](Connection& c, bool) {
      const size_t end = HeaderEnd(c.pending);
      const std::string req = c.pending.substr(0, end);
      c.pending.erase(0, end == std::string::npos ? c.pending.size() : end);
      {
        std::lock_guard<std::mutex> lock(mu);
        requests.push_back(req);
      }
      const std::string answer = "served:" + req;
      [[maybe_unused]] ssize_t n = ::send(c.fd, answer.data(), answer.size(), MSG_NOSIGNAL);
      --c.requests_left;
      ++calls;
      return keep;
    };
  }
};

TEST(HttpConnections, HalfRequestsHoldNoThread) {
  Recorder rec;
  ConnectionLimits limits;
  limits.threads = 2;
  limits.header_timeout = milliseconds(10000);
  ConnectionPool pool(limits, rec.Fn());
  std::vector<Pair> slow(40);
  for (Pair& p : slow) {
    p.Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\n");
    pool.Add(p.server, 1);
  }
  Pair fast;
  const auto t0 = Clock::now();
  pool.Add(fast.server, 1);
  fast.Send("GET /health HTTP/1.1\r\n\r\n");
  bool closed = false;
  EXPECT_EQ(fast.ReadUntilClosed(milliseconds(2000), &closed), "served:GET /health HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(closed);
  EXPECT_LT(Clock::now() - t0, milliseconds(1500));  // far inside the slow ones' 10 s header timeout
  EXPECT_EQ(rec.calls.load(), 1);
  EXPECT_EQ(WaitForWaiting(pool, 40), 40u);
  pool.Shutdown();  // closes the waiting ones
  for (Pair& p : slow) {
    EXPECT_EQ(p.ReadUntilClosed(milliseconds(1000), &closed), "");
    EXPECT_TRUE(closed);
  }
}

TEST(HttpConnections, DeadlineClosesPartialAndSilentConnections) {
  Recorder rec;
  ConnectionLimits limits;
  limits.threads = 1;
  limits.header_timeout = milliseconds(150);
  limits.timeout_response = "408!";
  ConnectionPool pool(limits, rec.Fn());
  Pair partial, silent;
  partial.Send("POST / HTTP/1.1\r\n");
  const auto t0 = Clock::now();
  pool.Add(partial.server, 1);
  pool.Add(silent.server, 1);
  bool closed = false;
  EXPECT_EQ(partial.ReadUntilClosed(milliseconds(3000), &closed), "408!");
  EXPECT_TRUE(closed);
  EXPECT_EQ(silent.ReadUntilClosed(milliseconds(3000), &closed), "");
  EXPECT_TRUE(closed);
  const auto took = Clock::now() - t0;
  EXPECT_GE(took, milliseconds(140));
  EXPECT_LT(took, milliseconds(1000));
  EXPECT_EQ(rec.calls.load(), 0);
  EXPECT_EQ(WaitForWaiting(pool, 0), 0u);
}

TEST(HttpConnections, BeyondTheBoundTheLongestWaitingAreClosed) {
  Recorder rec;
  ConnectionLimits limits;
  limits.max_header_waits = 3;
  int timeouts = 0;
  limits.timeout_response = "408!";
  limits.on_timeout_response = [&] { ++timeouts; };
  ConnectionPool pool(limits, rec.Fn());
  std::vector<Pair> pairs(5);
  for (Pair& p : pairs) {
    p.Send("GET");
    pool.Add(p.server, 1);
    std::this_thread::sleep_for(milliseconds(20));  // seen by the poll thread in this order
  }
  bool closed = false;
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(pairs[i].ReadUntilClosed(milliseconds(2000), &closed), "408!") << i;
    EXPECT_TRUE(closed) << i;
  }
  for (size_t i = 2; i < 5; ++i) {
    pairs[i].ReadUntilClosed(milliseconds(50), &closed);
    EXPECT_FALSE(closed) << i;
  }
  EXPECT_EQ(WaitForWaiting(pool, 3), 3u);
  pool.Shutdown();
  EXPECT_EQ(timeouts, 2);
}

TEST(HttpConnections, TrickleDoesNotExtendTheDeadline) {
  Recorder rec;
  ConnectionLimits limits;
  limits.header_timeout = milliseconds(300);
  limits.timeout_response = "408!";
  ConnectionPool pool(limits, rec.Fn());
  Pair p;
  const auto t0 = Clock::now();
  pool.Add(p.server, 1);
  // A byte every 50 ms, never a whole header, for up to 3 s or until the
  // server answers: a deadline that each byte pushed back would never come
  // while the trickle lasts.
  for (int i = 0; i < 60; ++i) {
    pollfd ready{p.client, POLLIN, 0};
    if (::poll(&ready, 1, 0) > 0) break;
    (void)::send(p.client, "x", 1, MSG_NOSIGNAL);
    std::this_thread::sleep_for(milliseconds(50));
  }
  bool closed = false;
  EXPECT_EQ(p.ReadUntilClosed(milliseconds(3000), &closed), "408!");
  EXPECT_TRUE(closed);
  EXPECT_LT(Clock::now() - t0, milliseconds(1500));  // 300 ms deadline; an extended one: > 3 s
  EXPECT_EQ(rec.calls.load(), 0);
}

TEST(HttpConnections, KeptAliveConnectionServesItsReadAheadRequest) {
  Recorder rec;
  rec.keep = true;
  ConnectionLimits limits;
  limits.threads = 1;
  limits.idle_timeout = milliseconds(200);
  ConnectionPool pool(limits, rec.Fn());
  Pair p;
  // Two requests in one write, and a third later; three requests at most.
  p.Send("GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n");
  pool.Add(p.server, 3);
  std::this_thread::sleep_for(milliseconds(50));
  p.Send("GET /c HTTP/1.1\r\n\r\n");
  bool closed = false;
  const std::string got = p.ReadUntilClosed(milliseconds(3000), &closed);
  EXPECT_EQ(got,
            "served:GET /a HTTP/1.1\r\n\r\nserved:GET /b HTTP/1.1\r\n\r\nserved:GET /c HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(closed);  // its third request was its last
  EXPECT_EQ(rec.calls.load(), 3);
}

TEST(HttpConnections, IdleKeptAliveConnectionIsClosedSilently) {
  Recorder rec;
  rec.keep = true;
  ConnectionLimits limits;
  limits.idle_timeout = milliseconds(150);
  limits.timeout_response = "408!";
  ConnectionPool pool(limits, rec.Fn());
  Pair p;
  p.Send("GET /a HTTP/1.1\r\n\r\n");
  pool.Add(p.server, 100);
  bool closed = false;
  EXPECT_EQ(p.ReadUntilClosed(milliseconds(3000), &closed), "served:GET /a HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(closed);
}

}  // namespace
}  // namespace kvcache::server
